// CUDA kernels: normalization family (ops of graph/ops/normalization.cc) and
// the com.castor BatchNormalizationGrad / LayerNormalizationGrad /
// InstanceNormalizationGrad, matching
// backend/cpu/normalization.cc and backend/cpu/normalization_grad.cc.
//
// BatchNormalization: X [N, C, D1, ...] in float32/float16/bfloat16; scale,
// B, mean and var in any of those (widened to float32 first). Inference
// folds the running statistics into y = x * a + b per channel. Training
// (opset 14+ training_mode = 1; below 14 when output 1 is requested) takes
// the batch statistics in two float32 passes over X (mean, then the biased
// variance, which both normalises and feeds running_var = var_in *
// momentum + var * (1 - momentum), as the CPU and the ONNX reference do;
// castor's BatchNormalizationTraining, the training graph's form, is the
// same with PyTorch's unbiased var * count / (count - 1) in that update),
// each pass summing a channel in chunks, one block per (chunk, channel),
// and adding the chunk sums in a fixed pattern (deterministic). `spatial` =
// 0 (opsets 7-8) normalises each [C, D1, ...] entry; relu = 1 (castor's
// fused BatchNormalization -> Relu) applies Relu before Y's rounding. Per-channel
// coefficients are formed in float64 from the float32 statistics, as the
// CPU forms them.
// BatchNormalizationGrad recomputes the batch statistics the same way (the
// mean read from input 3 instead where the graph passes the forward's: the
// same values, from the same kernels) and also sums dY and dY * (x - mean)
// per channel; dX is one elementwise pass. With input 4 (relu_output, the
// output of a Relu fused after the BatchNormalization) both read dY through
// ReluGrad's select: dY where relu_output > 0, else +0.
// LayerNormalization / LayerNormalizationGrad: one warp per row for rows of
// up to kWarpRowLimit elements, else one block per row; two-pass float32
// statistics. Scale and B broadcast to X as the CPU allows (any
// unidirectional broadcast; the usual full-row case indexes directly), in
// X's dtype or float32 (castor's form: a 16-bit X with float32 Scale, B).
// LayerNormalizationGrad's dScale/dBias sum dY * x_hat and dY down the rows
// in float32: one thread per column over a chunk of rows writes the chunk's
// sums, then one thread per scale element adds its columns' chunk sums in
// a fixed order (deterministic, like every sum of this file), and the
// result is rounded once into the scale's dtype.
// InstanceNormalization / InstanceNormalizationGrad: the (n, c) slices of
// X [N, C, D1, ...] are rows, laid out as LayerNorm's (warp or block per
// row); the two float32 passes sum x - x[row start] so that a mean far
// from zero does not cancel away the variance (the shift is the row's first
// value: x - shift is exact where x is within a factor two of it).
// InstanceNormalizationGrad writes each row's sum(dY) and sum(dY * x_hat)
// and one thread per channel adds them over n in order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/elementwise_math.h"
#include "backend/common/op_geometry.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

// Rows of at most this many elements get one warp each, longer ones a block.
constexpr int64_t kWarpRowLimit = 1024;
// The most axes a broadcast parameter index handles.
constexpr int kMaxBroadcastRank = 8;
// Grid cap for the kernels with a block (or a grid row) per channel; they
// loop beyond it.
constexpr int64_t kMaxChannelBlocks = 65535;

bool WantsOutput(const KernelContext& ctx, int i) {
  return i < ctx.num_outputs() && ctx.has_output(i);
}

// ---- row groups ----------------------------------------------------------------------

// The threads that share one row: a warp (kRowThreads = 32) or the whole
// block (kRowThreads = kThreads). Rows are visited in a grid-stride loop
// whose row is uniform across the group, so the group's reductions may
// synchronise inside it.
template <int kRowThreads>
struct RowGroup {
  static_assert(kRowThreads == 32 || kRowThreads == kThreads);
  static constexpr bool kWarp = kRowThreads == 32;
  static constexpr int kSize = kRowThreads;
  __device__ static int Lane() { return kWarp ? (threadIdx.x & 31) : threadIdx.x; }
  __device__ static int64_t FirstRow() {
    return kWarp ? blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32
                 : static_cast<int64_t>(blockIdx.x);
  }
  __device__ static int64_t RowStep() {
    return kWarp ? static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)
                 : static_cast<int64_t>(gridDim.x);
  }
  // The sum of `v` over the group, in every thread of it; the whole group
  // must call it (block_reduce.cuh's rules).
  __device__ static float Sum(float v) {
    if constexpr (kWarp) {
      return WarpSum(v);
    } else {
      return BlockSum(v);
    }
  }
};

// ---- float32 staging -------------------------------------------------------------------

// `t` as float32 on the device: its own data when float32, else a widened
// scratch copy (exact for 16-bit floats).
absl::StatusOr<const float*> Float32Of(KernelContext& ctx, const TensorView& t) {
  if (t.dtype == DType::kFloat32) return t.as<const float>();
  const int64_t n = t.num_elements();
  if (n == 0) return static_cast<const float*>(nullptr);
  CASTOR_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(static_cast<size_t>(n) * sizeof(float)));
  float* widened = static_cast<float*>(scratch);
  CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ConvertFloats(ctx, t.as<const T>(), n, widened);
  }));
  return static_cast<const float*>(widened);
}

// Rounds `n` float32 values at `src` (device) into `dst` (its dtype, `n`
// elements): a copy for float32.
absl::Status StoreFloat32(KernelContext& ctx, const float* src, int64_t n, TensorView& dst) {
  if (n == 0) return absl::OkStatus();
  if (dst.dtype == DType::kFloat32) {
    CASTOR_CUDA_CALL(cudaMemcpyAsync(dst.data, src, static_cast<size_t>(n) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, Stream(ctx)));
    return absl::OkStatus();
  }
  return DispatchFloat(ctx, dst.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ConvertFloats(ctx, src, n, dst.as<T>());
  });
}

// Allocates output `index` with its inferred dtype and `dims` and writes the
// `n` float32 values at `src` into it.
absl::Status WriteFloat32Output(KernelContext& ctx, int index, const std::vector<int64_t>& dims,
                                const float* src, int64_t n) {
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(index, dims));
  return StoreFloat32(ctx, src, n, *out);
}

// `count` float32 values of device scratch.
absl::StatusOr<float*> FloatScratch(KernelContext& ctx, int64_t count) {
  if (count == 0) return static_cast<float*>(nullptr);
  CASTOR_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(static_cast<size_t>(count) * sizeof(float)));
  return static_cast<float*>(scratch);
}

// ---- BatchNormalization ------------------------------------------------------------------

