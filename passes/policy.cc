// The autocast policy as data (passes/policy.h): the built-in policies, op
// and node overrides, input pins, the per-node category decision with its
// reason, and the canonical JSON form with its digest.
#include "passes/policy.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/onnx_io.h"
#include "graph/sha256.h"
#include "graph/status.h"
#include "graph/user_regex.h"

namespace castor {
namespace {

constexpr const char* kPolicyFormat = "castor.policy/1";

struct BuiltinPolicy {
  const char* name;
  DType compute_dtype;
};

constexpr BuiltinPolicy kBuiltinPolicies[] = {
    {"float32", DType::kFloat32},
    {"mixed_float16", DType::kFloat16},
    {"mixed_bfloat16", DType::kBFloat16},
};

// The categories in the order the JSON op_lists object lists them.
constexpr AutocastCategory kListCategories[] = {
    AutocastCategory::kAllow,
    AutocastCategory::kDeny,
    AutocastCategory::kFollow,
    AutocastCategory::kNone,
};

constexpr const char* kTopLevelFields[] = {
    "format",   "name",         "compute_dtype",  "variable_dtype", "keep_io_types",
    "op_lists", "op_overrides", "node_overrides", "pins",
};

bool IsDefaultDomain(const std::string& domain) {
  return domain.empty() || domain == "ai.onnx";
}

// Splits an OpListKey into (domain, op_type). Domains have no ':'.
std::pair<std::string, std::string> SplitOpListKey(const std::string& key) {
  size_t colon = key.rfind(':');
  if (colon == std::string::npos) return {"", key};
  return {key.substr(0, colon), key.substr(colon + 1)};
}

// "ai.onnx:Conv" is the same op as "Conv".
std::string CanonicalOpListKey(const std::string& key) {
  auto [domain, op_type] = SplitOpListKey(key);
  return OpListKey(domain, op_type);
}

// A short hint for an unknown op: case-insensitive matches first, else the
// first few registered ops.
std::string KnownOpsHint(const std::map<std::string, AutocastCategory>& op_lists,
                         const std::string& op) {
  std::string lowered = absl::AsciiStrToLower(op);
  std::vector<std::string> similar;
  for (const auto& [key, category] : op_lists) {
    if (absl::AsciiStrToLower(key) == lowered) similar.push_back(key);
  }
  if (!similar.empty()) return absl::StrCat("did you mean ", absl::StrJoin(similar, " or "), "?");
  std::vector<std::string> first;
  for (const auto& [key, category] : op_lists) {
    if (first.size() == 6) break;
    first.push_back(key);
  }
  return absl::StrCat("known ops include ", absl::StrJoin(first, ", "), ", ... (",
                      op_lists.size(), " registered ops)");
}

// `status` as an InvalidArgument error prefixed with "<source>: <field>: ".
absl::Status FieldError(const std::string& source, const std::string& field,
                        const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, ": ", status.message()));
}

absl::Status FieldError(const std::string& source, const std::string& field,
                        const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, ": ", message));
}

const char* JsonTypeName(const Json& json) {
  switch (json.type()) {
    case Json::Type::kNull: return "null";
    case Json::Type::kBool: return "a boolean";
    case Json::Type::kNumber: return "a number";
    case Json::Type::kString: return "a string";
    case Json::Type::kArray: return "an array";
    case Json::Type::kObject: return "an object";
  }
  return "a value";
}

std::string Quoted(const std::string& text) { return absl::StrCat("\"", text, "\""); }

// Parses a policy compute dtype: float32, float16 or bfloat16.
absl::StatusOr<DType> ParseComputeDType(const std::string& text) {
  absl::StatusOr<DType> dtype = DTypeFromName(text);
  if (!dtype.ok() || (*dtype != DType::kFloat32 && *dtype != DType::kFloat16 &&
                      *dtype != DType::kBFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compute dtype ", Quoted(text), " is not one of float32, float16, bfloat16"));
  }
  return *dtype;
}

}  // namespace

std::string OpListKey(const std::string& domain, const std::string& op_type) {
  if (IsDefaultDomain(domain)) return op_type;
  return absl::StrCat(domain, ":", op_type);
}

