// CUDA kernels: reduce family (the CPU's backend/cpu/reduce.cc) and
// com.castor ReduceToShapeOf (backend/cpu/reduce.cc).
//
// ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSumExp take `axes` as an
// attribute before opset 13 (ReduceSum) / 18 (the others) and as an
// optional int64 input from then on (read to the host: it decides the
// output shape), with keepdims and noop_with_empty_axes as the CPU reads
// them. Reducing an empty set gives the reduction's identity (0 for sums, 1
// for Prod, -inf for Max and LogSumExp, +inf for Min, NaN for Mean).
// ArgMax/ArgMin return int64 indices (select_last_index; NaN counts as the
// extreme and the first NaN wins, as numpy's argmax). ReduceToShapeOf sums
// dY over the axes X was broadcast along, into X's shape.
//
// Float inputs accumulate in float32 (the CPU accumulates float32 sums in
// float64, so float32 results agree to float32 rounding, not bit for bit)
// and round once on store; int32/int64 inputs (Sum, Max, Min, Prod, ArgMax,
// ArgMin) accumulate in int64, wrapping, as the CPU does.
//
// CumSum scans each line along its axis in one thread (exclusive, reverse
// as the CPU), accumulating float32 in float64 and 16-bit floats in float32
// as the CPU does, so results agree to the output's rounding.
//
// The input is viewed through two strided indexers (broadcast.cuh): one over
// the kept axes (output element -> base offset) and one over the reduced
// axes (reduced index -> offset), so any axis set reduces without a
// transpose. Each output's reduction may be split into slices so a large
// reduction (1M elements into 1) still spreads over the whole device:
// - when the innermost axis is kept (columns) or rows are short, one thread
//   reduces one (output, slice) pair and neighbouring threads read
//   neighbouring outputs (coalesced);
// - otherwise one warp reduces one (output, slice) pair, its lanes reading
//   neighbouring elements of the reduced run, combined by warp shuffles.
// With more than one slice, the per-slice accumulators go to scratch and a
// second kernel (a warp per output) combines them and finishes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/elementwise_math.h"
#include "backend/common/op_geometry.h"
#include "backend/cuda/broadcast.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// ---- values ------------------------------------------------------------------------

// The value a reduction of storage type T computes in: float for the float
// types, int64 for integers (wrapping sums and products, as the CPU).
template <typename T>
using Value = std::conditional_t<std::is_integral_v<T>, int64_t, float>;

template <typename T>
__device__ __forceinline__ Value<T> LoadValue(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return ToFloat(v);
  }
}

// Stores a result: 16-bit floats round once; int64 results wrap into int32.
template <typename T, typename V>
__device__ __forceinline__ void StoreValue(T* p, V v) {
  if constexpr (std::is_integral_v<T>) {
    *p = static_cast<T>(v);
  } else {
    *p = FromFloat<T>(static_cast<float>(v));
  }
}

// ---- reducers ----------------------------------------------------------------------
// Each reducer: Acc; Init(); Add(acc, x, r) folds in element x at reduced
// index r; Combine(a, b) merges two partial accumulators (associative and
// commutative up to float rounding); Finish(acc, count) gives the output
// value. Passed to kernels by value.

struct Identity {
  template <typename V>
  __device__ V operator()(V x) const { return x; }
};
struct Absolute {
  template <typename V>
  __device__ V operator()(V x) const { return math::AbsOp()(x); }
};
struct Square {
  template <typename V>
  __device__ V operator()(V x) const { return math::MulOp()(x, x); }
};

enum class SumFinish { kNone, kMean, kSqrt };

// Sum of Pre(x): ReduceSum, ReduceL1 (|x|), ReduceSumSquare (x*x); Mean and
// L2 finish a sum with / count and sqrt.
template <typename V, typename Pre, SumFinish kFinish = SumFinish::kNone>
struct SumReducer {
  using Acc = V;
  __device__ Acc Init() const { return V(0); }
  __device__ Acc Add(Acc acc, V x, int64_t) const { return math::AddOp()(acc, Pre()(x)); }
  __device__ Acc Combine(Acc a, Acc b) const { return math::AddOp()(a, b); }
  __device__ V Finish(Acc acc, int64_t count) const {
    if constexpr (kFinish == SumFinish::kMean) {
      return acc / static_cast<V>(count);  // float only: an empty mean is 0/0 = NaN
    } else if constexpr (kFinish == SumFinish::kSqrt) {
      return sqrtf(acc);  // float only
    } else {
      return acc;
    }
  }
};

