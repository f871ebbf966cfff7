// Bulk float conversions (see float_io.h): scalar loops over graph/half.h's
// conversions, and AVX2/F16C and AVX-512 (simd16.h) loops that give the
// same bits, the widest this CPU runs picked once at run time from
// cpu_features.h (the build has no -march flags).
#include "backend/cpu/float_io.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/simd16.h"


namespace castor::cpu {
namespace float_io_internal {
namespace {

void HalfToFloat32Scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
}

void Float32ToHalfScalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalfBits(src[i]);
}

void BFloat16ToFloat32Scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(src[i]);
}

void Float32ToBFloat16Scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Bits(src[i]);
}

#if defined(CASTOR_SIMD16_X86)

// kZeroUpperNote: each vector loop clears the upper register halves before
// its scalar tail or return. GCC does not insert vzeroupper there, and the
// rest of the binary is SSE code built without -mavx: with the upper halves
// left dirty, later SSE code (libm's expf among it) ran ~25x slower.

bool HasVectorConversions() {
  return HostCpuFeatures().avx2 && HostCpuFeatures().f16c;
}

// F16C widens every half exactly, except that it quietens signalling NaNs;
// HalfBitsToFloat keeps the payload as is (0x7c01 -> 0x7f802000), so the
// inf/NaN lanes are rebuilt with integer ops: sign, all-ones exponent,
// mantissa << 13.
__attribute__((target("avx2,f16c"))) void HalfToFloat32Vector(const uint16_t* src, float* dst,
                                                              int64_t n) {
  const __m256i exponent_mask = _mm256_set1_epi32(0x7c00);
  const __m256i mantissa_mask = _mm256_set1_epi32(0x3ff);
  const __m256i sign_mask = _mm256_set1_epi32(0x8000);
  const __m256i float_infinity = _mm256_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 widened = _mm256_cvtph_ps(half);
    const __m256i half32 = _mm256_cvtepu16_epi32(half);
    const __m256i is_inf_or_nan =
        _mm256_cmpeq_epi32(_mm256_and_si256(half32, exponent_mask), exponent_mask);
    if (_mm256_testz_si256(is_inf_or_nan, is_inf_or_nan)) {  // the common case
      _mm256_storeu_ps(dst + i, widened);
      continue;
    }
    const __m256i inf_or_nan = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(half32, sign_mask), 16), float_infinity),
        _mm256_slli_epi32(_mm256_and_si256(half32, mantissa_mask), 13));
    _mm256_storeu_ps(dst + i, _mm256_blendv_ps(widened, _mm256_castsi256_ps(inf_or_nan),
                                               _mm256_castsi256_ps(is_inf_or_nan)));
  }
  _mm256_zeroupper();  // see kZeroUpperNote
  HalfToFloat32Scalar(src + i, dst + i, n - i);
}

// F16C's round-to-nearest-even narrowing matches FloatToHalfBits for every
// float32 bit pattern (overflow to inf, subnormals, NaN quietened with the
// top payload bits kept), so no fix-up is needed. The rounding mode is the
// immediate, not MXCSR.
__attribute__((target("avx2,f16c"))) void Float32ToHalfVector(const float* src, uint16_t* dst,
                                                              int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
  }
  _mm256_zeroupper();  // see kZeroUpperNote
  Float32ToHalfScalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2"))) void BFloat16ToFloat32Vector(const uint16_t* src, float* dst,
                                                             int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bf16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bits);
  }
  _mm256_zeroupper();  // see kZeroUpperNote
  BFloat16ToFloat32Scalar(src + i, dst + i, n - i);
}

// FloatToBFloat16Bits on 8 lanes: NaN -> top half | 0x0040 (quiet, sign and
// payload kept); everything else rounds to nearest even by adding
// 0x7fff + lsb and keeping the top half (finite values may carry into inf).
__attribute__((target("avx2"))) void Float32ToBFloat16Vector(const float* src, uint16_t* dst,
                                                             int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i float_infinity = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i half_ulp = _mm256_set1_epi32(0x7fff);
  const __m256i quiet_bit = _mm256_set1_epi32(0x0040);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i top = _mm256_srli_epi32(bits, 16);
    // |bits| fits in 31 bits, so the signed compare is the unsigned one.
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), float_infinity);
    const __m256i rounding_bias = _mm256_add_epi32(half_ulp, _mm256_and_si256(top, one));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, rounding_bias), 16);
    const __m256i result = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet_bit), is_nan);
    // Every lane is <= 0xffff, so the unsigned-saturating pack is exact.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
  _mm256_zeroupper();  // see kZeroUpperNote
  Float32ToBFloat16Scalar(src + i, dst + i, n - i);
}

