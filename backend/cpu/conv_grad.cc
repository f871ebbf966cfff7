// CPU kernel of ConvGrad (castor's gradient op, graph/ops/gradient_ops.cc):
// per (image, group), dW += dY_g * im2col(X_g)^T and dX_g =
// col2im(W_g^T * dY_g) with im2col.h's geometry and gemm.h's Sgemm; 2-D
// convs use grid_conv.h's direct products instead where a vector kernel
// runs (dW from X copied onto the padded grid, up to 8 images per product;
// dX per stride phase from dY, each group's images right after their dW
// product, while their dY is in cache; see ConvGradOnGrid). The images run in
// slices on the thread pool (a partial dW per slice), or one after another
// with split GEMMs (and split grid products) when there is a single image.
// 16-bit X, dY and W are widened to float32 up front with float_io.h's
// vector conversions (a float32 copy of each, in scratch.h's PooledBuffer);
// outputs nothing reads are skipped (KernelContext::output_read), and
// every output rounds once on store. bfloat16 X, dY and W of a 2-D conv on
// a CPU with AVX512-BF16 take the grid's bfloat16 products as stored (dW
// from X's bfloat16 grid, dX from dY paired by output channel; float32
// sums); elsewhere, where gemm.h has a native bfloat16 kernel (AMX,
// AVX512-BF16), they are multiplied as stored on it, summing in float32
// (RunConvGradBFloat16Native); the widened path is the fallback
// (CASTOR_AVX512BF16=off, CASTOR_AMX=off, or VDPBF16PS slower than
// float32). Narrow bfloat16 images that keep their width take dX over
// unpadded rows (ConvGradOnGrid), and images with few output positions
// (im2col.h's FewOutputPositions) put several images' columns side by side
// in one GEMM, bfloat16 as stored, other dtypes widened
// (RunConvGradOnImageColumns).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "backend/common/window_geometry.h"
#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/batch_norm_loops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/grid_conv.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/parallel.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// ---- ConvGrad ----------------------------------------------------------------

// Scatter-adds col [channels * kernel_size, output_size] (Im2Col's layout)
// into the image x [channels, input...]: Im2Col's transpose.
void Col2ImAdd(const float* col, const common::WindowGeometry& g, int64_t rows, float* x) {
  const int nd = g.num_spatial;
  const int64_t in_size = g.input_size();
  const int64_t out_size = g.output_size();
  const int64_t out_last = g.output[nd - 1];
  const int64_t in_last = g.input[nd - 1];
  const int64_t outer_count = out_size / out_last;
  const int64_t s = g.strides[nd - 1];
  std::vector<int64_t> kidx(nd), oidx(nd);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t c = DecodeKernelRow(g, row, kidx.data());
    float* plane = x + c * in_size;
    const LastAxisSpan span = LastAxisSpanOf(g, kidx[nd - 1], out_last, in_last);
    UnravelOuter(g.output, 0, oidx.data());
    for (int64_t outer = 0; outer < outer_count; ++outer) {
      const int64_t offset = OuterOffset(g, oidx.data(), kidx.data(), g.input);
      NextOuter(g.output, oidx.data());
      if (offset < 0) continue;
      const float* src = col + row * out_size + outer * out_last;
      float* dst = plane + offset + span.shift;
      for (int64_t o = span.lo; o < span.hi; ++o) dst[o * s] += src[o];
    }
  }
}

struct ConvGradShapes {
  int64_t batch, channels, out_channels, group;
};

// True when ConvGrad takes ConvGradOnGrid's products (2-D, and a vector
// kernel runs: grid_conv.h's UseGridProducts); else the column path.
bool UsesGrid(const common::WindowGeometry& g) {
  return PaddedGrid::Applies(g) && UseGridProducts();
}

