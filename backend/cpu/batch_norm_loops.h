// The float32 loops of BatchNormalization in training mode, shared by its
// forward kernel (backend/cpu/normalization.cc) and BatchNormalizationGrad
// (backend/cpu/normalization_grad.cc; ConvGrad's dB, conv_grad.cc, sums
// rows with RowSum),
// built for AVX-512/AVX2/baseline (vector_clones.h).
//
// A channel's values in X [N, C, inner...] are `batch` runs of `inner`
// contiguous floats, `stride` (= C * inner) apart. Sums run in float64
// LaneSums (kWideSumLanes) over the runs in order, so every clone gives the same
// bits.
#pragma once

#include <array>
#include <cstdint>

#include "graph/dtype.h"

namespace castor::cpu {

// Sum of the channel's values.
double ChannelSum(const float* x, int64_t batch, int64_t stride, int64_t inner);

// Sum of x[0, n): one run.
inline double RowSum(const float* x, int64_t n) { return ChannelSum(x, 1, n, n); }

// A 16-bit channel (`batch` runs of `inner` values of `dtype`, float16 or
// bfloat16, `stride` elements apart from `x`) widened into `dst` (the runs
// packed: run n at dst + n * inner), returning the sum of its values: the
// bits of ChannelSum(dst, batch, inner, inner), each run added right after
// it is widened, while it is in cache.
double WidenChannelAndSum(DType dtype, const void* x, int64_t batch, int64_t stride,
                          int64_t inner, float* dst);

// Sum of (x - mean)^2 over the channel.
double ChannelSquaredDeviations(const float* x, int64_t batch, int64_t stride, int64_t inner,
                                double mean);

// {sum (x - mean)^2, sum dy, sum dy * (x - mean)} over the channel; dy has
// X's layout.
std::array<double, 3> ChannelGradientSums(const float* x, const float* dy, int64_t batch,
                                          int64_t stride, int64_t inner, double mean);

// dst[i] = src[i] * a + b (float32, two roundings) for i in [0, n).
void ScaleShift(const float* src, float* dst, int64_t n, float a, float b);

// One run of BatchNormalizationGrad's dX:
//   dx[i] = a * (dy[i] - mean_dy - (x[i] - mean) * inv_std * mean_dy_xhat).
void BatchNormInputGradient(const float* x, const float* dy, float* dx, int64_t n, float a,
                            float mean, float inv_std, float mean_dy, float mean_dy_xhat);

}  // namespace castor::cpu
