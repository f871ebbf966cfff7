// Tests for the CPU backend's training-step kernels (backend/step_kernels.h):
// the fused unscale-and-check in every float dtype, the step decision and
// loss-scale update against the host LossScaler, the multi-tensor optimizer
// against the host Optimizer (itself checked against PyTorch in
// optimizer_test) bit for bit, the skipped step that changes nothing, and
// argument errors.
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "graph/half.h"
#include "gtest/gtest.h"
#include "passes/loss_scaler.h"
#include "passes/optimizer.h"
#include "tests/step_kernels_test_util.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

Backend& Cpu() {
  static CpuBackend* backend = new CpuBackend(CpuBackendOptions{2});
  return *backend;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0;
}

TEST(StepKernelsTest, UnscalesEveryDtypeInPlace) {
  StepConfig config;
  config.optimizer.kind = OptimizerKind::kSgd;
  config.scaler.initial_scale = 1024.0;
  StepCase c = MakeStepCase(config, {}, 1);
  c.weights = {Tensor::FromVector<float>(DType::kFloat32, {3}, {0, 0, 0})};
  c.slots = {{}};
  c.gradients = {Tensor::FromVector<float>(DType::kFloat32, {3}, {1024.0f, -2048.0f, 512.0f})};
  // 16-bit gradients are unscaled (rounded once) and checked, not applied.
  Tensor f16 = Tensor::FromVector<uint16_t>(DType::kFloat16, {2},
                                            {FloatToHalfBits(3072.0f), FloatToHalfBits(-1.0f)});
  Tensor bf16 = Tensor::FromVector<uint16_t>(DType::kBFloat16, {1}, {FloatToBFloat16Bits(4096.0f)});
  StepKernels* kernels = Cpu().step_kernels();
  ASSERT_NE(kernels, nullptr);
  StepState state;
  state.scaler.scale = 1024.0;
  float next_scale = 0;
  Tensor f32 = c.gradients[0];
  std::vector<TensorView> views = {{f32.raw(), f32.dtype(), f32.dims()},
                                   {f16.raw(), f16.dtype(), f16.dims()},
                                   {bf16.raw(), bf16.dtype(), bf16.dims()}};
  Tensor loss = Tensor::Scalar(2.5f);
  ASSERT_TRUE(kernels
                  ->UnscaleAndDecide(config, views, {loss.raw(), loss.dtype(), loss.dims()}, &state,
                                     &next_scale)
                  .ok());
  EXPECT_EQ(f32.data<float>()[0], 1.0f);
  EXPECT_EQ(f32.data<float>()[1], -2.0f);
  EXPECT_EQ(f32.data<float>()[2], 0.5f);
  EXPECT_EQ(HalfBitsToFloat(f16.data<uint16_t>()[0]), 3.0f);
  EXPECT_EQ(HalfBitsToFloat(f16.data<uint16_t>()[1]), -1.0f / 1024.0f);
  EXPECT_EQ(BFloat16BitsToFloat(bf16.data<uint16_t>()[0]), 4.0f);
  EXPECT_EQ(state.non_finite, 0);
  EXPECT_EQ(state.skipped, 0);
  EXPECT_EQ(state.scale_used, 1024.0);
  const double squares = 1 + 4 + 0.25 + 9 + 1.0 / (1024.0 * 1024.0) + 16;
  EXPECT_DOUBLE_EQ(state.sum_squares, squares);
  EXPECT_DOUBLE_EQ(state.grad_norm, std::sqrt(squares));
  EXPECT_EQ(state.optimizer_step, 1);
  EXPECT_EQ(next_scale, 1024.0f);
}

