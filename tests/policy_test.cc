// Tests for passes/policy.h: the built-in policies, op/node overrides and
// their overlap errors, the per-node category decision with its reason, the
// JSON form (strict loading, round trips, digests) and policy files.
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/graph.h"
#include "graph/json.h"
#include "graph/op_registry.h"
#include "gtest/gtest.h"
#include "passes/policy.h"

namespace castor {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

Policy MixedFloat16() { return ValueOrDie(Policy::Builtin("mixed_float16")); }

NodeOverride ByName(const std::string& name, AutocastCategory category) {
  NodeOverride rule;
  rule.name = name;
  rule.category = category;
  return rule;
}

NodeOverride ByRegex(const std::string& regex, AutocastCategory category) {
  NodeOverride rule;
  rule.regex = regex;
  rule.category = category;
  return rule;
}

Json ParseOrDie(const std::string& text) { return ValueOrDie(Json::Parse(text)); }

// The error message of a failed FromJson of `text` ("" if it loads).
std::string LoadError(const std::string& text) {
  absl::StatusOr<Policy> policy = Policy::FromJson(ParseOrDie(text), "test.json");
  if (policy.ok()) return "";
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(policy.status().message());
}

// A small model whose nodes the tests ask CategoryOf about.
class PolicyNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.opset_imports = {{"", 17}};
    x_ = ValueOrDie(graph().AddInput("x", DType::kFloat32, Shape({2, 4})));
  }

  Graph& graph() { return *model_.graph; }

  const Node& AddNode(const std::string& op_type, const std::string& node_name,
                      const std::string& domain = "") {
    return *ValueOrDie(graph().AddNode(op_type, {x_}, {""}, node_name, domain));
  }

  Model model_;
  Value* x_ = nullptr;
};

TEST(PolicyTest, OpListKeys) {
  EXPECT_EQ(OpListKey("", "Conv"), "Conv");
  EXPECT_EQ(OpListKey("ai.onnx", "Conv"), "Conv");
  EXPECT_EQ(OpListKey(kTrainingDomain, "Adam"), "ai.onnx.preview.training:Adam");
}

TEST(PolicyTest, ParseCategories) {
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("allow")), AutocastCategory::kAllow);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("lowp")), AutocastCategory::kAllow);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("compute")), AutocastCategory::kAllow);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("deny")), AutocastCategory::kDeny);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("fp32")), AutocastCategory::kDeny);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("float32")), AutocastCategory::kDeny);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("follow")), AutocastCategory::kFollow);
  EXPECT_EQ(ValueOrDie(ParseAutocastCategory("none")), AutocastCategory::kNone);
  absl::StatusOr<AutocastCategory> bad = ParseAutocastCategory("half");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"half\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("allow, deny, follow or none"));
}

TEST(PolicyTest, BuiltinDTypesAndCategories) {
  EXPECT_EQ(Policy::BuiltinNames(),
            (std::vector<std::string>{"float32", "mixed_float16", "mixed_bfloat16"}));
  Policy f32 = ValueOrDie(Policy::Builtin("float32"));
  Policy f16 = ValueOrDie(Policy::Builtin("mixed_float16"));
  Policy bf16 = ValueOrDie(Policy::Builtin("mixed_bfloat16"));
  EXPECT_EQ(f32.compute_dtype(), DType::kFloat32);
  EXPECT_EQ(f16.compute_dtype(), DType::kFloat16);
  EXPECT_EQ(bf16.compute_dtype(), DType::kBFloat16);
  EXPECT_FALSE(f32.is_mixed());
  EXPECT_TRUE(f16.is_mixed());
  EXPECT_TRUE(bf16.is_mixed());
  for (const Policy* policy : {&f32, &f16, &bf16}) {
    EXPECT_EQ(policy->variable_dtype(), DType::kFloat32);
    EXPECT_TRUE(policy->keep_io_types());
    EXPECT_EQ(policy->op_lists().size(), OpRegistry::Global().All().size());
    EXPECT_EQ(policy->OpCategory("", "Conv"), AutocastCategory::kAllow);
    EXPECT_EQ(policy->OpCategory("", "Softmax"), AutocastCategory::kDeny);
    EXPECT_EQ(policy->OpCategory("", "Relu"), AutocastCategory::kFollow);
    EXPECT_EQ(policy->OpCategory("", "Shape"), AutocastCategory::kNone);
    EXPECT_EQ(policy->OpCategory(kTrainingDomain, "Adam"), AutocastCategory::kDeny);
    EXPECT_EQ(policy->OpCategory("", "NoSuchOp"), AutocastCategory::kUnset);
    EXPECT_TRUE(policy->op_overrides().empty());
  }
  EXPECT_EQ(f16.op_lists().at("ai.onnx.preview.training:Adam"), AutocastCategory::kDeny);

  absl::StatusOr<Policy> unknown = Policy::Builtin("mixed_fp8");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("\"mixed_fp8\"; valid names: float32, mixed_float16, mixed_bfloat16"));
}

