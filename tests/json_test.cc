// Json: parsing (strict RFC 8259, errors with line/column), writing (escapes,
// shortest round-trip numbers, pretty printing) and object Find/Set.
#include "graph/json.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

Json ParseOrDie(const std::string& text) {
  absl::StatusOr<Json> parsed = Json::Parse(text);
  EXPECT_TRUE(parsed.ok()) << text << " -> " << parsed.status();
  return parsed.ok() ? *parsed : Json();
}

std::string ParseError(const std::string& text) {
  absl::StatusOr<Json> parsed = Json::Parse(text);
  EXPECT_FALSE(parsed.ok()) << "parsed unexpectedly: " << text;
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(JsonTest, ParsesAllValueKinds) {
  Json json = ParseOrDie(R"( {"n": null, "t": true, "f": false, "i": -12, "d": 2.5,
                               "s": "hi", "a": [1, [2], {}], "o": {"x": []}} )");
  ASSERT_TRUE(json.is_object());
  ASSERT_EQ(json.size(), 8u);
  EXPECT_TRUE(json.Find("n")->is_null());
  EXPECT_TRUE(json.Find("t")->is_bool());
  EXPECT_TRUE(json.Find("t")->as_bool());
  EXPECT_FALSE(json.Find("f")->as_bool());
  EXPECT_TRUE(json.Find("i")->is_int());
  EXPECT_EQ(json.Find("i")->as_int(), -12);
  EXPECT_FALSE(json.Find("d")->is_int());
  EXPECT_EQ(json.Find("d")->as_number(), 2.5);
  EXPECT_EQ(json.Find("s")->as_string(), "hi");
  const Json& array = *json.Find("a");
  ASSERT_EQ(array.items().size(), 3u);
  EXPECT_EQ(array.items()[1].items()[0].as_int(), 2);
  EXPECT_TRUE(array.items()[2].is_object());
  EXPECT_TRUE(json.Find("o")->Find("x")->is_array());
  EXPECT_EQ(json.Find("missing"), nullptr);
  EXPECT_EQ(json.Dump(), R"({"n":null,"t":true,"f":false,"i":-12,"d":2.5,"s":"hi",)"
                         R"("a":[1,[2],{}],"o":{"x":[]}})");
}

TEST(JsonTest, RoundTripsThroughDump) {
  const std::string texts[] = {
      "null", "true", "[]", "{}", "\"\"", "0", "-0", "1.5", "[1,2,3]",
      R"({"b":1,"a":[true,false,null],"c":{"d":"e\n\"f\""}})",
      R"(["caf\u00e9 \ud83d\ude00",1e+300,-2.5e-07,0.1])"};
  for (const std::string& text : texts) {
    Json first = ParseOrDie(text);
    Json second = ParseOrDie(first.Dump());
    EXPECT_EQ(first, second) << text;
    EXPECT_EQ(first.Dump(), second.Dump()) << text;
    Json pretty = ParseOrDie(first.Dump(2));
    EXPECT_EQ(first, pretty) << text;
  }
  // Dump of parsed compact text without escapes or numbers to reformat is the
  // same text.
  EXPECT_EQ(ParseOrDie(R"({"b":1,"a":[true,false,null]})").Dump(),
            R"({"b":1,"a":[true,false,null]})");
  // -0 keeps its sign.
  EXPECT_EQ(ParseOrDie("-0").Dump(), "-0");
  EXPECT_TRUE(std::signbit(ParseOrDie("-0").as_number()));
}

