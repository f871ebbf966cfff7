// A small JSON value type with a strict RFC 8259 parser and a deterministic
// writer, for castor's own files (autocast policies, checkpoint metadata).
//
//   CASTOR_ASSIGN_OR_RETURN(Json policy, ParseJsonFile(path));
//   if (const Json* list = policy.Find("fp32_ops"); list && list->is_array()) ...
//
//   Json meta = Json::Object();
//   meta.Set("step", Json::Int(100)).Set("loss", Json::Number(0.25));
//   std::string text = meta.Dump(2);
//
// Objects keep their members in insertion order, so Dump() is deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace castor {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, Json>;

  // null.
  Json() = default;

  static Json Bool(bool value);
  // JSON has no NaN or infinity: Number() of a non-finite value yields null
  // (is_null() is true and Dump() prints `null`).
  static Json Number(double value);
  // An exact 64-bit integer; is_int() is true and Dump() prints every digit.
  static Json Int(int64_t value);
  static Json String(std::string value);
  static Json Array();
  static Json Object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  // A number that holds an exact int64: made by Int(), or parsed from integer
  // text (no fraction or exponent) that fits in int64.
  bool is_int() const { return type_ == Type::kNumber && has_int_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors return a zero/empty value when the type does not match; check
  // the type first when it matters.
  bool as_bool() const { return is_bool() && bool_; }
  // The exact integer when is_int(), else the number truncated toward zero
  // (saturating), else 0.
  int64_t as_int() const;
  double as_number() const { return is_number() ? number_ : 0.0; }
  const std::string& as_string() const;
  const std::vector<Json>& items() const;
  const std::vector<Member>& members() const;
  // Element count of an array or object; 0 for other types.
  size_t size() const;

  // Arrays: appends `value`. A non-array (e.g. null) becomes an empty array
  // first. Returns *this for chaining.
  Json& Append(Json value);

  // Objects: the member named `key`, or nullptr (also when not an object).
  const Json* Find(const std::string& key) const;
  Json* Find(const std::string& key);
  // Objects: replaces the value of an existing `key` in place (keeping its
  // position), else appends the member. A non-object (e.g. null) becomes an
  // empty object first. Returns *this for chaining.
  Json& Set(const std::string& key, Json value);

  // Compact text when indent < 0; otherwise one element per line, nested
  // `indent` spaces per level (empty arrays/objects print as [] and {}).
  // Strings are escaped per RFC 8259: `"` `\` and \b \f \n \r \t by their
  // short forms, other control characters as \u00XX; everything else
  // (including non-ASCII UTF-8) is copied unchanged. Integers print exactly;
  // other numbers use the shortest %g form that parses back to the same double.
  std::string Dump(int indent = -1) const;

  // Strict RFC 8259: one value surrounded by optional whitespace; no comments,
  // no trailing commas, no leading zeros, no NaN/Infinity, valid UTF-8 only,
  // nesting depth at most kMaxDepth. Duplicate object keys are rejected.
  // Errors read "line L, column C: <what was expected>" (1-based; the column
  // counts bytes).
  static absl::StatusOr<Json> Parse(const std::string& text);

  static constexpr int kMaxDepth = 256;

  // Structural equality; numbers compare exactly as integers when both are
  // is_int(), else as doubles. Object member order matters.
  friend bool operator==(const Json& a, const Json& b);

 private:
  void DumpTo(std::string& out, int indent, int level) const;

  Type type_ = Type::kNull;
  bool bool_ = false;
  bool has_int_ = false;
  double number_ = 0.0;
  int64_t int_ = 0;
  std::string string_;
  std::vector<Json> items_;
  std::vector<Member> members_;
};

// Reads and parses the JSON file at `path`; errors are prefixed with the path
// ("<path>: line L, column C: ...").
absl::StatusOr<Json> ParseJsonFile(const std::string& path);

// `text` as a JSON string literal, quotes included ("a\"b" for a"b):
// control characters as \uXXXX, bytes >= 0x80 as they are (UTF-8).
std::string JsonQuoted(std::string_view text);

}  // namespace castor