TEST(PolicyTest, DigestsAreStableAndDistinct) {
  Policy f32 = ValueOrDie(Policy::Builtin("float32"));
  Policy f16 = MixedFloat16();
  Policy bf16 = ValueOrDie(Policy::Builtin("mixed_bfloat16"));
  std::string digest = f16.Digest();
  EXPECT_EQ(digest.size(), 71u);
  EXPECT_THAT(digest, StartsWith("sha256:"));
  EXPECT_EQ(digest.find_first_not_of("0123456789abcdef", 7), std::string::npos);
  EXPECT_EQ(f16.Digest(), digest);
  EXPECT_EQ(MixedFloat16().Digest(), digest);
  EXPECT_NE(f32.Digest(), digest);
  EXPECT_NE(bf16.Digest(), digest);
  EXPECT_NE(f32.Digest(), bf16.Digest());

  Policy changed = MixedFloat16();
  ASSERT_TRUE(changed.OverrideOp("Softmax", AutocastCategory::kAllow).ok());
  EXPECT_NE(changed.Digest(), digest);
  Policy io = MixedFloat16();
  io.set_keep_io_types(false);
  EXPECT_NE(io.Digest(), digest);
}

TEST(PolicyTest, ToJsonForm) {
  Policy policy = MixedFloat16();
  ASSERT_TRUE(policy.OverrideOp("Softmax", AutocastCategory::kAllow).ok());
  ASSERT_TRUE(policy.OverrideNode(ByName("fc2", AutocastCategory::kDeny)).ok());
  ASSERT_TRUE(policy.OverrideNode(ByRegex("enc.*", AutocastCategory::kFollow)).ok());
  ASSERT_TRUE(policy.PinInput("Conv", 2).ok());
  ASSERT_TRUE(policy.PinInput("Conv", 1).ok());
  ASSERT_TRUE(policy.PinInput("Conv", 1).ok());  // duplicate: ignored

  Json json = policy.ToJson();
  std::vector<std::string> keys;
  for (const auto& [key, value] : json.members()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"format", "name", "compute_dtype", "variable_dtype",
                                            "keep_io_types", "op_lists", "op_overrides",
                                            "node_overrides", "pins"}));
  EXPECT_EQ(json.Find("format")->as_string(), "castor.policy/1");
  EXPECT_EQ(json.Find("name")->as_string(), "mixed_float16");
  EXPECT_EQ(json.Find("compute_dtype")->as_string(), "float16");
  EXPECT_EQ(json.Find("variable_dtype")->as_string(), "float32");
  EXPECT_TRUE(json.Find("keep_io_types")->as_bool());

  const Json& lists = *json.Find("op_lists");
  std::vector<std::string> list_names;
  size_t listed = 0;
  for (const auto& [list, ops] : lists.members()) {
    list_names.push_back(list);
    listed += ops.size();
    for (size_t i = 1; i < ops.size(); ++i) {
      EXPECT_LT(ops.items()[i - 1].as_string(), ops.items()[i].as_string()) << list;
    }
  }
  EXPECT_EQ(list_names, (std::vector<std::string>{"allow", "deny", "follow", "none"}));
  EXPECT_EQ(listed, OpRegistry::Global().All().size());
  auto in_list = [&](const std::string& list, const std::string& op) {
    for (const Json& item : lists.Find(list)->items()) {
      if (item.as_string() == op) return true;
    }
    return false;
  };
  EXPECT_TRUE(in_list("allow", "Softmax"));  // the override is applied to the lists
  EXPECT_FALSE(in_list("deny", "Softmax"));
  EXPECT_TRUE(in_list("allow", "Conv"));
  EXPECT_TRUE(in_list("none", "Shape"));
  EXPECT_TRUE(in_list("deny", "ai.onnx.preview.training:Adam"));

  EXPECT_EQ(json.Find("op_overrides")->Dump(), R"({"Softmax":"allow"})");
  EXPECT_EQ(json.Find("node_overrides")->Dump(),
            R"([{"name":"fc2","category":"deny"},{"regex":"enc.*","category":"follow"}])");
  EXPECT_EQ(json.Find("pins")->Dump(), R"([{"op":"Conv","input":1},{"op":"Conv","input":2}])");
}