// The direct products (grid_conv.h) of a 2-D ConvGrad, set up once per call.
//
// dW_g += dY_g * columns(X_g)^T reads the column rows in place from X_g
// copied onto the conv's grid (im2col.h's PaddedGrid: phase planes when
// strided).
//
// dX_g is the conv's transpose, computed as forward products on dY_g, one
// per stride phase. Along an axis (stride s, tap offsets t = k * dilation,
// begin pad p), input position i sits at padded position u = i + p = v * s
// + phi; the taps that reach it are those with t % s == phi, from output
// v - t / s. So for each phase (phi0, phi1):
//   dX[u] = sum_{m, taps of the phase} W[m][c][tap] * dY[m][v - t / s],
// a forward product over dY copied once into a zero-bordered buffer with
// `shift` = max(t / s) rows and columns before it (tap t reads at offset
// shift - t / s). Phase positions are dX lines of stride s0 rows; they are
// written in place when s1 == 1, else gathered in a scratch and spread.
// Where some phase has no tap (a 1x1 conv of stride 2: three phases of
// four), the image's dX is zeroed first and those phases are skipped, so
// every dX element is written. A narrow bfloat16 conv that keeps its width
// at unit strides (im2col.h's RowProductsPay) reads dY from unpadded rows
// instead (im2col.h's PairRowGrid): the same sums in fewer vectors.
class ConvGradOnGrid {
 public:
  // W as stored: float32, or bfloat16 for the bfloat16 products (then
  // the phases keep W in pairs of output channels).
  template <typename T>
  ConvGradOnGrid(const common::WindowGeometry& g, const ConvGradShapes& s, const T* w)
      : g_(g), x_grid_(g_), cg_(s.channels / s.group), mg_(s.out_channels / s.group) {
    const int64_t kernel_size = g_.kernel_size();
    for (int64_t row = 0; row < cg_ * kernel_size; ++row) x_rows_.push_back(x_grid_.RowOffset(row));
    // dY's buffer: `shift` zeros before it along each axis, and room for
    // the largest phase position v.
    int64_t shift[2], size[2];
    for (int d = 0; d < 2; ++d) {
      shift[d] = (g_.kernel[d] - 1) * g_.dilations[d] / g_.strides[d];
      size[d] = (g_.pad_begin[d] + g_.input[d] - 1) / g_.strides[d] + shift[d] + 1;
      dy_shift_[d] = shift[d];
    }
    dy_rows_ = size[0];
    dy_cols_ = size[1];
    const int64_t plane = dy_rows_ * dy_cols_;
    for (int64_t phi0 = 0; phi0 < g_.strides[0]; ++phi0) {
      for (int64_t phi1 = 0; phi1 < g_.strides[1]; ++phi1) {
        Phase phase;
        const int64_t phi[2] = {phi0, phi1};
        int64_t first[2], last[2];  // phase positions v, inclusive
        for (int d = 0; d < 2; ++d) {
          const int64_t s_d = g_.strides[d];
          first[d] = std::max<int64_t>(0, CeilDiv(g_.pad_begin[d] - phi[d], s_d));
          last[d] = (g_.pad_begin[d] + g_.input[d] - 1 - phi[d]) / s_d;
        }
        if (g_.pad_begin[0] + g_.input[0] - 1 < phi0 || g_.pad_begin[1] + g_.input[1] - 1 < phi1 ||
            last[0] < first[0] || last[1] < first[1]) {
          continue;  // no dX position in this phase
        }
        phase.lines = last[0] - first[0] + 1;
        phase.width = last[1] - first[1] + 1;
        phase.gathered = first[0] * dy_cols_ + first[1];
        phase.dx_row = first[0] * g_.strides[0] + phi0 - g_.pad_begin[0];
        phase.dx_col = first[1] * g_.strides[1] + phi1 - g_.pad_begin[1];
        std::vector<int64_t> taps;
        for (int64_t kh = 0; kh < g_.kernel[0]; ++kh) {
          const int64_t t0 = kh * g_.dilations[0];
          if (t0 % g_.strides[0] != phi0) continue;
          for (int64_t kw = 0; kw < g_.kernel[1]; ++kw) {
            const int64_t t1 = kw * g_.dilations[1];
            if (t1 % g_.strides[1] != phi1) continue;
            taps.push_back(kh * g_.kernel[1] + kw);
            phase.tap_offsets.push_back((shift[0] - t0 / g_.strides[0]) * dy_cols_ + shift[1] -
                                        t1 / g_.strides[1]);
          }
        }
        const int64_t num_taps = static_cast<int64_t>(taps.size());
        // dY's rows (float32: one per output channel; bfloat16: one per pair).
        const int64_t dy_rows = std::is_same_v<T, float> ? mg_ : (mg_ + 1) / 2;
        for (int64_t m = 0; m < dy_rows; ++m) {
          for (int64_t j = 0; j < num_taps; ++j) {
            phase.b_rows.push_back(m * plane + phase.tap_offsets[j]);
          }
        }
        // float32: a[gi][c][m * num_taps + j] = W[gi * mg + m][c][taps[j]];
        // bfloat16: pairs[gi][c][m * num_taps + j] pairs W[gi * mg + 2m]'s
        // and W[gi * mg + 2m + 1]'s (zeros past mg).
        const int64_t depth = dy_rows * num_taps;
        if constexpr (std::is_same_v<T, float>) {
          phase.a.resize(static_cast<size_t>(s.group * cg_ * depth));
        } else {
          phase.pairs.resize(static_cast<size_t>(s.group * cg_ * depth));
        }
        for (int64_t gi = 0; gi < s.group; ++gi) {
          for (int64_t c = 0; c < cg_; ++c) {
            for (int64_t m = 0; m < dy_rows; ++m) {
              const int64_t at = (gi * cg_ + c) * depth + m * num_taps;
              if constexpr (std::is_same_v<T, float>) {
                const float* src = w + ((gi * mg_ + m) * cg_ + c) * kernel_size;
                for (int64_t j = 0; j < num_taps; ++j) phase.a[at + j] = src[taps[j]];
              } else {
                const T* first = w + ((gi * mg_ + 2 * m) * cg_ + c) * kernel_size;
                const T* second = 2 * m + 1 < mg_ ? first + cg_ * kernel_size : nullptr;
                for (int64_t j = 0; j < num_taps; ++j) {
                  phase.pairs[at + j] = BFloat16Pair(
                      first[taps[j]].bits, second != nullptr ? second[taps[j]].bits : uint16_t{0});
                }
              }
            }
          }
        }
        has_empty_phase_ |= phase.tap_offsets.empty();
        phases_.push_back(std::move(phase));
      }
    }
    // bfloat16 dX of a narrow conv that keeps its width: dY's pairs on
    // unpadded rows (the single phase's taps, in its depth order), where
    // dX line i reads dY line i + pad - kh * dilation and column shift
    // pad - kw * dilation, below `top` zero lines.
    if constexpr (!std::is_same_v<T, float>) {
      if (RowProductsPay(g_)) {
        const int64_t top = std::max<int64_t>(0, (g_.kernel[0] - 1) * g_.dilations[0] -
                                                     g_.pad_begin[0]);
        std::vector<int64_t> line_offsets, column_shifts;
        for (int64_t kh = 0; kh < g_.kernel[0]; ++kh) {
          line_offsets.push_back(g_.pad_begin[0] - kh * g_.dilations[0] + top);
        }
        for (int64_t kw = 0; kw < g_.kernel[1]; ++kw) {
          column_shifts.push_back(g_.pad_begin[1] - kw * g_.dilations[1]);
        }
        const int64_t rows = std::max(top + g_.output[0], g_.input[0] + g_.pad_begin[0] + top);
        dy_row_grid_.emplace((mg_ + 1) / 2, rows, g_.output[1], top, line_offsets, column_shifts);
      }
    }
  }

