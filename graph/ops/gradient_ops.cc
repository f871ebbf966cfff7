// castor's own gradient ops, domain "com.castor" version 1: the backward
// computations the autodiff pass (passes/autodiff.*) emits where ONNX has no
// op. Each takes the upstream gradient first and the forward tensors it
// needs after it; attributes mirror the forward op's.
//   ConvGrad(dY, X, W) -> (dX, dW, dB)                Conv's attributes
//   MaxPoolGrad(dY, X) -> dX                         first maximum per window
//   AveragePoolGrad(dY, X) -> dX
//   GlobalAveragePoolGrad(dY, X) -> dX
//   BatchNormalizationGrad(dY, X, scale[, mean[, relu_output]]) -> (dX, dScale, dBias)
//   LayerNormalizationGrad(dY, X, scale) -> (dX, dScale, dBias)
//   InstanceNormalizationGrad(dY, X, scale) -> (dX, dScale, dBias)
//   SoftmaxGrad(dY, Y) -> dX, LogSoftmaxGrad(dY, Y) -> dX        one axis
//   SoftmaxCrossEntropyLossGrad(dLoss, scores, labels[, weights]) -> dScores
//   ReluGrad(dY, Y) -> dX
//   GeluGrad(dY, X) -> dX
//   ReduceToShapeOf(dY, X) -> dX       sums broadcast axes back to X's shape
//   GatherGrad(dY, indices, data) -> dData               scatter-add on axis
//   GatherNDGrad(dY, indices, data) -> dData     scatter-add of index tuples
//   GatherElementsGrad(dY, indices, data) -> dData   scatter-add on axis
//   ResizeGrad(dY, X[, scales, sizes]) -> dX   dY scattered with Resize's weights
// T is float32, float16 or bfloat16; the normalisation parameters (scale,
// dScale, dBias) may be float32 with 16-bit activations. None of these ops
// has a gradient of its own (no second-order differentiation).
#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/gradient_builder.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

const std::vector<DType> kGradFloats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr const char* kNoSecondOrder = "second-order gradients are not supported";

// Checks that `count` inputs are present, names them in errors.
absl::Status RequireInputs(const InferenceContext& ctx, const std::vector<const char*>& names) {
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    if (i >= ctx.num_inputs() || !ctx.has_input(i)) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") is missing"));
    }
  }
  return absl::OkStatus();
}

// Input i must be a float gradient dtype and, when `same_as` >= 0, share
// input same_as's dtype.
absl::Status RequireFloatInput(const InferenceContext& ctx, int i, const char* name,
                               int same_as = -1) {
  const DType dtype = ctx.input_dtype(i);
  bool ok = false;
  for (DType d : kGradFloats) ok |= d == dtype;
  if (!ok) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") has dtype ", DTypeName(dtype),
                                  "; expected float32, float16 or bfloat16"));
  }
  if (same_as >= 0 && ctx.input_dtype(same_as) != dtype) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") has dtype ", DTypeName(dtype),
                                  " but input ", same_as, " has ",
                                  DTypeName(ctx.input_dtype(same_as)), "; they must match"));
  }
  return absl::OkStatus();
}

// Input i's rank, when known, must be at least `min_rank`.
absl::Status RequireMinRank(const InferenceContext& ctx, int i, const char* name, int min_rank,
                            const char* layout) {
  const Shape& s = ctx.input_shape(i);
  if (s.rank_known() && s.rank() < min_rank) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") must have rank >= ", min_rank, " (",
                                  layout, "); its shape is ", s.ToString()));
  }
  return absl::OkStatus();
}

// Inputs i and j must have the same rank when both are known.
absl::Status RequireSameRank(const InferenceContext& ctx, int i, const char* name_i, int j,
                             const char* name_j) {
  const Shape& a = ctx.input_shape(i);
  const Shape& b = ctx.input_shape(j);
  if (a.rank_known() && b.rank_known() && a.rank() != b.rank()) {
    return ctx.Error(absl::StrCat("input ", i, " (", name_i, ") ", a.ToString(), " and input ", j,
                                  " (", name_j, ") ", b.ToString(), " must have the same rank"));
  }
  return absl::OkStatus();
}

