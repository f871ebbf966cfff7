// Recurrent op definitions: LSTM, GRU and RNN (ONNX opsets 7 and 14; 14
// adds `layout`). They are what torch.onnx.export writes for nn.LSTM,
// nn.GRU and nn.RNN. castor has no kernel for them: the unroll-recurrent
// pass (passes/unroll_recurrent.h) rewrites each node into MatMul, Add,
// Mul, Sigmoid, Tanh, Gather, Concat, ... before anything runs, so these
// definitions only let such models load, type-check and show in `castor
// inspect`.
//
// Inputs (G gates: LSTM 4 (i, o, f, c), GRU 3 (z, r, h), RNN 1; D = 2 when
// direction is "bidirectional", else 1; H = hidden_size):
//   X [seq, batch, input] (layout 1: [batch, seq, input]), W [D, G*H, input],
//   R [D, G*H, H], B [D, 2*G*H]?, sequence_lens [batch] int32?,
//   initial_h [D, batch, H]? (layout 1: [batch, D, H]), LSTM also
//   initial_c (as initial_h) and P [D, 3*H]? (peepholes i, o, f).
// Outputs, all optional: Y [seq, D, batch, H] (layout 1: [batch, seq, D, H]),
//   Y_h [D, batch, H] (layout 1: [batch, D, H]), LSTM also Y_c (as Y_h).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

const std::vector<DType> kRecurrentFloats = {DType::kFloat16, DType::kFloat32, DType::kFloat64};

// Dim `axis` of `shape`, or unknown when the rank is not known.
Dim DimOf(const Shape& shape, int axis) {
  return shape.rank_known() && axis < shape.rank() ? shape[axis] : Dim::Unknown();
}

absl::Status CheckRank(const InferenceContext& ctx, int input, const char* name, int rank,
                       const char* layout) {
  if (!ctx.has_input(input)) return absl::OkStatus();
  const Shape& shape = ctx.input_shape(input);
  if (shape.rank_known() && shape.rank() != rank) {
    return ctx.Error(absl::StrCat("input ", input, " (", name, ") must have rank ", rank, " (",
                                  layout, "); its shape is ", shape.ToString()));
  }
  return absl::OkStatus();
}

