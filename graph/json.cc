// JSON value, strict RFC 8259 parser and deterministic writer (see json.h).
#include "graph/json.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/onnx_io.h"
#include "graph/status.h"

namespace castor {

// --- construction and access -------------------------------------------------

Json Json::Bool(bool value) {
  Json json;
  json.type_ = Type::kBool;
  json.bool_ = value;
  return json;
}

Json Json::Number(double value) {
  Json json;
  if (!std::isfinite(value)) return json;  // JSON cannot express NaN/Inf.
  json.type_ = Type::kNumber;
  json.number_ = value;
  return json;
}

Json Json::Int(int64_t value) {
  Json json;
  json.type_ = Type::kNumber;
  json.number_ = static_cast<double>(value);
  json.int_ = value;
  json.has_int_ = true;
  return json;
}

Json Json::String(std::string value) {
  Json json;
  json.type_ = Type::kString;
  json.string_ = std::move(value);
  return json;
}

Json Json::Array() {
  Json json;
  json.type_ = Type::kArray;
  return json;
}

Json Json::Object() {
  Json json;
  json.type_ = Type::kObject;
  return json;
}

int64_t Json::as_int() const {
  if (!is_number()) return 0;
  if (has_int_) return int_;
  // 2^63 as a double; saturate instead of invoking undefined behaviour.
  constexpr double kTwo63 = 9223372036854775808.0;
  if (number_ >= kTwo63) return std::numeric_limits<int64_t>::max();
  if (number_ < -kTwo63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(number_);
}

const std::string& Json::as_string() const {
  static const std::string* const kEmpty = new std::string();
  return is_string() ? string_ : *kEmpty;
}

const std::vector<Json>& Json::items() const {
  static const std::vector<Json>* const kEmpty = new std::vector<Json>();
  return is_array() ? items_ : *kEmpty;
}

const std::vector<Json::Member>& Json::members() const {
  static const std::vector<Member>* const kEmpty = new std::vector<Member>();
  return is_object() ? members_ : *kEmpty;
}

size_t Json::size() const {
  if (is_array()) return items_.size();
  if (is_object()) return members_.size();
  return 0;
}

Json& Json::Append(Json value) {
  if (!is_array()) *this = Array();
  items_.push_back(std::move(value));
  return *this;
}

const Json* Json::Find(const std::string& key) const {
  if (!is_object()) return nullptr;
  for (const Member& member : members_) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

Json* Json::Find(const std::string& key) {
  return const_cast<Json*>(static_cast<const Json&>(*this).Find(key));
}

Json& Json::Set(const std::string& key, Json value) {
  if (!is_object()) *this = Object();
  if (Json* existing = Find(key)) {
    *existing = std::move(value);
  } else {
    members_.emplace_back(key, std::move(value));
  }
  return *this;
}

bool operator==(const Json& a, const Json& b) {
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case Json::Type::kNull:
      return true;
    case Json::Type::kBool:
      return a.bool_ == b.bool_;
    case Json::Type::kNumber:
      if (a.has_int_ && b.has_int_) return a.int_ == b.int_;
      return a.number_ == b.number_;
    case Json::Type::kString:
      return a.string_ == b.string_;
    case Json::Type::kArray:
      return a.items_ == b.items_;
    case Json::Type::kObject:
      return a.members_ == b.members_;
  }
  return false;
}

// --- writer ------------------------------------------------------------------

namespace {

void AppendEscapedString(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char c : text) {
    const unsigned char byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out.push_back(kHex[byte >> 4]);
          out.push_back(kHex[byte & 0xf]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// The shortest "%.<p>g" form (p = 1..17) that parses back to `value` exactly.
// std::to_chars/from_chars keep this independent of the C locale.
void AppendShortestDouble(std::string& out, double value) {
  char buffer[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::to_chars_result written = std::to_chars(
        buffer, buffer + sizeof(buffer), value, std::chars_format::general, precision);
    if (written.ec != std::errc()) continue;
    double parsed = 0.0;
    std::from_chars_result read = std::from_chars(buffer, written.ptr, parsed);
    if ((read.ec == std::errc() && parsed == value) || precision == 17) {
      out.append(buffer, written.ptr);
      return;
    }
  }
}

void AppendNewline(std::string& out, int indent, int level) {
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

}  // namespace

std::string JsonQuoted(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  AppendEscapedString(out, text);
  return out;
}

void Json::DumpTo(std::string& out, int indent, int level) const {
  switch (type_) {
    case Type::kNull:
      out += "null";
      return;
    case Type::kBool:
      out += bool_ ? "true" : "false";
      return;
    case Type::kNumber:
      if (has_int_) {
        out += absl::StrCat(int_);
      } else {
        AppendShortestDouble(out, number_);
      }
      return;
    case Type::kString:
      AppendEscapedString(out, string_);
      return;
    case Type::kArray:
      if (items_.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) out.push_back(',');
        if (indent >= 0) AppendNewline(out, indent, level + 1);
        items_[i].DumpTo(out, indent, level + 1);
      }
      if (indent >= 0) AppendNewline(out, indent, level);
      out.push_back(']');
      return;
    case Type::kObject:
      if (members_.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i > 0) out.push_back(',');
        if (indent >= 0) AppendNewline(out, indent, level + 1);
        AppendEscapedString(out, members_[i].first);
        out += indent >= 0 ? ": " : ":";
        members_[i].second.DumpTo(out, indent, level + 1);
      }
      if (indent >= 0) AppendNewline(out, indent, level);
      out.push_back('}');
      return;
  }
}

std::string Json::Dump(int indent) const {
  std::string out;
  DumpTo(out, indent, 0);
  return out;
}

// --- parser ------------------------------------------------------------------

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    SkipWhitespace();
    Json value;
    absl::Status status = ParseValue(value, 0);
    if (!status.ok()) return status;
    SkipWhitespace();
    if (pos_ != text_.size()) {
      return Error("expected end of input after the JSON value, got " + Describe());
    }
    return value;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // "line L, column C: what" for the current position.
  absl::Status Error(const std::string& what) const { return ErrorAt(pos_, what); }
  absl::Status ErrorAt(size_t offset, const std::string& what) const {
    size_t line = 1;
    size_t column = 1;
    for (size_t i = 0; i < offset && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("line %d, column %d: %s", line, column, what));
  }

  // The character at the current position, for error messages.
  std::string Describe() const {
    if (AtEnd()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
    return absl::StrFormat("byte 0x%02x", c);
  }

  void SkipWhitespace() {
    while (!AtEnd()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }

  absl::Status ParseValue(Json& out, int depth) {
    switch (Peek()) {
      case '{':
        return ParseObject(out, depth + 1);
      case '[':
        return ParseArray(out, depth + 1);
      case '"': {
        std::string text;
        absl::Status status = ParseString(text);
        if (!status.ok()) return status;
        out = Json::String(std::move(text));
        return absl::OkStatus();
      }
      case 't':
        return ParseLiteral("true", Json::Bool(true), out);
      case 'f':
        return ParseLiteral("false", Json::Bool(false), out);
      case 'n':
        return ParseLiteral("null", Json(), out);
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber(out);
        return Error("expected a JSON value (object, array, string, number, true, false "
                     "or null), got " + Describe());
    }
  }

  absl::Status ParseLiteral(const char* word, Json value, Json& out) {
    const std::string expected(word);
    if (text_.compare(pos_, expected.size(), expected) != 0) {
      return Error(absl::StrCat("expected '", expected, "'"));
    }
    pos_ += expected.size();
    out = std::move(value);
    return absl::OkStatus();
  }

  absl::Status CheckDepth(int depth) const {
    if (depth > Json::kMaxDepth) {
      return Error(absl::StrCat("nesting deeper than ", Json::kMaxDepth,
                                " arrays/objects is not allowed"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseArray(Json& out, int depth) {
    absl::Status status = CheckDepth(depth);
    if (!status.ok()) return status;
    ++pos_;  // '['
    out = Json::Array();
    SkipWhitespace();
    if (Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipWhitespace();
      if (Peek() == ']') return Error("expected a value after ',' (trailing commas are not allowed)");
      Json element;
      status = ParseValue(element, depth);
      if (!status.ok()) return status;
      out.Append(std::move(element));
      SkipWhitespace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in array, got " + Describe());
    }
  }

  absl::Status ParseObject(Json& out, int depth) {
    absl::Status status = CheckDepth(depth);
    if (!status.ok()) return status;
    ++pos_;  // '{'
    out = Json::Object();
    SkipWhitespace();
    if (Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipWhitespace();
      if (Peek() == '}') {
        return Error("expected a member name after ',' (trailing commas are not allowed)");
      }
      if (Peek() != '"') return Error("expected '\"' to begin a member name, got " + Describe());
      const size_t key_offset = pos_;
      std::string key;
      status = ParseString(key);
      if (!status.ok()) return status;
      if (out.Find(key) != nullptr) {
        return ErrorAt(key_offset, absl::StrCat("duplicate member name \"", key, "\""));
      }
      SkipWhitespace();
      if (Peek() != ':') return Error("expected ':' after member name, got " + Describe());
      ++pos_;
      SkipWhitespace();
      Json value;
      status = ParseValue(value, depth);
      if (!status.ok()) return status;
      out.Set(key, std::move(value));
      SkipWhitespace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in object, got " + Describe());
    }
  }

  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Reads the 4 hex digits after "\u" (pos_ at the first digit).
  absl::Status ParseHex4(uint32_t& code) {
    code = 0;
    for (int i = 0; i < 4; ++i) {
      const int digit = HexValue(Peek());
      if (AtEnd() || digit < 0) return Error("expected 4 hex digits after \\u, got " + Describe());
      code = code * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return absl::OkStatus();
  }

  static void AppendUtf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
    }
  }

  // Copies one raw UTF-8 sequence starting at pos_ (a byte >= 0x80), checking
  // it is well formed: no overlong forms, surrogates or code points > 0x10FFFF.
  absl::Status CopyUtf8Sequence(std::string& out) {
    const size_t start = pos_;
    const unsigned char lead = static_cast<unsigned char>(text_[pos_]);
    int continuation = 0;
    uint32_t code = 0;
    uint32_t minimum = 0;
    if (lead >= 0xc2 && lead <= 0xdf) {
      continuation = 1;
      code = lead & 0x1f;
      minimum = 0x80;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      continuation = 2;
      code = lead & 0x0f;
      minimum = 0x800;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      continuation = 3;
      code = lead & 0x07;
      minimum = 0x10000;
    } else {
      return Error(absl::StrFormat("expected valid UTF-8 in string, got byte 0x%02x", lead));
    }
    for (int i = 1; i <= continuation; ++i) {
      const size_t at = start + static_cast<size_t>(i);
      const unsigned char byte = at < text_.size() ? static_cast<unsigned char>(text_[at]) : 0;
      if ((byte & 0xc0) != 0x80) {
        return Error(absl::StrFormat("expected valid UTF-8 in string: truncated sequence "
                                     "after lead byte 0x%02x", lead));
      }
      code = (code << 6) | (byte & 0x3f);
    }
    if (code < minimum || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return Error(absl::StrFormat("expected valid UTF-8 in string: invalid code point "
                                   "U+%04X", code));
    }
    out.append(text_, start, static_cast<size_t>(continuation) + 1);
    pos_ = start + static_cast<size_t>(continuation) + 1;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string& out) {
    const size_t open_offset = pos_;
    ++pos_;  // opening quote
    while (true) {
      if (AtEnd()) {
        return ErrorAt(open_offset, "unterminated string: expected a closing '\"' before end of input");
      }
      const char c = text_[pos_];
      const unsigned char byte = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (byte < 0x20) {
        return Error(absl::StrFormat(
            "expected a string character, got unescaped control character 0x%02x "
            "(write it as \\u%04x)", byte, byte));
      }
      if (byte >= 0x80) {
        absl::Status status = CopyUtf8Sequence(out);
        if (!status.ok()) return status;
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      const size_t escape_offset = pos_;
      ++pos_;  // backslash
      const char escape = Peek();
      switch (escape) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          ++pos_;
          uint32_t code = 0;
          absl::Status status = ParseHex4(code);
          if (!status.ok()) return status;
          if (code >= 0xdc00 && code <= 0xdfff) {
            return ErrorAt(escape_offset, absl::StrFormat(
                "expected a high surrogate before low surrogate \\u%04x", code));
          }
          if (code >= 0xd800 && code <= 0xdbff) {
            if (text_.compare(pos_, 2, "\\u") != 0) {
              return Error(absl::StrFormat(
                  "expected a \\uDC00-\\uDFFF low surrogate after high surrogate \\u%04x", code));
            }
            pos_ += 2;
            uint32_t low = 0;
            status = ParseHex4(low);
            if (!status.ok()) return status;
            if (low < 0xdc00 || low > 0xdfff) {
              return ErrorAt(pos_ - 6, absl::StrFormat(
                  "expected a \\uDC00-\\uDFFF low surrogate after high surrogate \\u%04x, "
                  "got \\u%04x", code, low));
            }
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          }
          AppendUtf8(out, code);
          continue;  // pos_ already past the digits
        }
        default:
          return ErrorAt(escape_offset, "expected an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t "
                                        "or \\uXXXX) after '\\', got " + Describe());
      }
      ++pos_;
    }
  }

  absl::Status ParseNumber(Json& out) {
    const size_t start = pos_;
    if (Peek() == '-') ++pos_;
    if (Peek() == '0') {
      ++pos_;
      if (Peek() >= '0' && Peek() <= '9') {
        return ErrorAt(start, "expected a number without leading zeros");
      }
    } else if (Peek() >= '1' && Peek() <= '9') {
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
    } else {
      return Error("expected a digit in number, got " + Describe());
    }
    bool is_integer = true;
    if (Peek() == '.') {
      is_integer = false;
      ++pos_;
      if (!(Peek() >= '0' && Peek() <= '9')) {
        return Error("expected a digit after '.' in number, got " + Describe());
      }
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      is_integer = false;
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!(Peek() >= '0' && Peek() <= '9')) {
        return Error("expected a digit in the exponent, got " + Describe());
      }
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    double value = 0.0;
    std::from_chars_result read = std::from_chars(first, last, value);
    if (read.ec != std::errc() || read.ptr != last || !std::isfinite(value)) {
      return ErrorAt(start, absl::StrCat("expected a number within the range of a double, got ",
                                         std::string(first, last)));
    }
    out = Json::Number(value);
    if (is_integer) {
      int64_t exact = 0;
      std::from_chars_result int_read = std::from_chars(first, last, exact);
      // "-0" stays a double so its sign survives a round trip.
      const bool negative_zero = exact == 0 && *first == '-';
      if (int_read.ec == std::errc() && int_read.ptr == last && !negative_zero) {
        out = Json::Int(exact);
      }
    }
    return absl::OkStatus();
  }

  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<Json> Json::Parse(const std::string& text) {
  return Parser(text).ParseDocument();
}

absl::StatusOr<Json> ParseJsonFile(const std::string& path) {
  // A regular file of bounded size: a FIFO or /dev/zero must not be read
  // forever (ReadWholeFile refuses both before reading).
  constexpr uint64_t kMaxJsonFileBytes = uint64_t{256} << 20;
  CASTOR_ASSIGN_OR_RETURN(std::string contents,
                          ReadWholeFile(path, kMaxJsonFileBytes, "the 256 MiB a JSON file may hold"));
  absl::StatusOr<Json> parsed = Json::Parse(contents);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace castor
