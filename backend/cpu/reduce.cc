// CPU kernels: reduce family (ops of graph/ops/reduce.cc).
//
// ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSumExp: `axes` is an
// attribute before opset 13 (ReduceSum) / 18 (the others) and an optional
// int64 input from then on, with `noop_with_empty_axes` (empty axes and the
// flag set: the output is the input, as the spec says; else empty axes
// reduce everything). Reducing an empty set gives the reduction's identity
// (0 for sums, 1 for Prod, -inf/lowest for Max, +inf/max for Min, -inf for
// LogSumExp, NaN for a float Mean). Float sums accumulate in double for
// float32/float64 and in float32 for the 16-bit floats, rounding once on
// store; integers accumulate in 64 bits (wrapping); Max/Min also take bool
// (any / all). ArgMax/ArgMin (int64 indices, select_last_index, first NaN
// wins as numpy's argmax) and CumSum (exclusive, reverse) complete it.
//
// The input is viewed with its axes collapsed into alternating kept/reduced
// groups; one trailing reduced group reduces contiguous rows, a reduced
// group followed by kept ones accumulates rows elementwise, and anything
// else walks a table of reduced-element offsets.
// ReduceToShapeOf (com.castor, the gradient of a broadcast; see
// graph/ops/gradient_ops.cc) sums dY over the axes X is broadcast along.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/elementwise_math.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/strided_copy.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// Reduced elements per ParallelFor chunk.
constexpr int64_t kReduceGrain = 16384;

// ---- accumulators ----

// The type a sum of storage type T accumulates in.
template <typename T>
struct SumAccumOf {
  using type = std::conditional_t<std::is_unsigned_v<T>, uint64_t, int64_t>;
};
template <>
struct SumAccumOf<float> { using type = double; };
template <>
struct SumAccumOf<double> { using type = double; };
template <>
struct SumAccumOf<Half> { using type = float; };
template <>
struct SumAccumOf<BFloat16> { using type = float; };
template <typename T>
using SumAccum = typename SumAccumOf<T>::type;

// A float accumulator's value as the output's compute type; integers as
// themselves (numpy: float results truncate into integer outputs).
template <typename T, typename A>
ComputeType<T> ToOutput(A value) {
  using V = ComputeType<T>;
  if constexpr (std::is_floating_point_v<V> || std::is_same_v<V, bool>) {
    return static_cast<V>(value);
  } else if constexpr (std::is_floating_point_v<A>) {
    return math::SaturatingCast<V>(value);
  } else {
    return static_cast<V>(value);  // 64-bit wrap-around to the narrower type
  }
}

// Each reducer: Acc, Init(), Add(acc, x) with x the compute value,
// Finish(acc, count) -> the output's compute value.
template <typename T, typename Pre>
struct SumLike {  // sum of Pre(x): Sum, L1 (|x|), SumSquare (x*x)
  using A = SumAccum<T>;
  static A Init() { return A(0); }
  static A Add(A acc, ComputeType<T> x) { return math::AddOp()(acc, Pre()(static_cast<A>(x))); }
  static ComputeType<T> Finish(A acc, int64_t) { return ToOutput<T>(acc); }
};
struct Identity {
  template <typename A>
  A operator()(A x) const { return x; }
};
struct Square {
  template <typename A>
  A operator()(A x) const { return math::MulOp()(x, x); }
};
template <typename T>
using SumReducer = SumLike<T, Identity>;
template <typename T>
using L1Reducer = SumLike<T, math::AbsOp>;
template <typename T>
using SumSquareReducer = SumLike<T, Square>;

template <typename T>
struct MeanReducer : SumReducer<T> {
  using A = SumAccum<T>;
  static ComputeType<T> Finish(A acc, int64_t count) {
    if constexpr (std::is_floating_point_v<A>) {
      return ToOutput<T>(acc / static_cast<A>(count));  // empty: 0/0 = NaN
    } else {
      if (count == 0) return 0;
      return ToOutput<T>(static_cast<double>(acc) / static_cast<double>(count));
    }
  }
};

