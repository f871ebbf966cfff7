// CPU kernels: pool family (ops of graph/ops/pool.cc): MaxPool (with the
// optional int64 Indices output, storage_order 0/1, int8/uint8 too),
// AveragePool (count_include_pad, ceil_mode, dilations, auto_pad),
// GlobalAveragePool and GlobalMaxPool, over N-d inputs [N, C, D1, ...].
// Windows follow the ONNX output-size rules (im2col.h ForwardWindowGeometry);
// positions in the padding are skipped (max) or, for the average, excluded
// from the divisor unless count_include_pad, which counts the window
// positions inside the padded input (not the overhang of ceil_mode).
// Arithmetic is in float32 (float64 for float64), rounded once on store;
// GlobalAveragePool sums a plane in 16 float32 lanes (PlaneSum).
// 2-D MaxPool without the Indices output (the common inference case) takes
// a direct separable path (MaxPool2D); everything else walks the windows
// with the generic N-d visitor ForEachWindow.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/simd16.h"
#include "backend/cpu/vector_clones.h"
#include "graph/gradient_builder.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kPoolFloatDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                             DType::kFloat64};
const std::vector<DType> kMaxPoolDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                           DType::kFloat64, DType::kInt8,    DType::kUInt8};

// The arithmetic type of storage type T.
template <typename T>
using ValueOf = std::conditional_t<std::is_same_v<T, double>, double,
                                   std::conditional_t<std::is_integral_v<T>, int, float>>;

template <typename T>
ValueOf<T> Load(T v) {
  if constexpr (std::is_same_v<T, double> || std::is_integral_v<T>) {
    return v;
  } else {
    return LoadF(v);
  }
}

template <typename T, typename V>
void Store(T* p, V v) {
  if constexpr (std::is_same_v<T, double> || std::is_integral_v<T>) {
    *p = static_cast<T>(v);
  } else {
    StoreF(p, static_cast<float>(v));
  }
}

// Float dtypes plus int8/uint8.
template <typename Fn>
bool DispatchPool(DType dtype, Fn&& fn) {
  if (DispatchFloat(dtype, fn)) return true;
  if (dtype == DType::kInt8) {
    fn(TypeTag<int8_t>{});
    return true;
  }
  if (dtype == DType::kUInt8) {
    fn(TypeTag<uint8_t>{});
    return true;
  }
  return false;
}

// Calls fn(output_flat, o, visit) for every output position q (row-major;
// o its per-axis index) of one plane, where visit(cb) calls
// cb(row_major_offset, column_major_offset) for each input position of the
// window that lies inside the input, in row-major window order. The output
// index advances as an odometer (no division per position).
template <typename Fn>
void ForEachWindow(const common::WindowGeometry& g, const std::vector<AxisWindows>& axes, Fn&& fn) {
  const int nd = g.num_spatial;
  std::vector<int64_t> row_stride(nd), col_stride(nd);
  int64_t rs = 1, cs = 1;
  for (int d = nd - 1; d >= 0; --d) {
    row_stride[d] = rs;
    rs *= g.input[d];
  }
  for (int d = 0; d < nd; ++d) {
    col_stride[d] = cs;
    cs *= g.input[d];
  }
  std::vector<int64_t> o(nd, 0), lo(nd), hi(nd), cur(nd);
  const int64_t out_size = g.output_size();
  for (int64_t q = 0; q < out_size; ++q) {
    bool empty = false;
    for (int d = 0; d < nd; ++d) {
      lo[d] = axes[d].begin[o[d]];
      hi[d] = axes[d].begin[o[d] + 1];
      empty |= lo[d] == hi[d];
    }
    auto visit = [&](auto&& cb) {
      if (empty) return;
      for (int d = 0; d < nd; ++d) cur[d] = lo[d];
      for (;;) {
        int64_t row = 0, col = 0;
        for (int d = 0; d < nd; ++d) {
          const int64_t i = axes[d].idx[cur[d]];
          row += i * row_stride[d];
          col += i * col_stride[d];
        }
        cb(row, col);
        int d = nd - 1;
        while (d >= 0 && ++cur[d] == hi[d]) {
          cur[d] = lo[d];
          --d;
        }
        if (d < 0) break;
      }
    };
    fn(q, o, visit);
    for (int d = nd - 1; d >= 0 && ++o[d] == g.output[d]; --d) o[d] = 0;
  }
}

