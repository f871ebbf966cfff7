// CUDA kernels: pool family (ops of graph/ops/pool.cc) and their gradients
// (com.castor MaxPoolGrad, AveragePoolGrad, GlobalAveragePoolGrad), matching
// backend/cpu/pool.cc and backend/cpu/pool_grad.cc.
//
// MaxPool (float32/float16/bfloat16/int8/uint8, optional int64 Indices in
// storage_order 0 or 1) and AveragePool (count_include_pad) run one thread
// per output element over 1-D, 2-D or 3-D windows, with the window geometry
// (output sizes, auto_pad, ceil_mode, dilations) of the CPU backend's
// ForwardWindowGeometry. A window visits the positions inside the input in
// row-major window order, as the CPU does: the max keeps the first maximum
// (a NaN wins over numbers), the average sums in that order in float32 and
// divides by the positions inside the input or, with count_include_pad, by
// those inside the padded input. GlobalAveragePool/GlobalMaxPool reduce one
// plane per warp.
// The gradients scatter from one thread per dY element: MaxPoolGrad to the
// window's first maximum (the forward's tie rule), AveragePoolGrad dY / count
// to every position. Where windows can overlap they accumulate with atomicAdd
// in float32 (the output itself for float32, else a scratch buffer rounded
// once at the end); disjoint windows store directly into a zeroed dX.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/op_geometry.h"
#include "backend/common/window_geometry.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

// Windowed pools handle up to this many spatial axes (1-D, 2-D and 3-D).
constexpr int kMaxPoolDims = 3;

// ---- element access --------------------------------------------------------------

// Storage value as float32 (int8/uint8 are exact in float32).
template <typename T>
__device__ __forceinline__ float LoadAsFloat(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<float>(v);
  } else {
    return ToFloat(v);
  }
}

// float32 to storage: 16-bit floats round to nearest even; integers go
// through int as the CPU's int arithmetic type does.
template <typename T>
__device__ __forceinline__ T StoreFromFloat(float v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int>(v));
  } else {
    return FromFloat<T>(v);
  }
}

// The lowest value of the CPU's arithmetic type for T (what an empty max
// window yields): int's for int8/uint8, float's otherwise.
template <typename T>
__device__ __forceinline__ float LowestValue() {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<float>(std::numeric_limits<int>::lowest());
  } else {
    return -std::numeric_limits<float>::max();
  }
}

// Whether `v` replaces `best` as the window maximum: strictly greater, or a
// NaN over a number (so the first maximum, and the first NaN, win).
__device__ __forceinline__ bool TakesMax(float v, float best) {
  return v > best || (isnan(v) && !isnan(best));
}

// ---- window geometry -----------------------------------------------------------

// A windowed pool's geometry as a kernel argument. Axis arrays hold the
// spatial axes [0, nd); row_stride/col_stride are an input plane's
// row-major and column-major strides.
struct PoolParams {
  int64_t planes = 0;    // N * C
  int64_t in_size = 0;   // elements of one input plane
  int64_t out_size = 0;  // elements of one output plane
  int64_t input[kMaxPoolDims] = {};
  int64_t output[kMaxPoolDims] = {};
  int64_t kernel[kMaxPoolDims] = {};
  int64_t strides[kMaxPoolDims] = {};
  int64_t dilations[kMaxPoolDims] = {};
  int64_t pad_begin[kMaxPoolDims] = {};
  int64_t pad_end[kMaxPoolDims] = {};
  int64_t row_stride[kMaxPoolDims] = {};
  int64_t col_stride[kMaxPoolDims] = {};
  bool count_include_pad = false;
  bool column_major_indices = false;  // MaxPool storage_order = 1
};

// The window of one output position: along each axis the input index of
// kernel position 0 and the kernel positions [first, end) inside the input.
template <int kNd>
struct Window {
  int64_t start[kNd];
  int64_t first[kNd];
  int64_t end[kNd];
  int64_t inside = 1;  // positions inside the input
  int64_t padded = 1;  // positions inside the padded input
};

// Kernel positions k in [0, kernel) whose input index start + k * dilation
// lies in [lo, hi), as [*first, *end).
__device__ __forceinline__ void KernelSpan(int64_t start, int64_t dilation, int64_t kernel,
                                           int64_t lo, int64_t hi, int64_t* first,
                                           int64_t* end) {
  int64_t f = start >= lo ? 0 : (lo - start + dilation - 1) / dilation;
  int64_t e = hi - 1 - start < 0 ? 0 : (hi - 1 - start) / dilation + 1;
  f = f < kernel ? f : kernel;
  e = e < kernel ? e : kernel;
  *first = f;
  *end = e > f ? e : f;
}