// Inputs i and j must have equal static dims where both are static.
absl::Status RequireSameShape(const InferenceContext& ctx, int i, const char* name_i, int j,
                              const char* name_j) {
  CASTOR_RETURN_IF_ERROR(RequireSameRank(ctx, i, name_i, j, name_j));
  const Shape& a = ctx.input_shape(i);
  const Shape& b = ctx.input_shape(j);
  if (!a.rank_known() || !b.rank_known()) return absl::OkStatus();
  for (int d = 0; d < a.rank(); ++d) {
    if (a[d].is_static() && b[d].is_static() && a[d].value() != b[d].value()) {
      return ctx.Error(absl::StrCat("input ", i, " (", name_i, ") ", a.ToString(), " and input ",
                                    j, " (", name_j, ") ", b.ToString(),
                                    " must have the same shape"));
    }
  }
  return absl::OkStatus();
}

OpDef MakeGradDef(const std::string& op_type, int min_inputs, int max_inputs, int min_outputs,
                  int max_outputs, std::vector<AttrSpec> attributes, InferFn infer,
                  const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.domain = kCastorDomain;
  def.min_opset = 1;
  def.max_opset = 1;
  def.min_inputs = min_inputs;
  def.max_inputs = max_inputs;
  def.min_outputs = min_outputs;
  def.max_outputs = max_outputs;
  def.attributes = std::move(attributes);
  def.infer = std::move(infer);
  def.no_gradient_reason = kNoSecondOrder;
  def.summary = summary;
  return def;
}

// ---- ConvGrad ----------------------------------------------------------------

absl::Status InferConvGrad(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", "X", "W"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY", 1));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 2, "W", 1));
  CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 1, "X", 3, "[N, C, D1, ...]"));
  CASTOR_RETURN_IF_ERROR(RequireSameRank(ctx, 0, "dY", 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireSameRank(ctx, 2, "W", 1, "X"));
  const Shape& w = ctx.input_shape(2);
  if (ctx.GetInt("group", 1) < 1) {
    return ctx.Error(absl::StrCat("attribute 'group' is ", ctx.GetInt("group", 1),
                                  "; expected >= 1"));
  }
  const DType dtype = ctx.input_dtype(1);
  ctx.SetOutput(0, dtype, ctx.input_shape(1));
  if (ctx.num_outputs() > 1) ctx.SetOutput(1, dtype, w);
  if (ctx.num_outputs() > 2) {
    ctx.SetOutput(2, dtype, w.rank_known() ? Shape({w[0]}) : Shape({Dim()}));
  }
  return absl::OkStatus();
}

// ---- pools -------------------------------------------------------------------

absl::Status InferPoolGrad(InferenceContext& ctx, bool windowed) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", "X"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY", 1));
  CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 1, "X", 3, "[N, C, D1, ...]"));
  CASTOR_RETURN_IF_ERROR(RequireSameRank(ctx, 0, "dY", 1, "X"));
  if (windowed && !ctx.has_attribute("kernel_shape")) {
    return ctx.Error("attribute 'kernel_shape' is required");
  }
  ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
  return absl::OkStatus();
}

std::vector<AttrSpec> PoolAttributes() {
  return {{"auto_pad", AttrKind::kString, false},  {"ceil_mode", AttrKind::kInt, false},
          {"dilations", AttrKind::kInts, false},   {"kernel_shape", AttrKind::kInts, true},
          {"pads", AttrKind::kInts, false},        {"strides", AttrKind::kInts, false}};
}

// ---- normalisation -------------------------------------------------------------

// Which normalisation a (dY, X, scale) gradient op belongs to: BatchNorm
// and InstanceNorm take a per-channel scale [C] (InstanceNorm's X has rank
// >= 3), LayerNorm one over its normalised axes.
enum class NormKind { kBatch, kInstance, kLayer };

