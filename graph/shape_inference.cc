// Whole-graph type inference over the op registry, with constant and
// shape-value propagation so Reshape targets built from Shape() keep
// symbolic dims.
#include "graph/shape_inference.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_registry.h"
#include "graph/status.h"

namespace castor {
namespace {

// The value of a Constant node with a `value` tensor attribute, else null.
const Tensor* ConstantValue(const Value* value) {
  if (value->initializer() && !value->is_graph_input()) return value->initializer();
  const Node* producer = value->producer();
  if (producer && producer->op_type() == "Constant" && producer->domain().empty()) {
    const Attribute* a = producer->attribute("value");
    if (a && a->kind == AttrKind::kTensor) return &a->t;
  }
  return nullptr;
}

std::optional<InferenceContext::ShapeValue> ShapeValueOfConstant(const Tensor* t) {
  if (!t || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32) ||
      t->dims().size() > 1) {
    return std::nullopt;
  }
  InferenceContext::ShapeValue dims;
  for (int64_t v : t->ToInt64Vector()) dims.push_back(v >= 0 ? Dim(v) : Dim::Unknown());
  // Negative entries (-1 in a Reshape target) are meaningful to Reshape,
  // which reads the constant itself; as dims they are unknown.
  return dims;
}

}  // namespace

absl::Status MergeShape(const Shape& declared, const Shape& inferred, const std::string& what,
                        Shape* merged) {
  if (!declared.rank_known()) {
    *merged = inferred;
    return absl::OkStatus();
  }
  if (!inferred.rank_known()) {
    *merged = declared;
    return absl::OkStatus();
  }
  if (declared.rank() != inferred.rank()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": declared shape ", declared.ToString(),
                                                   " but inferred ", inferred.ToString()));
  }
  std::vector<Dim> dims;
  for (int i = 0; i < declared.rank(); ++i) {
    const Dim& d = declared[i];
    const Dim& n = inferred[i];
    if (d.is_static() && n.is_static() && d.value() != n.value()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": declared shape ",
                                                     declared.ToString(), " but inferred ",
                                                     inferred.ToString()));
    }
    // Prefer a number, then the inferred symbol, then the declared one.
    if (n.is_static() || (n.is_symbolic() && !d.is_static())) {
      dims.push_back(n);
    } else {
      dims.push_back(d);
    }
  }
  *merged = Shape(std::move(dims));
  return absl::OkStatus();
}

