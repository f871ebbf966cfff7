// CPU kernels of the pools' gradients (castor's gradient ops,
// graph/ops/gradient_ops.cc). MaxPoolGrad / AveragePoolGrad walk each
// plane's windows (the forward window tables: ForwardWindowGeometry,
// ceil_mode, pads, dilations; a 2-D MaxPoolGrad plane scans each window
// directly); MaxPoolGrad routes dY to the first maximum of each window in
// row-major window order (the forward kernel's and PyTorch's tie rule),
// overlapping windows accumulate. GlobalAveragePoolGrad spreads dY / size.
// All arithmetic is float32; 16-bit inputs widen exactly and every output
// rounds once on store. Planes run in parallel on backend/cpu/parallel.h.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "backend/common/window_geometry.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/simd16.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// ---- pools -------------------------------------------------------------------

// Calls fn(q, o, offsets) for each output position q of one plane (o: its
// per-axis index), `offsets` being the row-major input offsets its window
// reads inside the input, in row-major window order.
template <typename Fn>
void ForEachWindow(const common::WindowGeometry& g, const std::vector<AxisWindows>& axes, Fn&& fn) {
  const int nd = g.num_spatial;
  std::vector<int64_t> stride(nd);
  int64_t step = 1;
  for (int d = nd - 1; d >= 0; --d) {
    stride[d] = step;
    step *= g.input[d];
  }
  std::vector<int64_t> o(nd, 0), cur(nd), offsets;
  const int64_t out_size = g.output_size();
  for (int64_t q = 0; q < out_size; ++q) {
    offsets.clear();
    bool empty = false;
    for (int d = 0; d < nd; ++d) {
      cur[d] = axes[d].begin[o[d]];
      empty |= cur[d] == axes[d].begin[o[d] + 1];
    }
    while (!empty) {
      int64_t offset = 0;
      for (int d = 0; d < nd; ++d) offset += axes[d].idx[cur[d]] * stride[d];
      offsets.push_back(offset);
      int d = nd - 1;
      while (d >= 0 && ++cur[d] == axes[d].begin[o[d] + 1]) {
        cur[d] = axes[d].begin[o[d]];
        --d;
      }
      if (d < 0) break;
    }
    fn(q, o, offsets);
    for (int d = nd - 1; d >= 0 && ++o[d] == g.output[d]; --d) o[d] = 0;
  }
}

// Shared set-up of MaxPoolGrad and AveragePoolGrad: checks, geometry, dX.
struct PoolGradSetUp {
  common::WindowGeometry g;
  std::vector<AxisWindows> axes;
  int64_t planes = 0;
  TensorView* dx = nullptr;
};

absl::StatusOr<PoolGradSetUp> SetUpPoolGrad(KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat("input 1 (X) must have rank >= 3 ([N, C, D1, ...]); it is ",
                                  common::DimsToString(x.dims)));
  }
  if (absl::Status st = common::RequireSameDType(ctx, 0, "dY", 1, "X"); !st.ok()) return st;
  if (!ctx.node().has_attribute("kernel_shape")) {
    return ctx.Error("attribute 'kernel_shape' is required");
  }
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  PoolGradSetUp setup;
  CASTOR_ASSIGN_OR_RETURN(setup.g,
                          common::ForwardWindowGeometry(ctx, spatial, ctx.GetInts("kernel_shape"),
                                                        ctx.GetInt("ceil_mode", 0) != 0));
  std::vector<int64_t> y_dims = {x.dims[0], x.dims[1]};
  y_dims.insert(y_dims.end(), setup.g.output.begin(), setup.g.output.end());
  if (absl::Status st = common::RequireDims(ctx, 0, "dY", y_dims, "the pool's output for X");
      !st.ok()) {
    return st;
  }
  setup.axes = BuildAxisWindows(setup.g);
  setup.planes = x.dims[0] * x.dims[1];
  CASTOR_ASSIGN_OR_RETURN(setup.dx, ctx.Output(0, x.dtype, x.dims));
  return setup;
}

