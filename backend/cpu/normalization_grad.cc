// CPU kernels of BatchNormalizationGrad (training mode: batch statistics
// recomputed from X over all axes but 1, biased variance),
// LayerNormalizationGrad (statistics over the axes from `axis` on) and
// InstanceNormalizationGrad (statistics per (n, c) row over D1, ...),
// castor's gradient ops (graph/ops/gradient_ops.cc). All accumulate their
// statistics and parameter gradients in float64 (BatchNormalizationGrad
// sums each image row in float32 lanes first: batch_norm_loops.h; it reads
// float32 and 16-bit X and dY as stored, and takes the forward's batch
// mean where the graph passes it), skip the outputs nothing reads
// (KernelContext::output_read), and run channels or rows in parallel on
// backend/cpu/parallel.h; 16-bit inputs widen exactly and every output
// rounds once on store. LayerNormalizationGrad widens and rounds 16-bit
// rows a few at a time as it goes (Float32Rows); its rows with a dense
// scale run four at a time on AVX-512 (layer_norm_rows.h, the same bits).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/backend.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/batch_norm_loops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/layer_norm_rows.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/simd16.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// Writes float64 values to a new output `index` with `dtype` and `dims`.
absl::Status WriteDoubles(KernelContext& ctx, int index, DType dtype,
                          const std::vector<int64_t>& dims, const std::vector<double>& values) {
  absl::StatusOr<TensorView*> out = ctx.Output(index, dtype, dims);
  if (!out.ok()) return out.status();
  std::vector<float> narrowed(values.begin(), values.end());
  FromFloat32(dtype, narrowed.data(), (*out)->data, static_cast<int64_t>(narrowed.size()));
  return absl::OkStatus();
}

// The scale and bias gradients (outputs 1 and 2, where the graph reads
// them), shaped and typed as the scale input.
absl::Status WriteScaleBiasGrads(KernelContext& ctx, DType dtype, const std::vector<int64_t>& dims,
                                 const std::vector<double>& d_scale,
                                 const std::vector<double>& d_bias) {
  if (WantsOutput(ctx, 1)) CASTOR_RETURN_IF_ERROR(WriteDoubles(ctx, 1, dtype, dims, d_scale));
  if (WantsOutput(ctx, 2)) CASTOR_RETURN_IF_ERROR(WriteDoubles(ctx, 2, dtype, dims, d_bias));
  return absl::OkStatus();
}