template <typename V>
struct ProdReducer {
  using Acc = V;
  __device__ Acc Init() const { return V(1); }
  __device__ Acc Add(Acc acc, V x, int64_t) const { return math::MulOp()(acc, x); }
  __device__ Acc Combine(Acc a, Acc b) const { return math::MulOp()(a, b); }
  __device__ V Finish(Acc acc, int64_t) const { return acc; }
};

// Max / Min (NaN-propagating for floats).
template <typename V, typename Extreme>
struct ExtremeReducer {
  using Acc = V;
  __device__ Acc Init() const { return Extreme::template Init<V>(); }
  __device__ Acc Add(Acc acc, V x, int64_t) const { return Extreme::Combine(acc, x); }
  __device__ Acc Combine(Acc a, Acc b) const { return Extreme::Combine(a, b); }
  __device__ V Finish(Acc acc, int64_t) const { return acc; }
};

// log(sum(exp(x))) as a running maximum m and the sum s of exp(x - m); two
// partials rescale to the larger maximum. Equal maxima add without exp (so
// inf - inf never happens), a NaN element poisons the sum, and an empty or
// all -inf set finishes as -inf.
struct LogSumExpAcc {
  float max;
  float sum;
};

struct LogSumExpReducer {
  using Acc = LogSumExpAcc;
  __device__ Acc Init() const { return {-INFINITY, 0.0f}; }
  __device__ Acc Add(Acc acc, float x, int64_t) const {
    if (x != x) {
      acc.sum = x;
    } else if (x == -INFINITY) {
      // exp(-inf) adds nothing
    } else if (x > acc.max) {
      acc.sum = acc.sum * expf(acc.max - x) + 1.0f;
      acc.max = x;
    } else if (x == acc.max) {
      acc.sum += 1.0f;
    } else {
      acc.sum += expf(x - acc.max);
    }
    return acc;
  }
  __device__ Acc Combine(Acc a, Acc b) const {
    const float m = fmaxf(a.max, b.max);  // neither max is ever NaN
    const float sa = a.max == m ? a.sum : a.sum * expf(a.max - m);
    const float sb = b.max == m ? b.sum : b.sum * expf(b.max - m);
    return {m, sa + sb};
  }
  __device__ float Finish(Acc acc, int64_t) const {
    if (acc.sum == 0.0f) return -INFINITY;
    return acc.max + logf(acc.sum);
  }
};

// ArgMax / ArgMin over one axis: the candidate (value, index) that wins is
// a NaN before any number (the first NaN, or the last with
// select_last_index), else the larger (smaller) value, ties going to the
// smaller index (the larger with select_last_index). The rule only looks at
// values and indices, so partials combine in any order to the CPU's scan.
template <typename V>
struct ArgAcc {
  V value;
  int64_t index;  // -1: no element yet
};

template <typename V, bool kMax>
struct ArgReducer {
  using Acc = ArgAcc<V>;
  bool select_last = false;

  __device__ Acc Init() const { return {V(0), -1}; }
  __device__ Acc Add(Acc acc, V x, int64_t r) const { return Combine(acc, Acc{x, r}); }
  __device__ Acc Combine(Acc a, Acc b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool a_nan = math::IsNan(a.value), b_nan = math::IsNan(b.value);
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) {
      return (kMax ? a.value > b.value : a.value < b.value) ? a : b;
    }
    return (select_last ? a.index > b.index : a.index < b.index) ? a : b;
  }
  __device__ int64_t Finish(Acc acc, int64_t) const { return acc.index; }
};

// ---- warp shuffles ------------------------------------------------------------------

// __shfl_down_sync of any trivially copyable accumulator, word by word.
template <typename A>
__device__ __forceinline__ A ShuffleDown(const A& value, int delta) {
  static_assert(sizeof(A) % sizeof(int) == 0, "accumulators are whole 32-bit words");
  constexpr int kWords = static_cast<int>(sizeof(A) / sizeof(int));
  int words[kWords];
  memcpy(words, &value, sizeof(A));
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = __shfl_down_sync(kFullMask, words[w], delta);
  A result;
  memcpy(&result, words, sizeof(A));
  return result;
}