  // How many images one AddFilterGrad call should take: enough positions
  // that each dW entry's vector lanes are added up once per ~2048 of them
  // (a 14x14 image alone spent a fifth of its time there), at most 8.
  int64_t ImagesPerFilterGrad() const {
    return std::clamp<int64_t>(2048 / std::max<int64_t>(1, g_.output_size()), 1, 8);
  }

  // dW_g [mg, cg * kernel_size] += sum over `images` images of dY_g *
  // columns(X_g)^T, for one group: image i's X_g at x_g + i * x_stride and
  // dY_g at dy_g + i * dy_stride (the columns split across threads when the
  // caller runs alone).
  // X and dY float32, or bfloat16 for the bfloat16 products (then X's grid
  // holds bfloat16).
  template <typename T>
  void AddFilterGrad(const T* x_g, int64_t x_stride, const T* dy_g, int64_t dy_stride,
                     int64_t images, float* dw_g) const {
    thread_local std::vector<T> padded;
    const int64_t grid_size = cg_ * x_grid_.channel_size();
    padded.resize(static_cast<size_t>(images * grid_size));
    for (int64_t i = 0; i < images; ++i) {
      FillGrid<T, T>(x_g + i * x_stride, 0, cg_, x_grid_, padded.data() + i * grid_size);
    }
    const T* b = padded.data();
    const GridLines lines{g_.output[0], g_.output[1], x_grid_.cols, g_.output[1]};
    const GridImages image_strides{images, grid_size, dy_stride};
    const int64_t kg = static_cast<int64_t>(x_rows_.size());
    // Split in whole blocks of 12 columns (a multiple of every kernel's
    // column block), so a thread's share has no leftover columns but the last.
    constexpr int64_t kSplit = 12;
    ParallelFor(0, (kg + kSplit - 1) / kSplit, 1, [&](int64_t lo, int64_t hi) {
      const int64_t k0 = lo * kSplit, k1 = std::min(kg, hi * kSplit);
      if constexpr (std::is_same_v<T, float>) {
        GridConvFilterGrad(mg_, k1 - k0, dy_g, g_.output_size(), b, x_rows_.data() + k0, lines,
                           image_strides, dw_g + k0, kg);
      } else {
        GridConvFilterGradBFloat16(mg_, k1 - k0, &dy_g->bits, g_.output_size(), &b->bits,
                                   x_rows_.data() + k0, lines, image_strides, dw_g + k0, kg);
      }
    });
  }