#if defined(CASTOR_SIMD16_X86)
// kRows consecutive rows of LayerNormGrad with a dense scale (x, dy and dx
// rows n apart; dx null: no dX), 8 float64 lanes at a time: the scalar
// loop's arithmetic in the same order, so the same bits. The rows'
// statistics (LayerNormRowStats, layer_norm_rows.h) and sums run side by
// side, each row in its own lanes, so kRows chains of adds are in flight;
// ds and db take the rows' dScale and dBias terms in row order, as the
// scalar loop adds them. x_hat and g are kRows * n doubles of scratch.
template <int kRows>
CASTOR_SIMD16_TARGET void LayerNormGradRowsAvx512(const float* x, const float* dy,
                                                  const float* scale, int64_t n, double epsilon,
                                                  double* ds, double* db, double* x_hat,
                                                  double* g, float* dx) {
  double mean[kRows], inv_std[kRows];
  LayerNormRowStats<kRows>(x, n, epsilon, mean, inv_std);
  __m512d mv[kRows], iv[kRows], g_sum[kRows], g_xhat_sum[kRows];
  for (int r = 0; r < kRows; ++r) {
    mv[r] = _mm512_set1_pd(mean[r]);
    iv[r] = _mm512_set1_pd(inv_std[r]);
    g_sum[r] = g_xhat_sum[r] = _mm512_setzero_pd();
  }
  for (int64_t j = 0; j < n; j += 8) {
    const __mmask8 lanes = TailMask8(n - j);
    const __m512d sv = LoadAsDoubles(scale + j, lanes);
    __m512d dsv = _mm512_maskz_loadu_pd(lanes, ds + j);
    __m512d dbv = _mm512_maskz_loadu_pd(lanes, db + j);
    for (int r = 0; r < kRows; ++r) {
      const __m512d dyv = LoadAsDoubles(dy + r * n + j, lanes);
      const __m512d xh =
          _mm512_mul_pd(_mm512_sub_pd(LoadAsDoubles(x + r * n + j, lanes), mv[r]), iv[r]);
      const __m512d gv = _mm512_mul_pd(dyv, sv);
      _mm512_mask_storeu_pd(x_hat + r * n + j, lanes, xh);
      _mm512_mask_storeu_pd(g + r * n + j, lanes, gv);
      dsv = _mm512_add_pd(dsv, _mm512_mul_pd(dyv, xh));
      dbv = _mm512_add_pd(dbv, dyv);
      g_sum[r] = _mm512_mask_add_pd(g_sum[r], lanes, g_sum[r], gv);
      g_xhat_sum[r] =
          _mm512_mask_add_pd(g_xhat_sum[r], lanes, g_xhat_sum[r], _mm512_mul_pd(gv, xh));
    }
    _mm512_mask_storeu_pd(ds + j, lanes, dsv);
    _mm512_mask_storeu_pd(db + j, lanes, dbv);
  }
  if (dx != nullptr) {
    __m512d g_mean[kRows], g_xhat_mean[kRows];
    for (int r = 0; r < kRows; ++r) {
      g_mean[r] = _mm512_set1_pd(PairwiseTotal(g_sum[r]) / static_cast<double>(n));
      g_xhat_mean[r] = _mm512_set1_pd(PairwiseTotal(g_xhat_sum[r]) / static_cast<double>(n));
    }
    for (int r = 0; r < kRows; ++r) {
      for (int64_t j = 0; j < n; j += 8) {
        const __mmask8 lanes = TailMask8(n - j);
        const __m512d centred =
            _mm512_sub_pd(_mm512_maskz_loadu_pd(lanes, g + r * n + j), g_mean[r]);
        const __m512d v = _mm512_mul_pd(
            iv[r], _mm512_sub_pd(centred, _mm512_mul_pd(_mm512_maskz_loadu_pd(
                                                            lanes, x_hat + r * n + j),
                                                        g_xhat_mean[r])));
        _mm256_mask_storeu_ps(dx + r * n + j, lanes, _mm512_maskz_cvtpd_ps(lanes, v));
      }
    }
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

// ---- BatchNormalizationGrad --------------------------------------------------

// An input of BatchNormalizationGrad of X's layout (X, dY, relu_output)
// channel by channel (ChannelRuns): read as stored when float32 or 16-bit,
// else (float64) through a float32 copy. An absent input (null) gives
// channels without runs (`first` null).
class ChannelSource {
 public:
  ChannelSource(const TensorView* t, const common::BatchNormGradGeometry& geometry)
      : geometry_(geometry) {
    if (t == nullptr) return;
    if (ChannelDType(t->dtype)) {
      dtype_ = t->dtype;
      data_ = t->data;
    } else {
      copy_.emplace(*t);
      data_ = copy_->data();
    }
  }
  ChannelRuns Channel(int64_t c) const {
    if (data_ == nullptr) return ChannelRuns{};
    const int64_t inner = geometry_.inner;
    return ChannelRuns{dtype_, static_cast<const char*>(data_) + c * inner * DTypeSize(dtype_),
                       geometry_.batch, geometry_.channels * inner, inner};
  }

 private:
  const common::BatchNormGradGeometry& geometry_;
  DType dtype_ = DType::kFloat32;
  const void* data_ = nullptr;
  std::optional<Float32In> copy_;
};

// dX of BatchNormalizationGrad: written as stored when X is float32 or
// 16-bit (its dtype), else (float64) through a float32 buffer (Finish).
class InputGradientOut {
 public:
  InputGradientOut(TensorView* dx, const common::BatchNormGradGeometry& geometry)
      : geometry_(geometry) {
    if (ChannelDType(dx->dtype)) {
      dtype_ = dx->dtype;
      data_ = dx->data;
    } else {
      buffer_ = std::make_unique<Float32Out>(dx, /*overwritten=*/true);
      data_ = buffer_->data();
    }
  }
  ChannelOut Channel(int64_t c) const {
    return ChannelOut{dtype_,
                      static_cast<char*>(data_) + c * geometry_.inner * DTypeSize(dtype_)};
  }
  void Finish() const {
    if (buffer_ != nullptr) buffer_->Finish();
  }

 private:
  const common::BatchNormGradGeometry& geometry_;
  DType dtype_ = DType::kFloat32;
  void* data_ = nullptr;
  std::unique_ptr<Float32Out> buffer_;
};

// dX's terms for a channel whose sums (ChannelGradientSums) used `mean`.
InputGradientTerms InputTerms(double scale, double mean, double inv_std, double count,
                              double sum_dy, double sum_dy_xhat) {
  return InputGradientTerms{static_cast<float>(scale * inv_std), static_cast<float>(mean),
                            static_cast<float>(inv_std),
                            static_cast<float>(count > 0 ? sum_dy / count : 0.0),
                            static_cast<float>(count > 0 ? sum_dy_xhat / count : 0.0)};
}

// Synchronised BatchNormalization's gradient (--sync-batchnorm): the mean,
// variance and the sums of dY and dY * x_hat over the global batch, summed
// across the ranks, give dX as one process would compute it for its share
// of the whole batch. Scale's and B's gradients stay this rank's sums: the
// data-parallel step averages them with the other gradients, which makes
// them the global batch's. `saved_mean` (the forward's, input 3; null where
// not given) is already the global batch's (GlobalBatchStatistics in
// normalization.cc, the same sums): with it, the pass over X for the mean
// and its sum across the ranks go, and the global count travels with the
// gradient sums.
absl::Status SyncBatchNormGrad(KernelContext& ctx, const common::BatchNormGradGeometry& geometry,
                               double epsilon, const ChannelSource& x, const ChannelSource& dy,
                               const ChannelSource& relu_output, const float* saved_mean,
                               const Float32In& scale, const InputGradientOut* dx,
                               std::vector<double>& d_scale, std::vector<double>& d_bias) {
  const Backend::CrossRankSum& across_ranks = ctx.backend().cross_rank_sum();
  const int64_t batch = geometry.batch, channels = geometry.channels, inner = geometry.inner;
  const std::string what = absl::StrCat("the gradient sums of BatchNormalizationGrad node '",
                                        ctx.node().name(), "'");
  const double local_count = static_cast<double>(batch * inner);
  double count = local_count;
  std::vector<double> mean(static_cast<size_t>(channels));
  if (saved_mean != nullptr) {
    for (int64_t c = 0; c < channels; ++c) mean[c] = saved_mean[c];
  } else {
    std::vector<double> sums(static_cast<size_t>(channels) + 1);
    ParallelFor(0, channels, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) sums[c] = ChannelSum(x.Channel(c));
    });
    sums[channels] = local_count;
    CASTOR_RETURN_IF_ERROR(across_ranks(sums.data(), sums.size(), what));
    count = sums[channels];
    for (int64_t c = 0; c < channels; ++c) mean[c] = count > 0 ? sums[c] / count : 0.0;
  }
  // Per channel: sum (x - mean)^2, sum dY, sum dY * (x - mean); then the
  // count where the mean came from the forward.
  std::vector<double> local(3 * static_cast<size_t>(channels) + (saved_mean != nullptr));
  ParallelFor(0, channels, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const std::array<double, 3> s =
          ChannelGradientSums(x.Channel(c), dy.Channel(c), relu_output.Channel(c), mean[c]);
      std::copy(s.begin(), s.end(), local.begin() + 3 * c);
    }
  });
  if (saved_mean != nullptr) local.back() = local_count;
  std::vector<double> global = local;
  CASTOR_RETURN_IF_ERROR(across_ranks(global.data(), global.size(), what));
  if (saved_mean != nullptr) count = global.back();
  ParallelFor(0, channels, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const double var = count > 0 ? global[3 * c] / count : 0.0;
      const double inv_std = 1.0 / std::sqrt(var + epsilon);
      d_bias[c] = local[3 * c + 1];
      d_scale[c] = local[3 * c + 2] * inv_std;
      if (dx == nullptr) continue;
      ChannelInputGradient(x.Channel(c), dy.Channel(c), relu_output.Channel(c),
                           InputTerms(scale.data()[c], mean[c], inv_std, count, global[3 * c + 1],
                                      global[3 * c + 2] * inv_std),
                           dx->Channel(c));
    }
  });
  return absl::OkStatus();
}

