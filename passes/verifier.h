// The graph verifier: the invariants every graph must keep. Used by tests,
// by the commands that read or write a model, and, through the pass manager
// (passes/pass_manager.h), after every pass.
//
// Rules 1-5 hold for every graph castor accepts: an imported model that the
// ONNX checker accepts meets them (VerifyRules::kValid). Rule 6 is a rule
// of style that castor's own passes keep and exporters need not
// (VerifyRules::kCastor): an imported model with a no-op Cast is taken as it
// is, and the canonicalize pass (passes/canonicalize.h) folds it.
//
//   1. SSA: every value has exactly one definition (graph input,
//      initializer or one node output) and producer links are consistent.
//   2. Topological order: every node input is defined by a graph input, an
//      initializer or an earlier node; graph outputs are defined.
//   3. Unique non-empty node names.
//   4. Every op is registered for its domain and opset, with an arity and
//      attributes its schema allows.
//   5. Types agree with each op's inference (dtype equal, shapes compatible).
//   6. No Cast to the type its input already has.
#pragma once

#include "absl/status/status.h"
#include "graph/graph.h"

namespace castor {

enum class VerifyRules {
  kValid,  // rules 1-5: every graph castor accepts (imported models too)
  kCastor, // rules 1-6: graphs castor's passes produce
};

struct VerifyOptions {
  // Skip invariant 5 (for graphs whose types are not inferred yet).
  bool check_types = true;
  VerifyRules rules = VerifyRules::kCastor;
};

// OK, or FailedPrecondition listing every violation found (one per line,
// each naming the node or value).
absl::Status VerifyModel(const Model& model, const VerifyOptions& options = {});

}  // namespace castor
