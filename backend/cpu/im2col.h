// im2col for the CPU Conv, ConvTranspose and pooling kernels: unrolling the
// windows of one image into the columns of a [C * prod(kernel),
// prod(output)] matrix so a convolution is one GEMM (several images side by
// side where each has few output positions), the padded grid of the 2-D
// window ops and the unpadded rows of narrow bfloat16 products, the pools'
// per-axis window tables and col2im's helpers.
// The window geometry itself is common/window_geometry.h (CUDA uses it too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/common/window_geometry.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/grid_conv.h"

namespace castor::cpu {

// For one spatial axis and each output index: the input indices its window
// reads (inside the input) and how many window positions lie inside the
// padded input (the pooling kernels and their gradients walk these).
struct AxisWindows {
  std::vector<int64_t> begin;  // output index o reads idx[begin[o] .. begin[o + 1])
  std::vector<int64_t> idx;
  std::vector<int64_t> padded_count;
};
std::vector<AxisWindows> BuildAxisWindows(const common::WindowGeometry& g);

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
void Im2Col(const T* x, const common::WindowGeometry& g, int64_t first_row, int64_t end_row,
            int64_t outer_lo, int64_t outer_hi, Acc* col, int64_t col_ld);

// Column-scratch budget (elements) of one task when (image, group) tasks
// run in parallel: about the size of a core's L2 cache.
inline constexpr int64_t kTileColumnElements = int64_t{1} << 17;

// Convs whose images have few output positions (the 1x1 and 2x2 maps a
// 32x32 input leaves in a ResNet's last stages): a product per image
// spends most of a vector's lanes, or of a GEMM's columns, on nothing, so
// conv.cc and conv_grad.cc lay the columns of several images side by side,
// [C * kernel, images * positions], and run one GEMM for all of them.
inline constexpr int64_t kFewOutputPositions = 16;
inline bool FewOutputPositions(const common::WindowGeometry& g) {
  return g.output_size() < kFewOutputPositions;
}
// Images per such GEMM for `rows` column rows: about 256 columns, the
// column matrix within 2 * kTileColumnElements, and as many groups of
// images as `threads` can share evenly.
int64_t ImagesPerColumnGemm(const common::WindowGeometry& g, int64_t rows, int64_t batch,
                            int64_t threads);

// A stored element as Acc (float or double); defined below.
template <typename Acc, typename T>
Acc WidenTo(T v);

// The columns of such an image, by a table of where each (tap, output
// position) reads. With `drop_dead_taps`, the kernel taps whose every read
// falls in the padding (all but the centre of a padded 3x3 kernel on a 1x1
// map) are left out: they add W * 0 to Y and dY * 0 to dW, and nothing to
// dX, so dropping them changes no value as long as those W and dY are
// finite (an Inf or NaN there would make the zeros NaN: callers keep the
// dead taps then). Column row c * taps().size() + t holds channel c at
// live tap taps()[t].
class FewPositionColumns {
 public:
  FewPositionColumns(const common::WindowGeometry& g, bool drop_dead_taps);
  // Kernel indices (row-major over the kernel dims) of the taps kept.
  const std::vector<int64_t>& taps() const { return taps_; }
  // Rows [0, channels * taps().size()) of the columns of one image x
  // [channels, input...], its positions at columns [0, output_size()) of
  // rows col_ld apart; zeros where a tap reads the padding.
  template <typename T>
  void Gather(const T* x, int64_t channels, T* col, int64_t col_ld) const {
    const int64_t taps = static_cast<int64_t>(taps_.size());
    for (int64_t c = 0; c < channels; ++c) {
      const T* plane = x + c * in_size_;
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t* at = reads_.data() + t * positions_;
        T* dst = col + (c * taps + t) * col_ld;
        for (int64_t q = 0; q < positions_; ++q) dst[q] = at[q] >= 0 ? plane[at[q]] : T{};
      }
    }
  }
  // Gather's adjoint: adds each column entry to the element it was read
  // from (entries in the padding go nowhere).
  void ScatterAdd(const float* col, int64_t col_ld, int64_t channels, float* x) const;