// The combination of the 32 lanes' accumulators, valid in lane 0. Every
// lane of the warp must call it.
template <typename R>
__device__ __forceinline__ typename R::Acc WarpCombine(const R& reducer, typename R::Acc acc) {
#pragma unroll
  for (int delta = kWarpSize / 2; delta > 0; delta /= 2) {
    acc = reducer.Combine(acc, ShuffleDown(acc, delta));
  }
  return acc;
}

// ---- kernels -----------------------------------------------------------------------

// Where the elements of one output live: kept.Offset(o) is output o's base
// offset in x, reduced.Offset(r) the offset of its reduced element r.
struct ReduceGeometry {
  StridedIndexer kept;
  StridedIndexer reduced;
};

// The slicing of a reduction: `count` elements per output in `slices`
// slices of `chunk` elements (the last may be shorter). Pair p = s *
// out_count + o is slice s of output o.
struct ReducePlan {
  int64_t out_count = 0;
  int64_t count = 0;
  int64_t slices = 1;
  int64_t chunk = 0;
};

// The accumulator of pair p over its slice, one element at a time, starting
// at element `first` of the slice and stepping by `step`.
template <typename TIn, typename R>
__device__ __forceinline__ typename R::Acc AccumulateSlice(const TIn* x,
                                                           const ReduceGeometry& geometry,
                                                           const ReducePlan& plan,
                                                           const R& reducer, int64_t p,
                                                           int64_t first, int64_t step) {
  const int64_t o = p % plan.out_count;
  const int64_t s = p / plan.out_count;
  const int64_t begin = s * plan.chunk;
  const int64_t end = min(plan.count, begin + plan.chunk);
  const TIn* base = x + geometry.kept.Offset(o);
  typename R::Acc acc = reducer.Init();
  for (int64_t r = begin + first; r < end; r += step) {
    acc = reducer.Add(acc, LoadValue(base[geometry.reduced.Offset(r)]), r);
  }
  return acc;
}

// One thread per (output, slice) pair. With one slice, writes y[o];
// otherwise partial[p].
template <typename TIn, typename TOut, typename R>
__global__ void ReduceThreadKernel(const TIn* x, ReduceGeometry geometry, ReducePlan plan,
                                   R reducer, typename R::Acc* partial, TOut* y) {
  const int64_t pairs = plan.out_count * plan.slices;
  CASTOR_GRID_STRIDE(p, pairs) {
    const typename R::Acc acc = AccumulateSlice(x, geometry, plan, reducer, p, 0, 1);
    if (partial != nullptr) {
      partial[p] = acc;
    } else {
      StoreValue(&y[p], reducer.Finish(acc, plan.count));
    }
  }
}

// One warp per (output, slice) pair: lanes take every 32nd element of the
// slice, then combine by shuffles. blockDim.x must be a multiple of 32;
// the pair loop is uniform across a warp, so every lane reaches the
// shuffles.
template <typename TIn, typename TOut, typename R>
__global__ void ReduceWarpKernel(const TIn* x, ReduceGeometry geometry, ReducePlan plan,
                                 R reducer, typename R::Acc* partial, TOut* y) {
  const int64_t pairs = plan.out_count * plan.slices;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t warp =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t p = warp; p < pairs; p += warps) {
    typename R::Acc acc = AccumulateSlice(x, geometry, plan, reducer, p, lane, kWarpSize);
    acc = WarpCombine(reducer, acc);
    if (lane == 0) {
      if (partial != nullptr) {
        partial[p] = acc;
      } else {
        StoreValue(&y[p], reducer.Finish(acc, plan.count));
      }
    }
  }
}

// One warp per output: combines the output's slice accumulators and
// stores the finished value.
template <typename TOut, typename R>
__global__ void ReduceFinishKernel(const typename R::Acc* partial, ReducePlan plan, R reducer,
                                   TOut* y) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t warp =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t o = warp; o < plan.out_count; o += warps) {
    typename R::Acc acc = reducer.Init();
    for (int64_t s = lane; s < plan.slices; s += kWarpSize) {
      acc = reducer.Combine(acc, partial[s * plan.out_count + o]);
    }
    acc = WarpCombine(reducer, acc);
    if (lane == 0) StoreValue(&y[o], reducer.Finish(acc, plan.count));
  }
}

// ---- host side ---------------------------------------------------------------------

