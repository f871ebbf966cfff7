// CPU kernels: castor's gradient ops (domain com.castor, graph/ops/gradient_ops.cc).
//
// ConvGrad: per (image, group), dW += dY_g * im2col(X_g)^T and dX_g =
// col2im(W_g^T * dY_g) with im2col.h's geometry and gemm.h's Sgemm; 2-D
// convs use grid_conv.h's direct products instead where a vector kernel
// runs (dW from X copied onto the padded grid, up to 8 images per product;
// dX per stride phase from dY; see ConvGradOnGrid). The images run in
// slices on the thread pool (a partial dW per slice), or one after another
// with split GEMMs (and split grid products) when there is a single image.
// 16-bit X, dY and W are widened to float32 up front with float_io.h's
// vector conversions (a float32 copy of each, in scratch.h's PooledBuffer).
// ConvGrad, BatchNormalizationGrad and LayerNormalizationGrad skip the
// outputs nothing reads (KernelContext::output_read).
// MaxPoolGrad / AveragePoolGrad walk each plane's windows (the forward
// window tables: ForwardWindowGeometry, ceil_mode, pads, dilations; a 2-D
// MaxPoolGrad plane scans each window directly);
// MaxPoolGrad routes dY to the first maximum of each window in row-major
// window order (the forward kernel's and PyTorch's tie rule), overlapping
// windows accumulate. GlobalAveragePoolGrad spreads dY / size.
// BatchNormalizationGrad (training mode: batch statistics recomputed from
// X over all axes but 1, biased variance) and LayerNormalizationGrad
// (statistics over the axes from `axis` on) accumulate their statistics and
// parameter gradients in float64.
// SoftmaxGrad, LogSoftmaxGrad, SoftmaxCrossEntropyLossGrad, ReluGrad,
// ReduceToShapeOf and GatherGrad follow their formulas in
// graph/ops/gradient_ops.cc.
// All arithmetic is float32 (sums in float64 where noted); 16-bit inputs
// widen exactly and every output rounds once on store. Planes, rows or
// lines run in parallel on backend/cpu/parallel.h.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/batch_norm_loops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/grid_conv.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd16.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kGradDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr int64_t kElementGrain = int64_t{1} << 14;

int64_t Product(const std::vector<int64_t>& dims, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, dims.size()); ++i) p *= dims[i];
  return p;
}

// A float tensor read as float32: the tensor itself when float32, else a
// widened copy (exact for 16-bit).
class Float32In {
 public:
  explicit Float32In(const TensorView& t) {
    if (t.dtype == DType::kFloat32) {
      data_ = t.as<float>();
      return;
    }
    const int64_t n = t.num_elements();
    copy_.emplace(n);
    float* dst = copy_->data();
    ParallelFor(0, n, kElementGrain, [&](int64_t lo, int64_t hi) {
      ToFloat32(t.dtype, static_cast<const char*>(t.data) + lo * DTypeSize(t.dtype), dst + lo,
                hi - lo);
    });
    data_ = dst;
  }
  Float32In(const Float32In&) = delete;
  Float32In& operator=(const Float32In&) = delete;
  const float* data() const { return data_; }

 private:
  const float* data_ = nullptr;
  std::optional<PooledBuffer<float>> copy_;
};

// An output computed in float32: written in place when float32, else in a
// buffer that Finish() rounds into the output once. Zero-initialised unless
// the kernel writes every element (`overwritten`).
class Float32Out {
 public:
  explicit Float32Out(TensorView* t, bool overwritten = false) : view_(t) {
    const int64_t n = t->num_elements();
    if (t->dtype == DType::kFloat32) {
      data_ = t->as<float>();
    } else {
      buffer_.emplace(n);  // not initialised
      data_ = buffer_->data();
    }
    if (!overwritten) std::fill(data_, data_ + n, 0.0f);
  }
  Float32Out(const Float32Out&) = delete;
  Float32Out& operator=(const Float32Out&) = delete;
  float* data() const { return data_; }
  void Finish() const {
    if (view_->dtype == DType::kFloat32) return;
    ParallelFromFloat32(view_->dtype, data_, view_->data, view_->num_elements());
  }

 private:
  TensorView* view_;
  float* data_ = nullptr;
  std::optional<PooledBuffer<float>> buffer_;
};

// Writes float64 values to a new output `index` with `dtype` and `dims`.
absl::Status WriteDoubles(KernelContext& ctx, int index, DType dtype,
                          const std::vector<int64_t>& dims, const std::vector<double>& values) {
  absl::StatusOr<TensorView*> out = ctx.Output(index, dtype, dims);
  if (!out.ok()) return out.status();
  std::vector<float> narrowed(values.begin(), values.end());
  FromFloat32(dtype, narrowed.data(), (*out)->data, static_cast<int64_t>(narrowed.size()));
  return absl::OkStatus();
}

