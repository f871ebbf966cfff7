// A small declarative argument parser for `castor` subcommands.
//
// A subcommand keeps its settings in an options struct whose member
// initializers are the defaults, and binds each positional and flag to a
// member:
//
//   struct InspectOptions { std::string model; std::string format = "text"; };
//   InspectOptions options;
//   ArgParser parser("castor inspect", "Shows a model's graph.");
//   parser.AddPositional("MODEL", "the ONNX model file", &options.model)
//       .AddEnum("format", {"text", "json", "dot"}, "output format", &options.format);
//   CASTOR_ASSIGN_OR_RETURN(ParseOutcome outcome, parser.Parse(args));
//
// Accepted forms: `--flag value` and `--flag=value` (and `-o value` for a
// flag given a short name); switches `--x` and
// `--no-x` (or `--x=true|false`); repeated flags `--input A --input B`
// (each adds one element; given values replace the default list); `--`
// ends the flags (later arguments are positional); `-h`/`--help` anywhere
// before `--` asks for help. Errors name the flag or argument and say what
// was expected; an unknown flag gets a "did you mean" suggestion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castor::tools {

// The kind of value a flag takes (shown in --help).
enum class FlagKind { kString, kInt, kFloat, kSwitch, kEnum, kRepeated };
const char* FlagKindName(FlagKind kind);

// What Parse found: run the command, or print its help.
enum class ParseOutcome { kRun, kHelp };

class ArgParser {
 public:
  // `command` is how the user invokes it ("castor inspect"); `summary` is
  // the paragraph --help shows under the usage line.
  ArgParser(std::string command, std::string summary);

  // Positionals, in order. Required ones must come before optional ones.
  ArgParser& AddPositional(std::string name, std::string help, std::string* target);
  ArgParser& AddOptionalPositional(std::string name, std::string help, std::string* target);

  // Flags, named without the leading dashes. The target's current value is
  // the default (and --help shows it). `value_name` names the value in
  // --help ("FILE", "N").
  ArgParser& AddString(std::string name, std::string value_name, std::string help,
                       std::string* target);
  ArgParser& AddInt(std::string name, std::string value_name, std::string help, int64_t* target);
  ArgParser& AddFloat(std::string name, std::string value_name, std::string help, double* target);
  ArgParser& AddSwitch(std::string name, std::string help, bool* target);
  ArgParser& AddEnum(std::string name, std::vector<std::string> allowed, std::string help,
                     std::string* target);
  ArgParser& AddRepeated(std::string name, std::string value_name, std::string help,
                         std::vector<std::string>* target);
  // Gives the flag added last a one-letter form: `-o FILE` for `--output FILE`.
  ArgParser& WithShortName(char letter);
  // A usage example shown at the end of --help.
  ArgParser& AddExample(std::string command_line);

  // Parses the arguments after the subcommand name. On error the targets may
  // be partly assigned. InvalidArgument errors are one line each.
  absl::StatusOr<ParseOutcome> Parse(const std::vector<std::string>& args);

  // Usage, summary, arguments, flags (each with kind, default and help),
  // examples.
  std::string Help() const;
  const std::string& command() const { return command_; }

  // True if a flag named `name` was given on the command line (valid after
  // Parse).
  bool WasGiven(const std::string& name) const;

 private:
  struct Positional {
    std::string name;
    std::string help;
    std::string* target;
    bool required;
  };
  struct Flag {
    std::string name;
    FlagKind kind;
    std::string value_name;
    std::string help;
    std::vector<std::string> allowed;  // kEnum
    std::string default_text;          // for --help
    void* target;
    bool given = false;
    char short_name = 0;  // 'o' for -o; 0 when none
  };

  Flag& AddFlag(std::string name, FlagKind kind, std::string value_name, std::string help,
                void* target);
  Flag* FindFlag(const std::string& name);
  absl::Status SetValue(Flag& flag, const std::string& value);
  absl::Status UnknownFlagError(const std::string& arg) const;

  std::string command_;
  std::string summary_;
  std::vector<Positional> positionals_;
  std::vector<Flag> flags_;
  std::vector<std::string> examples_;
};

// The candidate closest to `word` by edit distance (a transposition counts
// as one edit), if close enough to be a likely typo; "" otherwise.
std::string ClosestMatch(const std::string& word, const std::vector<std::string>& candidates);

// Optimal-string-alignment distance: insertions, deletions, substitutions
// and adjacent transpositions each cost 1.
int EditDistance(const std::string& a, const std::string& b);

}  // namespace castor::tools
