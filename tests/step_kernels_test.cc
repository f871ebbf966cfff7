// Tests for the CPU backend's training-step kernels (backend/step_kernels.h):
// the fused unscale-and-check in every float dtype, the step decision and
// loss-scale update against the host LossScaler, the multi-tensor optimizer
// against the host Optimizer (itself checked against PyTorch in
// optimizer_test) bit for bit, the gradient norm's bits at any thread
// count, the skipped step that changes nothing, and argument errors.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/parallel.h"
#include "gmock/gmock.h"
#include "graph/half.h"
#include "gtest/gtest.h"
#include "training/loss_scaler.h"
#include "training/optimizer.h"
#include "tests/step_kernels_test_util.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

Backend& Cpu() {
  static CpuBackend* backend = new CpuBackend(CpuBackendOptions{2});
  return *backend;
}

// Runs UnscaleAndDecide on host tensors; returns the state it leaves.
StepState UnscaleAndDecide(const StepConfig& config, std::vector<Tensor*> gradients, float loss,
                           float* next_scale) {
  StepState state;
  state.scaler.scale = config.scaler.initial_scale;
  std::vector<TensorView> views;
  for (Tensor* g : gradients) views.push_back({g->raw(), g->dtype(), g->dims()});
  Tensor loss_tensor = Tensor::Scalar(loss);
  const absl::Status status = Cpu().step_kernels()->UnscaleAndDecide(
      config, views, {loss_tensor.raw(), DType::kFloat32, {}}, &state, next_scale);
  EXPECT_TRUE(status.ok()) << status;
  return state;
}

TEST(StepKernelsTest, UnscalesEveryDtypeInPlace) {
  const StepConfig config = MakeStepConfig(OptimizerKind::kSgd, 0, false, 0, 0, 1024.0);
  Tensor f32 = Tensor::FromVector<float>(DType::kFloat32, {3}, {1024.0f, -2048.0f, 512.0f});
  Tensor f16 = Tensor::FromVector<uint16_t>(DType::kFloat16, {2},
                                            {FloatToHalfBits(3072.0f), FloatToHalfBits(-1.0f)});
  Tensor bf16 = Tensor::FromVector<uint16_t>(DType::kBFloat16, {1}, {FloatToBFloat16Bits(4096.0f)});
  float next_scale = 0;
  const StepState state = UnscaleAndDecide(config, {&f32, &f16, &bf16}, 2.5f, &next_scale);
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

  // An infinite 16-bit gradient skips the step like a float32 one.
  Tensor half_inf = Tensor::FromVector<uint16_t>(DType::kFloat16, {1}, {0x7C00});
  const StepState skipped = UnscaleAndDecide(config, {&half_inf}, 2.5f, &next_scale);
  EXPECT_EQ(skipped.non_finite, 1);
  EXPECT_EQ(skipped.skipped, 1);
  EXPECT_EQ(next_scale, 512.0f);
}

// Loss scaling off (mixed_bfloat16's and float32's default): the pass only
// checks and sums; every gradient keeps its bits, odd ones included.
TEST(StepKernelsTest, WithoutALossScaleGradientsKeepTheirBits) {
  StepConfig config = MakeStepConfig(OptimizerKind::kSgd, 0, false, 0, 0, 1024.0);
  config.scaler.enabled = false;
  const float tiny = std::numeric_limits<float>::denorm_min();
  Tensor f32 = Tensor::FromVector<float>(DType::kFloat32, {3}, {3.0f, -0.1f, tiny});
  Tensor bf16 = Tensor::FromVector<uint16_t>(DType::kBFloat16, {2}, {0x3f81, 0x8001});
  const Tensor f32_before = f32, bf16_before = bf16;
  float next_scale = 0;
  const StepState state = UnscaleAndDecide(config, {&f32, &bf16}, 2.5f, &next_scale);
  EXPECT_TRUE(SameBits(f32, f32_before));
  EXPECT_TRUE(SameBits(bf16, bf16_before));
  EXPECT_EQ(state.skipped, 0);
  EXPECT_EQ(state.scale_used, 1.0);
  double squares = 0;
  for (float v : {3.0f, -0.1f, tiny, BFloat16BitsToFloat(0x3f81), BFloat16BitsToFloat(0x8001)}) {
    squares += double{v} * v;
  }
  EXPECT_DOUBLE_EQ(state.sum_squares, squares);
}