  // For W [rows, kernel_size] (rows = M * C): whether every entry at a
  // dropped tap is finite; W's kept taps, [rows, taps().size()]; and a
  // gradient of those added into dW [rows, kernel_size].
  template <typename T>
  bool DroppedTapsFinite(const T* w, int64_t rows) const {
    std::vector<char> kept(static_cast<size_t>(kernel_size_), 0);
    for (const int64_t tap : taps_) kept[tap] = 1;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t tap = 0; tap < kernel_size_; ++tap) {
        if (!kept[tap] && !std::isfinite(WidenTo<float>(w[r * kernel_size_ + tap]))) return false;
      }
    }
    return true;
  }
  template <typename T>
  void KeptTaps(const T* w, int64_t rows, T* out) const {
    const int64_t taps = static_cast<int64_t>(taps_.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < taps; ++t) out[r * taps + t] = w[r * kernel_size_ + taps_[t]];
    }
  }
  void AddKeptTaps(const float* kept, int64_t rows, float* dw) const;

 private:
  int64_t positions_ = 0, in_size_ = 0, kernel_size_ = 0;
  std::vector<int64_t> taps_;
  std::vector<int64_t> reads_;  // [tap][position]: the element of a channel plane, or -1
};

// The "padded grid" of a 2-D window op (Conv; ConvGrad's dW): one image
// copied into zero-padded phase planes, strides[0] * strides[1] per channel
// ([channels, s0, s1, rows, cols]; one plane per channel at unit strides),
// plus `slack` zeros after the last channel. Plane (a, b) holds the padded
// input's positions (i * s0 + a, j * s1 + b). Output position (oh, ow) is
// grid position oh * cols + ow; the cols - output[1] positions past each
// output line are extra. Kernel tap (kh, kw) at padded offset (th, tw) =
// (kh * d0, kw * d1) reads plane (th % s0, tw % s1) shifted by (th / s0,
// tw / s1), so row `row` = (c, kh, kw) of the column matrix over grid
// positions [q0, q1) is the contiguous slice padded + RowOffset(row) +
// [q0, q1): unrolling is a copy, or no copy at all for grid_conv.h's
// products, which read the slices in place. The extra
// positions read pads, the next line or (the last line, by up to `slack`)
// the next plane.
struct PaddedGrid {
  // True when `g` is 2-D.
  static bool Applies(const common::WindowGeometry& g) { return g.num_spatial == 2; }
  explicit PaddedGrid(const common::WindowGeometry& g)
      : geometry(&g),
        rows(g.output[0] + (g.kernel[0] - 1) * g.dilations[0] / g.strides[0]),
        cols(g.output[1] + (g.kernel[1] - 1) * g.dilations[1] / g.strides[1]),
        slack((g.kernel[1] - 1) * g.dilations[1] / g.strides[1]),
        used_phases_(static_cast<size_t>(g.strides[0] * g.strides[1]), 0) {
    // Phase (a, b) is read when some kernel row's offset is a mod s0 and
    // some kernel column's is b mod s1.
    std::vector<char> row_used(static_cast<size_t>(g.strides[0]), 0);
    std::vector<char> col_used(static_cast<size_t>(g.strides[1]), 0);
    for (int64_t k = 0; k < g.kernel[0]; ++k) row_used[k * g.dilations[0] % g.strides[0]] = 1;
    for (int64_t k = 0; k < g.kernel[1]; ++k) col_used[k * g.dilations[1] % g.strides[1]] = 1;
    for (int64_t a = 0; a < g.strides[0]; ++a) {
      for (int64_t b = 0; b < g.strides[1]; ++b) {
        used_phases_[a * g.strides[1] + b] = row_used[a] && col_used[b];
      }
    }
  }