// Element k of the (batch * inner) elements of channel f in X [batch,
// features, inner].
__device__ __forceinline__ int64_t ChannelElement(int64_t k, int64_t f, int64_t features,
                                                  int64_t inner) {
  const int64_t n = k / inner;
  return (n * features + f) * inner + (k - n * inner);
}

// The per-channel affine map of normalisation, y = x * a + b, formed in
// float64 as the CPU does.
__device__ __forceinline__ void NormCoefficients(float scale, float shift, float mean, float var,
                                                 float epsilon, float* a, float* b) {
  const double a64 = static_cast<double>(scale) / sqrt(static_cast<double>(var) + epsilon);
  *a = static_cast<float>(a64);
  *b = static_cast<float>(static_cast<double>(shift) - static_cast<double>(mean) * a64);
}

// The running statistics and batch statistics of training mode, one array
// of `features` floats each (scratch), and the coefficients of y = x * a + b.
struct BatchNormStats {
  float* running_mean;
  float* running_var;
  float* mean;
  float* var;
  float* a;
  float* b;
};

// Inference: a and b from the given statistics.
__global__ void BatchNormInferenceCoefficientsKernel(const float* __restrict__ scale,
                                                     const float* __restrict__ shift,
                                                     const float* __restrict__ mean,
                                                     const float* __restrict__ var,
                                                     int64_t features, float epsilon,
                                                     float* __restrict__ a,
                                                     float* __restrict__ b) {
  CASTOR_GRID_STRIDE(f, features) {
    NormCoefficients(scale[f], shift[f], mean[f], var[f], epsilon, &a[f], &b[f]);
  }
}

// ---- per-channel sums in chunks ---------------------------------------------------------

// The training statistics of BatchNormalization and its gradient sum each
// channel's batch * inner elements in chunks of kChannelChunk, one block
// per (chunk, channel), so every SM works even when there are few channels.
// A block writes its chunk's sums to scratch and the per-channel totals add
// the chunks' sums in a fixed pattern: the result does not depend on how
// the blocks were scheduled.
constexpr int64_t kChannelChunk = 8 * kThreads;

// What one chunk pass sums per channel: X (kX); (X - mean)^2 (kSquares);
// (X - mean)^2, dY and dY * (X - mean) (kGradSums).
enum class ChannelSums { kX, kSquares, kGradSums };

constexpr int Quantities(ChannelSums what) { return what == ChannelSums::kGradSums ? 3 : 1; }

int64_t ChannelChunks(int64_t count) {
  return std::max<int64_t>(1, (count + kChannelChunk - 1) / kChannelChunk);
}

// dY[e] as BatchNormalizationGrad takes it: through the gradient of a
// fused Relu (ReluGrad's select) where relu_output is not null.
template <typename T>
__device__ __forceinline__ float GradientAt(const T* __restrict__ dy,
                                            const T* __restrict__ relu_output, int64_t e) {
  const float g = ToFloat(dy[e]);
  return relu_output == nullptr || ToFloat(relu_output[e]) > 0.0f ? g : 0.0f;
}

// partial[(q * features + f) * chunks + chunk] = sum q of chunk blockIdx.x
// of channel f (the y index, looping beyond the grid). `mean` (per
// channel) is read by kSquares and kGradSums; `dy` (through a fused Relu's
// gradient where relu_output is not null: GradientAt) by kGradSums.
template <typename T, ChannelSums kWhat>
__global__ void ChannelChunkSumsKernel(const T* __restrict__ x, const T* __restrict__ dy,
                                       const T* __restrict__ relu_output,
                                       const float* __restrict__ mean, int64_t features,
                                       int64_t inner, int64_t count, int64_t chunks,
                                       float* __restrict__ partial) {
  const int64_t begin = blockIdx.x * kChannelChunk;
  const int64_t end = min(count, begin + kChannelChunk);
  for (int64_t f = blockIdx.y; f < features; f += gridDim.y) {
    float sums[Quantities(kWhat)] = {};
    const float m = kWhat == ChannelSums::kX ? 0.0f : mean[f];
    for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
      const int64_t e = ChannelElement(k, f, features, inner);
      if constexpr (kWhat == ChannelSums::kX) {
        sums[0] += ToFloat(x[e]);
      } else {
        const float centred = ToFloat(x[e]) - m;
        sums[0] += centred * centred;
        if constexpr (kWhat == ChannelSums::kGradSums) {
          const float g = GradientAt(dy, relu_output, e);
          sums[1] += g;
          sums[2] += g * centred;
        }
      }
    }
    for (int q = 0; q < Quantities(kWhat); ++q) {
      const float total = BlockSum(sums[q]);
      if (threadIdx.x == 0) partial[(q * features + f) * chunks + blockIdx.x] = total;
    }
  }
}

// Sum q of channel f over its chunks: the block strides over the chunk
// sums and reduces (every thread of the block must call it).
__device__ __forceinline__ float ChannelTotal(const float* __restrict__ partial, int q,
                                              int64_t f, int64_t features, int64_t chunks) {
  const float* sums = partial + (q * features + f) * chunks;
  float total = 0.0f;
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) total += sums[j];
  return BlockSum(total);
}

// mean[f] = total X of channel f / count; one block per channel.
__global__ void ChannelMeanKernel(const float* __restrict__ partial, int64_t features,
                                  int64_t count, int64_t chunks, float* __restrict__ mean) {
  for (int64_t f = blockIdx.x; f < features; f += gridDim.x) {
    const float sum = ChannelTotal(partial, 0, f, features, chunks);
    if (threadIdx.x == 0) mean[f] = count > 0 ? sum / static_cast<float>(count) : 0.0f;
  }
}

// Queues the chunk pass `kWhat` over X [batch, features, inner] (and dY).
template <typename T, ChannelSums kWhat>
absl::Status LaunchChannelChunkSums(KernelContext& ctx, const T* x, const T* dy,
                                    const T* relu_output, const float* mean, int64_t features,
                                    int64_t inner, int64_t count, float* partial) {
  const int64_t chunks = ChannelChunks(count);
  const dim3 grid(static_cast<unsigned>(chunks),
                  static_cast<unsigned>(std::min(features, kMaxChannelBlocks)));
  ChannelChunkSumsKernel<T, kWhat><<<grid, kThreads, 0, Stream(ctx)>>>(
      x, dy, relu_output, mean, features, inner, count, chunks, partial);
  return CheckLaunch(ctx);
}

// Queues the batch mean of each channel into `mean`: a chunk pass, then the
// totals. `partial` holds ChannelChunks(count) * features floats.
template <typename T>
absl::Status LaunchChannelMeans(KernelContext& ctx, const T* x, int64_t features, int64_t inner,
                                int64_t count, float* partial, float* mean) {
  CASTOR_RETURN_IF_ERROR((LaunchChannelChunkSums<T, ChannelSums::kX>(
      ctx, x, nullptr, nullptr, nullptr, features, inner, count, partial)));
  const unsigned blocks = static_cast<unsigned>(std::min(features, kMaxChannelBlocks));
  ChannelMeanKernel<<<blocks, kThreads, 0, Stream(ctx)>>>(partial, features, count,
                                                           ChannelChunks(count), mean);
  return CheckLaunch(ctx);
}