absl::StatusOr<AutocastCategory> ParseAutocastCategory(const std::string& text) {
  std::string word = absl::AsciiStrToLower(text);
  if (word == "allow" || word == "lowp" || word == "compute") return AutocastCategory::kAllow;
  if (word == "deny" || word == "fp32" || word == "float32") return AutocastCategory::kDeny;
  if (word == "follow") return AutocastCategory::kFollow;
  if (word == "none") return AutocastCategory::kNone;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown autocast category ", Quoted(text),
      "; expected allow, deny, follow or none (also fp32/float32 for deny, lowp/compute "
      "for allow)"));
}

std::string NodeOverride::Describe() const {
  if (!regex.empty()) return absl::StrCat("node regex ", Quoted(regex));
  return absl::StrCat("node ", Quoted(name));
}

// --- construction ------------------------------------------------------------

std::vector<std::string> Policy::BuiltinNames() {
  std::vector<std::string> names;
  for (const BuiltinPolicy& builtin : kBuiltinPolicies) names.push_back(builtin.name);
  return names;
}

absl::StatusOr<Policy> Policy::Builtin(const std::string& name) {
  for (const BuiltinPolicy& builtin : kBuiltinPolicies) {
    if (name != builtin.name) continue;
    Policy policy;
    policy.name_ = name;
    policy.compute_dtype_ = builtin.compute_dtype;
    policy.keep_io_types_ = true;
    for (const OpDef* def : OpRegistry::Global().All()) {
      policy.op_lists_[OpListKey(def->domain, def->op_type)] = def->autocast;
    }
    return policy;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown built-in policy ", Quoted(name), "; valid names: ",
                   absl::StrJoin(BuiltinNames(), ", ")));
}

absl::Status Policy::OverrideOp(const std::string& op, AutocastCategory category) {
  if (category == AutocastCategory::kUnset) {
    return absl::InvalidArgumentError(
        absl::StrCat("op override of ", Quoted(op), " needs a category (allow, deny, follow "
                     "or none)"));
  }
  std::string key = CanonicalOpListKey(op);
  auto list_it = op_lists_.find(key);
  if (list_it == op_lists_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown op ", Quoted(op), " in op override; ", KnownOpsHint(op_lists_, op)));
  }
  auto [it, inserted] = op_overrides_.emplace(key, category);
  if (!inserted && it->second != category) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op ", Quoted(key), " is overridden both as ", AutocastCategoryName(it->second),
        " and as ", AutocastCategoryName(category), "; the op lists must not overlap"));
  }
  list_it->second = category;
  return absl::OkStatus();
}

absl::Status Policy::OverrideNode(NodeOverride override_rule) {
  if (override_rule.name.empty() == override_rule.regex.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a node override needs exactly one of a node name and a regex (got name ",
        Quoted(override_rule.name), ", regex ", Quoted(override_rule.regex), ")"));
  }
  if (override_rule.category == AutocastCategory::kUnset) {
    return absl::InvalidArgumentError(absl::StrCat(
        override_rule.Describe(), " override needs a category (allow, deny, follow or none)"));
  }
  for (const NodeOverride& existing : node_overrides_) {
    if (existing.name != override_rule.name || existing.regex != override_rule.regex) continue;
    if (existing.category == override_rule.category) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        override_rule.Describe(), " is overridden both as ",
        AutocastCategoryName(existing.category), " and as ",
        AutocastCategoryName(override_rule.category), "; the overrides must not overlap"));
  }
  std::shared_ptr<const std::regex> compiled;
  if (!override_rule.regex.empty()) {
    absl::StatusOr<std::regex> regex = CompileUserRegex(override_rule.regex);
    if (!regex.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid node regex ", Quoted(override_rule.regex), ": ", regex.status().message()));
    }
    compiled = std::make_shared<const std::regex>(*std::move(regex));
  }
  node_overrides_.push_back(std::move(override_rule));
  compiled_.push_back(std::move(compiled));
  return absl::OkStatus();
}

absl::Status Policy::PinInput(const std::string& op, int input) {
  std::string key = CanonicalOpListKey(op);
  auto [domain, op_type] = SplitOpListKey(key);
  const OpDef* def = OpRegistry::Global().Find(domain, op_type);
  if (def == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown op ", Quoted(op), " in input pin; ", KnownOpsHint(op_lists_, op)));
  }
  if (input < 0 || input >= def->max_inputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input pin ", key, " input ", input, " is out of range: ", key, " has ",
        def->max_inputs == INT_MAX ? std::string("variadic")
                                   : absl::StrCat("at most ", def->max_inputs),
        " inputs (numbered from 0)"));
  }
  InputPin pin{key, input};
  auto less = [](const InputPin& a, const InputPin& b) {
    return std::tie(a.op, a.input) < std::tie(b.op, b.input);
  };
  auto it = std::lower_bound(pins_.begin(), pins_.end(), pin, less);
  if (it != pins_.end() && it->op == pin.op && it->input == pin.input) return absl::OkStatus();
  pins_.insert(it, std::move(pin));
  return absl::OkStatus();
}