  int64_t plane() const { return rows * cols; }
  // Elements of one channel's planes.
  int64_t channel_size() const { return geometry->strides[0] * geometry->strides[1] * plane(); }
  // Elements of the padded buffer of `channels` channels, slack included.
  int64_t buffer_size(int64_t channels) const { return channels * channel_size() + slack; }
  // Grid positions of output lines [0, lines).
  int64_t positions(int64_t lines) const { return lines * cols; }
  // Where row `row` = c * kernel_size + kh * kernel[1] + kw starts.
  int64_t RowOffset(int64_t row) const {
    const common::WindowGeometry& g = *geometry;
    const int64_t c = row / g.kernel_size(), k = row % g.kernel_size();
    const int64_t th = k / g.kernel[1] * g.dilations[0], tw = k % g.kernel[1] * g.dilations[1];
    const int64_t s0 = g.strides[0], s1 = g.strides[1];
    return c * channel_size() + (th % s0 * s1 + tw % s1) * plane() + th / s0 * cols + tw / s1;
  }
  // True when some kernel tap reads phase plane (a, b) (found once, by the
  // constructor: FillGrid asks per channel and phase).
  bool PhaseUsed(int64_t a, int64_t b) const {
    return used_phases_[a * geometry->strides[1] + b] != 0;
  }

  const common::WindowGeometry* geometry;
  int64_t rows, cols, slack;

 private:
  std::vector<char> used_phases_;  // [s0][s1]
};

// Whether a 2-D window op's products run over unpadded rows (grid_conv.h's
// GridConvForwardBFloat16PairRows) rather than on the padded grid: they
// can (unit strides, an output as wide as the input: pads left + right =
// (kernel width - 1) * dilation; at most kMaxRowShifts kernel columns),
// and they pay: their masked loads make a vector cost about a quarter more
// than the padded grid's (Zen 4: 76% of VDPBF16PS's peak per lane against
// 96%), so they take at most 4/5 of its vectors. Narrow images gain (7x7:
// 4 vectors against 7; 10x10: 7 against 10), 14x14 and 28x28 do not (13
// against 14, 49 against 56).
bool RowProductsPay(const common::WindowGeometry& g);

// The operand of grid_conv.h's pair products over unpadded rows: `planes`
// planes of `rows` lines of `width` bfloat16 pairs, plane k holding
// channels 2k and 2k + 1 of a source image [channels, lines, width] side
// by side, its lines at [top, top + lines) and zeros above and below. The
// product's depth step (plane, kh, kw), in that order, reads plane
// `plane` at line offset line_offsets[kh] from the output position's line
// and column shift column_shifts[kw] (pair_rows, shift_index, shifts:
// RowPositions'). Conv's forward reads X so (line offset kh * dilation,
// shift kw * dilation - left pad); ConvGrad's dX reads dY (conv_grad.cc).
class PairRowGrid {
 public:
  PairRowGrid(int64_t planes, int64_t rows, int64_t width, int64_t top,
              const std::vector<int64_t>& line_offsets, const std::vector<int64_t>& column_shifts);

  // Elements a buffer for Fill needs (the planes and the slack around them
  // that keeps every address a product forms inside it).
  int64_t buffer_size() const { return lead_ + planes_ * plane_ + trail_; }
  // Where the planes start in a buffer of buffer_size() (the `b` of
  // GridConvForwardBFloat16PairRows); zeros the slack around them.
  uint32_t* Planes(uint32_t* buffer) const;
  // Fills planes [plane_lo, plane_hi) from `source` (`channels` channels of
  // `lines` lines, each channel `channel_stride` elements after the last).
  void Fill(const BFloat16* source, int64_t channels, int64_t lines, int64_t channel_stride,
            int64_t plane_lo, int64_t plane_hi, uint32_t* planes) const;
  // Positions [begin, end) of the product.
  RowPositions Positions(int64_t begin, int64_t end) const;
  const int64_t* pair_rows() const { return pair_rows_.data(); }

 private:
  int64_t planes_, rows_, width_, top_, plane_;
  int64_t lead_ = 0, trail_ = 0;
  std::vector<int64_t> pair_rows_;
  std::vector<uint8_t> shift_index_;
  std::vector<int64_t> shifts_;
};

// Copies channels [channel_lo, channel_hi) of one image x [channels, in_h,
// in_w] (storage T; the grid geometry's input dims and begin pads) into
// their phase planes of `padded` as Acc, zeros where the padded input lies
// outside x. Planes no kernel tap reads are left as they are; the slack is
// not written.
template <typename T, typename Acc>
void FillGrid(const T* x, int64_t channel_lo, int64_t channel_hi, const PaddedGrid& grid,
              Acc* padded);

