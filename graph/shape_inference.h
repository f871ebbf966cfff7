// Whole-graph dtype and shape inference: runs each node's registry
// inference in topological order and records the results on its outputs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "graph/graph.h"

namespace castor {

struct InferenceOptions {
  // What to do with a node whose op is not registered: false -> error;
  // true -> leave its outputs as they are (declared types from value_info).
  bool allow_unknown_ops = false;
  // Compare instead of record: every output's recorded dtype must equal the
  // inferred one and its shape must agree (MergeShape) — the verifier's
  // "types agree with each op's rule". The model is left unchanged.
  bool check_only = false;
};

// Infers every node's output dtype and shape. Where the model declared a
// type (value_info, graph outputs), the inferred one must agree: dtypes
// equal, ranks equal, static dims equal; a declared symbolic or static dim
// fills an inferred unknown one. Errors name the node and value.
absl::Status InferTypes(Model& model, const InferenceOptions& options = {});
// Runs the registry inference of one node against the current types of its
// inputs (constant inputs are read; shape values are not propagated) and
// discards the result: OK when the op accepts those types at the model's
// opset. Used by passes to ask "would this node accept float16 inputs?".
absl::Status CheckNodeInference(const Model& model, const Node& node);

// The check_only form on a const model.
absl::Status CheckTypes(const Model& model, bool allow_unknown_ops = false);

// Merges `inferred` with `declared` as described above; error text names
// `what`.
absl::Status MergeShape(const Shape& declared, const Shape& inferred, const std::string& what,
                        Shape* merged);

// Op types in the model's main graph that the registry does not know, as
// "OpType (domain): node1, node2" lines; empty when all are known.
std::vector<std::string> UnsupportedOps(const Model& model);

// Checks the model's opset imports are within the supported ranges; the
// error names the domain and the version.
absl::Status CheckOpsets(const Model& model);

}  // namespace castor
