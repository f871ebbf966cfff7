// Loss op definitions: SoftmaxCrossEntropyLoss (scores) and
// NegativeLogLikelihoodLoss (log-probabilities), both over an input
// [N, C, d1, ..., dk] with int32/int64 labels [N, d1, ..., dk], optional
// per-class weights [C], ignore_index and reduction none | sum | mean. The
// loss is [] for sum/mean and the labels' shape for none;
// SoftmaxCrossEntropyLoss can also output log_prob, shaped like the scores.
// castor's domain holds a copy of SoftmaxCrossEntropyLoss for the training
// graphs of models below opset 12 (passes/training_graph.cc, AttachLoss).
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

// Shared inference; `bfloat16_since` is the opset where T gained bfloat16
// (13 for SoftmaxCrossEntropyLoss, 22 for NegativeLogLikelihoodLoss).
absl::Status InferLoss(InferenceContext& ctx, int64_t bfloat16_since) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      ops::DTypesAt(ctx, {{1, {DType::kFloat16, DType::kFloat32, DType::kFloat64}},
                          {bfloat16_since, {DType::kBFloat16}}})));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt32, DType::kInt64}));
  if (ctx.has_input(2)) {  // weights: the scores' dtype
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 2, {ctx.input_dtype(0)}));
  }
  const std::string reduction = ctx.GetString("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean") {
    return ctx.Error(absl::StrCat("attribute 'reduction' is \"", reduction,
                                  "\"; expected \"none\", \"sum\" or \"mean\""));
  }

  const Shape& scores = ctx.input_shape(0);
  const Shape& labels = ctx.input_shape(1);
  if (scores.rank_known() && scores.rank() < 2) {
    return ctx.Error(absl::StrCat("input 0 must have rank >= 2 ([N, C, d1, ...]); its shape is ",
                                  scores.ToString()));
  }
  // labels: [N, d1, ..., dk] for scores [N, C, d1, ..., dk].
  std::vector<Dim> label_dims;
  if (labels.rank_known()) label_dims = labels.dims();
  if (scores.rank_known() && labels.rank_known()) {
    if (labels.rank() != scores.rank() - 1) {
      return ctx.Error(absl::StrCat("labels ", labels.ToString(), " must have rank ",
                                    scores.rank() - 1, " ([N, d1, ...]) for input 0 ",
                                    scores.ToString()));
    }
    for (int k = 0; k < labels.rank(); ++k) {
      const Dim& expected = scores[k == 0 ? 0 : k + 1];
      const Dim& got = labels[k];
      if (expected.is_static() && got.is_static() && expected.value() != got.value()) {
        return ctx.Error(absl::StrCat("labels ", labels.ToString(), " do not match input 0 ",
                                      scores.ToString(), " (expected [N, d1, ...])"));
      }
      if (got.is_unknown()) label_dims[k] = expected;
    }
  }
  if (ctx.has_input(2)) {
    const Shape& weights = ctx.input_shape(2);
    if (weights.rank_known() && weights.rank() != 1) {
      return ctx.Error(
          absl::StrCat("weights must be 1-D [C]; their shape is ", weights.ToString()));
    }
    if (weights.rank_known() && scores.rank_known() && weights[0].is_static() &&
        scores[1].is_static() && weights[0].value() != scores[1].value()) {
      return ctx.Error(absl::StrCat("weights ", weights.ToString(),
                                    " must have C = ", scores[1].value(), " entries"));
    }
  }

  const DType dtype = ctx.input_dtype(0);
  if (reduction == "none") {
    Shape loss_shape;  // the labels' shape, else [N, d1, ...] from the scores
    if (labels.rank_known()) {
      loss_shape = Shape(std::move(label_dims));
    } else if (scores.rank_known()) {
      std::vector<Dim> dims = {scores[0]};
      for (int k = 2; k < scores.rank(); ++k) dims.push_back(scores[k]);
      loss_shape = Shape(std::move(dims));
    }
    ctx.SetOutput(0, dtype, std::move(loss_shape));
  } else {
    ctx.SetOutput(0, dtype, Shape::Scalar());
  }
  ctx.SetOutput(1, dtype, scores);  // SoftmaxCrossEntropyLoss's log_prob, when requested
  return absl::OkStatus();
}

OpDef MakeLossOp(const std::string& op_type, int max_outputs, int64_t bfloat16_since,
                 const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.min_opset = 12;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = 2;
  def.max_inputs = 3;
  def.min_outputs = 1;
  def.max_outputs = max_outputs;
  def.attributes = {{"ignore_index", AttrKind::kInt, false},
                    {"reduction", AttrKind::kString, false}};  // default "mean"
  def.infer = [bfloat16_since](InferenceContext& ctx) { return InferLoss(ctx, bfloat16_since); };
  def.summary = summary;
  return def;
}

}  // namespace

void RegisterLossOps(OpRegistry& registry) {
  registry.Register(MakeLossOp(
      "SoftmaxCrossEntropyLoss", 2, 13,
      "cross entropy of softmax(scores [N,C,...]) and int labels [N,...]; optional log_prob"));
  // The same op in castor's domain: the loss the training graph attaches to
  // a model whose opset predates SoftmaxCrossEntropyLoss (below 12). It
  // means exactly what ONNX's opset-13 form means.
  OpDef castor_loss = MakeLossOp(
      "SoftmaxCrossEntropyLoss", 2, 1,
      "ONNX SoftmaxCrossEntropyLoss-13 in castor's domain: the training loss of a model "
      "below opset 12");
  castor_loss.domain = kCastorDomain;
  castor_loss.min_opset = 1;
  castor_loss.max_opset = 1;
  registry.Register(std::move(castor_loss));
  registry.Register(MakeLossOp(
      "NegativeLogLikelihoodLoss", 1, 22,
      "-input[n, label[n], ...] (optionally weighted) over log-probabilities [N,C,...]"));
}

}  // namespace castor