template <typename T>
struct L2Reducer : SumSquareReducer<T> {
  using A = SumAccum<T>;
  static ComputeType<T> Finish(A acc, int64_t) {
    return ToOutput<T>(std::sqrt(static_cast<double>(acc)));
  }
};

template <typename T>
struct ProdReducer {
  using A = SumAccum<T>;
  static A Init() { return A(1); }
  static A Add(A acc, ComputeType<T> x) { return math::MulOp()(acc, static_cast<A>(x)); }
  static ComputeType<T> Finish(A acc, int64_t) { return ToOutput<T>(acc); }
};

template <typename T, typename Combine>
struct ExtremeReducer {  // Max / Min in the value's own type
  using A = ComputeType<T>;
  static A Init() { return Combine::template Init<A>(); }
  static A Add(A acc, A x) { return Combine::Combine(acc, x); }
  static A Finish(A acc, int64_t) { return acc; }
};
template <typename T>
using MaxReducer = ExtremeReducer<T, math::MaxReduce>;
template <typename T>
using MinReducer = ExtremeReducer<T, math::MinReduce>;

// log(sum(exp(x))) in one pass: running max m and sum s of exp(x - m).
template <typename T>
struct LogSumExpReducer {
  using F = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, double,
                               float>;
  struct A {
    F max;
    F sum;
  };
  static A Init() { return {-std::numeric_limits<F>::infinity(), F(0)}; }
  static A Add(A acc, ComputeType<T> value) {
    const F x = static_cast<F>(value);
    if (x != x) {
      acc.sum = x;  // NaN poisons the result
    } else if (x == -std::numeric_limits<F>::infinity()) {
      // exp(-inf) adds nothing
    } else if (x > acc.max) {
      acc.sum = acc.sum * std::exp(acc.max - x) + F(1);
      acc.max = x;
    } else if (x == acc.max) {
      acc.sum += F(1);  // also keeps inf - inf out
    } else {
      acc.sum += std::exp(x - acc.max);
    }
    return acc;
  }
  static ComputeType<T> Finish(A acc, int64_t) {
    if (acc.sum == F(0)) return ToOutput<T>(-std::numeric_limits<F>::infinity());
    return ToOutput<T>(acc.max + std::log(acc.sum));
  }
};

// ---- the reduction walk ----

// Input axes collapsed into alternating kept/reduced groups.
struct ReduceLayout {
  std::vector<int64_t> sizes;
  std::vector<bool> reduced;
  int64_t out_count = 1;     // product of kept sizes
  int64_t reduce_count = 1;  // product of reduced sizes
};

ReduceLayout Collapse(const std::vector<int64_t>& dims, const std::vector<bool>& reduced) {
  ReduceLayout layout;
  for (size_t i = 0; i < dims.size(); ++i) {
    (reduced[i] ? layout.reduce_count : layout.out_count) *= dims[i];
    if (dims[i] == 1) continue;
    if (!layout.sizes.empty() && layout.reduced.back() == reduced[i]) {
      layout.sizes.back() *= dims[i];
    } else {
      layout.sizes.push_back(dims[i]);
      layout.reduced.push_back(reduced[i]);
    }
  }
  return layout;
}