absl::Status BatchNormGradKernel(KernelContext& ctx) {
  const TensorView& x_view = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::BatchNormGradGeometry geometry,
                          common::PlanBatchNormGrad(ctx));
  const int64_t channels = geometry.channels;
  const double epsilon = ctx.GetFloat("epsilon", 1e-5f);
  const double count = static_cast<double>(geometry.batch * geometry.inner);
  std::vector<double> d_scale(channels), d_bias(channels);
  const ChannelSource x(&x_view, geometry);
  const ChannelSource dy(&ctx.input(0), geometry);
  // The output of a Relu fused after the BatchNormalization (input 4):
  // dY is the Relu's output gradient.
  const ChannelSource relu_output(ctx.has_input(4) ? &ctx.input(4) : nullptr, geometry);
  const Float32In scale(scale_view);
  std::optional<InputGradientOut> dx;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * dx_view, ctx.Output(0, x_view.dtype, x_view.dims));
    dx.emplace(dx_view, geometry);
  }
  // The forward's batch mean where the graph hands it over (input 3,
  // float32: InferNormGrad): the kernels use the mean rounded to float32, so
  // it gives the bits of ChannelSum's and saves a pass over X.
  const float* saved_mean = ctx.has_input(3) ? ctx.input(3).as<float>() : nullptr;
  if (ctx.backend().cross_rank_sum()) {
    CASTOR_RETURN_IF_ERROR(SyncBatchNormGrad(ctx, geometry, epsilon, x, dy, relu_output,
                                             saved_mean, scale, dx ? &*dx : nullptr, d_scale,
                                             d_bias));
  } else {
    // Per channel: the sums, then its dX while X and dY are still in cache.
    ParallelFor(0, channels, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const ChannelRuns xc = x.Channel(c), dyc = dy.Channel(c), rc = relu_output.Channel(c);
        const double mean = saved_mean != nullptr ? saved_mean[c]
                            : count > 0           ? ChannelSum(xc) / count
                                                  : 0.0;
        // (x - mean)^2, dY, dY * (x - mean)
        const std::array<double, 3> sums = ChannelGradientSums(xc, dyc, rc, mean);
        const double var = count > 0 ? sums[0] / count : 0.0;
        const double inv_std = 1.0 / std::sqrt(var + epsilon);
        d_bias[c] = sums[1];
        d_scale[c] = sums[2] * inv_std;  // sum(dY * x_hat)
        if (!dx.has_value()) continue;
        // dX = scale * inv_std * (dY - dBias / M - x_hat * dScale / M)
        ChannelInputGradient(
            xc, dyc, rc,
            InputTerms(scale.data()[c], mean, inv_std, count, d_bias[c], d_scale[c]),
            dx->Channel(c));
      }
    });
  }
  if (dx.has_value()) dx->Finish();
  return WriteScaleBiasGrads(ctx, scale_view.dtype, scale_view.dims, d_scale, d_bias);
}

