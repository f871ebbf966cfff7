// The CUDA backend's training-step kernels (backend/cuda/step_kernels.cu)
// against the CPU backend's: unscale-and-check, the step decision and
// loss-scale update, the multi-tensor optimizer (SGD with momentum and
// Nesterov, Adam, AdamW; weight decay; clipping) over several steps and
// over more parameters than one launch takes; a skipped step changes
// nothing; two runs give the same bits. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "graph/half.h"
#include "tests/cuda_test_util.h"
#include "tests/step_kernels_test_util.h"

namespace castor {
namespace {

using ::castor::testing::Cpu;
using ::castor::testing::Gpu;

// float32 tensors equal to rounding, relative to the tensor's largest
// magnitude (so Adam's v, about 1e-7..1e-5 here, is checked at its own
// scale): nvcc fuses a * b + c into FMAs, and the device's pow (bias
// corrections) and its order of summing squares (the norm behind
// clipping) differ from the host's.
void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dims(), want.dims()) << what;
  float largest = 0;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    largest = std::max(largest, std::fabs(want.data<float>()[i]));
  }
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-6 * largest)
        << what << " element " << i;
  }
}

void ExpectSameStep(const StepOutcome& gpu, const StepOutcome& cpu) {
  EXPECT_EQ(gpu.state.skipped, cpu.state.skipped);
  EXPECT_EQ(gpu.state.non_finite, cpu.state.non_finite);
  EXPECT_EQ(gpu.state.optimizer_step, cpu.state.optimizer_step);
  EXPECT_EQ(gpu.state.scaler.scale, cpu.state.scaler.scale);
  EXPECT_EQ(gpu.state.scaler.good_steps, cpu.state.scaler.good_steps);
  EXPECT_EQ(gpu.state.scaler.skipped_steps, cpu.state.scaler.skipped_steps);
  EXPECT_EQ(gpu.state.scale_used, cpu.state.scale_used);
  EXPECT_EQ(gpu.next_loss_scale, cpu.next_loss_scale);
  EXPECT_NEAR(gpu.state.grad_norm, cpu.state.grad_norm, 1e-12 * cpu.state.grad_norm);
  EXPECT_NEAR(gpu.state.update.lr, cpu.state.update.lr, 1e-15);
  EXPECT_TRUE(SameBits(gpu.statistic, cpu.statistic));
  for (size_t k = 0; k < cpu.weights.size(); ++k) {
    // Unscaling is one float32 multiply on both: the same bits.
    EXPECT_TRUE(SameBits(gpu.gradients[k], cpu.gradients[k])) << "gradient " << k;
    ExpectClose(gpu.weights[k], cpu.weights[k], "weight " + std::to_string(k));
    for (size_t s = 0; s < cpu.slots[k].size(); ++s) {
      ExpectClose(gpu.slots[k][s], cpu.slots[k][s],
                  "slot " + std::to_string(s) + " of " + std::to_string(k));
    }
  }
}

TEST(CudaStepKernelsTest, StepsMatchTheCpuBackend) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<StepConfig> configs = {
      MakeStepConfig(OptimizerKind::kSgd, 0.0, false, 0.0, 0.0),
      MakeStepConfig(OptimizerKind::kSgd, 0.9, true, 1e-2, 0.5),
      MakeStepConfig(OptimizerKind::kAdam, 0.0, false, 1e-2, 1.0),
      MakeStepConfig(OptimizerKind::kAdamW, 0.0, false, 5e-2, 0.0),
  };
  // 100 parameters: three launches of the multi-tensor kernels; one large
  // enough for many blocks per tensor.
  std::vector<std::vector<int64_t>> dims = {{300, 700}, {700}, {3, 2, 2}};
  for (int k = 0; k < 97; ++k) dims.push_back({k % 7 + 1, 5});
  for (size_t v = 0; v < configs.size(); ++v) {
    SCOPED_TRACE("config " + std::to_string(v));
    StepCase gpu_case = MakeStepCase(configs[v], dims, 11);
    StepCase cpu_case = gpu_case;
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      absl::StatusOr<StepOutcome> gpu = RunStepKernels(Gpu(), gpu_case);
      absl::StatusOr<StepOutcome> cpu = RunStepKernels(Cpu(), cpu_case);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      ASSERT_EQ(cpu->state.skipped, 0);
      ExpectSameStep(*gpu, *cpu);
      // Next step: each backend continues from its own state, with new
      // gradients scaled by the (same) new scale.
      StepCase next = MakeStepCase(configs[v], dims, 11 + 100 * step);
      const float rescale = cpu->next_loss_scale / 1024.0f;
      for (Tensor& g : next.gradients) {
        for (int64_t i = 0; i < g.num_elements(); ++i) g.data<float>()[i] *= rescale;
      }
      gpu_case.gradients = cpu_case.gradients = next.gradients;
      gpu_case.weights = gpu->weights;
      gpu_case.slots = gpu->slots;
      gpu_case.state = gpu->state;
      cpu_case.weights = cpu->weights;
      cpu_case.slots = cpu->slots;
      cpu_case.state = cpu->state;
    }
  }
}

