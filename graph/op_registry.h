// The op registry: one OpDef per ONNX op type (per domain), holding
//   - the attribute schema (names, kinds, required or default),
//   - the input/output arity,
//   - dtype + shape inference, which also handles the op's opset-version
//     differences (axes as attribute vs input, ...),
//   - the autocast category, with the list entry it comes from (set for
//     every op by the one table in graph/ops/autocast_table.cc) and
//   - the gradient rule, or an explicit reason why the op has none (set by
//     graph/ops/gradient_rules.cc).
// Each op (or small family) is defined in one file under graph/ops/ and
// registered by that file's Register*Ops function, listed in all_ops.cc;
// tests/registry_test.cc checks every registered op has both (the known
// gaps are listed in tests/registry_gaps.txt).
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "graph/attribute.h"
#include "graph/graph.h"

namespace castor {

// How the autocast pass treats an op (DESIGN.md, "The autocast pass").
enum class AutocastCategory {
  kUnset,   // not decided yet: the registry completeness test lists these
  kAllow,   // runs in the compute dtype (tensor-core work)
  kDeny,    // always float32 (numerically sensitive)
  kFollow,  // takes the dtype its float inputs agree on
  kNone,    // not a float computation (shape ops on int64, comparisons, ...)
};
const char* AutocastCategoryName(AutocastCategory category);

struct AttrSpec {
  std::string name;
  AttrKind kind;
  bool required = false;
};

// What an inference function sees of one node: its inputs' types, the
// values of inputs known at graph-build time, and its attributes.
class InferenceContext {
 public:
  // A "shape value" is a 1-D (or scalar) int64 tensor whose entries are
  // known as Dims, possibly symbolic: the output of Shape(x) for x of shape
  // [N,28,28] is {N, 28, 28}. Propagating these through Gather/Concat/
  // Unsqueeze/Slice lets Reshape keep symbolic batch dims.
  using ShapeValue = std::vector<Dim>;

  InferenceContext(const Node& node, int64_t opset,
                   std::vector<const Tensor*> input_constants,
                   std::vector<std::optional<ShapeValue>> input_shape_values);

  const Node& node() const { return node_; }
  int64_t opset() const { return opset_; }

  int num_inputs() const { return node_.num_inputs(); }
  int num_outputs() const { return node_.num_outputs(); }
  bool has_input(int i) const { return node_.input(i) != nullptr; }
  DType input_dtype(int i) const;
  const Shape& input_shape(int i) const;
  // The input's data when known at graph-build time (an initializer that is
  // not an overridable graph input, or a Constant's value), else nullptr.
  const Tensor* input_constant(int i) const;
  // The input as a shape value (from a constant int tensor or propagated).
  const std::optional<ShapeValue>& input_shape_value(int i) const;

  // Attribute reads; absent attributes give the default.
  bool has_attribute(const std::string& name) const { return node_.has_attribute(name); }
  int64_t GetInt(const std::string& name, int64_t default_value) const {
    return node_.GetInt(name, default_value);
  }
  float GetFloat(const std::string& name, float default_value) const {
    return node_.GetFloat(name, default_value);
  }
  std::string GetString(const std::string& name, const std::string& default_value) const {
    return node_.GetString(name, default_value);
  }
  std::vector<int64_t> GetInts(const std::string& name,
                               std::vector<int64_t> default_value = {}) const {
    return node_.GetInts(name, std::move(default_value));
  }

  // Results. Every output must get a dtype; shapes may stay unknown.
  void SetOutput(int i, DType dtype, Shape shape);
  void SetOutputShapeValue(int i, ShapeValue value);
  DType output_dtype(int i) const { return outputs_[i].dtype; }
  const Shape& output_shape(int i) const { return outputs_[i].shape; }
  bool output_set(int i) const { return outputs_[i].set; }
  const std::optional<ShapeValue>& output_shape_value(int i) const {
    return outputs_[i].shape_value;
  }

  // An InvalidArgument error prefixed with the node's op and name.
  absl::Status Error(const std::string& message) const;