  // Writes all of dX_g [cg, input] of group gi for one image (the lines of
  // each phase split across threads when the caller runs alone).
  // dY and dX float32, or bfloat16 for the bfloat16 products (then dY's
  // buffer holds pairs of output channels, and each dX element is summed
  // in float32 and rounded once as the products store it).
  template <typename T>
  void FillInputGrad(int64_t gi, const T* dy_g, T* dx_g) const {
    const int64_t out_h = g_.output[0], out_w = g_.output[1];
    if constexpr (!std::is_same_v<T, float>) {
      if (dy_row_grid_.has_value()) {
        FillInputGradOnRows(gi, dy_g, dx_g);
        return;
      }
    }
    const int64_t plane = dy_rows_ * dy_cols_;
    using Buffered = std::conditional_t<std::is_same_v<T, float>, float, uint32_t>;
    const int64_t buffered_rows = std::is_same_v<T, float> ? mg_ : (mg_ + 1) / 2;
    thread_local std::vector<Buffered> padded;
    thread_local std::vector<T> scratch;
    padded.resize(static_cast<size_t>(buffered_rows * plane + kGridReadSlack));
    std::fill(padded.begin() + buffered_rows * plane, padded.end(), Buffered{0});
    // dY's lines and columns that fit in the buffer.
    const int64_t lines_in = std::clamp<int64_t>(dy_rows_ - dy_shift_[0], 0, out_h);
    const int64_t width_in = std::clamp<int64_t>(dy_cols_ - dy_shift_[1], 0, out_w);
    for (int64_t m = 0; m < buffered_rows; ++m) {
      Buffered* dst = padded.data() + m * plane;
      if constexpr (std::is_same_v<T, float>) {
        const float* src = dy_g + m * out_h * out_w;
        if (FillPaddedPlaneVector(src, lines_in, width_in, out_w, dy_shift_[0], dy_shift_[1],
                                  dy_rows_, dy_cols_, dst)) {
          continue;
        }
        std::fill(dst, dst + plane, 0.0f);
        for (int64_t oh = 0; oh < lines_in; ++oh) {
          std::copy(src + oh * out_w, src + oh * out_w + width_in,
                    dst + (oh + dy_shift_[0]) * dy_cols_ + dy_shift_[1]);
        }
      } else {
        const T* first = dy_g + 2 * m * out_h * out_w;
        FillPaddedPairPlane(first, 2 * m + 1 < mg_ ? first + out_h * out_w : nullptr, lines_in,
                            width_in, out_w, dy_shift_[0], dy_shift_[1], dy_rows_, dy_cols_, dst);
      }
    }
    const int64_t in_w = g_.input[1], in_size = g_.input_size();
    const int64_t s0 = g_.strides[0], s1 = g_.strides[1];
    if (has_empty_phase_) std::fill(dx_g, dx_g + cg_ * in_size, T{});
    for (const Phase& phase : phases_) {
      const int64_t depth = static_cast<int64_t>(phase.b_rows.size());
      if (phase.tap_offsets.empty()) continue;  // zeros, written above
      const Buffered* b = padded.data() + phase.gathered;
      T* out = dx_g + phase.dx_row * in_w + phase.dx_col;
      int64_t ld_out = in_size, dense_stride = s0 * in_w;
      if (s1 != 1) {  // gathered in [cg, lines, width], spread below
        scratch.resize(static_cast<size_t>(cg_ * phase.lines * phase.width));
        out = scratch.data();
        ld_out = phase.lines * phase.width;
        dense_stride = phase.width;
      }
      ParallelFor(0, phase.lines, 1, [&](int64_t lo, int64_t hi) {
        const GridLines lines{hi - lo, phase.width, dy_cols_, dense_stride};
        if constexpr (std::is_same_v<T, float>) {
          GridConvForward(cg_, depth, phase.a.data() + gi * cg_ * depth, depth,
                          b + lo * dy_cols_, phase.b_rows.data(), lines, nullptr,
                          out + lo * dense_stride, ld_out);
        } else {
          GridConvForwardBFloat16Pairs(cg_, depth, phase.pairs.data() + gi * cg_ * depth, depth,
                                       b + lo * dy_cols_, phase.b_rows.data(), lines, nullptr,
                                       out + lo * dense_stride, ld_out);
        }
      });
      if (s1 == 1) continue;
      for (int64_t c = 0; c < cg_; ++c) {
        const T* from = scratch.data() + c * phase.lines * phase.width;
        T* to = dx_g + c * in_size + phase.dx_row * in_w + phase.dx_col;
        if constexpr (std::is_same_v<T, float>) {
          SpreadRows(from, phase.width, phase.lines, s1, to, s0 * in_w);
        } else {
          SpreadRows(&from->bits, phase.width, phase.lines, s1, &to->bits, s0 * in_w);
        }
      }
    }
  }

 private:
  static int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

  // FillInputGrad's bfloat16 dX over unpadded rows (dy_row_grid_): the
  // single phase's products over dX's dense positions.
  void FillInputGradOnRows(int64_t gi, const BFloat16* dy_g, BFloat16* dx_g) const {
    const PairRowGrid& grid = *dy_row_grid_;
    const Phase& phase = phases_.front();
    const int64_t depth = static_cast<int64_t>(phase.b_rows.size());
    const int64_t out_size = g_.output_size(), in_size = g_.input_size();
    thread_local std::vector<uint32_t> buffer;
    buffer.resize(static_cast<size_t>(grid.buffer_size()));
    uint32_t* planes = grid.Planes(buffer.data());
    grid.Fill(dy_g, mg_, g_.output[0], out_size, 0, (mg_ + 1) / 2, planes);
    ParallelFor(0, (in_size + 15) / 16, 1, [&](int64_t lo, int64_t hi) {
      GridConvForwardBFloat16PairRows(cg_, depth, phase.pairs.data() + gi * cg_ * depth, depth,
                                      planes, grid.pair_rows(),
                                      grid.Positions(lo * 16, std::min(in_size, hi * 16)),
                                      nullptr, dx_g, in_size);
    });
  }

  // One stride phase of dX: its positions (lines x width, the first at
  // dX (dx_row, dx_col) and dY-buffer offset `gathered`) and taps.
  struct Phase {
    int64_t lines = 0, width = 0, gathered = 0, dx_row = 0, dx_col = 0;
    std::vector<int64_t> tap_offsets;  // per tap: its offset in a dY plane
    std::vector<int64_t> b_rows;       // (m, tap): m * plane + tap offset (m: a pair)
    std::vector<float> a;              // [group][cg][mg * taps]: W's entries (float32)
    std::vector<uint32_t> pairs;       // [group][cg][pairs * taps]: W's pairs (bfloat16)
  };

