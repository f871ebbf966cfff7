// Shared pieces of the CUDA kernels: error checks that turn CUDA, cuBLAS and
// cuDNN codes into absl::Status naming what failed, the backend behind a
// KernelContext, launch geometry, the float types castor computes in
// (float, __half, __nv_bfloat16) with float32 loads/stores, a dtype
// dispatcher, and small host reads of int tensors (shapes, axes).
//
//   return DispatchFloat(ctx, x.dtype, [&](auto tag) {
//     using T = typename decltype(tag)::type;
//     MyKernel<T><<<Blocks(n), kThreads, 0, Stream(ctx)>>>(x.as<T>(), ...);
//     return CheckLaunch(ctx);
//   });
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/dims.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/kernel.h"
#include "graph/dtype.h"
#include "graph/status.h"

namespace castor::cuda {

// ---- errors --------------------------------------------------------------------

// OK for success codes; otherwise an Internal error "<what>: <library text>".
absl::Status CudaStatus(cudaError_t code, const char* what);
absl::Status CublasStatus(cublasStatus_t code, const char* what);
absl::Status CudnnStatus(cudnnStatus_t code, const char* what);

#define CASTOR_CUDA_CALL(expr)                                                             \
  do {                                                                                    \
    if (const cudaError_t castor_cuda_code_ = (expr); castor_cuda_code_ != cudaSuccess) { \
      return ::castor::cuda::CudaStatus(castor_cuda_code_, #expr);                        \
    }                                                                                     \
  } while (0)
#define CASTOR_CUBLAS_CALL(expr)                                          \
  do {                                                                    \
    if (const cublasStatus_t castor_cublas_code_ = (expr);                \
        castor_cublas_code_ != CUBLAS_STATUS_SUCCESS) {                   \
      return ::castor::cuda::CublasStatus(castor_cublas_code_, #expr);    \
    }                                                                     \
  } while (0)
#define CASTOR_CUDNN_CALL(expr)                                                                \
  do {                                                                                        \
    if (const cudnnStatus_t castor_cudnn_code_ = (expr);                                      \
        castor_cudnn_code_ != CUDNN_STATUS_SUCCESS) {                                         \
      return ::castor::cuda::CudnnStatus(castor_cudnn_code_, #expr);                          \
    }                                                                                         \
  } while (0)

// ---- the backend behind a kernel ---------------------------------------------

inline CudaBackend& Cuda(const KernelContext& ctx) {
  return static_cast<CudaBackend&>(ctx.backend());
}
inline cudaStream_t Stream(const KernelContext& ctx) { return Cuda(ctx).stream(); }

// The error of the last launch, if any, as the node's error (launch errors
// are configuration errors; faults inside a kernel surface at the next
// synchronisation).
absl::Status CheckLaunch(const KernelContext& ctx);

// ---- launch geometry -------------------------------------------------------------

inline constexpr int kThreads = 256;
// Blocks for a grid-stride loop over `n` elements (at least 1, capped so
// huge tensors loop instead of overflowing the grid).
inline unsigned Blocks(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));
}
#define CASTOR_GRID_STRIDE(i, n)                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- float types -------------------------------------------------------------------

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// The CUDA float types castor's kernels compute in.
inline bool IsCudaFloat(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}
inline const std::vector<DType>& CudaFloatDTypes() {
  static const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  return dtypes;
}

// Calls `f(TypeTag<T>{})` with T the CUDA type of `dtype` (float, __half,
// __nv_bfloat16) and returns its Status; other dtypes are the node's
// Unimplemented error (the kernel's supports predicate should prevent it).
template <typename F>
absl::Status DispatchFloat(const KernelContext& ctx, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    default:
      return ctx.Unimplemented(std::string("the CUDA kernel has no ") + DTypeName(dtype) +
                               " variant");
  }
}

// ---- messages ------------------------------------------------------------------------

// "[2,3,4]": dims as error messages print them (the CPU backend's).
using common::DimsToString;

// ---- host reads ----------------------------------------------------------------------

// The elements of int32/int64 input `index` (a shape, axes, starts...) on
// the host: from the executor's host copy (TensorView::host_data) when it
// has one, which is the rule for constants, feeds and Shape-like outputs;
// otherwise the copy synchronises the stream.
absl::StatusOr<std::vector<int64_t>> ReadInt64s(const KernelContext& ctx, int index);

// Copies `values` into a new device output `index` of dtype int64 and
// dims `dims` (Shape, Size...), and hands the executor the host copy.
absl::Status WriteInt64Output(KernelContext& ctx, int index, const std::vector<int64_t>& dims,
                              const std::vector<int64_t>& values);

}  // namespace castor::cuda
