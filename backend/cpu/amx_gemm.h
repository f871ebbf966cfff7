// bfloat16 GEMM on Intel AMX (Advanced Matrix Extensions) tiles, for the
// CPU backend's 16-bit MatMul/Gemm under mixed_bfloat16 (gemm.h's
// GemmFloat32Accumulate takes it where it runs).
//
// op(A) and op(B) are packed into 16-row x 32-column bfloat16 tiles (B in
// the pair-interleaved layout the tile product reads), zero-padded to whole
// tiles, and each 32 x 32 block of C is four 16 x 16 float32 accumulator
// tiles fed by TDPBF16PS over K in steps of 32. alpha and beta are applied
// once per C element when the block is written back.
//
// Numerics, as on a GPU's tensor cores: every product of two bfloat16 is
// exact in float32 and sums accumulate in float32, but in pairs (two
// products added, then added to the accumulator, with round-to-nearest-even)
// and in another order than the widened sgemm's, and TDPBF16PS treats
// subnormal inputs and results as zero. Results agree with the sgemm path to
// float32 rounding of the sum's magnitude, not bit for bit; every run gives
// the same bits.
//
// Runs only where the CPU has AMX-TILE and AMX-BF16 and Linux grants the
// process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+);
// elsewhere AmxBf16Available() is false and callers keep the sgemm path.
#pragma once

#include <cstdint>

namespace castor::cpu {

// True when AmxGemmBf16 can run here (checked once; asks Linux for the tile
// state on the first call) and no test turned it off.
bool AmxBf16Available();

// True when the hardware and OS allow AMX, whatever a test chose.
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
// (C is not read when beta == 0). Requires AmxBf16Available(). Splits the
// work across threads (serial inside a ParallelFor).
void AmxGemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                 float* c, int64_t ldc);

}  // namespace castor::cpu