// Reductions shorter than this run a thread per output even when the
// innermost axis is reduced.
constexpr int64_t kWarpMinCount = 64;
// Elements a slice holds at least, per thread and per warp.
constexpr int64_t kThreadMinChunk = 32;
constexpr int64_t kWarpMinChunk = 8 * kWarpSize;
// The most slices per output (the finishing warp loops over them).
constexpr int64_t kThreadMaxSlices = 1024;
constexpr int64_t kWarpMaxSlices = 4096;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The geometry of x (dims) with `reduced` axes: kept and reduced axes, each
// in row-major order, merged where they walk memory as one.
absl::StatusOr<ReduceGeometry> MakeReduceGeometry(const KernelContext& ctx,
                                                  const std::vector<int64_t>& dims,
                                                  const std::vector<bool>& reduced) {
  const std::vector<int64_t> strides = DenseStrides(dims);
  std::vector<int64_t> kept_dims, kept_strides, reduced_dims, reduced_strides;
  for (size_t d = 0; d < dims.size(); ++d) {
    (reduced[d] ? reduced_dims : kept_dims).push_back(dims[d]);
    (reduced[d] ? reduced_strides : kept_strides).push_back(strides[d]);
  }
  ReduceGeometry geometry;
  absl::StatusOr<StridedIndexer> kept = MakeStridedIndexer(kept_dims, kept_strides);
  if (!kept.ok()) return NodeStatus(ctx, kept.status());
  absl::StatusOr<StridedIndexer> reduce = MakeStridedIndexer(reduced_dims, reduced_strides);
  if (!reduce.ok()) return NodeStatus(ctx, reduce.status());
  geometry.kept = *kept;
  geometry.reduced = *reduce;
  return geometry;
}

// Reduces x (its `dims`, `reduced` axes) into y (the kept axes' elements in
// row-major order) with `reducer`, on ctx's stream.
template <typename TIn, typename TOut, typename R>
absl::Status RunReduce(KernelContext& ctx, const TIn* x, const std::vector<int64_t>& dims,
                       const std::vector<bool>& reduced, const R& reducer, TOut* y) {
  using Acc = typename R::Acc;
  CASTOR_ASSIGN_OR_RETURN(ReduceGeometry geometry, MakeReduceGeometry(ctx, dims, reduced));
  ReducePlan plan;
  plan.out_count = 1;
  plan.count = 1;
  for (size_t d = 0; d < dims.size(); ++d) (reduced[d] ? plan.count : plan.out_count) *= dims[d];
  if (plan.out_count == 0) return absl::OkStatus();

  // Thread per pair when columns are kept innermost (neighbouring outputs
  // are neighbours in memory) or rows are short; else a warp per pair.
  const bool inner_kept =
      geometry.kept.rank > 0 && geometry.kept.strides[geometry.kept.rank - 1] == 1;
  const bool per_thread = inner_kept || plan.count < kWarpMinCount;
  const int64_t processors = std::max(1, Cuda(ctx).device().multiprocessors);
  // Enough pairs to fill the device: 2048 threads or 64 warps per SM.
  const int64_t target_pairs = per_thread ? processors * 2048 : processors * 64;
  const int64_t min_chunk = per_thread ? kThreadMinChunk : kWarpMinChunk;
  const int64_t max_slices = per_thread ? kThreadMaxSlices : kWarpMaxSlices;
  int64_t slices = 1;
  if (plan.out_count < target_pairs / 2 && plan.count > min_chunk) {
    slices = std::min({target_pairs / plan.out_count, CeilDiv(plan.count, min_chunk), max_slices});
    slices = std::max<int64_t>(slices, 1);
  }
  plan.chunk = std::max<int64_t>(1, CeilDiv(plan.count, slices));
  plan.slices = plan.count > 0 ? CeilDiv(plan.count, plan.chunk) : 1;  // no empty slices

  Acc* partial = nullptr;
  if (plan.slices > 1) {
    CASTOR_ASSIGN_OR_RETURN(
        void* scratch,
        ctx.Scratch(static_cast<size_t>(plan.out_count * plan.slices) * sizeof(Acc)));
    partial = static_cast<Acc*>(scratch);
  }
  const int64_t pairs = plan.out_count * plan.slices;
  const cudaStream_t stream = Stream(ctx);
  if (per_thread) {
    ReduceThreadKernel<TIn, TOut, R>
        <<<Blocks(pairs), kThreads, 0, stream>>>(x, geometry, plan, reducer, partial, y);
  } else {
    ReduceWarpKernel<TIn, TOut, R><<<Blocks(pairs * kWarpSize), kThreads, 0, stream>>>(
        x, geometry, plan, reducer, partial, y);
  }
  CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
  if (partial == nullptr) return absl::OkStatus();
  ReduceFinishKernel<TOut, R>
      <<<Blocks(plan.out_count * kWarpSize), kThreads, 0, stream>>>(partial, plan, reducer, y);
  return CheckLaunch(ctx);
}

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSumExp };

