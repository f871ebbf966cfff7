// CUDA kernels: losses family (ops of graph/ops/losses.cc) and the
// com.castor gradient of softmax cross-entropy:
//   SoftmaxCrossEntropyLoss(scores, labels[, weights]) -> (loss[, log_prob])
//   NegativeLogLikelihoodLoss(log_probs, labels[, weights]) -> loss
//   SoftmaxCrossEntropyLossGrad(dLoss, scores, labels[, weights]) -> dScores
// over scores [N, C, d1, ..., dk] with int32/int64 labels [N, d1, ..., dk],
// as backend/cpu/losses.cc: optional per-class weights [C], optional
// ignore_index, reduction none | sum | mean (mean = sum(w_i * loss_i) /
// sum(w_i), w_i = weights[label_i] or 1, 0 for ignored positions; all
// positions ignored gives 0 / 0 = NaN, as on the CPU).
//
// One warp handles one position (the C scores of one (n, d1..dk), `inner`
// apart): line maximum, sum of exp(x - max), log-softmax of the label, the
// log_prob column when asked for, or the gradient column. Arithmetic is
// float32 for float32/float16/bfloat16; the reductions over positions run
// in one block (float32 for the loss, float64 for the gradient's weight
// total, as the CPU). The label check fails the node with the CPU's error
// naming the first label outside [0, C) that is not ignore_index and its
// position: on the host when the executor has a host copy of the labels
// (fed labels), without waiting for the device; otherwise the kernel
// records the first such position on the device (atomicMin) and reads that
// one flag back once its work is queued (an 8-byte synchronising copy).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/op_geometry.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

constexpr int kWarpsPerBlock = kThreads / kWarpSize;
// "No invalid label": the all-ones pattern cudaMemsetAsync(0xff) writes.
constexpr unsigned long long kNoBadLabel = ~0ull;

enum class Reduction { kNone, kSum, kMean };

// ---- positions -----------------------------------------------------------------

// What one position reads: its scores column and label.
template <typename L>
struct PositionLabels {
  const L* labels;
  int64_t classes;
  int64_t inner;
  bool has_ignore;
  int64_t ignore_index;
  unsigned long long* first_bad;  // the first position with an invalid label (nullptr:
                                  // checked on the host already)

  // The label of position p when it counts (not ignored, in range), else -1;
  // an invalid label is recorded in *first_bad by lane 0.
  __device__ int64_t UsableLabel(int64_t p, int lane) const {
    const int64_t label = static_cast<int64_t>(labels[p]);
    if (has_ignore && label == ignore_index) return -1;
    if (label < 0 || label >= classes) {
      if (lane == 0 && first_bad != nullptr) {
        atomicMin(first_bad, static_cast<unsigned long long>(p));
      }
      return -1;
    }
    return label;
  }
  // The offset of the position's class-0 score in [N, C, inner].
  __device__ int64_t ColumnBase(int64_t p) const {
    return (p / inner) * classes * inner + p % inner;
  }
};

// Line maximum and sum of exp(x - max) of a scores column, in every lane.
template <typename T>
__device__ void ColumnStats(const T* column, int64_t classes, int64_t inner, int lane,
                            float* max_out, float* sum_out) {
  float max = -INFINITY;
  for (int64_t c = lane; c < classes; c += kWarpSize) max = fmaxf(max, ToFloat(column[c * inner]));
  max = WarpMax(max);
  float sum = 0.0f;
  for (int64_t c = lane; c < classes; c += kWarpSize) sum += expf(ToFloat(column[c * inner]) - max);
  *max_out = max;
  *sum_out = WarpSum(sum);
}

// Per position (one warp each): the weighted loss -w * log p(label) (or
// -w * x[label] for NLL) and its weight w; 0 and 0 for ignored positions.
// With `loss_out` the loss is stored there (reduction none), otherwise in
// `losses` and the weight in `weights_used`. `log_prob` (may be null) gets
// the log-softmax of every position.
template <typename T, typename L, bool kSoftmax>
__global__ void LossPerPosition(const T* scores, const T* weights, PositionLabels<L> pl,
                                int64_t positions, T* log_prob, T* loss_out, float* losses,
                                float* weights_used) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  for (int64_t p = first; p < positions; p += static_cast<int64_t>(kWarpsPerBlock) * gridDim.x) {
    const int64_t base = pl.ColumnBase(p);
    const T* column = scores + base;
    const int64_t label = pl.UsableLabel(p, lane);
    float picked = 0.0f;  // log-probability (NLL: the input) of the label
    if (kSoftmax) {
      float max, sum;
      ColumnStats(column, pl.classes, pl.inner, lane, &max, &sum);
      const float log_sum = logf(sum);
      if (log_prob != nullptr) {
        T* out_column = log_prob + base;
        for (int64_t c = lane; c < pl.classes; c += kWarpSize) {
          out_column[c * pl.inner] = FromFloat<T>(ToFloat(column[c * pl.inner]) - max - log_sum);
        }
      }
      if (label >= 0) picked = ToFloat(column[label * pl.inner]) - max - log_sum;
    } else if (label >= 0) {
      picked = ToFloat(column[label * pl.inner]);
    }
    if (lane == 0) {
      const float weight = label < 0 ? 0.0f : (weights != nullptr ? ToFloat(weights[label]) : 1.0f);
      const float loss = label < 0 ? 0.0f : -weight * picked;
      if (loss_out != nullptr) {
        loss_out[p] = FromFloat<T>(loss);
      } else {
        losses[p] = loss;
        weights_used[p] = weight;
      }
    }
  }
}