// Whether the gradient op's output `i` is computed: only when something
// reads it (KernelContext::output_read).
bool WantsOutput(const KernelContext& ctx, int i) {
  return i < ctx.num_outputs() && ctx.output_read(i);
}

// Splits [0, count) into at most NumThreads() contiguous slices.
int64_t SliceCount(int64_t count) { return std::clamp<int64_t>(NumThreads(), 1, count); }
int64_t SliceBegin(int64_t slice, int64_t slices, int64_t count) {
  return slice * count / slices;
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
CASTOR_SIMD16_TARGET void AddWidenedRows(float* partial, const T* src, int64_t stride,
                                         int64_t rows, int64_t m) {
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

#if defined(CASTOR_SIMD16_X86)
// Floats [p, p + 8) (lanes outside `lanes` 0) as doubles.
CASTOR_SIMD16_TARGET inline __m512d LoadAsDoubles(const float* p, __mmask8 lanes) {
  return _mm512_maskz_cvtps_pd(lanes, _mm256_maskz_loadu_ps(lanes, p));
}

// LaneSums' total of 8 lanes held in a vector.
CASTOR_SIMD16_TARGET inline double PairwiseTotal(__m512d lanes) {
  alignas(64) double v[8];
  _mm512_store_pd(v, lanes);
  return AddLanesPairwise(v);
}

// One row of LayerNormGrad with a dense scale, 8 float64 lanes at a time:
// the scalar loop's arithmetic in the same order (LaneSums puts element j
// of the whole blocks of 8 in lane j mod 8 and the tail's in lanes 0..),
// so the same bits (castor builds with -ffp-contract=off: no FMA in target
// code either). Adds the row's dScale and dBias terms to ds and db;
// writes dX when dx is set; x_hat and g are n doubles of scratch.
CASTOR_SIMD16_TARGET void LayerNormGradRowAvx512(
    const float* x, const float* dy, const float* scale, int64_t n, double epsilon, double* ds,
    double* db, double* x_hat, double* g, float* dx) {
  __m512d sum = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 lanes = TailMask8(n - j);
    sum = _mm512_mask_add_pd(sum, lanes, sum, LoadAsDoubles(x + j, lanes));
  }
  const double m = n > 0 ? PairwiseTotal(sum) / static_cast<double>(n) : 0.0;
  const __m512d mv = _mm512_set1_pd(m);
  __m512d squares = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 lanes = TailMask8(n - j);
    const __m512d centred = _mm512_sub_pd(LoadAsDoubles(x + j, lanes), mv);
    squares = _mm512_mask_add_pd(squares, lanes, squares, _mm512_mul_pd(centred, centred));
  }
  const double inv_std =
      1.0 / std::sqrt((n > 0 ? PairwiseTotal(squares) / static_cast<double>(n) : 0.0) + epsilon);
  const __m512d iv = _mm512_set1_pd(inv_std);
  __m512d g_sum = _mm512_setzero_pd(), g_xhat_sum = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 lanes = TailMask8(n - j);
    const __m512d dyv = LoadAsDoubles(dy + j, lanes);
    const __m512d xh = _mm512_mul_pd(_mm512_sub_pd(LoadAsDoubles(x + j, lanes), mv), iv);
    const __m512d gv = _mm512_mul_pd(dyv, LoadAsDoubles(scale + j, lanes));
    _mm512_mask_storeu_pd(x_hat + j, lanes, xh);
    _mm512_mask_storeu_pd(g + j, lanes, gv);
    const __m512d dsv = _mm512_maskz_loadu_pd(lanes, ds + j);
    _mm512_mask_storeu_pd(ds + j, lanes, _mm512_add_pd(dsv, _mm512_mul_pd(dyv, xh)));
    const __m512d dbv = _mm512_maskz_loadu_pd(lanes, db + j);
    _mm512_mask_storeu_pd(db + j, lanes, _mm512_add_pd(dbv, dyv));
    g_sum = _mm512_mask_add_pd(g_sum, lanes, g_sum, gv);
    g_xhat_sum = _mm512_mask_add_pd(g_xhat_sum, lanes, g_xhat_sum, _mm512_mul_pd(gv, xh));
  }
  if (dx != nullptr) {
    const __m512d g_mean = _mm512_set1_pd(PairwiseTotal(g_sum) / static_cast<double>(n));
    const __m512d g_xhat_mean =
        _mm512_set1_pd(PairwiseTotal(g_xhat_sum) / static_cast<double>(n));
    for (int64_t j = 0; j < n; j += 8) {
      const __mmask8 lanes = TailMask8(n - j);
      const __m512d centred = _mm512_sub_pd(_mm512_maskz_loadu_pd(lanes, g + j), g_mean);
      const __m512d v = _mm512_mul_pd(
          iv, _mm512_sub_pd(centred,
                            _mm512_mul_pd(_mm512_maskz_loadu_pd(lanes, x_hat + j), g_xhat_mean)));
      _mm256_mask_storeu_ps(dx + j, lanes, _mm512_maskz_cvtpd_ps(lanes, v));
    }
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

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
// written in place when s1 == 1, else gathered in a scratch and spread. A
// phase no tap reaches comes out as zeros, so every dX element is written.
class ConvGradOnGrid {
 public:
  ConvGradOnGrid(const common::WindowGeometry& g, const ConvGradShapes& s, const float* w)
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
        for (int64_t m = 0; m < mg_; ++m) {
          for (int64_t j = 0; j < num_taps; ++j) {
            phase.b_rows.push_back(m * plane + phase.tap_offsets[j]);
          }
        }
        // a[gi][c][m * num_taps + j] = W[gi * mg + m][c][taps[j]]
        phase.a.resize(static_cast<size_t>(s.group * cg_ * mg_ * num_taps));
        for (int64_t gi = 0; gi < s.group; ++gi) {
          for (int64_t c = 0; c < cg_; ++c) {
            for (int64_t m = 0; m < mg_; ++m) {
              const float* src = w + ((gi * mg_ + m) * cg_ + c) * kernel_size;
              float* dst = phase.a.data() + ((gi * cg_ + c) * mg_ + m) * num_taps;
              for (int64_t j = 0; j < num_taps; ++j) dst[j] = src[taps[j]];
            }
          }
        }
        phases_.push_back(std::move(phase));
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
  void AddFilterGrad(const float* x_g, int64_t x_stride, const float* dy_g, int64_t dy_stride,
                     int64_t images, float* dw_g) const {
    thread_local std::vector<float> padded;
    const int64_t grid_size = cg_ * x_grid_.channel_size();
    padded.resize(static_cast<size_t>(images * grid_size));
    for (int64_t i = 0; i < images; ++i) {
      FillGrid<float, float>(x_g + i * x_stride, 0, cg_, x_grid_, padded.data() + i * grid_size);
    }
    const float* b = padded.data();
    const GridLines lines{g_.output[0], g_.output[1], x_grid_.cols, g_.output[1]};
    const GridImages image_strides{images, grid_size, dy_stride};
    const int64_t kg = static_cast<int64_t>(x_rows_.size());
    // Split in whole blocks of 12 columns (a multiple of every kernel's
    // column block), so a thread's share has no leftover columns but the last.
    constexpr int64_t kSplit = 12;
    ParallelFor(0, (kg + kSplit - 1) / kSplit, 1, [&](int64_t lo, int64_t hi) {
      const int64_t k0 = lo * kSplit, k1 = std::min(kg, hi * kSplit);
      GridConvFilterGrad(mg_, k1 - k0, dy_g, g_.output_size(), b, x_rows_.data() + k0, lines,
                         image_strides, dw_g + k0, kg);
    });
  }

  // Writes all of dX_g [cg, input] of group gi for one image (the lines of
  // each phase split across threads when the caller runs alone).
  void FillInputGrad(int64_t gi, const float* dy_g, float* dx_g) const {
    const int64_t out_h = g_.output[0], out_w = g_.output[1];
    const int64_t plane = dy_rows_ * dy_cols_;
    thread_local std::vector<float> padded, scratch;
    padded.resize(static_cast<size_t>(mg_ * plane + kGridReadSlack));
    std::fill(padded.begin() + mg_ * plane, padded.end(), 0.0f);
    // dY's lines and columns that fit in the buffer.
    const int64_t lines_in = std::clamp<int64_t>(dy_rows_ - dy_shift_[0], 0, out_h);
    const int64_t width_in = std::clamp<int64_t>(dy_cols_ - dy_shift_[1], 0, out_w);
    for (int64_t m = 0; m < mg_; ++m) {
      const float* src = dy_g + m * out_h * out_w;
      float* dst = padded.data() + m * plane;
      if (FillPaddedPlaneVector(src, lines_in, width_in, out_w, dy_shift_[0], dy_shift_[1],
                                dy_rows_, dy_cols_, dst)) {
        continue;
      }
      std::fill(dst, dst + plane, 0.0f);
      for (int64_t oh = 0; oh < lines_in; ++oh) {
        std::copy(src + oh * out_w, src + oh * out_w + width_in,
                  dst + (oh + dy_shift_[0]) * dy_cols_ + dy_shift_[1]);
      }
    }
    const int64_t in_w = g_.input[1], in_size = g_.input_size();
    const int64_t s0 = g_.strides[0], s1 = g_.strides[1];
    for (const Phase& phase : phases_) {
      const int64_t depth = static_cast<int64_t>(phase.b_rows.size());
      const float* a = phase.a.data() + gi * cg_ * depth;
      const float* b = padded.data() + phase.gathered;
      float* out = dx_g + phase.dx_row * in_w + phase.dx_col;
      int64_t ld_out = in_size, dense_stride = s0 * in_w;
      if (s1 != 1) {  // gathered in [cg, lines, width], spread below
        scratch.resize(static_cast<size_t>(cg_ * phase.lines * phase.width));
        out = scratch.data();
        ld_out = phase.lines * phase.width;
        dense_stride = phase.width;
      }
      ParallelFor(0, phase.lines, 1, [&](int64_t lo, int64_t hi) {
        const GridLines lines{hi - lo, phase.width, dy_cols_, dense_stride};
        GridConvForward(cg_, depth, a, depth, b + lo * dy_cols_, phase.b_rows.data(), lines,
                        nullptr, out + lo * dense_stride, ld_out);
      });
      if (s1 == 1) continue;
      for (int64_t c = 0; c < cg_; ++c) {
        for (int64_t l = 0; l < phase.lines; ++l) {
          const float* src = scratch.data() + (c * phase.lines + l) * phase.width;
          float* dst = dx_g + c * in_size + (phase.dx_row + l * s0) * in_w + phase.dx_col;
          SpreadRow(src, phase.width, s1, dst);
        }
      }
    }
  }

 private:
  static int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

  // One stride phase of dX: its positions (lines x width, the first at
  // dX (dx_row, dx_col) and dY-buffer offset `gathered`) and taps.
  struct Phase {
    int64_t lines = 0, width = 0, gathered = 0, dx_row = 0, dx_col = 0;
    std::vector<int64_t> tap_offsets;  // per tap: its offset in a dY plane
    std::vector<int64_t> b_rows;       // (m, tap): m * plane + tap offset
    std::vector<float> a;              // [group][cg][mg * taps]: W's entries
  };

  const common::WindowGeometry& g_;
  const PaddedGrid x_grid_;
  const int64_t cg_, mg_;
  std::vector<int64_t> x_rows_;  // column row k of X_g: padded + x_rows_[k]
  int64_t dy_shift_[2] = {0, 0};  // zeros before dY in its buffer, per axis
  int64_t dy_rows_ = 0, dy_cols_ = 0;
  std::vector<Phase> phases_;
};

void RunConvGrad(const common::WindowGeometry& g, const ConvGradShapes& s, const float* x,
                 const float* dy, const float* w, float* dx, float* dw, float* db) {
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
    std::vector<float> col, dcol;
    if (dw_acc != nullptr && grid.has_value()) {
      const int64_t chunk = grid->ImagesPerFilterGrad();
      for (int64_t n = first; n < last; n += chunk) {
        for (int64_t gi = 0; gi < s.group; ++gi) {
          grid->AddFilterGrad(x + (n * s.channels + gi * cg) * in_size, s.channels * in_size,
                              dy + (n * s.out_channels + gi * mg) * p, s.out_channels * p,
                              std::min(chunk, last - n), dw_acc + gi * mg * kg);
        }
      }
    }
    for (int64_t n = first; n < last; ++n) {
      for (int64_t gi = 0; gi < s.group; ++gi) {
        const float* x_g = x + (n * s.channels + gi * cg) * in_size;
        const float* dy_g = dy + (n * s.out_channels + gi * mg) * p;
        if (dw_acc != nullptr && !grid.has_value()) {
          col.resize(static_cast<size_t>(kg * p));
          Im2Col<float, float>(x_g, g, 0, kg, 0, lines, col.data(), p);
          // dW_g [mg, kg] += dY_g [mg, p] * col^T [p, kg]
          Sgemm(false, true, mg, kg, p, 1.0f, dy_g, p, col.data(), p, 1.0f,
                dw_acc + gi * mg * kg, kg);
        }
        float* dx_g = dx != nullptr ? dx + (n * s.channels + gi * cg) * in_size : nullptr;
        if (dx_g != nullptr && grid.has_value()) {
          grid->FillInputGrad(gi, dy_g, dx_g);
        } else if (dx_g != nullptr) {
          dcol.resize(static_cast<size_t>(kg * p));
          // dcol [kg, p] = W_g^T [kg, mg] * dY_g [mg, p]
          Sgemm(true, false, kg, p, mg, 1.0f, w + gi * mg * kg, kg, dy_g, p, 0.0f, dcol.data(),
                p);
          Col2ImAdd(dcol.data(), g, kg, dx_g);
        }
        if (db_acc != nullptr) {  // dY's row sums
          for (int64_t m = 0; m < mg; ++m) {
            db_acc[gi * mg + m] += static_cast<float>(RowSum(dy_g + m * p, p));
          }
        }
      }
    }
  };
  if (slices > 1) {
    ParallelFor(0, slices, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t slice = lo; slice < hi; ++slice) run_slice(slice);
    });
  } else {
    run_slice(0);
  }
  for (int64_t slice = 1; slice < slices; ++slice) {
    if (dw != nullptr) {
      for (int64_t i = 0; i < w_size; ++i) dw[i] += dw_parts[slice][i];
    }
    if (db != nullptr) {
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
  std::optional<Float32Out> dx_out, dw_out, db_out;
  // The grid's phases write every element of dX; col2im adds.
  if (dx) dx_out.emplace(dx, runs && UsesGrid(*g));
  if (dw) dw_out.emplace(dw);
  if (db) db_out.emplace(db);
  if (runs) {
    // X widened once with the vector conversions (float_io.h), like dY and
    // W: the unrolling then copies float32 instead of converting each of
    // the kernel-size copies of every element.
    const Float32In x_f(x);
    const Float32In dy_f(dy);
    const Float32In w_f(w);
    RunConvGrad(*g, s, x_f.data(), dy_f.data(), w_f.data(), dx ? dx_out->data() : nullptr,
                dw ? dw_out->data() : nullptr, db ? db_out->data() : nullptr);
  }
  for (auto* out : {&dx_out, &dw_out, &db_out}) {
    if (out->has_value()) (*out)->Finish();
  }
  return absl::OkStatus();
}

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
  const Float32In dy(ctx.input(0));
  // MaxPoolGradPlane2x2 (float32 and widened 16-bit X) writes every dX
  // element; everything else adds into zeros.
  const bool disjoint_2x2 = kMax && IsDisjoint2x2(g) && x.dtype != DType::kFloat64;
  const Float32Out dx(setup.dx, /*overwritten=*/disjoint_2x2);
  const bool count_include_pad = ctx.GetInt("count_include_pad", 0) != 0;
  const int64_t in_size = g.input_size(), out_size = g.output_size();
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
  const int64_t size = Product(x.dims, 2);
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

// ---- BatchNormalizationGrad --------------------------------------------------

absl::Status BatchNormGradKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::BatchNormGradGeometry geometry,
                          common::PlanBatchNormGrad(ctx));
  const int64_t batch = geometry.batch, channels = geometry.channels, inner = geometry.inner;
  const double epsilon = ctx.GetFloat("epsilon", 1e-5f);
  const Float32In xf(x);
  const Float32In dyf(ctx.input(0));
  const Float32In scale(scale_view);
  const double count = static_cast<double>(batch * inner);
  std::vector<double> d_scale(channels), d_bias(channels);
  const int64_t stride = channels * inner;
  std::optional<Float32Out> dx;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * dx_view, ctx.Output(0, x.dtype, x.dims));
    dx.emplace(dx_view, /*overwritten=*/true);
  }
  // Per channel: the sums, then its dX while X and dY are still in cache.
  ParallelFor(0, channels, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const float* x_first = xf.data() + c * inner;
      const float* dy_first = dyf.data() + c * inner;
      const double mean = count > 0 ? ChannelSum(x_first, batch, stride, inner) / count : 0.0;
      // (x - mean)^2, dY, dY * (x - mean)
      const std::array<double, 3> sums =
          ChannelGradientSums(x_first, dy_first, batch, stride, inner, mean);
      const double var = count > 0 ? sums[0] / count : 0.0;
      const double inv_std = 1.0 / std::sqrt(var + epsilon);
      d_bias[c] = sums[1];
      d_scale[c] = sums[2] * inv_std;  // sum(dY * x_hat)
      if (!dx.has_value()) continue;
      // dX = scale * inv_std * (dY - dBias / M - x_hat * dScale / M)
      const float a = static_cast<float>(scale.data()[c] * inv_std);
      const float mean_dy = static_cast<float>(d_bias[c] / count);
      const float mean_dy_xhat = static_cast<float>(d_scale[c] / count);
      for (int64_t n = 0; n < batch; ++n) {
        BatchNormInputGradient(x_first + n * stride, dy_first + n * stride,
                               dx->data() + c * inner + n * stride, inner, a,
                               static_cast<float>(mean), static_cast<float>(inv_std), mean_dy,
                               mean_dy_xhat);
      }
    }
  });
  if (dx.has_value()) dx->Finish();
  if (WantsOutput(ctx, 1)) {
    if (absl::Status st = WriteDoubles(ctx, 1, scale_view.dtype, scale_view.dims, d_scale);
        !st.ok()) {
      return st;
    }
  }
  if (WantsOutput(ctx, 2)) {
    if (absl::Status st = WriteDoubles(ctx, 2, scale_view.dtype, scale_view.dims, d_bias);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

// ---- LayerNormalizationGrad ----------------------------------------------------

absl::Status LayerNormGradKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::LayerNormGeometry geometry, common::PlanLayerNormGrad(ctx));
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  const int64_t axis = geometry.axis, outer = geometry.outer, inner = geometry.inner;
  // scale (right-aligned against X's axes from `axis` on, 1 = broadcast):
  // the scale element of each of the `inner` positions.
  const std::vector<int64_t>& sd = scale_view.dims;
  std::vector<int64_t> scale_index(static_cast<size_t>(inner));
  for (int64_t j = 0; j < inner; ++j) {
    int64_t rem = j, index = 0, step = 1;
    for (int64_t d = rank - 1, k = static_cast<int64_t>(sd.size()) - 1; d >= axis; --d, --k) {
      const int64_t pos = rem % x.dims[d];
      rem /= x.dims[d];
      if (k >= 0) {
        if (sd[k] != 1) index += pos * step;
        step *= sd[k];
      }
    }
    scale_index[j] = index;
  }
  const int64_t scale_size = scale_view.num_elements();
  // Scale holds one element per normalised position, in order (the usual
  // [D] scale of a [..., D] LayerNorm).
  bool dense_scale = scale_size == inner;
  for (int64_t j = 0; dense_scale && j < inner; ++j) dense_scale = scale_index[j] == j;
  const double epsilon = ctx.GetFloat("epsilon", 1e-5f);
  const Float32In xf(x);
  const Float32In dyf(ctx.input(0));
  const Float32In scale(scale_view);
  TensorView* dx_view = nullptr;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(dx_view, ctx.Output(0, x.dtype, x.dims));
  }
  std::optional<Float32Out> dx;
  if (dx_view) dx.emplace(dx_view);
  const int64_t slices = SliceCount(std::max<int64_t>(outer, 1));
  std::vector<std::vector<double>> d_scale(static_cast<size_t>(slices)),
      d_bias(static_cast<size_t>(slices));
  ParallelFor(0, slices, 1, [&](int64_t lo, int64_t hi) {
    std::vector<double> x_hat(static_cast<size_t>(inner)), g(static_cast<size_t>(inner));
    for (int64_t slice = lo; slice < hi; ++slice) {
      std::vector<double>& ds = d_scale[slice];
      std::vector<double>& db = d_bias[slice];
      ds.assign(static_cast<size_t>(scale_size), 0.0);
      db.assign(static_cast<size_t>(scale_size), 0.0);
      for (int64_t r = SliceBegin(slice, slices, outer); r < SliceBegin(slice + 1, slices, outer);
           ++r) {
        const float* xr = xf.data() + r * inner;
        const float* dyr = dyf.data() + r * inner;
#if defined(CASTOR_SIMD16_X86)
        if (dense_scale && UseFusedSimd16()) {
          LayerNormGradRowAvx512(xr, dyr, scale.data(), inner, epsilon, ds.data(), db.data(),
                                 x_hat.data(), g.data(), dx ? dx->data() + r * inner : nullptr);
          continue;
        }
#endif
        LaneSums<1> sum;
        sum.Add(inner, [&](int64_t j) { return std::array<double, 1>{xr[j]}; });
        const double m = inner > 0 ? sum.Total(0) / inner : 0.0;
        LaneSums<1> squares;
        squares.Add(inner, [&](int64_t j) {
          const double centred = xr[j] - m;
          return std::array<double, 1>{centred * centred};
        });
        const double inv_std =
            1.0 / std::sqrt((inner > 0 ? squares.Total(0) / inner : 0.0) + epsilon);
        if (dense_scale) {  // the same arithmetic without the index table: it vectorizes
          const float* sc = scale.data();
          double* dsp = ds.data();
          double* dbp = db.data();
          for (int64_t j = 0; j < inner; ++j) {
            x_hat[j] = (xr[j] - m) * inv_std;
            g[j] = static_cast<double>(dyr[j]) * sc[j];
            dsp[j] += dyr[j] * x_hat[j];
            dbp[j] += dyr[j];
          }
        } else {
          for (int64_t j = 0; j < inner; ++j) {
            x_hat[j] = (xr[j] - m) * inv_std;
            g[j] = static_cast<double>(dyr[j]) * scale.data()[scale_index[j]];
            ds[scale_index[j]] += dyr[j] * x_hat[j];
            db[scale_index[j]] += dyr[j];
          }
        }
        if (!dx) continue;
        LaneSums<2> g_sums;  // g, g * x_hat
        g_sums.Add(inner, [&](int64_t j) { return std::array<double, 2>{g[j], g[j] * x_hat[j]}; });
        const double g_mean = g_sums.Total(0) / static_cast<double>(inner);
        const double g_xhat_mean = g_sums.Total(1) / static_cast<double>(inner);
        float* dxr = dx->data() + r * inner;
        for (int64_t j = 0; j < inner; ++j) {
          dxr[j] = static_cast<float>(inv_std * (g[j] - g_mean - x_hat[j] * g_xhat_mean));
        }
      }
    }
  });
  if (dx) dx->Finish();
  for (int64_t slice = 1; slice < slices; ++slice) {
    for (int64_t i = 0; i < scale_size; ++i) {
      d_scale[0][i] += d_scale[slice][i];
      d_bias[0][i] += d_bias[slice][i];
    }
  }
  if (WantsOutput(ctx, 1)) {
    if (absl::Status st = WriteDoubles(ctx, 1, scale_view.dtype, sd, d_scale[0]); !st.ok()) {
      return st;
    }
  }
  if (WantsOutput(ctx, 2)) {
    if (absl::Status st = WriteDoubles(ctx, 2, scale_view.dtype, sd, d_bias[0]); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

// ---- SoftmaxGrad / LogSoftmaxGrad --------------------------------------------

template <bool kLog>
absl::Status SoftmaxGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& y = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::SoftmaxGeometry geometry, common::PlanSoftmaxGrad(ctx));
  const int64_t outer = geometry.outer, n = geometry.n, inner = geometry.inner;
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, y.dtype, y.dims));
  DispatchFloat(y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    const T* yp = y.as<T>();
    T* dxp = dx->as<T>();
    const int64_t lines = outer * inner;
    ParallelFor(0, lines, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, n)),
                [&](int64_t lo, int64_t hi) {
                  for (int64_t line = lo; line < hi; ++line) {
                    const int64_t base = (line / inner) * n * inner + line % inner;
                    float sum = 0;
                    for (int64_t k = 0; k < n; ++k) {
                      const int64_t i = base + k * inner;
                      sum += kLog ? LoadF(dyp[i]) : LoadF(dyp[i]) * LoadF(yp[i]);
                    }
                    for (int64_t k = 0; k < n; ++k) {
                      const int64_t i = base + k * inner;
                      const float yv = LoadF(yp[i]);
                      const float g = LoadF(dyp[i]);
                      StoreF(&dxp[i], kLog ? g - std::exp(yv) * sum : yv * (g - sum));
                    }
                  }
                });
  });
  return absl::OkStatus();
}

