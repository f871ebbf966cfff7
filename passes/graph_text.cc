// GraphToText (see graph_text.h).
#include "passes/graph_text.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "passes/autocast.h"

namespace castor {
namespace {

std::string Typed(const Value* value) {
  return absl::StrCat(value->name(), ": ", DTypeName(value->dtype()),
                      value->shape().rank_known() ? value->shape().ToString() : "[...]");
}

std::string NodeLine(const Node& node) {
  std::vector<std::string> inputs;
  for (const Value* in : node.inputs()) inputs.push_back(in ? in->name() : "");
  std::vector<std::string> outputs;
  for (const Value* out : node.outputs()) outputs.push_back(Typed(out));
  std::string line = absl::StrCat(
      "node   ", node.name(), " = ", node.domain().empty() ? "" : absl::StrCat(node.domain(), ":"),
      node.op_type(), "(", absl::StrJoin(inputs, ", "), ") -> ", absl::StrJoin(outputs, ", "));
  std::vector<std::string> details;
  for (const Attribute& a : node.attributes()) details.push_back(absl::StrCat(a.name, "=", a.ToString()));
  if (const std::string* dtype = node.FindMetadata(kNodeDTypeKey)) {
    details.push_back(absl::StrCat("[", *dtype, "]"));
  }
  if (!details.empty()) absl::StrAppend(&line, "\n         ", absl::StrJoin(details, "  "));
  return line;
}

}  // namespace

std::string GraphToText(const Model& model) {
  const Graph& graph = *model.graph;
  std::string text;
  for (const OpsetImport& opset : model.opset_imports) {
    absl::StrAppend(&text, "opset  ", opset.domain.empty() ? "ai.onnx" : opset.domain, " ",
                    opset.version, "\n");
  }
  for (const Value* input : graph.inputs()) absl::StrAppend(&text, "input  ", Typed(input), "\n");
  for (const Value* init : graph.initializers()) {
    if (!init->is_graph_input()) absl::StrAppend(&text, "init   ", Typed(init), "\n");
  }
  for (const Node* node : graph.nodes()) absl::StrAppend(&text, NodeLine(*node), "\n");
  for (const Value* output : graph.outputs()) absl::StrAppend(&text, "output ", Typed(output), "\n");
  return text;
}

}  // namespace castor
