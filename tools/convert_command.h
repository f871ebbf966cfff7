// `castor convert MODEL -o OUT --policy P`: the autocast pass as a command.
// Loads and checks MODEL (as `castor inspect` does), builds the Policy from
// --policy or --policy-file plus the override flags, runs the pass, checks
// the result with the verifier, writes OUT atomically and prints a summary:
// the policy and its digest, Casts inserted (weight / constant /
// activation), nodes per dtype, weight bytes as stored and as computed, and
// the pass's notes.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "passes/autocast.h"
#include "passes/policy.h"

namespace castor::tools {

struct ConvertOptions {
  std::string model_path;
  std::string output_path;
  std::string policy = "mixed_float16";
  std::string policy_file;
  std::vector<std::string> fp32_ops;    // each entry may be "A,B,C"
  std::vector<std::string> lowp_ops;
  std::vector<std::string> fp32_nodes;  // regexes over node names
  std::vector<std::string> pins;        // "OP:INPUT"
  bool keep_io_types = true;
  bool keep_io_types_given = false;     // overrides the policy (file)'s setting
  bool restart_from_float32 = false;
  std::string save_policy_path;
  std::string dump_passes_dir;  // "": no dumps
};

// The Policy the flags describe: the built-in or file policy, then op
// overrides, node overrides and pins. Errors name the flag and the value.
absl::StatusOr<Policy> PolicyFromOptions(const ConvertOptions& options);

// The summary `castor convert` prints after a conversion.
std::string RenderConvertSummary(const ConvertOptions& options, const Policy& policy,
                                 const AutocastReport& report);

int RunConvert(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