// The window of output position q (row-major within one output plane).
template <int kNd>
__device__ __forceinline__ Window<kNd> WindowAt(const PoolParams& p, int64_t q) {
  Window<kNd> w;
#pragma unroll
  for (int d = kNd - 1; d >= 0; --d) {
    const int64_t o = q % p.output[d];
    q /= p.output[d];
    w.start[d] = o * p.strides[d] - p.pad_begin[d];
    KernelSpan(w.start[d], p.dilations[d], p.kernel[d], 0, p.input[d], &w.first[d], &w.end[d]);
    int64_t padded_first = 0, padded_end = 0;
    KernelSpan(w.start[d], p.dilations[d], p.kernel[d], -p.pad_begin[d],
               p.input[d] + p.pad_end[d], &padded_first, &padded_end);
    w.inside *= w.end[d] - w.first[d];
    w.padded *= padded_end - padded_first;
  }
  return w;
}

// Calls fn(row_offset, col_offset) for each input position of window `w`
// (offsets within the plane, row- and column-major) in row-major window
// order, axis 0 outermost.
template <int kD, int kNd, typename Fn>
__device__ __forceinline__ void VisitWindow(const PoolParams& p, const Window<kNd>& w, int64_t row,
                                            int64_t col, Fn& fn) {
  for (int64_t k = w.first[kD]; k < w.end[kD]; ++k) {
    const int64_t i = w.start[kD] + k * p.dilations[kD];
    const int64_t r = row + i * p.row_stride[kD];
    const int64_t c = col + i * p.col_stride[kD];
    if constexpr (kD + 1 == kNd) {
      fn(r, c);
    } else {
      VisitWindow<kD + 1, kNd>(p, w, r, c, fn);
    }
  }
}

// The first maximum of window `w` of plane `xs`: its value (LowestValue for
// an empty window) and row- and column-major offsets (-1 when empty).
struct WindowMax {
  float value;
  int64_t row = -1;
  int64_t col = -1;
};

template <typename T, int kNd>
__device__ __forceinline__ WindowMax FindWindowMax(const PoolParams& p, const Window<kNd>& w,
                                                   const T* xs) {
  WindowMax best;
  best.value = LowestValue<T>();
  auto take = [&](int64_t row, int64_t col) {
    const float v = LoadAsFloat(xs[row]);
    if (best.row < 0 || TakesMax(v, best.value)) {
      best.value = v;
      best.row = row;
      best.col = col;
    }
  };
  VisitWindow<0, kNd>(p, w, 0, 0, take);
  return best;
}

// ---- kernels -----------------------------------------------------------------------

// Y (and Indices, when not null) of MaxPool (kMax) or AveragePool: one
// thread per output element.
template <typename T, int kNd, bool kMax>
__global__ void PoolForwardKernel(PoolParams p, const T* __restrict__ x, T* __restrict__ y,
                                  int64_t* __restrict__ indices) {
  const int64_t total = p.planes * p.out_size;
  CASTOR_GRID_STRIDE(e, total) {
    const int64_t plane = e / p.out_size;
    const Window<kNd> w = WindowAt<kNd>(p, e - plane * p.out_size);
    const T* xs = x + plane * p.in_size;
    if constexpr (kMax) {
      const WindowMax best = FindWindowMax<T, kNd>(p, w, xs);
      y[e] = StoreFromFloat<T>(best.value);
      if (indices != nullptr) {
        const int64_t local = p.column_major_indices ? best.col : best.row;
        indices[e] = local < 0 ? -1 : plane * p.in_size + local;
      }
    } else {
      float sum = 0.0f;
      auto add = [&](int64_t row, int64_t) { sum += LoadAsFloat(xs[row]); };
      VisitWindow<0, kNd>(p, w, 0, 0, add);
      const int64_t count = p.count_include_pad ? w.padded : w.inside;
      y[e] = StoreFromFloat<T>(sum / static_cast<float>(count));
    }
  }
}