// The reducer of kKind for values V (int64 only for Sum, Max, Min, Prod:
// the kinds registered for integers).
template <ReduceKind kKind, typename V>
auto MakeReducer() {
  if constexpr (kKind == ReduceKind::kSum) {
    return SumReducer<V, Identity>{};
  } else if constexpr (kKind == ReduceKind::kMean) {
    return SumReducer<V, Identity, SumFinish::kMean>{};
  } else if constexpr (kKind == ReduceKind::kMax) {
    return ExtremeReducer<V, math::MaxReduce>{};
  } else if constexpr (kKind == ReduceKind::kMin) {
    return ExtremeReducer<V, math::MinReduce>{};
  } else if constexpr (kKind == ReduceKind::kProd) {
    return ProdReducer<V>{};
  } else if constexpr (kKind == ReduceKind::kL1) {
    return SumReducer<V, Absolute>{};
  } else if constexpr (kKind == ReduceKind::kL2) {
    return SumReducer<V, Square, SumFinish::kSqrt>{};
  } else if constexpr (kKind == ReduceKind::kSumSquare) {
    return SumReducer<V, Square>{};
  } else {
    return LogSumExpReducer{};
  }
}

template <ReduceKind kKind>
inline constexpr bool kTakesIntegers = kKind == ReduceKind::kSum || kKind == ReduceKind::kMax ||
                                       kKind == ReduceKind::kMin || kKind == ReduceKind::kProd;

// Calls f(TypeTag<T>{}) for a float dtype, or int32/int64 when kIntegers.
template <bool kIntegers, typename F>
absl::Status DispatchReduceType(const KernelContext& ctx, DType dtype, F&& f) {
  if constexpr (kIntegers) {
    if (dtype == DType::kInt32) return f(TypeTag<int32_t>{});
    if (dtype == DType::kInt64) return f(TypeTag<int64_t>{});
  }
  return DispatchFloat(ctx, dtype, f);
}

template <ReduceKind kKind>
absl::Status ReduceKernel(KernelContext& ctx) {
  const int64_t axes_input_since = kKind == ReduceKind::kSum ? 13 : 18;
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(
      const common::ReduceAxes choice,
      common::PlanReduceAxes(ctx, axes_input_since, [&ctx](int i) { return ReadInt64s(ctx, i); }));
  if (choice.noop) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
    if (y->data != x.data && x.byte_size() > 0) {
      CASTOR_CUDA_CALL(cudaMemcpyAsync(y->data, x.data, x.byte_size(), cudaMemcpyDeviceToDevice,
                                       Stream(ctx)));
    }
    return absl::OkStatus();
  }
  const bool keepdims = ctx.GetInt("keepdims", 1) != 0;
  std::vector<int64_t> out_dims;
  for (size_t i = 0; i < x.dims.size(); ++i) {
    if (!choice.reduced[i]) {
      out_dims.push_back(x.dims[i]);
    } else if (keepdims) {
      out_dims.push_back(1);
    }
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, out_dims));
  return DispatchReduceType<kTakesIntegers<kKind>>(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunReduce(ctx, x.as<const T>(), x.dims, choice.reduced, MakeReducer<kKind, Value<T>>(),
                     y->as<T>());
  });
}

// ArgMax / ArgMin over the `axis` attribute (int64 out).
template <bool kMax>
absl::Status ArgReduceKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::ArgReduceGeometry g, common::PlanArgReduce(ctx, kMax));
  const bool last = g.select_last;
  const std::vector<int64_t>& out_dims = g.out_dims;
  std::vector<bool> reduced(x.dims.size(), false);
  if (!x.dims.empty()) reduced[g.axis] = true;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, DType::kInt64, out_dims));
  return DispatchReduceType<true>(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunReduce(ctx, x.as<const T>(), x.dims, reduced, ArgReducer<Value<T>, kMax>{last},
                     y->as<int64_t>());
  });
}

