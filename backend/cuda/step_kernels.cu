// The CUDA backend's training-step kernels (backend/step_kernels.h), on the
// backend's stream, applying backend/common/update_rules.h:
//
//   Unscale      grid (kBlocksPerGradient, gradients): each block unscales
//                a stripe of one gradient in place (float32 arithmetic, one
//                rounding on store for 16-bit) and writes its sum of
//                squares and a non-finite flag to its own partial slot;
//   Decide       one block adds the partials in a fixed order (so the norm,
//                and clipping, are the same from run to run), reads the
//                loss, and runs DecideStep and the loss-scale update;
//   Update       grid (blocks, parameters): the optimizer over every
//                parameter at once; every block returns at once when the
//                step was skipped;
//   CopyIfKept   a running statistic, unless the step was skipped.
//
// Tensor lists travel as kernel arguments, in launches of up to
// kTensorsPerLaunch tensors, so a step copies nothing from the host. The
// only host-side state is the partial-sum scratch, kept between steps.
#include <algorithm>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/step_kernels.h"

namespace castor::cuda {
namespace {

constexpr int kTensorsPerLaunch = 48;
constexpr int kBlocksPerGradient = 64;

// a | b (the non-finite flags).
struct OrCombine {
  __device__ __forceinline__ int operator()(int a, int b) const { return a | b; }
};

enum GradientType : int32_t { kGradFloat32, kGradFloat16, kGradBFloat16 };

struct UnscaleList {
  void* data[kTensorsPerLaunch];
  int64_t count[kTensorsPerLaunch];
  int32_t type[kTensorsPerLaunch];
  int32_t first;  // index of the list's first gradient among all of the step's
};

struct UpdateList {
  float* weight[kTensorsPerLaunch];
  const float* gradient[kTensorsPerLaunch];
  float* slot0[kTensorsPerLaunch];
  float* slot1[kTensorsPerLaunch];
  int64_t count[kTensorsPerLaunch];
};

template <typename T>
__device__ __forceinline__ void UnscaleStripe(T* data, int64_t count, float inverse,
                                              double& sum, int& bad) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    // Non-finite after unscaling, as the CPU backend decides (a finite
    // value overflows only when the scale is below 1).
    const T stored = FromFloat<T>(ToFloat(data[i]) * inverse);
    const float unscaled = ToFloat(stored);
    if (!IsFiniteFloat(unscaled)) {
      bad = 1;
      continue;
    }
    data[i] = stored;
    sum += static_cast<double>(unscaled) * unscaled;
  }
}

__global__ void UnscaleKernel(LossScalerOptions scaler, const StepState* state, UnscaleList list,
                              double* partial_sums, int* partial_flags) {
  const int t = blockIdx.y;
  const float inverse = static_cast<float>(1.0 / CurrentLossScale(scaler, state->scaler));
  double sum = 0.0;
  int bad = 0;
  switch (list.type[t]) {
    case kGradFloat32:
      UnscaleStripe(static_cast<float*>(list.data[t]), list.count[t], inverse, sum, bad);
      break;
    case kGradFloat16:
      UnscaleStripe(static_cast<__half*>(list.data[t]), list.count[t], inverse, sum, bad);
      break;
    default:
      UnscaleStripe(static_cast<__nv_bfloat16*>(list.data[t]), list.count[t], inverse, sum, bad);
      break;
  }
  sum = BlockSum(sum);
  bad = BlockReduce(bad, OrCombine(), 0);
  if (threadIdx.x == 0) {
    const int64_t slot = static_cast<int64_t>(list.first + t) * kBlocksPerGradient + blockIdx.x;
    partial_sums[slot] = sum;
    partial_flags[slot] = bad;
  }
}

__global__ void DecideKernel(StepConfig config, const double* partial_sums,
                             const int* partial_flags, int64_t partials, const float* loss,
                             StepState* state, float* next_loss_scale) {
  double sum = 0.0;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < partials; i += blockDim.x) {
    sum += partial_sums[i];
    bad |= partial_flags[i];
  }
  sum = BlockSum(sum);
  bad = BlockReduce(bad, OrCombine(), 0);
  if (threadIdx.x == 0) {
    state->sum_squares = sum;
    state->non_finite = bad;
    DecideStep(config, IsFiniteFloat(*loss), *state);
    *next_loss_scale = static_cast<float>(CurrentLossScale(config.scaler, state->scaler));
  }
}

__global__ void UpdateKernel(OptimizerOptions options, const StepState* state, UpdateList list) {
  if (state->skipped) return;
  const UpdateScalars update = state->update;
  const int t = blockIdx.y;
  float* weight = list.weight[t];
  const float* gradient = list.gradient[t];
  float* slot0 = list.slot0[t];
  float* slot1 = list.slot1[t];
  CASTOR_GRID_STRIDE(i, list.count[t]) {
    OptimizerUpdate(options, update, weight[i], gradient[i],
                    slot0 == nullptr ? nullptr : slot0 + i, slot1 == nullptr ? nullptr : slot1 + i);
  }
}

template <typename Word>
__global__ void CopyUnlessSkippedKernel(const StepState* state, const Word* source,
                                        Word* destination, int64_t words) {
  if (state->skipped) return;
  CASTOR_GRID_STRIDE(i, words) { destination[i] = source[i]; }
}

absl::Status LastLaunch(const char* what) {
  return CudaStatus(cudaGetLastError(), what);
}

