// `castor verify CKPT [--policy P | --policy-file F] [--json]`: proves which
// dtype policy a checkpoint was trained under and that it is intact.
//
// Reads the checkpoint (training/checkpoint.h: format, data digest over the
// graph, weights, statistics, moments and state), runs the consistency checks
// (record digest, policy digest, recorded name and dtypes, the nodes kept
// float32 recomputed by autocast, master weights float32, the state against
// the graph) and, with an expected policy, compares the recorded policy to
// it field by field. Prints a summary (policy, dtypes, parameters, running
// statistics, step/epoch/position, optimizer, loss scale, skipped steps,
// castor version, storage), as text or with --json as one JSON object.
//
// Exit codes: 0 verified; 1 mismatch (the record is inconsistent or the
// policy differs from the expected one; each difference is listed);
// 2 unreadable or corrupt (missing, truncated, bit-flipped, not a castor
// checkpoint, data digest mismatch, missing external data) or bad flags.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "graph/json.h"
#include "training/checkpoint.h"

namespace castor::tools {

// What `castor verify` reports about a readable checkpoint.
struct CheckpointSummary {
  std::string file;
  int64_t file_bytes = 0;
  std::string external_data_file;  // "" when inline
  int64_t external_data_bytes = 0;
  std::string castor_version;
  std::string policy_name;
  std::string policy_digest;
  std::string compute_dtype;
  std::string variable_dtype;
  int node_count = 0;
  int kept_float32_nodes = 0;
  int64_t parameters = 0;  // trained tensors
  int64_t parameter_elements = 0;
  bool parameters_all_float32 = true;
  int64_t running_stats = 0;
  int64_t running_stat_elements = 0;
  int64_t moment_tensors = 0;
  training::TrainingState state;  // the moments' names, without their tensors
  // From the loss-scaler state (absent: not recorded).
  bool has_loss_scaler = false;
  bool loss_scaling_enabled = false;
  double loss_scale = 1.0;
  int64_t good_steps = 0;
  int64_t skipped_steps = 0;
  std::string data_digest;
  std::string record_digest;
};

CheckpointSummary SummarizeCheckpoint(const training::Checkpoint& checkpoint, const std::string& path);

// The outcome of verifying one file.
struct VerifyResult {
  int exit_code = 0;                            // kExitOk, kExitFailure or kExitBadInput
  std::string error;                            // exit 2: why the file is unreadable or corrupt
  std::optional<CheckpointSummary> summary;     // when the file was readable
  std::vector<std::string> problems;            // inconsistencies (exit 1)
  std::vector<std::string> notes;               // expected differences (another castor version)
  std::string expected_policy;                  // "" when no policy was expected
  std::vector<std::string> policy_differences;  // recorded vs expected (exit 1)
};

// Verifies `path`; `expected` (may be null) is the policy the user expects.
VerifyResult VerifyCheckpointFile(const std::string& path, const Policy* expected);

std::string RenderVerifyText(const VerifyResult& result);
Json VerifyResultToJson(const VerifyResult& result);

int RunVerify(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