TEST(PolicyTest, JsonRoundTripKeepsDigest) {
  for (const std::string& name : Policy::BuiltinNames()) {
    Policy builtin = ValueOrDie(Policy::Builtin(name));
    Policy loaded = ValueOrDie(Policy::FromJson(builtin.ToJson(), "round trip"));
    EXPECT_EQ(loaded.Digest(), builtin.Digest()) << name;
  }

  Policy policy = ValueOrDie(Policy::Builtin("mixed_bfloat16"));
  policy.set_keep_io_types(false);
  ASSERT_TRUE(policy.OverrideOp("Softmax", AutocastCategory::kAllow).ok());
  ASSERT_TRUE(policy.OverrideOp("Conv", AutocastCategory::kDeny).ok());
  ASSERT_TRUE(policy.OverrideNode(ByRegex("enc.*", AutocastCategory::kDeny)).ok());
  ASSERT_TRUE(policy.OverrideNode(ByName("fc2", AutocastCategory::kAllow)).ok());
  ASSERT_TRUE(policy.PinInput("Conv", 1).ok());
  Policy loaded = ValueOrDie(Policy::FromJson(policy.ToJson(), "round trip"));
  EXPECT_EQ(loaded.Digest(), policy.Digest());
  EXPECT_EQ(loaded.ToJson(), policy.ToJson());
  EXPECT_EQ(loaded.name(), "mixed_bfloat16");
  EXPECT_EQ(loaded.compute_dtype(), DType::kBFloat16);
  EXPECT_FALSE(loaded.keep_io_types());
  EXPECT_EQ(loaded.OpCategory("", "Conv"), AutocastCategory::kDeny);
  ASSERT_EQ(loaded.node_overrides().size(), 2u);
  EXPECT_EQ(loaded.node_overrides()[0].regex, "enc.*");
  EXPECT_EQ(loaded.node_overrides()[1].name, "fc2");
  ASSERT_EQ(loaded.pins().size(), 1u);
  EXPECT_EQ(loaded.pins()[0].op, "Conv");
  EXPECT_EQ(loaded.pins()[0].input, 1);
  EXPECT_NE(loaded.Digest(), ValueOrDie(Policy::Builtin("mixed_bfloat16")).Digest());
}

TEST(PolicyTest, SaveAndLoadFile) {
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "castor_policy_test";
  std::filesystem::create_directories(dir);
  std::string path = (dir / "policy.json").string();

  Policy policy = MixedFloat16();
  ASSERT_TRUE(policy.OverrideOp("ReduceMean", AutocastCategory::kFollow).ok());
  ASSERT_TRUE(policy.OverrideNode(ByName("head", AutocastCategory::kDeny)).ok());
  ASSERT_TRUE(policy.SaveFile(path).ok());

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), StartsWith("{\n  \"format\": \"castor.policy/1\",\n"));
  EXPECT_EQ(text.str().back(), '\n');

  Policy loaded = ValueOrDie(Policy::LoadFile(path));
  EXPECT_EQ(loaded.Digest(), policy.Digest());
  EXPECT_EQ(loaded.OpCategory("", "ReduceMean"), AutocastCategory::kFollow);

  absl::StatusOr<Policy> missing = Policy::LoadFile((dir / "missing.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.json"));
  std::filesystem::remove_all(dir);
}

TEST(PolicyTest, LoadFileErrorsNameTheFile) {
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "castor_policy_bad";
  std::filesystem::create_directories(dir);
  std::string path = (dir / "bad.json").string();
  std::ofstream(path) << R"({"name": "mixed_float16", "pins": [{"op": "Conv", "input": 7}]})";
  absl::StatusOr<Policy> policy = Policy::LoadFile(path);
  ASSERT_FALSE(policy.ok());
  EXPECT_THAT(std::string(policy.status().message()), StartsWith(path + ": pins[0]: "));
  EXPECT_THAT(policy.status().message(), HasSubstr("out of range"));
  std::filesystem::remove_all(dir);
}