// One block: *out = sum(losses), divided by sum(weights_used) for the mean.
template <typename T>
__global__ void ReduceLosses(const float* losses, const float* weights_used, int64_t positions,
                             bool mean, T* out) {
  float loss_sum = 0.0f, weight_sum = 0.0f;
  for (int64_t p = threadIdx.x; p < positions; p += blockDim.x) {
    loss_sum += losses[p];
    weight_sum += weights_used[p];
  }
  loss_sum = BlockSum(loss_sum);
  weight_sum = BlockSum(weight_sum);
  if (threadIdx.x == 0) *out = FromFloat<T>(mean ? loss_sum / weight_sum : loss_sum);
}

// One block: *scale = 1 / sum of the weights of the positions that count
// (float64 sum, as the CPU), the gradient's factor for the mean.
template <typename T, typename L>
__global__ void MeanScale(const T* weights, PositionLabels<L> pl, int64_t positions, float* scale) {
  double total = 0.0;
  for (int64_t p = threadIdx.x; p < positions; p += blockDim.x) {
    const int64_t label = static_cast<int64_t>(pl.labels[p]);
    if ((pl.has_ignore && label == pl.ignore_index) || label < 0 || label >= pl.classes) continue;
    total += weights != nullptr ? static_cast<double>(ToFloat(weights[label])) : 1.0;
  }
  total = BlockSum(total);
  if (threadIdx.x == 0) *scale = static_cast<float>(1.0 / total);  // 0 / 0: NaN, as the CPU
}

// Per position (one warp each): dScores column = (softmax - onehot(label))
// * weight * upstream * scale, zero for ignored positions.
template <typename T, typename L>
__global__ void CrossEntropyGrad(const T* d_loss, bool per_position_upstream, const T* scores,
                                 const T* weights, const float* scale, PositionLabels<L> pl,
                                 int64_t positions, T* d_scores) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  for (int64_t p = first; p < positions; p += static_cast<int64_t>(kWarpsPerBlock) * gridDim.x) {
    const int64_t base = pl.ColumnBase(p);
    const T* column = scores + base;
    T* out_column = d_scores + base;
    const int64_t label = pl.UsableLabel(p, lane);
    if (label < 0) {
      for (int64_t c = lane; c < pl.classes; c += kWarpSize) {
        out_column[c * pl.inner] = FromFloat<T>(0.0f);
      }
      continue;
    }
    const float upstream = ToFloat(d_loss[per_position_upstream ? p : 0]);
    const float factor = (weights != nullptr ? ToFloat(weights[label]) : 1.0f) * upstream *
                         (scale != nullptr ? *scale : 1.0f);
    float max, sum;
    ColumnStats(column, pl.classes, pl.inner, lane, &max, &sum);
    for (int64_t c = lane; c < pl.classes; c += kWarpSize) {
      const float prob = expf(ToFloat(column[c * pl.inner]) - max) / sum;
      out_column[c * pl.inner] = FromFloat<T>((prob - (c == label ? 1.0f : 0.0f)) * factor);
    }
  }
}

// ---- host side -----------------------------------------------------------------

unsigned WarpBlocks(int64_t positions) {
  const int64_t blocks = (positions + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));
}

// Calls f(TypeTag<L>{}) for int32/int64 labels.
template <typename F>
absl::Status DispatchLabel(DType dtype, F&& f) {
  if (dtype == DType::kInt32) return f(TypeTag<int32_t>{});
  return f(TypeTag<int64_t>{});
}

// The label settings of a node and the device flag of its first invalid
// label (nullptr when the labels were checked on the host).
struct LabelCheck {
  bool has_ignore = false;
  int64_t ignore_index = 0;
  unsigned long long* first_bad = nullptr;