// Reduces x (layout) into y (out_count values) with reducer R.
template <typename T, typename R>
void ReduceWith(const ReduceLayout& layout, const T* x, T* y) {
  using A = typename R::A;
  const int64_t out_count = layout.out_count;
  const int64_t count = layout.reduce_count;
  const int groups = static_cast<int>(layout.sizes.size());
  if (out_count == 0) return;
  const int64_t grain = std::max<int64_t>(1, kReduceGrain / std::max<int64_t>(count, 1));
  int reduced_groups = 0;
  for (int g = 0; g < groups; ++g) reduced_groups += layout.reduced[g] ? 1 : 0;

  if (reduced_groups == 0 || (reduced_groups == 1 && layout.reduced[groups - 1])) {
    // [kept..., R]: each output reduces `count` contiguous elements.
    ParallelFor(0, out_count, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const T* row = x + o * count;
        A acc = R::Init();
        for (int64_t r = 0; r < count; ++r) acc = R::Add(acc, Load(row[r]));
        Store(&y[o], R::Finish(acc, count));
      }
    });
    return;
  }
  if (reduced_groups == 1 && !layout.reduced[groups - 1] &&
      (groups == 2 || (groups == 3 && !layout.reduced[0]))) {
    // [outer, R, inner]: accumulate rows of `inner` elements.
    const int64_t inner = layout.sizes[groups - 1];
    const int64_t outer = out_count / inner;
    (void)outer;
    ParallelFor(0, out_count, std::max<int64_t>(1, grain), [&](int64_t lo, int64_t hi) {
      std::vector<A> acc;
      for (int64_t start = lo; start < hi;) {
        const int64_t block = start / inner;
        const int64_t k_begin = start % inner;
        const int64_t k_end = std::min(inner, k_begin + (hi - start));
        const int64_t width = k_end - k_begin;
        acc.assign(static_cast<size_t>(width), R::Init());
        const T* base = x + block * count * inner + k_begin;
        for (int64_t r = 0; r < count; ++r) {
          const T* row = base + r * inner;
          for (int64_t k = 0; k < width; ++k) acc[k] = R::Add(acc[k], Load(row[k]));
        }
        T* out = y + block * inner + k_begin;
        for (int64_t k = 0; k < width; ++k) Store(&out[k], R::Finish(acc[k], count));
        start += width;
      }
    });
    return;
  }
  // General: per-output base offsets and a table of reduced offsets.
  std::vector<int64_t> strides(groups);
  int64_t step = 1;
  for (int g = groups - 1; g >= 0; --g) {
    strides[g] = step;
    step *= layout.sizes[g];
  }
  auto offsets_of = [&](bool reduced_part, int64_t total) {
    std::vector<int64_t> offsets(static_cast<size_t>(total));
    std::vector<int> axes;
    for (int g = 0; g < groups; ++g) {
      if (layout.reduced[g] == reduced_part) axes.push_back(g);
    }
    std::vector<int64_t> index(axes.size(), 0);
    int64_t offset = 0;
    for (int64_t i = 0; i < total; ++i) {
      offsets[i] = offset;
      for (int d = static_cast<int>(axes.size()) - 1; d >= 0; --d) {
        const int g = axes[d];
        ++index[d];
        offset += strides[g];
        if (index[d] < layout.sizes[g]) break;
        offset -= index[d] * strides[g];
        index[d] = 0;
      }
    }
    return offsets;
  };
  const std::vector<int64_t> out_offsets = offsets_of(false, out_count);
  const std::vector<int64_t> red_offsets = offsets_of(true, count);
  ParallelFor(0, out_count, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      const T* base = x + out_offsets[o];
      A acc = R::Init();
      for (int64_t r = 0; r < count; ++r) acc = R::Add(acc, Load(base[red_offsets[r]]));
      Store(&y[o], R::Finish(acc, count));
    }
  });
}

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSumExp };

template <ReduceKind kKind>
absl::Status ReduceKernel(KernelContext& ctx) {
  const int64_t axes_input_since = kKind == ReduceKind::kSum ? 13 : 18;
  const TensorView& x = ctx.input(0);
  absl::StatusOr<common::ReduceAxes> choice =
      common::PlanReduceAxes(ctx, axes_input_since, HostIntInputs(ctx));
  if (!choice.ok()) return choice.status();
  if (choice->noop) {
    absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
    if (!y.ok()) return y.status();
    if ((*y)->data != x.data && x.byte_size() > 0) std::memmove((*y)->data, x.data, x.byte_size());
    return absl::OkStatus();
  }
  const bool keepdims = ctx.GetInt("keepdims", 1) != 0;
  std::vector<int64_t> out_dims;
  for (size_t i = 0; i < x.dims.size(); ++i) {
    if (!choice->reduced[i]) {
      out_dims.push_back(x.dims[i]);
    } else if (keepdims) {
      out_dims.push_back(1);
    }
  }
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  const ReduceLayout layout = Collapse(x.dims, choice->reduced);
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    if constexpr (kKind == ReduceKind::kMax) {
      ReduceWith<T, MaxReducer<T>>(layout, xp, yp);
    } else if constexpr (kKind == ReduceKind::kMin) {
      ReduceWith<T, MinReducer<T>>(layout, xp, yp);
    } else if constexpr (!std::is_same_v<T, bool>) {
      if constexpr (kKind == ReduceKind::kSum) ReduceWith<T, SumReducer<T>>(layout, xp, yp);
      if constexpr (kKind == ReduceKind::kMean) ReduceWith<T, MeanReducer<T>>(layout, xp, yp);
      if constexpr (kKind == ReduceKind::kProd) ReduceWith<T, ProdReducer<T>>(layout, xp, yp);
      if constexpr (kKind == ReduceKind::kL1) ReduceWith<T, L1Reducer<T>>(layout, xp, yp);
      if constexpr (kKind == ReduceKind::kL2) ReduceWith<T, L2Reducer<T>>(layout, xp, yp);
      if constexpr (kKind == ReduceKind::kSumSquare) {
        ReduceWith<T, SumSquareReducer<T>>(layout, xp, yp);
      }
      if constexpr (kKind == ReduceKind::kLogSumExp) {
        ReduceWith<T, LogSumExpReducer<T>>(layout, xp, yp);
      }
    }
  };
  const bool bool_ok =
      x.dtype == DType::kBool && (kKind == ReduceKind::kMax || kKind == ReduceKind::kMin);
  const bool ok = bool_ok ? DispatchNumericOrBool(x.dtype, run) : DispatchNumeric(x.dtype, run);
  if (!ok) {
    return ctx.Unimplemented(absl::StrCat("input 0 has dtype ", DTypeName(x.dtype),
                                          ", which this kernel lacks"));
  }
  return absl::OkStatus();
}

// ---- ArgMax / ArgMin ----

template <bool kMax>
absl::Status ArgReduceKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::ArgReduceGeometry g, common::PlanArgReduce(ctx, kMax));
  const bool last = g.select_last;
  const int64_t outer = g.outer, n = g.n, inner = g.inner;
  const std::vector<int64_t>& out_dims = g.out_dims;
  absl::StatusOr<TensorView*> y = ctx.Output(0, DType::kInt64, out_dims);
  if (!y.ok()) return y.status();
  int64_t* yp = (*y)->as<int64_t>();
  const bool ok = DispatchNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.as<T>();
    ParallelFor(0, outer * inner, std::max<int64_t>(1, kReduceGrain / std::max<int64_t>(n, 1)),
                [&](int64_t lo, int64_t hi) {
                  for (int64_t o = lo; o < hi; ++o) {
                    const T* base = xp + (o / inner) * n * inner + (o % inner);
                    auto best = Load(base[0]);
                    int64_t best_index = 0;
                    for (int64_t i = 1; i < n; ++i) {
                      const auto v = Load(base[i * inner]);
                      // NaN counts as the extreme (numpy: the first NaN wins).
                      bool better;
                      if (math::IsNan(best)) {
                        better = last && math::IsNan(v);
                      } else if (math::IsNan(v)) {
                        better = true;
                      } else {
                        better = kMax ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
                      }
                      if (better) {
                        best = v;
                        best_index = i;
                      }
                    }
                    yp[o] = best_index;
                  }
                });
  });
  if (!ok) {
    return ctx.Unimplemented(absl::StrCat("input 0 has dtype ", DTypeName(x.dtype),
                                          ", which this kernel lacks"));
  }
  return absl::OkStatus();
}

// ---- CumSum ----

