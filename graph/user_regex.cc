// CompileUserRegex (see user_regex.h).
#include "graph/user_regex.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace castor {
namespace {

// Why a number in `pattern` is refused, or "" when none is: a repetition
// count {m}, {m,} or {m,n} above kMaxUserRegexRepeat (outside bracket
// expressions), or an escape followed by more than 9 digits (a
// backreference libstdc++ would parse into a long as well).
std::string RefusedNumber(const std::string& pattern) {
  auto digits_at = [&](size_t at) {
    size_t end = at;
    while (end < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[end]))) ++end;
    return pattern.substr(at, end - at);
  };
  auto shown = [](const std::string& digits) {
    return digits.size() > 12 ? digits.substr(0, 12) + "..." : digits;
  };
  bool in_brackets = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      if (const std::string digits = digits_at(i + 1); digits.size() > 9) {
        return absl::StrCat("the escape \\", shown(digits), " has more than 9 digits");
      }
      ++i;  // the escaped character is a literal
    } else if (in_brackets) {
      in_brackets = c != ']';
    } else if (c == '[') {
      in_brackets = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') ++i;  // "[]...]"
    } else if (c == '{') {
      for (size_t j = i + 1; j < pattern.size();) {
        const std::string digits = digits_at(j);
        j += digits.size();
        // More than 5 digits already exceeds the limit: never parsed.
        if (digits.size() > 5 || (!digits.empty() && std::stol(digits) > kMaxUserRegexRepeat)) {
          return absl::StrCat("repetition count ", shown(digits), " is larger than the ",
                              kMaxUserRegexRepeat, " castor accepts");
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
  if (const std::string refused = RefusedNumber(pattern); !refused.empty()) {
    return absl::InvalidArgumentError(refused);
  }
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

}  // namespace castor
