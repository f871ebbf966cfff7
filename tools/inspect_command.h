// `castor inspect MODEL`: loads and checks an ONNX model, then reports its
// graph as text (header, node table, inputs/outputs, initializers,
// summary), JSON (the same content) or Graphviz DOT.
//
// The report is built once as plain rows (InspectReport, a NodeRow per
// node) and each format is a renderer over it, so later columns (the
// autocast decision and its reason for `--why NODE`) are one field plus one
// cell per renderer.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace castor::tools {

struct InspectOptions {
  std::string model_path;
  std::string format = "text";  // text | json | dot
  std::string output_path;      // "" = stdout
  std::string why_node;         // --why NODE: explain that node's dtype instead
  bool canonicalize = false;    // show the graph after the canonicalize pass
};

// A value as the report shows it: `input float32[N,1,28,28]`.
struct ValueRow {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
  bool present = true;       // false for an omitted optional node input
  bool has_default = false;  // a graph input with an initializer (overridable)
};

struct NodeRow {
  int index = 0;
  std::string name;
  std::string op_type;
  std::string domain;  // "" for ai.onnx
  // The dtype the node computes in: castor's autocast record when the model
  // was converted by castor (a Cast's target dtype), else its first
  // floating-point input's dtype, else its first output's.
  DType compute_dtype = DType::kUndefined;
  std::vector<ValueRow> inputs;
  std::vector<ValueRow> outputs;
  // Borrowed from the Model the report was built from.
  std::vector<const Attribute*> attributes;
  // The autocast record's reason ("" when none) and, for a Cast castor
  // inserted, what it reads: "weight", "constant" or "activation".
  std::string autocast_why;
  std::string inserted_cast;
};

struct InitializerRow {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
  int64_t elements = 0;
  int64_t bytes = 0;
  bool overridable = false;  // also a graph input (a default, not a parameter)
};

struct ParameterTotals {
  DType dtype = DType::kUndefined;
  int64_t elements = 0;
  int64_t bytes = 0;
};

struct InspectSummary {
  int node_count = 0;
  // (op, count), count descending then op name; ops outside ai.onnx are
  // written "domain:Op".
  std::vector<std::pair<std::string, int>> op_histogram;
  // Initializers that are not overridable inputs, per dtype (in DType order).
  std::vector<ParameterTotals> parameters_by_dtype;
  int64_t parameter_count = 0;
  int64_t parameter_bytes = 0;
  int overridable_inputs = 0;
  // Casts the autocast pass inserted, and nodes per recorded dtype (both
  // empty for a model castor did not convert).
  int inserted_casts = 0;
  std::vector<std::pair<std::string, int>> autocast_nodes_per_dtype;
};

struct InspectReport {
  std::string file;
  int64_t ir_version = 0;
  std::string producer_name;
  std::string producer_version;
  std::vector<OpsetImport> opsets;
  std::string graph_name;
  std::string description;  // first line of the model's doc_string
  // The autocast policy recorded by `castor convert` ("" when none).
  std::string policy_name;
  std::string policy_digest;
  std::vector<ValueRow> inputs;  // graph inputs (overridable ones included)
  std::vector<ValueRow> outputs;
  std::vector<InitializerRow> initializers;
  std::vector<NodeRow> nodes;
  InspectSummary summary;
};


InspectReport BuildInspectReport(const Model& model, const std::string& file);

// "float32[N,1,28,28]"; "float32[...]" when the rank is unknown.
std::string TypeString(DType dtype, const Shape& shape);
// 693962 -> "693,962".
std::string WithThousandsSeparators(int64_t value);
// "op" or "domain:op".
std::string QualifiedOpName(const std::string& domain, const std::string& op_type);

std::string RenderInspectText(const InspectReport& report);
std::string RenderInspectJson(const InspectReport& report);
std::string RenderInspectDot(const InspectReport& report);

// `--why NODE`: the node's op, compute dtype, inputs, and the rule behind
// its dtype from the autocast record; NotFound (with a "did you mean")
// when no node has that name.
absl::StatusOr<std::string> ExplainNode(const Model& model, const std::string& node_name);

// Load, check and render in `options.format` (or explain --why NODE).
absl::StatusOr<std::string> InspectModel(const InspectOptions& options);

// The subcommand: parses flags, writes the report to stdout or --output.
int RunInspect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
