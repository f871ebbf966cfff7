// The `castor` command-line program: subcommand dispatch and the
// conventions every subcommand shares (exit codes, the opening: parsing,
// --help and the error line; --policy / --policy-file).
//
// Adding a subcommand `castor x`:
//   1. Write tools/x_command.h and tools/x_command.cc with
//      `int RunX(const std::vector<std::string>& args, std::ostream& out,
//      std::ostream& err)`: an options struct and an ArgParser
//      ("castor x", tools/args.h) for its flags, then the shared opening:
//
//        const Command command(parser, out, err);
//        if (std::optional<int> done = command.Parse(args)) return *done;
//        ...
//        if (bad) return command.Fail(kExitBadInput, "what is wrong");
//
//      Library work (anything a test or another command could call) goes in
//      graph/, passes/, backend/ or training/; the command file keeps flags
//      and printing.
//   2. Add one line to the table in cli.cc.
//   3. Add tests/x_command_test.cc (the CMake and Bazel globs pick it up).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "passes/policy.h"
#include "tools/args.h"

namespace castor::tools {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // the check ran and found a problem
inline constexpr int kExitBadInput = 2;   // unreadable/invalid input or flags

// The opening every subcommand shares: parsing its flags, --help, and the
// error line `castor x: error: MESSAGE` (the parser's command name).
class Command {
 public:
  Command(ArgParser& parser, std::ostream& out, std::ostream& err)
      : parser_(parser), out_(out), err_(err) {}

  // Parses `args`. nullopt: go on and run the command. Otherwise the exit
  // code to return at once: kExitOk after printing --help on `out`, or
  // kExitBadInput after printing the parse error.
  std::optional<int> Parse(const std::vector<std::string>& args) const;

  // Prints `castor x: error: MESSAGE` on `err`, on one line (OneLine);
  // returns `code`.
  int Fail(int code, absl::string_view message) const;
  int Fail(int code, const absl::Status& status) const { return Fail(code, status.message()); }

  // "castor x".
  const std::string& name() const { return parser_.command(); }

 private:
  ArgParser& parser_;
  std::ostream& out_;
  std::ostream& err_;
};

// `text` on one line: newlines, tabs and other control characters
// escaped (\n, \r, \t, \xNN), so a name holding them cannot forge or
// split an error line.
std::string OneLine(absl::string_view text);

// --policy NAME / --policy-file FILE as a command resolves them.
struct PolicyFlags {
  std::string name;  // --policy; "" when not given
  std::string file;  // --policy-file; "" when not given
  // Whether errors name the flag ("--policy NAME: ...", "--policy-file:
  // ...") or pass Policy::Builtin's and Policy::LoadFile's message on as is.
  bool name_the_flag = true;
  // A --policy value that is no policy but the command's own word (export's
  // "recorded"): it resolves to nullopt. "" when none.
  std::string keyword;
  // Added after a --policy NAME error (export: " (or 'recorded': ...)").
  std::string hint;
};

// The policy the flags ask for; nullopt when neither flag is given (or
// --policy is the keyword). Both given: InvalidArgument "give --policy or
// --policy-file, not both".
absl::StatusOr<std::optional<Policy>> ResolvePolicyFlags(const PolicyFlags& flags);

// A subcommand's entry point: `args` are the arguments after its name;
// reports go to `out`, diagnostics to `err`; returns an exit code.
using SubcommandFn = int (*)(const std::vector<std::string>& args, std::ostream& out,
                             std::ostream& err);

struct Subcommand {
  const char* name;     // "inspect"
  const char* summary;  // one line for `castor --help`
  SubcommandFn run;
};

// Every subcommand, in the order `castor --help` lists them.
const std::vector<Subcommand>& Subcommands();

// The top-level usage text (`castor --help`).
std::string TopLevelHelp();

// Runs the program on `args` (argv without argv[0]).
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// main(): RunCli on argv with std::cout / std::cerr.
int Main(int argc, char** argv);

}  // namespace castor::tools
