// The `castor` command-line program: subcommand dispatch and shared
// conventions (exit codes, error printing).
#pragma once

namespace castor::tools {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // the check ran and found a problem
inline constexpr int kExitBadInput = 2;   // unreadable/invalid input or flags

int Main(int argc, char** argv);

}  // namespace castor::tools