TEST(PolicyTest, OpOverrideOverlapIsAnError) {
  Policy policy = MixedFloat16();
  ASSERT_TRUE(policy.OverrideOp("Conv", AutocastCategory::kDeny).ok());
  ASSERT_TRUE(policy.OverrideOp("Conv", AutocastCategory::kDeny).ok());  // idempotent
  absl::Status status = policy.OverrideOp("Conv", AutocastCategory::kAllow);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"Conv\" is overridden both as deny and as allow"));
  EXPECT_THAT(status.message(), HasSubstr("must not overlap"));
  EXPECT_EQ(policy.OpCategory("", "Conv"), AutocastCategory::kDeny);
  EXPECT_EQ(policy.op_overrides().size(), 1u);
}

TEST(PolicyTest, UnknownOpOverride) {
  Policy policy = MixedFloat16();
  absl::Status status = policy.OverrideOp("Foo", AutocastCategory::kDeny);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("unknown op \"Foo\" in op override; known ops include"));
  status = policy.OverrideOp("softmax", AutocastCategory::kDeny);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("did you mean Softmax?"));
  EXPECT_TRUE(policy.op_overrides().empty());
}

TEST(PolicyTest, NodeOverrideRules) {
  Policy policy = MixedFloat16();
  ASSERT_TRUE(policy.OverrideNode(ByName("fc2", AutocastCategory::kDeny)).ok());
  ASSERT_TRUE(policy.OverrideNode(ByName("fc2", AutocastCategory::kDeny)).ok());
  EXPECT_EQ(policy.node_overrides().size(), 1u);

  absl::Status status =
      policy.OverrideNode(ByName("fc2", AutocastCategory::kAllow));
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("node \"fc2\" is overridden both as deny and as allow"));

  status = policy.OverrideNode(NodeOverride{"a", "b", AutocastCategory::kDeny});
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("exactly one of a node name and a regex"));
  status = policy.OverrideNode(NodeOverride{"", "", AutocastCategory::kDeny});
  ASSERT_FALSE(status.ok());

  status = policy.OverrideNode(ByRegex("enc(", AutocastCategory::kDeny));
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("invalid node regex \"enc(\": "));
  EXPECT_GT(status.message().size(), std::string("invalid node regex \"enc(\": ").size());
  EXPECT_EQ(policy.node_overrides().size(), 1u);
}

TEST(PolicyTest, PinInputChecksRange) {
  const OpDef* conv = OpRegistry::Global().Find("", "Conv");
  ASSERT_NE(conv, nullptr);
  ASSERT_EQ(conv->max_inputs, 3);
  Policy policy = MixedFloat16();
  EXPECT_TRUE(policy.PinInput("Conv", 2).ok());
  absl::Status status = policy.PinInput("Conv", 3);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("Conv input 3 is out of range"));
  EXPECT_THAT(status.message(), HasSubstr("at most 3 inputs"));
  EXPECT_FALSE(policy.PinInput("Conv", -1).ok());
  status = policy.PinInput("Foo", 0);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("unknown op \"Foo\""));
  EXPECT_EQ(policy.pins().size(), 1u);
}