// --- decisions ---------------------------------------------------------------

absl::StatusOr<CategoryReason> Policy::CategoryOf(const Node& node) const {
  // (1) Node overrides, exact names and whole-name regex matches.
  if (!node_overrides_.empty()) {
    int first_match = -1;
    for (size_t i = 0; i < node_overrides_.size(); ++i) {
      const NodeOverride& rule = node_overrides_[i];
      bool matches = compiled_[i] == nullptr ? rule.name == node.name()
                                             : std::regex_match(node.name(), *compiled_[i]);
      if (!matches) continue;
      if (first_match < 0) {
        first_match = static_cast<int>(i);
        continue;
      }
      const NodeOverride& first = node_overrides_[first_match];
      if (first.category != rule.category) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node ", Quoted(node.name()), " (", node.op_type(), ") matches both ",
            first.Describe(), " -> ", AutocastCategoryName(first.category), " and ",
            rule.Describe(), " -> ", AutocastCategoryName(rule.category),
            "; the node overrides must agree"));
      }
    }
    if (first_match >= 0) {
      const NodeOverride& rule = node_overrides_[first_match];
      return CategoryReason{
          rule.category, "node override",
          absl::StrCat(rule.Describe(), " -> ", AutocastCategoryName(rule.category))};
    }
  }

  // The op's key without building a string in the default domain.
  std::string foreign_key;
  const std::string* key = &node.op_type();
  if (!IsDefaultDomain(node.domain())) {
    foreign_key = OpListKey(node.domain(), node.op_type());
    key = &foreign_key;
  }

  // (2) Op overrides.
  if (!op_overrides_.empty()) {
    auto it = op_overrides_.find(*key);
    if (it != op_overrides_.end()) {
      return CategoryReason{
          it->second, "op override",
          absl::StrCat("op_overrides ", *key, " -> ", AutocastCategoryName(it->second))};
    }
  }

  // (3) The op lists.
  auto it = op_lists_.find(*key);
  if (it == op_lists_.end()) {
    return CategoryReason{
        AutocastCategory::kUnset, "unknown op",
        absl::StrCat(*key, " is not in the op registry, so no op list has it")};
  }
  if (it->second == AutocastCategory::kUnset) {
    return CategoryReason{AutocastCategory::kUnset, "op list",
                          absl::StrCat(*key, " has no autocast category in the registry")};
  }
  const OpDef* def = OpRegistry::Global().Find(node.domain(), node.op_type());
  const char* list_name = AutocastCategoryName(it->second);
  if (def != nullptr && def->autocast == it->second) {
    return CategoryReason{it->second, "op list",
                          absl::StrCat(list_name, " list: ", *key, " (", def->autocast_source, ")")};
  }
  // The policy file moved the op off its registry list.
  return CategoryReason{it->second, "op list",
                        absl::StrCat(list_name, " list: ", *key, " (op_lists of policy \"",
                                     name_, "\")")};
}

AutocastCategory Policy::OpCategory(const std::string& domain, const std::string& op_type) const {
  auto it = IsDefaultDomain(domain) ? op_lists_.find(op_type)
                                    : op_lists_.find(OpListKey(domain, op_type));
  return it == op_lists_.end() ? AutocastCategory::kUnset : it->second;
}

bool Policy::IsPinned(const Node& node, int input) const {
  if (pins_.empty()) return false;
  std::string key = OpListKey(node.domain(), node.op_type());
  for (const InputPin& pin : pins_) {
    if (pin.input == input && pin.op == key) return true;
  }
  return false;
}

// --- JSON --------------------------------------------------------------------