// NaN-propagating max (b when b > a or b is NaN, else a; once a NaN is in,
// it stays) and the plain max for data known to hold no NaN, which compiles
// to one branch-free max instruction.
template <typename V>
inline V NanMax(V a, V b) {
  if constexpr (std::is_floating_point_v<V>) {
    return (b > a) | (b != b) ? b : a;
  } else {
    return b > a ? b : a;
  }
}
template <typename V>
inline V PlainMax(V a, V b) {
  return b > a ? b : a;
}

// The max over one window along the last axis of `line` (count positions
// from `first`, `step` apart); the lowest value for an empty window.
template <typename V, bool kNanSafe>
inline V WindowMax(const V* line, int64_t first, int64_t count, int64_t step) {
  if (count == 0) return std::numeric_limits<V>::lowest();
  const V* c = line + first;
  V best = c[0];
  for (int64_t k = 1; k < count; ++k) {
    best = kNanSafe ? NanMax(best, c[k * step]) : PlainMax(best, c[k * step]);
  }
  return best;
}

#if defined(CASTOR_SIMD16_X86)
// NanMax on 16 lanes: b where b > a or b is NaN, else a.
CASTOR_SIMD16_TARGET inline __m512 NanMax16(__m512 a, __m512 b) {
  const __mmask16 take_b =
      _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(take_b, a, b);
}