TEST_F(PolicyNodeTest, PrecedenceAndReasons) {
  const Node& softmax = AddNode("Softmax", "attn/softmax");
  const Node& conv = AddNode("Conv", "conv1");
  Policy policy = MixedFloat16();

  CategoryReason reason = ValueOrDie(policy.CategoryOf(softmax));
  EXPECT_EQ(reason.category, AutocastCategory::kDeny);
  EXPECT_EQ(reason.rule, "op list");
  EXPECT_EQ(reason.entry, "deny list: Softmax (" +
                              OpRegistry::Global().Find("", "Softmax")->autocast_source + ")");
  EXPECT_THAT(reason.entry, HasSubstr("PyTorch softmax"));

  ASSERT_TRUE(policy.OverrideOp("Softmax", AutocastCategory::kAllow).ok());
  reason = ValueOrDie(policy.CategoryOf(softmax));
  EXPECT_EQ(reason.category, AutocastCategory::kAllow);
  EXPECT_EQ(reason.rule, "op override");
  EXPECT_EQ(reason.entry, "op_overrides Softmax -> allow");

  ASSERT_TRUE(
      policy.OverrideNode(ByRegex("attn/.*", AutocastCategory::kFollow)).ok());
  reason = ValueOrDie(policy.CategoryOf(softmax));
  EXPECT_EQ(reason.category, AutocastCategory::kFollow);
  EXPECT_EQ(reason.rule, "node override");
  EXPECT_EQ(reason.entry, "node regex \"attn/.*\" -> follow");

  // Conv is untouched by the overrides.
  reason = ValueOrDie(policy.CategoryOf(conv));
  EXPECT_EQ(reason.category, AutocastCategory::kAllow);
  EXPECT_EQ(reason.rule, "op list");
  EXPECT_THAT(reason.entry, StartsWith("allow list: Conv ("));

  ASSERT_TRUE(policy.OverrideNode(ByName("conv1", AutocastCategory::kDeny)).ok());
  reason = ValueOrDie(policy.CategoryOf(conv));
  EXPECT_EQ(reason.category, AutocastCategory::kDeny);
  EXPECT_EQ(reason.entry, "node \"conv1\" -> deny");
}

TEST_F(PolicyNodeTest, RegexMustMatchTheWholeName) {
  const Node& fc = AddNode("Gemm", "fc");
  const Node& fc2 = AddNode("Gemm", "fc2");
  const Node& head_fc = AddNode("Gemm", "head_fc");
  Policy policy = MixedFloat16();
  ASSERT_TRUE(policy.OverrideNode(ByRegex("fc", AutocastCategory::kDeny)).ok());
  EXPECT_EQ(ValueOrDie(policy.CategoryOf(fc)).category, AutocastCategory::kDeny);
  EXPECT_EQ(ValueOrDie(policy.CategoryOf(fc2)).category, AutocastCategory::kAllow);
  EXPECT_EQ(ValueOrDie(policy.CategoryOf(fc2)).rule, "op list");
  EXPECT_EQ(ValueOrDie(policy.CategoryOf(head_fc)).category, AutocastCategory::kAllow);
}

TEST_F(PolicyNodeTest, ConflictingNodeOverridesAreAnError) {
  const Node& node = AddNode("MatMul", "enc/attn/q");
  const Node& other = AddNode("MatMul", "dec/q");
  Policy policy = MixedFloat16();
  ASSERT_TRUE(policy.OverrideNode(ByRegex("enc/.*", AutocastCategory::kDeny)).ok());
  ASSERT_TRUE(policy.OverrideNode(ByRegex(".*/q", AutocastCategory::kAllow)).ok());
  absl::StatusOr<CategoryReason> reason = policy.CategoryOf(node);
  ASSERT_FALSE(reason.ok());
  EXPECT_THAT(reason.status().message(), HasSubstr("node \"enc/attn/q\""));
  EXPECT_THAT(reason.status().message(), HasSubstr("node regex \"enc/.*\" -> deny"));
  EXPECT_THAT(reason.status().message(), HasSubstr("node regex \".*/q\" -> allow"));
  // Only one rule matches the other node.
  EXPECT_EQ(ValueOrDie(policy.CategoryOf(other)).entry, "node regex \".*/q\" -> allow");

  // Agreeing matches are fine: the first one is the reason.
  Policy agreeing = MixedFloat16();
  ASSERT_TRUE(agreeing.OverrideNode(ByRegex("enc/.*", AutocastCategory::kDeny)).ok());
  ASSERT_TRUE(agreeing.OverrideNode(ByName("enc/attn/q", AutocastCategory::kDeny)).ok());
  CategoryReason agreed = ValueOrDie(agreeing.CategoryOf(node));
  EXPECT_EQ(agreed.category, AutocastCategory::kDeny);
  EXPECT_EQ(agreed.entry, "node regex \"enc/.*\" -> deny");
}