TEST(JsonTest, EscapesStrings) {
  EXPECT_EQ(Json::String("a\"b\\c/d").Dump(), R"("a\"b\\c/d")");
  EXPECT_EQ(Json::String("\b\f\n\r\t").Dump(), R"("\b\f\n\r\t")");
  EXPECT_EQ(Json::String(std::string("\x01\x1f\x7f", 3)).Dump(), "\"\\u0001\\u001f\x7f\"");
  EXPECT_EQ(Json::String(std::string("nul\0x", 5)).Dump(), R"("nul\u0000x")");
  // Non-ASCII UTF-8 is copied unchanged.
  EXPECT_EQ(Json::String("caf\xc3\xa9 \xf0\x9f\x98\x80").Dump(),
            "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
}

TEST(JsonTest, UnescapesStrings) {
  EXPECT_EQ(ParseOrDie(R"("\"\\\/\b\f\n\r\t")").as_string(), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(ParseOrDie(R"("\u0041\u00e9")").as_string(), "A\xc3\xa9");
  EXPECT_EQ(ParseOrDie(R"("\u20AC")").as_string(), "\xe2\x82\xac");
  EXPECT_EQ(ParseOrDie(R"("\ud83d\ude00")").as_string(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(ParseOrDie(R"("\u0000")").as_string(), std::string("\0", 1));
  // Raw UTF-8 passes through.
  EXPECT_EQ(ParseOrDie("\"\xf0\x9f\x98\x80\"").as_string(), "\xf0\x9f\x98\x80");
}

TEST(JsonTest, NumberForms) {
  EXPECT_EQ(ParseOrDie("0").as_int(), 0);
  EXPECT_EQ(ParseOrDie("-7").as_int(), -7);
  EXPECT_EQ(ParseOrDie("1e3").as_number(), 1000.0);
  EXPECT_FALSE(ParseOrDie("1e3").is_int());
  EXPECT_EQ(ParseOrDie("1E+2").as_number(), 100.0);
  EXPECT_EQ(ParseOrDie("-2.5e-3").as_number(), -0.0025);
  EXPECT_EQ(ParseOrDie("0.1").as_number(), 0.1);
  EXPECT_EQ(Json::Number(0.1).Dump(), "0.1");
  EXPECT_EQ(Json::Number(1.0 / 3.0).Dump(), "0.3333333333333333");
  EXPECT_EQ(ParseOrDie(Json::Number(1.0 / 3.0).Dump()).as_number(), 1.0 / 3.0);
  EXPECT_EQ(Json::Number(3.0).Dump(), "3");
  EXPECT_EQ(Json::Number(1e300).Dump(), "1e+300");
  EXPECT_EQ(Json::Number(-2.5e-7).Dump(), "-2.5e-07");
  EXPECT_EQ(Json::Number(5e-324).Dump(), "5e-324");
  EXPECT_EQ(ParseOrDie(Json::Number(5e-324).Dump()).as_number(), 5e-324);

  // int64 extremes stay exact (a double would round them).
  const int64_t max = std::numeric_limits<int64_t>::max();
  const int64_t min = std::numeric_limits<int64_t>::min();
  Json parsed_max = ParseOrDie("9223372036854775807");
  ASSERT_TRUE(parsed_max.is_int());
  EXPECT_EQ(parsed_max.as_int(), max);
  EXPECT_EQ(parsed_max.Dump(), "9223372036854775807");
  EXPECT_EQ(ParseOrDie("-9223372036854775808").as_int(), min);
  EXPECT_EQ(Json::Int(max).Dump(), "9223372036854775807");
  EXPECT_EQ(Json::Int(max - 1).Dump(), "9223372036854775806");
  // One past int64: a double, not an int.
  Json too_big = ParseOrDie("9223372036854775808");
  EXPECT_FALSE(too_big.is_int());
  EXPECT_EQ(too_big.as_number(), 9223372036854775808.0);
  EXPECT_EQ(too_big.as_int(), max);  // saturates
}

TEST(JsonTest, NonFiniteNumbersBecomeNull) {
  EXPECT_TRUE(Json::Number(std::numeric_limits<double>::quiet_NaN()).is_null());
  EXPECT_EQ(Json::Number(std::numeric_limits<double>::infinity()).Dump(), "null");
  EXPECT_EQ(Json::Number(-std::numeric_limits<double>::infinity()).Dump(), "null");
}

TEST(JsonTest, ErrorsNameLineAndColumn) {
  EXPECT_EQ(ParseError("[1, 2,]"),
            "line 1, column 7: expected a value after ',' (trailing commas are not allowed)");
  EXPECT_EQ(ParseError("{\n  \"a\": 1,\n}"),
            "line 3, column 1: expected a member name after ',' (trailing commas are not "
            "allowed)");
  EXPECT_EQ(ParseError("{\"a\": \"abc"),
            "line 1, column 7: unterminated string: expected a closing '\"' before end of "
            "input");
  EXPECT_THAT(ParseError("[\"a\\qb\"]"), HasSubstr("line 1, column 4: expected an escape"));
  EXPECT_EQ(ParseError("[0123]"), "line 1, column 2: expected a number without leading zeros");
  EXPECT_EQ(ParseError("-01"), "line 1, column 1: expected a number without leading zeros");
  EXPECT_EQ(ParseError("{} x"),
            "line 1, column 4: expected end of input after the JSON value, got 'x'");
  EXPECT_EQ(ParseError("[1]\n\n  ]"),
            "line 3, column 3: expected end of input after the JSON value, got ']'");
  EXPECT_EQ(ParseError(""),
            "line 1, column 1: expected a JSON value (object, array, string, number, true, "
            "false or null), got end of input");
}

TEST(JsonTest, DepthLimit) {
  const int limit = Json::kMaxDepth;
  std::string ok = std::string(limit, '[') + std::string(limit, ']');
  EXPECT_TRUE(Json::Parse(ok).ok());
  std::string too_deep = std::string(limit + 1, '[') + std::string(limit + 1, ']');
  EXPECT_EQ(ParseError(too_deep),
            "line 1, column 257: nesting deeper than 256 arrays/objects is not allowed");
  std::string objects;
  for (int i = 0; i <= limit; ++i) objects += "{\"k\":";
  objects += "1" + std::string(limit + 1, '}');
  EXPECT_THAT(ParseError(objects), HasSubstr("nesting deeper than 256"));
}

TEST(JsonTest, RejectsNonStandardInput) {
  EXPECT_THAT(ParseError("// c\n1"), HasSubstr("line 1, column 1: expected a JSON value"));
  EXPECT_THAT(ParseError("[1 /* c */]"), HasSubstr("line 1, column 4: expected ',' or ']'"));
  EXPECT_THAT(ParseError("{'a': 1}"), HasSubstr("expected '\"' to begin a member name"));
  EXPECT_THAT(ParseError("{\"a\" 1}"), HasSubstr("line 1, column 6: expected ':'"));
  EXPECT_THAT(ParseError("NaN"), HasSubstr("expected a JSON value"));
  EXPECT_THAT(ParseError("-Infinity"), HasSubstr("expected a digit in number"));
  EXPECT_THAT(ParseError("1."), HasSubstr("expected a digit after '.'"));
  EXPECT_THAT(ParseError(".5"), HasSubstr("expected a JSON value"));
  EXPECT_THAT(ParseError("1e"), HasSubstr("expected a digit in the exponent"));
  EXPECT_THAT(ParseError("+1"), HasSubstr("expected a JSON value"));
  EXPECT_THAT(ParseError("1e400"), HasSubstr("within the range of a double"));
  EXPECT_THAT(ParseError("tru"), HasSubstr("expected 'true'"));
  EXPECT_THAT(ParseError("\"a\tb\""), HasSubstr("unescaped control character 0x09"));
  EXPECT_THAT(ParseError(R"("\ud83d")"), HasSubstr("low surrogate"));
  EXPECT_THAT(ParseError(R"("\ud83d\u0041")"), HasSubstr("low surrogate"));
  EXPECT_THAT(ParseError(R"("\ude00")"), HasSubstr("high surrogate"));
  EXPECT_THAT(ParseError(R"("\u12g4")"), HasSubstr("4 hex digits"));
  EXPECT_THAT(ParseError("\"\xc3\""), HasSubstr("truncated sequence"));
  EXPECT_THAT(ParseError("\"\xc0\xaf\""), HasSubstr("valid UTF-8"));       // overlong '/'
  EXPECT_THAT(ParseError("\"\xed\xa0\x80\""), HasSubstr("code point U+D800"));
  EXPECT_THAT(ParseError(R"({"a":1,"a":2})"),
              HasSubstr("line 1, column 8: duplicate member name \"a\""));
}

TEST(JsonTest, FindAndSet) {
  Json object = Json::Object();
  object.Set("b", Json::Int(1)).Set("a", Json::String("x")).Set("c", Json());
  EXPECT_EQ(object.Dump(), R"({"b":1,"a":"x","c":null})");
  // Replacing keeps the member's position.
  object.Set("b", Json::Bool(false));
  EXPECT_EQ(object.Dump(), R"({"b":false,"a":"x","c":null})");
  ASSERT_NE(object.Find("a"), nullptr);
  EXPECT_EQ(object.Find("a")->as_string(), "x");
  EXPECT_EQ(object.Find("z"), nullptr);
  EXPECT_EQ(Json::Array().Find("a"), nullptr);
  // Mutable Find edits in place.
  object.Find("c")->Append(Json::Int(4)).Append(Json::Int(5));
  EXPECT_EQ(object.Dump(), R"({"b":false,"a":"x","c":[4,5]})");
  // Set on null makes an object; wrong-type accessors return empty values.
  Json from_null;
  from_null.Set("k", Json::Number(0.5));
  EXPECT_TRUE(from_null.is_object());
  EXPECT_EQ(from_null.Find("k")->as_number(), 0.5);
  EXPECT_EQ(from_null.as_string(), "");
  EXPECT_TRUE(from_null.items().empty());
  EXPECT_EQ(from_null.members().size(), 1u);
}

TEST(JsonTest, PrettyPrint) {
  Json json = Json::Object();
  Json list = Json::Array();
  list.Append(Json::Int(1)).Append(Json::String("two")).Append(Json::Array());
  Json inner = Json::Object();
  inner.Set("deep", Json::Bool(true));
  json.Set("name", Json::String("policy")).Set("list", list).Set("inner", inner)
      .Set("empty", Json::Object());
  EXPECT_EQ(json.Dump(2),
            "{\n"
            "  \"name\": \"policy\",\n"
            "  \"list\": [\n"
            "    1,\n"
            "    \"two\",\n"
            "    []\n"
            "  ],\n"
            "  \"inner\": {\n"
            "    \"deep\": true\n"
            "  },\n"
            "  \"empty\": {}\n"
            "}");
  EXPECT_EQ(json.Dump(0), "{\n\"name\": \"policy\",\n\"list\": [\n1,\n\"two\",\n[]\n],\n"
                          "\"inner\": {\n\"deep\": true\n},\n\"empty\": {}\n}");
  EXPECT_EQ(json.Dump(), R"({"name":"policy","list":[1,"two",[]],"inner":{"deep":true},)"
                         R"("empty":{}})");
  EXPECT_EQ(Json::Int(3).Dump(4), "3");
}

TEST(JsonTest, ParseJsonFilePrefixesPath) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "castor_json_good.json";
  const std::string bad = dir + "castor_json_bad.json";
  {
    std::ofstream(good) << "{\"fp32_ops\": [\"Softmax\"]}\n";
    std::ofstream(bad) << "{\n  \"a\": [1,]\n}\n";
  }
  absl::StatusOr<Json> parsed = ParseJsonFile(good);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Find("fp32_ops")->items()[0].as_string(), "Softmax");

  absl::StatusOr<Json> failed = ParseJsonFile(bad);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(failed.status().message()),
            bad + ": line 2, column 11: expected a value after ',' (trailing commas are not "
                  "allowed)");

  absl::StatusOr<Json> missing = ParseJsonFile(dir + "castor_json_missing.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("castor_json_missing.json"));
  std::remove(good.c_str());
  std::remove(bad.c_str());
}

}  // namespace
}  // namespace castor
