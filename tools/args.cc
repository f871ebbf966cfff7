// ArgParser: the declarative flag/positional parser every castor subcommand
// uses (see args.h for the accepted forms).
#include "tools/args.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castor::tools {
namespace {

[[noreturn]] void SpecError(const std::string& message) {
  std::fprintf(stderr, "ArgParser: %s\n", message.c_str());
  std::abort();
}

bool IsNumber(const std::string& text) {
  double unused;
  return absl::SimpleAtod(text, &unused);
}

// "-x", "--x", "--x=1" are flags; "-", "-5" and "-0.5" are values.
bool LooksLikeFlag(const std::string& arg) {
  return arg.size() > 1 && arg[0] == '-' && !IsNumber(arg);
}

std::string FormatDouble(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

absl::Status BadValue(const std::string& flag, const std::string& expected,
                      const std::string& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("flag '--", flag, "' expects ", expected, ", got '", value, "'"));
}

}  // namespace

const char* FlagKindName(FlagKind kind) {
  switch (kind) {
    case FlagKind::kString: return "string";
    case FlagKind::kInt: return "int";
    case FlagKind::kFloat: return "float";
    case FlagKind::kSwitch: return "switch";
    case FlagKind::kEnum: return "enum";
    case FlagKind::kRepeated: return "repeated string";
  }
  return "?";
}