// ---- SoftmaxCrossEntropyLossGrad ---------------------------------------------

int64_t LabelAt(const TensorView& labels, int64_t i) {
  return labels.dtype == DType::kInt32 ? labels.as<int32_t>()[i] : labels.as<int64_t>()[i];
}

absl::Status SoftmaxCrossEntropyLossGradKernel(KernelContext& ctx) {
  const TensorView& d_loss = ctx.input(0);
  const TensorView& scores = ctx.input(1);
  const TensorView& labels = ctx.input(2);
  const TensorView* weights = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  const bool has_ignore = ctx.node().has_attribute("ignore_index");
  const int64_t ignore_index = ctx.GetInt("ignore_index", 0);
  CASTOR_ASSIGN_OR_RETURN(const common::LossGeometry geometry, common::PlanCrossEntropyGrad(ctx));
  const std::string& reduction = geometry.reduction;
  const int64_t batch = geometry.batch, classes = geometry.classes, inner = geometry.inner;
  const int64_t positions = batch * inner;
  std::optional<Float32In> w;
  if (weights != nullptr) w.emplace(*weights);
  const Float32In dl(d_loss);
  double weight_total = 0;
  for (int64_t p = 0; p < positions; ++p) {
    const int64_t label = LabelAt(labels, p);
    if (has_ignore && label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      return ctx.Error(absl::StrCat(
          "input 2 (labels): label ", label, " at position ", p, " is out of range [0, ",
          classes, ")",
          has_ignore ? absl::StrCat(" and is not ignore_index ", ignore_index) : std::string()));
    }
    weight_total += weights != nullptr ? w->data()[label] : 1.0;
  }
  const float scale =
      reduction == "mean" ? static_cast<float>(1.0 / weight_total) : 1.0f;  // 0 / 0: NaN
  CASTOR_ASSIGN_OR_RETURN(TensorView * ds, ctx.Output(0, scores.dtype, scores.dims));
  DispatchFloat(scores.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = scores.as<T>();
    T* out = ds->as<T>();
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, classes));
    ParallelFor(0, positions, grain, [&](int64_t lo, int64_t hi) {
      std::vector<float> e(static_cast<size_t>(classes));
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t n = p / inner, d = p % inner;
        const T* column = x + n * classes * inner + d;
        T* out_column = out + n * classes * inner + d;
        const int64_t label = LabelAt(labels, p);
        if (has_ignore && label == ignore_index) {
          for (int64_t c = 0; c < classes; ++c) StoreF(&out_column[c * inner], 0.0f);
          continue;
        }
        const float upstream = reduction == "none" ? dl.data()[p] : dl.data()[0];
        const float factor = (weights != nullptr ? w->data()[label] : 1.0f) * upstream * scale;
        float max_value = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < classes; ++c) {
          max_value = std::max(max_value, LoadF(column[c * inner]));
        }
        float sum = 0;
        for (int64_t c = 0; c < classes; ++c) {
          e[c] = std::exp(LoadF(column[c * inner]) - max_value);
          sum += e[c];
        }
        for (int64_t c = 0; c < classes; ++c) {
          const float prob = e[c] / sum;
          StoreF(&out_column[c * inner], (prob - (c == label ? 1.0f : 0.0f)) * factor);
        }
      }
    });
  });
  return absl::OkStatus();
}

