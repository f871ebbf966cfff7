// LayerNormalization's rows on AVX-512, shared by its forward kernel
// (normalization.cc) and its gradient (normalization_grad.cc): float32 rows
// of a dense [..., D] layout, statistics in float64 with the arithmetic of
// the portable loops in the same order, so the same bits. LaneSums<1>
// (lane_sums.h) puts element j of the whole blocks of 8 in lane j mod 8 and
// the tail's in lanes 0, 1, ..., then adds the lanes pairwise; here a
// register of 8 float64 lanes does it. castor builds with
// -ffp-contract=off, so no FMA appears in these targets either.
//
// A row's sums wait on their previous add (8 per 64 values); kRows rows
// summed side by side keep that many chains in flight.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/lane_sums.h"
#include "backend/cpu/simd16.h"

#if defined(CASTOR_SIMD16_X86)
namespace castor::cpu {

// Floats [p, p + 8) (lanes outside `lanes` 0) as doubles.
CASTOR_SIMD16_TARGET inline __m512d LoadAsDoubles(const float* p, __mmask8 lanes) {
  return _mm512_maskz_cvtps_pd(lanes, _mm256_maskz_loadu_ps(lanes, p));
}

// LaneSums' total of 8 lanes held in a vector.
CASTOR_SIMD16_TARGET inline double PairwiseTotal(__m512d lanes) {
  alignas(64) double v[8];
  _mm512_store_pd(v, lanes);
  return AddLanesPairwise(v);
}

// Rows x + r * n (r < kRows) of n floats: mean[r] and inv_std[r] = 1 /
// sqrt(biased variance + epsilon), as the portable loops compute them
// (two passes: the sum, then the squares of x - mean).
template <int kRows>
CASTOR_SIMD16_TARGET inline void LayerNormRowStats(const float* x, int64_t n, double epsilon,
                                                   double* mean, double* inv_std) {
  __m512d sums[kRows];
  for (int r = 0; r < kRows; ++r) sums[r] = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 lanes = TailMask8(n - j);
    for (int r = 0; r < kRows; ++r) {
      sums[r] = _mm512_mask_add_pd(sums[r], lanes, sums[r], LoadAsDoubles(x + r * n + j, lanes));
    }
  }
  __m512d means[kRows], squares[kRows];
  for (int r = 0; r < kRows; ++r) {
    mean[r] = n > 0 ? PairwiseTotal(sums[r]) / static_cast<double>(n) : 0.0;
    means[r] = _mm512_set1_pd(mean[r]);
    squares[r] = _mm512_setzero_pd();
  }
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 lanes = TailMask8(n - j);
    for (int r = 0; r < kRows; ++r) {
      const __m512d centred = _mm512_sub_pd(LoadAsDoubles(x + r * n + j, lanes), means[r]);
      squares[r] =
          _mm512_mask_add_pd(squares[r], lanes, squares[r], _mm512_mul_pd(centred, centred));
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const double var = n > 0 ? PairwiseTotal(squares[r]) / static_cast<double>(n) : 0.0;
    inv_std[r] = 1.0 / std::sqrt(var + epsilon);
  }
}

}  // namespace castor::cpu
#endif  // CASTOR_SIMD16_X86