  const common::WindowGeometry& g_;
  const PaddedGrid x_grid_;
  const int64_t cg_, mg_;
  std::vector<int64_t> x_rows_;  // column row k of X_g: padded + x_rows_[k]
  int64_t dy_shift_[2] = {0, 0};  // zeros before dY in its buffer, per axis
  int64_t dy_rows_ = 0, dy_cols_ = 0;
  std::vector<Phase> phases_;
  bool has_empty_phase_ = false;  // some phase has no tap: its dX stays zero
  std::optional<PairRowGrid> dy_row_grid_;  // bfloat16 dX over unpadded rows
};

// dX, dW, dB (float32) of X, dY and W in float32, or in bfloat16 where
// ConvGradOnGrid's bfloat16 products run (UsesBFloat16Grid: the grid, no
// column path); then dX is bfloat16, each element summed in float32 and
// rounded once as the products store it.
template <typename T>
void RunConvGrad(const common::WindowGeometry& g, const ConvGradShapes& s, const T* x,
                 const T* dy, const T* w, T* dx, float* dw, float* db) {
  const int64_t cg = s.channels / s.group;
  const int64_t mg = s.out_channels / s.group;
  const int64_t kg = cg * g.kernel_size();
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const int64_t lines = p / g.output[g.num_spatial - 1];
  const int64_t w_size = s.out_channels * kg;
  const int64_t slices = SliceCount(s.batch);
  std::optional<ConvGradOnGrid> grid;
  if (UsesGrid(g) && (dx != nullptr || dw != nullptr)) grid.emplace(g, s, w);
  // Per slice: partial dW and dB (slice 0 writes the outputs directly).
  std::vector<std::vector<float>> dw_parts(static_cast<size_t>(slices)),
      db_parts(static_cast<size_t>(slices));
  auto run_slice = [&](int64_t slice) {
    float* dw_acc = dw;
    float* db_acc = db;
    if (slice > 0) {
      if (dw != nullptr) {
        dw_parts[slice].assign(static_cast<size_t>(w_size), 0.0f);
        dw_acc = dw_parts[slice].data();
      }
      if (db != nullptr) {
        db_parts[slice].assign(static_cast<size_t>(s.out_channels), 0.0f);
        db_acc = db_parts[slice].data();
      }
    }
    const int64_t first = SliceBegin(slice, slices, s.batch);
    const int64_t last = SliceBegin(slice + 1, slices, s.batch);
    std::vector<float> col, dcol, dy_row;
    // The grid's filter gradient takes a few images at a time; their dX and
    // dB follow at once, while their dY is still in cache.
    const int64_t chunk = grid.has_value() ? grid->ImagesPerFilterGrad() : 1;
    for (int64_t n0 = first; n0 < last; n0 += chunk) {
      const int64_t n1 = std::min(last, n0 + chunk);
      if (dw_acc != nullptr && grid.has_value()) {
        for (int64_t gi = 0; gi < s.group; ++gi) {
          grid->AddFilterGrad(x + (n0 * s.channels + gi * cg) * in_size, s.channels * in_size,
                              dy + (n0 * s.out_channels + gi * mg) * p, s.out_channels * p,
                              n1 - n0, dw_acc + gi * mg * kg);
        }
      }
      for (int64_t n = n0; n < n1; ++n) {
        for (int64_t gi = 0; gi < s.group; ++gi) {
          const T* x_g = x + (n * s.channels + gi * cg) * in_size;
          const T* dy_g = dy + (n * s.out_channels + gi * mg) * p;
          T* dx_g = dx != nullptr ? dx + (n * s.channels + gi * cg) * in_size : nullptr;
          if (dx_g != nullptr && grid.has_value()) grid->FillInputGrad(gi, dy_g, dx_g);
          if constexpr (std::is_same_v<T, float>) {
            if (dw_acc != nullptr && !grid.has_value()) {
              col.resize(static_cast<size_t>(kg * p));
              Im2Col<float, float>(x_g, g, 0, kg, 0, lines, col.data(), p);
              // dW_g [mg, kg] += dY_g [mg, p] * col^T [p, kg]
              Sgemm(false, true, mg, kg, p, 1.0f, dy_g, p, col.data(), p, 1.0f,
                    dw_acc + gi * mg * kg, kg);
            }
            if (dx_g != nullptr && !grid.has_value()) {
              dcol.resize(static_cast<size_t>(kg * p));
              // dcol [kg, p] = W_g^T [kg, mg] * dY_g [mg, p]
              Sgemm(true, false, kg, p, mg, 1.0f, w + gi * mg * kg, kg, dy_g, p, 0.0f,
                    dcol.data(), p);
              Col2ImAdd(dcol.data(), g, kg, dx_g);
            }
          }
          if (db_acc != nullptr) {  // dY's row sums
            for (int64_t m = 0; m < mg; ++m) {
              const float* row = nullptr;
              if constexpr (std::is_same_v<T, float>) {
                row = dy_g + m * p;
              } else {
                dy_row.resize(static_cast<size_t>(p));
                ToFloat32(dy_g + m * p, dy_row.data(), p);
                row = dy_row.data();
              }
              db_acc[gi * mg + m] += static_cast<float>(RowSum(row, p));
            }
          }
        }
      }
    }
  };
  ForEachSlice(slices, run_slice);
  for (int64_t slice = 1; slice < slices; ++slice) {
    if (dw != nullptr) {
      for (int64_t i = 0; i < w_size; ++i) dw[i] += dw_parts[slice][i];
    }
    if (db != nullptr) {
      for (int64_t m = 0; m < s.out_channels; ++m) db[m] += db_parts[slice][m];
    }
  }
}