// ---- ReluGrad ------------------------------------------------------------------

absl::Status ReluGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& y = ctx.input(1);
  if (absl::Status st = common::RequireSameDType(ctx, 0, "dY", 1, "Y"); !st.ok()) return st;
  if (absl::Status st = common::RequireDims(ctx, 0, "dY", y.dims, "Y's shape"); !st.ok()) return st;
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, y.dtype, y.dims));
  DispatchFloat(y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    const T* yp = y.as<T>();
    T* dxp = dx->as<T>();
    ParallelFor(0, y.num_elements(), kElementGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kIsFloat16Storage<T>) {
        // On the bit patterns: Y > 0 exactly when its bits lie in
        // [1, +inf's] (+0, negatives, -0 and NaNs lie outside), so one
        // unsigned compare selects dY or +0's pattern (0), and the loop
        // vectorizes.
        const uint16_t positive_infinity = std::is_same_v<T, Half> ? 0x7c00 : 0x7f80;
        const uint16_t* y_bits = reinterpret_cast<const uint16_t*>(yp);
        const uint16_t* dy_bits = reinterpret_cast<const uint16_t*>(dyp);
        uint16_t* dx_bits = reinterpret_cast<uint16_t*>(dxp);
        for (int64_t i = lo; i < hi; ++i) {
          const uint16_t d = dy_bits[i];
          dx_bits[i] = static_cast<uint16_t>(y_bits[i] - 1u) < positive_infinity ? d : 0;
        }
      } else {
        // A select, not a branch: vectorized, and no mispredictions on
        // signs that alternate at random.
        // (dY is loaded unconditionally, so the loop has no control flow.)
        for (int64_t i = lo; i < hi; ++i) {
          const T d = dyp[i];
          dxp[i] = LoadF(yp[i]) > 0.0f ? d : T(0);
        }
      }
    });
  });
  return absl::OkStatus();
}

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