  template <typename L>
  PositionLabels<L> For(const TensorView& labels, int64_t classes, int64_t inner) const {
    return {labels.as<L>(), classes, inner, has_ignore, ignore_index, first_bad};
  }
};

// The CPU's error for invalid `label` at `position`, prefixed by `prefix`.
absl::Status LabelError(const KernelContext& ctx, const LabelCheck& check, int64_t label,
                        int64_t position, int64_t classes, const std::string& prefix) {
  return ctx.Error(absl::StrCat(
      prefix, "label ", label, " at position ", position, " is out of range [0, ", classes, ")",
      check.has_ignore ? absl::StrCat(" and is not ignore_index ", check.ignore_index)
                       : std::string()));
}

// Checks the labels on the host when the executor has a host copy of them
// (fed labels: no wait for the device); otherwise sets up a device flag
// that FinishLabelCheck reads.
absl::StatusOr<LabelCheck> StartLabelCheck(KernelContext& ctx, const TensorView& labels,
                                           int64_t classes, const std::string& prefix) {
  LabelCheck check;
  check.has_ignore = ctx.node().has_attribute("ignore_index");
  check.ignore_index = ctx.GetInt("ignore_index", 0);
  if (labels.host_data != nullptr) {
    for (int64_t p = 0; p < labels.num_elements(); ++p) {
      const int64_t label = labels.dtype == DType::kInt32
                                ? static_cast<const int32_t*>(labels.host_data)[p]
                                : static_cast<const int64_t*>(labels.host_data)[p];
      if (check.has_ignore && label == check.ignore_index) continue;
      if (label < 0 || label >= classes) {
        return LabelError(ctx, check, label, p, classes, prefix);
      }
    }
    return check;
  }
  CASTOR_ASSIGN_OR_RETURN(void* flag, ctx.Scratch(sizeof(unsigned long long)));
  check.first_bad = static_cast<unsigned long long*>(flag);
  CASTOR_CUDA_CALL(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), Stream(ctx)));
  return check;
}

// Reads the flag back (synchronises) and, when a label was invalid, returns
// the CPU's error for it, prefixed by `prefix`.
absl::Status FinishLabelCheck(const KernelContext& ctx, const LabelCheck& check,
                              const TensorView& labels, int64_t classes,
                              const std::string& prefix) {
  if (check.first_bad == nullptr) return absl::OkStatus();  // checked on the host
  unsigned long long first_bad = kNoBadLabel;
  CASTOR_RETURN_IF_ERROR(ctx.backend().CopyToHost(&first_bad, check.first_bad, sizeof(first_bad)));
  if (first_bad == kNoBadLabel) return absl::OkStatus();
  const int64_t position = static_cast<int64_t>(first_bad);
  int64_t label = 0;
  if (labels.dtype == DType::kInt32) {
    int32_t narrow = 0;
    CASTOR_RETURN_IF_ERROR(
        ctx.backend().CopyToHost(&narrow, labels.as<int32_t>() + position, sizeof(narrow)));
    label = narrow;
  } else {
    CASTOR_RETURN_IF_ERROR(
        ctx.backend().CopyToHost(&label, labels.as<int64_t>() + position, sizeof(label)));
  }
  return LabelError(ctx, check, label, position, classes, prefix);
}

// The reduction attribute as common::PlanLoss and PlanCrossEntropyGrad
// checked it.
Reduction ReductionOf(const std::string& reduction) {
  if (reduction == "none") return Reduction::kNone;
  if (reduction == "sum") return Reduction::kSum;
  return Reduction::kMean;
}

// ---- SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss ----------------------------

