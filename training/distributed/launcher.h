// `castor train --nproc N`: starts N local ranks of the same command (this
// executable again, with RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
// MASTER_PORT set, as torchrun would), waits for them, and reports the
// first rank that failed. A rank that fails makes the others stop: they
// fail their next collective within the communicator's timeout; any still
// running `grace` after the first failure are killed, so the launcher
// never hangs; and the ranks die with the launcher.
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castor::distributed {

// A TCP port on 127.0.0.1 that nothing listens on right now.
absl::StatusOr<int> FreeLoopbackPort();

// The path of the running executable (/proc/self/exe).
absl::StatusOr<std::string> CurrentExecutable();

// Runs `executable` with `arguments` (argv[1...]) as ranks 0..nproc-1 and
// waits for all of them. Returns 0 when every rank exits 0; otherwise the
// exit code of the first rank that failed (1 for one killed by a signal),
// after writing "castor train: rank R of N exited with code C" (or "was
// killed by signal S") to `err`.
int LaunchLocalRanks(const std::string& executable, const std::vector<std::string>& arguments,
                     int nproc, std::chrono::milliseconds grace, std::ostream& err);

// `arguments` without "--nproc N" / "--nproc=N".
std::vector<std::string> WithoutNprocFlag(const std::vector<std::string>& arguments);

}  // namespace castor::distributed