// `gates` is the number of gate blocks in W and R (LSTM 4, GRU 3, RNN 1).
absl::Status InferRecurrent(InferenceContext& ctx, int gates) {
  CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "layout", 14));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, kRecurrentFloats));
  const int last_float = ctx.num_inputs() - 1;
  for (int i = 1; i <= last_float; ++i) {
    if (i == 4 || !ctx.has_input(i)) continue;  // sequence_lens is int32
    if (ctx.input_dtype(i) != ctx.input_dtype(0)) {
      return ctx.Error(absl::StrCat("input ", i, " has dtype ", DTypeName(ctx.input_dtype(i)),
                                    " but X has ", DTypeName(ctx.input_dtype(0)),
                                    "; all float inputs share one dtype"));
    }
  }
  if (ctx.has_input(4)) CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 4, {DType::kInt32}));
  const std::string direction = ctx.GetString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    return ctx.Error(absl::StrCat("attribute 'direction' is '", direction,
                                  "'; expected forward, reverse or bidirectional"));
  }
  const int64_t layout = ctx.GetInt("layout", 0);
  if (layout != 0 && layout != 1) {
    return ctx.Error(absl::StrCat("attribute 'layout' is ", layout, "; expected 0 or 1"));
  }
  const int64_t directions = direction == "bidirectional" ? 2 : 1;
  const char* x_layout = layout == 0 ? "[seq, batch, input]" : "[batch, seq, input]";
  const char* state_layout = layout == 0 ? "[directions, batch, hidden]" : "[batch, directions, hidden]";
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 0, "X", 3, x_layout));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 1, "W", 3, "[directions, gates*hidden, input]"));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 2, "R", 3, "[directions, gates*hidden, hidden]"));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 3, "B", 2, "[directions, 2*gates*hidden]"));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 4, "sequence_lens", 1, "[batch]"));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 5, "initial_h", 3, state_layout));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 6, "initial_c", 3, state_layout));
  CASTOR_RETURN_IF_ERROR(CheckRank(ctx, 7, "P", 2, "[directions, 3*hidden]"));

  Dim hidden = Dim::Unknown();
  if (ctx.has_attribute("hidden_size")) {
    const int64_t h = ctx.GetInt("hidden_size", 0);
    if (h <= 0) return ctx.Error(absl::StrCat("attribute 'hidden_size' is ", h, "; expected > 0"));
    hidden = Dim(h);
  } else {
    hidden = DimOf(ctx.input_shape(2), 2);
  }
  const Shape& w = ctx.input_shape(1);
  const Shape& r = ctx.input_shape(2);
  for (const Shape* weights : {&w, &r}) {
    const char* name = weights == &w ? "W" : "R";
    const Dim dirs = DimOf(*weights, 0);
    if (dirs.is_static() && dirs.value() != directions) {
      return ctx.Error(absl::StrCat("input ", name, " ", weights->ToString(), " has ", dirs.value(),
                                    " directions but direction is '", direction, "' (",
                                    directions, ")"));
    }
    const Dim rows = DimOf(*weights, 1);
    if (rows.is_static() && hidden.is_static() && rows.value() != gates * hidden.value()) {
      return ctx.Error(absl::StrCat("input ", name, " ", weights->ToString(), " has ", rows.value(),
                                    " rows; expected ", gates, " gates * hidden_size ",
                                    hidden.value(), " = ", gates * hidden.value()));
    }
  }
  const Shape& x = ctx.input_shape(0);
  const Dim seq = DimOf(x, layout == 0 ? 0 : 1);
  const Dim batch = DimOf(x, layout == 0 ? 1 : 0);
  const Dim input_size = DimOf(x, 2);
  const Dim w_input = DimOf(w, 2);
  if (input_size.is_static() && w_input.is_static() && input_size.value() != w_input.value()) {
    return ctx.Error(absl::StrCat("X ", x.ToString(), " has input size ", input_size.value(),
                                  " but W ", w.ToString(), " expects ", w_input.value()));
  }
  const DType dtype = ctx.input_dtype(0);
  const Shape y = layout == 0 ? Shape({seq, Dim(directions), batch, hidden})
                              : Shape({batch, seq, Dim(directions), hidden});
  const Shape state = layout == 0 ? Shape({Dim(directions), batch, hidden})
                                  : Shape({batch, Dim(directions), hidden});
  ctx.SetOutput(0, dtype, y);
  for (int i = 1; i < ctx.num_outputs(); ++i) ctx.SetOutput(i, dtype, state);
  return absl::OkStatus();
}

std::vector<AttrSpec> RecurrentAttributes() {
  return {{"activation_alpha", AttrKind::kFloats, false},
          {"activation_beta", AttrKind::kFloats, false},
          {"activations", AttrKind::kStrings, false},
          {"clip", AttrKind::kFloat, false},
          {"direction", AttrKind::kString, false},  // default forward
          {"hidden_size", AttrKind::kInt, false},
          {"layout", AttrKind::kInt, false}};  // opset 14+, default 0
}

OpDef RecurrentDef(const std::string& op_type, int gates, int max_inputs, int max_outputs,
                   const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.min_opset = kMinOnnxOpset;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = 3;
  def.max_inputs = max_inputs;
  def.min_outputs = 1;  // every output is optional; a node writes at least one
  def.max_outputs = max_outputs;
  def.attributes = RecurrentAttributes();
  def.infer = [gates](InferenceContext& ctx) { return InferRecurrent(ctx, gates); };
  def.summary = summary;
  return def;
}

}  // namespace

void RegisterRecurrentOps(OpRegistry& registry) {
  OpDef lstm = RecurrentDef("LSTM", 4, 8, 3,
                            "long short-term memory layer over X [seq, batch, input]; unrolled "
                            "into primitive ops by the unroll-recurrent pass");
  lstm.attributes.push_back({"input_forget", AttrKind::kInt, false});  // default 0
  registry.Register(std::move(lstm));
  OpDef gru = RecurrentDef("GRU", 3, 6, 2,
                           "gated recurrent unit layer over X [seq, batch, input]; unrolled into "
                           "primitive ops by the unroll-recurrent pass");
  gru.attributes.push_back({"linear_before_reset", AttrKind::kInt, false});  // default 0
  registry.Register(std::move(gru));
  registry.Register(RecurrentDef("RNN", 1, 6, 2,
                                 "simple recurrent layer (H = f(X W^T + H R^T + b)) over X [seq, "
                                 "batch, input]; unrolled into primitive ops by the "
                                 "unroll-recurrent pass"));
}

}  // namespace castor