template <bool kSoftmax>
absl::Status LossKernel(KernelContext& ctx) {
  const TensorView& scores = ctx.input(0);
  const TensorView& labels = ctx.input(1);
  const TensorView* weights = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  CASTOR_ASSIGN_OR_RETURN(const common::LossGeometry geometry, common::PlanLoss(ctx));
  const Reduction reduction = ReductionOf(geometry.reduction);
  const int64_t classes = geometry.classes, inner = geometry.inner;
  if (weights != nullptr && weights->dtype != scores.dtype) {
    return ctx.Error(absl::StrCat("weights are ", DTypeName(weights->dtype), " but scores are ",
                                  DTypeName(scores.dtype), "; they must match"));
  }
  const int64_t positions = scores.dims[0] * inner;
  CASTOR_ASSIGN_OR_RETURN(const LabelCheck check, StartLabelCheck(ctx, labels, classes, ""));
  TensorView* log_prob = nullptr;
  if (kSoftmax && ctx.num_outputs() > 1 && ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(log_prob, ctx.Output(1, scores.dtype, scores.dims));
  }
  TensorView* loss = nullptr;
  float* losses = nullptr;
  float* weights_used = nullptr;
  if (reduction == Reduction::kNone) {
    CASTOR_ASSIGN_OR_RETURN(loss, ctx.Output(0, scores.dtype, labels.dims));
  } else {
    CASTOR_ASSIGN_OR_RETURN(loss, ctx.Output(0, scores.dtype, {}));
    const size_t bytes = static_cast<size_t>(positions) * sizeof(float);
    CASTOR_ASSIGN_OR_RETURN(void* loss_buffer, ctx.Scratch(bytes));
    CASTOR_ASSIGN_OR_RETURN(void* weight_buffer, ctx.Scratch(bytes));
    losses = static_cast<float*>(loss_buffer);
    weights_used = static_cast<float*>(weight_buffer);
  }
  CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, scores.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchLabel(labels.dtype, [&](auto label_tag) {
      using L = typename decltype(label_tag)::type;
      const cudaStream_t stream = Stream(ctx);
      if (positions > 0) {
        LossPerPosition<T, L, kSoftmax><<<WarpBlocks(positions), kThreads, 0, stream>>>(
            scores.as<T>(), weights != nullptr ? weights->as<T>() : nullptr,
            check.For<L>(labels, classes, inner), positions,
            log_prob != nullptr ? log_prob->as<T>() : nullptr,
            reduction == Reduction::kNone ? loss->as<T>() : nullptr, losses, weights_used);
        CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
      }
      if (reduction != Reduction::kNone) {
        ReduceLosses<T><<<1, kThreads, 0, stream>>>(losses, weights_used, positions,
                                                    reduction == Reduction::kMean, loss->as<T>());
        CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
      }
      return absl::OkStatus();
    });
  }));
  return FinishLabelCheck(ctx, check, labels, classes, "");
}

// ---- SoftmaxCrossEntropyLossGrad -------------------------------------------------------

absl::Status CrossEntropyGradKernel(KernelContext& ctx) {
  const TensorView& d_loss = ctx.input(0);
  const TensorView& scores = ctx.input(1);
  const TensorView& labels = ctx.input(2);
  const TensorView* weights = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  CASTOR_ASSIGN_OR_RETURN(const common::LossGeometry geometry, common::PlanCrossEntropyGrad(ctx));
  const Reduction reduction = ReductionOf(geometry.reduction);
  const int64_t classes = geometry.classes, inner = geometry.inner;
  const int64_t positions = scores.dims[0] * inner;
  CASTOR_ASSIGN_OR_RETURN(TensorView * d_scores, ctx.Output(0, scores.dtype, scores.dims));
  if (positions == 0) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(const LabelCheck check,
                          StartLabelCheck(ctx, labels, classes, "input 2 (labels): "));
  float* scale = nullptr;
  if (reduction == Reduction::kMean) {
    CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(sizeof(float)));
    scale = static_cast<float*>(buffer);
  }
  CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, scores.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchLabel(labels.dtype, [&](auto label_tag) {
      using L = typename decltype(label_tag)::type;
      const cudaStream_t stream = Stream(ctx);
      const T* w = weights != nullptr ? weights->as<T>() : nullptr;
      const PositionLabels<L> pl = check.For<L>(labels, classes, inner);
      if (scale != nullptr) {
        MeanScale<T, L><<<1, kThreads, 0, stream>>>(w, pl, positions, scale);
        CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
      }
      CrossEntropyGrad<T, L><<<WarpBlocks(positions), kThreads, 0, stream>>>(
          d_loss.as<T>(), reduction == Reduction::kNone, scores.as<T>(), w, scale, pl, positions,
          d_scores->as<T>());
      return CheckLaunch(ctx);
    });
  }));
  return FinishLabelCheck(ctx, check, labels, classes, "input 2 (labels): ");
}

}  // namespace

void RegisterLossKernels(KernelTable& table) {
  table.Register(KernelDef{"", "SoftmaxCrossEntropyLoss", FloatDTypesIn(CudaFloatDTypes()),
                           &LossKernel<true>, false});
  table.Register(KernelDef{kCastorDomain, "SoftmaxCrossEntropyLoss",
                           FloatDTypesIn(CudaFloatDTypes()), &LossKernel<true>, false});
  table.Register(KernelDef{"", "NegativeLogLikelihoodLoss", FloatDTypesIn(CudaFloatDTypes()),
                           &LossKernel<false>, false});
  table.Register(KernelDef{kCastorDomain, "SoftmaxCrossEntropyLossGrad",
                           FloatDTypesIn(CudaFloatDTypes()), &CrossEntropyGradKernel, false});
}

}  // namespace castor::cuda
