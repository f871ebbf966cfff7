// The one GEMM entry of the CPU backend, used by MatMul, Gemm, Conv and
// ConvTranspose: row-major C = alpha * op(A) * op(B) + beta * C.
//
// float32 and float64 go straight to OpenBLAS (cblas_sgemm / cblas_dgemm,
// threaded by OpenBLAS with the thread count the CpuBackend set). 16-bit
// operands (float16, bfloat16) are widened exactly to float32 in K-panels and
// multiplied by the same sgemm, so products accumulate in float32 as tensor
// cores do; C stays float32 and the caller rounds it once on store.
#pragma once

#include <cstdint>

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
// (at most a few tens of MiB of scratch) and multiplied with Sgemm.
void GemmFloat32Accumulate(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const void* a, int64_t lda, const void* b,
                           int64_t ldb, float beta, float* c, int64_t ldc);

// True when OpenBLAS runs a GEMM of this size on the calling thread alone
// (its multithreading threshold), so a caller with many independent GEMMs of
// this size should run them in parallel itself (ParallelFor).
bool IsSmallGemm(int64_t m, int64_t n, int64_t k);

// While alive, OpenBLAS runs every GEMM on its calling thread, so GEMMs
// issued from all ParallelFor threads at once do not compete for OpenBLAS's
// own thread pool; restores the previous thread count. (Kernels run one at
// a time, so nothing else changes the count meanwhile.)
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;
};

}  // namespace castor::cpu