TEST(StepKernelsTest, NonFiniteGradientOrLossSkipsEverything) {
  StepConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;
  config.scaler.initial_scale = 4096.0;
  for (const char* where : {"gradient inf", "gradient nan", "half inf", "loss nan"}) {
    SCOPED_TRACE(where);
    StepCase c = MakeStepCase(config, {{3, 5}, {7}}, 2);
    c.state.optimizer_step = 4;
    c.state.scaler.good_steps = 17;
    for (auto& slots : c.slots) slots = {RandomFloats(slots[0].dims(), 5), RandomFloats(slots[0].dims(), 6)};
    const std::string what = where;
    if (what == "gradient inf") c.gradients[1].data<float>()[3] = std::numeric_limits<float>::infinity();
    if (what == "gradient nan") c.gradients[0].data<float>()[0] = std::nanf("");
    if (what == "half inf") {
      c.gradients.push_back(Tensor::FromVector<uint16_t>(DType::kFloat16, {1}, {0x7C00}));
    }
    if (what == "loss nan") c.loss = Tensor::Scalar(std::nanf(""));
    // The float16 gradient has no parameter: it is checked only.
    StepCase run = c;
    if (what == "half inf") run.gradients.pop_back();
    absl::StatusOr<StepOutcome> out = absl::InternalError("not run");
    if (what == "half inf") {
      // Check the 16-bit path directly: the parameters' gradients plus one more.
      StepKernels* kernels = Cpu().step_kernels();
      StepState state = c.state;
      float next = 0;
      std::vector<TensorView> views;
      for (Tensor& g : c.gradients) views.push_back({g.raw(), g.dtype(), g.dims()});
      ASSERT_TRUE(kernels
                      ->UnscaleAndDecide(config, views, {c.loss.raw(), c.loss.dtype(), c.loss.dims()},
                                         &state, &next)
                      .ok());
      EXPECT_EQ(state.skipped, 1);
      EXPECT_EQ(next, 2048.0f);
      continue;
    }
    out = RunStepKernels(Cpu(), run);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->state.skipped, 1);
    EXPECT_EQ(out->state.non_finite, what == "loss nan" ? 0 : 1);
    EXPECT_EQ(out->state.optimizer_step, 4);
    EXPECT_EQ(out->state.scaler.scale, 2048.0);
    EXPECT_EQ(out->state.scaler.good_steps, 0);
    EXPECT_EQ(out->state.scaler.skipped_steps, 1);
    EXPECT_EQ(out->state.scale_used, 4096.0);
    EXPECT_EQ(out->state.grad_norm, 0.0);
    EXPECT_EQ(out->next_loss_scale, 2048.0f);
    for (size_t k = 0; k < c.weights.size(); ++k) {
      EXPECT_TRUE(SameBits(out->weights[k], c.weights[k])) << k;
      for (size_t s = 0; s < c.slots[k].size(); ++s) {
        EXPECT_TRUE(SameBits(out->slots[k][s], c.slots[k][s])) << k << " slot " << s;
      }
    }
    EXPECT_TRUE(SameBits(out->statistic, c.statistic));
  }
}

