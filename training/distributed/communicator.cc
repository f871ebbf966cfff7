// The group configuration from the environment, and Connect where castor
// was built without a collective library (see communicator.h).
#include "training/distributed/communicator.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace castor::distributed {

std::string RankPrefix(int rank, int world_size) {
  return absl::StrCat("rank ", rank, " of ", world_size, ": ");
}

const std::vector<Launcher>& Launchers() {
  static const std::vector<Launcher> launchers = {
      {"torchrun", kRankEnv, kWorldSizeEnv, "LOCAL_RANK", "LOCAL_WORLD_SIZE", 0},
      {"Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", kDefaultMasterPort},
      {"MPICH's or Intel MPI's mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
       "MPI_LOCALNRANKS", kDefaultMasterPort},
  };
  return launchers;
}

absl::StatusOr<std::optional<DistributedConfig>> ConfigFromEnvironment(
    std::chrono::milliseconds timeout, const std::function<const char*(const char*)>& lookup) {
  auto get = [&lookup](const char* name) -> const char* {
    const char* value = lookup ? lookup(name) : std::getenv(name);
    return value != nullptr && value[0] != '\0' ? value : nullptr;
  };
  // The first launcher whose variables are there (torchrun's win, so a
  // user can always say RANK/WORLD_SIZE).
  const Launcher* launcher = nullptr;
  for (const Launcher& candidate : Launchers()) {
    if (get(candidate.rank_variable) != nullptr || get(candidate.world_size_variable) != nullptr) {
      launcher = &candidate;
      break;
    }
  }
  if (launcher == nullptr) return std::nullopt;
  const std::string rank_name = launcher->rank_variable;
  const std::string world_name = launcher->world_size_variable;
  const char* rank_text = get(launcher->rank_variable);
  const char* world_text = get(launcher->world_size_variable);
  if (rank_text == nullptr || world_text == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        rank_text == nullptr ? world_name : rank_name, " is set but ",
        rank_text == nullptr ? rank_name : world_name,
        " is not: a distributed run needs both (", rank_name, " in [0, ", world_name, "), as ",
        launcher->name, " sets them), or neither for a run on its own"));
  }
  DistributedConfig config;
  config.timeout = timeout;
  if (!absl::SimpleAtoi(world_text, &config.world_size) || config.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(world_name, "=", world_text, ": expected an integer >= 1"));
  }
  if (!absl::SimpleAtoi(rank_text, &config.rank) || config.rank < 0 ||
      config.rank >= config.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(rank_name, "=", rank_text,
                                                   ": expected an integer in [0, ",
                                                   config.world_size, ") (", world_name, "=",
                                                   world_text, ")"));
  }
  if (config.world_size == 1) return std::nullopt;
  const std::string prefix = RankPrefix(config.rank, config.world_size);
  // The ranks on this host, when the launcher says.
  config.local_rank = config.rank;
  config.local_world_size = config.world_size;
  const char* local_rank_text = get(launcher->local_rank_variable);
  const char* local_size_text = get(launcher->local_size_variable);
  if (local_size_text != nullptr &&
      (!absl::SimpleAtoi(local_size_text, &config.local_world_size) ||
       config.local_world_size < 1 || config.local_world_size > config.world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, launcher->local_size_variable, "=", local_size_text,
                     ": expected an integer in [1, ", config.world_size, "] (the ranks on "
                     "this host)"));
  }
  if (local_rank_text == nullptr) {
    // No local rank (with a local size, or none): ranks placed host by host.
    config.local_rank = config.rank % config.local_world_size;
  } else if (!absl::SimpleAtoi(local_rank_text, &config.local_rank) || config.local_rank < 0 ||
             config.local_rank >= config.local_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, launcher->local_rank_variable, "=", local_rank_text,
                     ": expected an integer in [0, ", config.local_world_size, ")"));
  }
  if (const char* addr = get(kMasterAddrEnv)) {
    config.master_addr = addr;
  } else if (config.local_world_size < config.world_size) {
    // Fewer ranks on this host than in all: several hosts, where 127.0.0.1
    // is no meeting point.
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "the ", config.world_size, " ranks run on several hosts (",
        launcher->local_size_variable, "=", local_size_text,
        "): set MASTER_ADDR to rank 0's host for every rank (mpirun -x MASTER_ADDR=HOST "
        "-x MASTER_PORT=PORT)"));
  }
  const char* port_text = get(kMasterPortEnv);
  if (port_text == nullptr && launcher->default_master_port != 0) {
    config.master_port = launcher->default_master_port;
    return config;
  }
  if (port_text == nullptr || !absl::SimpleAtoi(port_text, &config.master_port) ||
      config.master_port < 1 || config.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "MASTER_PORT=", port_text == nullptr ? "(unset)" : port_text,
                     ": expected the port rank 0 listens on, an integer in [1, 65535]"));
  }
  return config;
}

#ifndef CASTOR_HAVE_GLOO
bool CollectivesAvailable() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> Connect(const DistributedConfig& config) {
  return absl::UnimplementedError(absl::StrCat(
      RankPrefix(config.rank, config.world_size),
      "this castor was built without Gloo (install libgloo-dev and rebuild): it trains on one "
      "process only (unset RANK and WORLD_SIZE)"));
}
#endif

}  // namespace castor::distributed
