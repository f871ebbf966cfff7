// CPU kernels: losses family (ops of graph/ops/losses.cc):
// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss over scores
// [N, C, d1, ..., dk] with int32/int64 labels [N, d1, ..., dk], optional
// per-class weights [C], optional ignore_index and reduction none | sum |
// mean (mean = sum(w_i * loss_i) / sum(w_i), with w_i = weights[label_i] or
// 1, and 0 for ignored positions, as in the ONNX reference).
//
// Arithmetic is float32 for float32/float16/bfloat16 scores (float64 for
// float64): 16-bit inputs widen exactly, the loss (and log_prob) round once
// on store, and sums accumulate in the compute type in fixed-size blocks so
// the result does not depend on the thread count.
// SoftmaxCrossEntropyLossGrad (com.castor, graph/ops/gradient_ops.cc)
// recomputes the softmax per position in float32 and scales dLoss by the
// reduction's weights.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/parallel.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

enum class LossKind { kSoftmaxCrossEntropy, kNegativeLogLikelihood };

// Sum in blocks of a fixed size: deterministic, and more accurate than one
// running sum.
template <typename Acc>
Acc BlockedSum(const std::vector<Acc>& values) {
  constexpr size_t kBlock = 256;
  Acc total = 0;
  for (size_t begin = 0; begin < values.size(); begin += kBlock) {
    Acc block = 0;
    const size_t end = std::min(values.size(), begin + kBlock);
    for (size_t i = begin; i < end; ++i) block += values[i];
    total += block;
  }
  return total;
}

// Element reads and writes in the compute type: float64 stays float64,
// other floats widen to float32 and round once on store.
inline double Load(double v) { return v; }
inline float Load(float v) { return v; }
inline float Load(Half v) { return LoadF(v); }
inline float Load(BFloat16 v) { return LoadF(v); }
inline void Store(double* p, double v) { *p = v; }
template <typename T>
inline void Store(T* p, float v) {
  StoreF(p, v);
}

template <typename T>
absl::Status RunLossTyped(KernelContext& ctx, LossKind kind) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const TensorView& scores = ctx.input(0);
  const TensorView& labels = ctx.input(1);
  const TensorView* weights = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const bool has_ignore = ctx.node().has_attribute("ignore_index");
  const int64_t ignore_index = ctx.GetInt("ignore_index", 0);
  CASTOR_ASSIGN_OR_RETURN(const common::LossGeometry geometry, common::PlanLoss(ctx));
  const std::string& reduction = geometry.reduction;
  const int64_t n_batch = geometry.batch, classes = geometry.classes, inner = geometry.inner;
  const int64_t positions = n_batch * inner;
  for (int64_t p = 0; p < positions; ++p) {
    const int64_t label = IntAt(labels, p);
    if (has_ignore && label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      return ctx.Error(absl::StrCat(
          "label ", label, " at position ", p, " is out of range [0, ", classes, ")",
          has_ignore ? absl::StrCat(" and is not ignore_index ", ignore_index) : std::string()));
    }
  }

  T* log_prob = nullptr;
  if (kind == LossKind::kSoftmaxCrossEntropy && ctx.num_outputs() > 1 && ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * lp, ctx.Output(1, scores.dtype, scores.dims));
    log_prob = lp->as<T>();
  }
  const T* x = scores.as<T>();
  const T* w = weights != nullptr ? weights->as<T>() : nullptr;
  std::vector<Acc> losses(positions), position_weights(positions);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, classes));
  ParallelFor(0, positions, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t n = p / inner, d = p % inner;
      const T* column = x + n * classes * inner + d;  // element c at column[c * inner]
      const int64_t label = IntAt(labels, p);
      const bool ignored = has_ignore && label == ignore_index;
      Acc picked = 0;  // log-probability of the label
      if (kind == LossKind::kSoftmaxCrossEntropy) {
        Acc max_value = -std::numeric_limits<Acc>::infinity();
        for (int64_t c = 0; c < classes; ++c) {
          max_value = std::max(max_value, Load(column[c * inner]));
        }
        Acc sum = 0;
        for (int64_t c = 0; c < classes; ++c) sum += std::exp(Load(column[c * inner]) - max_value);
        const Acc log_sum = std::log(sum);
        if (log_prob != nullptr) {
          T* out_column = log_prob + n * classes * inner + d;
          for (int64_t c = 0; c < classes; ++c) {
            Store(&out_column[c * inner], Load(column[c * inner]) - max_value - log_sum);
          }
        }
        if (!ignored) picked = Load(column[label * inner]) - max_value - log_sum;
      } else if (!ignored) {
        picked = Load(column[label * inner]);
      }
      const Acc weight = ignored ? Acc(0) : (w != nullptr ? Load(w[label]) : Acc(1));
      losses[p] = ignored ? Acc(0) : -weight * picked;
      position_weights[p] = weight;
    }
  });

  if (reduction == "none") {
    CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, scores.dtype, labels.dims));
    T* y = out->as<T>();
    for (int64_t p = 0; p < positions; ++p) Store(&y[p], losses[p]);
    return absl::OkStatus();
  }
  Acc total = BlockedSum(losses);
  if (reduction == "mean") total /= BlockedSum(position_weights);
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, scores.dtype, {}));
  Store(out->as<T>(), total);
  return absl::OkStatus();
}

template <LossKind kind>
absl::Status RunLoss(KernelContext& ctx) {
  absl::Status status = ctx.Error("unreachable");
  if (!DispatchFloat(ctx.input(0).dtype, [&](auto tag) {
        status = RunLossTyped<typename decltype(tag)::type>(ctx, kind);
      })) {
    return ctx.Error(
        absl::StrCat("input 0 is ", DTypeName(ctx.input(0).dtype), "; expected a float type"));
  }
  return status;
}

// ---- SoftmaxCrossEntropyLossGrad ---------------------------------------------

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
    const int64_t label = IntAt(labels, p);
    if (has_ignore && label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      return ctx.Error(absl::StrCat(
          "input 2 (labels): label ", label, " at position ", p, " is out of range [0, ", classes,
          ")",
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
        const int64_t label = IntAt(labels, p);
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
}  // namespace

void RegisterLossKernels(KernelTable& table) {
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                     DType::kFloat64};
  table.Register(KernelDef{"", "SoftmaxCrossEntropyLoss", FloatDTypesIn(floats),
                           RunLoss<LossKind::kSoftmaxCrossEntropy>, false});
  table.Register(KernelDef{kCastorDomain, "SoftmaxCrossEntropyLoss", FloatDTypesIn(floats),
                           RunLoss<LossKind::kSoftmaxCrossEntropy>, false});
  table.Register(KernelDef{"", "NegativeLogLikelihoodLoss", FloatDTypesIn(floats),
                           RunLoss<LossKind::kNegativeLogLikelihood>, false});
  RegisterGradientKernel(table, "SoftmaxCrossEntropyLossGrad", SoftmaxCrossEntropyLossGradKernel);
}

}  // namespace castor::cpu