// Three steps of the multi-tensor update against the host Optimizer and
// LossScaler fed the same unscaled gradients: the same bits.
TEST(StepKernelsTest, MatchesTheHostOptimizerBitForBit) {
  struct Variant {
    const char* name;
    OptimizerOptions options;
  };
  std::vector<Variant> variants;
  auto add = [&](const char* name, OptimizerKind kind, double momentum, bool nesterov, double wd,
                 double clip) {
    OptimizerOptions o;
    o.kind = kind;
    o.momentum = momentum;
    o.nesterov = nesterov;
    o.weight_decay = wd;
    o.clip_norm = clip;
    variants.push_back({name, o});
  };
  add("sgd", OptimizerKind::kSgd, 0, false, 0, 0);
  add("sgd momentum wd", OptimizerKind::kSgd, 0.9, false, 1e-2, 0);
  add("sgd nesterov clip", OptimizerKind::kSgd, 0.9, true, 0, 0.5);
  add("adam wd clip", OptimizerKind::kAdam, 0, false, 1e-2, 1.0);
  add("adamw", OptimizerKind::kAdamW, 0, false, 5e-2, 0);
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    StepConfig config;
    config.optimizer = variant.options;
    config.lr.kind = LrSchedule::Kind::kCosine;
    config.lr.base_lr = 0.05;
    config.lr.warmup_steps = 1;
    config.lr.total_steps = 5;
    config.scaler.initial_scale = 256.0;
    config.scaler.growth_interval = 2;
    absl::StatusOr<Optimizer> host = Optimizer::Create(variant.options);
    ASSERT_TRUE(host.ok());
    LossScaler scaler(config.scaler);
    const std::vector<std::vector<int64_t>> dims = {{4, 6}, {6}, {3, 2, 2}};
    StepCase c = MakeStepCase(config, dims, 7);
    std::vector<Tensor> host_weights = c.weights;
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE(step);
      c = [&] {
        StepCase next = MakeStepCase(config, dims, 100 * step);
        const float scale = static_cast<float>(scaler.scale());
        for (Tensor& g : next.gradients) {
          for (int64_t i = 0; i < g.num_elements(); ++i) {
            g.data<float>()[i] = g.data<float>()[i] / 256.0f * scale;
          }
        }
        next.weights = c.weights;
        next.slots = c.slots;
        next.state = c.state;
        return next;
      }();
      // The host reference: unscale, then Step with the scheduled rate.
      std::vector<Tensor> unscaled = c.gradients;
      const float inverse = static_cast<float>(1.0 / scaler.scale());
      for (Tensor& g : unscaled) {
        for (int64_t i = 0; i < g.num_elements(); ++i) g.data<float>()[i] *= inverse;
      }
      std::vector<ParameterGradient> parameters;
      for (size_t k = 0; k < dims.size(); ++k) {
        parameters.push_back({absl::StrCat("w", k), &host_weights[k], &unscaled[k]});
      }
      const double lr = LearningRate(config.lr, host->step() + 1);
      absl::StatusOr<double> norm = host->Step(parameters, lr);
      ASSERT_TRUE(norm.ok());
      scaler.Update(true);

      absl::StatusOr<StepOutcome> out = RunStepKernels(Cpu(), c);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->state.skipped, 0);
      EXPECT_EQ(out->state.optimizer_step, host->step());
      EXPECT_EQ(out->state.grad_norm, *norm);
      EXPECT_EQ(out->state.update.lr, lr);
      EXPECT_EQ(out->state.scaler.scale, scaler.state().scale);
      EXPECT_EQ(out->state.scaler.good_steps, scaler.state().good_steps);
      EXPECT_EQ(out->next_loss_scale, static_cast<float>(scaler.scale()));
      EXPECT_TRUE(SameBits(out->statistic, c.updated_statistic));
      const std::vector<std::string> slot_names = OptimizerSlotNames(variant.options);
      for (size_t k = 0; k < dims.size(); ++k) {
        EXPECT_TRUE(SameBits(out->gradients[k], unscaled[k])) << k;
        EXPECT_TRUE(SameBits(out->weights[k], host_weights[k])) << k;
        for (size_t s = 0; s < slot_names.size(); ++s) {
          EXPECT_TRUE(SameBits(out->slots[k][s], host->state().at(absl::StrCat("w", k)).at(slot_names[s])))
              << k << " " << slot_names[s];
        }
      }
      c.weights = out->weights;
      c.slots = out->slots;
      c.state = out->state;
    }
    EXPECT_EQ(c.state.scaler.scale, 512.0);  // grew once after 2 good steps
  }
}

TEST(StepKernelsTest, ErrorsNameTheParameterOrInput) {
  StepConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;
  StepCase c = MakeStepCase(config, {{2}}, 3);
  c.slots[0].pop_back();  // Adam needs two
  absl::StatusOr<StepOutcome> out = RunStepKernels(Cpu(), c);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("parameter 'w0' has no slot 1 of 2"));

  c = MakeStepCase(config, {{2}}, 3);
  c.gradients[0] = Tensor(DType::kFloat32, {3});
  out = RunStepKernels(Cpu(), c);
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("parameter 'w0' is float32 with a float32 gradient of other dims"));

  c = MakeStepCase(config, {{2}}, 3);
  c.loss = Tensor(DType::kFloat32, {2});
  out = RunStepKernels(Cpu(), c);
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("the loss is float32 with 2 elements; expected a float32 scalar"));

  c = MakeStepCase(config, {{2}}, 3);
  c.gradients[0] = Tensor(DType::kFloat64, {2});
  out = RunStepKernels(Cpu(), c);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("a gradient is float64"));
}

}  // namespace
}  // namespace castor
