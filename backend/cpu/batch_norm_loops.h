// The loops of BatchNormalization in training mode, shared by its forward
// kernel (backend/cpu/normalization.cc) and BatchNormalizationGrad
// (backend/cpu/normalization_grad.cc; ConvGrad's dB, conv_grad.cc, sums
// rows with RowSum), built for AVX-512/AVX2/baseline (vector_clones.h);
// bfloat16 runs take AVX-512 intrinsics where the CPU has them (simd16.h),
// with the same bits.
//
// A channel of X [N, C, inner...] is `batch` runs of `inner` contiguous
// values, `stride` (= C * inner) apart (ChannelRuns), in float32, float16 or
// bfloat16. The loops take it a run at a time, in float32 arithmetic: a
// bfloat16 run is widened (exactly) and its results rounded once inside the
// vector loop, a float16 run goes through float32 buffers of the calling
// thread that stay in L1. So a 16-bit channel gives the bits of its float32
// copy, without float32 copies of the tensor (the training graph folds the
// Casts around a float32 BatchNormalization into the node:
// passes/training_graph.cc).
//
// Channel sums: each run is summed in float32 in kRunSumLanes independent
// lanes (RunLaneSums, lane_sums.h), whose sums are then added to float64
// lanes, so float32 rounding spans at most inner / kRunSumLanes terms (49
// for a 28x28 image) and the rest adds in float64. Every clone gives the
// same bits.
#pragma once

#include <array>
#include <cstdint>

#include "graph/dtype.h"

namespace castor::cpu {

// One channel of a float tensor [N, C, inner...]: run n (n < batch) is the
// `inner` values of `dtype` (float32, float16 or bfloat16) at element
// n * stride from `first`.
struct ChannelRuns {
  DType dtype = DType::kFloat32;
  const void* first = nullptr;
  int64_t batch = 0;
  int64_t stride = 0;
  int64_t inner = 0;
};

// Whether ChannelRuns reads `dtype` as stored: float32, float16 and
// bfloat16 (callers copy other dtypes to float32 first).
inline bool ChannelDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// The same channel of an output of ChannelRuns' layout and dtype: `first`
// is its first element.
struct ChannelOut {
  DType dtype = DType::kFloat32;
  void* first = nullptr;
};

// Sum of the channel's values.
double ChannelSum(const ChannelRuns& x);

// Sum of (x - mean)^2 over the channel (x - mean in float32, with mean
// rounded to float32).
double ChannelSquaredDeviations(const ChannelRuns& x, double mean);

// {sum (x - mean)^2, sum dy, sum dy * (x - mean)} over the channel, dy of
// x's layout (its own dtype). Where `relu_output` has runs (x's layout and
// dtype: the output of a Relu fused after the BatchNormalization; `first`
// null where there is none), dy is that Relu's output gradient and counts
// where relu_output > 0 only (ReluGrad's select, without its pass).
std::array<double, 3> ChannelGradientSums(const ChannelRuns& x, const ChannelRuns& dy,
                                          const ChannelRuns& relu_output, double mean);

// y = x * a + b (float32, two roundings, then one to X's dtype) over the
// channel; with `relu`, Relu(x * a + b) (math::ReluOp, before the rounding
// to X's dtype: the bits of Relu on the rounded value).
void ChannelScaleShift(const ChannelRuns& x, float a, float b, ChannelOut y, bool relu);

// BatchNormalizationGrad's dX over the channel (float32, then one rounding
// to X's dtype):
//   dx = a * (dy - mean_dy - (x - mean) * inv_std * mean_dy_xhat),
// dy through the fused Relu's gradient where `relu_output` has runs (as
// ChannelGradientSums).
struct InputGradientTerms {
  float a = 0, mean = 0, inv_std = 0, mean_dy = 0, mean_dy_xhat = 0;
};
void ChannelInputGradient(const ChannelRuns& x, const ChannelRuns& dy,
                          const ChannelRuns& relu_output, const InputGradientTerms& terms,
                          ChannelOut dx);

// Sum of x[0, n) in float64 lanes (LaneSums, kWideSumLanes).
double RowSum(const float* x, int64_t n);

}  // namespace castor::cpu