// Training: from the chunk sums of (X - mean)^2, the biased variance, the
// running statistics and a, b; one block per channel. The running variance
// takes the batch variance times `running_var_factor`: 1 for ONNX's
// BatchNormalization (the spec's biased update), count / (count - 1) for
// castor's BatchNormalizationTraining (PyTorch's unbiased update; see
// common::BatchNormGeometry).
__global__ void BatchNormTrainingStatsKernel(const float* __restrict__ partial, int64_t features,
                                             int64_t count, int64_t chunks,
                                             const float* __restrict__ scale,
                                             const float* __restrict__ shift,
                                             const float* __restrict__ input_mean,
                                             const float* __restrict__ input_var, float epsilon,
                                             float momentum, double running_var_factor,
                                             BatchNormStats stats) {
  for (int64_t f = blockIdx.x; f < features; f += gridDim.x) {
    const float squares = ChannelTotal(partial, 0, f, features, chunks);
    if (threadIdx.x == 0) {
      const float mean = stats.mean[f];
      const float var = count > 0 ? squares / static_cast<float>(count) : 0.0f;
      stats.var[f] = var;
      const double keep = momentum;
      stats.running_mean[f] = static_cast<float>(input_mean[f] * keep + mean * (1.0 - keep));
      stats.running_var[f] =
          static_cast<float>(input_var[f] * keep + var * running_var_factor * (1.0 - keep));
      NormCoefficients(scale[f], shift[f], mean, var, epsilon, &stats.a[f], &stats.b[f]);
    }
  }
}

// y = x * a[f] + b[f], f the feature of each element of X [batch, features,
// inner].
template <typename T>
__global__ void BatchNormApplyKernel(const T* __restrict__ x, int64_t total, int64_t features,
                                     int64_t inner, const float* __restrict__ a,
                                     const float* __restrict__ b, bool relu,
                                     T* __restrict__ y) {
  CASTOR_GRID_STRIDE(e, total) {
    const int64_t f = (e / inner) % features;
    const float v = ToFloat(x[e]) * a[f] + b[f];
    y[e] = FromFloat<T>(relu ? math::ReluOp{}(v) : v);
  }
}

absl::Status BatchNormKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::BatchNormGeometry geometry, common::PlanBatchNorm(ctx));
  const bool training = geometry.training;
  const float epsilon = geometry.epsilon;
  const float momentum = geometry.momentum;
  const int64_t batch = geometry.batch, features = geometry.features, inner = geometry.inner;
  // castor's fused BatchNormalization -> Relu (fuse-batchnorm-relu).
  const bool relu = ctx.GetInt("relu", 0) != 0;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  if (features == 0) {
    // Nothing to normalise; the statistics outputs are empty too.
    for (int i = 1; training && i < ctx.num_outputs() && i <= 4; ++i) {
      if (!WantsOutput(ctx, i)) continue;
      CASTOR_RETURN_IF_ERROR(ctx.Output(i, ctx.input(3).dims).status());
    }
    return absl::OkStatus();
  }
  CASTOR_ASSIGN_OR_RETURN(const float* scale, Float32Of(ctx, ctx.input(1)));
  CASTOR_ASSIGN_OR_RETURN(const float* shift, Float32Of(ctx, ctx.input(2)));
  CASTOR_ASSIGN_OR_RETURN(const float* input_mean, Float32Of(ctx, ctx.input(3)));
  CASTOR_ASSIGN_OR_RETURN(const float* input_var, Float32Of(ctx, ctx.input(4)));
  CASTOR_ASSIGN_OR_RETURN(float* buffer, FloatScratch(ctx, 6 * features));
  float* partial = nullptr;  // the chunk sums of training mode
  if (training) {
    CASTOR_ASSIGN_OR_RETURN(partial,
                            FloatScratch(ctx, ChannelChunks(batch * inner) * features));
  }
  const BatchNormStats stats = {buffer,
                                buffer + features,
                                buffer + 2 * features,
                                buffer + 3 * features,
                                buffer + 4 * features,
                                buffer + 5 * features};
  const int64_t total = x.num_elements();
  CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (training) {
      const int64_t count = batch * inner;
      CASTOR_RETURN_IF_ERROR(
          LaunchChannelMeans<T>(ctx, x.as<T>(), features, inner, count, partial, stats.mean));
      CASTOR_RETURN_IF_ERROR((LaunchChannelChunkSums<T, ChannelSums::kSquares>(
          ctx, x.as<T>(), nullptr, nullptr, stats.mean, features, inner, count, partial)));
      const unsigned blocks = static_cast<unsigned>(std::min(features, kMaxChannelBlocks));
      BatchNormTrainingStatsKernel<<<blocks, kThreads, 0, Stream(ctx)>>>(
          partial, features, count, ChannelChunks(count), scale, shift, input_mean, input_var,
          epsilon, momentum, geometry.running_var_factor, stats);
    } else {
      BatchNormInferenceCoefficientsKernel<<<Blocks(features), kThreads, 0, Stream(ctx)>>>(
          scale, shift, input_mean, input_var, features, epsilon, stats.a, stats.b);
    }
    CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
    if (total == 0) return absl::OkStatus();
    BatchNormApplyKernel<T><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
        x.as<T>(), total, features, inner, stats.a, stats.b, relu, y->as<T>());
    return CheckLaunch(ctx);
  }));
  if (!training) return absl::OkStatus();
  // Opset 14+: (running_mean, running_var); before: (mean, var, saved_mean,
  // saved_var), the saved ones being the batch statistics.
  const float* outputs[] = {stats.running_mean, stats.running_var, stats.mean, stats.var};
  for (int i = 1; i < ctx.num_outputs() && i <= 4; ++i) {
    if (!ctx.has_output(i)) continue;
    CASTOR_RETURN_IF_ERROR(
        WriteFloat32Output(ctx, i, ctx.input(3).dims, outputs[i - 1], features));
  }
  return absl::OkStatus();
}

// ---- BatchNormalizationGrad ---------------------------------------------------------

// Per-channel results of BatchNormalizationGrad's reduction (scratch, one
// float per channel each): the batch statistics, the parameter gradients,
// and the coefficients of dX = a * (dY - mean_dy - x_hat * mean_dy_xhat).
struct BatchNormGradStats {
  const float* mean;  // the forward's (input 3) or this node's own
  float* inv_std;
  float* d_scale;       // sum(dY * x_hat)
  float* d_bias;        // sum(dY)
  float* a;             // scale * inv_std
  float* mean_dy;       // d_bias / count
  float* mean_dy_xhat;  // d_scale / count
};