// dX of MaxPoolGrad (kMax) or AveragePoolGrad: one thread per dY element
// scatters into dx_accumulator (float32, zeroed, atomicAdd) or, when the
// windows are disjoint and dx_accumulator is null, stores into the zeroed
// dx_direct.
template <typename T, int kNd, bool kMax>
__global__ void PoolBackwardKernel(PoolParams p, const T* __restrict__ dy,
                                   const T* __restrict__ x, float* dx_accumulator,
                                   T* dx_direct) {
  const int64_t total = p.planes * p.out_size;
  CASTOR_GRID_STRIDE(e, total) {
    const int64_t plane = e / p.out_size;
    const Window<kNd> w = WindowAt<kNd>(p, e - plane * p.out_size);
    if (w.inside == 0) continue;
    const int64_t base = plane * p.in_size;
    auto add = [&](int64_t offset, float value) {
      if (dx_accumulator != nullptr) {
        atomicAdd(dx_accumulator + base + offset, value);
      } else {
        dx_direct[base + offset] = FromFloat<T>(value);
      }
    };
    const float g = ToFloat(dy[e]);
    if constexpr (kMax) {
      add(FindWindowMax<T, kNd>(p, w, x + base).row, g);
    } else {
      const int64_t count = p.count_include_pad ? w.padded : w.inside;
      const float share = g / static_cast<float>(count);
      auto spread = [&](int64_t row, int64_t) { add(row, share); };
      VisitWindow<0, kNd>(p, w, 0, 0, spread);
    }
  }
}

// max with NaN propagation (b when greater or NaN; a NaN, once in, stays).
struct NanMaxCombine {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return (b > a || isnan(b)) ? b : a;
  }
};

// GlobalMaxPool (kMax) / GlobalAveragePool: one warp per plane of `size`
// elements. An empty plane gives NaN, as on the CPU.
template <typename T, bool kMax>
__global__ void GlobalPoolKernel(const T* __restrict__ x, int64_t planes, int64_t size,
                                 T* __restrict__ y) {
  const NanMaxCombine nan_max{};
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x / 32;
  for (int64_t plane = blockIdx.x * warps_per_block + threadIdx.x / 32; plane < planes;
       plane += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const T* xs = x + plane * size;
    float acc = kMax ? -std::numeric_limits<float>::infinity() : 0.0f;
    for (int64_t i = lane; i < size; i += 32) {
      const float v = ToFloat(xs[i]);
      acc = kMax ? nan_max(acc, v) : acc + v;
    }
    // The plane depends on the warp only, so all 32 lanes reduce together.
    acc = kMax ? WarpReduce(acc, nan_max) : WarpSum(acc);
    if (lane == 0) {
      if constexpr (kMax) {
        y[plane] = FromFloat<T>(size > 0 ? acc : std::numeric_limits<float>::quiet_NaN());
      } else {
        y[plane] = FromFloat<T>(acc / static_cast<float>(size));
      }
    }
  }
}

// dX = dY[plane] / size everywhere in the plane.
template <typename T>
__global__ void GlobalAveragePoolGradKernel(const T* __restrict__ dy, int64_t size, int64_t total,
                                            T* __restrict__ dx) {
  const float divisor = static_cast<float>(size);
  CASTOR_GRID_STRIDE(e, total) { dx[e] = FromFloat<T>(ToFloat(dy[e / size]) / divisor); }
}

// ---- host side -----------------------------------------------------------------------

// Calls f(TypeTag<T>) for MaxPool's storage types: the CUDA floats, int8, uint8.
template <typename F>
absl::Status DispatchMaxPoolType(const KernelContext& ctx, DType dtype, F&& f) {
  if (dtype == DType::kInt8) return f(TypeTag<int8_t>{});
  if (dtype == DType::kUInt8) return f(TypeTag<uint8_t>{});
  return DispatchFloat(ctx, dtype, std::forward<F>(f));
}

// Calls f(std::integral_constant<int, nd>) for nd in [1, kMaxPoolDims].
template <typename F>
absl::Status DispatchSpatialRank(const KernelContext& ctx, int nd, F&& f) {
  switch (nd) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default:
      return ctx.Unimplemented(absl::StrCat("the CUDA kernel pools over 1 to ", kMaxPoolDims,
                                            " spatial axes; this node has ", nd));
  }
}

// What the windowed pools and their gradients share: the geometry of X
// (input `x_index`) and Y's dims.
struct WindowedPool {
  PoolParams params;
  std::vector<int64_t> y_dims;
  int nd = 0;
  bool windows_overlap = false;  // some input position may lie in two windows
};

