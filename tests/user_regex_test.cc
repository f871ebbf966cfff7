// CompileUserRegex (graph/user_regex.h): what it accepts compiles and
// matches as std::regex's ECMAScript does; hostile patterns (a repetition
// count libstdc++ would overflow on, an overlong pattern) are refused with
// a reason before std::regex sees them; std::regex's own errors pass
// through. Also through a policy's node regex and --freeze, which use it.
#include "graph/user_regex.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "graph/json.h"
#include "passes/policy.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

std::string Error(const std::string& pattern) {
  absl::StatusOr<std::regex> regex = CompileUserRegex(pattern);
  EXPECT_FALSE(regex.ok()) << pattern;
  if (regex.ok()) return "";
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(regex.status().message());
}

TEST(UserRegex, CompilesAndMatchesOrdinaryPatterns) {
  absl::StatusOr<std::regex> head = CompileUserRegex("^fc\\.");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_TRUE(std::regex_search("fc.weight", *head));
  EXPECT_FALSE(std::regex_search("conv.fc.weight", *head));
  absl::StatusOr<std::regex> repeat = CompileUserRegex("^layer[0-9]{1,3}/a{2,}b{10000}$");
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_TRUE(std::regex_search("layer12/aa" + std::string(10000, 'b'), *repeat));
  // Braces inside brackets and escaped braces are literals, not counts.
  absl::StatusOr<std::regex> literal = CompileUserRegex("[{123456789}]x\\{123456789\\}");
  ASSERT_TRUE(literal.ok()) << literal.status();
  EXPECT_TRUE(std::regex_search("9x{123456789}", *literal));
  ASSERT_TRUE(CompileUserRegex("").ok());  // matches everything, as --filter's default
}

TEST(UserRegex, RefusesRepetitionCountsAboveTheLimit) {
  // 20 digits: libstdc++ overflows a long parsing it (undefined behaviour).
  EXPECT_THAT(Error("a{19999999999999999999}"),
              HasSubstr("repetition count 199999999999... is larger than the 10000"));
  EXPECT_THAT(Error("a{10001}"), HasSubstr("repetition count 10001"));
  EXPECT_THAT(Error("a{2,123456}"), HasSubstr("repetition count 123456"));
  EXPECT_THAT(Error("(x|y){3}z{99999999}"), HasSubstr("repetition count 99999999"));
  // A 28-digit backreference overflows the same way (fuzz_policy_json's
  // second finding); a short one is std::regex's to judge.
  EXPECT_THAT(Error("(a)\\0000000000000000001325898456"),
              HasSubstr("the escape \\000000000000... has more than 9 digits"));
  EXPECT_TRUE(CompileUserRegex("(a)\\1").ok());
}

TEST(UserRegex, RefusesOverlongPatternsAndPassesStdRegexErrorsOn) {
  EXPECT_THAT(Error(std::string(kMaxUserRegexLength + 1, 'a')),
              HasSubstr("has 1001 characters, more than the 1000"));
  EXPECT_FALSE(Error("(unclosed").empty());
  EXPECT_FALSE(Error("a{x}").empty());
}

// fuzz_policy_json's finding (corpus/policy_json/
// regression-node_regex_repeat_overflows_long.json): a policy's node regex
// with a 20-digit repetition count is refused, naming the regex.
TEST(UserRegex, PolicyNodeRegexWithAHugeRepeatIsRefused) {
  absl::StatusOr<Json> json = Json::Parse(R"({
    "format": "castor.policy/1", "name": "custom", "compute_dtype": "bfloat16",
    "node_overrides": [{"regex": "enc{19999999999999999999}", "category": "fp32"}]})");
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<Policy> policy = Policy::FromJson(*json, "custom.json");
  ASSERT_FALSE(policy.ok());
  EXPECT_THAT(policy.status().message(),
              AllOf(HasSubstr("invalid node regex"), HasSubstr("repetition count")));
}

}  // namespace
}  // namespace castor