// From the chunk sums of (X - mean)^2, dY and dY * (X - mean): the
// per-channel results above; one block per channel.
__global__ void BatchNormGradStatsKernel(const float* __restrict__ partial, int64_t channels,
                                         int64_t count, int64_t chunks,
                                         const float* __restrict__ scale, float epsilon,
                                         BatchNormGradStats stats) {
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    const float squares = ChannelTotal(partial, 0, c, channels, chunks);
    const float dy_sum = ChannelTotal(partial, 1, c, channels, chunks);
    const float dy_centred = ChannelTotal(partial, 2, c, channels, chunks);
    if (threadIdx.x == 0) {
      const double var = count > 0 ? static_cast<double>(squares) / count : 0.0;
      const double inv_std = 1.0 / sqrt(var + epsilon);
      const double d_scale = dy_centred * inv_std;
      stats.inv_std[c] = static_cast<float>(inv_std);
      stats.d_scale[c] = static_cast<float>(d_scale);
      stats.d_bias[c] = dy_sum;
      stats.a[c] = static_cast<float>(scale[c] * inv_std);
      stats.mean_dy[c] = static_cast<float>(static_cast<double>(dy_sum) / count);
      stats.mean_dy_xhat[c] = static_cast<float>(d_scale / count);
    }
  }
}

template <typename T>
__global__ void BatchNormGradInputKernel(const T* dy, const T* __restrict__ x,
                                         const T* __restrict__ relu_output, int64_t total,
                                         int64_t channels, int64_t inner,
                                         BatchNormGradStats stats, T* dx) {
  CASTOR_GRID_STRIDE(e, total) {
    const int64_t c = (e / inner) % channels;
    const float x_hat = (ToFloat(x[e]) - stats.mean[c]) * stats.inv_std[c];
    dx[e] = FromFloat<T>(stats.a[c] * (GradientAt(dy, relu_output, e) - stats.mean_dy[c] -
                                       x_hat * stats.mean_dy_xhat[c]));
  }
}

// The outputs of a normalization gradient node, each allocated only where
// the graph reads it (else null): dx shaped as x, d_scale and d_bias as
// the scale (`param_dims`, in `param_dtype`).
struct NormGradOutputs {
  TensorView* dx = nullptr;
  TensorView* d_scale = nullptr;
  TensorView* d_bias = nullptr;
};

absl::StatusOr<NormGradOutputs> AllocateNormGradOutputs(KernelContext& ctx, const TensorView& x,
                                                        DType param_dtype,
                                                        const std::vector<int64_t>& param_dims) {
  NormGradOutputs out;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(out.dx, ctx.Output(0, x.dtype, x.dims));
  }
  if (WantsOutput(ctx, 1)) {
    CASTOR_ASSIGN_OR_RETURN(out.d_scale, ctx.Output(1, param_dtype, param_dims));
  }
  if (WantsOutput(ctx, 2)) {
    CASTOR_ASSIGN_OR_RETURN(out.d_bias, ctx.Output(2, param_dtype, param_dims));
  }
  return out;
}

absl::Status BatchNormGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::BatchNormGradGeometry geometry,
                          common::PlanBatchNormGrad(ctx));
  const int64_t batch = geometry.batch, channels = geometry.channels, inner = geometry.inner;
  const float epsilon = ctx.GetFloat("epsilon", 1e-5f);
  CASTOR_ASSIGN_OR_RETURN(const NormGradOutputs outputs,
                          AllocateNormGradOutputs(ctx, x, scale_view.dtype, scale_view.dims));
  TensorView *dx = outputs.dx, *d_scale = outputs.d_scale, *d_bias = outputs.d_bias;
  if (channels == 0) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(const float* scale, Float32Of(ctx, scale_view));
  CASTOR_ASSIGN_OR_RETURN(float* buffer, FloatScratch(ctx, 7 * channels));
  CASTOR_ASSIGN_OR_RETURN(
      float* partial,
      FloatScratch(ctx, Quantities(ChannelSums::kGradSums) * ChannelChunks(batch * inner) *
                            channels));
  // The forward's batch mean (float32 [C]: InferNormGrad) where given.
  const float* saved_mean = ctx.has_input(3) ? ctx.input(3).as<float>() : nullptr;
  // The fused Relu's output (X's dtype and dims: PlanBatchNormGrad) where given.
  const TensorView* relu_output = ctx.has_input(4) ? &ctx.input(4) : nullptr;
  const BatchNormGradStats stats = {saved_mean != nullptr ? saved_mean : buffer,
                                    buffer + channels,
                                    buffer + 2 * channels,
                                    buffer + 3 * channels,
                                    buffer + 4 * channels,
                                    buffer + 5 * channels,
                                    buffer + 6 * channels};
  const int64_t total = x.num_elements();
  CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t count = batch * inner;
    if (saved_mean == nullptr) {
      CASTOR_RETURN_IF_ERROR(
          LaunchChannelMeans<T>(ctx, x.as<T>(), channels, inner, count, partial, buffer));
    }
    const T* relu = relu_output != nullptr ? relu_output->as<T>() : nullptr;
    CASTOR_RETURN_IF_ERROR((LaunchChannelChunkSums<T, ChannelSums::kGradSums>(
        ctx, x.as<T>(), dy.as<T>(), relu, stats.mean, channels, inner, count, partial)));
    const unsigned blocks = static_cast<unsigned>(std::min(channels, kMaxChannelBlocks));
    BatchNormGradStatsKernel<<<blocks, kThreads, 0, Stream(ctx)>>>(
        partial, channels, count, ChannelChunks(count), scale, epsilon, stats);
    CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
    if (dx == nullptr || total == 0) return absl::OkStatus();
    BatchNormGradInputKernel<T><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
        dy.as<T>(), x.as<T>(), relu, total, channels, inner, stats, dx->as<T>());
    return CheckLaunch(ctx);
  }));
  if (d_scale != nullptr) {
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, stats.d_scale, channels, *d_scale));
  }
  if (d_bias != nullptr) {
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, stats.d_bias, channels, *d_bias));
  }
  return absl::OkStatus();
}

// ---- LayerNormalization -------------------------------------------------------------

// Where a parameter broadcast (right-aligned) against `dims` keeps the value
// of each element: offset = sum of index[d] * strides[d] (stride 0 on
// broadcast axes). `row_identity`: the parameter holds one value per
// position of a row (the axes from the first row axis on) and none varies
// with the axes before, so the offset is the position within the row.
struct ParamIndex {
  bool row_identity = false;
  int rank = 0;
  int64_t dims[kMaxBroadcastRank] = {};
  int64_t strides[kMaxBroadcastRank] = {};