absl::StatusOr<WindowedPool> SetUpWindowedPool(const KernelContext& ctx, int x_index) {
  const TensorView& x = ctx.input(x_index);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat(x_index == 0 ? "input X" : "input 1 (X)",
                                  " must have rank >= 3 ([N, C, D1, ...]); it is ",
                                  DimsToString(x.dims)));
  }
  if (x_index == 1 && ctx.input(0).dtype != x.dtype) {
    return ctx.Error(absl::StrCat("input 0 (dY) is ", DTypeName(ctx.input(0).dtype),
                                  " but input 1 (X) is ", DTypeName(x.dtype),
                                  "; they must match"));
  }
  if (!ctx.node().has_attribute("kernel_shape")) {
    return ctx.Error("attribute 'kernel_shape' is required");
  }
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  CASTOR_ASSIGN_OR_RETURN(const common::WindowGeometry g,
                          common::ForwardWindowGeometry(ctx, spatial, ctx.GetInts("kernel_shape"),
                                                        ctx.GetInt("ceil_mode", 0) != 0));
  WindowedPool pool;
  pool.nd = g.num_spatial;
  if (pool.nd > kMaxPoolDims) {
    return ctx.Unimplemented(absl::StrCat("the CUDA kernel pools over at most ", kMaxPoolDims,
                                          " spatial axes; X ", DimsToString(x.dims), " has ",
                                          pool.nd));
  }
  pool.y_dims = {x.dims[0], x.dims[1]};
  pool.y_dims.insert(pool.y_dims.end(), g.output.begin(), g.output.end());
  PoolParams& p = pool.params;
  p.planes = x.dims[0] * x.dims[1];
  p.in_size = g.input_size();
  p.out_size = g.output_size();
  int64_t row_step = 1, col_step = 1;
  for (int d = pool.nd - 1; d >= 0; --d) {
    p.row_stride[d] = row_step;
    row_step *= g.input[d];
  }
  for (int d = 0; d < pool.nd; ++d) {
    p.col_stride[d] = col_step;
    col_step *= g.input[d];
    p.input[d] = g.input[d];
    p.output[d] = g.output[d];
    p.kernel[d] = g.kernel[d];
    p.strides[d] = g.strides[d];
    p.dilations[d] = g.dilations[d];
    p.pad_begin[d] = g.pad_begin[d];
    p.pad_end[d] = g.pad_end[d];
    pool.windows_overlap |= g.strides[d] < (g.kernel[d] - 1) * g.dilations[d] + 1;
  }
  p.count_include_pad = ctx.GetInt("count_include_pad", 0) != 0;
  return pool;
}

absl::Status CheckStorageOrder(const KernelContext& ctx) {
  const int64_t storage_order = ctx.GetInt("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) {
    return ctx.Error(absl::StrCat("attribute 'storage_order' is ", storage_order,
                                  "; expected 0 or 1"));
  }
  return absl::OkStatus();
}

template <bool kMax>
absl::Status PoolKernel(KernelContext& ctx) {
  if (kMax) CASTOR_RETURN_IF_ERROR(CheckStorageOrder(ctx));
  CASTOR_ASSIGN_OR_RETURN(WindowedPool pool, SetUpWindowedPool(ctx, 0));
  pool.params.column_major_indices = ctx.GetInt("storage_order", 0) == 1;
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, pool.y_dims));
  int64_t* indices = nullptr;
  if (kMax && ctx.num_outputs() > 1 && ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * ind, ctx.Output(1, DType::kInt64, pool.y_dims));
    indices = ind->as<int64_t>();
  }
  const int64_t total = y->num_elements();
  if (total == 0) return absl::OkStatus();
  auto launch = [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchSpatialRank(ctx, pool.nd, [&](auto rank) {
      PoolForwardKernel<T, decltype(rank)::value, kMax><<<Blocks(total), kThreads, 0,
                                                          Stream(ctx)>>>(
          pool.params, x.as<T>(), y->as<T>(), indices);
      return CheckLaunch(ctx);
    });
  };
  if constexpr (kMax) {
    return DispatchMaxPoolType(ctx, x.dtype, launch);
  } else {
    return DispatchFloat(ctx, x.dtype, launch);
  }
}

