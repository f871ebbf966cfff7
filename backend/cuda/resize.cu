// CUDA kernels: Resize and com.castor ResizeGrad (backend/cpu/resize.cc on
// the CPU). The taps (backend/common/resize_geometry.h) are planned on the
// host exactly as the CPU plans them, which reads scales/sizes back (they
// decide the output shape), and uploaded to scratch; one thread per output
// element then walks them. Resize nearest moves bytes in any fixed-size
// dtype; linear computes float32/float16/bfloat16 in float32 and rounds
// once, as the CPU. ResizeGrad adds dY times the weights into a float32
// accumulator with atomics (the sums' order differs from the CPU's, so
// float32 results agree to rounding) and rounds once into dX.
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/resize_geometry.h"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

using common::ResizeIndexer;

template <typename E>
__global__ void ResizeNearestKernel(const E* x, E* y, ResizeIndexer indexer, int64_t total) {
  CASTOR_GRID_STRIDE(o, total) {
    indexer.ForEachSource(o, [&](int64_t offset, float) { y[o] = x[offset]; });
  }
}

template <typename T>
__global__ void ResizeLinearKernel(const T* x, T* y, ResizeIndexer indexer, int64_t total) {
  CASTOR_GRID_STRIDE(o, total) {
    float sum = 0.0f;
    indexer.ForEachSource(o, [&](int64_t offset, float weight) { sum += weight * ToFloat(x[offset]); });
    y[o] = FromFloat<T>(sum);
  }
}

template <typename T>
__global__ void ResizeGradKernel(const T* dy, float* acc, ResizeIndexer indexer, int64_t total) {
  CASTOR_GRID_STRIDE(o, total) {
    const float value = ToFloat(dy[o]);
    indexer.ForEachSource(o, [&](int64_t offset, float weight) {
      atomicAdd(acc + offset, weight * value);
    });
  }
}

// Calls f(TypeTag<E>{}) with E an unsigned type of `size` bytes.
template <typename F>
absl::Status DispatchBytes(const KernelContext& ctx, size_t size, F&& f) {
  switch (size) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    default:
      return ctx.Unimplemented(absl::StrCat("no CUDA kernel moves elements of ", size, " bytes"));
  }
}

// The geometry from scales (input `scales_at`) and sizes (`sizes_at`, -1:
// none), read to the host; its taps uploaded to scratch.
absl::StatusOr<common::ResizeGeometry> PlanOnDevice(KernelContext& ctx,
                                                   const std::vector<int64_t>& in_dims,
                                                   int scales_at, int sizes_at, bool opset10) {
  std::vector<float> scales;
  std::vector<int64_t> sizes;
  if (scales_at < ctx.num_inputs() && ctx.has_input(scales_at)) {
    const TensorView& t = ctx.input(scales_at);
    if (t.num_elements() > 0) {
      if (t.dtype != DType::kFloat32) {
        return ctx.Error(absl::StrCat("input ", scales_at, " (scales) is ", DTypeName(t.dtype),
                                      "; expected float32"));
      }
      scales.resize(static_cast<size_t>(t.num_elements()));
      if (t.host_data != nullptr) {
        std::memcpy(scales.data(), t.host_data, scales.size() * sizeof(float));
      } else {
        CASTOR_RETURN_IF_ERROR(
            ctx.backend().CopyToHost(scales.data(), t.data, scales.size() * sizeof(float)));
      }
    }
  }
  if (sizes_at >= 0 && sizes_at < ctx.num_inputs() && ctx.has_input(sizes_at)) {
    CASTOR_ASSIGN_OR_RETURN(sizes, ReadInt64s(ctx, sizes_at));
  }
  CASTOR_ASSIGN_OR_RETURN(common::ResizeGeometry g,
                          common::PlanResize(ctx, in_dims, scales, sizes, opset10));
  const size_t bytes = g.taps.size() * sizeof(common::ResizeTap);
  if (bytes > 0) {
    CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(bytes));
    CASTOR_RETURN_IF_ERROR(ctx.backend().CopyFromHost(buffer, g.taps.data(), bytes));
    g.indexer.taps = static_cast<const common::ResizeTap*>(buffer);
  }
  return g;
}

