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

// For one spatial axis and each output index: the input indices its window
// reads (inside the input) and how many window positions lie inside the
// padded input (the pooling kernels and their gradients walk these).
struct AxisWindows {
  std::vector<int64_t> begin;  // output index o reads idx[begin[o] .. begin[o + 1])
  std::vector<int64_t> idx;
  std::vector<int64_t> padded_count;
};
std::vector<AxisWindows> BuildAxisWindows(const WindowGeometry& g);

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

// Unrolls the windows of one image `x` ([channels, input...], storage type
// T) into rows [first_row, end_row) of the [channels * kernel_size(),
// output_size()] column matrix, for the output positions of "output rows"
// [outer_lo, outer_hi) only: an output row is one line along the last
// spatial axis (output[last] positions; outer indexes the other axes
// row-major). Row `row` goes to col + row * col_ld, and position o of output
// row r to column (r - outer_lo) * output[last] + o, so the whole image is
// outer [0, output_size() / output[last]) with col_ld >= output_size().
// Positions in the padding read as 0. Values are widened to Acc.
template <typename T, typename Acc>
void Im2Col(const T* x, const WindowGeometry& g, int64_t first_row, int64_t end_row,
            int64_t outer_lo, int64_t outer_hi, Acc* col, int64_t col_ld);

// --- helpers shared with col2im (conv.cc) -----------------------------------

// The channel of unrolled row `row` (= channel * kernel_size() + kernel
// offset, row-major over the kernel axes); kidx[d] receives the kernel index
// along each spatial axis d.
inline int64_t DecodeKernelRow(const WindowGeometry& g, int64_t row, int64_t* kidx) {
  int64_t rem = row % g.kernel_size();
  for (int d = g.num_spatial - 1; d >= 0; --d) {
    kidx[d] = rem % g.kernel[d];
    rem /= g.kernel[d];
  }
  return row / g.kernel_size();
}

// Along the last spatial axis with kernel index k: window index b in
// [0, count) reads position b * stride + shift (shift = k * dilation -
// pad_begin) of an axis of `extent` positions; [lo, hi) are the b for which
// that position lies inside. (Im2Col: count = output, extent = input;
// col2im the other way round.)
struct LastAxisSpan {
  int64_t shift, lo, hi;
};
inline LastAxisSpan LastAxisSpanOf(const WindowGeometry& g, int64_t k, int64_t count,
                                   int64_t extent) {
  const int last = g.num_spatial - 1;
  const int64_t s = g.strides[last];
  const int64_t shift = k * g.dilations[last] - g.pad_begin[last];
  int64_t lo = shift >= 0 ? 0 : (-shift + s - 1) / s;
  int64_t hi = extent - shift <= 0 ? 0 : (extent - 1 - shift) / s + 1;
  lo = std::min(lo, count);
  hi = std::clamp(hi, lo, count);
  return {shift, lo, hi};
}

// For the spatial axes before the last: window index widx[d] with kernel
// index kidx[d] reads position widx * stride - pad_begin + kidx * dilation
// of an axis of extent[d] positions. Returns the row-major offset of those
// positions times extent[last] (where their line starts), or -1 when any of
// them lies outside.
inline int64_t OuterOffset(const WindowGeometry& g, const int64_t* widx, const int64_t* kidx,
                           const std::vector<int64_t>& extent) {
  const int last = g.num_spatial - 1;
  int64_t offset = 0, step = extent[last];
  for (int d = last - 1; d >= 0; --d) {
    const int64_t i = widx[d] * g.strides[d] - g.pad_begin[d] + kidx[d] * g.dilations[d];
    if (i < 0 || i >= extent[d]) return -1;
    offset += i * step;
    step *= extent[d];
  }
  return offset;
}

// Sets widx[0 .. last) to the row-major index of line `outer` over dims
// count[0 .. last) (the spatial axes before the last).
inline void UnravelOuter(const std::vector<int64_t>& count, int64_t outer, int64_t* widx) {
  for (int d = static_cast<int>(count.size()) - 2; d >= 0; --d) {
    widx[d] = outer % count[d];
    outer /= count[d];
  }
}

// Advances widx[0 .. last) to the next line (row-major over count[0 .. last)).
inline void NextOuter(const std::vector<int64_t>& count, int64_t* widx) {
  for (int d = static_cast<int>(count.size()) - 2; d >= 0 && ++widx[d] == count[d]; --d) {
    widx[d] = 0;
  }
}

// --- implementation ---------------------------------------------------------

template <typename Acc, typename T>
inline Acc WidenTo(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<Acc>(v);
  } else {
    return static_cast<Acc>(LoadF(v));
  }
}

template <typename T, typename Acc>
void Im2Col(const T* x, const WindowGeometry& g, int64_t first_row, int64_t end_row,
            int64_t outer_lo, int64_t outer_hi, Acc* col, int64_t col_ld) {
  const int nd = g.num_spatial;
  const int64_t in_size = g.input_size();
  const int64_t out_last = g.output[nd - 1];
  const int64_t in_last = g.input[nd - 1];
  const int64_t s = g.strides[nd - 1];
  std::vector<int64_t> kidx(nd), oidx(nd);
  for (int64_t row = first_row; row < end_row; ++row) {
    const int64_t c = DecodeKernelRow(g, row, kidx.data());
    const T* xc = x + c * in_size;
    Acc* dst = col + row * col_ld;
    const LastAxisSpan span = LastAxisSpanOf(g, kidx[nd - 1], out_last, in_last);
    UnravelOuter(g.output, outer_lo, oidx.data());
    for (int64_t outer = outer_lo; outer < outer_hi; ++outer, dst += out_last) {
      const int64_t offset = OuterOffset(g, oidx.data(), kidx.data(), g.input);
      NextOuter(g.output, oidx.data());
      if (offset < 0) {
        std::fill(dst, dst + out_last, Acc(0));
        continue;
      }
      const T* src = xc + offset + span.shift;
      std::fill(dst, dst + span.lo, Acc(0));
      if constexpr (std::is_same_v<T, Acc>) {
        if (s == 1) {
          std::copy(src + span.lo, src + span.hi, dst + span.lo);
        } else {
          for (int64_t o = span.lo; o < span.hi; ++o) dst[o] = src[o * s];
        }
      } else if (s == 1) {
        for (int64_t o = span.lo; o < span.hi; ++o) dst[o] = WidenTo<Acc>(src[o]);
      } else {
        for (int64_t o = span.lo; o < span.hi; ++o) dst[o] = WidenTo<Acc>(src[o * s]);
      }
      std::fill(dst + span.hi, dst + out_last, Acc(0));
    }
  }
}

}  // namespace castor::cpu