// ReduceToShapeOf(dY, X): dY summed over the axes X (right-aligned) is 1
// along, in X's shape and dY's dtype; float32 accumulation, one rounding.
absl::Status ReduceToShapeOfKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const std::vector<bool> reduced, common::PlanReduceToShapeOf(ctx));
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, dy.dtype, x.dims));
  return DispatchFloat(ctx, dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunReduce(ctx, dy.as<const T>(), dy.dims, reduced, SumReducer<float, Identity>{},
                     dx->as<T>());
  });
}

// ---- CumSum ----------------------------------------------------------------------------

// The type a CumSum of storage type T accumulates in (the CPU's SumAccum).
template <typename T>
using ScanAccum = std::conditional_t<std::is_same_v<T, float>, double, Value<T>>;

// One thread per line of `n` values `inner` apart.
template <typename T>
__global__ void CumSumKernel(const T* x, T* y, int64_t lines, int64_t n, int64_t inner,
                             bool exclusive, bool reverse) {
  CASTOR_GRID_STRIDE(line, lines) {
    const int64_t base = line / inner * n * inner + line % inner;
    ScanAccum<T> acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t i = base + (reverse ? n - 1 - s : s) * inner;
      const ScanAccum<T> value = static_cast<ScanAccum<T>>(LoadValue(x[i]));
      if (!exclusive) acc += value;
      StoreValue(y + i, acc);
      if (exclusive) acc += value;
    }
  }
}

absl::Status RunCumSum(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> axis, ReadInt64s(ctx, 1));
  CASTOR_ASSIGN_OR_RETURN(const common::CumSumGeometry g, common::PlanCumSum(ctx, axis));
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  const int64_t lines = g.outer * g.inner;
  if (lines == 0 || g.n == 0) return absl::OkStatus();
  return DispatchReduceType<true>(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    CumSumKernel<T><<<Blocks(lines), kThreads, 0, Stream(ctx)>>>(
        x.as<T>(), y->as<T>(), lines, g.n, g.inner, g.exclusive, g.reverse);
    return CheckLaunch(ctx);
  });
}

}  // namespace

void RegisterReduceKernels(KernelTable& table) {
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const std::vector<DType> with_ints = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                        DType::kInt32, DType::kInt64};
  auto add = [&](const char* op, KernelFn run, SupportsFn supports,
                 const std::string& domain = "") {
    KernelDef def;
    def.domain = domain;
    def.op_type = op;
    def.supports = std::move(supports);
    def.run = run;
    table.Register(std::move(def));
  };
  add("ReduceSum", &ReduceKernel<ReduceKind::kSum>, InputDTypeIn(0, with_ints));
  add("ReduceMean", &ReduceKernel<ReduceKind::kMean>, InputDTypeIn(0, floats));
  add("ReduceMax", &ReduceKernel<ReduceKind::kMax>, InputDTypeIn(0, with_ints));
  add("ReduceMin", &ReduceKernel<ReduceKind::kMin>, InputDTypeIn(0, with_ints));
  add("ReduceProd", &ReduceKernel<ReduceKind::kProd>, InputDTypeIn(0, with_ints));
  add("ReduceL1", &ReduceKernel<ReduceKind::kL1>, InputDTypeIn(0, floats));
  add("ReduceL2", &ReduceKernel<ReduceKind::kL2>, InputDTypeIn(0, floats));
  add("ReduceSumSquare", &ReduceKernel<ReduceKind::kSumSquare>, InputDTypeIn(0, floats));
  add("ReduceLogSumExp", &ReduceKernel<ReduceKind::kLogSumExp>, InputDTypeIn(0, floats));
  add("ArgMax", &ArgReduceKernel<true>, InputDTypeIn(0, with_ints));
  add("ArgMin", &ArgReduceKernel<false>, InputDTypeIn(0, with_ints));
  add("CumSum", &RunCumSum, InputDTypeIn(0, with_ints));
  add("ReduceToShapeOf", &ReduceToShapeOfKernel, FloatDTypesIn(floats), kCastorDomain);
}

}  // namespace castor::cuda
