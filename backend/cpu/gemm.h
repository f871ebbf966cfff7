// The one GEMM entry of the CPU backend, used by MatMul, Gemm, Conv and
// ConvTranspose: row-major C = alpha * op(A) * op(B) + beta * C.
//
// float32 and float64 go to OpenBLAS (cblas_sgemm / cblas_dgemm), which
// castor sets to one thread on the first GEMM: a large GEMM is split into
// blocks of C's rows or columns run on castor's own ParallelFor threads.
// (OpenBLAS's own worker threads spin in sched_yield for a long time after
// each GEMM; with as many castor threads as cores they took the cores from
// castor's kernels.) 16-bit operands (float16, bfloat16) are widened
// exactly to float32 in K-panels and multiplied by the same sgemm, so
// products accumulate in float32 as tensor cores do; C stays float32 and the
// caller rounds it once on store, or GemmRoundedToDType rounds it into a
// 16-bit C. bfloat16 operands go to AMX tiles instead where the CPU has
// them (amx_gemm.h), else to AVX512-BF16 dot products where it has those
// (avx512bf16_gemm.h); both sum in float32 in another order and flush
// subnormals.
#pragma once

#include <cstdint>
#include <string>

#include "graph/dtype.h"

namespace castor::cpu {

// Row-major float32 GEMM: C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C.
// lda/ldb/ldc are the row strides (in elements) of A, B and C as stored.
// k == 0 gives C = beta * C (C is not read when beta == 0).
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// The same in float64.
void Dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
           int64_t ldc);

// A and B stored with float dtype `dtype` (float32, float16 or bfloat16; not
// float64), C float32. 16-bit operands are widened to float32 panel by panel
// (at most a few tens of MiB of scratch) and multiplied with Sgemm; bfloat16
// ones run on AMX where AmxBf16Available(), else on AVX512-BF16 where
// Avx512Bf16Available().
void GemmFloat32Accumulate(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const void* a, int64_t lda, const void* b,
                           int64_t ldb, float beta, float* c, int64_t ldc);

// C = alpha * op(A) * op(B) with A, B and C all of float dtype `dtype`
// (float32, float16 or bfloat16; C's row stride ldc): products accumulate
// in float32 as in GemmFloat32Accumulate and C is rounded once to `dtype`.
// bfloat16 on AMX rounds each block of C as it is finished (no float32
// copy of C); otherwise C is computed in float32 scratch and rounded on
// every thread.
void GemmRoundedToDType(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const void* a, int64_t lda, const void* b,
                        int64_t ldb, void* c, int64_t ldc);

// One line for summaries and --version: blas_core.h's DescribeBlasCore(),
// plus "; AMX for bfloat16 GEMMs" where amx_gemm.h runs, or
// "; AVX512-BF16 for bfloat16 GEMMs" where avx512bf16_gemm.h does, and
// where grid_conv.h's bfloat16 products run, " and convolutions" after it
// (with AMX: "; AVX512-BF16 for bfloat16 convolutions"). Where the CPU
// has AVX512-BF16 too slow to pay (avx512bf16_gemm.h's Avx512Bf16Pays) and
// the environment did not switch it off: "; AVX512-BF16 not used: its dot
// products run at 0.49x the float32 FMA rate here" ("used
// (CASTOR_AVX512BF16=on)" where the environment forced it).
std::string DescribeGemm();

// C = beta * C, the GEMM of an empty K (C is not read when beta == 0, so
// NaN there stays out). Shared by the sgemm/dgemm wrappers and the AMX and
// AVX512-BF16 kernels.
template <typename T>
void ScaleC(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == T(0) ? T(0) : beta * row[j];
  }
}

// The switch of a native GEMM kernel (CASTOR_AMX, CASTOR_AVX512BF16), as
// environment variable `name` sets it (any case): off, 0, no or false:
// kOff; on, 1, yes or true: kOn (use the kernel even where castor would
// not choose it); unset, empty or auto: kAuto (castor chooses). Anything
// else is reported on stderr and read as kAuto.
enum class KernelSwitch { kAuto, kOn, kOff };
KernelSwitch GemmKernelSwitchInEnvironment(const char* name);

// True when Sgemm runs a GEMM of this size on the calling thread alone
// (OpenBLAS's own multithreading threshold), so a caller with many
// independent GEMMs of this size should run them in parallel itself.
bool IsSmallGemm(int64_t m, int64_t n, int64_t k);

}  // namespace castor::cpu