TEST_F(PolicyNodeTest, UnknownOpsAndOtherDomains) {
  const Node& unknown = AddNode("FancyOp", "f");
  const Node& adam = AddNode("Adam", "opt", kTrainingDomain);
  Policy policy = MixedFloat16();
  CategoryReason reason = ValueOrDie(policy.CategoryOf(unknown));
  EXPECT_EQ(reason.category, AutocastCategory::kUnset);
  EXPECT_EQ(reason.rule, "unknown op");
  EXPECT_THAT(reason.entry, HasSubstr("FancyOp is not in the op registry"));

  reason = ValueOrDie(policy.CategoryOf(adam));
  EXPECT_EQ(reason.category, AutocastCategory::kDeny);
  EXPECT_THAT(reason.entry, StartsWith("deny list: ai.onnx.preview.training:Adam ("));
  ASSERT_TRUE(policy.OverrideOp("ai.onnx.preview.training:Adam", AutocastCategory::kFollow).ok());
  EXPECT_EQ(ValueOrDie(policy.CategoryOf(adam)).entry,
            "op_overrides ai.onnx.preview.training:Adam -> follow");
}

TEST_F(PolicyNodeTest, IsPinned) {
  const Node& conv = AddNode("Conv", "conv");
  const Node& gemm = AddNode("Gemm", "gemm");
  Policy policy = MixedFloat16();
  EXPECT_FALSE(policy.IsPinned(conv, 1));
  ASSERT_TRUE(policy.PinInput("Conv", 1).ok());
  EXPECT_TRUE(policy.IsPinned(conv, 1));
  EXPECT_FALSE(policy.IsPinned(conv, 0));
  EXPECT_FALSE(policy.IsPinned(gemm, 1));
}

TEST_F(PolicyNodeTest, OpListsFromJsonExplainTheirOrigin) {
  const Node& softmax = AddNode("Softmax", "s");
  Policy policy = ValueOrDie(Policy::FromJson(
      ParseOrDie(R"({"name": "mixed_float16", "op_lists": {"allow": ["Softmax"]}})"), "p.json"));
  CategoryReason reason = ValueOrDie(policy.CategoryOf(softmax));
  EXPECT_EQ(reason.category, AutocastCategory::kAllow);
  EXPECT_EQ(reason.rule, "op list");
  EXPECT_EQ(reason.entry, "allow list: Softmax (op_lists of policy \"mixed_float16\")");
  // Ops not listed keep the registry default.
  EXPECT_EQ(policy.OpCategory("", "Exp"), AutocastCategory::kDeny);
  EXPECT_EQ(policy.OpCategory("", "Conv"), AutocastCategory::kAllow);
}

TEST(PolicyJsonTest, MinimalBuiltinLoads) {
  Policy policy = ValueOrDie(Policy::FromJson(ParseOrDie(R"({"name": "mixed_bfloat16"})"), "x"));
  EXPECT_EQ(policy.Digest(), ValueOrDie(Policy::Builtin("mixed_bfloat16")).Digest());
  Policy with_dtype = ValueOrDie(Policy::FromJson(
      ParseOrDie(R"({"format": "castor.policy/1", "name": "mixed_float16",
                     "compute_dtype": "float16", "variable_dtype": "float32"})"),
      "x"));
  EXPECT_EQ(with_dtype.Digest(), MixedFloat16().Digest());
}

TEST(PolicyJsonTest, CustomNamedPolicy) {
  Policy policy = ValueOrDie(Policy::FromJson(
      ParseOrDie(R"({"name": "my_bf16", "compute_dtype": "bfloat16",
                     "op_overrides": {"Softmax": "lowp"},
                     "node_overrides": [{"regex": "head.*", "category": "fp32"}],
                     "pins": [{"op": "Conv", "input": 2}]})"),
      "custom.json"));
  EXPECT_EQ(policy.name(), "my_bf16");
  EXPECT_EQ(policy.compute_dtype(), DType::kBFloat16);
  EXPECT_TRUE(policy.is_mixed());
  EXPECT_EQ(policy.OpCategory("", "Softmax"), AutocastCategory::kAllow);
  EXPECT_EQ(policy.OpCategory("", "Conv"), AutocastCategory::kAllow);
  ASSERT_EQ(policy.node_overrides().size(), 1u);
  EXPECT_EQ(policy.node_overrides()[0].category, AutocastCategory::kDeny);
  EXPECT_EQ(policy.ToJson().Find("name")->as_string(), "my_bf16");
  EXPECT_EQ(policy.ToJson().Find("compute_dtype")->as_string(), "bfloat16");
  EXPECT_NE(policy.Digest(), ValueOrDie(Policy::Builtin("mixed_bfloat16")).Digest());
  Policy again = ValueOrDie(Policy::FromJson(policy.ToJson(), "again"));
  EXPECT_EQ(again.Digest(), policy.Digest());

  EXPECT_THAT(LoadError(R"({"name": "my_policy"})"),
              HasSubstr("test.json: compute_dtype: required for the custom policy \"my_policy\""));
}