// MaxPoolGrad of one 2-D plane without ForEachWindow's offset lists: each
// output's window is scanned row-major over the positions inside the input,
// and dY goes to the first maximum (a NaN wins over numbers), exactly as the
// generic walk does.
template <typename U>
void MaxPoolGradPlane2D(const common::WindowGeometry& g, const U* x, const float* dy, float* dx) {
  const int64_t in_h = g.input[0], in_w = g.input[1];
  for (int64_t oh = 0; oh < g.output[0]; ++oh) {
    const int64_t h0 = oh * g.strides[0] - g.pad_begin[0];
    for (int64_t ow = 0; ow < g.output[1]; ++ow) {
      const int64_t w0 = ow * g.strides[1] - g.pad_begin[1];
      int64_t best = -1;
      for (int64_t kh = 0; kh < g.kernel[0]; ++kh) {
        const int64_t ih = h0 + kh * g.dilations[0];
        if (ih < 0 || ih >= in_h) continue;
        for (int64_t kw = 0; kw < g.kernel[1]; ++kw) {
          const int64_t iw = w0 + kw * g.dilations[1];
          if (iw < 0 || iw >= in_w) continue;
          const int64_t at = ih * in_w + iw;
          if (best < 0) {
            best = at;
            continue;
          }
          const float v = LoadF(x[at]), best_value = LoadF(x[best]);
          // Non-short-circuit ops and an integer select (a conditional
          // move): which element wins is random, so a branch mispredicts.
          const bool take = (v > best_value) | ((v != v) & (best_value == best_value));
          best = take ? at : best;
        }
      }
      if (best >= 0) dx[best] += dy[oh * g.output[1] + ow];
    }
  }
}

// True when every window of `g` is 2x2, inside the input, and no input
// position is in two windows: kernel 2x2, strides 2, no pads or dilation
// (whatever ceil_mode, the output then stays inside the input).
bool IsDisjoint2x2(const common::WindowGeometry& g) {
  return g.num_spatial == 2 && g.kernel[0] == 2 && g.kernel[1] == 2 && g.strides[0] == 2 &&
         g.strides[1] == 2 && g.dilations[0] == 1 && g.dilations[1] == 1 &&
         g.pad_begin[0] == 0 && g.pad_begin[1] == 0 && 2 * g.output[0] <= g.input[0] &&
         2 * g.output[1] <= g.input[1];
}