TEST(CudaStepKernelsTest, SixteenBitGradientsUnscaleLikeTheCpu) {
  CASTOR_REQUIRE_CUDA();
  // 1000, not a power of two: unscaling rounds, on the device through
  // __float2half_rn / __float2bfloat16_rn, on the host through graph/half.h.
  StepConfig config = MakeStepConfig(OptimizerKind::kSgd, 0.0, false, 0.0, 0.0, 1000.0);
  StepCase c = MakeStepCase(config, {}, 5);
  Tensor f16(DType::kFloat16, {1000});
  Tensor bf16(DType::kBFloat16, {777});
  const Tensor source = RandomFloats({1000}, 9, 300.0f);
  for (int64_t i = 0; i < 1000; ++i) f16.data<uint16_t>()[i] = FloatToHalfBits(source.data<float>()[i]);
  for (int64_t i = 0; i < 777; ++i) bf16.data<uint16_t>()[i] = FloatToBFloat16Bits(source.data<float>()[i]);
  // Gradients without parameters: RunStepKernels pairs gradients with
  // weights, so run the unscale pass through a parameterless case and
  // compare the states and the unscaled values.
  auto run = [&](Backend& backend) -> absl::StatusOr<std::pair<StepState, std::vector<Tensor>>> {
    std::vector<void*> owned;
    std::vector<TensorView> views;
    for (const Tensor* t : {&f16, &bf16}) {
      CASTOR_ASSIGN_OR_RETURN(void* p, backend.Allocate(t->byte_size()));
      owned.push_back(p);
      CASTOR_RETURN_IF_ERROR(backend.CopyFromHost(p, t->raw(), t->byte_size()));
      views.push_back({p, t->dtype(), t->dims()});
    }
    CASTOR_ASSIGN_OR_RETURN(void* state, backend.Allocate(sizeof(StepState)));
    CASTOR_ASSIGN_OR_RETURN(void* loss, backend.Allocate(sizeof(float)));
    CASTOR_ASSIGN_OR_RETURN(void* next, backend.Allocate(sizeof(float)));
    CASTOR_RETURN_IF_ERROR(backend.CopyFromHost(state, &c.state, sizeof(StepState)));
    CASTOR_RETURN_IF_ERROR(backend.CopyFromHost(loss, c.loss.raw(), sizeof(float)));
    CASTOR_RETURN_IF_ERROR(backend.step_kernels()->UnscaleAndDecide(
        config, views, {loss, DType::kFloat32, {}}, static_cast<StepState*>(state),
        static_cast<float*>(next)));
    std::pair<StepState, std::vector<Tensor>> out;
    CASTOR_RETURN_IF_ERROR(backend.CopyToHost(&out.first, state, sizeof(StepState)));
    for (const TensorView& v : views) {
      Tensor t(v.dtype, v.dims);
      CASTOR_RETURN_IF_ERROR(backend.CopyToHost(t.raw(), v.data, t.byte_size()));
      out.second.push_back(std::move(t));
    }
    for (void* p : owned) backend.Free(p);
    for (void* p : {state, loss, next}) backend.Free(p);
    return out;
  };
  auto gpu = run(Gpu());
  auto cpu = run(Cpu());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(gpu->first.skipped, 0);
  EXPECT_NEAR(gpu->first.sum_squares, cpu->first.sum_squares, 1e-12 * cpu->first.sum_squares);
  EXPECT_TRUE(SameBits(gpu->second[0], cpu->second[0]));
  EXPECT_TRUE(SameBits(gpu->second[1], cpu->second[1]));
}

TEST(CudaStepKernelsTest, ASkippedStepChangesNothing) {
  CASTOR_REQUIRE_CUDA();
  StepConfig config = MakeStepConfig(OptimizerKind::kAdam, 0.0, false, 0.0, 1.0);
  StepCase c = MakeStepCase(config, {{64, 64}, {64}}, 3);
  c.state.optimizer_step = 7;
  for (auto& slots : c.slots) {
    slots = {RandomFloats(slots[0].dims(), 4), RandomFloats(slots[0].dims(), 5)};
  }
  c.gradients[0].data<float>()[4000] = std::numeric_limits<float>::infinity();
  absl::StatusOr<StepOutcome> gpu = RunStepKernels(Gpu(), c);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->state.skipped, 1);
  EXPECT_EQ(gpu->state.non_finite, 1);
  EXPECT_EQ(gpu->state.optimizer_step, 7);
  EXPECT_EQ(gpu->state.scaler.scale, 512.0);
  EXPECT_EQ(gpu->next_loss_scale, 512.0f);
  for (size_t k = 0; k < c.weights.size(); ++k) {
    EXPECT_TRUE(SameBits(gpu->weights[k], c.weights[k])) << k;
    for (size_t s = 0; s < 2; ++s) EXPECT_TRUE(SameBits(gpu->slots[k][s], c.slots[k][s])) << k;
  }
  EXPECT_TRUE(SameBits(gpu->statistic, c.statistic));

  c = MakeStepCase(config, {{8}}, 3);
  c.loss = Tensor::Scalar(std::nanf(""));
  gpu = RunStepKernels(Gpu(), c);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->state.skipped, 1);
  EXPECT_EQ(gpu->state.non_finite, 0);
  EXPECT_TRUE(SameBits(gpu->weights[0], c.weights[0]));
}

TEST(CudaStepKernelsTest, TwoRunsGiveTheSameBits) {
  CASTOR_REQUIRE_CUDA();
  // Clipping makes every weight depend on the norm: a norm summed in a
  // varying order would show here.
  StepConfig config = MakeStepConfig(OptimizerKind::kSgd, 0.9, false, 0.0, 0.1);
  StepCase c = MakeStepCase(config, {{512, 513}, {1000}, {77}}, 8);
  absl::StatusOr<StepOutcome> first = RunStepKernels(Gpu(), c);
  absl::StatusOr<StepOutcome> second = RunStepKernels(Gpu(), c);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->state.grad_norm, second->state.grad_norm);
  for (size_t k = 0; k < c.weights.size(); ++k) {
    EXPECT_TRUE(SameBits(first->weights[k], second->weights[k])) << k;
  }
}

}  // namespace
}  // namespace castor