int EditDistance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // d[i][j]: distance between the first i chars of a and the first j of b.
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string ClosestMatch(const std::string& word, const std::vector<std::string>& candidates) {
  // Leading dashes carry no information about the typo.
  const size_t letters = word.size() - std::min(word.find_first_not_of('-'), word.size());
  const int max_distance = std::clamp(static_cast<int>(letters + 1) / 3, 1, 3);
  std::string best;
  int best_distance = max_distance + 1;
  for (const std::string& candidate : candidates) {
    const int distance = EditDistance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

ArgParser& ArgParser::AddPositional(std::string name, std::string help, std::string* target) {
  if (!positionals_.empty() && !positionals_.back().required) {
    SpecError(absl::StrCat(command_, ": required positional ", name, " after an optional one"));
  }
  positionals_.push_back({std::move(name), std::move(help), target, true});
  return *this;
}

ArgParser& ArgParser::AddOptionalPositional(std::string name, std::string help,
                                            std::string* target) {
  positionals_.push_back({std::move(name), std::move(help), target, false});
  return *this;
}

ArgParser::Flag& ArgParser::AddFlag(std::string name, FlagKind kind, std::string value_name,
                                    std::string help, void* target) {
  if (name.empty() || name[0] == '-' || name == "help" || FindFlag(name)) {
    SpecError(absl::StrCat(command_, ": bad or duplicate flag name '", name, "'"));
  }
  flags_.push_back({std::move(name), kind, std::move(value_name), std::move(help), {}, "", target});
  return flags_.back();
}

ArgParser& ArgParser::AddString(std::string name, std::string value_name, std::string help,
                                std::string* target) {
  AddFlag(std::move(name), FlagKind::kString, std::move(value_name), std::move(help), target)
      .default_text = target->empty() ? "none" : absl::StrCat("\"", *target, "\"");
  return *this;
}

ArgParser& ArgParser::AddInt(std::string name, std::string value_name, std::string help,
                             int64_t* target) {
  AddFlag(std::move(name), FlagKind::kInt, std::move(value_name), std::move(help), target)
      .default_text = absl::StrCat(*target);
  return *this;
}

ArgParser& ArgParser::AddFloat(std::string name, std::string value_name, std::string help,
                               double* target) {
  AddFlag(std::move(name), FlagKind::kFloat, std::move(value_name), std::move(help), target)
      .default_text = FormatDouble(*target);
  return *this;
}

ArgParser& ArgParser::AddSwitch(std::string name, std::string help, bool* target) {
  AddFlag(std::move(name), FlagKind::kSwitch, "", std::move(help), target).default_text =
      *target ? "on" : "off";
  return *this;
}

ArgParser& ArgParser::AddEnum(std::string name, std::vector<std::string> allowed,
                              std::string help, std::string* target) {
  if (std::find(allowed.begin(), allowed.end(), *target) == allowed.end()) {
    SpecError(absl::StrCat(command_, ": default of --", name, " is not an allowed value"));
  }
  Flag& flag = AddFlag(std::move(name), FlagKind::kEnum, absl::StrJoin(allowed, "|"),
                       std::move(help), target);
  flag.allowed = std::move(allowed);
  flag.default_text = *target;
  return *this;
}

ArgParser& ArgParser::AddRepeated(std::string name, std::string value_name, std::string help,
                                  std::vector<std::string>* target) {
  AddFlag(std::move(name), FlagKind::kRepeated, std::move(value_name), std::move(help), target)
      .default_text = target->empty() ? "none" : absl::StrJoin(*target, ", ");
  return *this;
}

ArgParser& ArgParser::AddExample(std::string command_line) {
  examples_.push_back(std::move(command_line));
  return *this;
}

ArgParser::Flag* ArgParser::FindFlag(const std::string& name) {
  for (Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

bool ArgParser::WasGiven(const std::string& name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return flag.given;
  }
  return false;
}

absl::Status ArgParser::UnknownFlagError(const std::string& arg) const {
  std::vector<std::string> known = {"--help"};
  for (const Flag& flag : flags_) {
    known.push_back(absl::StrCat("--", flag.name));
    if (flag.kind == FlagKind::kSwitch) known.push_back(absl::StrCat("--no-", flag.name));
  }
  std::string message = absl::StrCat("unknown flag '", arg, "'");
  // "-format" is probably "--format": compare with two dashes.
  const std::string normalized = arg.size() > 1 && arg[1] != '-' ? absl::StrCat("-", arg) : arg;
  if (std::string suggestion = ClosestMatch(normalized, known); !suggestion.empty()) {
    absl::StrAppend(&message, " (did you mean '", suggestion, "'?)");
  }
  absl::StrAppend(&message, "; see '", command_, " --help'");
  return absl::InvalidArgumentError(message);
}

absl::Status ArgParser::SetValue(Flag& flag, const std::string& value) {
  switch (flag.kind) {
    case FlagKind::kString:
      *static_cast<std::string*>(flag.target) = value;
      return absl::OkStatus();
    case FlagKind::kInt: {
      int64_t parsed;
      if (!absl::SimpleAtoi(value, &parsed)) return BadValue(flag.name, "an integer", value);
      *static_cast<int64_t*>(flag.target) = parsed;
      return absl::OkStatus();
    }
    case FlagKind::kFloat: {
      double parsed;
      if (!absl::SimpleAtod(value, &parsed)) return BadValue(flag.name, "a number", value);
      *static_cast<double*>(flag.target) = parsed;
      return absl::OkStatus();
    }
    case FlagKind::kSwitch: {
      if (value != "true" && value != "false") return BadValue(flag.name, "true or false", value);
      *static_cast<bool*>(flag.target) = value == "true";
      return absl::OkStatus();
    }
    case FlagKind::kEnum:
      if (std::find(flag.allowed.begin(), flag.allowed.end(), value) == flag.allowed.end()) {
        return absl::InvalidArgumentError(absl::StrCat("flag '--", flag.name, "' got '", value,
                                                       "'; allowed values: ",
                                                       absl::StrJoin(flag.allowed, ", ")));
      }
      *static_cast<std::string*>(flag.target) = value;
      return absl::OkStatus();
    case FlagKind::kRepeated: {
      auto* list = static_cast<std::vector<std::string>*>(flag.target);
      if (!flag.given) list->clear();  // given values replace the default list
      list->push_back(value);
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unhandled flag kind");
}

ArgParser& ArgParser::WithShortName(char letter) {
  if (flags_.empty()) SpecError(absl::StrCat(command_, ": WithShortName before any flag"));
  for (const Flag& flag : flags_) {
    if (flag.short_name == letter || letter == 'h') {
      SpecError(absl::StrCat(command_, ": short flag -", std::string(1, letter),
                             " is already taken (-h is --help)"));
    }
  }
  flags_.back().short_name = letter;
  return *this;
}

absl::StatusOr<ParseOutcome> ArgParser::Parse(const std::vector<std::string>& args) {
  // Help wins over every other problem on the line.
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "-h" || arg == "--help") return ParseOutcome::kHelp;
  }
  for (Flag& flag : flags_) flag.given = false;

  std::vector<std::string> positional_values;
  bool flags_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (!flags_ended && arg.size() == 2 && arg[0] == '-' && arg[1] != '-') {
      for (const Flag& flag : flags_) {
        if (flag.short_name == arg[1]) arg = absl::StrCat("--", flag.name);
      }
    }
    if (flags_ended || !LooksLikeFlag(arg)) {
      positional_values.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    if (arg[1] != '-') return UnknownFlagError(arg);

    const size_t equals = arg.find('=');
    const std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos
                                                                        : equals - 2);
    const bool has_inline_value = equals != std::string::npos;
    const std::string inline_value = has_inline_value ? arg.substr(equals + 1) : "";

    Flag* flag = FindFlag(name);
    bool negated = false;
    if (!flag && name.rfind("no-", 0) == 0) {
      Flag* positive = FindFlag(name.substr(3));
      if (positive && positive->kind == FlagKind::kSwitch) {
        if (has_inline_value) {
          return absl::InvalidArgumentError(
              absl::StrCat("flag '--", name, "' takes no value; got '", arg, "'"));
        }
        flag = positive;
        negated = true;
      }
    }
    if (!flag) return UnknownFlagError(arg.substr(0, equals));
    if (flag->given && flag->kind != FlagKind::kRepeated) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag '--", flag->name, "' is given more than once"));
    }

    if (flag->kind == FlagKind::kSwitch) {
      if (has_inline_value) {
        if (absl::Status s = SetValue(*flag, inline_value); !s.ok()) return s;
      } else {
        *static_cast<bool*>(flag->target) = !negated;
      }
      flag->given = true;
      continue;
    }

    std::string value;
    if (has_inline_value) {
      value = inline_value;
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag '--", flag->name, "' needs a value (", flag->value_name, ")"));
    }
    if (absl::Status s = SetValue(*flag, value); !s.ok()) return s;
    flag->given = true;
  }

  if (positional_values.size() > positionals_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional_values[positionals_.size()], "'; see '",
                     command_, " --help'"));
  }
  for (size_t k = 0; k < positionals_.size(); ++k) {
    if (k < positional_values.size()) {
      *positionals_[k].target = positional_values[k];
    } else if (positionals_[k].required) {
      return absl::InvalidArgumentError(absl::StrCat("missing argument ", positionals_[k].name,
                                                     "; see '", command_, " --help'"));
    }
  }
  return ParseOutcome::kRun;
}

