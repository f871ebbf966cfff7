// AVX-512 building blocks for the CPU kernels' vector loops. Chiefly for
// float16/bfloat16 data: 16 lanes widened to float32 and rounded back with
// exactly the bits of graph/half.h's scalar conversions
// (round-to-nearest-even; NaN payloads kept as FloatToBFloat16Bits /
// HalfBitsToFloat do; subnormals kept, not flushed); float_io.cc's bulk
// conversions and the fused elementwise loops are built from them. Also
// lane masks for partial vectors and the (de)interleaving of 2x2 windows'
// columns that float32 pooling loops use.
//
// The functions carry CASTOR_SIMD16_TARGET and may only run where
// HasSimd16() is true (the build has no -march flags); code that calls them
// carries the same attribute. Defined only where CASTOR_SIMD16_X86 is (x86
// with GCC or clang).
//
//   if (HasSimd16()) RunMyLoop(...);   // CASTOR_SIMD16_TARGET void RunMyLoop
//   ... __m512 v = LoadWidened(x + i, lanes); ... StoreRounded(y + i, lanes, v);
#pragma once

#include <cstdint>

#include "backend/cpu/float_io.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define CASTOR_SIMD16_X86 1
#include <immintrin.h>
#endif

namespace castor::cpu {

// True when this CPU runs the functions below: AVX2, AVX-512 F/BW/VL and
// F16C (checked once).
bool HasSimd16();

// True when kernels should take their AVX-512 loops built on this header
// (fused 16-bit elementwise runs and row sums; float32 MaxPool and
// MaxPoolGrad rows of 2x2 windows; LayerNormGrad rows, in float64):
// HasSimd16() and no test turned them off. Each such loop gives the same
// bits as the portable loop it replaces. (The bulk conversions in
// float_io.h always use the widest loops; float_io_test checks each
// implementation directly.)
bool UseFusedSimd16();

// For tests: let kernels use those loops only when `enabled` (and
// HasSimd16()), so the portable paths they replace stay tested; returns
// the previous setting.
bool SetFusedSimd16ForTesting(bool enabled);

// For tests: SetFusedSimd16ForTesting(enabled) for the scope.
class ScopedFusedSimd16ForTesting {
 public:
  explicit ScopedFusedSimd16ForTesting(bool enabled) : before_(SetFusedSimd16ForTesting(enabled)) {}
  ~ScopedFusedSimd16ForTesting() { SetFusedSimd16ForTesting(before_); }
  ScopedFusedSimd16ForTesting(const ScopedFusedSimd16ForTesting&) = delete;
  ScopedFusedSimd16ForTesting& operator=(const ScopedFusedSimd16ForTesting&) = delete;

 private:
  bool before_;
};

#if defined(CASTOR_SIMD16_X86)

#define CASTOR_SIMD16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

// The first min(remaining, 16) lanes (none for remaining <= 0).
CASTOR_SIMD16_TARGET inline __mmask16 TailMask(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 16 ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << remaining) - 1);
}

// The same for 8 lanes of float64.
CASTOR_SIMD16_TARGET inline __mmask8 TailMask8(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 8 ? static_cast<__mmask8>(0xff)
                        : static_cast<__mmask8>((1u << remaining) - 1);
}

// Of 32 consecutive floats `lo` (the first 16) and `hi`: the elements at
// even positions, and at odd positions (the columns of 2x2 windows).
CASTOR_SIMD16_TARGET inline __m512 EvenElements(__m512 lo, __m512 hi) {
  const __m512i even =
      _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return _mm512_permutex2var_ps(lo, even, hi);
}
CASTOR_SIMD16_TARGET inline __m512 OddElements(__m512 lo, __m512 hi) {
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_ps(lo, odd, hi);
}

// Their inverse: 32 floats alternating even[i], odd[i]; the first 16, and
// the last 16.
CASTOR_SIMD16_TARGET inline __m512 InterleavedFirst(__m512 even, __m512 odd) {
  const __m512i first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutex2var_ps(even, first, odd);
}
CASTOR_SIMD16_TARGET inline __m512 InterleavedLast(__m512 even, __m512 odd) {
  const __m512i last =
      _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  return _mm512_permutex2var_ps(even, last, odd);
}

// The maskz_ forms below (inactive lanes read as zero) also keep GCC 12
// from warning about the undefined source operand of the unmasked
// intrinsics.

