// Graph verifier (see verifier.h for the numbered invariants).
#include "passes/verifier.h"

#include <algorithm>

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

namespace castor {
namespace {

constexpr size_t kMaxReported = 25;

class Problems {
 public:
  void Add(std::string problem) {
    ++count_;
    if (lines_.size() < kMaxReported) lines_.push_back(std::move(problem));
  }
  bool empty() const { return count_ == 0; }
  absl::Status ToStatus() const {
    if (empty()) return absl::OkStatus();
    // One line, as every error castor prints (problems separated by "; ").
    std::string text = absl::StrCat("graph verification failed (", count_, " problem",
                                    count_ == 1 ? "" : "s", "): ",
                                    absl::StrJoin(lines_, "; "));
    if (count_ > lines_.size()) absl::StrAppend(&text, "; ... and ", count_ - lines_.size(), " more");
    return absl::FailedPreconditionError(text);
  }

 private:
  std::vector<std::string> lines_;
  size_t count_ = 0;
};

std::string Describe(const Node* node) {
  return absl::StrCat(node->op_type(), " node '", node->name(), "'");
}

void CheckSchema(const Model& model, const Node* node, Problems& problems) {
  const OpDef* def = OpRegistry::Global().Find(node->domain(), node->op_type());
  if (!def) {
    problems.Add(absl::StrCat(Describe(node), ": op ", node->op_type(),
                              node->domain().empty() ? "" : absl::StrCat(" (domain ", node->domain(), ")"),
                              " is not supported"));
    return;
  }
  const int64_t opset = model.OpsetVersion(node->domain());
  if (opset < def->min_opset || opset > def->max_opset) {
    problems.Add(absl::StrCat(Describe(node), ": opset ", opset, " is outside the supported range ",
                              def->min_opset, "..", def->max_opset, " for ", node->op_type()));
  }
  if (node->num_inputs() < def->min_inputs || node->num_inputs() > def->max_inputs) {
    problems.Add(absl::StrCat(Describe(node), ": has ", node->num_inputs(), " inputs; expected ",
                              def->min_inputs, "..", def->max_inputs));
  }
  for (int i = 0; i < def->min_inputs && i < node->num_inputs(); ++i) {
    if (!node->input(i)) problems.Add(absl::StrCat(Describe(node), ": required input ", i, " is missing"));
  }
  if (node->num_outputs() < def->min_outputs || node->num_outputs() > def->max_outputs) {
    problems.Add(absl::StrCat(Describe(node), ": has ", node->num_outputs(), " outputs; expected ",
                              def->min_outputs, "..", def->max_outputs));
  }
  // An attribute the op does not define is an error, as in ONNX's checker:
  // a misspelt one (Gemm's `transb` for `transB`) would otherwise run with
  // the default silently.
  for (const Attribute& a : node->attributes()) {
    const bool known = std::any_of(def->attributes.begin(), def->attributes.end(),
                                   [&](const AttrSpec& spec) { return spec.name == a.name; });
    if (!known) {
      std::string expected;
      for (const AttrSpec& spec : def->attributes) {
        absl::StrAppend(&expected, expected.empty() ? "" : ", ", spec.name);
      }
      problems.Add(absl::StrCat(Describe(node), ": unknown attribute '", a.name, "' (",
                                node->op_type(), " has ",
                                expected.empty() ? "no attributes" : expected, ")"));
    }
  }
  for (const AttrSpec& spec : def->attributes) {
    const Attribute* a = node->attribute(spec.name);
    if (!a) {
      if (spec.required) problems.Add(absl::StrCat(Describe(node), ": required attribute '", spec.name, "' is missing"));
    } else if (a->kind != spec.kind) {
      problems.Add(absl::StrCat(Describe(node), ": attribute '", spec.name, "' is ",
                                AttrKindName(a->kind), "; expected ", AttrKindName(spec.kind)));
    }
  }
}

}  // namespace

absl::Status VerifyModel(const Model& model, const VerifyOptions& options) {
  const Graph& graph = *model.graph;
  Problems problems;

  // 1 + 2: definitions and order.
  absl::flat_hash_set<const Value*> defined;
  for (const Value* v : graph.inputs()) {
    if (!defined.insert(v).second) problems.Add(absl::StrCat("graph input '", v->name(), "' is listed twice"));
    if (v->producer()) problems.Add(absl::StrCat("graph input '", v->name(), "' also has a producer node"));
  }
  for (const Value* v : graph.initializers()) {
    if (v->producer()) problems.Add(absl::StrCat("initializer '", v->name(), "' also has a producer node"));
    defined.insert(v);
  }
  absl::flat_hash_set<std::string> node_names;
  for (const Node* node : graph.nodes()) {
    if (node->name().empty()) {
      // Name its first output so the node can be found.
      problems.Add(absl::StrCat(node->op_type(), " node without a name",
                                node->num_outputs() > 0
                                    ? absl::StrCat(" (output '", node->output(0)->name(), "')")
                                    : std::string()));
    } else if (!node_names.insert(node->name()).second) {
      problems.Add(absl::StrCat("node name '", node->name(), "' is used more than once"));
    }
    auto check_input = [&](const Value* in, const std::string& slot) {
      if (!defined.contains(in)) {
        problems.Add(absl::StrCat(Describe(node), " ", slot, " '", in->name(), "' is ",
                                  in->producer() ? "defined later (graph is not in topological order)"
                                                 : "not defined by any input, initializer or node"));
      }
    };
    for (int i = 0; i < node->num_inputs(); ++i) {
      if (const Value* in = node->input(i)) check_input(in, absl::StrCat("input ", i));
    }
    for (const Value* in : node->implicit_inputs()) check_input(in, "subgraph input");
    for (int k = 0; k < node->num_outputs(); ++k) {
      const Value* out = node->output(k);
      if (out->producer() != node || out->producer_output() != k) {
        problems.Add(absl::StrCat(Describe(node), " output '", out->name(), "' has an inconsistent producer link"));
      }
      if (!defined.insert(out).second) {
        problems.Add(absl::StrCat("value '", out->name(), "' is defined more than once"));
      }
    }
    CheckSchema(model, node, problems);  // 4
    // 6: Cast to the same type (graphs castor produces).
    if (options.rules == VerifyRules::kCastor && node->op_type() == "Cast" && node->domain().empty() && node->input(0)) {
      const Attribute* to = node->attribute("to");
      if (to && static_cast<int64_t>(node->input(0)->dtype()) == to->i) {
        problems.Add(absl::StrCat(Describe(node), " casts '", node->input(0)->name(), "' to ",
                                  DTypeName(node->input(0)->dtype()), ", the type it already has"));
      }
    }
  }
  for (const Value* out : graph.outputs()) {
    if (!defined.contains(out)) problems.Add(absl::StrCat("graph output '", out->name(), "' is not defined"));
  }
  if (!problems.empty()) return problems.ToStatus();

  // 5: types agree with inference (only meaningful on a well-formed graph).
  if (options.check_types) {
    if (absl::Status s = CheckTypes(model); !s.ok()) problems.Add(std::string(s.message()));
  }
  return problems.ToStatus();
}

}  // namespace castor