absl::Status InferNormGrad(InferenceContext& ctx, NormKind kind) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", "X", "scale"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY", 1));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 2, "scale"));
  CASTOR_RETURN_IF_ERROR(RequireSameShape(ctx, 0, "dY", 1, "X"));
  const Shape& x = ctx.input_shape(1);
  const Shape& scale = ctx.input_shape(2);
  if (kind != NormKind::kLayer) {
    if (kind == NormKind::kBatch) {
      CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 1, "X", 2, "[N, C, ...]"));
    } else {
      CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 1, "X", 3, "[N, C, D1, ...]"));
    }
    if (scale.rank_known() && scale.rank() != 1) {
      return ctx.Error(absl::StrCat("input 2 (scale) must be 1-D [C]; its shape is ",
                                    scale.ToString()));
    }
    if (scale.rank_known() && x.rank_known() && scale[0].is_static() && x[1].is_static() &&
        scale[0].value() != x[1].value()) {
      return ctx.Error(absl::StrCat("input 2 (scale) ", scale.ToString(),
                                    " must have C = ", x[1].value(), " entries for X ",
                                    x.ToString()));
    }
  } else if (x.rank_known()) {
    CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 1, "X", 1, "[..., normalised axes]"));
    CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                            ops::NormalizeAxis(ctx, ctx.GetInt("axis", -1), x.rank()));
    if (scale.rank_known() && scale.rank() > x.rank() - axis) {
      return ctx.Error(absl::StrCat("input 2 (scale) ", scale.ToString(),
                                    " has more axes than X ", x.ToString(),
                                    " has from axis ", axis, " on"));
    }
  }
  if (kind == NormKind::kBatch && ctx.num_inputs() > 3 && ctx.has_input(3)) {
    // The forward's batch mean: float32 [C], the value the kernels would
    // compute (they round the float64 mean to float32 before using it).
    if (ctx.input_dtype(3) != DType::kFloat32) {
      return ctx.Error(absl::StrCat("input 3 (mean) has dtype ", DTypeName(ctx.input_dtype(3)),
                                    "; expected float32"));
    }
    const Shape& mean = ctx.input_shape(3);
    if (mean.rank_known() && x.rank_known() &&
        (mean.rank() != 1 || (mean[0].is_static() && x[1].is_static() &&
                              mean[0].value() != x[1].value()))) {
      return ctx.Error(absl::StrCat(
          "input 3 (mean) is ", mean.ToString(), "; expected [",
          x[1].is_static() ? absl::StrCat(x[1].value()) : std::string("C"),
          "], one entry per channel of X ", x.ToString()));
    }
  }
  if (kind == NormKind::kBatch && ctx.num_inputs() > 4 && ctx.has_input(4)) {
    // The output of a Relu fused after the BatchNormalization (castor's
    // relu = 1): dY is that Relu's output gradient.
    CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 4, "relu_output", 1));
    CASTOR_RETURN_IF_ERROR(RequireSameShape(ctx, 4, "relu_output", 1, "X"));
  }
  ctx.SetOutput(0, ctx.input_dtype(1), x);
  if (ctx.num_outputs() > 1) ctx.SetOutput(1, ctx.input_dtype(2), scale);
  if (ctx.num_outputs() > 2) ctx.SetOutput(2, ctx.input_dtype(2), scale);
  return absl::OkStatus();
}

// ---- softmax, relu -------------------------------------------------------------

// (dY, Y) -> dX of Y's shape and dtype; `axis` checked when `with_axis`.
absl::Status InferElementwiseGrad(InferenceContext& ctx, bool with_axis,
                                  const char* forward = "Y") {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", forward}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 1, forward));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY", 1));
  CASTOR_RETURN_IF_ERROR(RequireSameShape(ctx, 0, "dY", 1, forward));
  const Shape& y = ctx.input_shape(1);
  if (with_axis && y.rank_known()) {
    CASTOR_RETURN_IF_ERROR(ops::NormalizeAxis(ctx, ctx.GetInt("axis", -1), y.rank()).status());
  }
  ctx.SetOutput(0, ctx.input_dtype(1), y);
  return absl::OkStatus();
}

// ---- SoftmaxCrossEntropyLossGrad ---------------------------------------------

absl::Status InferSoftmaxCrossEntropyLossGrad(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dLoss", "scores", "labels"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 1, "scores"));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dLoss", 1));
  if (ctx.num_inputs() > 3 && ctx.has_input(3)) {
    CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 3, "weights", 1));
  }
  const DType label_dtype = ctx.input_dtype(2);
  if (label_dtype != DType::kInt32 && label_dtype != DType::kInt64) {
    return ctx.Error(absl::StrCat("input 2 (labels) has dtype ", DTypeName(label_dtype),
                                  "; expected int32 or int64"));
  }
  CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 1, "scores", 2, "[N, C, d1, ...]"));
  const std::string reduction = ctx.GetString("reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none") {
    return ctx.Error(absl::StrCat("attribute 'reduction' is \"", reduction,
                                  "\"; expected \"mean\", \"sum\" or \"none\""));
  }
  const Shape& scores = ctx.input_shape(1);
  const Shape& labels = ctx.input_shape(2);
  if (scores.rank_known() && labels.rank_known() && labels.rank() != scores.rank() - 1) {
    return ctx.Error(absl::StrCat("input 2 (labels) ", labels.ToString(),
                                  " must have rank ", scores.rank() - 1, " for scores ",
                                  scores.ToString()));
  }
  const Shape& d_loss = ctx.input_shape(0);
  if (reduction != "none") {
    const std::optional<int64_t> count = d_loss.NumElements();
    if (count && *count != 1) {
      return ctx.Error(absl::StrCat("input 0 (dLoss) must be a scalar for reduction \"",
                                    reduction, "\"; its shape is ", d_loss.ToString()));
    }
  } else {
    CASTOR_RETURN_IF_ERROR(RequireSameShape(ctx, 0, "dLoss", 2, "labels"));
  }
  ctx.SetOutput(0, ctx.input_dtype(1), scores);
  return absl::OkStatus();
}

