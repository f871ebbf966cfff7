// Reading a user's ONNX model: the one way every subcommand (and the
// benchmarks) load a model file and check it before anything else runs.
//
// LoadAndCheckModel takes any valid ONNX model as the exporter wrote it:
// the checks are the rules every valid graph meets (VerifyRules::kValid);
// an exporter's style (a no-op Cast, an Identity chain, a dead node) is for
// the canonicalize pass (passes/canonicalize.h), never a reason to refuse.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "passes/pass_manager.h"

namespace castor {

// Loads `path` and checks it: LoadModel, CheckOpsets, UnsupportedOps (all
// unknown ops reported at once), InferTypes, VerifyModel with
// VerifyRules::kValid. Error messages name the file.
absl::StatusOr<Model> LoadAndCheckModel(const std::string& path);

// Adds the passes every imported model goes through before autocast or
// training, in order: unroll-recurrent (LSTM/GRU/RNN into primitive ops),
// then canonicalize (no-op Casts, Identity chains, dead nodes). Every
// subcommand that rewrites a user's model starts with them.
PassManager& AddImportPasses(PassManager& manager);

// `status` with "path: " in front, unless its message already names the
// file (an ok status is returned as it is).
absl::Status NameFile(const absl::Status& status, const std::string& path);

}  // namespace castor
