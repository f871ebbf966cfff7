// CUDA kernels: matmul family (ops of graph/ops/matmul.cc) through cuBLAS,
// for float32, float16 and bfloat16 (the CPU kernels in backend/cpu/matmul.cc
// are the reference).
//
// MatMul: NumPy matmul (1-D operands get a 1 prepended/appended and dropped,
// batch dims broadcast). The broadcast batch is reduced to its axes of size
// above 1, neighbours that broadcast alike merged; then one GEMM when B is
// shared by every batch and A's batches are dense (batch folded into M), one
// strided-batched GEMM for a single batch axis (stride 0 for a broadcast
// side), else one pointer-array batched GEMM with the pointers computed on
// the device.
// Gemm: Y = alpha * op(A) * op(B) + beta * C, with C unidirectionally
// broadcast to [M, N] by a small kernel into Y first and cuBLAS's beta
// reading it back; no C (or beta == 0) is a plain GEMM. K == 0 gives beta * C
// or zeros.
//
// Every GEMM accumulates in float32 (CUBLAS_COMPUTE_32F; TF32 tensor cores
// for float32 only when the backend allows them) with float alpha/beta, and
// rounds once to the storage type. Row-major C = op(A) op(B) runs as the
// column-major C^T = op(B)^T op(A)^T. The 64-bit cuBLAS entry points take
// the int64 dims as they are.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/op_geometry.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/row_major_gemm.cuh"

namespace castor::cuda {
namespace {

// ---- cuBLAS GEMM ---------------------------------------------------------------

cudaDataType_t CublasDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// While alive, the cuBLAS handle runs castor's GEMMs: default math (TF32
// only through the compute type) and split-K reductions kept in float32
// rather than the 16-bit output type. Restores the previous mode.
class GemmMathMode {
 public:
  explicit GemmMathMode(cublasHandle_t handle) : handle_(handle) {}
  ~GemmMathMode() {
    if (entered_) cublasSetMathMode(handle_, previous_);  // best effort on the way out
  }
  GemmMathMode(const GemmMathMode&) = delete;
  GemmMathMode& operator=(const GemmMathMode&) = delete;