// The AVX-512 loops (simd16.h), one per direction for both 16-bit types
// (T: Half or BFloat16): 16 lanes per step and the last partial vector
// under a lane mask instead of a scalar tail (masked-off lanes are neither
// read nor written).
template <typename T>
CASTOR_SIMD16_TARGET void WidenAvx512(const uint16_t* src, float* dst, int64_t n) {
  const T* s = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = TailMask(n - i);
    _mm512_mask_storeu_ps(dst + i, lanes, LoadWidened(s + i, lanes));
  }
  _mm256_zeroupper();  // see kZeroUpperNote
}

template <typename T>
CASTOR_SIMD16_TARGET void NarrowAvx512(const float* src, uint16_t* dst, int64_t n) {
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = TailMask(n - i);
    StoreRounded(d + i, lanes, _mm512_maskz_loadu_ps(lanes, src + i));
  }
  _mm256_zeroupper();  // see kZeroUpperNote
}

#endif  // CASTOR_SIMD16_X86

}  // namespace

std::vector<ConversionLoops> AvailableConversionLoops() {
  std::vector<ConversionLoops> loops = {{"scalar", HalfToFloat32Scalar, Float32ToHalfScalar,
                                         BFloat16ToFloat32Scalar, Float32ToBFloat16Scalar}};
#if defined(CASTOR_SIMD16_X86)
  if (HasVectorConversions()) {
    loops.push_back({"AVX2+F16C", HalfToFloat32Vector, Float32ToHalfVector,
                     BFloat16ToFloat32Vector, Float32ToBFloat16Vector});
  }
  if (HasSimd16()) {
    loops.push_back({"AVX-512", WidenAvx512<Half>, NarrowAvx512<Half>, WidenAvx512<BFloat16>,
                     NarrowAvx512<BFloat16>});
  }
#endif
  return loops;
}

}  // namespace float_io_internal

bool HasSimd16() {
#if defined(CASTOR_SIMD16_X86)
  // Decided once: kernels ask per row or per run.
  static const bool has = [] {
    const CpuFeatures& cpu = HostCpuFeatures();
    return float_io_internal::HasVectorConversions() && cpu.avx512f && cpu.avx512bw &&
           cpu.avx512vl;
  }();
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<bool> fused_simd16_allowed{true};
}  // namespace

bool UseFusedSimd16() {
  return fused_simd16_allowed.load(std::memory_order_relaxed) && HasSimd16();
}

bool SetFusedSimd16ForTesting(bool enabled) {
  return fused_simd16_allowed.exchange(enabled, std::memory_order_relaxed);
}

namespace {

// The widest conversion loops this CPU runs, chosen on first use.
const float_io_internal::ConversionLoops& Loops() {
  static const float_io_internal::ConversionLoops loops =
      float_io_internal::AvailableConversionLoops().back();
  return loops;
}

}  // namespace

void ToFloat32(const Half* src, float* dst, int64_t n) {
  Loops().half_to_float(reinterpret_cast<const uint16_t*>(src), dst, n);
}

void ToFloat32(const BFloat16* src, float* dst, int64_t n) {
  Loops().bfloat16_to_float(reinterpret_cast<const uint16_t*>(src), dst, n);
}

void FromFloat32(const float* src, Half* dst, int64_t n) {
  Loops().float_to_half(src, reinterpret_cast<uint16_t*>(dst), n);
}

void FromFloat32(const float* src, BFloat16* dst, int64_t n) {
  Loops().float_to_bfloat16(src, reinterpret_cast<uint16_t*>(dst), n);
}

void ToFloat32(DType dtype, const void* src, float* dst, int64_t n) {
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src);
    if constexpr (kIsFloat16Storage<T>) {
      ToFloat32(s, dst, n);
    } else if constexpr (std::is_same_v<T, float>) {
      if (n > 0 && s != dst) std::memmove(dst, s, static_cast<size_t>(n) * sizeof(float));
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF(s[i]);
    }
  });
}

void FromFloat32(DType dtype, const float* src, void* dst, int64_t n) {
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = static_cast<T*>(dst);
    if constexpr (kIsFloat16Storage<T>) {
      FromFloat32(src, d, n);
    } else if constexpr (std::is_same_v<T, float>) {
      if (n > 0 && d != src) std::memmove(d, src, static_cast<size_t>(n) * sizeof(float));
    } else {
      for (int64_t i = 0; i < n; ++i) StoreF(&d[i], src[i]);
    }
  });
}

void ParallelToFloat32(DType dtype, const void* src, float* dst, int64_t n) {
  const char* bytes = static_cast<const char*>(src);
  const size_t size = DTypeSize(dtype);
  ParallelFor(0, n, kParallelConvertGrain, [&](int64_t lo, int64_t hi) {
    ToFloat32(dtype, bytes + lo * size, dst + lo, hi - lo);
  });
}

void ParallelFromFloat32(DType dtype, const float* src, void* dst, int64_t n) {
  char* bytes = static_cast<char*>(dst);
  const size_t size = DTypeSize(dtype);
  ParallelFor(0, n, kParallelConvertGrain, [&](int64_t lo, int64_t hi) {
    FromFloat32(dtype, src + lo, bytes + lo * size, hi - lo);
  });
}

}  // namespace castor::cpu