absl::Status RunResize(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const bool opset10 = ctx.opset() < 11;
  CASTOR_ASSIGN_OR_RETURN(const common::ResizeGeometry g,
                          PlanOnDevice(ctx, x.dims, opset10 ? 1 : 2, opset10 ? -1 : 3, opset10));
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, g.out_dims));
  const int64_t total = y->num_elements();
  if (total == 0) return absl::OkStatus();
  if (ctx.GetString("mode", "nearest") == "nearest") {
    return DispatchBytes(ctx, DTypeSize(x.dtype), [&](auto tag) {
      using E = typename decltype(tag)::type;
      ResizeNearestKernel<E><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
          static_cast<const E*>(x.data), static_cast<E*>(y->data), g.indexer, total);
      return CheckLaunch(ctx);
    });
  }
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ResizeLinearKernel<T><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(x.as<T>(), y->as<T>(),
                                                                      g.indexer, total);
    return CheckLaunch(ctx);
  });
}

absl::Status RunResizeGrad(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  if (dy.dtype != x.dtype) {
    return ctx.Error(absl::StrCat("input 0 (dY) is ", DTypeName(dy.dtype), " but input 1 (X) is ",
                                  DTypeName(x.dtype), "; they must match"));
  }
  CASTOR_ASSIGN_OR_RETURN(const common::ResizeGeometry g,
                          PlanOnDevice(ctx, x.dims, 2, 3, /*opset10=*/false));
  if (dy.dims != g.out_dims) {
    return ctx.Error(absl::StrCat("input 0 (dY) is ", DimsToString(dy.dims),
                                  "; expected Resize's output ", DimsToString(g.out_dims)));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const int64_t n = dx->num_elements();
  if (n == 0) return absl::OkStatus();
  float* acc = nullptr;
  if (x.dtype == DType::kFloat32) {
    acc = dx->as<float>();
  } else {
    CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(static_cast<size_t>(n) * sizeof(float)));
    acc = static_cast<float*>(buffer);
  }
  CASTOR_CUDA_CALL(cudaMemsetAsync(acc, 0, static_cast<size_t>(n) * sizeof(float), Stream(ctx)));
  const int64_t total = dy.num_elements();
  return DispatchFloat(ctx, x.dtype, [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    if (total > 0) {
      ResizeGradKernel<T><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(dy.as<T>(), acc, g.indexer,
                                                                       total);
      CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
    }
    if constexpr (!std::is_same_v<T, float>) {
      CASTOR_RETURN_IF_ERROR(ConvertFloats(ctx, acc, n, dx->as<T>()));
    }
    return absl::OkStatus();
  });
}

// A SupportsFn: linear needs a CUDA float type; nearest moves any element
// of 1 to 8 bytes.
absl::Status ResizeSupports(const Node& node) {
  const Value* x = node.input(0);
  if (x == nullptr || x->dtype() == DType::kUndefined) return absl::OkStatus();
  if (node.GetString("mode", "nearest") == "nearest") {
    const size_t size = DTypeSize(x->dtype());
    if (size == 1 || size == 2 || size == 4 || size == 8) return absl::OkStatus();
  } else if (IsCudaFloat(x->dtype())) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("Resize of ", DTypeName(x->dtype()), " data in mode ",
                                               node.GetString("mode", "nearest"), " on CUDA"));
}

}  // namespace

void RegisterResizeKernels(KernelTable& table) {
  table.Register(KernelDef{"", "Resize", ResizeSupports, RunResize, false});
  table.Register(KernelDef{kCastorDomain, "ResizeGrad", FloatDTypesIn(CudaFloatDTypes()),
                           RunResizeGrad, false});
}

}  // namespace castor::cuda