std::string ArgParser::Help() const {
  std::string usage = absl::StrCat("usage: ", command_);
  for (const Positional& p : positionals_) {
    absl::StrAppend(&usage, p.required ? " " : " [", p.name, p.required ? "" : "]");
  }
  absl::StrAppend(&usage, " [flags]\n");

  // Two-column rows: the left column is padded to the widest entry.
  std::vector<std::pair<std::string, std::string>> argument_rows, flag_rows;
  for (const Positional& p : positionals_) {
    argument_rows.emplace_back(p.name, absl::StrCat(p.help, p.required ? "" : " (optional)"));
  }
  for (const Flag& f : flags_) {
    std::string left = f.kind == FlagKind::kSwitch ? absl::StrCat("--[no-]", f.name)
                                                   : absl::StrCat("--", f.name, " ", f.value_name);
    if (f.short_name != 0) left = absl::StrCat("-", std::string(1, f.short_name), ", ", left);
    flag_rows.emplace_back(std::move(left), f.help);
    flag_rows.emplace_back("", absl::StrCat("(", FlagKindName(f.kind), "; default: ",
                                            f.default_text, ")"));
  }
  flag_rows.emplace_back("-h, --help", "show this help");
  size_t width = 0;
  for (const auto& rows : {argument_rows, flag_rows}) {
    for (const auto& [left, right] : rows) width = std::max(width, left.size());
  }
  auto render = [width](const std::vector<std::pair<std::string, std::string>>& rows) {
    std::string text;
    for (const auto& [left, right] : rows) {
      absl::StrAppend(&text, "  ", left, std::string(width - left.size() + 2, ' '), right, "\n");
    }
    return text;
  };

  std::string help = absl::StrCat(usage, "\n", summary_, "\n");
  if (!argument_rows.empty()) absl::StrAppend(&help, "\narguments:\n", render(argument_rows));
  absl::StrAppend(&help, "\nflags:\n", render(flag_rows));
  if (!examples_.empty()) {
    absl::StrAppend(&help, "\nexamples:\n");
    for (const std::string& example : examples_) absl::StrAppend(&help, "  ", example, "\n");
  }
  return help;
}

}  // namespace castor::tools
