// Sliding-window geometry shared by the CPU Conv, ConvTranspose and pooling
// kernels, and im2col: unrolling the windows of one image into the columns
// of a [C * prod(kernel), prod(output)] matrix so a convolution is one GEMM.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/kernel.h"
#include "backend/cpu/float_io.h"

namespace castor::cpu {

// Per spatial axis: input size, kernel, stride, dilation, begin/end pads and
// output size, resolved from the node's attributes for concrete input dims.
struct WindowGeometry {
  int num_spatial = 0;
  std::vector<int64_t> input, kernel, strides, dilations, pad_begin, pad_end, output;

  int64_t input_size() const;   // prod(input)
  int64_t kernel_size() const;  // prod(kernel)
  int64_t output_size() const;  // prod(output)
};

// Reads strides, dilations, pads and auto_pad of `ctx`'s node for a forward
// window op (Conv and the pools) over `input` spatial dims with `kernel`, and
// computes the output dims as ONNX does (SAME_UPPER/SAME_LOWER: output =
// ceil(input / stride), the odd pad unit at the end / beginning; VALID: no
// pads; ceil_mode rounds up but drops a last window starting in the end pad).
absl::StatusOr<WindowGeometry> ForwardWindowGeometry(const KernelContext& ctx,
                                                     const std::vector<int64_t>& input,
                                                     const std::vector<int64_t>& kernel,
                                                     bool ceil_mode);

// Attribute `name` as `count` ints (default `fill` when absent); an error
// naming the attribute when its length differs.
absl::StatusOr<std::vector<int64_t>> WindowInts(const KernelContext& ctx, const std::string& name,
                                                size_t count, int64_t fill);

// Unrolls `channels` channels of one image `x` ([channels, input...], storage
// type T) into `col` rows [channels * kernel_size(), output_size()] with row
// stride `col_ld` (>= output_size(); lets callers place several images side
// by side). Positions in the padding read as 0. Values are widened to Acc.
template <typename T, typename Acc>
void Im2Col(const T* x, int64_t channels, const WindowGeometry& g, Acc* col, int64_t col_ld,
            int64_t first_row, int64_t end_row);

// --- implementation ---------------------------------------------------------

template <typename Acc, typename T>
inline Acc WidenTo(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<Acc>(v);
  } else {
    return static_cast<Acc>(LoadF(v));
  }
}

// Rows [first_row, end_row) of the unrolled matrix (row = channel * kernel
// positions + kernel offset, row-major over the kernel axes).
template <typename T, typename Acc>
void Im2Col(const T* x, int64_t channels, const WindowGeometry& g, Acc* col, int64_t col_ld,
            int64_t first_row, int64_t end_row) {
  (void)channels;
  const int nd = g.num_spatial;
  const int64_t ksize = g.kernel_size();
  const int64_t in_size = g.input_size();
  const int64_t out_last = g.output[nd - 1];
  const int64_t in_last = g.input[nd - 1];
  const int64_t outer_count = g.output_size() / std::max<int64_t>(out_last, 1);
  std::vector<int64_t> kidx(nd), oidx(nd);
  for (int64_t row = first_row; row < end_row; ++row) {
    const int64_t c = row / ksize;
    int64_t rem = row % ksize;
    for (int d = nd - 1; d >= 0; --d) {
      kidx[d] = rem % g.kernel[d];
      rem /= g.kernel[d];
    }
    const T* xc = x + c * in_size;
    Acc* dst_row = col + row * col_ld;
    // Along the last axis: input = o * stride + shift; valid o in [lo, hi).
    const int64_t s = g.strides[nd - 1];
    const int64_t shift = kidx[nd - 1] * g.dilations[nd - 1] - g.pad_begin[nd - 1];
    int64_t lo = shift >= 0 ? 0 : (-shift + s - 1) / s;
    int64_t hi = in_last - shift <= 0 ? 0 : (in_last - 1 - shift) / s + 1;
    lo = std::min(lo, out_last);
    hi = std::clamp(hi, lo, out_last);
    for (int64_t outer = 0; outer < outer_count; ++outer) {
      // Input offset of the outer axes (all but the last), or -1 if padding.
      int64_t rest = outer;
      int64_t offset = 0;
      bool inside = true;
      for (int d = nd - 2; d >= 0; --d) {
        oidx[d] = rest % g.output[d];
        rest /= g.output[d];
      }
      int64_t step = in_last;
      for (int d = nd - 2; d >= 0; --d) {
        const int64_t i = oidx[d] * g.strides[d] - g.pad_begin[d] + kidx[d] * g.dilations[d];
        if (i < 0 || i >= g.input[d]) {
          inside = false;
          break;
        }
        offset += i * step;
        step *= g.input[d];
      }
      Acc* dst = dst_row + outer * out_last;
      if (!inside) {
        std::fill(dst, dst + out_last, Acc(0));
        continue;
      }
      const T* src = xc + offset + shift;
      std::fill(dst, dst + lo, Acc(0));
      if (s == 1) {
        for (int64_t o = lo; o < hi; ++o) dst[o] = WidenTo<Acc>(src[o]);
      } else {
        for (int64_t o = lo; o < hi; ++o) dst[o] = WidenTo<Acc>(src[o * s]);
      }
      std::fill(dst + hi, dst + out_last, Acc(0));
    }
  }
}

}  // namespace castor::cpu
