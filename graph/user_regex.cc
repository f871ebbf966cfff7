// CompileUserRegex (see user_regex.h).
#include "graph/user_regex.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace castor {
namespace {

// The first repetition count {m}, {m,} or {m,n} of `pattern` above
// kMaxUserRegexRepeat (outside bracket expressions, escapes skipped), as
// its digits; empty when there is none.
std::string OversizedRepeat(const std::string& pattern) {
  bool in_brackets = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      ++i;  // the escaped character is a literal
    } else if (in_brackets) {
      in_brackets = c != ']';
    } else if (c == '[') {
      in_brackets = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') ++i;  // "[]...]"
    } else if (c == '{') {
      for (size_t j = i + 1; j < pattern.size();) {
        const size_t digits_begin = j;
        while (j < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[j]))) ++j;
        const std::string digits = pattern.substr(digits_begin, j - digits_begin);
        // More than 5 digits already exceeds the limit: never parsed.
        if (digits.size() > 5 || (!digits.empty() && std::stol(digits) > kMaxUserRegexRepeat)) {
          return digits;
        }
        if (j >= pattern.size() || pattern[j] != ',') break;
        ++j;
      }
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::regex> CompileUserRegex(const std::string& pattern) {
  if (pattern.size() > kMaxUserRegexLength) {
    return absl::InvalidArgumentError(absl::StrCat("the pattern has ", pattern.size(),
                                                   " characters, more than the ",
                                                   kMaxUserRegexLength, " castor accepts"));
  }
  if (const std::string repeat = OversizedRepeat(pattern); !repeat.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition count ", repeat.size() > 12 ? repeat.substr(0, 12) + "..." : repeat,
                     " is larger than the ", kMaxUserRegexRepeat, " castor accepts"));
  }
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

}  // namespace castor