  absl::Status Enter() {
    CASTOR_CUBLAS_CALL(cublasGetMathMode(handle_, &previous_));
    entered_ = true;
    CASTOR_CUBLAS_CALL(cublasSetMathMode(
        handle_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    return absl::OkStatus();
  }

 private:
  cublasHandle_t handle_;
  cublasMath_t previous_ = CUBLAS_DEFAULT_MATH;
  bool entered_ = false;
};

}  // namespace

absl::Status RowMajorGemm(const KernelContext& ctx, DType dtype, const GemmShape& s, float alpha,
                          const void* a, const void* b, float beta, void* c,
                          const GemmBatch& batch) {
  const cublasHandle_t handle = Cuda(ctx).cublas();
  GemmMathMode math_mode(handle);
  CASTOR_RETURN_IF_ERROR(math_mode.Enter());
  const cudaDataType_t type = CublasDataType(dtype);
  const cublasComputeType_t compute = dtype == DType::kFloat32 && Cuda(ctx).allow_tf32()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  // Column-major: C^T [n, m] = op(B)^T [n, k] * op(A)^T [k, m]; a row-major
  // matrix with row stride ld is its transpose in column-major with the
  // same leading dimension.
  const cublasOperation_t op_b = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch.a_ptrs != nullptr) {
    CASTOR_CUBLAS_CALL(cublasGemmBatchedEx_64(
        handle, op_b, op_a, s.n, s.m, s.k, &alpha, batch.b_ptrs, type, s.ldb, batch.a_ptrs, type,
        s.lda, &beta, batch.c_ptrs, type, s.ldc, batch.count, compute, CUBLAS_GEMM_DEFAULT));
  } else if (batch.count == 1) {
    CASTOR_CUBLAS_CALL(cublasGemmEx_64(handle, op_b, op_a, s.n, s.m, s.k, &alpha, b, type, s.ldb,
                                       a, type, s.lda, &beta, c, type, s.ldc, compute,
                                       CUBLAS_GEMM_DEFAULT));
  } else {
    CASTOR_CUBLAS_CALL(cublasGemmStridedBatchedEx_64(
        handle, op_b, op_a, s.n, s.m, s.k, &alpha, b, type, s.ldb, batch.stride_b, a, type, s.lda,
        batch.stride_a, &beta, c, type, s.ldc, batch.stride_c, batch.count, compute,
        CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

namespace {

// ---- MatMul ----------------------------------------------------------------------

// The broadcast batch axes of a MatMul with more than one element, merged
// where neighbours broadcast alike (outermost first). Steps count matrices
// of each operand; 0 means that operand is broadcast along the axis.
constexpr int kMaxBatchAxes = 8;
struct BatchAxes {
  int rank = 0;
  int64_t size[kMaxBatchAxes] = {};
  int64_t a_step[kMaxBatchAxes] = {};
  int64_t b_step[kMaxBatchAxes] = {};
};

// Fills the pointer arrays of a batched GEMM: output matrix i (row-major
// over `axes`) reads A and B at the offsets its batch index gives.
__global__ void FillBatchPointers(BatchAxes axes, const char* a, int64_t a_bytes, const char* b,
                                  int64_t b_bytes, char* c, int64_t c_bytes, int64_t count,
                                  const void** a_ptrs, const void** b_ptrs, void** c_ptrs) {
  CASTOR_GRID_STRIDE(i, count) {
    int64_t rest = i, a_offset = 0, b_offset = 0;
    for (int r = axes.rank - 1; r >= 0; --r) {
      const int64_t index = rest % axes.size[r];
      rest /= axes.size[r];
      a_offset += index * axes.a_step[r];
      b_offset += index * axes.b_step[r];
    }
    a_ptrs[i] = a + a_offset * a_bytes;
    b_ptrs[i] = b + b_offset * b_bytes;
    c_ptrs[i] = c + i * c_bytes;
  }
}

absl::Status MatMulKernel(KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::MatMulGeometry geometry, common::PlanMatMul(ctx));
  const int64_t m = geometry.m, n = geometry.n, k = geometry.k;
  const std::vector<int64_t>& batch = geometry.batch;
  const std::vector<int64_t>& a_stride = geometry.a_stride;
  const std::vector<int64_t>& b_stride = geometry.b_stride;
  const size_t rank = batch.size();
  const std::vector<int64_t>& out_dims = geometry.out_dims;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, a.dtype, out_dims));
  if (y->num_elements() == 0) return absl::OkStatus();
  if (k == 0) {  // empty sums: zeros (all-zero bits in every float dtype)
    CASTOR_CUDA_CALL(cudaMemsetAsync(y->data, 0, y->byte_size(), Stream(ctx)));
    return absl::OkStatus();
  }

  // The batch axes above 1, neighbours that broadcast alike merged (their
  // steps nest: the outer step is the inner one times the inner size).
  BatchAxes axes;
  int64_t batch_count = 1;
  for (size_t r = 0; r < rank; ++r) {
    if (batch[r] == 1) continue;
    batch_count *= batch[r];
    const int last = axes.rank - 1;
    if (last >= 0 && (axes.a_step[last] == 0) == (a_stride[r] == 0) &&
        (axes.b_step[last] == 0) == (b_stride[r] == 0)) {
      axes.size[last] *= batch[r];
      axes.a_step[last] = a_stride[r];
      axes.b_step[last] = b_stride[r];
      continue;
    }
    if (axes.rank == kMaxBatchAxes) {
      return ctx.Unimplemented(absl::StrCat("the broadcast of A ", DimsToString(a.dims), " and B ",
                                            DimsToString(b.dims), " has more than ",
                                            kMaxBatchAxes, " alternating batch axes"));
    }
    axes.size[axes.rank] = batch[r];
    axes.a_step[axes.rank] = a_stride[r];
    axes.b_step[axes.rank] = b_stride[r];
    ++axes.rank;
  }

  GemmShape shape;
  shape.m = m;
  shape.n = n;
  shape.k = k;
  shape.lda = k;
  shape.ldb = n;
  shape.ldc = n;
  if (axes.rank == 0) return RowMajorGemm(ctx, a.dtype, shape, 1.0f, a.data, b.data, 0.0f, y->data);
  if (axes.rank == 1) {
    if (axes.b_step[0] == 0) {
      // One B for every batch and A's batches dense (step 1 matrix, in the
      // output's order): a single GEMM with the batch folded into M.
      shape.m = batch_count * m;
      return RowMajorGemm(ctx, a.dtype, shape, 1.0f, a.data, b.data, 0.0f, y->data);
    }
    GemmBatch strided;
    strided.count = batch_count;
    strided.stride_a = axes.a_step[0] * m * k;
    strided.stride_b = axes.b_step[0] * k * n;
    strided.stride_c = m * n;
    return RowMajorGemm(ctx, a.dtype, shape, 1.0f, a.data, b.data, 0.0f, y->data, strided);
  }
  // General broadcast: pointer arrays [A..., B..., C...] built on the device.
  const size_t array_bytes = static_cast<size_t>(batch_count) * sizeof(void*);
  CASTOR_ASSIGN_OR_RETURN(void* arrays, ctx.Scratch(3 * array_bytes));
  const void** a_ptrs = static_cast<const void**>(arrays);
  const void** b_ptrs = a_ptrs + batch_count;
  void** c_ptrs = static_cast<void**>(arrays) + 2 * batch_count;
  const int64_t elem = static_cast<int64_t>(DTypeSize(a.dtype));
  FillBatchPointers<<<Blocks(batch_count), kThreads, 0, Stream(ctx)>>>(
      axes, static_cast<const char*>(a.data), m * k * elem, static_cast<const char*>(b.data),
      k * n * elem, static_cast<char*>(y->data), m * n * elem, batch_count, a_ptrs, b_ptrs, c_ptrs);
  CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
  GemmBatch pointers;
  pointers.count = batch_count;
  pointers.a_ptrs = a_ptrs;
  pointers.b_ptrs = b_ptrs;
  pointers.c_ptrs = c_ptrs;
  return RowMajorGemm(ctx, a.dtype, shape, 1.0f, nullptr, nullptr, 0.0f, nullptr, pointers);
}

// ---- Gemm ------------------------------------------------------------------------

// y[i, j] = scale * c[i or 0, j or 0] for y [m, n]: C ([c_rows, c_cols],
// each 1 or the full size) unidirectionally broadcast, in float32.
template <typename T>
__global__ void BroadcastScaledC(const T* c, int64_t c_rows, int64_t c_cols, float scale, T* y,
                                 int64_t m, int64_t n) {
  CASTOR_GRID_STRIDE(i, m * n) {
    const int64_t row = i / n, col = i % n;
    const int64_t source = (c_rows == 1 ? 0 : row * c_cols) + (c_cols == 1 ? 0 : col);
    y[i] = scale == 1.0f ? c[source] : FromFloat<T>(scale * ToFloat(c[source]));
  }
}

absl::Status GemmKernel(KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::GemmGeometry g, common::PlanGemm(ctx));
  GemmShape shape;
  shape.trans_a = g.trans_a;
  shape.trans_b = g.trans_b;
  const float alpha = g.alpha, beta = g.beta;
  const int64_t m = g.m, n = g.n, k = g.k;
  // C broadcast to [m, n]: c_rows x c_cols with 1 meaning broadcast.
  const TensorView* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const int64_t c_rows = g.c_rows, c_cols = g.c_cols;
  const bool use_c = g.use_c;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, a.dtype, {m, n}));
  if (m == 0 || n == 0) return absl::OkStatus();
  if (!use_c && k == 0) {
    CASTOR_CUDA_CALL(cudaMemsetAsync(y->data, 0, y->byte_size(), Stream(ctx)));
    return absl::OkStatus();
  }
  if (use_c) {
    // Y = C broadcast (exact), which the GEMM then reads with beta; with
    // K == 0 there is no product and Y = beta * C (rounded once).
    const float scale = k == 0 ? beta : 1.0f;
    CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, a.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      BroadcastScaledC<T><<<Blocks(m * n), kThreads, 0, Stream(ctx)>>>(
          c->as<T>(), c_rows, c_cols, scale, y->as<T>(), m, n);
      return CheckLaunch(ctx);
    }));
    if (k == 0) return absl::OkStatus();
  }
  shape.m = m;
  shape.n = n;
  shape.k = k;
  shape.lda = a.dims[1];
  shape.ldb = b.dims[1];
  shape.ldc = n;
  return RowMajorGemm(ctx, a.dtype, shape, alpha, a.data, b.data, use_c ? beta : 0.0f, y->data);
}

}  // namespace

void RegisterMatMulKernels(KernelTable& table) {
  table.Register({"", "MatMul", InputDTypeIn(0, CudaFloatDTypes()), MatMulKernel});
  table.Register({"", "Gemm", InputDTypeIn(0, CudaFloatDTypes()), GemmKernel});
}

}  // namespace castor::cuda