Json Policy::ToJson() const {
  Json json = Json::Object();
  json.Set("format", Json::String(kPolicyFormat));
  json.Set("name", Json::String(name_));
  json.Set("compute_dtype", Json::String(DTypeName(compute_dtype_)));
  json.Set("variable_dtype", Json::String(DTypeName(DType::kFloat32)));
  json.Set("keep_io_types", Json::Bool(keep_io_types_));

  Json lists = Json::Object();
  for (AutocastCategory category : kListCategories) {
    Json ops = Json::Array();
    for (const auto& [op, op_category] : op_lists_) {  // std::map: sorted keys
      if (op_category == category) ops.Append(Json::String(op));
    }
    lists.Set(AutocastCategoryName(category), std::move(ops));
  }
  json.Set("op_lists", std::move(lists));

  Json overrides = Json::Object();
  for (const auto& [op, category] : op_overrides_) {
    overrides.Set(op, Json::String(AutocastCategoryName(category)));
  }
  json.Set("op_overrides", std::move(overrides));

  Json nodes = Json::Array();
  for (const NodeOverride& rule : node_overrides_) {
    Json entry = Json::Object();
    if (!rule.regex.empty()) {
      entry.Set("regex", Json::String(rule.regex));
    } else {
      entry.Set("name", Json::String(rule.name));
    }
    entry.Set("category", Json::String(AutocastCategoryName(rule.category)));
    nodes.Append(std::move(entry));
  }
  json.Set("node_overrides", std::move(nodes));

  Json pins = Json::Array();
  for (const InputPin& pin : pins_) {  // kept sorted by (op, input)
    Json entry = Json::Object();
    entry.Set("op", Json::String(pin.op));
    entry.Set("input", Json::Int(pin.input));
    pins.Append(std::move(entry));
  }
  json.Set("pins", std::move(pins));
  return json;
}

namespace {

// FromJson's steps for the optional fields that go through Policy's public
// setters.

absl::Status ReadOpOverridesJson(const Json& overrides, const std::string& source,
                                 Policy& policy) {
  if (!overrides.is_object()) {
    return FieldError(source, "op_overrides",
                      absl::StrCat("expected an object, got ", JsonTypeName(overrides)));
  }
  for (const auto& [op, category_json] : overrides.members()) {
    const std::string field = absl::StrCat("op_overrides.", op);
    if (!category_json.is_string()) {
      return FieldError(source, field,
                        absl::StrCat("expected a category string, got ",
                                     JsonTypeName(category_json)));
    }
    absl::StatusOr<AutocastCategory> category =
        ParseAutocastCategory(category_json.as_string());
    if (!category.ok()) return FieldError(source, field, category.status());
    absl::Status status = policy.OverrideOp(op, *category);
    if (!status.ok()) return FieldError(source, "op_overrides", status);
  }
  return absl::OkStatus();
}

absl::Status ReadNodeOverridesJson(const Json& nodes, const std::string& source, Policy& policy) {
  if (!nodes.is_array()) {
    return FieldError(source, "node_overrides",
                      absl::StrCat("expected an array, got ", JsonTypeName(nodes)));
  }
  for (size_t i = 0; i < nodes.items().size(); ++i) {
    const Json& entry = nodes.items()[i];
    const std::string field = absl::StrCat("node_overrides[", i, "]");
    if (!entry.is_object()) {
      return FieldError(source, field,
                        absl::StrCat("expected an object, got ", JsonTypeName(entry)));
    }
    NodeOverride rule;
    bool has_category = false;
    for (const auto& [key, value] : entry.members()) {
      if (key != "name" && key != "regex" && key != "category") {
        return FieldError(source, field,
                          absl::StrCat("unknown field ", Quoted(key),
                                       " (known fields: name, regex, category)"));
      }
      if (!value.is_string()) {
        return FieldError(source, absl::StrCat(field, ".", key),
                          absl::StrCat("expected a string, got ", JsonTypeName(value)));
      }
      if (key == "name") {
        rule.name = value.as_string();
      } else if (key == "regex") {
        rule.regex = value.as_string();
      } else {
        absl::StatusOr<AutocastCategory> category = ParseAutocastCategory(value.as_string());
        if (!category.ok()) {
          return FieldError(source, absl::StrCat(field, ".category"), category.status());
        }
        rule.category = *category;
        has_category = true;
      }
    }
    if (!has_category) return FieldError(source, field, "missing \"category\"");
    absl::Status status = policy.OverrideNode(std::move(rule));
    if (!status.ok()) return FieldError(source, field, status);
  }
  return absl::OkStatus();
}

absl::Status ReadPinsJson(const Json& pins, const std::string& source, Policy& policy) {
  if (!pins.is_array()) {
    return FieldError(source, "pins",
                      absl::StrCat("expected an array, got ", JsonTypeName(pins)));
  }
  for (size_t i = 0; i < pins.items().size(); ++i) {
    const Json& entry = pins.items()[i];
    const std::string field = absl::StrCat("pins[", i, "]");
    if (!entry.is_object()) {
      return FieldError(source, field,
                        absl::StrCat("expected an object, got ", JsonTypeName(entry)));
    }
    for (const auto& [key, value] : entry.members()) {
      if (key != "op" && key != "input") {
        return FieldError(source, field,
                          absl::StrCat("unknown field ", Quoted(key),
                                       " (known fields: op, input)"));
      }
    }
    const Json* op = entry.Find("op");
    const Json* input = entry.Find("input");
    if (op == nullptr || !op->is_string()) {
      return FieldError(source, field, "needs \"op\", a string");
    }
    if (input == nullptr || !input->is_int() || input->as_int() < 0 ||
        input->as_int() > INT_MAX) {
      return FieldError(source, field, "needs \"input\", a non-negative integer");
    }
    absl::Status status = policy.PinInput(op->as_string(), static_cast<int>(input->as_int()));
    if (!status.ok()) return FieldError(source, field, status);
  }
  return absl::OkStatus();
}

}  // namespace