// ---- ReduceToShapeOf ----------------------------------------------------------

absl::Status InferReduceToShapeOf(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", "X"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY"));
  const Shape& dy = ctx.input_shape(0);
  const Shape& x = ctx.input_shape(1);
  if (dy.rank_known() && x.rank_known()) {
    if (x.rank() > dy.rank()) {
      return ctx.Error(absl::StrCat("input 1 (X) ", x.ToString(), " has more axes than input 0 (dY) ",
                                    dy.ToString()));
    }
    const int offset = dy.rank() - x.rank();
    for (int d = 0; d < x.rank(); ++d) {
      const Dim& xd = x[d];
      const Dim& yd = dy[offset + d];
      if (xd.is_static() && yd.is_static() && xd.value() != 1 && xd.value() != yd.value()) {
        return ctx.Error(absl::StrCat("input 1 (X) ", x.ToString(),
                                      " does not broadcast to input 0 (dY) ", dy.ToString()));
      }
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

// ---- GatherGrad ----------------------------------------------------------------

// The inputs every gather gradient takes: (dY, indices, data), dY and data
// float, indices int32 or int64.
absl::Status RequireGatherGradInputs(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", "indices", "data"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 2, "data"));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY", 2));
  const DType index_dtype = ctx.input_dtype(1);
  if (index_dtype != DType::kInt32 && index_dtype != DType::kInt64) {
    return ctx.Error(absl::StrCat("input 1 (indices) has dtype ", DTypeName(index_dtype),
                                  "; expected int32 or int64"));
  }
  return absl::OkStatus();
}

absl::Status InferGatherGrad(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireGatherGradInputs(ctx));
  const Shape& dy = ctx.input_shape(0);
  const Shape& indices = ctx.input_shape(1);
  const Shape& data = ctx.input_shape(2);
  if (data.rank_known()) {
    CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 2, "data", 1, "the gathered tensor"));
    CASTOR_RETURN_IF_ERROR(
        ops::NormalizeAxis(ctx, ctx.GetInt("axis", 0), data.rank()).status());
    if (indices.rank_known() && dy.rank_known() &&
        dy.rank() != data.rank() - 1 + indices.rank()) {
      return ctx.Error(absl::StrCat("input 0 (dY) ", dy.ToString(), " must have rank ",
                                    data.rank() - 1 + indices.rank(), " (data ",
                                    data.ToString(), " gathered with indices ",
                                    indices.ToString(), ")"));
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(2), data);
  return absl::OkStatus();
}

// ---- GatherNDGrad, GatherElementsGrad --------------------------------------------

