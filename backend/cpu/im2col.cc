// Window geometry for the CPU Conv and pooling kernels (see im2col.h).
#include "backend/cpu/im2col.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/grid_conv.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define CASTOR_IM2COL_X86 1
#include <immintrin.h>
#endif

namespace castor::cpu {
namespace {
int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

#if defined(CASTOR_IM2COL_X86)
#pragma GCC push_options
#pragma GCC target("avx512f")
// FillPaddedPlaneVector's loop. Lane j of a row's vector at column j0 reads
// src_line[j0 + j - left] where that lies in [0, in_w): masked-off lanes
// are neither read nor faulted on, and store zeros.
void FillPaddedPlaneAvx512(const float* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, float* dst) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < rows; ++i, dst += cols) {
    const int64_t ih = i - top;
    const bool inside = ih >= 0 && ih < in_h;
    const uintptr_t line = inside ? reinterpret_cast<uintptr_t>(src + ih * src_stride) : 0;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const __mmask16 store = static_cast<__mmask16>(
          cols - j0 >= 16 ? 0xFFFFu : (1u << (cols - j0)) - 1u);
      __mmask16 load = 0;
      if (inside) {  // lanes with 0 <= j0 + j - left < in_w
        const __m512i column = _mm512_add_epi32(lanes, _mm512_set1_epi32(int(j0 - left)));
        load = _mm512_cmpge_epi32_mask(column, _mm512_setzero_si512()) &
               _mm512_cmplt_epi32_mask(column, _mm512_set1_epi32(int(in_w))) & store;
      }
      // (The address is formed only for lanes inside the line: j0 - left may
      // be negative, so offset the line pointer by integers, not before it.)
      const float* from = reinterpret_cast<const float*>(
          line + static_cast<uintptr_t>((j0 - left) * int64_t{sizeof(float)}));
      const __m512 v = _mm512_maskz_loadu_ps(load, from);
      _mm512_mask_storeu_ps(dst + j0, store, v);
    }
  }
  _mm256_zeroupper();
}

// SpreadRow with step 2: 8 floats at a time are expanded into the even lanes
// of a vector and stored under an even-lane mask, so the odd positions (the
// other column phase's) keep their values.
void SpreadRowStep2Avx512(const float* src, int64_t n, float* dst) {
  constexpr __mmask16 kEven = 0x5555;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm512_mask_storeu_ps(dst + 2 * j, kEven, _mm512_maskz_expandloadu_ps(kEven, src + j));
  }
  if (j < n) {  // r < 8 left: lanes 0, 2, ..., 2r - 2
    const __mmask16 mask = static_cast<__mmask16>(kEven & ((1u << (2 * (n - j) - 1)) - 1u));
    _mm512_mask_storeu_ps(dst + 2 * j, mask, _mm512_maskz_expandloadu_ps(mask, src + j));
  }
  _mm256_zeroupper();
}
#pragma GCC pop_options
#endif  // CASTOR_IM2COL_X86

}  // namespace

bool FillPaddedPlaneVector(const float* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, float* dst) {
#if defined(CASTOR_IM2COL_X86)
  constexpr int64_t kLimit = int64_t{1} << 30;  // lane columns are int32
  if (ActiveGridIsa() == GridIsa::kAvx512 && in_w < kLimit && left < kLimit && cols < kLimit) {
    FillPaddedPlaneAvx512(src, in_h, in_w, src_stride, top, left, rows, cols, dst);
    return true;
  }
#endif
  (void)src, (void)in_h, (void)in_w, (void)src_stride, (void)top, (void)left, (void)rows;
  (void)cols, (void)dst;
  return false;
}

void SpreadRow(const float* src, int64_t n, int64_t step, float* dst) {
#if defined(CASTOR_IM2COL_X86)
  if (step == 2 && ActiveGridIsa() == GridIsa::kAvx512) {
    SpreadRowStep2Avx512(src, n, dst);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) dst[j * step] = src[j];
}

int64_t WindowGeometry::input_size() const { return Product(input); }
int64_t WindowGeometry::kernel_size() const { return Product(kernel); }
int64_t WindowGeometry::output_size() const { return Product(output); }

absl::StatusOr<std::vector<int64_t>> WindowInts(const KernelContext& ctx, const std::string& name,
                                                size_t count, int64_t fill) {
  if (!ctx.node().has_attribute(name)) return std::vector<int64_t>(count, fill);
  std::vector<int64_t> values = ctx.GetInts(name);
  if (values.size() != count) {
    return ctx.Error(absl::StrCat("attribute '", name, "' has ", values.size(),
                                  " entries; expected ", count));
  }
  return values;
}

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

absl::StatusOr<WindowGeometry> ForwardWindowGeometry(const KernelContext& ctx,
                                                     const std::vector<int64_t>& input,
                                                     const std::vector<int64_t>& kernel,
                                                     bool ceil_mode) {
  const size_t n = input.size();
  WindowGeometry g;
  g.num_spatial = static_cast<int>(n);
  g.input = input;
  g.kernel = kernel;
  if (kernel.size() != n) {
    return ctx.Error(absl::StrCat("kernel has ", kernel.size(), " axes; the input has ", n,
                                  " spatial axes"));
  }
  auto strides = WindowInts(ctx, "strides", n, 1);
  if (!strides.ok()) return strides.status();
  auto dilations = WindowInts(ctx, "dilations", n, 1);
  if (!dilations.ok()) return dilations.status();
  auto pads = WindowInts(ctx, "pads", 2 * n, 0);
  if (!pads.ok()) return pads.status();
  g.strides = *strides;
  g.dilations = *dilations;
  const std::string auto_pad = ctx.GetString("auto_pad", "NOTSET");
  g.pad_begin.assign(pads->begin(), pads->begin() + n);
  g.pad_end.assign(pads->begin() + n, pads->end());
  g.output.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (g.strides[i] < 1 || g.dilations[i] < 1 || g.kernel[i] < 1) {
      return ctx.Error(absl::StrCat("axis ", i, ": kernel ", g.kernel[i], ", stride ",
                                    g.strides[i], ", dilation ", g.dilations[i],
                                    "; all must be >= 1"));
    }
    const int64_t window = (g.kernel[i] - 1) * g.dilations[i] + 1;
    const int64_t stride = g.strides[i];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t out = (input[i] + stride - 1) / stride;
      const int64_t total = std::max<int64_t>(0, (out - 1) * stride + window - input[i]);
      g.pad_begin[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pad_end[i] = total - g.pad_begin[i];
    } else if (auto_pad == "VALID") {
      g.pad_begin[i] = g.pad_end[i] = 0;
    } else if (auto_pad != "NOTSET") {
      return ctx.Error(absl::StrCat("attribute 'auto_pad' is \"", auto_pad,
                                    "\"; expected NOTSET, SAME_UPPER, SAME_LOWER or VALID"));
    }
    const int64_t padded = input[i] + g.pad_begin[i] + g.pad_end[i];
    if (padded < window) {
      return ctx.Error(absl::StrCat("spatial axis ", i, ": the window spans ", window,
                                    " but the padded input has only ", padded));
    }
    int64_t out = (padded - window + (ceil_mode ? stride - 1 : 0)) / stride + 1;
    if (ceil_mode && (out - 1) * stride >= input[i] + g.pad_begin[i]) --out;
    g.output[i] = out;
  }
  return g;
}

}  // namespace castor::cpu