TEST(PolicyJsonTest, StrictErrors) {
  EXPECT_EQ(LoadError(R"([1])"), "test.json: a policy must be a JSON object, not an array");
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "fp32_ops": []})"),
              StartsWith("test.json: unknown field \"fp32_ops\" (known fields: format, name,"));
  EXPECT_THAT(LoadError(R"({"format": "castor.policy/2", "name": "mixed_float16"})"),
              StartsWith("test.json: format: is \"castor.policy/2\"; expected \"castor.policy/1\""));
  EXPECT_THAT(LoadError(R"({"format": "castor.policy/1"})"),
              StartsWith("test.json: name: a policy needs a non-empty name"));
  EXPECT_THAT(LoadError(R"({"name": ""})"), StartsWith("test.json: name: "));
  EXPECT_THAT(LoadError(R"({"name": 3})"),
              StartsWith("test.json: name: expected a string, got a number"));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "compute_dtype": "bfloat16"})"),
              StartsWith("test.json: compute_dtype: is \"bfloat16\" but the built-in policy "
                         "\"mixed_float16\" computes in float16"));
  EXPECT_THAT(LoadError(R"({"name": "custom", "compute_dtype": "int8"})"),
              StartsWith("test.json: compute_dtype: compute dtype \"int8\" is not one of"));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "variable_dtype": "float16"})"),
              StartsWith("test.json: variable_dtype: is \"float16\""));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "keep_io_types": "yes"})"),
              StartsWith("test.json: keep_io_types: expected true or false"));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "op_lists": {"allow": ["Foo"]}})"),
              StartsWith("test.json: op_lists.allow: unknown op \"Foo\""));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "op_lists": {"fp16": []}})"),
              StartsWith("test.json: op_lists: unknown list \"fp16\""));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "op_overrides": {"Softmax": "half"}})"),
              StartsWith("test.json: op_overrides.Softmax: unknown autocast category \"half\""));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "op_overrides": {"Foo": "deny"}})"),
              StartsWith("test.json: op_overrides: unknown op \"Foo\" in op override"));
  EXPECT_THAT(
      LoadError(R"({"name": "mixed_float16", "node_overrides": [{"regex": "a(", "category": "deny"}]})"),
      StartsWith("test.json: node_overrides[0]: invalid node regex \"a(\": "));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "node_overrides": [{"name": "a"}]})"),
              StartsWith("test.json: node_overrides[0]: missing \"category\""));
  EXPECT_THAT(
      LoadError(R"({"name": "mixed_float16", "node_overrides": [{"node": "a", "category": "deny"}]})"),
      StartsWith("test.json: node_overrides[0]: unknown field \"node\""));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "pins": [{"op": "Conv", "input": 3}]})"),
              StartsWith("test.json: pins[0]: input pin Conv input 3 is out of range"));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "pins": [{"op": "Conv"}]})"),
              StartsWith("test.json: pins[0]: needs \"input\""));
}

TEST(PolicyJsonTest, OverlapErrors) {
  EXPECT_EQ(LoadError(R"({"name": "mixed_float16",
                          "op_lists": {"allow": ["Conv"], "deny": ["Exp", "Conv"]}})"),
            "test.json: op_lists: op \"Conv\" is in both the \"allow\" and the \"deny\" lists; "
            "the lists must not overlap");
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16", "node_overrides": [
                             {"name": "fc2", "category": "deny"},
                             {"name": "fc2", "category": "allow"}]})"),
              StartsWith("test.json: node_overrides[1]: node \"fc2\" is overridden both as deny "
                         "and as allow"));
  EXPECT_THAT(LoadError(R"({"name": "mixed_float16",
                            "op_overrides": {"Conv": "deny", "ai.onnx:Conv": "allow"}})"),
              HasSubstr("\"Conv\" is overridden both as deny and as allow"));
  // The same op twice in one list, or the same node override twice, is fine.
  EXPECT_EQ(LoadError(R"({"name": "mixed_float16", "op_lists": {"deny": ["Exp", "Exp"]},
                          "node_overrides": [{"name": "a", "category": "deny"},
                                             {"name": "a", "category": "fp32"}]})"),
            "");
}

}  // namespace
}  // namespace castor
