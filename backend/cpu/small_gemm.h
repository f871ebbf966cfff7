// Small 16-bit GEMMs in registers: the per-head products of attention
// (a transformer's Q * K^T and softmax * V, [28 x 16] * [16 x 28] and
// [28 x 28] * [28 x 16] per image and head), which a batched MatMul runs
// by the hundred per step. The general path (gemm.h) widens both operands
// into scratch, calls OpenBLAS's sgemm and rounds C: for such sizes its
// fixed costs are most of the time (bfloat16 28 x 28 x 16: 0.75 us where
// sgemm alone on float32 takes 0.36; VDPBF16PS's kernel 0.61, its
// packing). Here op(B) is widened once into a zero-padded float32 panel
// per thread, and each block of rows of C (eight, four or three, by width)
// sums over k in float32 AVX-512 registers (the rows' A values widened
// first, then broadcast), then is rounded once on store.
//
// Numerics: each C element is alpha * sum_k a[i][k] * b[k][j], summed in
// order of k from zero with fused multiply-adds (one rounding per step, as
// OpenBLAS's kernels do; the order of sums may differ from sgemm's, so the
// results agree to float32 rounding of the sum's magnitude, not bit for
// bit), then rounded to the 16-bit type once (simd16.h's StoreRounded: the
// bits of graph/half.h's conversions). Subnormals are kept; Inf and NaN
// propagate as in float32. The bits do not depend on threads or timing.
//
// Only where simd16.h's HasSimd16() is true (AVX-512 F/BW/VL, F16C); the
// code carries per-function target attributes.
#pragma once

#include <cstdint>

#include "graph/dtype.h"

namespace castor::cpu {

// The largest n and k SmallGemmRounded takes (op(B) in a 256 x 64 float32
// panel: 64 KiB per thread).
inline constexpr int64_t kSmallGemmMaxN = 64;
inline constexpr int64_t kSmallGemmMaxK = 256;

// True when SmallGemmRounded runs this GEMM: where gemm.h would widen the
// operands (float16; bfloat16 where neither AMX nor AVX512-BF16 kernels
// run: their own small products were not measured against this one), n
// and k within the limits above (and positive), m * n * k at most gemm.h's
// single-thread size, on a CPU with HasSimd16().
bool SmallGemmApplies(DType dtype, int64_t m, int64_t n, int64_t k);

// Row-major C[m, n] = alpha * A[m, k] * B[k, n] for float16 or bfloat16 A,
// B and C (row strides lda, ldb, ldc), where SmallGemmApplies.
void SmallGemmRounded(DType dtype, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                      int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc);

}  // namespace castor::cpu