// ---- GatherGrad ------------------------------------------------------------------

absl::Status GatherGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const TensorView& data = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis, common::PlanGatherGrad(ctx));
  const int64_t outer = Product(data.dims, 0, axis);
  const int64_t axis_dim = data.dims[axis];
  const int64_t inner = Product(data.dims, axis + 1);
  const int64_t count = indices.num_elements();
  std::vector<int64_t> wrapped(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = LabelAt(indices, k);
    if (index < -axis_dim || index >= axis_dim) {
      return ctx.Error(absl::StrCat("input 1 (indices): index ", index, " at position ", k,
                                    " is out of range [", -axis_dim, ", ", axis_dim, ")"));
    }
    wrapped[k] = index < 0 ? index + axis_dim : index;
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * dd, ctx.Output(0, data.dtype, data.dims));
  const Float32Out out(dd);
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  DispatchFloat(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    float* acc = out.data();
    ParallelFor(0, outer * blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t task = lo; task < hi; ++task) {
        const int64_t o = task / blocks;
        const int64_t i0 = task % blocks * kBlock;
        const int64_t i1 = std::min(inner, i0 + kBlock);
        for (int64_t k = 0; k < count; ++k) {
          const T* src = dyp + (o * count + k) * inner;
          float* dst = acc + (o * axis_dim + wrapped[k]) * inner;
          for (int64_t i = i0; i < i1; ++i) dst[i] += LoadF(src[i]);
        }
      }
    });
  });
  out.Finish();
  return absl::OkStatus();
}

}  // namespace

void RegisterGradientKernels(KernelTable& table) {
  auto add = [&](const char* op, KernelFn fn) {
    table.Register({kCastorDomain, op, FloatDTypesIn(kGradDTypes), fn});
  };
  add("ConvGrad", ConvGradKernel);
  add("MaxPoolGrad", PoolGradKernel<true>);
  add("AveragePoolGrad", PoolGradKernel<false>);
  add("GlobalAveragePoolGrad", GlobalAveragePoolGradKernel);
  add("BatchNormalizationGrad", BatchNormGradKernel);
  add("LayerNormalizationGrad", LayerNormGradKernel);
  add("SoftmaxGrad", SoftmaxGradKernel<false>);
  add("LogSoftmaxGrad", SoftmaxGradKernel<true>);
  add("SoftmaxCrossEntropyLossGrad", SoftmaxCrossEntropyLossGradKernel);
  add("ReluGrad", ReluGradKernel);
  add("ReduceToShapeOf", ReduceToShapeOfKernel);
  add("GatherGrad", GatherGradKernel);
}

}  // namespace castor::cpu