  // The offset of element `flat` (row-major over dims) at position `j` of
  // its row.
  __device__ __forceinline__ int64_t Offset(int64_t flat, int64_t j) const {
    if (row_identity) return j;
    int64_t offset = 0;
#pragma unroll
    for (int d = kMaxBroadcastRank - 1; d >= 0; --d) {
      if (d < rank) {
        const int64_t q = flat / dims[d];
        offset += (flat - q * dims[d]) * strides[d];
        flat = q;
      }
    }
    return offset;
  }
};

// The index of a parameter of `param_dims` broadcast to `dims`, whose rows
// span the axes from `first_row_axis` on; Unimplemented beyond
// kMaxBroadcastRank axes when the general form is needed.
absl::StatusOr<ParamIndex> MakeParamIndex(const KernelContext& ctx,
                                          const std::vector<int64_t>& param_dims,
                                          const std::vector<int64_t>& dims,
                                          int64_t first_row_axis) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t param_rank = static_cast<int64_t>(param_dims.size());
  std::vector<int64_t> strides(dims.size(), 0);
  int64_t step = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    const int64_t pd = d - (rank - param_rank);
    if (pd < 0) continue;
    if (param_dims[pd] != 1) strides[d] = step;
    step *= param_dims[pd];
  }
  // Row identity: the strides of a contiguous row on the row axes, zero
  // before them (size-1 axes index nothing).
  ParamIndex index;
  index.row_identity = true;
  int64_t row_step = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    const bool row_axis = d >= first_row_axis;
    if (dims[d] != 1 && strides[d] != (row_axis ? row_step : 0)) index.row_identity = false;
    if (row_axis) row_step *= dims[d];
  }
  if (index.row_identity) return index;
  if (rank > kMaxBroadcastRank) {
    return ctx.Unimplemented(absl::StrCat("the CUDA kernel broadcasts parameters over at most ",
                                          kMaxBroadcastRank, " axes; X has ", rank));
  }
  index.rank = static_cast<int>(rank);
  for (int64_t d = 0; d < rank; ++d) {
    index.dims[d] = dims[d];
    index.strides[d] = strides[d];
  }
  return index;
}

// Rows of `inner` elements: the mean and 1 / sqrt(biased variance +
// epsilon) of row `row_data`, two passes over it, for RowGroup `Group`.
template <typename Group, typename T>
__device__ __forceinline__ void RowStatistics(const T* row_data, int64_t inner, float epsilon,
                                              float* mean, float* inv_std) {
  float sum = 0.0f;
  for (int64_t j = Group::Lane(); j < inner; j += Group::kSize) sum += ToFloat(row_data[j]);
  sum = Group::Sum(sum);
  const float m = inner > 0 ? sum / static_cast<float>(inner) : 0.0f;
  float squares = 0.0f;
  for (int64_t j = Group::Lane(); j < inner; j += Group::kSize) {
    const float d = ToFloat(row_data[j]) - m;
    squares += d * d;
  }
  squares = Group::Sum(squares);
  const float var = inner > 0 ? squares / static_cast<float>(inner) : 0.0f;
  *mean = m;
  *inv_std = 1.0f / sqrtf(var + epsilon);
}

// Y = (X - mean) * inv_std * Scale (+ B) over rows of `inner` elements
// (Scale and B widened to float32); the row statistics also go to
// row_mean / row_inv_std when not null.
template <typename T, int kRowThreads>
__global__ void __launch_bounds__(kThreads)
    LayerNormKernel(const T* __restrict__ x, const float* __restrict__ scale,
                    const float* __restrict__ bias, ParamIndex scale_at, ParamIndex bias_at,
                    int64_t outer, int64_t inner, float epsilon, T* __restrict__ y,
                    float* __restrict__ row_mean, float* __restrict__ row_inv_std) {
  using Group = RowGroup<kRowThreads>;
  for (int64_t r = Group::FirstRow(); r < outer; r += Group::RowStep()) {
    const T* xr = x + r * inner;
    float mean = 0.0f, inv_std = 0.0f;
    RowStatistics<Group>(xr, inner, epsilon, &mean, &inv_std);
    if (Group::Lane() == 0) {
      if (row_mean != nullptr) row_mean[r] = mean;
      if (row_inv_std != nullptr) row_inv_std[r] = inv_std;
    }
    for (int64_t j = Group::Lane(); j < inner; j += kRowThreads) {
      const int64_t e = r * inner + j;
      float v = (ToFloat(xr[j]) - mean) * inv_std * scale[scale_at.Offset(e, j)];
      if (bias != nullptr) v += bias[bias_at.Offset(e, j)];
      y[e] = FromFloat<T>(v);
    }
  }
}

// Calls launch(std::integral_constant<int, threads per row>, blocks) with
// one warp per row for short rows, else one block per row.
template <typename F>
absl::Status LaunchRows(int64_t outer, int64_t inner, F&& launch) {
  if (inner <= kWarpRowLimit) {
    return launch(std::integral_constant<int, 32>{}, Blocks(outer * 32));
  }
  return launch(std::integral_constant<int, kThreads>{}, Blocks(outer * kThreads));
}

absl::Status LayerNormKernelFor(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::LayerNormGeometry geometry, common::PlanLayerNorm(ctx));
  const int64_t axis = geometry.axis, outer = geometry.outer, inner = geometry.inner;
  const float epsilon = ctx.GetFloat("epsilon", 1e-5f);
  CASTOR_ASSIGN_OR_RETURN(const ParamIndex scale_at,
                          MakeParamIndex(ctx, ctx.input(1).dims, x.dims, axis));
  const bool has_bias = ctx.has_input(2);
  ParamIndex bias_at;
  if (has_bias) {
    CASTOR_ASSIGN_OR_RETURN(bias_at, MakeParamIndex(ctx, ctx.input(2).dims, x.dims, axis));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  std::vector<int64_t> stats_dims = x.dims;
  for (size_t d = static_cast<size_t>(axis); d < stats_dims.size(); ++d) stats_dims[d] = 1;
  // The optional Mean and InvStdDev outputs (stash_type's dtype): written in
  // place when float32, else staged in float32 scratch and rounded.
  TensorView* stats_out[2] = {nullptr, nullptr};
  float* stats_data[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    if (!WantsOutput(ctx, i + 1)) continue;
    CASTOR_ASSIGN_OR_RETURN(stats_out[i], ctx.Output(i + 1, stats_dims));
    if (stats_out[i]->dtype == DType::kFloat32) {
      stats_data[i] = stats_out[i]->as<float>();
    } else {
      CASTOR_ASSIGN_OR_RETURN(stats_data[i], FloatScratch(ctx, outer));
    }
  }
  if (outer == 0) return absl::OkStatus();
  // Scale and B: X's dtype, or float32 beside a 16-bit X (castor's form).
  CASTOR_ASSIGN_OR_RETURN(const float* scale, Float32Of(ctx, ctx.input(1)));
  const float* bias = nullptr;
  if (has_bias) {
    CASTOR_ASSIGN_OR_RETURN(bias, Float32Of(ctx, ctx.input(2)));
  }
  CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchRows(outer, inner, [&](auto row_threads, unsigned blocks) {
      LayerNormKernel<T, decltype(row_threads)::value><<<blocks, kThreads, 0, Stream(ctx)>>>(
          x.as<T>(), scale, bias, scale_at, bias_at, outer, inner, epsilon, y->as<T>(),
          stats_data[0], stats_data[1]);
      return CheckLaunch(ctx);
    });
  }));
  for (int i = 0; i < 2; ++i) {
    if (stats_out[i] == nullptr || stats_out[i]->dtype == DType::kFloat32) continue;
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, stats_data[i], outer, *stats_out[i]));
  }
  return absl::OkStatus();
}