// Whether bfloat16 GEMMs run on a native kernel (AMX or AVX512-BF16;
// gemm.h): then a bfloat16 ConvGrad multiplies X, dY and W as stored.
bool NativeBFloat16Gemm() { return AmxBf16Available() || Avx512Bf16Available(); }

// RunConvGrad for bfloat16 X, dY and W on the native bfloat16 GEMM (float32
// accumulation), into float32 dX, dW, dB: per image and group, dW_g +=
// dY_g * im2col(X_g)^T with the columns unrolled in bfloat16 (Im2Col copies
// the bits), and dX_g = col2im(W_g^T * dY_g) from a float32 dcol. dB sums
// dY's rows widened a row at a time. Slices of images as RunConvGrad.
void RunConvGradBFloat16Native(const common::WindowGeometry& g, const ConvGradShapes& s,
                               const BFloat16* x, const BFloat16* dy, const BFloat16* w,
                               float* dx, float* dw, float* db) {
  const int64_t cg = s.channels / s.group;
  const int64_t mg = s.out_channels / s.group;
  const int64_t kg = cg * g.kernel_size();
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const int64_t lines = p / g.output[g.num_spatial - 1];
  const int64_t w_size = s.out_channels * kg;
  const int64_t slices = SliceCount(s.batch);
  std::vector<std::vector<float>> dw_parts(static_cast<size_t>(slices)),
      db_parts(static_cast<size_t>(slices));
  auto run_slice = [&](int64_t slice) {
    float* dw_acc = dw;
    float* db_acc = db;
    if (slice > 0) {
      if (dw != nullptr) {
        dw_parts[slice].assign(static_cast<size_t>(w_size), 0.0f);
        dw_acc = dw_parts[slice].data();
      }
      if (db != nullptr) {
        db_parts[slice].assign(static_cast<size_t>(s.out_channels), 0.0f);
        db_acc = db_parts[slice].data();
      }
    }
    std::vector<BFloat16> col;
    std::vector<float> dcol, dy_row;
    for (int64_t n = SliceBegin(slice, slices, s.batch);
         n < SliceBegin(slice + 1, slices, s.batch); ++n) {
      for (int64_t gi = 0; gi < s.group; ++gi) {
        const BFloat16* x_g = x + (n * s.channels + gi * cg) * in_size;
        const BFloat16* dy_g = dy + (n * s.out_channels + gi * mg) * p;
        if (dw_acc != nullptr) {
          col.resize(static_cast<size_t>(kg * p));
          Im2Col<BFloat16, BFloat16>(x_g, g, 0, kg, 0, lines, col.data(), p);
          // dW_g [mg, kg] += dY_g [mg, p] * col^T [p, kg]
          GemmFloat32Accumulate(DType::kBFloat16, false, true, mg, kg, p, 1.0f, dy_g, p,
                                col.data(), p, 1.0f, dw_acc + gi * mg * kg, kg);
        }
        if (dx != nullptr) {
          dcol.resize(static_cast<size_t>(kg * p));
          // dcol [kg, p] = W_g^T [kg, mg] * dY_g [mg, p]
          GemmFloat32Accumulate(DType::kBFloat16, true, false, kg, p, mg, 1.0f,
                                w + gi * mg * kg, kg, dy_g, p, 0.0f, dcol.data(), p);
          Col2ImAdd(dcol.data(), g, kg, dx + (n * s.channels + gi * cg) * in_size);
        }
        if (db_acc != nullptr) {  // dY's row sums
          dy_row.resize(static_cast<size_t>(p));
          for (int64_t m = 0; m < mg; ++m) {
            ToFloat32(dy_g + m * p, dy_row.data(), p);
            db_acc[gi * mg + m] += static_cast<float>(RowSum(dy_row.data(), p));
          }
        }
      }
    }
  };
  ForEachSlice(slices, run_slice);
  for (int64_t slice = 1; slice < slices; ++slice) {
    if (dw != nullptr) {
      for (int64_t i = 0; i < w_size; ++i) dw[i] += dw_parts[slice][i];
    }
    if (db != nullptr) {
      for (int64_t m = 0; m < s.out_channels; ++m) db[m] += db_parts[slice][m];
    }
  }
}

