// Regular expressions a user writes (a policy's node regex, --freeze,
// --train-only, conformance --filter), compiled in one place so that every
// caller gets the same checks. std::regex (libstdc++) is not safe on
// hostile patterns: a repetition count or a backreference of 19 or more
// digits overflows a long while it is parsed (undefined behaviour), and
// its compiler and matcher recurse per pattern element. CompileUserRegex
// refuses patterns longer than kMaxUserRegexLength, repetition counts
// above kMaxUserRegexRepeat and escapes followed by more than 9 digits
// before std::regex sees them, then returns std::regex's own verdict
// (ECMAScript grammar).
#pragma once

#include <regex>
#include <string>

#include "absl/status/statusor.h"

namespace castor {

inline constexpr size_t kMaxUserRegexLength = 1000;
inline constexpr long kMaxUserRegexRepeat = 10000;

// The compiled pattern, or InvalidArgument saying what is wrong with it
// (the message does not repeat the pattern: callers name it and its flag).
absl::StatusOr<std::regex> CompileUserRegex(const std::string& pattern);

}  // namespace castor