// ---- LayerNormalizationGrad -----------------------------------------------------------

// Per row: the statistics (to row_mean / row_inv_std when not null) and,
// when dx is not null, dX = inv_std * (g - mean(g) - x_hat * mean(g * x_hat))
// with g = dY * scale.
template <typename T, int kRowThreads>
__global__ void __launch_bounds__(kThreads)
    LayerNormGradKernel(const T* __restrict__ dy, const T* __restrict__ x,
                        const float* __restrict__ scale, ParamIndex scale_at, int64_t outer,
                        int64_t inner, float epsilon, T* __restrict__ dx,
                        float* __restrict__ row_mean, float* __restrict__ row_inv_std) {
  using Group = RowGroup<kRowThreads>;
  for (int64_t r = Group::FirstRow(); r < outer; r += Group::RowStep()) {
    const T* xr = x + r * inner;
    const T* dyr = dy + r * inner;
    float mean = 0.0f, inv_std = 0.0f;
    RowStatistics<Group>(xr, inner, epsilon, &mean, &inv_std);
    if (Group::Lane() == 0) {
      if (row_mean != nullptr) row_mean[r] = mean;
      if (row_inv_std != nullptr) row_inv_std[r] = inv_std;
    }
    if (dx == nullptr) continue;  // uniform over the grid
    float g_sum = 0.0f, g_xhat_sum = 0.0f;  // g, g * x_hat
    for (int64_t j = Group::Lane(); j < inner; j += kRowThreads) {
      const float x_hat = (ToFloat(xr[j]) - mean) * inv_std;
      const float g = ToFloat(dyr[j]) * scale[scale_at.Offset(j, j)];
      g_sum += g;
      g_xhat_sum += g * x_hat;
    }
    g_sum = Group::Sum(g_sum);
    g_xhat_sum = Group::Sum(g_xhat_sum);
    const float g_mean = g_sum / static_cast<float>(inner);
    const float g_xhat_mean = g_xhat_sum / static_cast<float>(inner);
    for (int64_t j = Group::Lane(); j < inner; j += kRowThreads) {
      const float x_hat = (ToFloat(xr[j]) - mean) * inv_std;
      const float g = ToFloat(dyr[j]) * scale[scale_at.Offset(j, j)];
      dx[r * inner + j] = FromFloat<T>(inv_std * (g - g_mean - x_hat * g_xhat_mean));
    }
  }
}

// The sums of dY * x_hat (dScale) and dY (dBias) down the rows of one
// column j per thread over the chunk of rows blockIdx.y, stored at
// [chunk * inner + j] of chunk_scale and chunk_bias (either may be null).
template <typename T>
__global__ void LayerNormParamChunkKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const float* __restrict__ row_mean,
                                          const float* __restrict__ row_inv_std, int64_t outer,
                                          int64_t inner, int64_t rows_per_chunk,
                                          float* chunk_scale, float* chunk_bias) {
  const int64_t row_begin = blockIdx.y * rows_per_chunk;
  const int64_t row_end = min(outer, row_begin + rows_per_chunk);
  CASTOR_GRID_STRIDE(j, inner) {
    float ds = 0.0f, db = 0.0f;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const int64_t e = r * inner + j;
      const float g = ToFloat(dy[e]);
      ds += g * ((ToFloat(x[e]) - row_mean[r]) * row_inv_std[r]);
      db += g;
    }
    const int64_t at = static_cast<int64_t>(blockIdx.y) * inner + j;
    if (chunk_scale != nullptr) chunk_scale[at] = ds;
    if (chunk_bias != nullptr) chunk_bias[at] = db;
  }
}

// dScale[k] and dBias[k]: the chunk sums of the columns j whose scale
// element is k, added chunk by chunk and column by column in order. With a
// full-row scale column k is element k; a broadcast scale (rare) scans the
// row for its columns.
__global__ void LayerNormParamTotalKernel(const float* __restrict__ chunk_scale,
                                          const float* __restrict__ chunk_bias,
                                          ParamIndex scale_at, int64_t inner, int64_t chunks,
                                          int64_t scale_size, float* d_scale, float* d_bias) {
  CASTOR_GRID_STRIDE(k, scale_size) {
    float ds = 0.0f, db = 0.0f;
    for (int64_t j = scale_at.row_identity ? k : 0; j < inner; ++j) {
      if (!scale_at.row_identity && scale_at.Offset(j, j) != k) continue;
      for (int64_t c = 0; c < chunks; ++c) {
        if (chunk_scale != nullptr) ds += chunk_scale[c * inner + j];
        if (chunk_bias != nullptr) db += chunk_bias[c * inner + j];
      }
      if (scale_at.row_identity) break;
    }
    if (d_scale != nullptr) d_scale[k] = ds;
    if (d_bias != nullptr) d_bias[k] = db;
  }
}

