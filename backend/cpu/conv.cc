// CPU kernels: conv family (ops of graph/ops/conv.cc).
//
// Conv: N-d (1-D, 2-D, 3-D, ...) with groups, strides, dilations, pads,
// auto_pad and optional bias, as im2col + GEMM per (image, group). When one
// image's GEMM is small (OpenBLAS would run it on one thread) the images run
// in parallel, each writing its output directly; otherwise several images'
// columns are laid side by side so one large GEMM (threaded by OpenBLAS)
// covers them, and the result is scattered to [N, M, ...].
// ConvTranspose: GEMM W^T * X per (image, group), then col2im scatter-adds
// the columns into the output (output_shape, output_padding, pads, auto_pad).
// 16-bit inputs are widened to float32 for the GEMM; each output is rounded
// once on store. float64 runs in float64 (dgemm).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/parallel.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kConvDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                        DType::kFloat64};

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// Row-major GEMM in the accumulation type (float32 or float64).
template <typename Acc>
void GemmAcc(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Acc* a,
             int64_t lda, const Acc* b, int64_t ldb, Acc* c, int64_t ldc) {
  if constexpr (std::is_same_v<Acc, double>) {
    Dgemm(trans_a, trans_b, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
  } else {
    Sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  }
}

template <typename T, typename Acc>
void StoreAcc(T* dst, Acc v) {
  if constexpr (std::is_same_v<T, double>) {
    *dst = static_cast<double>(v);
  } else {
    StoreF(dst, static_cast<float>(v));
  }
}

// `n` elements of `src` (storage T) widened to Acc (a copy; a view when the
// types match is handled by the callers).
template <typename T, typename Acc>
std::vector<Acc> WidenAll(const T* src, int64_t n) {
  std::vector<Acc> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = WidenTo<Acc>(src[i]);
  return out;
}

// The optional bias [M] widened to Acc (zeros when absent).
template <typename T, typename Acc>
std::vector<Acc> ReadBias(const KernelContext& ctx, int64_t m) {
  if (!ctx.has_input(2)) return std::vector<Acc>(static_cast<size_t>(m), Acc(0));
  return WidenAll<T, Acc>(ctx.input(2).as<T>(), m);
}

// Shared input checks of Conv and ConvTranspose: ranks, dtypes, group, bias.
absl::Status CheckConvInputs(const KernelContext& ctx, int64_t group, int64_t bias_size) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  if (x.dims.size() < 3 || w.dims.size() != x.dims.size()) {
    return ctx.Error(absl::StrCat("X ", DimsString(x.dims), " and W ", DimsString(w.dims),
                                  " must have the same rank >= 3"));
  }
  if (w.dtype != x.dtype || (ctx.has_input(2) && ctx.input(2).dtype != x.dtype)) {
    return ctx.Error("X, W and B must have the same dtype");
  }
  if (group < 1) return ctx.Error(absl::StrCat("attribute 'group' is ", group, "; expected >= 1"));
  if (ctx.has_input(2) && ctx.input(2).num_elements() != bias_size) {
    return ctx.Error(absl::StrCat("bias B ", DimsString(ctx.input(2).dims), " must have ",
                                  bias_size, " entries"));
  }
  // kernel_shape, when given, must match W's spatial dims.
  if (ctx.node().has_attribute("kernel_shape")) {
    const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
    if (ctx.GetInts("kernel_shape") != kernel) {
      return ctx.Error(absl::StrCat("attribute 'kernel_shape' ",
                                    DimsString(ctx.GetInts("kernel_shape")),
                                    " does not match W's spatial dims ", DimsString(kernel)));
    }
  }
  return absl::OkStatus();
}

// ---- Conv ------------------------------------------------------------------

