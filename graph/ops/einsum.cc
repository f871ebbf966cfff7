// Einsum op definition (opset 12+): Y = the Einstein sum its `equation`
// attribute spells ("bhqd,bhkd->bhqk"), over any number of inputs of one
// numeric dtype. The equation's grammar and rules live in
// einsum_equation.h; here are the schema and the dtype and shape inference.
// ONNX lists no bfloat16 for Einsum, so a bfloat16 policy keeps it float32
// (ONNX Runtime could not run the converted model otherwise).
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/einsum_equation.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

// Einsum-12's T: every numeric type but bfloat16.
std::vector<DType> EinsumDTypes() {
  std::vector<DType> types;
  for (DType t : ops::NumericTypes()) {
    if (t != DType::kBFloat16) types.push_back(t);
  }
  return types;
}

// The size of one label from the dims it labels (`dims`, in input order):
// the one static size other than 1, else a symbol all agree on, else 1 when
// every dim is 1, else unknown. `what` names the label in errors.
absl::StatusOr<Dim> LabelDim(const InferenceContext& ctx, const std::vector<Dim>& dims,
                             const std::vector<std::string>& where, const std::string& what) {
  Dim size;
  int size_at = -1;
  bool all_one = true;
  for (size_t i = 0; i < dims.size(); ++i) {
    const Dim& d = dims[i];
    if (!(d.is_static() && d.value() == 1)) all_one = false;
    if (!d.is_static() || d.value() == 1) continue;
    if (size.is_static() && size.value() != d.value()) {
      return ctx.Error(absl::StrCat("subscript ", what, " labels sizes ", size.value(), " (",
                                    where[size_at], ") and ", d.value(), " (", where[i],
                                    "), which neither equal nor broadcast"));
    }
    size = d;
    size_at = static_cast<int>(i);
  }
  if (size.is_static()) return size;
  if (all_one) return Dim(1);
  // Only symbolic or unknown dims beside 1s: a symbol when they share it.
  Dim symbol;
  for (const Dim& d : dims) {
    if (d.is_static()) continue;
    if (d.is_unknown()) return Dim::Unknown();
    if (symbol.is_symbolic() && symbol != d) return Dim::Unknown();
    symbol = d;
  }
  return symbol;
}

absl::Status InferEinsum(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, EinsumDTypes()));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, ctx.num_inputs() - 1));
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
  }
  if (!ctx.has_attribute("equation")) return ctx.Error("the equation attribute is required");
  absl::StatusOr<EinsumEquation> equation =
      ParseEinsumEquation(ctx.GetString("equation", ""), ctx.num_inputs());
  if (!equation.ok()) return ctx.Error(std::string(equation.status().message()));
  const DType dtype = ctx.input_dtype(0);

  std::vector<int64_t> ranks;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.input_shape(i).rank_known()) break;
    ranks.push_back(ctx.input_shape(i).rank());
  }
  if (static_cast<int>(ranks.size()) < ctx.num_inputs()) {
    const bool output_has_ellipsis = std::count(equation->output.begin(), equation->output.end(),
                                                kEinsumEllipsis) > 0;
    ctx.SetOutput(0, dtype,
                  output_has_ellipsis
                      ? Shape::Unknown()
                      : Shape(std::vector<Dim>(equation->output.size(), Dim::Unknown())));
    return absl::OkStatus();
  }
  absl::StatusOr<EinsumAxes> axes = ResolveEinsumAxes(*equation, ranks);
  if (!axes.ok()) return ctx.Error(std::string(axes.status().message()));

  // Every dim each label names, and where ("input 1 axis 2").
  const int labels = kEinsumLetters + axes->ellipsis_rank;
  std::vector<std::vector<Dim>> label_dims(labels);
  std::vector<std::vector<std::string>> label_where(labels);
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const std::vector<int>& term = axes->inputs[i];
    for (size_t axis = 0; axis < term.size(); ++axis) {
      const Dim& d = ctx.input_shape(i)[static_cast<int>(axis)];
      // A letter repeated in one input takes a diagonal: its dims must agree.
      for (size_t earlier = 0; earlier < axis; ++earlier) {
        const Dim& e = ctx.input_shape(i)[static_cast<int>(earlier)];
        if (term[earlier] == term[axis] && d.is_static() && e.is_static() &&
            d.value() != e.value()) {
          return ctx.Error(absl::StrCat("input ", i, " repeats subscript '",
                                        EinsumLabelText(term[axis]), "' (a diagonal) on axes ",
                                        earlier, " and ", axis, " of sizes ", e.value(), " and ",
                                        d.value(), "; a diagonal needs equal sizes"));
        }
      }
      label_dims[term[axis]].push_back(d);
      label_where[term[axis]].push_back(absl::StrCat("input ", i, " axis ", axis));
    }
  }
  std::vector<Dim> out_dims;
  for (int label : axes->output) {
    const std::string what =
        label < kEinsumLetters ? absl::StrCat("'", EinsumLabelText(label), "'")
                               : absl::StrCat("\"...\" dim ", label - kEinsumLetters);
    CASTOR_ASSIGN_OR_RETURN(Dim size, LabelDim(ctx, label_dims[label], label_where[label], what));
    out_dims.push_back(size);
  }
  // Summed labels are checked too.
  for (int label = 0; label < labels; ++label) {
    if (label_dims[label].empty()) continue;
    const std::string what =
        label < kEinsumLetters ? absl::StrCat("'", EinsumLabelText(label), "'")
                               : absl::StrCat("\"...\" dim ", label - kEinsumLetters);
    CASTOR_RETURN_IF_ERROR(LabelDim(ctx, label_dims[label], label_where[label], what).status());
  }
  ctx.SetOutput(0, dtype, Shape(std::move(out_dims)));
  return absl::OkStatus();
}

}  // namespace

void RegisterEinsumOps(OpRegistry& registry) {
  OpDef def;
  def.op_type = "Einsum";
  def.min_opset = 12;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = 1;
  def.max_inputs = INT_MAX;
  def.attributes = {{"equation", AttrKind::kString, true}};
  def.infer = InferEinsum;
  def.summary =
      "Einstein summation over any number of inputs by an equation such as 'bhqd,bhkd->bhqk' "
      "(diagonals, sums, ellipsis broadcasting, implicit output)";
  registry.Register(std::move(def));
}

}  // namespace castor
