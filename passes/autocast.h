// The autocast pass: rewrites a float32 model so each node computes in the
// dtype a Policy gives it, inserting the fewest Casts that make it so
// (DESIGN.md, "The autocast pass"; the numbered algorithm is at the top of
// autocast.cc).
//
// What a converted model records, so a later reader (inspect --why,
// castor verify, a second conversion) needs nothing but the file:
//   model metadata_props
//     castor.policy           policy name
//     castor.policy_digest    Policy::Digest()
//     castor.policy_json      the policy, compact JSON (Policy::FromJson)
//     castor.compute_dtype    "float16" | "bfloat16" | "float32"
//     castor.lowered_inputs   graph inputs turned 16-bit (--no-keep-io-types),
//                             comma-separated; absent when none
//   node metadata (NodeProto.metadata_props)
//     castor.autocast.dtype   the dtype the node computes in
//     castor.autocast.why     the rule and list entry behind it
//     castor.autocast.cast    on Casts castor inserted: "weight", "constant"
//                             or "activation" (what the Cast reads)
//     castor.autocast.float32_value
//                             on a Constant stored in 16 bits because every
//                             reader needs it so: its float32 values, %.9g,
//                             comma-separated (StripAutocast restores them)
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "passes/pass.h"
#include "passes/policy.h"

namespace castor {

// Model and node metadata keys written by the pass.
inline constexpr const char* kPolicyNameKey = "castor.policy";
inline constexpr const char* kPolicyDigestKey = "castor.policy_digest";
inline constexpr const char* kPolicyJsonKey = "castor.policy_json";
inline constexpr const char* kComputeDTypeKey = "castor.compute_dtype";
inline constexpr const char* kLoweredInputsKey = "castor.lowered_inputs";
inline constexpr const char* kNodeDTypeKey = "castor.autocast.dtype";
inline constexpr const char* kNodeWhyKey = "castor.autocast.why";
inline constexpr const char* kInsertedCastKey = "castor.autocast.cast";
inline constexpr const char* kLoweredConstantKey = "castor.autocast.float32_value";

struct AutocastOptions {
  // A model already converted under a different policy is refused unless
  // this is set; then castor's own Casts and records are removed first and
  // the float32 graph is converted again.
  bool restart_from_float32 = false;
  // For castor's training graph only ('castor train', and the checks of
  // what a checkpoint recorded): a Conv or ConvTranspose that ONNX refuses
  // in the compute dtype at the model's opset (bfloat16 below opset 22) is
  // given castor's form of the op (com.castor Conv / ConvTranspose, opset
  // 22's schema at every opset; graph/ops/conv.cc) and computes in it.
  // Off (the default), as 'castor convert' writes a file ONNX Runtime runs:
  // the node stays ONNX and float32, and its record says that training
  // computes it in the compute dtype.
  bool training_graph_ops = false;
};

struct AutocastReport {
  // The model already carried this policy's digest: nothing was changed.
  bool unchanged = false;
  // Casts removed by restart_from_float32.
  int casts_removed = 0;
  int weight_casts = 0;      // Casts of float32 initializers (master weights)
  int constant_casts = 0;    // Casts of Constant node outputs
  int activation_casts = 0;  // Casts of computed values and graph inputs
  // Constant nodes stored in the compute dtype because every reader needs
  // it there (no Cast inserted for them).
  int constants_lowered = 0;
  // Nodes that compute in the compute dtype as castor's form of their op
  // (training_graph_ops), per op; and, without that option, the nodes
  // that stay float32 in this graph but compute in the compute dtype in
  // castor's training graph.
  std::map<std::string, int> training_forms;
  std::map<std::string, int> float32_here_lowp_in_training;
  int casts_inserted() const { return weight_casts + constant_casts + activation_casts; }
  // Nodes per compute dtype name ("float16", "float32", ...); nodes that do
  // no float computation (Shape, Cast, ...) are counted under "none".
  std::map<std::string, int> nodes_per_dtype;
  // Bytes of floating-point initializers as stored (float32 master copies)
  // and as the nodes that read them compute (16-bit where cast).
  int64_t weight_bytes_stored = 0;
  int64_t weight_bytes_computed = 0;
  // Things the user should know: nodes kept float32 because castor cannot
  // look inside them (subgraphs, unknown ops), no-op model Casts removed.
  std::vector<std::string> notes;
};

// Converts `model` in place. The model must have inferred types (as
// LoadModel leaves it). Errors name the node, the op or the policies.
absl::StatusOr<AutocastReport> RunAutocast(Model& model, const Policy& policy,
                                           const AutocastOptions& options = {});

// RunAutocast as a pass for a PassManager: `policy` must outlive it; the
// report goes to `*report` when given.
std::unique_ptr<Pass> MakeAutocastPass(const Policy& policy, AutocastOptions options = {},
                                       AutocastReport* report = nullptr);

// Removes what RunAutocast added (its Casts, node and model records,
// lowered graph inputs) and re-infers types: the float32 graph again.
// Returns the number of Casts removed.
absl::StatusOr<int> StripAutocast(Model& model);

// The autocast record of a node: its dtype and why, or empty strings when
// the model was not converted by castor (or the node does no float work).
struct AutocastRecord {
  std::string dtype;
  std::string why;
  std::string inserted_cast;  // "" unless castor inserted this Cast
};
AutocastRecord ReadAutocastRecord(const Node& node);

}  // namespace castor