template <typename T, typename Acc>
void RunConv(const KernelContext& ctx, const WindowGeometry& g, int64_t batch, int64_t channels,
             int64_t out_channels, int64_t group, TensorView* y) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  const int64_t kg = cg * g.kernel_size();
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const T* xp = x.as<T>();
  T* yp = y->as<T>();
  std::vector<Acc> w_widened;
  const Acc* wp;
  if constexpr (std::is_same_v<T, Acc>) {
    wp = w.as<Acc>();
  } else {
    w_widened = WidenAll<T, Acc>(w.as<T>(), w.num_elements());
    wp = w_widened.data();
  }
  const std::vector<Acc> bias = ReadBias<T, Acc>(ctx, out_channels);

  if (IsSmallGemm(mg, p, kg) || batch == 1) {
    // One task per (image, group); small GEMMs run on the calling thread.
    const bool parallel_images = IsSmallGemm(mg, p, kg);
    auto task = [&](int64_t t) {
      const int64_t n = t / group, gi = t % group;
      thread_local std::vector<Acc> col, product;
      col.resize(static_cast<size_t>(kg * p));
      const T* xg = xp + (n * channels + gi * cg) * in_size;
      // (thread_local buffers are named through pointers inside nested
      // ParallelFor lambdas, which run on other threads.)
      Acc* col_data = col.data();
      if (parallel_images) {
        Im2Col<T, Acc>(xg, cg, g, col_data, p, 0, kg);
      } else {
        ParallelFor(0, kg, 1, [&](int64_t lo, int64_t hi) {
          Im2Col<T, Acc>(xg, cg, g, col_data, p, lo, hi);
        });
      }
      T* yg = yp + (n * out_channels + gi * mg) * p;
      Acc* dst;
      if constexpr (std::is_same_v<T, Acc>) {
        dst = yg;
      } else {
        product.resize(static_cast<size_t>(mg * p));
        dst = product.data();
      }
      GemmAcc<Acc>(false, false, mg, p, kg, wp + gi * mg * kg, kg, col.data(), p, dst, p);
      for (int64_t m = 0; m < mg; ++m) {
        const Acc b = bias[gi * mg + m];
        for (int64_t i = 0; i < p; ++i) StoreAcc(&yg[m * p + i], dst[m * p + i] + b);
      }
    };
    if (parallel_images) {
      ParallelFor(0, batch * group, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) task(t);
      });
    } else {
      for (int64_t t = 0; t < batch * group; ++t) task(t);
    }
    return;
  }

  // Large GEMMs: images of a chunk side by side, col [kg, chunk * p].
  constexpr int64_t kBudget = int64_t{16} << 20;  // elements of col + product
  const int64_t chunk = std::clamp<int64_t>(kBudget / ((kg + mg) * p), 1, batch);
  std::vector<Acc> col(static_cast<size_t>(kg * chunk * p));
  std::vector<Acc> product(static_cast<size_t>(mg * chunk * p));
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t images = std::min(chunk, batch - n0);
    const int64_t ld = images * p;
    for (int64_t gi = 0; gi < group; ++gi) {
      ParallelFor(0, images * kg, std::max<int64_t>(1, kg / 4), [&](int64_t lo, int64_t hi) {
        while (lo < hi) {
          const int64_t b = lo / kg, row = lo % kg;
          const int64_t end_row = std::min(kg, row + (hi - lo));
          const T* xg = xp + ((n0 + b) * channels + gi * cg) * in_size;
          Im2Col<T, Acc>(xg, cg, g, col.data() + b * p, ld, row, end_row);
          lo += end_row - row;
        }
      });
      GemmAcc<Acc>(false, false, mg, ld, kg, wp + gi * mg * kg, kg, col.data(), ld,
                   product.data(), ld);
      ParallelFor(0, images * mg, 4, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t b = t / mg, m = t % mg;
          const Acc bv = bias[gi * mg + m];
          const Acc* src = product.data() + m * ld + b * p;
          T* dst = yp + ((n0 + b) * out_channels + gi * mg + m) * p;
          for (int64_t i = 0; i < p; ++i) StoreAcc(&dst[i], src[i] + bv);
        }
      });
    }
  }
}

