// The autocast policy as data (DESIGN.md, "The autocast pass").
//
// A Policy says which dtype each node of a model computes in: a name, the
// compute dtype (float16/bfloat16 for the mixed policies, float32 for the
// float32 policy), the variable dtype of master weights (always float32),
// the op lists, per-op and per-node overrides, per-(op, input) float32 pins
// and whether graph outputs stay float32.
//
// The op lists start from the registry's table (graph/ops/autocast_table.cc,
// the one place they are written down); a policy stores them resolved, with
// its op overrides applied, so a saved policy (and the checkpoint that
// records it) says exactly which list every op was on. The digest is the
// SHA-256 of the canonical JSON form, so two policies with the same digest
// make the same decisions.
//
// JSON form (`castor convert --policy-file F`; every field but "name" is
// optional when loading and defaults to the built-in policy of that name, or
// to mixed_float16's settings for a custom name with a compute_dtype):
//   {
//     "format": "castor.policy/1",
//     "name": "mixed_float16",
//     "compute_dtype": "float16",          // float32 | float16 | bfloat16
//     "variable_dtype": "float32",
//     "keep_io_types": true,               // graph outputs and their producers float32
//     "op_lists": {"allow": [...], "deny": [...], "follow": [...], "none": [...]},
//     "op_overrides": {"Softmax": "allow"},          // applied on top of op_lists
//     "node_overrides": [{"name": "fc2", "category": "deny"},
//                        {"regex": "encoder/.*/attn.*", "category": "deny"}],
//     "pins": [{"op": "Resize", "input": 2}]        // that input stays float32
//   }
// Ops outside the default domain are written "domain:OpType".
#pragma once

#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "graph/json.h"
#include "graph/op_registry.h"

namespace castor {

// The key of an op in the op lists: "Conv", or "domain:OpType" outside the
// default domain.
std::string OpListKey(const std::string& domain, const std::string& op_type);

// Parses "allow" / "deny" / "follow" / "none" (also "fp32" and "float32" for
// deny, "lowp" and "compute" for allow).
absl::StatusOr<AutocastCategory> ParseAutocastCategory(const std::string& text);

struct NodeOverride {
  // Exactly one of `name` (exact node name) and `regex` (ECMAScript, must
  // match the whole node name) is set.
  std::string name;
  std::string regex;
  AutocastCategory category = AutocastCategory::kDeny;
  std::string Describe() const;  // `node "fc2"` or `node regex "enc.*"`
};

struct InputPin {
  std::string op;  // an OpListKey
  int input = 0;
};

// Why a node got its category: the rule and the list entry behind it.
struct CategoryReason {
  AutocastCategory category = AutocastCategory::kUnset;
  // "node override", "op override" or "op list".
  std::string rule;
  // The entry: `node regex "enc.*" -> deny`, `op_overrides Softmax -> allow`,
  // or `deny list: Softmax (PyTorch softmax: fp32; ...)`.
  std::string entry;
};

class Policy {
 public:
  // The built-in policies: "float32", "mixed_float16", "mixed_bfloat16".
  static absl::StatusOr<Policy> Builtin(const std::string& name);
  static std::vector<std::string> BuiltinNames();
  // Loads and validates a policy file; errors name the file and the field.
  static absl::StatusOr<Policy> LoadFile(const std::string& path);
  // `source` names the origin in error messages (a file path, "checkpoint").
  static absl::StatusOr<Policy> FromJson(const Json& json, const std::string& source);

  Json ToJson() const;
  // Writes ToJson() atomically, 2-space indented.
  absl::Status SaveFile(const std::string& path) const;
  // "sha256:<64 hex digits>" of the compact canonical JSON.
  std::string Digest() const;

  const std::string& name() const { return name_; }
  DType compute_dtype() const { return compute_dtype_; }
  DType variable_dtype() const { return DType::kFloat32; }
  bool keep_io_types() const { return keep_io_types_; }
  void set_keep_io_types(bool keep) { keep_io_types_ = keep; }
  // True when the policy computes anything in a 16-bit dtype.
  bool is_mixed() const { return compute_dtype_ != DType::kFloat32; }

  // Op overrides (the --fp32-ops / --lowp-ops flags): `op` is an OpListKey
  // of a registered op. Overriding one op two different ways is an error.
  absl::Status OverrideOp(const std::string& op, AutocastCategory category);
  // Node overrides (the --fp32-nodes flag): the regex must compile. The same
  // exact name or pattern with two different categories is an error.
  absl::Status OverrideNode(NodeOverride override_rule);
  absl::Status PinInput(const std::string& op, int input);

  // The category of `node` and why: node override, then op override, then
  // op list. A node matched by two node overrides with different categories
  // is an error naming both. Unknown ops get kUnset.
  absl::StatusOr<CategoryReason> CategoryOf(const Node& node) const;
  // The op-list category (after op overrides) of an op, kUnset if unknown.
  AutocastCategory OpCategory(const std::string& domain, const std::string& op_type) const;
  bool IsPinned(const Node& node, int input) const;

  const std::map<std::string, AutocastCategory>& op_lists() const { return op_lists_; }
  const std::map<std::string, AutocastCategory>& op_overrides() const { return op_overrides_; }
  const std::vector<NodeOverride>& node_overrides() const { return node_overrides_; }
  const std::vector<InputPin>& pins() const { return pins_; }

 private:
  Policy() = default;
  // FromJson's steps (policy.cc): the policy the name and compute dtype
  // start from, then each optional field in the order of the format.
  static absl::StatusOr<Policy> StartFromJson(const Json& json, const std::string& source);
  absl::Status ReadOpListsJson(const Json& lists, const std::string& source);

  std::string name_;
  DType compute_dtype_ = DType::kFloat32;
  bool keep_io_types_ = true;
  // Every registered op's category after op overrides, by OpListKey.
  std::map<std::string, AutocastCategory> op_lists_;
  std::map<std::string, AutocastCategory> op_overrides_;
  std::vector<NodeOverride> node_overrides_;
  // Compiled node_overrides_ regexes (nullptr for exact names), same order.
  std::vector<std::shared_ptr<const std::regex>> compiled_;
  std::vector<InputPin> pins_;
};

}  // namespace castor