class CudaStepKernels : public StepKernels {
 public:
  explicit CudaStepKernels(CudaBackend& backend) : backend_(backend) {}
  ~CudaStepKernels() override {
    if (scratch_ != nullptr) backend_.Free(scratch_);
    for (void* old : outgrown_) backend_.Free(old);
  }

  absl::Status UnscaleAndDecide(const StepConfig& config, const std::vector<TensorView>& gradients,
                                const TensorView& loss, StepState* state,
                                float* next_loss_scale) override {
    CASTOR_RETURN_IF_ERROR(CheckStepInputs(gradients, loss));
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    const int64_t partials = static_cast<int64_t>(gradients.size()) * kBlocksPerGradient;
    CASTOR_RETURN_IF_ERROR(ReserveScratch(partials));
    auto* sums = static_cast<double*>(scratch_);
    auto* flags = reinterpret_cast<int*>(sums + scratch_partials_);
    const cudaStream_t stream = backend_.stream();
    for (size_t first = 0; first < gradients.size(); first += kTensorsPerLaunch) {
      const int size = static_cast<int>(std::min<size_t>(kTensorsPerLaunch, gradients.size() - first));
      UnscaleList list{};
      list.first = static_cast<int32_t>(first);
      for (int t = 0; t < size; ++t) {
        const TensorView& g = gradients[first + t];
        list.data[t] = g.data;
        list.count[t] = g.num_elements();
        list.type[t] = g.dtype == DType::kFloat32   ? kGradFloat32
                       : g.dtype == DType::kFloat16 ? kGradFloat16
                                                    : kGradBFloat16;
      }
      UnscaleKernel<<<dim3(kBlocksPerGradient, size), kThreads, 0, stream>>>(config.scaler, state,
                                                                            list, sums, flags);
      CASTOR_RETURN_IF_ERROR(LastLaunch("unscale-and-check kernel"));
    }
    DecideKernel<<<1, kThreads, 0, stream>>>(config, sums, flags, partials, loss.as<float>(), state,
                                             next_loss_scale);
    return LastLaunch("step decision kernel");
  }

  absl::Status ApplyOptimizer(const StepConfig& config,
                              const std::vector<ParameterUpdate>& parameters,
                              const StepState* state) override {
    CASTOR_RETURN_IF_ERROR(CheckParameters(config.optimizer, parameters));
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    for (size_t first = 0; first < parameters.size(); first += kTensorsPerLaunch) {
      const int size = static_cast<int>(std::min<size_t>(kTensorsPerLaunch, parameters.size() - first));
      UpdateList list{};
      int64_t largest = 0;
      for (int t = 0; t < size; ++t) {
        const ParameterUpdate& p = parameters[first + t];
        list.weight[t] = p.weight.as<float>();
        list.gradient[t] = p.gradient.as<float>();
        list.slot0[t] = p.slots[0];
        list.slot1[t] = p.slots[1];
        list.count[t] = p.weight.num_elements();
        largest = std::max(largest, list.count[t]);
      }
      const unsigned blocks = std::min(Blocks(largest), 1024u);
      UpdateKernel<<<dim3(blocks, size), kThreads, 0, backend_.stream()>>>(config.optimizer, state,
                                                                          list);
      CASTOR_RETURN_IF_ERROR(LastLaunch("multi-tensor optimizer kernel"));
    }
    return absl::OkStatus();
  }

  absl::Status CopyUnlessSkipped(const TensorView& destination, const TensorView& source,
                                 const StepState* state) override {
    CASTOR_RETURN_IF_ERROR(CheckCopy(destination, source));
    const int64_t bytes = static_cast<int64_t>(source.byte_size());
    if (bytes == 0 || destination.data == source.data) return absl::OkStatus();
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    const cudaStream_t stream = backend_.stream();
    if (bytes % 4 == 0) {
      CopyUnlessSkippedKernel<<<Blocks(bytes / 4), kThreads, 0, stream>>>(
          state, static_cast<const uint32_t*>(source.data), static_cast<uint32_t*>(destination.data),
          bytes / 4);
    } else {
      CopyUnlessSkippedKernel<<<Blocks(bytes), kThreads, 0, stream>>>(
          state, static_cast<const uint8_t*>(source.data), static_cast<uint8_t*>(destination.data),
          bytes);
    }
    return LastLaunch("running-statistics commit kernel");
  }

 private:
  // Room for `partials` sums and flags; grows, never shrinks. An outgrown
  // scratch is kept until the step kernels go: queued kernels may still
  // read it, and so may a recorded step (CUDA graph) of another trainer on
  // this backend, which replays with the address it was recorded with.
  absl::Status ReserveScratch(int64_t partials) {
    if (partials <= scratch_partials_) return absl::OkStatus();
    CASTOR_ASSIGN_OR_RETURN(void* grown, backend_.Allocate(static_cast<size_t>(partials) *
                                                           (sizeof(double) + sizeof(int))));
    if (scratch_ != nullptr) outgrown_.push_back(scratch_);
    scratch_ = grown;
    scratch_partials_ = partials;
    return absl::OkStatus();
  }

  CudaBackend& backend_;
  void* scratch_ = nullptr;
  int64_t scratch_partials_ = 0;
  std::vector<void*> outgrown_;
};

}  // namespace

std::unique_ptr<StepKernels> MakeCudaStepKernels(CudaBackend& backend) {
  return std::make_unique<CudaStepKernels>(backend);
}

}  // namespace castor::cuda