// The fields every policy has (format, name, compute_dtype, variable_dtype,
// keep_io_types) on top of the built-in policy of that name, or
// mixed_float16's lists with the given compute dtype.
absl::StatusOr<Policy> Policy::StartFromJson(const Json& json, const std::string& source) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a policy must be a JSON object, not ", JsonTypeName(json)));
  }
  for (const auto& [key, value] : json.members()) {
    if (std::find(std::begin(kTopLevelFields), std::end(kTopLevelFields), key) ==
        std::end(kTopLevelFields)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unknown field ", Quoted(key), " (known fields: ",
                       absl::StrJoin(kTopLevelFields, ", "), ")"));
    }
  }
  // A field that must be a string, or nullptr when absent.
  auto string_field = [&](const char* field) -> absl::StatusOr<const std::string*> {
    const Json* value = json.Find(field);
    if (value == nullptr) return nullptr;
    if (!value->is_string()) {
      return FieldError(source, field,
                        absl::StrCat("expected a string, got ", JsonTypeName(*value)));
    }
    return &value->as_string();
  };

  CASTOR_ASSIGN_OR_RETURN(const std::string* format, string_field("format"));
  if (format != nullptr && *format != kPolicyFormat) {
    return FieldError(source, "format",
                      absl::StrCat("is ", Quoted(*format), "; expected ", Quoted(kPolicyFormat)));
  }
  CASTOR_ASSIGN_OR_RETURN(const std::string* name, string_field("name"));
  if (name == nullptr || name->empty()) {
    return FieldError(source, "name", "a policy needs a non-empty name");
  }
  CASTOR_ASSIGN_OR_RETURN(const std::string* compute_text, string_field("compute_dtype"));
  std::optional<DType> compute_dtype;
  if (compute_text != nullptr) {
    absl::StatusOr<DType> parsed = ParseComputeDType(*compute_text);
    if (!parsed.ok()) return FieldError(source, "compute_dtype", parsed.status());
    compute_dtype = *parsed;
  }

  // The starting point: the built-in policy of that name, or mixed_float16's
  // lists with the given compute dtype.
  const std::vector<std::string> builtin_names = BuiltinNames();
  const bool is_builtin =
      std::find(builtin_names.begin(), builtin_names.end(), *name) != builtin_names.end();
  Policy policy;
  if (is_builtin) {
    CASTOR_ASSIGN_OR_RETURN(policy, Builtin(*name));
    if (compute_dtype.has_value() && *compute_dtype != policy.compute_dtype_) {
      return FieldError(
          source, "compute_dtype",
          absl::StrCat("is ", Quoted(*compute_text), " but the built-in policy ", Quoted(*name),
                       " computes in ", DTypeName(policy.compute_dtype_),
                       "; give a custom policy another name"));
    }
  } else {
    if (!compute_dtype.has_value()) {
      return FieldError(source, "compute_dtype",
                        absl::StrCat("required for the custom policy ", Quoted(*name),
                                     " (built-in policies: ",
                                     absl::StrJoin(builtin_names, ", "), ")"));
    }
    CASTOR_ASSIGN_OR_RETURN(policy, Builtin("mixed_float16"));
    policy.name_ = *name;
    policy.compute_dtype_ = *compute_dtype;
  }

  CASTOR_ASSIGN_OR_RETURN(const std::string* variable_dtype, string_field("variable_dtype"));
  if (variable_dtype != nullptr && *variable_dtype != "float32") {
    return FieldError(source, "variable_dtype",
                      absl::StrCat("is ", Quoted(*variable_dtype),
                                   "; master weights are always \"float32\""));
  }

  if (const Json* keep = json.Find("keep_io_types"); keep != nullptr) {
    if (!keep->is_bool()) {
      return FieldError(source, "keep_io_types",
                        absl::StrCat("expected true or false, got ", JsonTypeName(*keep)));
    }
    policy.keep_io_types_ = keep->as_bool();
  }
  return policy;
}

