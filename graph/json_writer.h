// A small streaming JSON writer for castor's machine-readable outputs
// (`inspect --format json`, metrics files, `--json` reports). It writes
// objects, arrays, strings (escaped per RFC 8259), integers, doubles
// (non-finite ones become null, which JSON has no number for), bools and
// null, pretty-printed with `indent` spaces per level or compact (indent 0).
//
//   JsonWriter json;
//   json.BeginObject().Key("nodes").Int(7).Key("name").String("cnn").EndObject();
//   std::string text = json.TakeString();
//
// Misuse (a value where a key is due, unbalanced End*, a second top-level
// value) is a programming error and aborts with a message.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace castor {

class JsonWriter {
 public:
  explicit JsonWriter(int indent = 2) : indent_(indent) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // The next member's key; only inside an object, before each value.
  JsonWriter& Key(std::string_view key);

  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // True once one complete top-level value has been written.
  bool complete() const { return stack_.empty() && wrote_top_level_; }
  // The document so far (ends with a newline once complete()).
  const std::string& str() const { return out_; }
  std::string TakeString() { return std::move(out_); }

  // `value` as a quoted JSON string literal.
  static std::string Quote(std::string_view value);

 private:
  enum class Scope { kObject, kArray };
  struct Frame {
    Scope scope;
    int members = 0;        // values written in this scope
    bool key_pending = false;  // a Key() waits for its value
  };

  // Writes separators/indentation before a value and checks it is allowed.
  void BeforeValue(const char* what);
  void AfterValue();
  void NewLineAndIndent(size_t depth);

  int indent_;
  std::string out_;
  std::vector<Frame> stack_;
  bool wrote_top_level_ = false;
};

}  // namespace castor
