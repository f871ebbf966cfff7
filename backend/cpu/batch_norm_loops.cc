// BatchNormalization's float32 training loops (see batch_norm_loops.h).
#include "backend/cpu/batch_norm_loops.h"

#include "backend/cpu/float_io.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/vector_clones.h"

namespace castor::cpu {

CASTOR_VECTOR_CLONES double ChannelSum(const float* x, int64_t batch, int64_t stride,
                                       int64_t inner) {
  LaneSums<1, kWideSumLanes> sum;
  for (int64_t n = 0; n < batch; ++n) {
    const float* run = x + n * stride;
    sum.Add(inner, [&](int64_t i) { return std::array<double, 1>{run[i]}; });
  }
  return sum.Total(0);
}

CASTOR_VECTOR_CLONES double WidenChannelAndSum(DType dtype, const void* x, int64_t batch,
                                               int64_t stride, int64_t inner, float* dst) {
  const size_t bytes = DTypeSize(dtype);
  LaneSums<1, kWideSumLanes> sum;
  for (int64_t n = 0; n < batch; ++n) {
    float* run = dst + n * inner;
    ToFloat32(dtype, static_cast<const char*>(x) + n * stride * bytes, run, inner);
    sum.Add(inner, [&](int64_t i) { return std::array<double, 1>{run[i]}; });
  }
  return sum.Total(0);
}

CASTOR_VECTOR_CLONES double ChannelSquaredDeviations(const float* x, int64_t batch,
                                                     int64_t stride, int64_t inner,
                                                     double mean) {
  LaneSums<1, kWideSumLanes> squares;
  for (int64_t n = 0; n < batch; ++n) {
    const float* run = x + n * stride;
    squares.Add(inner, [&](int64_t i) {
      const double d = run[i] - mean;
      return std::array<double, 1>{d * d};
    });
  }
  return squares.Total(0);
}

CASTOR_VECTOR_CLONES std::array<double, 3> ChannelGradientSums(const float* x, const float* dy,
                                                               int64_t batch, int64_t stride,
                                                               int64_t inner, double mean) {
  LaneSums<3, kWideSumLanes> sums;
  for (int64_t n = 0; n < batch; ++n) {
    const float* run = x + n * stride;
    const float* d_run = dy + n * stride;
    sums.Add(inner, [&](int64_t i) {
      const double centred = run[i] - mean;
      const double d = d_run[i];
      return std::array<double, 3>{centred * centred, d, d * centred};
    });
  }
  return {sums.Total(0), sums.Total(1), sums.Total(2)};
}

CASTOR_VECTOR_CLONES void ScaleShift(const float* src, float* dst, int64_t n, float a, float b) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * a + b;
}

CASTOR_VECTOR_CLONES void BatchNormInputGradient(const float* x, const float* dy, float* dx,
                                                 int64_t n, float a, float mean, float inv_std,
                                                 float mean_dy, float mean_dy_xhat) {
  for (int64_t i = 0; i < n; ++i) {
    const float x_hat = (x[i] - mean) * inv_std;
    dx[i] = a * (dy[i] - mean_dy - x_hat * mean_dy_xhat);
  }
}

}  // namespace castor::cpu