// The unscale pass spreads fixed segments of the gradients over the
// threads and adds their totals in order: the norm has the same bits at
// any thread count, and matches a float64 sum.
TEST(StepKernelsTest, GradientNormHasTheSameBitsAtEveryThreadCount) {
  const StepConfig config = MakeStepConfig(OptimizerKind::kSgd, 0, false, 0, 0, 1024.0);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-2000.0f, 2000.0f);
  std::vector<std::vector<float>> values(3);
  double want = 0.0;
  for (size_t k = 0; k < values.size(); ++k) {
    values[k].resize(k == 0 ? 200000 : k == 1 ? 70001 : 3);
    for (float& v : values[k]) {
      v = dist(rng);
      const double unscaled = v * (1.0f / 1024.0f);
      want += unscaled * unscaled;
    }
  }
  Cpu();  // constructed first: its constructor sets the thread count
  const int threads_before = cpu::NumThreads();
  std::vector<StepState> states;
  std::vector<std::vector<Tensor>> results;
  for (int threads : {1, 2, 3}) {
    cpu::SetNumThreads(threads);
    std::vector<Tensor> gradients;
    for (const std::vector<float>& v : values) {
      gradients.push_back(
          Tensor::FromVector<float>(DType::kFloat32, {static_cast<int64_t>(v.size())}, v));
    }
    std::vector<Tensor*> pointers;
    for (Tensor& g : gradients) pointers.push_back(&g);
    float next_scale = 0;
    states.push_back(UnscaleAndDecide(config, pointers, 1.0f, &next_scale));
    results.push_back(std::move(gradients));
  }
  cpu::SetNumThreads(threads_before);
  EXPECT_NEAR(states[0].sum_squares, want, 1e-12 * want);
  for (size_t t = 1; t < states.size(); ++t) {
    EXPECT_EQ(states[t].sum_squares, states[0].sum_squares) << "thread count " << t + 1;
    for (size_t k = 0; k < values.size(); ++k) {
      EXPECT_TRUE(SameBits(results[t][k], results[0][k])) << "gradient " << k;
    }
  }
  EXPECT_EQ(results[0][0].data<float>()[7], values[0][7] * (1.0f / 1024.0f));
}

TEST(StepKernelsTest, NonFiniteGradientOrLossSkipsEverything) {
  const StepConfig config = MakeStepConfig(OptimizerKind::kAdam, 0, false, 0, 0, 4096.0);
  for (const std::string what : {"gradient inf", "gradient nan", "loss nan"}) {
    SCOPED_TRACE(what);
    StepCase c = MakeStepCase(config, {{3, 5}, {7}}, 2);
    c.state.optimizer_step = 4;
    c.state.scaler.good_steps = 1;
    for (auto& slots : c.slots) {
      slots = {RandomFloats(slots[0].dims(), 5), RandomFloats(slots[0].dims(), 6)};
    }
    if (what == "gradient inf") {
      c.gradients[1].data<float>()[3] = std::numeric_limits<float>::infinity();
    }
    if (what == "gradient nan") c.gradients[0].data<float>()[0] = std::nanf("");
    if (what == "loss nan") c.loss = Tensor::Scalar(std::nanf(""));
    absl::StatusOr<StepOutcome> out = RunStepKernels(Cpu(), c);
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
// LossScaler fed the same unscaled gradients: the same bits (the gradient
// norm: the same to rounding).
TEST(StepKernelsTest, MatchesTheHostOptimizerBitForBit) {
  const std::vector<std::pair<const char*, StepConfig>> variants = {
      {"sgd", MakeStepConfig(OptimizerKind::kSgd, 0, false, 0, 0, 256.0, 5)},
      {"sgd momentum wd", MakeStepConfig(OptimizerKind::kSgd, 0.9, false, 1e-2, 0, 256.0, 5)},
      {"sgd nesterov clip", MakeStepConfig(OptimizerKind::kSgd, 0.9, true, 0, 0.5, 256.0, 5)},
      {"adam wd clip", MakeStepConfig(OptimizerKind::kAdam, 0, false, 1e-2, 1.0, 256.0, 5)},
      {"adamw", MakeStepConfig(OptimizerKind::kAdamW, 0, false, 5e-2, 0, 256.0, 5)},
  };
  for (const auto& [name, config] : variants) {
    SCOPED_TRACE(name);
    absl::StatusOr<Optimizer> host = Optimizer::Create(config.optimizer);
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
      // The kernels sum the squares in float64 lanes (lane_sums.h), the host
      // in one chain: the norms agree to float64 rounding, not bit for bit.
      EXPECT_NEAR(out->state.grad_norm, *norm, 1e-14 * *norm);
      EXPECT_EQ(out->state.update.lr, lr);
      EXPECT_EQ(out->state.scaler.scale, scaler.state().scale);
      EXPECT_EQ(out->state.scaler.good_steps, scaler.state().good_steps);
      EXPECT_EQ(out->next_loss_scale, static_cast<float>(scaler.scale()));
      EXPECT_TRUE(SameBits(out->statistic, c.updated_statistic));
      const std::vector<std::string> slot_names = OptimizerSlotNames(config.optimizer);
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
