// CPU kernels: normalization family (ops of graph/ops/normalization.cc).
//
// BatchNormalization: inference (running statistics) and training (batch
// statistics: opset 14+ training_mode=1 outputs running_mean/running_var;
// opsets below 14 train when the optional outputs mean, var, saved_mean,
// saved_var are requested). As the ONNX spec and its reference: the batch
// variance is the biased one (divided by N * spatial), used both to
// normalise and in the running-variance update
//   running = input * momentum + batch * (1 - momentum).
// com.castor BatchNormalizationTraining, the form castor's training graph
// runs, is the same kernel in training mode with one difference, PyTorch's:
// the running-variance update takes the unbiased batch variance (times
// count / (count - 1)). That running variance is what users compare
// castor's with and what the trained model is evaluated with; the ONNX op
// keeps the spec's biased update (its conformance data use it). With a
// cross-rank sum installed (--sync-batchnorm) the training statistics are
// the global batch's (GlobalBatchStatistics).
// X (T), scale/B (T1) and mean/var (T2) may have different float dtypes
// (opset 15). `spatial` = 0 (opsets 7-8) normalises per [C, D1, ...] entry.
// LayerNormalization: statistics over the axes from `axis` on; Scale and B
// broadcast to X, of X's dtype or (castor's form, com.castor) float32 with
// a 16-bit X; optional Mean and InvStdDev outputs in stash_type's dtype;
// rows with a dense float32 scale run four at a time on AVX-512
// (layer_norm_rows.h, the same bits; 16-bit rows widened first, rounded
// once after).
// InstanceNormalization: the statistics of each (n, c) row of X [N, C,
// D1, ...] over D1, ...; Y = (x - mean) * (scale[c] * inv_std) + B[c] with
// the centring and affine map in float64 too, so a mean far from zero
// (|mean| >> std) costs no more than the input's own rounding.
// Statistics accumulate in float64 (BatchNormalization on float32 and
// 16-bit X: each image row's terms in float32 lanes first,
// batch_norm_loops.h); elementwise math is float32 (float64 for float64
// inputs); 16-bit results round once on store. float32 and 16-bit
// BatchNormalization run the vectorised loops of batch_norm_loops.h, a
// feature at a time, writing its Y right after its statistics (the
// cross-rank statistics sum with the same loops); float64 takes the
// generic float64 loops. castor's BatchNormalizationTraining with relu = 1
// applies Relu to Y before its rounding (the bits of a Relu after it).
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/backend.h"
#include "backend/common/elementwise_math.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/batch_norm_loops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/layer_norm_rows.h"
#include "backend/cpu/parallel.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kNormDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                        DType::kFloat64};

template <typename T>
double LoadD(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return LoadF(v);
  }
}

template <typename T>
void StoreD(T* p, double v) {
  if constexpr (std::is_same_v<T, double>) {
    *p = v;
  } else {
    StoreF(p, static_cast<float>(v));
  }
}

// Any float tensor as float64 values.
std::vector<double> ReadDoubles(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.num_elements()));
  DispatchFloat(t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = t.as<T>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = LoadD(p[i]);
  });
  return out;
}

// Writes `values` to a new output `index` (its inferred dtype) of `dims`.
absl::Status WriteDoubles(KernelContext& ctx, int index, const std::vector<int64_t>& dims,
                          const std::vector<double>& values) {
  absl::StatusOr<TensorView*> out = ctx.Output(index, dims);
  if (!out.ok()) return out.status();
  const bool ok = DispatchFloat((*out)->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = (*out)->as<T>();
    for (size_t i = 0; i < values.size(); ++i) StoreD(&p[i], values[i]);
  });
  if (!ok) {
    return ctx.Unimplemented(
        absl::StrCat("output ", index, " has dtype ", DTypeName((*out)->dtype)));
  }
  return absl::OkStatus();
}

