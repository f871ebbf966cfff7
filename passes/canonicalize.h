// The canonicalize pass: the first pass over an imported model (DESIGN.md:
// "an imported model is first canonicalised by a pass of its own ... never
// refused for its style"). It takes any graph that meets the verifier's
// rules for valid graphs (VerifyRules::kValid) and leaves one that meets
// castor's own (VerifyRules::kCastor), computing the same outputs:
//
//   1. A no-op Cast (to the dtype its input has) and an Identity are
//      folded: their readers read the input instead. Where the output is a
//      graph output, its name is kept: the input takes the name if nothing
//      else needs the input's (it is computed by a node, is no graph
//      output itself and no subgraph reads it by name); otherwise the node
//      stays, a no-op Cast becoming an Identity. Nothing read by a
//      subgraph (If/Loop bodies name outer values) is renamed or folded.
//      Chains fold one link at a time.
//   2. Dead code: a node none of whose outputs is read (by a node, a
//      subgraph or as a graph output) is removed, then the nodes that fed
//      only it, and so on. A node with one output read and others unread
//      (Dropout's mask, training BatchNormalization's statistics) stays.
//      Initializers and graph inputs stay, read or not.
//
// Kept as they are: Constant nodes, shape subgraphs (Shape, Gather,
// Unsqueeze, Concat, Reshape computed at run time), node names.
// The sample models are unchanged by it (they have none of the above).
#pragma once

#include <memory>

#include "absl/status/statusor.h"

#include "passes/pass.h"

namespace castor {

struct CanonicalizeReport {
  int casts_folded = 0;       // no-op Casts removed
  int casts_to_identity = 0;  // no-op Casts kept as Identity (name of a graph output)
  int identities_folded = 0;
  int dead_nodes_removed = 0;
  bool changed() const {
    return casts_folded + casts_to_identity + identities_folded + dead_nodes_removed > 0;
  }
};

// Runs the pass directly (types must be inferred, as LoadAndCheckModel
// leaves them).
absl::StatusOr<CanonicalizeReport> Canonicalize(Model& model);

// The pass for a PassManager; fills `*report` when given, and adds a note
// to the context when it changed the graph.
std::unique_ptr<Pass> MakeCanonicalizePass(CanonicalizeReport* report = nullptr);

}  // namespace castor