absl::Status CumSumKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& axis_tensor = ctx.input(1);
  std::vector<int64_t> axis_values;
  if (axis_tensor.dtype == DType::kInt32 || axis_tensor.dtype == DType::kInt64) {
    for (int64_t i = 0; i < axis_tensor.num_elements(); ++i) {
      axis_values.push_back(IntAt(axis_tensor, i));
    }
  }
  CASTOR_ASSIGN_OR_RETURN(const common::CumSumGeometry g, common::PlanCumSum(ctx, axis_values));
  const bool exclusive = g.exclusive;
  const bool reverse = g.reverse;
  const int64_t outer = g.outer, n = g.n, inner = g.inner;
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
  if (!y.ok()) return y.status();
  const bool ok = DispatchNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = SumAccum<T>;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    ParallelFor(0, outer * inner, std::max<int64_t>(1, kReduceGrain / std::max<int64_t>(n, 1)),
                [&](int64_t lo, int64_t hi) {
                  for (int64_t o = lo; o < hi; ++o) {
                    const int64_t base = (o / inner) * n * inner + (o % inner);
                    A acc = 0;
                    for (int64_t s = 0; s < n; ++s) {
                      const int64_t i = base + (reverse ? n - 1 - s : s) * inner;
                      const A value = static_cast<A>(Load(xp[i]));
                      if (!exclusive) acc = math::AddOp()(acc, value);
                      Store(&yp[i], ToOutput<T>(acc));
                      if (exclusive) acc = math::AddOp()(acc, value);
                    }
                  }
                });
  });
  if (!ok) {
    return ctx.Unimplemented(absl::StrCat("input 0 has dtype ", DTypeName(x.dtype),
                                          ", which this kernel lacks"));
  }
  return absl::OkStatus();
}

// acc[k] += src[k] (k < n), each element on its own: the same bits as the
// plain loop. Written in chunks of 8 with a constant trip count because an
// -O2 build's "very cheap" vectorizer cost model (Bazel's; CMake builds the
// backend at -O3) skips loops of unknown length, while the unrolled chunk is
// still vectorized (SLP).
template <typename Acc>
inline void AddRow(Acc* __restrict acc, const float* __restrict src, int64_t n) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) acc[k + l] += src[k + l];
  }
  for (; k < n; ++k) acc[k] += src[k];
}