#if defined(CASTOR_SIMD16_X86)
// MaxPoolGradPlane2x2's window loop for 16 windows at a time: the two input
// rows' 32 values are split into the windows' four corners, the first
// maximum is found with the same comparisons (a NaN wins over a number),
// and dY goes to its corner, 0 to the others. Windows [0, count) of one
// output row.
CASTOR_SIMD16_TARGET void MaxPoolGradRow2x2Avx512(const float* r0, const float* r1,
                                                  const float* dy_row, float* d0, float* d1,
                                                  int64_t count) {
  for (int64_t w = 0; w < count; w += 16) {
    const int64_t windows = std::min<int64_t>(16, count - w);
    const __mmask16 lanes = TailMask(windows);
    const __mmask16 first = TailMask(2 * windows);
    const __mmask16 second = TailMask(2 * windows - 16);
    const float* a = r0 + 2 * w;
    const float* b = r1 + 2 * w;
    const __m512 a_lo = _mm512_maskz_loadu_ps(first, a), a_hi = _mm512_maskz_loadu_ps(second, a + 16);
    const __m512 b_lo = _mm512_maskz_loadu_ps(first, b), b_hi = _mm512_maskz_loadu_ps(second, b + 16);
    const __m512 v[4] = {EvenElements(a_lo, a_hi), OddElements(a_lo, a_hi),
                         EvenElements(b_lo, b_hi), OddElements(b_lo, b_hi)};
    __m512 best_value = v[0];
    __mmask16 is_best[4] = {0xffff, 0, 0, 0};
    for (int k = 1; k < 4; ++k) {
      const __mmask16 greater = _mm512_cmp_ps_mask(v[k], best_value, _CMP_GT_OQ);
      const __mmask16 nan_over_number = _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q) &
                                        _mm512_cmp_ps_mask(best_value, best_value, _CMP_ORD_Q);
      const __mmask16 take = greater | nan_over_number;
      for (int j = 0; j < k; ++j) is_best[j] &= static_cast<__mmask16>(~take);
      is_best[k] = take;
      best_value = _mm512_mask_blend_ps(take, best_value, v[k]);
    }
    const __m512 grad = _mm512_maskz_loadu_ps(lanes, dy_row + w);
    __m512 out[4];
    for (int k = 0; k < 4; ++k) out[k] = _mm512_maskz_mov_ps(is_best[k], grad);
    _mm512_mask_storeu_ps(d0 + 2 * w, first, InterleavedFirst(out[0], out[1]));
    _mm512_mask_storeu_ps(d0 + 2 * w + 16, second, InterleavedLast(out[0], out[1]));
    _mm512_mask_storeu_ps(d1 + 2 * w, first, InterleavedFirst(out[2], out[3]));
    _mm512_mask_storeu_ps(d1 + 2 * w + 16, second, InterleavedLast(out[2], out[3]));
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

// MaxPoolGradPlane2D for IsDisjoint2x2 windows, writing all of the plane's
// dX (so it needs no zeroed buffer): each window's four positions get dY at
// the first maximum (row-major; a NaN wins over numbers) and 0 elsewhere,
// branch-free over the windows of a row (16 at a time on AVX-512);
// positions no window covers (an odd last row or column) get 0.
void MaxPoolGradPlane2x2(const common::WindowGeometry& g, const float* x, const float* dy,
                         float* dx) {
  const int64_t in_h = g.input[0], in_w = g.input[1], out_h = g.output[0], out_w = g.output[1];
  for (int64_t ih = 2 * out_h; ih < in_h; ++ih) std::fill_n(dx + ih * in_w, in_w, 0.0f);
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const float* r0 = x + 2 * oh * in_w;
    const float* r1 = r0 + in_w;
    float* d0 = dx + 2 * oh * in_w;
    float* d1 = d0 + in_w;
    const float* dy_row = dy + oh * out_w;
#if defined(CASTOR_SIMD16_X86)
    if (UseFusedSimd16()) {
      MaxPoolGradRow2x2Avx512(r0, r1, dy_row, d0, d1, out_w);
      for (int64_t iw = 2 * out_w; iw < in_w; ++iw) d0[iw] = d1[iw] = 0.0f;
      continue;
    }
#endif
    for (int64_t ow = 0; ow < out_w; ++ow) {
      const float v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
      int best = 0;
      float best_value = v[0];
      for (int k = 1; k < 4; ++k) {
        const bool take = (v[k] > best_value) | ((v[k] != v[k]) & (best_value == best_value));
        best = take ? k : best;
        best_value = take ? v[k] : best_value;
      }
      const float grad = dy_row[ow];
      d0[2 * ow] = best == 0 ? grad : 0.0f;
      d0[2 * ow + 1] = best == 1 ? grad : 0.0f;
      d1[2 * ow] = best == 2 ? grad : 0.0f;
      d1[2 * ow + 1] = best == 3 ? grad : 0.0f;
    }
    for (int64_t iw = 2 * out_w; iw < in_w; ++iw) d0[iw] = d1[iw] = 0.0f;
  }
}