absl::Status ConvKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t group = ctx.GetInt("group", 1);
  if (absl::Status s = CheckConvInputs(ctx, group, w.dims.empty() ? 0 : w.dims[0]); !s.ok()) {
    return s;
  }
  const int64_t batch = x.dims[0], channels = x.dims[1], out_channels = w.dims[0];
  if (w.dims[1] * group != channels) {
    return ctx.Error(absl::StrCat("input channels ", channels, " (X ", DimsString(x.dims),
                                  ") must equal W.dim(1) * group = ", w.dims[1], " * ", group));
  }
  if (out_channels % group != 0) {
    return ctx.Error(absl::StrCat("output channels ", out_channels,
                                  " are not divisible by group ", group));
  }
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  absl::StatusOr<WindowGeometry> g = ForwardWindowGeometry(ctx, spatial, kernel, false);
  if (!g.ok()) return g.status();
  std::vector<int64_t> out_dims = {batch, out_channels};
  out_dims.insert(out_dims.end(), g->output.begin(), g->output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  if ((*y)->num_elements() == 0) return absl::OkStatus();
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    RunConv<T, Acc>(ctx, *g, batch, channels, out_channels, group, *y);
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

// ---- ConvTranspose ---------------------------------------------------------

// Python's floor division (ONNX's pad formulas use it for negative totals).
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// ConvTranspose geometry: `input` are X's spatial dims, `output` the result's.
absl::StatusOr<WindowGeometry> TransposeGeometry(const KernelContext& ctx,
                                                 const std::vector<int64_t>& input,
                                                 const std::vector<int64_t>& kernel) {
  const size_t n = input.size();
  WindowGeometry g;
  g.num_spatial = static_cast<int>(n);
  g.input = input;
  g.kernel = kernel;
  auto strides = WindowInts(ctx, "strides", n, 1);
  if (!strides.ok()) return strides.status();
  auto dilations = WindowInts(ctx, "dilations", n, 1);
  if (!dilations.ok()) return dilations.status();
  auto pads = WindowInts(ctx, "pads", 2 * n, 0);
  if (!pads.ok()) return pads.status();
  auto output_padding = WindowInts(ctx, "output_padding", n, 0);
  if (!output_padding.ok()) return output_padding.status();
  g.strides = *strides;
  g.dilations = *dilations;
  g.pad_begin.assign(pads->begin(), pads->begin() + n);
  g.pad_end.assign(pads->begin() + n, pads->end());
  const std::string auto_pad = ctx.GetString("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID") {
    return ctx.Error(absl::StrCat("attribute 'auto_pad' is \"", auto_pad,
                                  "\"; expected NOTSET, SAME_UPPER, SAME_LOWER or VALID"));
  }
  std::vector<int64_t> output_shape;
  if (ctx.node().has_attribute("output_shape")) {
    output_shape = ctx.GetInts("output_shape");
    // A full [N, C, ...] form is accepted too (as the registry does).
    if (output_shape.size() == n + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
    if (output_shape.size() != n) {
      return ctx.Error(absl::StrCat("attribute 'output_shape' ", DimsString(ctx.GetInts("output_shape")),
                                    " must have ", n, " entries (the spatial dims)"));
    }
  }
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  g.output.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (g.strides[i] < 1 || g.dilations[i] < 1) {
      return ctx.Error(absl::StrCat("axis ", i, ": strides and dilations must be >= 1"));
    }
    const int64_t window = (kernel[i] - 1) * g.dilations[i] + 1;
    const int64_t full = g.strides[i] * (input[i] - 1) + (*output_padding)[i] + window;
    if (!output_shape.empty() || same) {
      // The spec's total padding for a requested output size; SAME_UPPER
      // puts the odd unit at the end, otherwise at the beginning.
      int64_t target;
      int64_t total;
      if (!output_shape.empty()) {
        target = output_shape[i];
        total = full - target;
      } else {
        total = std::max<int64_t>(0, full - input[i] * g.strides[i]);
        target = full - total;
      }
      if (auto_pad == "SAME_UPPER") {
        g.pad_begin[i] = FloorDiv(total, 2);
        g.pad_end[i] = total - g.pad_begin[i];
      } else {
        g.pad_end[i] = FloorDiv(total, 2);
        g.pad_begin[i] = total - g.pad_end[i];
      }
      g.output[i] = target;
    } else {
      if (auto_pad == "VALID") g.pad_begin[i] = g.pad_end[i] = 0;
      g.output[i] = full - g.pad_begin[i] - g.pad_end[i];
    }
    if (g.output[i] < 0) {
      return ctx.Error(absl::StrCat("spatial axis ", i, ": the output size ", g.output[i],
                                    " is negative (pads too large)"));
    }
  }
  return g;
}

// Scatter-adds col [mg * kernel_size, input_size] into out [mg, output_size]
// for output channels [m_lo, m_hi).
template <typename Acc>
void Col2Im(const Acc* col, const WindowGeometry& g, Acc* out, int64_t m_lo, int64_t m_hi) {
  const int nd = g.num_spatial;
  const int64_t ksize = g.kernel_size();
  const int64_t in_size = g.input_size();
  const int64_t out_size = g.output_size();
  const int64_t in_last = g.input[nd - 1];
  const int64_t out_last = g.output[nd - 1];
  const int64_t outer_count = in_size / std::max<int64_t>(in_last, 1);
  std::vector<int64_t> kidx(nd), iidx(nd);
  for (int64_t row = m_lo * ksize; row < m_hi * ksize; ++row) {
    const int64_t m = row / ksize;
    int64_t rem = row % ksize;
    for (int d = nd - 1; d >= 0; --d) {
      kidx[d] = rem % g.kernel[d];
      rem /= g.kernel[d];
    }
    const Acc* src_row = col + row * in_size;
    Acc* dst_plane = out + m * out_size;
    // Last axis: output = i * stride + shift; valid i in [lo, hi).
    const int64_t s = g.strides[nd - 1];
    const int64_t shift = kidx[nd - 1] * g.dilations[nd - 1] - g.pad_begin[nd - 1];
    int64_t lo = shift >= 0 ? 0 : (-shift + s - 1) / s;
    int64_t hi = out_last - shift <= 0 ? 0 : (out_last - 1 - shift) / s + 1;
    lo = std::min(lo, in_last);
    hi = std::clamp(hi, lo, in_last);
    for (int64_t outer = 0; outer < outer_count; ++outer) {
      int64_t rest = outer;
      for (int d = nd - 2; d >= 0; --d) {
        iidx[d] = rest % g.input[d];
        rest /= g.input[d];
      }
      int64_t offset = 0, step = out_last;
      bool inside = true;
      for (int d = nd - 2; d >= 0; --d) {
        const int64_t o = iidx[d] * g.strides[d] - g.pad_begin[d] + kidx[d] * g.dilations[d];
        if (o < 0 || o >= g.output[d]) {
          inside = false;
          break;
        }
        offset += o * step;
        step *= g.output[d];
      }
      if (!inside) continue;
      const Acc* src = src_row + outer * in_last;
      Acc* dst = dst_plane + offset + shift;
      for (int64_t i = lo; i < hi; ++i) dst[i * s] += src[i];
    }
  }
}

template <typename T, typename Acc>
void RunConvTranspose(const KernelContext& ctx, const WindowGeometry& g, int64_t batch,
                      int64_t channels, int64_t out_channels, int64_t group, TensorView* y) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  const int64_t rows = mg * g.kernel_size();
  const int64_t in_size = g.input_size();
  const int64_t out_size = g.output_size();
  const T* xp = x.as<T>();
  T* yp = y->as<T>();
  std::vector<Acc> w_widened;
  const Acc* wp;
  if constexpr (std::is_same_v<T, Acc>) {
    wp = w.as<Acc>();
  } else {
    w_widened = WidenAll<T, Acc>(w.as<T>(), w.num_elements());
    wp = w_widened.data();
  }
  const std::vector<Acc> bias = ReadBias<T, Acc>(ctx, out_channels);
  const bool parallel_tasks = IsSmallGemm(rows, in_size, cg);
  auto task = [&](int64_t t) {
    const int64_t n = t / group, gi = t % group;
    thread_local std::vector<Acc> x_widened, col, acc;
    const T* xg = xp + (n * channels + gi * cg) * in_size;
    const Acc* xa;
    if constexpr (std::is_same_v<T, Acc>) {
      xa = xg;
    } else {
      x_widened.resize(static_cast<size_t>(cg * in_size));
      for (int64_t i = 0; i < cg * in_size; ++i) x_widened[i] = WidenTo<Acc>(xg[i]);
      xa = x_widened.data();
    }
    col.resize(static_cast<size_t>(rows * in_size));
    // col [mg*k, in] = W_g^T, W_g stored [cg, mg*k].
    GemmAcc<Acc>(true, false, rows, in_size, cg, wp + gi * cg * rows, rows, xa, in_size,
                 col.data(), in_size);
    acc.resize(static_cast<size_t>(mg * out_size));
    for (int64_t m = 0; m < mg; ++m) {
      std::fill(acc.begin() + m * out_size, acc.begin() + (m + 1) * out_size, bias[gi * mg + m]);
    }
    T* yg = yp + (n * out_channels + gi * mg) * out_size;
    auto scatter = [&](int64_t lo, int64_t hi) {
      Col2Im<Acc>(col.data(), g, acc.data(), lo, hi);
      for (int64_t i = lo * out_size; i < hi * out_size; ++i) StoreAcc(&yg[i], acc[i]);
    };
    if (parallel_tasks) {
      scatter(0, mg);
    } else {
      // thread_local buffers belong to this (calling) thread; workers only
      // touch disjoint channel ranges of them.
      Acc* col_data = col.data();
      Acc* acc_data = acc.data();
      ParallelFor(0, mg, 1, [&](int64_t lo, int64_t hi) {
        Col2Im<Acc>(col_data, g, acc_data, lo, hi);
        for (int64_t i = lo * out_size; i < hi * out_size; ++i) StoreAcc(&yg[i], acc_data[i]);
      });
    }
  };
  if (parallel_tasks) {
    ParallelFor(0, batch * group, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) task(t);
    });
  } else {
    for (int64_t t = 0; t < batch * group; ++t) task(t);
  }
}

