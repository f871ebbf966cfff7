// The pass manager: runs passes in order, verifies the graph after each
// (passes/verifier.h, with the rules the pass promises) and can dump the
// graph before the first pass and after each one, as text
// (passes/graph_text.h), into numbered files:
//
//   DIR/00-input.txt, DIR/01-canonicalize.txt, DIR/02-autocast.txt, ...
//
// Several managers can share one PassDumper, so a pipeline run in stages
// (the import passes, then autocast, then the training rewrites) numbers
// its dumps in one sequence.
//
// The pipelines castor runs (see where each is built):
//   import    canonicalize                        (passes/canonicalize.h)
//   convert   autocast                            (passes/autocast.h)
//   train     autocast, then evaluation-graph, batchnorm-training,
//             pool-before-relu, attach-loss, autodiff, step-outputs
//                                                 (passes/training_graph.h)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "graph/graph.h"
#include "passes/pass.h"

namespace castor {

// Writes DIR/NN-STAGE.txt files, numbering on from one call to the next.
class PassDumper {
 public:
  explicit PassDumper(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  // Writes `model` as text with a header line naming the stage; creates the
  // directory on first use. Errors name the file.
  absl::Status Dump(const Model& model, const std::string& stage, const std::string& header);
  int files_written() const { return next_; }

 private:
  std::string dir_;
  int next_ = 0;
};

struct PassManagerOptions {
  // Verify after every pass. On by default: the check is a walk over the
  // graph plus one type inference, small beside what the pipelines do,
  // and it is what stands between a pass bug and a wrong training step.
  bool verify = true;
  // Dump the graph (before the first pass when `dump_input`, and after
  // every pass); nullptr: no dumps.
  PassDumper* dumper = nullptr;
  bool dump_input = false;
};

class PassManager {
 public:
  explicit PassManager(PassManagerOptions options = {}) : options_(options) {}
  PassManager& Add(std::unique_ptr<Pass> pass);
  const std::vector<std::unique_ptr<Pass>>& passes() const { return passes_; }

  // Runs the passes in order. A pass's own error is returned as it is (its
  // message is what the user sees); a graph that fails the verifier after
  // a pass is an Internal error naming the pass.
  absl::Status Run(Model& model, PassContext& context);

 private:
  PassManagerOptions options_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

}  // namespace castor
