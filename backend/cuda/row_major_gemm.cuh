// castor's one cuBLAS GEMM entry (defined in matmul.cu), shared by the
// matmul family and Einsum (einsum.cu): row-major C = alpha op(A) op(B) +
// beta C, one GEMM, a strided batch or a pointer-array batch, accumulating
// in float32 (TF32 for float32 only when the backend allows it) and
// rounding once to the storage type (float32, float16 or bfloat16).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "backend/kernel.h"

namespace castor::cuda {

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C; lda,
// ldb and ldc are the row strides of A, B and C as stored. Requires m, n,
// k >= 1.
struct GemmShape {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
};

// How many GEMMs of one shape run and where their matrices are: `count`
// GEMMs at element strides (0 = the same matrix for all), or, when a_ptrs
// is set, at the device pointer arrays a_ptrs/b_ptrs/c_ptrs.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  const void* const* a_ptrs = nullptr;
  const void* const* b_ptrs = nullptr;
  void* const* c_ptrs = nullptr;
};

absl::Status RowMajorGemm(const KernelContext& ctx, DType dtype, const GemmShape& s, float alpha,
                          const void* a, const void* b, float beta, void* c,
                          const GemmBatch& batch = {});

}  // namespace castor::cuda