// RunConvGrad where the images have few output positions (im2col.h's
// FewOutputPositions), X, dY and W stored as T (float32 or bfloat16), into
// float32 dX (added to: zeros first), dW, dB: per group of images and conv
// group, the images' columns side by side [cg * taps, images * p]
// (FewPositionColumns, in T; the taps that read only padding left out
// while dY is finite: their dW stays zero) and their dY rows likewise [mg,
// images * p], then dW_g += dY * columns^T and dcol = W_g^T * dY in one
// GemmFloat32Accumulate each (bfloat16 on the native kernels where the CPU
// has them), dX by Gather's adjoint image by image, dB dY's row sums.
// Slices of images as RunConvGrad, each a partial dW.
template <typename T>
void RunConvGradOnImageColumns(const common::WindowGeometry& g, const ConvGradShapes& s,
                               const T* x, const T* dy, const T* w, float* dx, float* dw,
                               float* db) {
  constexpr DType kDType = std::is_same_v<T, float> ? DType::kFloat32 : DType::kBFloat16;
  const int64_t cg = s.channels / s.group;
  const int64_t mg = s.out_channels / s.group;
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  bool dy_finite = true;
  for (int64_t i = 0; i < s.batch * s.out_channels * p && dy_finite; ++i) {
    dy_finite = std::isfinite(WidenTo<float>(dy[i]));
  }
  const FewPositionColumns columns(g, dy_finite);
  const int64_t kernel_size = g.kernel_size();
  const int64_t taps = static_cast<int64_t>(columns.taps().size());
  const int64_t kg = cg * taps;
  const bool all_taps = taps == kernel_size;
  std::vector<T> w_kept(static_cast<size_t>(s.out_channels * kg));
  columns.KeptTaps(w, s.out_channels * cg, w_kept.data());
  const int64_t w_size = s.out_channels * kg;  // dW at the kept taps
  const int64_t slices = SliceCount(s.batch);
  const int64_t images = ImagesPerColumnGemm(g, kg, s.batch, slices);
  // Per slice: dW at the kept taps and dB (slice 0 writes dW directly when
  // every tap is kept, and dB).
  std::vector<std::vector<float>> dw_parts(static_cast<size_t>(slices)),
      db_parts(static_cast<size_t>(slices));
  auto run_slice = [&](int64_t slice) {
    float* dw_acc = dw;
    float* db_acc = db;
    if (dw != nullptr && (slice > 0 || !all_taps)) {
      dw_parts[slice].assign(static_cast<size_t>(w_size), 0.0f);
      dw_acc = dw_parts[slice].data();
    }
    if (db != nullptr && slice > 0) {
      db_parts[slice].assign(static_cast<size_t>(s.out_channels), 0.0f);
      db_acc = db_parts[slice].data();
    }
    std::vector<T> col, dy_cols;
    std::vector<float> dcol, dy_row;
    const int64_t last = SliceBegin(slice + 1, slices, s.batch);
    for (int64_t n0 = SliceBegin(slice, slices, s.batch); n0 < last; n0 += images) {
      const int64_t count = std::min(images, last - n0);
      const int64_t cols = count * p;
      for (int64_t gi = 0; gi < s.group; ++gi) {
        // dY_g of the images side by side: [mg, count * p].
        dy_cols.resize(static_cast<size_t>(mg * cols));
        for (int64_t m = 0; m < mg; ++m) {
          for (int64_t i = 0; i < count; ++i) {
            const T* from = dy + ((n0 + i) * s.out_channels + gi * mg + m) * p;
            std::copy(from, from + p, dy_cols.data() + m * cols + i * p);
          }
        }
        if (dw_acc != nullptr) {
          col.resize(static_cast<size_t>(kg * cols));
          for (int64_t i = 0; i < count; ++i) {
            columns.Gather(x + ((n0 + i) * s.channels + gi * cg) * in_size, cg,
                           col.data() + i * p, cols);
          }
          // dW_g [mg, kg] += dY [mg, cols] * col^T [cols, kg]
          GemmFloat32Accumulate(kDType, false, true, mg, kg, cols, 1.0f, dy_cols.data(), cols,
                                col.data(), cols, 1.0f, dw_acc + gi * mg * kg, kg);
        }
        if (dx != nullptr) {
          dcol.resize(static_cast<size_t>(kg * cols));
          // dcol [kg, cols] = W_g^T [kg, mg] * dY [mg, cols]
          GemmFloat32Accumulate(kDType, true, false, kg, cols, mg, 1.0f,
                                w_kept.data() + gi * mg * kg, kg, dy_cols.data(), cols, 0.0f,
                                dcol.data(), cols);
          for (int64_t i = 0; i < count; ++i) {
            columns.ScatterAdd(dcol.data() + i * p, cols, cg,
                               dx + ((n0 + i) * s.channels + gi * cg) * in_size);
          }
        }
        if (db_acc != nullptr) {  // dY's row sums
          dy_row.resize(static_cast<size_t>(cols));
          for (int64_t m = 0; m < mg; ++m) {
            ToFloat32(kDType, dy_cols.data() + m * cols, dy_row.data(), cols);
            db_acc[gi * mg + m] += static_cast<float>(RowSum(dy_row.data(), cols));
          }
        }
      }
    }
  };
  ForEachSlice(slices, run_slice);
  for (int64_t slice = 0; slice < slices; ++slice) {
    if (dw != nullptr && !dw_parts[slice].empty()) {
      if (all_taps) {
        for (int64_t i = 0; i < w_size; ++i) dw[i] += dw_parts[slice][i];
      } else {
        columns.AddKeptTaps(dw_parts[slice].data(), s.out_channels * cg, dw);
      }
    }
    if (db != nullptr && slice > 0) {
      for (int64_t m = 0; m < s.out_channels; ++m) db[m] += db_parts[slice][m];
    }
  }
}

