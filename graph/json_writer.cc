// JsonWriter: streaming JSON output with RFC 8259 string escaping.
#include "graph/json_writer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "graph/json.h"

namespace castor {
namespace {

[[noreturn]] void Misuse(const char* what) {
  std::fprintf(stderr, "JsonWriter misuse: %s\n", what);
  std::abort();
}

}  // namespace

std::string JsonWriter::Quote(std::string_view value) { return JsonQuoted(value); }

void JsonWriter::NewLineAndIndent(size_t depth) {
  if (indent_ <= 0) return;
  out_.push_back('\n');
  out_.append(depth * static_cast<size_t>(indent_), ' ');
}

void JsonWriter::BeforeValue(const char* what) {
  if (stack_.empty()) {
    if (wrote_top_level_) Misuse("a second top-level value");
    return;
  }
  Frame& frame = stack_.back();
  if (frame.scope == Scope::kObject) {
    if (!frame.key_pending) Misuse(what);  // an object member needs Key() first
    frame.key_pending = false;
    return;  // Key() wrote the separator and indentation
  }
  if (frame.members > 0) out_.push_back(',');
  NewLineAndIndent(stack_.size());
}

void JsonWriter::AfterValue() {
  if (stack_.empty()) {
    wrote_top_level_ = true;
    if (indent_ > 0) out_.push_back('\n');
    return;
  }
  ++stack_.back().members;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  if (stack_.empty() || stack_.back().scope != Scope::kObject) Misuse("Key() outside an object");
  Frame& frame = stack_.back();
  if (frame.key_pending) Misuse("two Key() calls without a value between them");
  if (frame.members > 0) out_.push_back(',');
  NewLineAndIndent(stack_.size());
  out_ += Quote(key);
  out_ += indent_ > 0 ? ": " : ":";
  frame.key_pending = true;
  return *this;
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue("an object member without Key()");
  out_.push_back('{');
  stack_.push_back({Scope::kObject});
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  if (stack_.empty() || stack_.back().scope != Scope::kObject) Misuse("EndObject() without BeginObject()");
  if (stack_.back().key_pending) Misuse("EndObject() after a Key() without a value");
  const bool empty = stack_.back().members == 0;
  stack_.pop_back();
  if (!empty) NewLineAndIndent(stack_.size());
  out_.push_back('}');
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue("an object member without Key()");
  out_.push_back('[');
  stack_.push_back({Scope::kArray});
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  if (stack_.empty() || stack_.back().scope != Scope::kArray) Misuse("EndArray() without BeginArray()");
  const bool empty = stack_.back().members == 0;
  stack_.pop_back();
  if (!empty) NewLineAndIndent(stack_.size());
  out_.push_back(']');
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view value) {
  BeforeValue("an object member without Key()");
  out_ += Quote(value);
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue("an object member without Key()");
  out_ += std::to_string(value);
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Double(double value) {
  if (!std::isfinite(value)) return Null();
  BeforeValue("an object member without Key()");
  // %.17g round-trips every double; shorter forms are tried first so
  // 0.1 prints as 0.1, not 0.10000000000000001.
  char buffer[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  out_ += buffer;
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue("an object member without Key()");
  out_ += value ? "true" : "false";
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue("an object member without Key()");
  out_ += "null";
  AfterValue();
  return *this;
}

}  // namespace castor