// ---- LayerNormalizationGrad ----------------------------------------------------

// Rows of `row_length` elements of a tensor read as float32: in place when
// float32, else a few rows at a time widened into scratch (exact for 16-bit
// floats), so a 16-bit tensor is never copied whole.
class Float32Rows {
 public:
  Float32Rows(const TensorView& t, int64_t row_length) : t_(t), row_length_(row_length) {}
  // Rows [r, r + count) as float32, valid until the next call.
  const float* Read(int64_t r, int64_t count) {
    if (t_.dtype == DType::kFloat32) return t_.as<float>() + r * row_length_;
    scratch_.resize(static_cast<size_t>(count * row_length_));
    ToFloat32(t_.dtype,
              static_cast<const char*>(t_.data) + r * row_length_ * DTypeSize(t_.dtype),
              scratch_.data(), count * row_length_);
    return scratch_.data();
  }

 private:
  const TensorView& t_;
  const int64_t row_length_;
  std::vector<float> scratch_;
};

// Rows of an output computed in float32: Rows(r, count) is where to write
// them (the output itself when float32, else scratch; null without an
// output), Write(r, count) then rounds scratch into the output once.
class Float32RowsOut {
 public:
  Float32RowsOut(TensorView* t, int64_t row_length) : t_(t), row_length_(row_length) {}
  float* Rows(int64_t r, int64_t count) {
    if (t_ == nullptr) return nullptr;
    if (t_->dtype == DType::kFloat32) return t_->as<float>() + r * row_length_;
    scratch_.resize(static_cast<size_t>(count * row_length_));
    return scratch_.data();
  }
  void Write(int64_t r, int64_t count) {
    if (t_ == nullptr || t_->dtype == DType::kFloat32) return;
    FromFloat32(t_->dtype, scratch_.data(),
                static_cast<char*>(t_->data) + r * row_length_ * DTypeSize(t_->dtype),
                count * row_length_);
  }