absl::Status ConvGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  const TensorView& w = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const int64_t group, common::CheckConvGrad(ctx));
  const ConvGradShapes s{x.dims[0], x.dims[1], w.dims[0], group};
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  absl::StatusOr<common::WindowGeometry> g =
      common::ForwardWindowGeometry(ctx, spatial, kernel, false);
  if (!g.ok()) return g.status();
  std::vector<int64_t> y_dims = {s.batch, s.out_channels};
  y_dims.insert(y_dims.end(), g->output.begin(), g->output.end());
  if (absl::Status st = common::RequireDims(ctx, 0, "dY", y_dims, "Conv's output for X and W");
      !st.ok()) {
    return st;
  }
  TensorView* dx = nullptr;
  TensorView* dw = nullptr;
  TensorView* db = nullptr;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(dx, ctx.Output(0, x.dtype, x.dims));
  }
  if (WantsOutput(ctx, 1)) {
    CASTOR_ASSIGN_OR_RETURN(dw, ctx.Output(1, x.dtype, w.dims));
  }
  if (WantsOutput(ctx, 2)) {
    CASTOR_ASSIGN_OR_RETURN(db, ctx.Output(2, x.dtype, {s.out_channels}));
  }
  const bool runs = dy.num_elements() > 0 && x.num_elements() > 0;
  // As the forward pass (conv.cc's NativeConvPays): where the grid's direct
  // products run (2-D), they beat unrolling, col2im and packing for the
  // native GEMM (measured in the ResNet's training step on a Zen 4).
  const bool all_bfloat16 = x.dtype == DType::kBFloat16 && dy.dtype == DType::kBFloat16 &&
                            w.dtype == DType::kBFloat16;
  // bfloat16 on the grid's bfloat16 products (VDPBF16PS), as stored.
  // Few output positions per image: the images' columns side by side in
  // one GEMM, bfloat16 as stored, other dtypes widened to float32.
  const bool few_positions = FewOutputPositions(*g);
  const bool bfloat16_grid =
      all_bfloat16 && !few_positions && UsesGrid(*g) && UseGridBFloat16Products();
  const bool native = all_bfloat16 && !few_positions && !bfloat16_grid && NativeBFloat16Gemm() &&
                      (g->pointwise() || !UsesGrid(*g));
  std::optional<Float32Out> dx_out, dw_out, db_out;
  // The grid's phases write every element of dX; col2im adds. The
  // bfloat16 grid rounds dX itself, image by image.
  if (dx && !(runs && bfloat16_grid)) {
    dx_out.emplace(dx, runs && UsesGrid(*g) && !native && !few_positions);
  }
  if (dw) dw_out.emplace(dw);
  if (db) db_out.emplace(db);
  if (runs && bfloat16_grid) {
    RunConvGrad(*g, s, x.as<BFloat16>(), dy.as<BFloat16>(), w.as<BFloat16>(),
                dx ? dx->as<BFloat16>() : nullptr, dw ? dw_out->data() : nullptr,
                db ? db_out->data() : nullptr);
  } else if (runs && few_positions && all_bfloat16) {
    RunConvGradOnImageColumns(*g, s, x.as<BFloat16>(), dy.as<BFloat16>(), w.as<BFloat16>(),
                              dx ? dx_out->data() : nullptr, dw ? dw_out->data() : nullptr,
                              db ? db_out->data() : nullptr);
  } else if (runs && few_positions) {
    const Float32In x_f(x);
    const Float32In dy_f(dy);
    const Float32In w_f(w);
    RunConvGradOnImageColumns(*g, s, x_f.data(), dy_f.data(), w_f.data(),
                              dx ? dx_out->data() : nullptr, dw ? dw_out->data() : nullptr,
                              db ? db_out->data() : nullptr);
  } else if (runs && native) {
    RunConvGradBFloat16Native(*g, s, x.as<BFloat16>(), dy.as<BFloat16>(), w.as<BFloat16>(),
                              dx ? dx_out->data() : nullptr, dw ? dw_out->data() : nullptr,
                              db ? db_out->data() : nullptr);
  } else if (runs) {
    // X widened once with the vector conversions (float_io.h), like dY and
    // W: the unrolling then copies float32 instead of converting each of
    // the kernel-size copies of every element.
    const Float32In x_f(x);
    const Float32In dy_f(dy);
    const Float32In w_f(w);
    RunConvGrad<float>(*g, s, x_f.data(), dy_f.data(), w_f.data(), dx ? dx_out->data() : nullptr,
                dw ? dw_out->data() : nullptr, db ? db_out->data() : nullptr);
  }
  for (auto* out : {&dx_out, &dw_out, &db_out}) {
    if (out->has_value()) (*out)->Finish();
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterConvGradKernels(KernelTable& table) {
  RegisterGradientKernel(table, "ConvGrad", ConvGradKernel);
}

}  // namespace castor::cpu