// One output row of 2x2 windows at stride 2 (columns from 0, every window
// whole), 16 windows at a time: y[ow] = NanMax(NanMax(r0[2ow], r1[2ow]),
// NanMax(r0[2ow + 1], r1[2ow + 1])), the separable path's comparisons in
// its order (a NaN propagates, with its payload, as there).
CASTOR_SIMD16_TARGET void MaxPoolRow2x2Avx512(const float* r0, const float* r1, float* y,
                                              int64_t count) {
  for (int64_t w = 0; w < count; w += 16) {
    const int64_t windows = std::min<int64_t>(16, count - w);
    const __mmask16 first = TailMask(2 * windows);
    const __mmask16 second = TailMask(2 * windows - 16);
    const __m512 column_lo = NanMax16(_mm512_maskz_loadu_ps(first, r0 + 2 * w),
                                     _mm512_maskz_loadu_ps(first, r1 + 2 * w));
    const __m512 column_hi = NanMax16(_mm512_maskz_loadu_ps(second, r0 + 2 * w + 16),
                                     _mm512_maskz_loadu_ps(second, r1 + 2 * w + 16));
    _mm512_mask_storeu_ps(y + w, TailMask(windows),
                          NanMax16(EvenElements(column_lo, column_hi),
                                   OddElements(column_lo, column_hi)));
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

// Y = MaxPool(X) for X [N, C, H, W] without the Indices output: any
// attributes (pads, strides, dilations, ceil_mode, auto_pad). The window
// max is separable: per output row, a vertical max over the window's input
// rows for every column (a vectorizable elementwise loop), then per output
// column a max over the window's columns of that row; windows wholly inside
// the row are indexed directly, the clipped ones at the edges through the
// window tables. Empty windows give the lowest value and a NaN anywhere in a
// window gives NaN, as the generic path does. Planes run in parallel.
template <typename T>
void MaxPool2D(const common::WindowGeometry& g, const std::vector<AxisWindows>& axes,
               int64_t planes, const T* xp, T* yp) {
  using V = ValueOf<T>;
  const int64_t in_h = g.input[0], in_w = g.input[1];
  const int64_t out_h = g.output[0], out_w = g.output[1];
  const int64_t step_h = g.dilations[0], step_w = g.dilations[1];
  const int64_t stride_w = g.strides[1], pad_w = g.pad_begin[1], kernel_w = g.kernel[1];
  const AxisWindows& rows = axes[0];
  const AxisWindows& cols = axes[1];
  // Output columns [full_lo, full_hi) have their whole window inside the row.
  int64_t full_lo = 0;
  while (full_lo < out_w && cols.begin[full_lo + 1] - cols.begin[full_lo] != kernel_w) ++full_lo;
  int64_t full_hi = full_lo;
  while (full_hi < out_w && cols.begin[full_hi + 1] - cols.begin[full_hi] == kernel_w) ++full_hi;
  // Windows of two adjacent columns at stride 2 from column 0 (2x2 pools).
  const bool pairs = kernel_w == 2 && stride_w == 2 && step_w == 1 && pad_w == 0;
  // ... with every window whole (no ceil_mode overhang): MaxPoolRow2x2Avx512.
  [[maybe_unused]] const bool whole_pairs =
      pairs && full_lo == 0 && full_hi == out_w && UseFusedSimd16();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, in_h * in_w));
  ParallelFor(0, planes, grain, [&](int64_t lo, int64_t hi) {
    std::vector<V> column_max(static_cast<size_t>(in_w));
    V* cm = column_max.data();
    // The window max of output column ow of the current row.
    auto edge_max = [&](int64_t ow, auto nan_safe) {
      const int64_t first = cols.begin[ow];
      const int64_t count = cols.begin[ow + 1] - first;
      return WindowMax<V, decltype(nan_safe)::value>(cm, count > 0 ? cols.idx[first] : 0, count,
                                                     step_w);
    };
    // 16-bit planes are computed in float32 and narrowed with the bulk
    // conversion once per plane (exact: each value is one of the widened
    // inputs; a call per row cost more than the rows' work).
    std::vector<V> narrow_plane(kIsFloat16Storage<T> ? out_h * out_w : 0);
    // Output row oh of the plane: in Y, or in the float32 plane.
    auto output_row = [&](T* ys, int64_t oh) {
      if constexpr (kIsFloat16Storage<T>) {
        return narrow_plane.data() + oh * out_w;
      } else {
        return ys + oh * out_w;
      }
    };
    auto row_pass = [&](T* ys, int64_t oh, auto nan_safe) {
      auto* yrow = output_row(ys, oh);
      for (int64_t ow = 0; ow < full_lo; ++ow) Store(&yrow[ow], edge_max(ow, nan_safe));
      if (pairs) {  // each window is cm[2 ow], cm[2 ow + 1]: one branch-free loop
        for (int64_t ow = full_lo; ow < full_hi; ++ow) {
          Store(&yrow[ow], NanMax(cm[2 * ow], cm[2 * ow + 1]));
        }
      } else {
        for (int64_t ow = full_lo; ow < full_hi; ++ow) {
          Store(&yrow[ow], WindowMax<V, decltype(nan_safe)::value>(cm, ow * stride_w - pad_w,
                                                                   kernel_w, step_w));
        }
      }
      for (int64_t ow = full_hi; ow < out_w; ++ow) Store(&yrow[ow], edge_max(ow, nan_safe));
    };
    // 16-bit planes are widened to float32 once (bulk conversion, exact).
    std::vector<float> widened_plane(kIsFloat16Storage<T> ? in_h * in_w : 0);
    for (int64_t plane = lo; plane < hi; ++plane) {
      const auto* xs = [&] {
        if constexpr (kIsFloat16Storage<T>) {
          ToFloat32(xp + plane * in_h * in_w, widened_plane.data(), in_h * in_w);
          return static_cast<const float*>(widened_plane.data());
        } else {
          return xp + plane * in_h * in_w;
        }
      }();
      T* ys = yp + plane * out_h * out_w;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const int64_t row_count = rows.begin[oh + 1] - rows.begin[oh];
#if defined(CASTOR_SIMD16_X86)
        if constexpr (std::is_same_v<V, float>) {
          if (whole_pairs && row_count == 2) {
            const float* first = xs + rows.idx[rows.begin[oh]] * in_w;
            MaxPoolRow2x2Avx512(first, first + step_h * in_w, output_row(ys, oh), out_w);
            continue;
          }
        }
#endif
        bool has_nan = false;
        if (row_count == 0) {
          std::fill(cm, cm + in_w, std::numeric_limits<V>::lowest());
        } else {
          const auto* first = xs + rows.idx[rows.begin[oh]] * in_w;
          for (int64_t w = 0; w < in_w; ++w) cm[w] = Load(first[w]);
          for (int64_t r = 1; r < row_count; ++r) {
            const auto* row = first + r * step_h * in_w;
            for (int64_t w = 0; w < in_w; ++w) cm[w] = NanMax(cm[w], Load(row[w]));
          }
          if constexpr (std::is_floating_point_v<V>) {
            int nan_count = 0;
            for (int64_t w = 0; w < in_w; ++w) nan_count += cm[w] != cm[w];
            has_nan = nan_count != 0;
          }
        }
        if (has_nan) {
          row_pass(ys, oh, std::true_type{});
        } else {
          row_pass(ys, oh, std::false_type{});
        }
      }
      if constexpr (kIsFloat16Storage<T>) FromFloat32(narrow_plane.data(), ys, out_h * out_w);
    }
  });
}