 private:
  TensorView* t_;
  const int64_t row_length_;
  std::vector<float> scratch_;
};

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
  const Float32In scale(scale_view);
  TensorView* dx_view = nullptr;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(dx_view, ctx.Output(0, x.dtype, x.dims));
  }
  const int64_t slices = SliceCount(std::max<int64_t>(outer, 1));
  std::vector<std::vector<double>> d_scale(static_cast<size_t>(slices)),
      d_bias(static_cast<size_t>(slices));
  ParallelFor(0, slices, 1, [&](int64_t lo, int64_t hi) {
    // Scratch for four rows (the vector rows' most; the scalar rows use one).
    std::vector<double> x_hat(static_cast<size_t>(4 * inner)), g(static_cast<size_t>(4 * inner));
    Float32Rows x_rows(x, inner), dy_rows(ctx.input(0), inner);
    Float32RowsOut dx_rows(dx_view, inner);
    for (int64_t slice = lo; slice < hi; ++slice) {
      std::vector<double>& ds = d_scale[slice];
      std::vector<double>& db = d_bias[slice];
      ds.assign(static_cast<size_t>(scale_size), 0.0);
      db.assign(static_cast<size_t>(scale_size), 0.0);
      const int64_t slice_end = SliceBegin(slice + 1, slices, outer);
      for (int64_t r = SliceBegin(slice, slices, outer); r < slice_end; ++r) {
#if defined(CASTOR_SIMD16_X86)
        if (dense_scale && UseFusedSimd16()) {
          // Four rows at a time while the slice has them.
          const bool four = slice_end - r >= 4;
          const int64_t rows = four ? 4 : 1;
          (four ? LayerNormGradRowsAvx512<4> : LayerNormGradRowsAvx512<1>)(
              x_rows.Read(r, rows), dy_rows.Read(r, rows), scale.data(), inner, epsilon,
              ds.data(), db.data(), x_hat.data(), g.data(), dx_rows.Rows(r, rows));
          dx_rows.Write(r, rows);
          r += rows - 1;
          continue;
        }
#endif
        const float* xr = x_rows.Read(r, 1);
        const float* dyr = dy_rows.Read(r, 1);
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
        float* dxr = dx_rows.Rows(r, 1);
        if (dxr == nullptr) continue;
        LaneSums<2> g_sums;  // g, g * x_hat
        g_sums.Add(inner, [&](int64_t j) { return std::array<double, 2>{g[j], g[j] * x_hat[j]}; });
        const double g_mean = g_sums.Total(0) / static_cast<double>(inner);
        const double g_xhat_mean = g_sums.Total(1) / static_cast<double>(inner);
        for (int64_t j = 0; j < inner; ++j) {
          dxr[j] = static_cast<float>(inv_std * (g[j] - g_mean - x_hat[j] * g_xhat_mean));
        }
        dx_rows.Write(r, 1);
      }
    }
  });
  for (int64_t slice = 1; slice < slices; ++slice) {
    for (int64_t i = 0; i < scale_size; ++i) {
      d_scale[0][i] += d_scale[slice][i];
      d_bias[0][i] += d_bias[slice][i];
    }
  }
  return WriteScaleBiasGrads(ctx, scale_view.dtype, sd, d_scale[0], d_bias[0]);
}

