// CPU kernels: pool family (ops of graph/ops/pool.cc): MaxPool (with the
// optional int64 Indices output, storage_order 0/1, int8/uint8 too),
// AveragePool (count_include_pad, ceil_mode, dilations, auto_pad),
// GlobalAveragePool and GlobalMaxPool, over N-d inputs [N, C, D1, ...].
// Windows follow the ONNX output-size rules (im2col.h ForwardWindowGeometry);
// positions in the padding are skipped (max) or, for the average, excluded
// from the divisor unless count_include_pad, which counts the window
// positions inside the padded input (not the overhang of ceil_mode).
// Arithmetic is in float32 (float64 for float64), rounded once on store.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/parallel.h"

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

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// For one spatial axis and each output index: the input indices its window
// reads (inside the input) and how many window positions lie inside the
// padded input.
struct AxisWindows {
  std::vector<int64_t> begin;  // output index o reads idx[begin[o] .. begin[o + 1])
  std::vector<int64_t> idx;
  std::vector<int64_t> padded_count;
};

std::vector<AxisWindows> BuildAxisWindows(const WindowGeometry& g) {
  std::vector<AxisWindows> axes(g.num_spatial);
  for (int d = 0; d < g.num_spatial; ++d) {
    AxisWindows& a = axes[d];
    a.begin.push_back(0);
    for (int64_t o = 0; o < g.output[d]; ++o) {
      const int64_t start = o * g.strides[d] - g.pad_begin[d];
      int64_t padded = 0;
      for (int64_t k = 0; k < g.kernel[d]; ++k) {
        const int64_t i = start + k * g.dilations[d];
        if (i >= 0 && i < g.input[d]) a.idx.push_back(i);
        if (i >= -g.pad_begin[d] && i < g.input[d] + g.pad_end[d]) ++padded;
      }
      a.begin.push_back(static_cast<int64_t>(a.idx.size()));
      a.padded_count.push_back(padded);
    }
  }
  return axes;
}

// Calls fn(output_flat, visit) for every output position of one plane, where
// visit(cb) calls cb(row_major_offset, column_major_offset) for each input
// position of the window that lies inside the input.
template <typename Fn>
void ForEachWindow(const WindowGeometry& g, const std::vector<AxisWindows>& axes, Fn&& fn) {
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
    int64_t rest = q;
    bool empty = false;
    for (int d = nd - 1; d >= 0; --d) {
      o[d] = rest % g.output[d];
      rest /= g.output[d];
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
  }
}

absl::Status CheckPoolInput(const KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat("input X must have rank >= 3 ([N, C, D1, ...]); it is ",
                                  DimsString(x.dims)));
  }
  return absl::OkStatus();
}

// The geometry of a windowed pool over X (kernel_shape required).
absl::StatusOr<WindowGeometry> PoolGeometry(const KernelContext& ctx) {
  if (!ctx.node().has_attribute("kernel_shape")) {
    return ctx.Error("attribute 'kernel_shape' is required");
  }
  const TensorView& x = ctx.input(0);
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const int64_t ceil_mode = ctx.GetInt("ceil_mode", 0);
  return ForwardWindowGeometry(ctx, spatial, ctx.GetInts("kernel_shape"), ceil_mode != 0);
}

absl::Status MaxPoolKernel(KernelContext& ctx) {
  if (absl::Status s = CheckPoolInput(ctx); !s.ok()) return s;
  absl::StatusOr<WindowGeometry> g = PoolGeometry(ctx);
  if (!g.ok()) return g.status();
  const int64_t storage_order = ctx.GetInt("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) {
    return ctx.Error(absl::StrCat("attribute 'storage_order' is ", storage_order,
                                  "; expected 0 or 1"));
  }
  const TensorView& x = ctx.input(0);
  std::vector<int64_t> out_dims = {x.dims[0], x.dims[1]};
  out_dims.insert(out_dims.end(), g->output.begin(), g->output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  int64_t* indices = nullptr;
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
    absl::StatusOr<TensorView*> ind = ctx.Output(1, DType::kInt64, out_dims);
    if (!ind.ok()) return ind.status();
    indices = (*ind)->as<int64_t>();
  }
  const int64_t planes = x.dims[0] * x.dims[1];
  const int64_t in_size = g->input_size();
  const int64_t out_size = g->output_size();
  const std::vector<AxisWindows> axes = BuildAxisWindows(*g);
  const bool ok = DispatchPool(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ValueOf<T>;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    ParallelFor(0, planes, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const T* xs = xp + plane * in_size;
        ForEachWindow(*g, axes, [&](int64_t q, const std::vector<int64_t>&, auto&& visit) {
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
  if (absl::Status s = CheckPoolInput(ctx); !s.ok()) return s;
  absl::StatusOr<WindowGeometry> g = PoolGeometry(ctx);
  if (!g.ok()) return g.status();
  const bool count_include_pad = ctx.GetInt("count_include_pad", 0) != 0;
  const TensorView& x = ctx.input(0);
  std::vector<int64_t> out_dims = {x.dims[0], x.dims[1]};
  out_dims.insert(out_dims.end(), g->output.begin(), g->output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  const int64_t planes = x.dims[0] * x.dims[1];
  const int64_t in_size = g->input_size();
  const int64_t out_size = g->output_size();
  const std::vector<AxisWindows> axes = BuildAxisWindows(*g);
  const int nd = g->num_spatial;
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ValueOf<T>;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    ParallelFor(0, planes, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const T* xs = xp + plane * in_size;
        ForEachWindow(*g, axes, [&](int64_t q, const std::vector<int64_t>& o, auto&& visit) {
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
  table.Register({"", "MaxPool", InputDTypeIn(0, kMaxPoolDTypes), MaxPoolKernel});
  table.Register({"", "AveragePool", InputDTypeIn(0, kPoolFloatDTypes), AveragePoolKernel});
  table.Register(
      {"", "GlobalAveragePool", InputDTypeIn(0, kPoolFloatDTypes), GlobalPoolKernel<false>});
  table.Register({"", "GlobalMaxPool", InputDTypeIn(0, kPoolFloatDTypes), GlobalPoolKernel<true>});
}

}  // namespace castor::cpu