// Synchronised BatchNormalization (--sync-batchnorm, Backend::
// cross_rank_sum): the statistics of the global batch, summed across the
// ranks in the same two passes one process makes over the whole batch:
// each channel's sum and the count, then the squared deviations around the
// global mean. `count` is the global batch's values per channel.
absl::Status GlobalBatchStatistics(KernelContext& ctx, const common::BatchNormGeometry& geometry,
                                   std::vector<double>& mean, std::vector<double>& var,
                                   double* count) {
  const TensorView& x = ctx.input(0);
  const Backend::CrossRankSum& across_ranks = ctx.backend().cross_rank_sum();
  const int64_t batch = geometry.batch, features = geometry.features, inner = geometry.inner;
  std::vector<double> sums(static_cast<size_t>(features) + 1);
  // Per channel: the sum of x, or of (x - mean)^2 once `centre` is set.
  const std::vector<double>* centre = nullptr;
  auto channel_sums = [&] {
    if (ChannelDType(x.dtype)) {
      // The loops of the one-process statistics (BatchNormKernel): each
      // image row's float32 lane sums are the same wherever the row is.
      const size_t bytes = DTypeSize(x.dtype);
      ParallelFor(0, features, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t f = lo; f < hi; ++f) {
          const ChannelRuns channel{x.dtype, static_cast<const char*>(x.data) + f * inner * bytes,
                                    batch, features * inner, inner};
          sums[f] = centre == nullptr ? ChannelSum(channel)
                                      : ChannelSquaredDeviations(channel, (*centre)[f]);
        }
      });
      return true;
    }
    return DispatchFloat(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* xp = x.as<T>();
      ParallelFor(0, features, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t f = lo; f < hi; ++f) {
          const double m = centre == nullptr ? 0.0 : (*centre)[f];
          LaneSums<1, kWideSumLanes> sum;
          for (int64_t n = 0; n < batch; ++n) {
            const T* row = xp + (n * features + f) * inner;
            sum.Add(inner, [&](int64_t i) {
              const double v = LoadD(row[i]);
              return std::array<double, 1>{centre == nullptr ? v : (v - m) * (v - m)};
            });
          }
          sums[f] = sum.Total(0);
        }
      });
    });
  };
  if (!channel_sums()) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  sums[features] = static_cast<double>(batch * inner);
  const std::string what =
      absl::StrCat("the batch statistics of BatchNormalization node '", ctx.node().name(), "'");
  CASTOR_RETURN_IF_ERROR(across_ranks(sums.data(), sums.size(), what));
  *count = sums[features];
  for (int64_t f = 0; f < features; ++f) mean[f] = *count > 0 ? sums[f] / *count : 0.0;
  centre = &mean;
  channel_sums();
  CASTOR_RETURN_IF_ERROR(across_ranks(sums.data(), static_cast<size_t>(features), what));
  for (int64_t f = 0; f < features; ++f) var[f] = *count > 0 ? sums[f] / *count : 0.0;
  return absl::OkStatus();
}

