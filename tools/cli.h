// The `castor` command-line program: subcommand dispatch and the
// conventions every subcommand shares (exit codes, error lines, --help).
//
// Adding a subcommand: write `int RunX(const std::vector<std::string>& args,
// std::ostream& out, std::ostream& err)` (parsing its flags with
// tools/args.h), and add one line to the table in cli.cc.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace castor::tools {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // the check ran and found a problem
inline constexpr int kExitBadInput = 2;   // unreadable/invalid input or flags

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