absl::Status CheckPoolInput(const KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat("input X must have rank >= 3 ([N, C, D1, ...]); it is ",
                                  common::DimsToString(x.dims)));
  }
  return absl::OkStatus();
}

// What MaxPool and AveragePool share: X's checks, the window geometry
// (kernel_shape required), Y [N, C, output...] in X's dtype, and the
// per-axis window tables.
struct WindowedPool {
  common::WindowGeometry g;
  std::vector<int64_t> out_dims;
  TensorView* y = nullptr;
  int64_t planes = 0;    // N * C
  int64_t in_size = 0;   // elements of one input plane
  int64_t out_size = 0;  // elements of one output plane
  std::vector<AxisWindows> axes;
};

absl::StatusOr<WindowedPool> SetUpWindowedPool(KernelContext& ctx) {
  if (absl::Status s = CheckPoolInput(ctx); !s.ok()) return s;
  if (!ctx.node().has_attribute("kernel_shape")) {
    return ctx.Error("attribute 'kernel_shape' is required");
  }
  const TensorView& x = ctx.input(0);
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const int64_t ceil_mode = ctx.GetInt("ceil_mode", 0);
  absl::StatusOr<common::WindowGeometry> g =
      common::ForwardWindowGeometry(ctx, spatial, ctx.GetInts("kernel_shape"), ceil_mode != 0);
  if (!g.ok()) return g.status();
  WindowedPool pool;
  pool.g = *std::move(g);
  pool.out_dims = {x.dims[0], x.dims[1]};
  pool.out_dims.insert(pool.out_dims.end(), pool.g.output.begin(), pool.g.output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, pool.out_dims);
  if (!y.ok()) return y.status();
  pool.y = *y;
  pool.planes = x.dims[0] * x.dims[1];
  pool.in_size = pool.g.input_size();
  pool.out_size = pool.g.output_size();
  pool.axes = BuildAxisWindows(pool.g);
  return pool;
}

absl::Status MaxPoolKernel(KernelContext& ctx) {
  const int64_t storage_order = ctx.GetInt("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) {
    return ctx.Error(absl::StrCat("attribute 'storage_order' is ", storage_order,
                                  "; expected 0 or 1"));
  }
  absl::StatusOr<WindowedPool> pool = SetUpWindowedPool(ctx);
  if (!pool.ok()) return pool.status();
  const common::WindowGeometry& g = pool->g;
  const TensorView& x = ctx.input(0);
  int64_t* indices = nullptr;
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
    absl::StatusOr<TensorView*> ind = ctx.Output(1, DType::kInt64, pool->out_dims);
    if (!ind.ok()) return ind.status();
    indices = (*ind)->as<int64_t>();
  }
  const int64_t planes = pool->planes, in_size = pool->in_size, out_size = pool->out_size;
  const bool ok = DispatchPool(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ValueOf<T>;
    const T* xp = x.as<T>();
    T* yp = pool->y->as<T>();
    if (g.num_spatial == 2 && indices == nullptr) {
      MaxPool2D<T>(g, pool->axes, planes, xp, yp);
      return;
    }
    ParallelFor(0, planes, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const T* xs = xp + plane * in_size;
        ForEachWindow(g, pool->axes, [&](int64_t q, const std::vector<int64_t>&, auto&& visit) {
          V best = std::numeric_limits<V>::lowest();
          int64_t best_row = -1, best_col = -1;
          visit([&](int64_t row, int64_t col) {
            const V v = Load(xs[row]);
            if (best_row < 0 || v > best || (std::isnan(static_cast<double>(v)) &&
                                             !std::isnan(static_cast<double>(best)))) {
              best = v;
              best_row = row;
              best_col = col;
            }
          });
          Store(&yp[plane * out_size + q], best);
          if (indices != nullptr) {
            const int64_t local = storage_order == 0 ? best_row : best_col;
            indices[plane * out_size + q] = local < 0 ? -1 : plane * in_size + local;
          }
        });
      }
    });
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