absl::Status BatchNormKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::BatchNormGeometry geometry, common::PlanBatchNorm(ctx));
  const bool training = geometry.training;
  const float epsilon = geometry.epsilon;
  const float momentum = geometry.momentum;
  const int64_t batch = geometry.batch, features = geometry.features, inner = geometry.inner;
  // castor's fused BatchNormalization -> Relu (fuse-batchnorm-relu).
  const bool relu = ctx.GetInt("relu", 0) != 0;
  const std::vector<double> scale = ReadDoubles(ctx.input(1));
  const std::vector<double> shift = ReadDoubles(ctx.input(2));
  const std::vector<double> input_mean = ReadDoubles(ctx.input(3));
  const std::vector<double> input_var = ReadDoubles(ctx.input(4));
  std::vector<double> mean = input_mean, var = input_var;

  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
  if (!y.ok()) return y.status();
  // y = x * a + b per feature.
  std::vector<double> a(static_cast<size_t>(features)), b(static_cast<size_t>(features));
  auto set_coefficients = [&](int64_t f) {
    a[f] = scale[f] / std::sqrt(var[f] + static_cast<double>(epsilon));
    b[f] = shift[f] - mean[f] * a[f];
  };
  bool ok = true;
  bool y_written = false;
  double running_var_factor = geometry.running_var_factor;
  if (training && ctx.backend().cross_rank_sum()) {
    double global_count = 0;
    CASTOR_RETURN_IF_ERROR(GlobalBatchStatistics(ctx, geometry, mean, var, &global_count));
    // castor's training form: the unbiased variance of the global batch.
    if (running_var_factor != 1.0 && global_count > 1) {
      running_var_factor = global_count / (global_count - 1);
    }
  } else if (training) {
    // Batch statistics per feature (two passes, float64).
    const double count = static_cast<double>(batch * inner);
    if (ChannelDType(x.dtype)) {
      // Each feature's Y is written right after its statistics, while its
      // values are still in cache (the third pass over them); a 16-bit
      // feature gives the bits of its float32 copy (batch_norm_loops.h).
      const size_t bytes = DTypeSize(x.dtype);
      const char* xp = static_cast<const char*>(x.data);
      char* yp = static_cast<char*>((*y)->data);
      const int64_t stride = features * inner;
      ParallelFor(0, features, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t f = lo; f < hi; ++f) {
          const ChannelRuns channel{x.dtype, xp + f * inner * bytes, batch, stride, inner};
          const double m = count > 0 ? ChannelSum(channel) / count : 0.0;
          mean[f] = m;
          var[f] = count > 0 ? ChannelSquaredDeviations(channel, m) / count : 0.0;
          set_coefficients(f);
          ChannelScaleShift(channel, static_cast<float>(a[f]), static_cast<float>(b[f]),
                            ChannelOut{x.dtype, yp + f * inner * bytes}, relu);
        }
      });
      y_written = true;
    } else {
      ok = DispatchFloat(x.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* xp = x.as<T>();
        ParallelFor(0, features, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t f = lo; f < hi; ++f) {
            LaneSums<1, kWideSumLanes> sum;
            for (int64_t n = 0; n < batch; ++n) {
              const T* row = xp + (n * features + f) * inner;
              sum.Add(inner, [&](int64_t i) { return std::array<double, 1>{LoadD(row[i])}; });
            }
            const double m = count > 0 ? sum.Total(0) / count : 0.0;
            LaneSums<1, kWideSumLanes> squares;
            for (int64_t n = 0; n < batch; ++n) {
              const T* row = xp + (n * features + f) * inner;
              squares.Add(inner, [&](int64_t i) {
                const double dv = LoadD(row[i]) - m;
                return std::array<double, 1>{dv * dv};
              });
            }
            mean[f] = m;
            var[f] = count > 0 ? squares.Total(0) / count : 0.0;
          }
        });
      });
    }
  }
  if (!y_written) {  // inference, the cross-rank statistics, or float64
    for (int64_t f = 0; f < features; ++f) set_coefficients(f);
    if (ChannelDType(x.dtype)) {
      const size_t bytes = DTypeSize(x.dtype);
      const char* xp = static_cast<const char*>(x.data);
      char* yp = static_cast<char*>((*y)->data);
      ParallelFor(0, batch * features, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t f = r % features;
          ChannelScaleShift(ChannelRuns{x.dtype, xp + r * inner * bytes, 1, inner, inner},
                            static_cast<float>(a[f]), static_cast<float>(b[f]),
                            ChannelOut{x.dtype, yp + r * inner * bytes}, relu);
        }
      });
    } else {
      ok = ok && DispatchFloat(x.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using V = std::conditional_t<std::is_same_v<T, double>, double, float>;
        const T* xp = x.as<T>();
        T* yp = (*y)->as<T>();
        ParallelFor(0, batch * features, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t f = r % features;
            const V av = static_cast<V>(a[f]), bv = static_cast<V>(b[f]);
            const T* src = xp + r * inner;
            T* dst = yp + r * inner;
            for (int64_t i = 0; i < inner; ++i) {
              const V v = static_cast<V>(LoadD(src[i])) * av + bv;
              StoreD(&dst[i], relu ? math::ReluOp{}(v) : v);
            }
          }
        });
      });
    }
  }
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  if (!training) return absl::OkStatus();

  std::vector<double> running_mean(static_cast<size_t>(features)),
      running_var(static_cast<size_t>(features));
  for (int64_t f = 0; f < features; ++f) {
    running_mean[f] = input_mean[f] * momentum + mean[f] * (1.0 - momentum);
    running_var[f] =
        input_var[f] * momentum + var[f] * running_var_factor * (1.0 - momentum);
  }
  const std::vector<int64_t>& stats_dims = ctx.input(3).dims;
  // Opset 14+: (running_mean, running_var); before: (mean, var, saved_mean,
  // saved_var), the saved ones being the batch statistics.
  const std::vector<double>* outputs[] = {&running_mean, &running_var, &mean, &var};
  for (int i = 1; i < ctx.num_outputs() && i <= 4; ++i) {
    if (!ctx.has_output(i)) continue;
    if (absl::Status s = WriteDoubles(ctx, i, stats_dims, *outputs[i - 1]); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Offsets into a tensor of `dims` broadcast (right-aligned) to X's `x_dims`,
// split into the part from the outer axes [0, axis) and the inner ones.
struct BroadcastOffsets {
  std::vector<int64_t> outer, inner;
};

BroadcastOffsets BroadcastTo(const std::vector<int64_t>& dims, const std::vector<int64_t>& x_dims,
                             int64_t axis) {
  const int64_t xr = static_cast<int64_t>(x_dims.size());
  const int64_t pr = static_cast<int64_t>(dims.size());
  std::vector<int64_t> stride(xr, 0);
  int64_t step = 1;
  for (int64_t d = xr - 1; d >= 0; --d) {
    const int64_t pd = d - (xr - pr);
    if (pd < 0) continue;
    if (dims[pd] != 1) stride[d] = step;
    step *= dims[pd];
  }
  auto offsets = [&](int64_t from, int64_t to) {
    std::vector<int64_t> out(1, 0);
    for (int64_t d = from; d < to; ++d) {
      std::vector<int64_t> next;
      next.reserve(out.size() * x_dims[d]);
      for (int64_t base : out) {
        for (int64_t i = 0; i < x_dims[d]; ++i) next.push_back(base + i * stride[d]);
      }
      out = std::move(next);
    }
    return out;
  };
  return {offsets(0, axis), offsets(axis, xr)};
}

#if defined(CASTOR_SIMD16_X86)
// kRows consecutive float32 rows of n with a dense scale (and bias, or
// none): their statistics side by side (LayerNormRowStats,
// layer_norm_rows.h) into mean and inv_std, then y = (x - mean) * inv_std *
// scale + bias in float32, the portable loop's arithmetic in its order (no
// FMA: -ffp-contract=off), so the same bits.
template <int kRows>
CASTOR_SIMD16_TARGET void LayerNormRowsAvx512(const float* x, const float* scale,
                                              const float* bias, int64_t n, double epsilon,
                                              double* mean, double* inv_std, float* y) {
  LayerNormRowStats<kRows>(x, n, epsilon, mean, inv_std);
  for (int r = 0; r < kRows; ++r) {
    const __m512 mv = _mm512_set1_ps(static_cast<float>(mean[r]));
    const __m512 iv = _mm512_set1_ps(static_cast<float>(inv_std[r]));
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 lanes = TailMask(n - i);
      __m512 v = _mm512_mul_ps(
          _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + r * n + i), mv), iv),
          _mm512_maskz_loadu_ps(lanes, scale + i));
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, bias + i));
      _mm512_mask_storeu_ps(y + r * n + i, lanes, v);
    }
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