absl::Status ConvTransposeKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t group = ctx.GetInt("group", 1);
  const int64_t out_channels = w.dims.size() >= 2 ? w.dims[1] * group : 0;
  if (absl::Status s = CheckConvInputs(ctx, group, out_channels); !s.ok()) return s;
  const int64_t batch = x.dims[0], channels = x.dims[1];
  if (w.dims[0] != channels) {
    return ctx.Error(absl::StrCat("input channels ", channels, " (X ", DimsString(x.dims),
                                  ") must equal W.dim(0) = ", w.dims[0]));
  }
  if (channels % group != 0) {
    return ctx.Error(absl::StrCat("input channels ", channels, " are not divisible by group ",
                                  group));
  }
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  absl::StatusOr<WindowGeometry> g = TransposeGeometry(ctx, spatial, kernel);
  if (!g.ok()) return g.status();
  std::vector<int64_t> out_dims = {batch, out_channels};
  out_dims.insert(out_dims.end(), g->output.begin(), g->output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  if ((*y)->num_elements() == 0) return absl::OkStatus();
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    RunConvTranspose<T, Acc>(ctx, *g, batch, channels, out_channels, group, *y);
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

}  // namespace

void RegisterConvKernels(KernelTable& table) {
  table.Register({"", "Conv", InputDTypeIn(0, kConvDTypes), ConvKernel});
  table.Register({"", "ConvTranspose", InputDTypeIn(0, kConvDTypes), ConvTransposeKernel});
}

}  // namespace castor::cpu