#if defined(CASTOR_SIMD16_X86)
// partial[k] += widened src[i * stride + k] for k < m, over rows i in
// [0, rows) in order: the blocked loop's float32 additions (widen a row,
// AddRow), fused, 64 columns per pass over the rows.
template <typename T>
CASTOR_SIMD16_TARGET void AddWidenedRows(float* partial, const T* src, int64_t stride, int64_t rows,
                                         int64_t m) {
  constexpr int64_t kStrips = 4;
  for (int64_t j0 = 0; j0 < m; j0 += 16 * kStrips) {
    __mmask16 lanes[kStrips];
    __m512 acc[kStrips];
    for (int64_t s = 0; s < kStrips; ++s) {
      lanes[s] = TailMask(std::max<int64_t>(0, m - j0 - 16 * s));
      acc[s] = _mm512_maskz_loadu_ps(lanes[s], partial + j0 + 16 * s);
    }
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = src + i * stride + j0;
      for (int64_t s = 0; s < kStrips; ++s) {
        acc[s] = _mm512_add_ps(acc[s], LoadWidened(row + 16 * s, lanes[s]));
      }
    }
    for (int64_t s = 0; s < kStrips; ++s) {
      _mm512_mask_storeu_ps(partial + j0 + 16 * s, lanes[s], acc[s]);
    }
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

// ---- ReduceToShapeOf -----------------------------------------------------------

absl::Status ReduceToShapeOfKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const std::vector<bool> summed_axes, common::PlanReduceToShapeOf(ctx));
  // Axes of dY, merged where neighbours are both kept or both summed.
  std::vector<int64_t> sizes;
  std::vector<bool> summed;
  for (size_t d = 0; d < dy.dims.size(); ++d) {
    if (dy.dims[d] == 1) continue;
    const bool sum_axis = summed_axes[d];
    if (!sizes.empty() && summed.back() == sum_axis) {
      sizes.back() *= dy.dims[d];
    } else {
      sizes.push_back(dy.dims[d]);
      summed.push_back(sum_axis);
    }
  }
  if (sizes.empty()) {  // a single element
    sizes.push_back(1);
    summed.push_back(false);
  }
  const int axes = static_cast<int>(sizes.size());
  std::vector<int64_t> strides(axes);
  int64_t step = 1;
  for (int d = axes - 1; d >= 0; --d) {
    strides[d] = step;
    step *= sizes[d];
  }
  std::vector<int> kept, reduced;
  for (int d = 0; d < axes; ++d) (summed[d] ? reduced : kept).push_back(d);
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, dy.dtype, x.dims));
  const int64_t out_count = dx->num_elements();
  if (out_count == 0) return absl::OkStatus();
  // Every output element is the float64 sum, over the combinations of the
  // outer summed axes, of float32 partial sums along the innermost summed
  // axis (in order, starting from +0). Both loops below keep exactly that
  // order per element; they differ in memory access.
  // Offset in dY of index `index` over the groups `groups` (row-major).
  auto offset_of = [&](const std::vector<int>& groups, int64_t index) {
    int64_t offset = 0;
    for (int k = static_cast<int>(groups.size()) - 1; k >= 0; --k) {
      offset += index % sizes[groups[k]] * strides[groups[k]];
      index /= sizes[groups[k]];
    }
    return offset;
  };
  std::vector<int> outer_reduced = reduced;
  if (!outer_reduced.empty()) outer_reduced.pop_back();
  int64_t outer_count = 1;
  for (int d : outer_reduced) outer_count *= sizes[d];
  const int64_t last_size = reduced.empty() ? 1 : sizes[reduced.back()];
  if (reduced.empty()) {
    // Nothing to sum: dX is dY + 0 (float32 +0.0f + v, the first step of
    // every sum below: -0 becomes +0, NaN stays NaN).
    DispatchFloat(dy.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* dyp = dy.as<T>();
      T* dxp = dx->as<T>();
      ParallelFor(0, out_count, kElementGrain, [&](int64_t lo, int64_t hi) {
        float values[kFloatConvertBlock];
        for (int64_t i = lo; i < hi; i += kFloatConvertBlock) {
          const int64_t m = std::min(kFloatConvertBlock, hi - i);
          ToFloat32(dy.dtype, dyp + i, values, m);
          float zeros[kFloatConvertBlock] = {};
          AddRow(zeros, values, m);
          FromFloat32(dy.dtype, zeros, dxp + i, m);
        }
      });
    });
    return absl::OkStatus();
  }
  if (!summed.back()) {
    // The innermost axis is kept: dY is [.., rows, inner] blocks whose rows
    // are summed. Each task owns a column block of one output row and adds
    // whole contiguous rows into float32 partials (vectorizable), then the
    // partials into float64 totals.
    const int64_t inner = sizes.back();
    std::vector<int> outer_kept(kept.begin(), kept.end() - 1);
    const int64_t outer_kept_count = out_count / inner;
    constexpr int64_t kMaxWidth = 256;
    auto task_count = [&](int64_t width) {
      return outer_kept_count * ((inner + width - 1) / width);
    };
    int64_t width = kMaxWidth;
    while (width > 16 && task_count(width) < NumThreads()) width /= 2;
    const int64_t blocks = (inner + width - 1) / width;
    const int64_t work_per_task = std::max<int64_t>(1, outer_count * last_size * width);
    const int64_t grain = std::max<int64_t>(1, kElementGrain / work_per_task);
    DispatchFloat(dy.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* dyp = dy.as<T>();
      T* dxp = dx->as<T>();
      ParallelFor(0, outer_kept_count * blocks, grain, [&](int64_t lo, int64_t hi) {
        float partial[kMaxWidth];
        float widened[kMaxWidth];
        double total[kMaxWidth];
        for (int64_t task = lo; task < hi; ++task) {
          const int64_t row = task / blocks;
          const int64_t column = task % blocks * width;
          const int64_t m = std::min(width, inner - column);
          const int64_t base = offset_of(outer_kept, row) + column;
          std::fill(total, total + m, 0.0);
          for (int64_t r = 0; r < outer_count; ++r) {
            const T* block = dyp + base + offset_of(outer_reduced, r);
            std::fill(partial, partial + m, 0.0f);
#if defined(CASTOR_SIMD16_X86)
            if constexpr (kIsFloat16Storage<T>) {
              if (UseFusedSimd16()) {
                AddWidenedRows(partial, block, inner, last_size, m);
                AddRow(total, partial, m);
                continue;
              }
            }
#endif
            for (int64_t i = 0; i < last_size; ++i) {
              const T* src = block + i * inner;
              if constexpr (std::is_same_v<T, float>) {
                AddRow(partial, src, m);
              } else {
                ToFloat32(dy.dtype, src, widened, m);
                AddRow(partial, widened, m);
              }
            }
            AddRow(total, partial, m);
          }
          T* out = dxp + row * inner + column;
          if constexpr (kIsFloat16Storage<T>) {  // round the totals to float32, then in bulk
            for (int64_t k = 0; k < m; ++k) partial[k] = static_cast<float>(total[k]);
            FromFloat32(partial, out, m);
          } else {
            for (int64_t k = 0; k < m; ++k) StoreF(&out[k], static_cast<float>(total[k]));
          }
        }
      });
    });
    return absl::OkStatus();
  }
  // The innermost axis is summed: each output element adds contiguous runs.
  DispatchFloat(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    T* dxp = dx->as<T>();
    const int64_t grain =
        std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, outer_count * last_size));
    ParallelFor(0, out_count, grain, [&](int64_t lo, int64_t hi) {
      float widened[kFloatConvertBlock];
      for (int64_t o = lo; o < hi; ++o) {
        const int64_t base = offset_of(kept, o);
        double sum = 0;
        for (int64_t r = 0; r < outer_count; ++r) {
          const T* src = dyp + base + offset_of(outer_reduced, r);
          float partial = 0;
          if constexpr (kIsFloat16Storage<T>) {
            for (int64_t i0 = 0; i0 < last_size; i0 += kFloatConvertBlock) {
              const int64_t m = std::min(kFloatConvertBlock, last_size - i0);
              ToFloat32(src + i0, widened, m);
              for (int64_t i = 0; i < m; ++i) partial += widened[i];
            }
          } else {
            for (int64_t i = 0; i < last_size; ++i) partial += LoadF(src[i]);
          }
          sum += partial;
        }
        StoreF(&dxp[o], static_cast<float>(sum));
      }
    });
  });
  return absl::OkStatus();
}
}  // namespace