// (dY, indices, data) -> dData of data's shape: the float and index dtypes
// and, where ranks are known, dY's rank (`dy_rank` of data's and indices'
// ranks, or -1 when unknown).
absl::Status InferIndexedGrad(InferenceContext& ctx, int64_t (*dy_rank)(const InferenceContext&,
                                                                         int64_t, int64_t)) {
  CASTOR_RETURN_IF_ERROR(RequireGatherGradInputs(ctx));
  const Shape& dy = ctx.input_shape(0);
  const Shape& indices = ctx.input_shape(1);
  const Shape& data = ctx.input_shape(2);
  if (data.rank_known() && indices.rank_known() && dy.rank_known()) {
    CASTOR_RETURN_IF_ERROR(RequireMinRank(ctx, 2, "data", 1, "the indexed tensor"));
    const int64_t expected = dy_rank(ctx, data.rank(), indices.rank());
    if (expected >= 0 && dy.rank() != expected) {
      return ctx.Error(absl::StrCat("input 0 (dY) ", dy.ToString(), " must have rank ", expected,
                                    " (data ", data.ToString(), " indexed by ",
                                    indices.ToString(), ")"));
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(2), data);
  return absl::OkStatus();
}

// GatherND's output rank: indices' rank - 1 + data's rank - batch_dims - k.
int64_t GatherNDRank(const InferenceContext& ctx, int64_t data_rank, int64_t index_rank) {
  if (index_rank == 0) return -1;
  const Dim& last = ctx.input_shape(1)[static_cast<int>(index_rank) - 1];
  if (!last.is_static()) return -1;
  return index_rank - 1 + data_rank - ctx.GetInt("batch_dims", 0) - last.value();
}

// GatherElements' output rank: indices' rank, which is data's.
int64_t GatherElementsRank(const InferenceContext&, int64_t data_rank, int64_t) {
  return data_rank;
}

// ---- ResizeGrad ----------------------------------------------------------------

absl::Status InferResizeGrad(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireInputs(ctx, {"dY", "X"}));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireFloatInput(ctx, 0, "dY", 1));
  CASTOR_RETURN_IF_ERROR(RequireSameRank(ctx, 0, "dY", 1, "X"));
  if (ctx.num_inputs() > 2 && ctx.has_input(2) && ctx.input_dtype(2) != DType::kFloat32) {
    return ctx.Error(absl::StrCat("input 2 (scales) has dtype ", DTypeName(ctx.input_dtype(2)),
                                  "; expected float32"));
  }
  if (ctx.num_inputs() > 3 && ctx.has_input(3) && ctx.input_dtype(3) != DType::kInt64) {
    return ctx.Error(absl::StrCat("input 3 (sizes) has dtype ", DTypeName(ctx.input_dtype(3)),
                                  "; expected int64"));
  }
  ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
  return absl::OkStatus();
}

}  // namespace