// bfloat16 -> float32 is exact: the bits move to the top half.
CASTOR_SIMD16_TARGET inline __m512 LoadWidened(const BFloat16* p, __mmask16 lanes) {
  const __m256i bits = _mm256_maskz_loadu_epi16(lanes, p);
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(lanes, _mm512_maskz_cvtepu16_epi32(lanes, bits), 16));
}

// float16 -> float32 with F16C, except that inf/NaN lanes are rebuilt with
// integer ops (sign, all-ones exponent, mantissa << 13): F16C would quieten
// a signalling NaN, HalfBitsToFloat keeps its payload as is.
CASTOR_SIMD16_TARGET inline __m512 LoadWidened(const Half* p, __mmask16 lanes) {
  const __m256i half = _mm256_maskz_loadu_epi16(lanes, p);
  const __m512 widened = _mm512_maskz_cvtph_ps(lanes, half);
  const __m512i half32 = _mm512_maskz_cvtepu16_epi32(lanes, half);
  const __m512i exponent_mask = _mm512_set1_epi32(0x7c00);
  const __mmask16 is_inf_or_nan =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(half32, exponent_mask), exponent_mask);
  if (is_inf_or_nan == 0) return widened;  // the common case
  const __m512i sign = _mm512_and_si512(half32, _mm512_set1_epi32(0x8000));
  const __m512i mantissa = _mm512_and_si512(half32, _mm512_set1_epi32(0x3ff));
  const __m512i inf_or_nan =
      _mm512_or_si512(_mm512_or_si512(_mm512_maskz_slli_epi32(lanes, sign, 16),
                                      _mm512_set1_epi32(0x7f800000)),
                      _mm512_maskz_slli_epi32(lanes, mantissa, 13));
  return _mm512_mask_blend_ps(is_inf_or_nan, widened, _mm512_castsi512_ps(inf_or_nan));
}

// float32 -> bfloat16 as FloatToBFloat16Bits: NaN -> top half | 0x0040
// (quiet, sign and payload kept); everything else rounds to nearest even by
// adding 0x7fff + lsb and keeping the top half (finite values may carry
// into inf). VCVTNEPS2BF16 (AVX512_BF16) is not used: it flushes subnormal
// inputs to zero. RoundedBFloat16Bits gives each lane's bits in its low
// half (the high half zero); StoreRounded stores the lanes on `lanes`.
CASTOR_SIMD16_TARGET inline __m512i RoundedBFloat16Bits(__m512 v) {
  const __mmask16 all = 0xffff;  // maskz_ shifts: see above
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i top = _mm512_maskz_srli_epi32(all, bits, 16);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i rounding_bias =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(top, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_maskz_srli_epi32(all, _mm512_add_epi32(bits, rounding_bias), 16);
  return _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(top, _mm512_set1_epi32(0x0040)));
}
CASTOR_SIMD16_TARGET inline void StoreRounded(BFloat16* p, __mmask16 lanes, __m512 v) {
  // Every lane is <= 0xffff, so the truncating narrow is exact.
  _mm512_mask_cvtepi32_storeu_epi16(p, lanes, RoundedBFloat16Bits(v));
}

// 32 bfloat16 values widened into two registers, in the order of the
// 16-bit unpack (a 128-bit lane's first four values in `lo`, its last four
// in `hi`): for loops whose lanes are independent, which write them back
// with StoreRounded32. Three instructions (a load, two unpacks) for 32
// values, where LoadWidened takes three for 16.
CASTOR_SIMD16_TARGET inline void LoadWidened32(const BFloat16* p, __m512& lo, __m512& hi) {
  const __m512i bits = _mm512_loadu_si512(p);
  lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), bits));
  hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), bits));
}
CASTOR_SIMD16_TARGET inline void StoreRounded32(BFloat16* p, __m512 lo, __m512 hi) {
  // The 32-bit pack undoes the unpack lane by lane; values <= 0xffff pack
  // exactly.
  _mm512_storeu_si512(p, _mm512_packus_epi32(RoundedBFloat16Bits(lo), RoundedBFloat16Bits(hi)));
}

// float32 -> float16: F16C's round-to-nearest-even narrowing matches
// FloatToHalfBits for every float32 bit pattern (overflow to inf,
// subnormals, NaN quietened with the top payload bits kept). The rounding
// mode is the immediate, not MXCSR.
CASTOR_SIMD16_TARGET inline void StoreRounded(Half* p, __mmask16 lanes, __m512 v) {
  _mm256_mask_storeu_epi16(p, lanes, _mm512_maskz_cvtps_ph(lanes, v, _MM_FROUND_TO_NEAREST_INT));
}

#endif  // CASTOR_SIMD16_X86

}  // namespace castor::cpu