void RegisterReduceKernels(KernelTable& table) {
  const std::vector<DType> numeric = {
      DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt8,
      DType::kInt16,   DType::kInt32,   DType::kInt64,    DType::kUInt8,   DType::kUInt16,
      DType::kUInt32,  DType::kUInt64};
  std::vector<DType> with_bool = numeric;
  with_bool.push_back(DType::kBool);
  auto add = [&](const char* op, KernelFn run, const std::vector<DType>& dtypes) {
    KernelDef def;
    def.op_type = op;
    def.supports = InputDTypeIn(0, dtypes);
    def.run = run;
    table.Register(std::move(def));
  };
  add("ReduceSum", &ReduceKernel<ReduceKind::kSum>, numeric);
  add("ReduceMean", &ReduceKernel<ReduceKind::kMean>, numeric);
  add("ReduceMax", &ReduceKernel<ReduceKind::kMax>, with_bool);
  add("ReduceMin", &ReduceKernel<ReduceKind::kMin>, with_bool);
  add("ReduceProd", &ReduceKernel<ReduceKind::kProd>, numeric);
  add("ReduceL1", &ReduceKernel<ReduceKind::kL1>, numeric);
  add("ReduceL2", &ReduceKernel<ReduceKind::kL2>, numeric);
  add("ReduceSumSquare", &ReduceKernel<ReduceKind::kSumSquare>, numeric);
  add("ReduceLogSumExp", &ReduceKernel<ReduceKind::kLogSumExp>, numeric);
  add("ArgMax", &ArgReduceKernel<true>, numeric);
  add("ArgMin", &ArgReduceKernel<false>, numeric);
  add("CumSum", &CumSumKernel, numeric);
  RegisterGradientKernel(table, "ReduceToShapeOf", ReduceToShapeOfKernel);
}

}  // namespace castor::cpu
