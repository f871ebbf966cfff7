// bfloat16 GEMM on Intel AMX (Advanced Matrix Extensions) tiles, for the
// CPU backend's 16-bit MatMul/Gemm under mixed_bfloat16 (gemm.h's
// GemmFloat32Accumulate takes it where it runs).
//
// op(A) and op(B) are packed into 16-row x 32-column bfloat16 tiles (B in
// the pair-interleaved layout the tile product reads), zero-padded to whole
// tiles, and each 32 x 32 block of C is four 16 x 16 float32 accumulator
// tiles fed by TDPBF16PS over K in steps of 32. alpha and beta are applied
// when a block is written back (alpha once per K panel: see amx_gemm.cc).
//
// Numerics: products of two bfloat16 are exact in float32 and are summed in
// float32 with round-to-nearest-even, but in the instruction's own fixed
// order (within each step of 32, even and odd k accumulate separately),
// not the widened sgemm's; and TDPBF16PS takes subnormal inputs as zero and
// flushes results that underflow (a product below float32's normal range
// counts as 0), where the sgemm path keeps subnormals. Results agree with
// the sgemm path to float32 rounding of the sum's magnitude, not bit for
// bit; every run gives the same bits.
//
// Runs only where the CPU has AMX-TILE and AMX-BF16 (with AVX2 and
// AVX-512 F/BW/VL, which the packing and the bfloat16 write-back use) and Linux grants the process the tile
// state (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+), in builds with
// GCC 11 or newer; elsewhere, or with CASTOR_AMX=off in the environment,
// AmxBf16Available() is false and callers keep the sgemm path.
#pragma once

#include <cstdint>

namespace castor::cpu {

// True when castor uses AMX for bfloat16 GEMMs: AmxBf16Supported(), the
// environment does not say CASTOR_AMX=off (or 0, no, false) and no test
// turned it off.
bool AmxBf16Available();

// True when the hardware, OS and build allow AMX (checked once; the first
// call asks Linux for the tile state), whatever the environment or a test
// chose.
bool AmxBf16Supported();

// For tests: use AMX from now on only when `enabled` (and supported);
// returns the previous setting.
bool SetAmxForTesting(bool enabled);

// For tests: pack at most `elements` bfloat16 of A and B per K panel (K is
// cut into panels of whole tiles, at least one each); <= 0 restores the
// default (32 MiB). Returns the previous limit.
int64_t SetAmxPanelElementsForTesting(int64_t elements);

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C with A
// and B bfloat16 bit patterns (row strides lda, ldb as stored), C float32
// (C is not read when beta == 0; k <= 0 gives beta * C). Requires
// AmxBf16Supported() (aborts otherwise). Splits the work across threads
// (serial inside a ParallelFor).
void AmxGemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                 float* c, int64_t ldc);

// C = alpha * op(A) * op(B) as AmxGemmBf16 with beta = 0, but C is bfloat16
// (bit patterns, row stride ldc): each 32 x 32 block is rounded from its
// float32 accumulators as it is finished, so C never exists in float32.
// The same bits as AmxGemmBf16 followed by FloatToBFloat16Bits.
void AmxGemmBf16Rounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
                        int64_t ldb, uint16_t* c, int64_t ldc);

}  // namespace castor::cpu