absl::Status LayerNormKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  CASTOR_ASSIGN_OR_RETURN(const common::LayerNormGeometry geometry, common::PlanLayerNorm(ctx));
  const int64_t axis = geometry.axis, outer = geometry.outer, inner = geometry.inner;
  const float epsilon = ctx.GetFloat("epsilon", 1e-5f);
  const BroadcastOffsets scale_at = BroadcastTo(ctx.input(1).dims, x.dims, axis);
  const bool has_bias = ctx.has_input(2);
  const BroadcastOffsets bias_at =
      has_bias ? BroadcastTo(ctx.input(2).dims, x.dims, axis) : BroadcastOffsets{};
  // Scale and bias hold one element per normalised position, in order (the
  // usual [D] parameters of a [..., D] LayerNorm).
  auto dense = [&](const BroadcastOffsets& at) {
    for (int64_t i = 0; i < inner; ++i) {
      if (at.inner[i] != i) return false;
    }
    return true;
  };
  const bool dense_affine = dense(scale_at) && (!has_bias || dense(bias_at));
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
  if (!y.ok()) return y.status();
  std::vector<double> row_mean(static_cast<size_t>(outer)), row_inv_std(static_cast<size_t>(outer));
  const DType parameter_dtype = ctx.input(1).dtype;
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = std::conditional_t<std::is_same_v<T, double>, double, float>;
    constexpr bool kSixteenBit = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    // The rows with Scale and B of type P: X's, or float32 beside a 16-bit
    // X (castor's form).
    auto normalize_rows = [&](const auto* sp, const auto* bp) {
      using P = std::remove_cv_t<std::remove_pointer_t<decltype(sp)>>;
      // Row r from `in` to `out` (T, or float32 for a widened 16-bit row):
      // float64 statistics, then the affine map in V, rounded on store.
      auto portable_row = [&](int64_t r, const auto* in, auto* out) {
        using In = std::remove_cv_t<std::remove_pointer_t<decltype(in)>>;
        using Out = std::remove_pointer_t<decltype(out)>;
        LaneSums<1> sum;
        sum.Add(inner, [&](int64_t i) { return std::array<double, 1>{LoadD(in[i])}; });
        const double m = inner > 0 ? sum.Total(0) / static_cast<double>(inner) : 0.0;
        LaneSums<1> squares;
        squares.Add(inner, [&](int64_t i) {
          const double dv = LoadD(in[i]) - m;
          return std::array<double, 1>{dv * dv};
        });
        const double var = inner > 0 ? squares.Total(0) / static_cast<double>(inner) : 0.0;
        const double inv_std = 1.0 / std::sqrt(var + static_cast<double>(epsilon));
        row_mean[r] = m;
        row_inv_std[r] = inv_std;
        const V mv = static_cast<V>(m), iv = static_cast<V>(inv_std);
        const P* s_row = sp + scale_at.outer[r];
        const P* b_row = has_bias ? bp + bias_at.outer[r] : nullptr;
        if constexpr (std::is_same_v<In, float> && std::is_same_v<Out, float> &&
                      std::is_same_v<P, float>) {
          if (dense_affine) {  // the same arithmetic without the index tables: it vectorizes
            if (b_row != nullptr) {
              for (int64_t i = 0; i < inner; ++i) out[i] = (in[i] - mv) * iv * s_row[i] + b_row[i];
            } else {
              for (int64_t i = 0; i < inner; ++i) out[i] = (in[i] - mv) * iv * s_row[i];
            }
            return;
          }
        }
        for (int64_t i = 0; i < inner; ++i) {
          V v = (static_cast<V>(LoadD(in[i])) - mv) * iv *
                static_cast<V>(LoadD(s_row[scale_at.inner[i]]));
          if (b_row != nullptr) v += static_cast<V>(LoadD(b_row[bias_at.inner[i]]));
          StoreD(&out[i], v);
        }
      };
      ParallelFor(0, outer, 1, [&](int64_t lo, int64_t hi) {
        // 16-bit rows on the float32 rows' path: widened into `wide`,
        // normalised into `normalised`, rounded once.
        std::vector<float> wide, normalised;
        for (int64_t r = lo; r < hi; ++r) {
          const T* src = xp + r * inner;
          if constexpr (std::is_same_v<P, float> && (std::is_same_v<T, float> || kSixteenBit)) {
            if (dense_affine) {
              bool vector_rows = false;
#if defined(CASTOR_SIMD16_X86)
              vector_rows = UseFusedSimd16();
#endif
              // On AVX-512 four rows at a time where the range has four that
              // share their scale and bias (a [D] pair: all rows do).
              bool four = vector_rows && hi - r >= 4;
              for (int64_t k = 1; four && k < 4; ++k) {
                four = scale_at.outer[r + k] == scale_at.outer[r] &&
                       (!has_bias || bias_at.outer[r + k] == bias_at.outer[r]);
              }
              const int64_t rows = four ? 4 : 1;
              const float* rows_in = nullptr;
              float* rows_out = nullptr;
              if constexpr (kSixteenBit) {
                wide.resize(static_cast<size_t>(4 * inner));
                normalised.resize(static_cast<size_t>(4 * inner));
                ToFloat32(src, wide.data(), rows * inner);
                rows_in = wide.data();
                rows_out = normalised.data();
              } else {
                rows_in = src;
                rows_out = yp + r * inner;
              }
#if defined(CASTOR_SIMD16_X86)
              if (vector_rows) {
                (four ? LayerNormRowsAvx512<4> : LayerNormRowsAvx512<1>)(
                    rows_in, sp + scale_at.outer[r], has_bias ? bp + bias_at.outer[r] : nullptr,
                    inner, static_cast<double>(epsilon), &row_mean[r], &row_inv_std[r],
                    rows_out);
              }
#endif
              if (!vector_rows) portable_row(r, rows_in, rows_out);
              if constexpr (kSixteenBit) FromFloat32(rows_out, yp + r * inner, rows * inner);
              r += rows - 1;
              continue;
            }
          }
          portable_row(r, src, yp + r * inner);
        }
      });
    };
    if constexpr (kSixteenBit) {
      if (parameter_dtype == DType::kFloat32) {
        normalize_rows(ctx.input(1).as<float>(), has_bias ? ctx.input(2).as<float>() : nullptr);
        return;
      }
    }
    normalize_rows(ctx.input(1).as<T>(), has_bias ? ctx.input(2).as<T>() : nullptr);
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  std::vector<int64_t> stats_dims = x.dims;
  for (int64_t d = axis; d < rank; ++d) stats_dims[d] = 1;
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
    if (absl::Status s = WriteDoubles(ctx, 1, stats_dims, row_mean); !s.ok()) return s;
  }
  if (ctx.num_outputs() > 2 && ctx.has_output(2)) {
    if (absl::Status s = WriteDoubles(ctx, 2, stats_dims, row_inv_std); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status InstanceNormKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::InstanceNormGeometry geometry,
                          common::PlanInstanceNorm(ctx));
  const int64_t channels = geometry.channels, rows = geometry.rows, inner = geometry.inner;
  const double epsilon = ctx.GetFloat("epsilon", 1e-5f);
  const std::vector<double> scale = ReadDoubles(ctx.input(1));
  const std::vector<double> shift = ReadDoubles(ctx.input(2));
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
  if (!y.ok()) return y.status();
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    ParallelFor(0, rows, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* src = xp + r * inner;
        T* dst = yp + r * inner;
        LaneSums<1> sum;
        sum.Add(inner, [&](int64_t i) { return std::array<double, 1>{LoadD(src[i])}; });
        const double m = sum.Total(0) / static_cast<double>(inner);
        LaneSums<1> squares;
        squares.Add(inner, [&](int64_t i) {
          const double dv = LoadD(src[i]) - m;
          return std::array<double, 1>{dv * dv};
        });
        const double var = squares.Total(0) / static_cast<double>(inner);
        const int64_t c = r % channels;
        const double a = scale[c] / std::sqrt(var + epsilon);
        const double b = shift[c];
        for (int64_t i = 0; i < inner; ++i) StoreD(&dst[i], (LoadD(src[i]) - m) * a + b);
      }
    });
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

}  // namespace

void RegisterNormalizationKernels(KernelTable& table) {
  table.Register({"", "BatchNormalization", InputDTypeIn(0, kNormDTypes), BatchNormKernel});
  table.Register({kCastorDomain, "BatchNormalizationTraining", InputDTypeIn(0, kNormDTypes),
                  BatchNormKernel});
  for (const char* domain : {"", kCastorDomain}) {
    table.Register({domain, "LayerNormalization", InputDTypeIn(0, kNormDTypes), LayerNormKernel});
  }
  table.Register(
      {"", "InstanceNormalization", InputDTypeIn(0, kNormDTypes), InstanceNormKernel});
}

}  // namespace castor::cpu
