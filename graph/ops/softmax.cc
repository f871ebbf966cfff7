// Softmax and LogSoftmax definitions. Before opset 13 `axis` defaults to 1
// and the input is coerced to 2-D [prod(dims[:axis]), prod(dims[axis:])],
// the softmax running over the whole second part; from opset 13 `axis`
// defaults to -1 and the softmax runs along that single axis. Either way
// the output has the input's dtype and shape; inference checks the axis.
#include <string>
#include <vector>

#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

absl::Status InferSoftmax(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      ops::DTypesAt(ctx, {{1, {DType::kFloat16, DType::kFloat32, DType::kFloat64}},
                          {13, {DType::kBFloat16}}})));
  const Shape& x = ctx.input_shape(0);
  if (x.rank_known()) {
    const int64_t default_axis = ctx.opset() < 13 ? 1 : -1;
    CASTOR_RETURN_IF_ERROR(
        ops::NormalizeAxis(ctx, ctx.GetInt("axis", default_axis), x.rank()).status());
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

OpDef MakeSoftmaxOp(const std::string& op_type, const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.min_opset = kMinOnnxOpset;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = 1;
  def.max_inputs = 1;
  def.attributes = {{"axis", AttrKind::kInt, false}};  // default 1 before opset 13, -1 from 13
  def.infer = InferSoftmax;
  def.summary = summary;
  return def;
}

}  // namespace

void RegisterSoftmaxOps(OpRegistry& registry) {
  registry.Register(MakeSoftmaxOp(
      "Softmax", "exp(X) / sum(exp(X)) along axis (opset < 13: over the 2-D coerced rows)"));
  registry.Register(MakeSoftmaxOp(
      "LogSoftmax", "X - log(sum(exp(X))) along axis (opset < 13: over the 2-D coerced rows)"));
}

}  // namespace castor