absl::Status LayerNormGradKernelFor(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::LayerNormGeometry geometry, common::PlanLayerNormGrad(ctx));
  const int64_t axis = geometry.axis, outer = geometry.outer, inner = geometry.inner;
  const std::vector<int64_t> norm_dims(x.dims.begin() + axis, x.dims.end());
  const std::vector<int64_t>& sd = scale_view.dims;
  CASTOR_ASSIGN_OR_RETURN(const ParamIndex scale_at, MakeParamIndex(ctx, sd, norm_dims, 0));
  const int64_t scale_size = scale_view.num_elements();
  const float epsilon = ctx.GetFloat("epsilon", 1e-5f);
  CASTOR_ASSIGN_OR_RETURN(const NormGradOutputs outputs,
                          AllocateNormGradOutputs(ctx, x, scale_view.dtype, sd));
  TensorView *dx = outputs.dx, *d_scale = outputs.d_scale, *d_bias = outputs.d_bias;
  const bool param_grads = d_scale != nullptr || d_bias != nullptr;
  // The float32 parameter gradients (zero when there are no rows) and the
  // row statistics they need.
  float* accumulators = nullptr;
  if (param_grads) {
    CASTOR_ASSIGN_OR_RETURN(accumulators, FloatScratch(ctx, 2 * scale_size));
    if (accumulators != nullptr && (outer == 0 || inner == 0)) {
      CASTOR_CUDA_CALL(cudaMemsetAsync(accumulators, 0,
                                       static_cast<size_t>(2 * scale_size) * sizeof(float),
                                       Stream(ctx)));
    }
  }
  if (outer > 0 && inner > 0 && (dx != nullptr || param_grads)) {
    CASTOR_ASSIGN_OR_RETURN(const float* scale, Float32Of(ctx, scale_view));
    float* row_stats = nullptr;
    if (param_grads) {
      CASTOR_ASSIGN_OR_RETURN(row_stats, FloatScratch(ctx, 2 * outer));
    }
    float* row_mean = row_stats;
    float* row_inv_std = row_stats != nullptr ? row_stats + outer : nullptr;
    CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, x.dtype, [&](auto tag) -> absl::Status {
      using T = typename decltype(tag)::type;
      CASTOR_RETURN_IF_ERROR(LaunchRows(outer, inner, [&](auto row_threads, unsigned blocks) {
        LayerNormGradKernel<T, decltype(row_threads)::value><<<blocks, kThreads, 0,
                                                               Stream(ctx)>>>(
            dy.as<T>(), x.as<T>(), scale, scale_at, outer, inner, epsilon,
            dx != nullptr ? dx->as<T>() : nullptr, row_mean, row_inv_std);
        return CheckLaunch(ctx);
      }));
      if (!param_grads) return absl::OkStatus();
      // Chunks of rows: enough of them to fill the GPU, and at most
      // kMaxChunkSums chunk sums of each kind in scratch.
      constexpr int64_t kRowsPerChunk = 32;
      constexpr int64_t kMaxChunks = 1024;
      constexpr int64_t kMaxChunkSums = int64_t{1} << 22;
      const int64_t chunks = std::clamp<int64_t>(
          (outer + kRowsPerChunk - 1) / kRowsPerChunk, 1,
          std::clamp<int64_t>(kMaxChunkSums / inner, 1, kMaxChunks));
      const int64_t rows_per_chunk = (outer + chunks - 1) / chunks;
      const int64_t wanted = (d_scale != nullptr) + (d_bias != nullptr);
      CASTOR_ASSIGN_OR_RETURN(float* chunk_sums, FloatScratch(ctx, wanted * chunks * inner));
      float* chunk_scale = d_scale != nullptr ? chunk_sums : nullptr;
      float* chunk_bias =
          d_bias != nullptr ? chunk_sums + (d_scale != nullptr ? chunks * inner : 0) : nullptr;
      const dim3 grid(Blocks(inner), static_cast<unsigned>(chunks));
      LayerNormParamChunkKernel<T><<<grid, kThreads, 0, Stream(ctx)>>>(
          dy.as<T>(), x.as<T>(), row_mean, row_inv_std, outer, inner, rows_per_chunk,
          chunk_scale, chunk_bias);
      CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
      LayerNormParamTotalKernel<<<Blocks(scale_size), kThreads, 0, Stream(ctx)>>>(
          chunk_scale, chunk_bias, scale_at, inner, chunks, scale_size,
          d_scale != nullptr ? accumulators : nullptr,
          d_bias != nullptr ? accumulators + scale_size : nullptr);
      return CheckLaunch(ctx);
    }));
  }
  if (d_scale != nullptr) {
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, accumulators, scale_size, *d_scale));
  }
  if (d_bias != nullptr) {
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, accumulators + scale_size, scale_size, *d_bias));
  }
  return absl::OkStatus();
}

// ---- InstanceNormalization ------------------------------------------------------------

// The statistics of a row of `inner` (> 0) elements from sums of x - shift,
// shift = row_data[0]: x's centred value is (x - *shift) - *shifted_mean.
template <typename Group, typename T>
__device__ __forceinline__ void ShiftedRowStatistics(const T* row_data, int64_t inner,
                                                     float epsilon, float* shift,
                                                     float* shifted_mean, float* inv_std) {
  const float k = ToFloat(row_data[0]);
  float sum = 0.0f;
  for (int64_t j = Group::Lane(); j < inner; j += Group::kSize) sum += ToFloat(row_data[j]) - k;
  sum = Group::Sum(sum);
  const float m = sum / static_cast<float>(inner);
  float squares = 0.0f;
  for (int64_t j = Group::Lane(); j < inner; j += Group::kSize) {
    const float d = (ToFloat(row_data[j]) - k) - m;
    squares += d * d;
  }
  squares = Group::Sum(squares);
  *shift = k;
  *shifted_mean = m;
  *inv_std = 1.0f / sqrtf(squares / static_cast<float>(inner) + epsilon);
}

// Y = centred x * (scale[c] * inv_std) + B[c] per (n, c) row.
template <typename T, int kRowThreads>
__global__ void __launch_bounds__(kThreads)
    InstanceNormKernel(const T* __restrict__ x, const float* __restrict__ scale,
                       const float* __restrict__ bias, int64_t rows, int64_t channels,
                       int64_t inner, float epsilon, T* __restrict__ y) {
  using Group = RowGroup<kRowThreads>;
  for (int64_t r = Group::FirstRow(); r < rows; r += Group::RowStep()) {
    const T* xr = x + r * inner;
    float shift = 0.0f, mean = 0.0f, inv_std = 0.0f;
    ShiftedRowStatistics<Group>(xr, inner, epsilon, &shift, &mean, &inv_std);
    const int64_t c = r % channels;
    const float a = scale[c] * inv_std;
    const float b = bias[c];
    for (int64_t j = Group::Lane(); j < inner; j += kRowThreads) {
      y[r * inner + j] = FromFloat<T>(((ToFloat(xr[j]) - shift) - mean) * a + b);
    }
  }
}

absl::Status InstanceNormKernelFor(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::InstanceNormGeometry geometry,
                          common::PlanInstanceNorm(ctx));
  const int64_t rows = geometry.rows, inner = geometry.inner;
  const float epsilon = ctx.GetFloat("epsilon", 1e-5f);
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  if (rows == 0 || inner == 0) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(const float* scale, Float32Of(ctx, ctx.input(1)));
  CASTOR_ASSIGN_OR_RETURN(const float* bias, Float32Of(ctx, ctx.input(2)));
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchRows(rows, inner, [&](auto row_threads, unsigned blocks) {
      InstanceNormKernel<T, decltype(row_threads)::value><<<blocks, kThreads, 0, Stream(ctx)>>>(
          x.as<T>(), scale, bias, rows, geometry.channels, inner, epsilon, y->as<T>());
      return CheckLaunch(ctx);
    });
  });
}

