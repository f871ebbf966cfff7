// The 16 x 16 transpose of 32-bit words that packs op(A) and op(B) for the
// bfloat16 GEMMs (amx_gemm.cc's tiles, avx512bf16_gemm.cc's panels): a row
// of 16 k pairs of one row or column of a matrix becomes pair q of 16 rows
// or columns. AVX-512 F: callers run it only where simd16.h's HasSimd16().
#pragma once

#include <cstdint>

#include "backend/cpu/simd16.h"

namespace castor::cpu {

#if defined(CASTOR_SIMD16_X86)

namespace pair_transpose_internal {

// 512-bit unpacks and lane shuffles as the masked forms with every lane
// set: the same instructions, but GCC 12's unmasked forms pass an
// "undefined" register that -Wuninitialized reports.
__attribute__((target("avx512f"))) inline __m512i UnpackLo32(__m512i a, __m512i b) {
  return _mm512_mask_unpacklo_epi32(a, 0xFFFF, a, b);
}
__attribute__((target("avx512f"))) inline __m512i UnpackHi32(__m512i a, __m512i b) {
  return _mm512_mask_unpackhi_epi32(a, 0xFFFF, a, b);
}
__attribute__((target("avx512f"))) inline __m512i UnpackLo64(__m512i a, __m512i b) {
  return _mm512_mask_unpacklo_epi64(a, 0xFF, a, b);
}
__attribute__((target("avx512f"))) inline __m512i UnpackHi64(__m512i a, __m512i b) {
  return _mm512_mask_unpackhi_epi64(a, 0xFF, a, b);
}
// Result lanes: a[imm & 3], a[imm >> 2 & 3], b[imm >> 4 & 3], b[imm >> 6].
template <int kImm>
__attribute__((target("avx512f"))) inline __m512i ShuffleLanes(__m512i a, __m512i b) {
  return _mm512_mask_shuffle_i32x4(a, 0xFFFF, a, b, kImm);
}

}  // namespace pair_transpose_internal

// The 16 x 16 transpose of 32-bit words (each a k pair of bfloat16): source
// row c is the 16 words at src + c * src_ld, destination row q the 16 words
// at dst + q * dst_ld (strides in bfloat16 units; no alignment needed), and
// destination row q holds word q of every source row. Unpacks within
// 128-bit lanes, then lane shuffles.
__attribute__((target("avx512f"))) inline void TransposeWords16x16(const uint16_t* src,
                                                                  int64_t src_ld,
                                                                  uint16_t* dst,
                                                                  int64_t dst_ld) {
  using namespace pair_transpose_internal;
  __m512i r[16], t[16], u[16];
  for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_si512(src + c * src_ld);
  for (int i = 0; i < 16; i += 2) {  // per lane: r[i][0], r[i+1][0], r[i][1], r[i+1][1]
    t[i] = UnpackLo32(r[i], r[i + 1]);
    t[i + 1] = UnpackHi32(r[i], r[i + 1]);
  }
  // u[g + q]: pairs q, q + 4, q + 8, q + 12 (one per 128-bit lane) of
  // columns g .. g + 3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = UnpackLo64(t[g], t[g + 2]);
    u[g + 1] = UnpackHi64(t[g], t[g + 2]);
    u[g + 2] = UnpackLo64(t[g + 1], t[g + 3]);
    u[g + 3] = UnpackHi64(t[g + 1], t[g + 3]);
  }
  for (int q = 0; q < 4; ++q) {  // destination rows q, q + 4, q + 8, q + 12
    const __m512i lanes01_0to7 = ShuffleLanes<0x44>(u[q], u[q + 4]);
    const __m512i lanes23_0to7 = ShuffleLanes<0xee>(u[q], u[q + 4]);
    const __m512i lanes01_8to15 = ShuffleLanes<0x44>(u[q + 8], u[q + 12]);
    const __m512i lanes23_8to15 = ShuffleLanes<0xee>(u[q + 8], u[q + 12]);
    _mm512_storeu_si512(dst + q * dst_ld, ShuffleLanes<0x88>(lanes01_0to7, lanes01_8to15));
    _mm512_storeu_si512(dst + (q + 4) * dst_ld,
                        ShuffleLanes<0xdd>(lanes01_0to7, lanes01_8to15));
    _mm512_storeu_si512(dst + (q + 8) * dst_ld,
                        ShuffleLanes<0x88>(lanes23_0to7, lanes23_8to15));
    _mm512_storeu_si512(dst + (q + 12) * dst_ld,
                        ShuffleLanes<0xdd>(lanes23_0to7, lanes23_8to15));
  }
  _mm256_zeroupper();  // the caller may be SSE code (see float_io.cc's kZeroUpperNote)
}

#endif  // CASTOR_SIMD16_X86

}  // namespace castor::cpu