void RegisterGradientOps(OpRegistry& registry) {
  registry.Register(MakeGradDef(
      "ConvGrad", 3, 3, 1, 3,
      {{"auto_pad", AttrKind::kString, false},
       {"dilations", AttrKind::kInts, false},
       {"group", AttrKind::kInt, false},
       {"kernel_shape", AttrKind::kInts, false},
       {"pads", AttrKind::kInts, false},
       {"strides", AttrKind::kInts, false}},
      InferConvGrad, "(dY, X, W) -> (dX, dW, dB): the gradients of Conv (dB = sum of dY)"));
  std::vector<AttrSpec> max_pool_attributes = PoolAttributes();
  max_pool_attributes.push_back({"storage_order", AttrKind::kInt, false});
  registry.Register(MakeGradDef(
      "MaxPoolGrad", 2, 2, 1, 1, std::move(max_pool_attributes),
      [](InferenceContext& ctx) { return InferPoolGrad(ctx, true); },
      "(dY, X) -> dX: MaxPool's gradient, routed to the first maximum of each window"));
  std::vector<AttrSpec> average_pool_attributes = PoolAttributes();
  average_pool_attributes.push_back({"count_include_pad", AttrKind::kInt, false});
  registry.Register(MakeGradDef(
      "AveragePoolGrad", 2, 2, 1, 1, std::move(average_pool_attributes),
      [](InferenceContext& ctx) { return InferPoolGrad(ctx, true); },
      "(dY, X) -> dX: AveragePool's gradient, dY spread evenly over each window"));
  registry.Register(MakeGradDef(
      "GlobalAveragePoolGrad", 2, 2, 1, 1, {},
      [](InferenceContext& ctx) { return InferPoolGrad(ctx, false); },
      "(dY, X) -> dX: GlobalAveragePool's gradient, dY / spatial size everywhere"));
  registry.Register(MakeGradDef(
      "BatchNormalizationGrad", 3, 5, 1, 3, {{"epsilon", AttrKind::kFloat, false}},
      [](InferenceContext& ctx) { return InferNormGrad(ctx, NormKind::kBatch); },
      "(dY, X, scale[, mean[, relu_output]]) -> (dX, dScale, dBias): training-mode "
      "BatchNormalization's gradients (batch statistics recomputed from X; the batch mean taken "
      "from `mean`, the forward's, where given; with `relu_output`, the output of a Relu fused "
      "after the BatchNormalization, dY is the Relu's output gradient and passes where "
      "relu_output > 0)"));
  registry.Register(MakeGradDef(
      "LayerNormalizationGrad", 3, 3, 1, 3,
      {{"axis", AttrKind::kInt, false}, {"epsilon", AttrKind::kFloat, false}},
      [](InferenceContext& ctx) { return InferNormGrad(ctx, NormKind::kLayer); },
      "(dY, X, scale) -> (dX, dScale, dBias): LayerNormalization's gradients (statistics "
      "recomputed from X)"));
  registry.Register(MakeGradDef(
      "InstanceNormalizationGrad", 3, 3, 1, 3, {{"epsilon", AttrKind::kFloat, false}},
      [](InferenceContext& ctx) { return InferNormGrad(ctx, NormKind::kInstance); },
      "(dY, X, scale) -> (dX, dScale, dBias): InstanceNormalization's gradients (per (n, c) "
      "statistics recomputed from X)"));
  registry.Register(MakeGradDef(
      "SoftmaxGrad", 2, 2, 1, 1, {{"axis", AttrKind::kInt, false}},
      [](InferenceContext& ctx) { return InferElementwiseGrad(ctx, true); },
      "(dY, Y) -> dX = Y * (dY - sum(dY * Y, axis))"));
  registry.Register(MakeGradDef(
      "LogSoftmaxGrad", 2, 2, 1, 1, {{"axis", AttrKind::kInt, false}},
      [](InferenceContext& ctx) { return InferElementwiseGrad(ctx, true); },
      "(dY, Y) -> dX = dY - exp(Y) * sum(dY, axis)"));
  registry.Register(MakeGradDef(
      "SoftmaxCrossEntropyLossGrad", 3, 4, 1, 1,
      {{"ignore_index", AttrKind::kInt, false}, {"reduction", AttrKind::kString, false}},
      InferSoftmaxCrossEntropyLossGrad,
      "(dLoss, scores, labels[, weights]) -> dScores: SoftmaxCrossEntropyLoss's gradient"));
  registry.Register(MakeGradDef(
      "ReluGrad", 2, 2, 1, 1, {},
      [](InferenceContext& ctx) { return InferElementwiseGrad(ctx, false); },
      "(dY, Y) -> dX = dY where Y > 0, else 0"));
  registry.Register(MakeGradDef(
      "GeluGrad", 2, 2, 1, 1, {{"approximate", AttrKind::kString, false}},
      [](InferenceContext& ctx) { return InferElementwiseGrad(ctx, false, "X"); },
      "(dY, X) -> dX = dY * Gelu'(X), computed in float32 in one pass (the derivative's "
      "formulas: graph/ops/gradient_rules.cc GeluGradient)"));
  registry.Register(MakeGradDef(
      "ReduceToShapeOf", 2, 2, 1, 1, {}, InferReduceToShapeOf,
      "(dY, X) -> dX: dY summed over the axes broadcasting expanded X along, in X's shape"));
  registry.Register(MakeGradDef(
      "GatherGrad", 3, 3, 1, 1, {{"axis", AttrKind::kInt, false}}, InferGatherGrad,
      "(dY, indices, data) -> dData: zeros of data's shape with dY scatter-added on axis"));
  registry.Register(MakeGradDef(
      "GatherNDGrad", 3, 3, 1, 1, {{"batch_dims", AttrKind::kInt, false}},
      [](InferenceContext& ctx) { return InferIndexedGrad(ctx, GatherNDRank); },
      "(dY, indices, data) -> dData: zeros of data's shape with dY's slices scatter-added at "
      "the index tuples"));
  registry.Register(MakeGradDef(
      "GatherElementsGrad", 3, 3, 1, 1, {{"axis", AttrKind::kInt, false}},
      [](InferenceContext& ctx) { return InferIndexedGrad(ctx, GatherElementsRank); },
      "(dY, indices, data) -> dData: zeros of data's shape with dY[p] added at p with its axis "
      "coordinate replaced by indices[p]"));
  registry.Register(MakeGradDef(
      "ResizeGrad", 2, 4, 1, 1,
      {{"mode", AttrKind::kString, false},
       {"coordinate_transformation_mode", AttrKind::kString, false},
       {"nearest_mode", AttrKind::kString, false},
       {"axes", AttrKind::kInts, false},
       {"antialias", AttrKind::kInt, false},
       {"keep_aspect_ratio_policy", AttrKind::kString, false}},
      InferResizeGrad,
      "(dY, X[, scales, sizes]) -> dX: Resize's adjoint, each dY element added to the X "
      "elements Resize read for it with the same weights (nearest_mode \"simple\": Resize-10's "
      "rounding)"));
}

}  // namespace castor