// FillGrid for the bfloat16 products on channel pairs (grid_conv.h's
// GridConvForwardBFloat16Pairs): channel pairs [pair_lo, pair_hi) of one
// bfloat16 image x [channels, in_h, in_w] onto `pairs`, where pair k's
// planes start at k * grid.channel_size() and each position holds channels
// 2k and 2k + 1 side by side (BFloat16Pair; zeros for a channel past
// `channels`, so an odd last channel pairs with zeros). Planes no kernel
// tap reads are left as they are; the slack is not written.
void FillPairGrid(const BFloat16* x, int64_t channels, int64_t pair_lo, int64_t pair_hi,
                  const PaddedGrid& grid, uint32_t* pairs);

// One zero-padded float32 plane [rows, cols] in a single pass: plane row i
// holds the first in_w floats of src line i - top (in_h lines, src_stride
// floats apart) at columns [left, left + in_w), zeros elsewhere. True when
// it ran: AVX-512 whole-vector masked loads and stores (grid_conv.h's active
// instruction set), so each row is written once, zeros included; false
// (nothing written) otherwise.
bool FillPaddedPlaneVector(const float* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, float* dst);

// The same for 16-bit elements (float16, bfloat16 bits), where the CPU has
// AVX512-BW besides.
bool FillPaddedPlaneVector(const uint16_t* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, uint16_t* dst);

// A pair of bfloat16 planes (first, second; the same in_h, in_w and
// src_stride) as one zero-padded plane of pairs [rows, cols]: position
// (i, j) holds BFloat16Pair(first's, second's element at line i - top,
// column j - left) where that lies inside the planes, zeros elsewhere;
// without `second` its halves are zeros. AVX-512 masked loads, permutes
// and stores (grid_conv.h's active instruction set, with AVX512-BW), each
// row written once; elsewhere a scalar loop.
void FillPaddedPairPlane(const BFloat16* first, const BFloat16* second, int64_t in_h,
                         int64_t in_w, int64_t src_stride, int64_t top, int64_t left,
                         int64_t rows, int64_t cols, uint32_t* dst);

// For each of `lines` rows of n elements (row l at src + l * n):
// dst[l * dst_stride + j * step] = src[l * n + j] for j in [0, n); the
// positions between are not written. Stride 2 runs in AVX-512 masked
// stores when grid_conv.h's active instruction set is AVX-512 (16-bit
// elements: with AVX512-BW besides).
void SpreadRows(const float* src, int64_t n, int64_t lines, int64_t step, float* dst,
                int64_t dst_stride);
void SpreadRows(const uint16_t* src, int64_t n, int64_t lines, int64_t step, uint16_t* dst,
                int64_t dst_stride);

// The inverse for 16-bit elements and step 2: for each of `lines` rows,
// dst[l * dst_stride + j] = src[l * src_stride + 2 j] for j in [0, n).
// AVX-512 masked loads and a narrowing store per 16 elements where the CPU
// has AVX512-BW (grid_conv.h's active instruction set); reads nothing past
// each row's last element.
void GatherEveryOther(const uint16_t* src, int64_t src_stride, int64_t n, int64_t lines,
                      uint16_t* dst, int64_t dst_stride);

// --- helpers shared with col2im (conv.cc) -----------------------------------