 private:
  struct Output {
    bool set = false;
    DType dtype = DType::kUndefined;
    Shape shape;
    std::optional<ShapeValue> shape_value;
  };
  const Node& node_;
  int64_t opset_;
  std::vector<const Tensor*> input_constants_;
  std::vector<std::optional<ShapeValue>> input_shape_values_;
  std::vector<Output> outputs_;
};

using InferFn = std::function<absl::Status(InferenceContext&)>;

// The gradient rules (graph/ops/gradient_rules.cc) build backward nodes
// through a GradientBuilder (graph/gradient_builder.h).
class GradientBuilder;
using GradientFn = std::function<absl::Status(GradientBuilder&)>;

struct OpDef {
  std::string op_type;
  std::string domain;  // "" = ai.onnx
  // Opset versions of `domain` this definition handles (inclusive).
  int64_t min_opset = 1;
  int64_t max_opset = INT64_MAX;
  int min_inputs = 0;
  int max_inputs = 0;  // INT_MAX for variadic
  int min_outputs = 1;
  int max_outputs = 1;
  std::vector<AttrSpec> attributes;
  InferFn infer;
  AutocastCategory autocast = AutocastCategory::kUnset;
  // Where the category comes from (PyTorch/TensorFlow list entries), shown
  // by `castor inspect --why`; set with the category by autocast_table.cc.
  std::string autocast_source;
  // The op commutes with rounding to a 16-bit dtype: on rounded inputs it
  // gives the rounding of its float32 result (data movement, Relu,
  // MaxPool, sign). The autocast pass may then run a follow op of this
  // kind in 16-bit when its readers do (passes/autocast.cc, step 3b); its
  // forward values are the same, its gradient sees the rounded values.
  bool autocast_exact = false;
  // A deny op that computes in float32 but hands its first output on in
  // the dtype its first input arrived in (BatchNormalization: PyTorch's
  // batch_norm under autocast and Keras's BatchNormalization return their
  // input's dtype, normalising with float32 statistics). The autocast pass
  // counts that output as a vote in its input's dtype for the readers that
  // follow (passes/autocast.cc, step 3): they read it through one Cast.
  bool autocast_output_in_input_dtype = false;
  GradientFn gradient;
  std::string no_gradient_reason;  // set when the op deliberately has none
  // Inputs that are settings rather than values (Dropout's ratio): the
  // autodiff pass never differentiates through them,
  // and a float initializer read only there is not a parameter.
  std::vector<int> setting_inputs;
  bool IsSettingInput(int index) const;
  std::string summary;             // one line, for `castor ops` and docs
};

class OpRegistry {
 public:
  // The registry of every op castor knows, built once on first use.
  static const OpRegistry& Global();

  const OpDef* Find(const std::string& domain, const std::string& op_type) const;
  std::vector<const OpDef*> All() const;  // sorted by (domain, op_type)

  // Registration, used by graph/ops/*.cc. Re-registering an op aborts
  // with a message: it is a programming error caught by every test run.
  void Register(OpDef def);
  // Sets an op's default autocast category (graph/ops/autocast_table.cc).
  // An unknown op aborts: the table and the registry must agree.
  void SetAutocastCategory(const std::string& domain, const std::string& op_type,
                           AutocastCategory category, std::string source, bool exact,
                           bool output_in_input_dtype);
  // Sets an op's gradient rule, or the reason it deliberately has none
  // (graph/ops/gradient_rules.cc). An unknown op aborts.
  void SetGradient(const std::string& domain, const std::string& op_type, GradientFn gradient);
  void SetNoGradient(const std::string& domain, const std::string& op_type, std::string reason);
  void SetSettingInputs(const std::string& domain, const std::string& op_type,
                        std::vector<int> inputs);

 private:
  std::map<std::pair<std::string, std::string>, OpDef> ops_;
};

// Supported opset range of the default domain.
inline constexpr int64_t kMinOnnxOpset = 7;
inline constexpr int64_t kMaxOnnxOpset = 25;
inline constexpr const char* kTrainingDomain = "ai.onnx.preview.training";

}  // namespace castor
