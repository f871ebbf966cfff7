// The graph verifier: the invariants every pass must keep. Used by tests
// and, through the pass manager, after every pass.
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

struct VerifyOptions {
  // Skip invariant 5 (for graphs whose types are not inferred yet).
  bool check_types = true;
};

// OK, or FailedPrecondition listing every violation found (one per line,
// each naming the node or value).
absl::Status VerifyModel(const Model& model, const VerifyOptions& options = {});

}  // namespace castor