template <bool kMax>
absl::Status PoolGradKernel(KernelContext& ctx) {
  if (kMax) {
    const int64_t storage_order = ctx.GetInt("storage_order", 0);
    if (storage_order != 0 && storage_order != 1) {
      return ctx.Error(absl::StrCat("attribute 'storage_order' is ", storage_order,
                                    "; expected 0 or 1"));
    }
  }
  CASTOR_ASSIGN_OR_RETURN(PoolGradSetUp setup, SetUpPoolGrad(ctx));
  const common::WindowGeometry& g = setup.g;
  const TensorView& x = ctx.input(1);
  const int64_t in_size = g.input_size(), out_size = g.output_size();
  if (kMax && IsDisjoint2x2(g) && (x.dtype == DType::kBFloat16 || x.dtype == DType::kFloat16) &&
      ctx.input(0).dtype == x.dtype && setup.dx->dtype == x.dtype) {
    // 16-bit disjoint 2x2 windows a plane at a time: X and dY widened into
    // per-thread float32 planes, routed as float32, dX rounded back (exact:
    // each value is a dY or 0). Whole-tensor float32 copies of dY and dX
    // cost more than the routing.
    const size_t bytes = DTypeSize(x.dtype);
    const char* xp = static_cast<const char*>(x.data);
    const char* dyp = static_cast<const char*>(ctx.input(0).data);
    char* dxp = static_cast<char*>(setup.dx->data);
    ParallelFor(0, setup.planes, 1, [&](int64_t lo, int64_t hi) {
      thread_local std::vector<float> planes;
      planes.resize(static_cast<size_t>(2 * in_size + out_size));
      float* xs = planes.data();
      float* dxs = xs + in_size;
      float* dys = dxs + in_size;
      for (int64_t plane = lo; plane < hi; ++plane) {
        ToFloat32(x.dtype, xp + plane * in_size * bytes, xs, in_size);
        ToFloat32(x.dtype, dyp + plane * out_size * bytes, dys, out_size);
        MaxPoolGradPlane2x2(g, xs, dys, dxs);
        FromFloat32(x.dtype, dxs, dxp + plane * in_size * bytes, in_size);
      }
    });
    return absl::OkStatus();
  }
  const Float32In dy(ctx.input(0));
  // MaxPoolGradPlane2x2 (float32 and widened 16-bit X) writes every dX
  // element; everything else adds into zeros.
  const bool disjoint_2x2 = kMax && IsDisjoint2x2(g) && x.dtype != DType::kFloat64;
  const Float32Out dx(setup.dx, /*overwritten=*/disjoint_2x2);
  const bool count_include_pad = ctx.GetInt("count_include_pad", 0) != 0;
  DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.as<T>();
    ParallelFor(0, setup.planes, 1, [&](int64_t lo, int64_t hi) {
      // MaxPoolGrad widens a 16-bit X plane to float32 once (exact).
      std::vector<float> widened_plane(kMax && kIsFloat16Storage<T> ? in_size : 0);
      for (int64_t plane = lo; plane < hi; ++plane) {
        const auto* xs = [&] {
          if constexpr (kMax && kIsFloat16Storage<T>) {
            ToFloat32(xp + plane * in_size, widened_plane.data(), in_size);
            return static_cast<const float*>(widened_plane.data());
          } else {
            return xp + plane * in_size;
          }
        }();
        const float* dys = dy.data() + plane * out_size;
        float* dxs = dx.data() + plane * in_size;
        if constexpr (kMax) {
          if constexpr (std::is_same_v<std::decay_t<decltype(*xs)>, float>) {
            if (disjoint_2x2) {
              MaxPoolGradPlane2x2(g, xs, dys, dxs);
              continue;
            }
          }
          if (g.num_spatial == 2) {
            MaxPoolGradPlane2D(g, xs, dys, dxs);
            continue;
          }
        }
        ForEachWindow(g, setup.axes, [&](int64_t q, const std::vector<int64_t>& o,
                                         const std::vector<int64_t>& offsets) {
          if (offsets.empty()) return;
          if constexpr (kMax) {
            // The first maximum (a NaN wins over numbers, as in the forward).
            int64_t best = offsets[0];
            float best_value = LoadF(xs[best]);
            for (size_t k = 1; k < offsets.size(); ++k) {
              const float v = LoadF(xs[offsets[k]]);
              if (v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
                best_value = v;
                best = offsets[k];
              }
            }
            dxs[best] += dys[q];
          } else {
            int64_t count = static_cast<int64_t>(offsets.size());
            if (count_include_pad) {
              count = 1;
              for (int d = 0; d < g.num_spatial; ++d) count *= setup.axes[d].padded_count[o[d]];
            }
            const float share = dys[q] / static_cast<float>(count);
            for (int64_t offset : offsets) dxs[offset] += share;
          }
        });
      }
    });
  });
  dx.Finish();
  return absl::OkStatus();
}

absl::Status GlobalAveragePoolGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(common::CheckGlobalAveragePoolGrad(ctx));
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const int64_t planes = x.dims[0] * x.dims[1];
  const int64_t size = common::DimsProduct(x.dims, 2, x.dims.size());
  DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    T* dxp = dx->as<T>();
    ParallelFor(0, planes, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, size)),
                [&](int64_t lo, int64_t hi) {
                  for (int64_t plane = lo; plane < hi; ++plane) {
                    const float share = LoadF(dyp[plane]) / static_cast<float>(size);
                    T* dst = dxp + plane * size;
                    for (int64_t i = 0; i < size; ++i) StoreF(&dst[i], share);
                  }
                });
  });
  return absl::OkStatus();
}

}  // namespace

void RegisterPoolGradKernels(KernelTable& table) {
  RegisterGradientKernel(table, "MaxPoolGrad", PoolGradKernel<true>);
  RegisterGradientKernel(table, "AveragePoolGrad", PoolGradKernel<false>);
  RegisterGradientKernel(table, "GlobalAveragePoolGrad", GlobalAveragePoolGradKernel);
}

}  // namespace castor::cpu
