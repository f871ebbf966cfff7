// Optimizer op definitions of the ai.onnx.preview.training domain
// (version 1): Adagrad, Adam and Momentum. Each takes the scalar learning
// rate R (float/double) and step count T (int64), then n optimized tensors
// given group by group, not interleaved:
//   Adagrad  R, T, X1..Xn, G1..Gn, H1..Hn        -> X1_new..Xn_new, H1_new..Hn_new
//   Adam     R, T, X1..Xn, G1..Gn, V1..Vn, H1..Hn -> X_new..., V_new..., H_new...
//   Momentum R, T, X1..Xn, G1..Gn, V1..Vn        -> X_new..., V_new...
// Every new tensor has its input's dtype and shape. These are float
// optimizer updates on master weights, not autocast candidates.
#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/shape_inference.h"
#include "graph/status.h"

namespace castor {
namespace {

// How an optimizer lays out its variadic inputs and outputs.
struct OptimizerLayout {
  std::vector<std::string> input_groups;  // after R and T, e.g. X, G, H
  std::vector<int> output_groups;         // index into input_groups, e.g. X, H
};

absl::Status CheckScalar(const InferenceContext& ctx, int i, const char* name) {
  const std::optional<int64_t> count = ctx.input_shape(i).NumElements();
  if (count && *count != 1) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") must be a scalar; its shape is ",
                                  ctx.input_shape(i).ToString()));
  }
  return absl::OkStatus();
}

absl::Status InferOptimizer(InferenceContext& ctx, const OptimizerLayout& layout) {
  const int groups = static_cast<int>(layout.input_groups.size());
  const std::string input_pattern =
      absl::StrCat("R, T, then ", absl::StrJoin(layout.input_groups, "..., "), "...");
  const int tensors = ctx.num_inputs() - 2;
  if (tensors < groups || tensors % groups != 0) {
    return ctx.Error(absl::StrCat("has ", ctx.num_inputs(), " inputs; expected 2 + ", groups,
                                  " * n (", input_pattern, ")"));
  }
  const int n = tensors / groups;
  const int expected_outputs = static_cast<int>(layout.output_groups.size()) * n;
  if (ctx.num_outputs() != expected_outputs) {
    std::vector<std::string> names;
    for (int g : layout.output_groups) names.push_back(layout.input_groups[g] + "_new");
    return ctx.Error(absl::StrCat("has ", ctx.num_outputs(), " outputs; expected ",
                                  expected_outputs, " (", absl::StrJoin(names, "..., "),
                                  "... for the ", n, " optimized tensors)"));
  }
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
  }
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat64};
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, floats));
  CASTOR_RETURN_IF_ERROR(CheckScalar(ctx, 0, "R"));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
  CASTOR_RETURN_IF_ERROR(CheckScalar(ctx, 1, "T"));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 2, floats));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 2, ctx.num_inputs() - 1));

  // Each tensor's gradient and state must have its shape.
  for (int t = 0; t < n; ++t) {
    const int x_index = 2 + t;
    const Shape& x = ctx.input_shape(x_index);
    for (int g = 1; g < groups; ++g) {
      const int index = 2 + g * n + t;
      const Shape& s = ctx.input_shape(index);
      Shape merged;
      if (!MergeShape(x, s, "", &merged).ok()) {
        return ctx.Error(absl::StrCat("input ", index, " (", layout.input_groups[g], t + 1, ") ",
                                      s.ToString(), " must have the shape of input ", x_index, " (",
                                      layout.input_groups[0], t + 1, ") ", x.ToString()));
      }
    }
  }
  for (int o = 0; o < static_cast<int>(layout.output_groups.size()); ++o) {
    for (int t = 0; t < n; ++t) {
      const int index = 2 + layout.output_groups[o] * n + t;
      ctx.SetOutput(o * n + t, ctx.input_dtype(index), ctx.input_shape(index));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMomentumMode(const InferenceContext& ctx) {
  const std::string mode = ctx.GetString("mode", "");
  if (mode != "standard" && mode != "nesterov") {
    return ctx.Error(
        absl::StrCat("attribute 'mode' is \"", mode, "\"; expected \"standard\" or \"nesterov\""));
  }
  return absl::OkStatus();
}

OpDef MakeOptimizerOp(const std::string& op_type, OptimizerLayout layout,
                      std::vector<AttrSpec> attributes, const std::string& summary,
                      bool check_mode = false) {
  OpDef def;
  def.op_type = op_type;
  def.domain = kTrainingDomain;
  def.min_opset = 1;
  def.max_opset = 1;
  def.min_inputs = 3;
  def.max_inputs = INT_MAX;
  def.min_outputs = 1;
  def.max_outputs = INT_MAX;
  def.attributes = std::move(attributes);
  def.infer = [layout = std::move(layout), check_mode](InferenceContext& ctx) -> absl::Status {
    if (check_mode) CASTOR_RETURN_IF_ERROR(CheckMomentumMode(ctx));
    return InferOptimizer(ctx, layout);
  };
  def.autocast = AutocastCategory::kNone;  // float32 master-weight updates, never cast
  def.summary = summary;
  return def;
}

}  // namespace

void RegisterTrainingOps(OpRegistry& registry) {
  registry.Register(
      MakeOptimizerOp("Adagrad", {{"X", "G", "H"}, {0, 2}},
                      {{"decay_factor", AttrKind::kFloat, false},       // default 0
                       {"epsilon", AttrKind::kFloat, false},            // default 1e-6
                       {"norm_coefficient", AttrKind::kFloat, false}},  // default 0
                      "Adagrad step: inputs R, T, X..., G..., H...; outputs X_new..., H_new..."));
  registry.Register(MakeOptimizerOp(
      "Adam", {{"X", "G", "V", "H"}, {0, 2, 3}},
      {{"alpha", AttrKind::kFloat, false},                   // default 0.9
       {"beta", AttrKind::kFloat, false},                    // default 0.999
       {"epsilon", AttrKind::kFloat, false},                 // default 1e-6
       {"norm_coefficient", AttrKind::kFloat, false},        // default 0
       {"norm_coefficient_post", AttrKind::kFloat, false}},  // default 0
      "Adam step: inputs R, T, X..., G..., V..., H...; outputs X_new..., V_new..., H_new..."));
  registry.Register(MakeOptimizerOp(
      "Momentum", {{"X", "G", "V"}, {0, 2}},
      {{"alpha", AttrKind::kFloat, true},
       {"beta", AttrKind::kFloat, true},
       {"mode", AttrKind::kString, true},  // "standard" | "nesterov"
       {"norm_coefficient", AttrKind::kFloat, true}},
      "momentum / Nesterov step: inputs R, T, X..., G..., V...; outputs X_new..., V_new...",
      /*check_mode=*/true));
}

}  // namespace castor