// ---- InstanceNormalizationGrad ----------------------------------------------------------

// Per (n, c) row: row_dy[r] = sum(dY), row_dy_xhat[r] = sum(dY * x_hat) and,
// when dx is not null, dX = scale[c] * inv_std * (dY - sum(dY) / M - x_hat *
// sum(dY * x_hat) / M).
template <typename T, int kRowThreads>
__global__ void __launch_bounds__(kThreads)
    InstanceNormGradKernel(const T* __restrict__ dy, const T* __restrict__ x,
                           const float* __restrict__ scale, int64_t rows, int64_t channels,
                           int64_t inner, float epsilon, T* __restrict__ dx,
                           float* __restrict__ row_dy, float* __restrict__ row_dy_xhat) {
  using Group = RowGroup<kRowThreads>;
  for (int64_t r = Group::FirstRow(); r < rows; r += Group::RowStep()) {
    const T* xr = x + r * inner;
    const T* dyr = dy + r * inner;
    float shift = 0.0f, mean = 0.0f, inv_std = 0.0f;
    ShiftedRowStatistics<Group>(xr, inner, epsilon, &shift, &mean, &inv_std);
    float dy_sum = 0.0f, dy_xhat_sum = 0.0f;
    for (int64_t j = Group::Lane(); j < inner; j += kRowThreads) {
      const float g = ToFloat(dyr[j]);
      dy_sum += g;
      dy_xhat_sum += g * (((ToFloat(xr[j]) - shift) - mean) * inv_std);
    }
    dy_sum = Group::Sum(dy_sum);
    dy_xhat_sum = Group::Sum(dy_xhat_sum);
    if (Group::Lane() == 0) {
      row_dy[r] = dy_sum;
      row_dy_xhat[r] = dy_xhat_sum;
    }
    if (dx == nullptr) continue;  // uniform over the grid
    const float a = scale[r % channels] * inv_std;
    const float dy_mean = dy_sum / static_cast<float>(inner);
    const float dy_xhat_mean = dy_xhat_sum / static_cast<float>(inner);
    for (int64_t j = Group::Lane(); j < inner; j += kRowThreads) {
      const float x_hat = ((ToFloat(xr[j]) - shift) - mean) * inv_std;
      dx[r * inner + j] = FromFloat<T>(a * (ToFloat(dyr[j]) - dy_mean - x_hat * dy_xhat_mean));
    }
  }
}

// dScale[c] and dBias[c]: the row sums of rows c, c + channels, ... added in
// order, one thread per channel.
__global__ void InstanceNormParamTotalKernel(const float* __restrict__ row_dy,
                                             const float* __restrict__ row_dy_xhat, int64_t rows,
                                             int64_t channels, float* d_scale, float* d_bias) {
  CASTOR_GRID_STRIDE(c, channels) {
    float ds = 0.0f, db = 0.0f;
    for (int64_t r = c; r < rows; r += channels) {
      ds += row_dy_xhat[r];
      db += row_dy[r];
    }
    d_scale[c] = ds;
    d_bias[c] = db;
  }
}

absl::Status InstanceNormGradKernelFor(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::InstanceNormGeometry geometry,
                          common::PlanInstanceNormGrad(ctx));
  const int64_t channels = geometry.channels, rows = geometry.rows, inner = geometry.inner;
  const float epsilon = ctx.GetFloat("epsilon", 1e-5f);
  CASTOR_ASSIGN_OR_RETURN(const NormGradOutputs outputs,
                          AllocateNormGradOutputs(ctx, x, scale_view.dtype, scale_view.dims));
  TensorView *dx = outputs.dx, *d_scale = outputs.d_scale, *d_bias = outputs.d_bias;
  if (channels == 0) return absl::OkStatus();
  // The float32 parameter gradients, zero when there are no rows.
  CASTOR_ASSIGN_OR_RETURN(float* accumulators, FloatScratch(ctx, 2 * channels));
  if (rows == 0 || inner == 0) {
    CASTOR_CUDA_CALL(cudaMemsetAsync(
        accumulators, 0, static_cast<size_t>(2 * channels) * sizeof(float), Stream(ctx)));
  } else {
    CASTOR_ASSIGN_OR_RETURN(const float* scale, Float32Of(ctx, scale_view));
    CASTOR_ASSIGN_OR_RETURN(float* row_sums, FloatScratch(ctx, 2 * rows));
    CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, x.dtype, [&](auto tag) -> absl::Status {
      using T = typename decltype(tag)::type;
      return LaunchRows(rows, inner, [&](auto row_threads, unsigned blocks) {
        InstanceNormGradKernel<T, decltype(row_threads)::value>
            <<<blocks, kThreads, 0, Stream(ctx)>>>(dy.as<T>(), x.as<T>(), scale, rows, channels,
                                                   inner, epsilon,
                                                   dx != nullptr ? dx->as<T>() : nullptr,
                                                   row_sums, row_sums + rows);
        return CheckLaunch(ctx);
      });
    }));
    InstanceNormParamTotalKernel<<<Blocks(channels), kThreads, 0, Stream(ctx)>>>(
        row_sums, row_sums + rows, rows, channels, accumulators, accumulators + channels);
    CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
  }
  if (d_scale != nullptr) {
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, accumulators, channels, *d_scale));
  }
  if (d_bias != nullptr) {
    CASTOR_RETURN_IF_ERROR(StoreFloat32(ctx, accumulators + channels, channels, *d_bias));
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterNormalizationKernels(KernelTable& table) {
  table.Register({"", "BatchNormalization", FloatDTypesIn(CudaFloatDTypes()), BatchNormKernel});
  table.Register({kCastorDomain, "BatchNormalizationTraining", FloatDTypesIn(CudaFloatDTypes()),
                  BatchNormKernel});
  for (const char* domain : {"", kCastorDomain}) {  // castor's: float32 Scale, B with 16-bit X
    table.Register(
        {domain, "LayerNormalization", FloatDTypesIn(CudaFloatDTypes()), LayerNormKernelFor});
  }
  table.Register({kCastorDomain, "BatchNormalizationGrad", FloatDTypesIn(CudaFloatDTypes()),
                  BatchNormGradKernel});
  table.Register({kCastorDomain, "LayerNormalizationGrad", FloatDTypesIn(CudaFloatDTypes()),
                  LayerNormGradKernelFor});
  table.Register({"", "InstanceNormalization", FloatDTypesIn(CudaFloatDTypes()),
                  InstanceNormKernelFor});
  table.Register({kCastorDomain, "InstanceNormalizationGrad", FloatDTypesIn(CudaFloatDTypes()),
                  InstanceNormGradKernelFor});
}

}  // namespace castor::cuda
