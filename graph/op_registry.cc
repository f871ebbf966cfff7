// OpRegistry storage and InferenceContext accessors.
#include "graph/op_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "graph/ops/all_ops.h"

namespace castor {

const char* AutocastCategoryName(AutocastCategory category) {
  switch (category) {
    case AutocastCategory::kAllow: return "allow";
    case AutocastCategory::kDeny: return "deny";
    case AutocastCategory::kFollow: return "follow";
    case AutocastCategory::kNone: return "none";
    case AutocastCategory::kUnset: break;
  }
  return "unset";
}

InferenceContext::InferenceContext(const Node& node, int64_t opset,
                                   std::vector<const Tensor*> input_constants,
                                   std::vector<std::optional<ShapeValue>> input_shape_values)
    : node_(node),
      opset_(opset),
      input_constants_(std::move(input_constants)),
      input_shape_values_(std::move(input_shape_values)),
      outputs_(node.num_outputs()) {
  input_constants_.resize(node.num_inputs(), nullptr);
  input_shape_values_.resize(node.num_inputs());
}

DType InferenceContext::input_dtype(int i) const {
  const Value* v = node_.input(i);
  return v ? v->dtype() : DType::kUndefined;
}

const Shape& InferenceContext::input_shape(int i) const {
  static const Shape* const kUnknown = new Shape();
  const Value* v = node_.input(i);
  return v ? v->shape() : *kUnknown;
}

const Tensor* InferenceContext::input_constant(int i) const {
  return i < static_cast<int>(input_constants_.size()) ? input_constants_[i] : nullptr;
}

const std::optional<InferenceContext::ShapeValue>& InferenceContext::input_shape_value(
    int i) const {
  static const std::optional<ShapeValue>* const kNone = new std::optional<ShapeValue>();
  return i < static_cast<int>(input_shape_values_.size()) ? input_shape_values_[i] : *kNone;
}

void InferenceContext::SetOutput(int i, DType dtype, Shape shape) {
  if (i >= num_outputs()) return;  // optional output not requested
  outputs_[i].set = true;
  outputs_[i].dtype = dtype;
  outputs_[i].shape = std::move(shape);
}

void InferenceContext::SetOutputShapeValue(int i, ShapeValue value) {
  if (i >= num_outputs()) return;
  outputs_[i].shape_value = std::move(value);
}

absl::Status InferenceContext::Error(const std::string& message) const {
  return absl::InvalidArgumentError(
      absl::StrCat(node_.op_type(), " node '", node_.name(), "': ", message));
}

const OpRegistry& OpRegistry::Global() {
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry();
    RegisterAllOps(*r);
    return r;
  }();
  return *registry;
}

const OpDef* OpRegistry::Find(const std::string& domain, const std::string& op_type) const {
  auto it = ops_.find({CanonicalDomain(domain), op_type});
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<const OpDef*> OpRegistry::All() const {
  std::vector<const OpDef*> result;
  result.reserve(ops_.size());
  for (const auto& [key, def] : ops_) result.push_back(&def);
  return result;
}

void OpRegistry::Register(OpDef def) {
  def.domain = CanonicalDomain(def.domain);
  auto key = std::make_pair(def.domain, def.op_type);
  if (ops_.contains(key)) {
    std::fprintf(stderr, "castor: op %s registered twice\n", def.op_type.c_str());
    std::abort();
  }
  ops_.emplace(std::move(key), std::move(def));
}

void OpRegistry::SetAutocastCategory(const std::string& domain, const std::string& op_type,
                                     AutocastCategory category, std::string source,
                                     bool exact, bool output_in_input_dtype) {
  auto it = ops_.find({CanonicalDomain(domain), op_type});
  if (it == ops_.end()) {
    std::fprintf(stderr, "castor: autocast table names unregistered op %s\n", op_type.c_str());
    std::abort();
  }
  it->second.autocast = category;
  it->second.autocast_source = std::move(source);
  it->second.autocast_exact = exact;
  it->second.autocast_output_in_input_dtype = output_in_input_dtype;
}

namespace {

OpDef& FindForGradient(std::map<std::pair<std::string, std::string>, OpDef>& ops,
                       const std::string& domain, const std::string& op_type) {
  auto it = ops.find({CanonicalDomain(domain), op_type});
  if (it == ops.end()) {
    std::fprintf(stderr, "castor: gradient rules name unregistered op %s\n", op_type.c_str());
    std::abort();
  }
  return it->second;
}

}  // namespace

void OpRegistry::SetGradient(const std::string& domain, const std::string& op_type,
                             GradientFn gradient) {
  FindForGradient(ops_, domain, op_type).gradient = std::move(gradient);
}

void OpRegistry::SetNoGradient(const std::string& domain, const std::string& op_type,
                               std::string reason) {
  FindForGradient(ops_, domain, op_type).no_gradient_reason = std::move(reason);
}

void OpRegistry::SetSettingInputs(const std::string& domain, const std::string& op_type,
                                  std::vector<int> inputs) {
  FindForGradient(ops_, domain, op_type).setting_inputs = std::move(inputs);
}

bool OpDef::IsSettingInput(int index) const {
  return std::find(setting_inputs.begin(), setting_inputs.end(), index) != setting_inputs.end();
}

}  // namespace castor