// ---- InstanceNormalizationGrad -------------------------------------------------

// Per (n, c) row of M elements, with x_hat = (x - mean) * inv_std:
//   dX = scale[c] * inv_std * (dY - sum(dY) / M - x_hat * sum(dY * x_hat) / M)
// and the row's sum(dY * x_hat) and sum(dY), which add over n (in order) to
// dScale[c] and dBias[c].
absl::Status InstanceNormGradKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  const TensorView& scale_view = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::InstanceNormGeometry geometry,
                          common::PlanInstanceNormGrad(ctx));
  const int64_t channels = geometry.channels, rows = geometry.rows, inner = geometry.inner;
  const double epsilon = ctx.GetFloat("epsilon", 1e-5f);
  const Float32In xf(x);
  const Float32In dyf(ctx.input(0));
  const Float32In scale(scale_view);
  std::optional<Float32Out> dx;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * dx_view, ctx.Output(0, x.dtype, x.dims));
    dx.emplace(dx_view, /*overwritten=*/true);
  }
  std::vector<double> row_dy_xhat(static_cast<size_t>(rows)), row_dy(static_cast<size_t>(rows));
  const double count = static_cast<double>(inner);
  ParallelFor(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xf.data() + r * inner;
      const float* dyr = dyf.data() + r * inner;
      LaneSums<1> sum;
      sum.Add(inner, [&](int64_t j) { return std::array<double, 1>{xr[j]}; });
      const double m = sum.Total(0) / count;
      LaneSums<1> squares;
      squares.Add(inner, [&](int64_t j) {
        const double centred = xr[j] - m;
        return std::array<double, 1>{centred * centred};
      });
      const double inv_std = 1.0 / std::sqrt(squares.Total(0) / count + epsilon);
      LaneSums<2> dy_sums;  // dY, dY * x_hat
      dy_sums.Add(inner, [&](int64_t j) {
        const double d = dyr[j];
        return std::array<double, 2>{d, d * ((xr[j] - m) * inv_std)};
      });
      row_dy[r] = dy_sums.Total(0);
      row_dy_xhat[r] = dy_sums.Total(1);
      if (!dx.has_value()) continue;
      const double a = scale.data()[r % channels] * inv_std;
      const double dy_mean = row_dy[r] / count;
      const double dy_xhat_mean = row_dy_xhat[r] / count;
      float* dxr = dx->data() + r * inner;
      for (int64_t j = 0; j < inner; ++j) {
        const double x_hat = (xr[j] - m) * inv_std;
        dxr[j] = static_cast<float>(a * (dyr[j] - dy_mean - x_hat * dy_xhat_mean));
      }
    }
  });
  if (dx.has_value()) dx->Finish();
  std::vector<double> d_scale(static_cast<size_t>(channels), 0.0),
      d_bias(static_cast<size_t>(channels), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    d_scale[r % channels] += row_dy_xhat[r];
    d_bias[r % channels] += row_dy[r];
  }
  return WriteScaleBiasGrads(ctx, scale_view.dtype, scale_view.dims, d_scale, d_bias);
}

}  // namespace

void RegisterNormalizationGradKernels(KernelTable& table) {
  // dX over dY: a channel's dX is written run by run after its sums, each
  // run after reading it (a float64 dY is copied first).
  RegisterGradientKernel(table, "BatchNormalizationGrad", BatchNormGradKernel,
                         /*in_place_ok=*/true);
  RegisterGradientKernel(table, "LayerNormalizationGrad", LayerNormGradKernel);
  RegisterGradientKernel(table, "InstanceNormalizationGrad", InstanceNormGradKernel);
}

}  // namespace castor::cpu
