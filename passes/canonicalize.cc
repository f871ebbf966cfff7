// The canonicalize pass (see canonicalize.h for the numbered rules).
#include "passes/canonicalize.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"

namespace castor {
namespace {

bool ReadBySubgraph(const Value* value) {
  return std::any_of(value->uses().begin(), value->uses().end(),
                     [](const Use& use) { return use.index < 0; });
}

// A node that passes its one input through unchanged: Identity, or a Cast
// to the dtype its input already has.
bool IsPassThrough(const Node& node, bool* is_cast) {
  if (!node.domain().empty() || node.num_outputs() != 1 || node.input(0) == nullptr) return false;
  if (node.op_type() == "Identity") {
    *is_cast = false;
    return node.num_inputs() == 1;
  }
  if (node.op_type() == "Cast") {
    const Attribute* to = node.attribute("to");
    const DType dtype = node.input(0)->dtype();
    *is_cast = true;
    return to != nullptr && dtype != DType::kUndefined && static_cast<int64_t>(dtype) == to->i;
  }
  return false;
}

// Replaces the no-op Cast `cast` by an Identity of the same name, output
// name and place in the node order.
absl::Status CastToIdentity(Graph& graph, Node* cast) {
  Value* x = cast->input(0);
  Value* y = cast->output(0);
  const std::string node_name = cast->name();
  const std::string output_name = y->name();
  cast->set_name(graph.UniqueName(node_name + "/no_op_cast"));
  CASTOR_RETURN_IF_ERROR(graph.RenameValue(y, graph.UniqueName(output_name + "/no_op_cast")));
  CASTOR_ASSIGN_OR_RETURN(Node * identity, graph.AddNode("Identity", {x}, {output_name}, node_name));
  identity->set_doc_string(cast->doc_string());
  Value* out = identity->output(0);
  out->set_dtype(y->dtype());
  out->set_shape(y->shape());
  out->set_has_value_info(y->has_value_info());
  out->set_doc_string(y->doc_string());
  std::vector<Node*> order = graph.nodes();
  order.pop_back();  // the Identity, appended
  *std::find(order.begin(), order.end(), cast) = identity;
  graph.ReplaceAllUsesWith(y, out);
  CASTOR_RETURN_IF_ERROR(graph.RemoveNode(cast));
  return graph.ReorderNodes(std::move(order));
}

// Rule 1 for one pass-through node. Returns whether it was folded (removed).
absl::StatusOr<bool> FoldPassThrough(Graph& graph, Node* node) {
  Value* x = node->input(0);
  Value* y = node->output(0);
  if (ReadBySubgraph(y)) return false;
  if (!y->is_graph_output()) {
    graph.ReplaceAllUsesWith(y, x);
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
    return true;
  }
  // A graph output keeps its name: the input takes it, when nothing else
  // needs the input's.
  if (x->producer() == nullptr || x->is_graph_output() || ReadBySubgraph(x)) return false;
  const std::string name = y->name();
  const Shape shape = y->shape();  // the declared output type merged in
  const bool has_value_info = y->has_value_info() || x->has_value_info();
  std::string doc = x->doc_string().empty() ? y->doc_string() : x->doc_string();
  graph.ReplaceAllUsesWith(y, x);
  CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
  CASTOR_RETURN_IF_ERROR(graph.RenameValue(x, name));
  x->set_shape(shape);
  x->set_has_value_info(has_value_info);
  x->set_doc_string(std::move(doc));
  return true;
}

absl::Status FoldPassThroughs(Graph& graph, CanonicalizeReport& report) {
  const std::vector<Node*> nodes = graph.nodes();  // each visited once, alive
  for (Node* node : nodes) {
    bool is_cast = false;
    if (!IsPassThrough(*node, &is_cast)) continue;
    CASTOR_ASSIGN_OR_RETURN(bool folded, FoldPassThrough(graph, node));
    if (folded) {
      ++(is_cast ? report.casts_folded : report.identities_folded);
    } else if (is_cast) {
      CASTOR_RETURN_IF_ERROR(CastToIdentity(graph, node));
      ++report.casts_to_identity;
    }
  }
  return absl::OkStatus();
}

bool IsDead(const Node& node) {
  if (node.num_outputs() == 0) return false;
  return std::all_of(node.outputs().begin(), node.outputs().end(), [](const Value* out) {
    return out->uses().empty() && !out->is_graph_output();
  });
}

// Rule 2: readers come after their producers, so walking backwards removes
// a dead chain in one sweep.
absl::Status RemoveDeadNodes(Graph& graph, CanonicalizeReport& report) {
  const std::vector<Node*> nodes = graph.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    if (!IsDead(**it)) continue;
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(*it));
    ++report.dead_nodes_removed;
  }
  return absl::OkStatus();
}

std::string Describe(const CanonicalizeReport& report) {
  std::vector<std::string> parts;
  auto count = [&parts](int n, const char* one, const char* many) {
    if (n > 0) parts.push_back(absl::StrCat(n, " ", n == 1 ? one : many));
  };
  count(report.casts_folded, "no-op Cast folded", "no-op Casts folded");
  count(report.casts_to_identity, "no-op Cast kept as Identity (a graph output's name)",
        "no-op Casts kept as Identity (graph outputs' names)");
  count(report.identities_folded, "Identity folded", "Identity nodes folded");
  count(report.dead_nodes_removed, "node nobody reads removed", "nodes nobody reads removed");
  return absl::StrCat("canonicalize: ", absl::StrJoin(parts, ", "));
}

class CanonicalizePass : public Pass {
 public:
  explicit CanonicalizePass(CanonicalizeReport* report) : report_(report) {}
  std::string name() const override { return "canonicalize"; }
  std::string description() const override {
    return "folds no-op Casts and Identity nodes (graph outputs keep their names) and removes "
           "nodes whose outputs nobody reads";
  }
  absl::Status Run(Model& model, PassContext& context) override {
    CASTOR_ASSIGN_OR_RETURN(CanonicalizeReport report, Canonicalize(model));
    if (report.changed()) context.notes.push_back(Describe(report));
    if (report_ != nullptr) *report_ = report;
    return absl::OkStatus();
  }

 private:
  CanonicalizeReport* report_;
};

}  // namespace

absl::StatusOr<CanonicalizeReport> Canonicalize(Model& model) {
  CanonicalizeReport report;
  CASTOR_RETURN_IF_ERROR(FoldPassThroughs(*model.graph, report));
  CASTOR_RETURN_IF_ERROR(RemoveDeadNodes(*model.graph, report));
  return report;
}

std::unique_ptr<Pass> MakeCanonicalizePass(CanonicalizeReport* report) {
  return std::make_unique<CanonicalizePass>(report);
}

}  // namespace castor