absl::Status AveragePoolKernel(KernelContext& ctx) {
  absl::StatusOr<WindowedPool> pool = SetUpWindowedPool(ctx);
  if (!pool.ok()) return pool.status();
  const common::WindowGeometry& g = pool->g;
  const bool count_include_pad = ctx.GetInt("count_include_pad", 0) != 0;
  const TensorView& x = ctx.input(0);
  const int64_t planes = pool->planes, in_size = pool->in_size, out_size = pool->out_size;
  const std::vector<AxisWindows>& axes = pool->axes;
  const int nd = g.num_spatial;
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ValueOf<T>;
    const T* xp = x.as<T>();
    T* yp = pool->y->as<T>();
    ParallelFor(0, planes, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const T* xs = xp + plane * in_size;
        ForEachWindow(g, axes, [&](int64_t q, const std::vector<int64_t>& o, auto&& visit) {
          V sum = 0;
          int64_t count = 0;
          visit([&](int64_t row, int64_t) {
            sum += Load(xs[row]);
            ++count;
          });
          if (count_include_pad) {
            count = 1;
            for (int d = 0; d < nd; ++d) count *= axes[d].padded_count[o[d]];
          }
          Store(&yp[plane * out_size + q], sum / static_cast<V>(count));
        });
      }
    });
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

// GlobalAveragePool's plane sum: float32 in kPlaneSumLanes independent
// lanes (term i in lane i mod kPlaneSumLanes, the tail's in lanes 0, 1,
// ...), then the lanes added pairwise; the same order in every clone. (One
// running sum waited on its previous add at every element: 0.3 ms of the
// sample ResNet's step for 4096 planes of 196.) Float32, bfloat16 and
// float16 planes (LoadF widens exactly).
constexpr int kPlaneSumLanes = 16;

template <typename T>
CASTOR_VECTOR_CLONES float PlaneSum(const T* x, int64_t n) {
  float lanes[kPlaneSumLanes] = {};
  int64_t i = 0;
  for (; i + kPlaneSumLanes <= n; i += kPlaneSumLanes) {
    for (int l = 0; l < kPlaneSumLanes; ++l) lanes[l] += LoadF(x[i + l]);
  }
  for (int l = 0; i < n; ++i, ++l) lanes[l] += LoadF(x[i]);
  for (int width = kPlaneSumLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

template <bool kMax>
absl::Status GlobalPoolKernel(KernelContext& ctx) {
  if (absl::Status s = CheckPoolInput(ctx); !s.ok()) return s;
  const TensorView& x = ctx.input(0);
  std::vector<int64_t> out_dims(x.dims.size(), 1);
  out_dims[0] = x.dims[0];
  out_dims[1] = x.dims[1];
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  const int64_t planes = x.dims[0] * x.dims[1];
  int64_t size = 1;
  for (size_t d = 2; d < x.dims.size(); ++d) size *= x.dims[d];
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ValueOf<T>;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    ParallelFor(0, planes, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const T* xs = xp + plane * size;
        if constexpr (kMax) {
          V best = size > 0 ? Load(xs[0]) : std::numeric_limits<V>::quiet_NaN();
          for (int64_t i = 1; i < size; ++i) {
            const V v = Load(xs[i]);
            if (v > best || std::isnan(v)) best = v;
            if (std::isnan(best)) break;
          }
          Store(&yp[plane], best);
        } else if constexpr (std::is_same_v<V, float>) {
          Store(&yp[plane], PlaneSum(xs, size) / static_cast<V>(size));
        } else {
          V sum = 0;
          for (int64_t i = 0; i < size; ++i) sum += Load(xs[i]);
          Store(&yp[plane], sum / static_cast<V>(size));
        }
      }
    });
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

}  // namespace

void RegisterPoolKernels(KernelTable& table) {
  // The ONNX ops and castor's training forms of them (graph/ops/pool.cc).
  for (const char* domain : {"", kCastorDomain}) {
    table.Register({domain, "MaxPool", InputDTypeIn(0, kMaxPoolDTypes), MaxPoolKernel});
    table.Register({domain, "AveragePool", InputDTypeIn(0, kPoolFloatDTypes), AveragePoolKernel});
    table.Register(
        {domain, "GlobalAveragePool", InputDTypeIn(0, kPoolFloatDTypes), GlobalPoolKernel<false>});
  }
  table.Register({"", "GlobalMaxPool", InputDTypeIn(0, kPoolFloatDTypes), GlobalPoolKernel<true>});
}

}  // namespace castor::cpu