// The channel of unrolled row `row` (= channel * kernel_size() + kernel
// offset, row-major over the kernel axes); kidx[d] receives the kernel index
// along each spatial axis d.
inline int64_t DecodeKernelRow(const common::WindowGeometry& g, int64_t row, int64_t* kidx) {
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
inline LastAxisSpan LastAxisSpanOf(const common::WindowGeometry& g, int64_t k, int64_t count,
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
inline int64_t OuterOffset(const common::WindowGeometry& g, const int64_t* widx,
                           const int64_t* kidx, const std::vector<int64_t>& extent) {
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
  if constexpr (std::is_same_v<T, Acc>) {
    return v;
  } else if constexpr (std::is_same_v<T, double>) {
    return static_cast<Acc>(v);
  } else {
    return static_cast<Acc>(LoadF(v));
  }
}

template <typename T, typename Acc>
void FillGrid(const T* x, int64_t channel_lo, int64_t channel_hi, const PaddedGrid& grid,
              Acc* padded) {
  const common::WindowGeometry& g = *grid.geometry;
  const int64_t in_h = g.input[0], in_w = g.input[1];
  const int64_t s0 = g.strides[0], s1 = g.strides[1];
  const int64_t rows = grid.rows, cols = grid.cols;
  for (int64_t c = channel_lo; c < channel_hi; ++c) {
    const T* src = x + c * in_h * in_w;
    for (int64_t a = 0; a < s0; ++a) {
      for (int64_t b = 0; b < s1; ++b) {
        if (!grid.PhaseUsed(a, b)) continue;
        Acc* dst = padded + c * grid.channel_size() + (a * s1 + b) * grid.plane();
        if constexpr (std::is_same_v<T, float> && std::is_same_v<Acc, float>) {
          if (s0 == 1 && s1 == 1 &&
              FillPaddedPlaneVector(src, in_h, in_w, in_w, g.pad_begin[0], g.pad_begin[1], rows,
                                    cols, dst)) {
            continue;
          }
        } else if constexpr (std::is_same_v<T, Acc> && sizeof(T) == 2) {  // 16-bit bits
          if (s0 == 1 && s1 == 1 &&
              FillPaddedPlaneVector(reinterpret_cast<const uint16_t*>(src), in_h, in_w, in_w,
                                    g.pad_begin[0], g.pad_begin[1], rows, cols,
                                    reinterpret_cast<uint16_t*>(dst))) {
            continue;
          }
        }
        // The plane zeroed in one go, then the input's part copied: per-row
        // border fills of a float or two cost a memset call apiece.
        std::fill(dst, dst + grid.plane(), Acc{});
        // Plane columns j with input column j * s1 + b - left inside [0, in_w).
        const int64_t left = g.pad_begin[1] - b;
        const int64_t j_lo = std::clamp<int64_t>((left + s1 - 1) / s1, 0, cols);
        const int64_t j_hi = std::clamp<int64_t>((in_w + left + s1 - 1) / s1, j_lo, cols);
        if constexpr (std::is_same_v<T, Acc> && sizeof(T) == 2) {  // 16-bit bits
          if (s1 == 2) {  // the plane's rows with an input line, in one call
            const int64_t top = g.pad_begin[0] - a;  // row i reads line i * s0 - top
            const int64_t i_lo = std::clamp<int64_t>((top + s0 - 1) / s0, 0, rows);
            const int64_t i_hi = std::clamp<int64_t>((in_h + top + s0 - 1) / s0, i_lo, rows);
            if (i_lo < i_hi && j_lo < j_hi) {
              const T* first = src + (i_lo * s0 - top) * in_w + j_lo * s1 - left;
              GatherEveryOther(reinterpret_cast<const uint16_t*>(first), s0 * in_w, j_hi - j_lo,
                               i_hi - i_lo, reinterpret_cast<uint16_t*>(dst + i_lo * cols + j_lo),
                               cols);
            }
            continue;
          }
        }
        for (int64_t i = 0; i < rows; ++i, dst += cols) {
          const int64_t ih = i * s0 + a - g.pad_begin[0];
          if (ih < 0 || ih >= in_h) continue;
          const T* line = src + ih * in_w;  // plane column j reads line[j * s1 - left]
          if (s1 == 1) {  // contiguous: a copy the compiler vectorizes
            for (int64_t j = j_lo; j < j_hi; ++j) dst[j] = WidenTo<Acc>(line[j - left]);
          } else {
            for (int64_t j = j_lo; j < j_hi; ++j) dst[j] = WidenTo<Acc>(line[j * s1 - left]);
          }
        }
      }
    }
  }
}

template <typename T, typename Acc>
void Im2Col(const T* x, const common::WindowGeometry& g, int64_t first_row, int64_t end_row,
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
        std::fill(dst, dst + out_last, Acc{});
        continue;
      }
      const T* src = xc + offset + span.shift;
      std::fill(dst, dst + span.lo, Acc{});
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
      std::fill(dst + span.hi, dst + out_last, Acc{});
    }
  }
}

}  // namespace castor::cpu