template <bool kMax>
absl::Status PoolGradKernel(KernelContext& ctx) {
  if (kMax) CASTOR_RETURN_IF_ERROR(CheckStorageOrder(ctx));
  CASTOR_ASSIGN_OR_RETURN(const WindowedPool pool, SetUpWindowedPool(ctx, 1));
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  if (dy.dims != pool.y_dims) {
    return ctx.Error(absl::StrCat("input 0 (dY) is ", DimsToString(dy.dims), "; expected ",
                                  DimsToString(pool.y_dims), " (the pool's output for X)"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const int64_t dx_count = dx->num_elements();
  if (dx_count == 0) return absl::OkStatus();
  const int64_t dy_count = dy.num_elements();
  return DispatchFloat(ctx, x.dtype, [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    // Overlapping windows accumulate in float32: in dX itself when it is
    // float32, else in scratch rounded into dX at the end. The buffer
    // scattered into starts at zero.
    float* accumulator = nullptr;
    void* zeroed = dx->data;
    size_t zeroed_bytes = dx->byte_size();
    if (pool.windows_overlap && dy_count > 0) {
      if constexpr (std::is_same_v<T, float>) {
        accumulator = dx->as<float>();
      } else {
        zeroed_bytes = static_cast<size_t>(dx_count) * sizeof(float);
        CASTOR_ASSIGN_OR_RETURN(zeroed, ctx.Scratch(zeroed_bytes));
        accumulator = static_cast<float*>(zeroed);
      }
    }
    CASTOR_CUDA_CALL(cudaMemsetAsync(zeroed, 0, zeroed_bytes, Stream(ctx)));
    if (dy_count == 0) return absl::OkStatus();
    CASTOR_RETURN_IF_ERROR(DispatchSpatialRank(ctx, pool.nd, [&](auto rank) {
      PoolBackwardKernel<T, decltype(rank)::value, kMax><<<Blocks(dy_count), kThreads, 0,
                                                           Stream(ctx)>>>(
          pool.params, dy.as<T>(), x.as<T>(), accumulator, dx->as<T>());
      return CheckLaunch(ctx);
    }));
    if (accumulator == nullptr || static_cast<void*>(accumulator) == dx->data) {
      return absl::OkStatus();
    }
    return ConvertFloats(ctx, accumulator, dx_count, dx->as<T>());
  });
}

template <bool kMax>
absl::Status GlobalPoolKernelFor(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat("input X must have rank >= 3 ([N, C, D1, ...]); it is ",
                                  DimsToString(x.dims)));
  }
  std::vector<int64_t> y_dims(x.dims.size(), 1);
  y_dims[0] = x.dims[0];
  y_dims[1] = x.dims[1];
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, y_dims));
  const int64_t planes = x.dims[0] * x.dims[1];
  if (planes == 0) return absl::OkStatus();
  const int64_t size = x.num_elements() / planes;
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    GlobalPoolKernel<T, kMax><<<Blocks(planes * 32), kThreads, 0, Stream(ctx)>>>(
        x.as<T>(), planes, size, y->as<T>());
    return CheckLaunch(ctx);
  });
}

absl::Status GlobalAveragePoolGrad(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(common::CheckGlobalAveragePoolGrad(ctx));
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const int64_t total = dx->num_elements();
  if (total == 0) return absl::OkStatus();
  const int64_t size = total / (x.dims[0] * x.dims[1]);
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    GlobalAveragePoolGradKernel<T><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
        dy.as<T>(), size, total, dx->as<T>());
    return CheckLaunch(ctx);
  });
}

// `dtypes`, and a kernel_shape (when given) of at most kMaxPoolDims axes.
SupportsFn WindowedPoolSupports(SupportsFn dtypes) {
  return [dtypes = std::move(dtypes)](const Node& node) -> absl::Status {
    CASTOR_RETURN_IF_ERROR(dtypes(node));
    const size_t axes = node.GetInts("kernel_shape").size();
    if (axes > static_cast<size_t>(kMaxPoolDims)) {
      return absl::UnimplementedError(absl::StrCat("kernel_shape has ", axes,
                                                   " axes; the CUDA kernel pools over at most ",
                                                   kMaxPoolDims));
    }
    return absl::OkStatus();
  };
}

}  // namespace

void RegisterPoolKernels(KernelTable& table) {
  const std::vector<DType> max_pool_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                              DType::kInt8, DType::kUInt8};
  // The ONNX ops and castor's training forms of them (graph/ops/pool.cc).
  for (const char* domain : {"", kCastorDomain}) {
    table.Register({domain, "MaxPool", WindowedPoolSupports(InputDTypeIn(0, max_pool_dtypes)),
                    PoolKernel<true>});
    table.Register({domain, "AveragePool",
                    WindowedPoolSupports(InputDTypeIn(0, CudaFloatDTypes())), PoolKernel<false>});
    table.Register({domain, "GlobalAveragePool", InputDTypeIn(0, CudaFloatDTypes()),
                    GlobalPoolKernelFor<false>});
  }
  table.Register(
      {"", "GlobalMaxPool", InputDTypeIn(0, CudaFloatDTypes()), GlobalPoolKernelFor<true>});
  table.Register({kCastorDomain, "MaxPoolGrad",
                  WindowedPoolSupports(FloatDTypesIn(CudaFloatDTypes())), PoolGradKernel<true>});
  table.Register({kCastorDomain, "AveragePoolGrad",
                  WindowedPoolSupports(FloatDTypesIn(CudaFloatDTypes())),
                  PoolGradKernel<false>});
  table.Register({kCastorDomain, "GlobalAveragePoolGrad", FloatDTypesIn(CudaFloatDTypes()),
                  GlobalAveragePoolGrad});
}

}  // namespace castor::cuda