absl::Status Policy::ReadOpListsJson(const Json& lists, const std::string& source) {
  if (!lists.is_object()) {
    return FieldError(source, "op_lists",
                      absl::StrCat("expected an object, got ", JsonTypeName(lists)));
  }
  std::map<std::string, std::string> list_of_op;  // op -> the list naming it
  for (const auto& [list_name, ops] : lists.members()) {
    const std::string field = absl::StrCat("op_lists.", list_name);
    AutocastCategory category = AutocastCategory::kUnset;
    for (AutocastCategory candidate : kListCategories) {
      if (list_name == AutocastCategoryName(candidate)) category = candidate;
    }
    if (category == AutocastCategory::kUnset) {
      return FieldError(source, "op_lists",
                        absl::StrCat("unknown list ", Quoted(list_name),
                                     "; expected allow, deny, follow or none"));
    }
    if (!ops.is_array()) {
      return FieldError(source, field,
                        absl::StrCat("expected an array of op names, got ", JsonTypeName(ops)));
    }
    for (const Json& op : ops.items()) {
      if (!op.is_string()) {
        return FieldError(source, field,
                          absl::StrCat("expected op names, got ", JsonTypeName(op)));
      }
      std::string key = CanonicalOpListKey(op.as_string());
      auto list_it = op_lists_.find(key);
      if (list_it == op_lists_.end()) {
        return FieldError(source, field,
                          absl::StrCat("unknown op ", Quoted(op.as_string()), "; ",
                                       KnownOpsHint(op_lists_, op.as_string())));
      }
      auto [seen, inserted] = list_of_op.emplace(key, list_name);
      if (!inserted && seen->second != list_name) {
        return FieldError(source, "op_lists",
                          absl::StrCat("op ", Quoted(key), " is in both the ",
                                       Quoted(seen->second), " and the ", Quoted(list_name),
                                       " lists; the lists must not overlap"));
      }
      list_it->second = category;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Policy> Policy::FromJson(const Json& json, const std::string& source) {
  CASTOR_ASSIGN_OR_RETURN(Policy policy, StartFromJson(json, source));
  if (const Json* lists = json.Find("op_lists"); lists != nullptr) {
    CASTOR_RETURN_IF_ERROR(policy.ReadOpListsJson(*lists, source));
  }
  if (const Json* overrides = json.Find("op_overrides"); overrides != nullptr) {
    CASTOR_RETURN_IF_ERROR(ReadOpOverridesJson(*overrides, source, policy));
  }
  if (const Json* nodes = json.Find("node_overrides"); nodes != nullptr) {
    CASTOR_RETURN_IF_ERROR(ReadNodeOverridesJson(*nodes, source, policy));
  }
  if (const Json* pins = json.Find("pins"); pins != nullptr) {
    CASTOR_RETURN_IF_ERROR(ReadPinsJson(*pins, source, policy));
  }
  return policy;
}

absl::StatusOr<Policy> Policy::LoadFile(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(Json json, ParseJsonFile(path));
  return FromJson(json, path);
}

absl::Status Policy::SaveFile(const std::string& path) const {
  return WriteFileAtomically(path, ToJson().Dump(2) + "\n");
}

std::string Policy::Digest() const {
  return absl::StrCat("sha256:", Sha256Hex(ToJson().Dump(-1)));
}

}  // namespace castor