absl::Status InferTypes(Model& model, const InferenceOptions& options) {
  Graph& graph = *model.graph;
  const OpRegistry& registry = OpRegistry::Global();
  std::map<const Value*, InferenceContext::ShapeValue> shape_values;

  for (Node* node : graph.nodes()) {
    const OpDef* def = registry.Find(node->domain(), node->op_type());
    if (!def || !def->infer) {
      if (options.allow_unknown_ops) continue;
      return absl::UnimplementedError(absl::StrCat("no inference for op ", node->op_type(),
                                                   " (node '", node->name(), "')"));
    }
    std::vector<const Tensor*> constants;
    std::vector<std::optional<InferenceContext::ShapeValue>> shape_inputs;
    for (Value* in : node->inputs()) {
      const Tensor* constant = in ? ConstantValue(in) : nullptr;
      constants.push_back(constant);
      std::optional<InferenceContext::ShapeValue> sv;
      if (in) {
        auto it = shape_values.find(in);
        if (it != shape_values.end()) {
          sv = it->second;
        } else {
          sv = ShapeValueOfConstant(constant);
        }
      }
      shape_inputs.push_back(std::move(sv));
    }
    InferenceContext ctx(*node, model.OpsetVersion(node->domain()), std::move(constants),
                         std::move(shape_inputs));
    CASTOR_RETURN_IF_ERROR(def->infer(ctx));
    for (int i = 0; i < node->num_outputs(); ++i) {
      Value* out = node->output(i);
      if (!ctx.output_set(i)) {
        if (out->name().empty()) continue;
        return ctx.Error(absl::StrCat("inference left output ", i, " ('", out->name(),
                                      "') without a type"));
      }
      // Built only for an error message (this loop runs for every output).
      auto what = [&] {
        return absl::StrCat(node->op_type(), " node '", node->name(), "' output '",
                            out->name(), "'");
      };
      if (options.check_only && out->dtype() == DType::kUndefined) {
        return absl::InvalidArgumentError(absl::StrCat(what(), ": has no dtype recorded"));
      }
      if (out->dtype() != DType::kUndefined && out->dtype() != ctx.output_dtype(i)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what(), ": declared dtype ", DTypeName(out->dtype()), " but inferred ",
                         DTypeName(ctx.output_dtype(i))));
      }
      Shape merged;
      if (!MergeShape(out->shape(), ctx.output_shape(i), "", &merged).ok()) {
        CASTOR_RETURN_IF_ERROR(MergeShape(out->shape(), ctx.output_shape(i), what(), &merged));
      }
      if (ctx.output_shape_value(i)) shape_values[out] = *ctx.output_shape_value(i);
      if (options.check_only) continue;
      out->set_dtype(ctx.output_dtype(i));
      out->set_shape(std::move(merged));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNodeInference(const Model& model, const Node& node) {
  const OpDef* def = OpRegistry::Global().Find(node.domain(), node.op_type());
  if (!def || !def->infer) {
    return absl::UnimplementedError(absl::StrCat("no inference for op ", node.op_type(),
                                                 " (node '", node.name(), "')"));
  }
  std::vector<const Tensor*> constants;
  std::vector<std::optional<InferenceContext::ShapeValue>> shape_inputs;
  for (Value* in : node.inputs()) {
    const Tensor* constant = in ? ConstantValue(in) : nullptr;
    constants.push_back(constant);
    shape_inputs.push_back(ShapeValueOfConstant(constant));
  }
  InferenceContext ctx(node, model.OpsetVersion(node.domain()), std::move(constants),
                       std::move(shape_inputs));
  return def->infer(ctx);
}

absl::Status CheckTypes(const Model& model, bool allow_unknown_ops) {
  InferenceOptions options;
  options.allow_unknown_ops = allow_unknown_ops;
  options.check_only = true;
  // check_only never writes to the model.
  return InferTypes(const_cast<Model&>(model), options);
}

std::vector<std::string> UnsupportedOps(const Model& model) {
  std::map<std::string, std::vector<std::string>> missing;
  const OpRegistry& registry = OpRegistry::Global();
  for (const Node* node : model.graph->nodes()) {
    if (!registry.Find(node->domain(), node->op_type())) {
      std::string key = node->domain().empty()
                            ? node->op_type()
                            : absl::StrCat(node->op_type(), " (domain ", node->domain(), ")");
      missing[key].push_back(absl::StrCat("'", node->name(), "'"));
    }
  }
  std::vector<std::string> lines;
  for (const auto& [op, nodes] : missing) {
    lines.push_back(absl::StrCat(op, ": node", nodes.size() > 1 ? "s " : " ",
                                 absl::StrJoin(nodes, ", ")));
  }
  return lines;
}

absl::Status CheckOpsets(const Model& model) {
  for (const OpsetImport& opset : model.opset_imports) {
    const std::string domain = CanonicalDomain(opset.domain);
    if (domain.empty()) {
      if (opset.version < kMinOnnxOpset || opset.version > kMaxOnnxOpset) {
        return absl::OutOfRangeError(absl::StrCat(
            "model imports ai.onnx opset ", opset.version, "; castor supports opsets ",
            kMinOnnxOpset, " to ", kMaxOnnxOpset));
      }
    } else if (domain == kTrainingDomain) {
      if (opset.version != 1) {
        return absl::OutOfRangeError(absl::StrCat("model imports ", domain, " version ",
                                                  opset.version, "; castor supports version 1"));
      }
    }
    // Other domains: their ops are reported individually by UnsupportedOps.
  }
  if (model.OpsetVersion("") == 0 && !model.graph->nodes().empty()) {
    bool uses_default = false;
    for (const Node* node : model.graph->nodes()) uses_default |= node->domain().empty();
    if (uses_default) {
      return absl::InvalidArgumentError("model has ai.onnx nodes but no ai.onnx opset import");
    }
  }
  return absl::OkStatus();
}

}  // namespace castor
