// The group configuration from the environment, and Connect where castor
// was built without a collective library (see communicator.h).
#include "training/distributed/communicator.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace castor::distributed {

std::string RankPrefix(int rank, int world_size) {
  return absl::StrCat("rank ", rank, " of ", world_size, ": ");
}

absl::StatusOr<std::optional<DistributedConfig>> ConfigFromEnvironment(
    std::chrono::milliseconds timeout, const std::function<const char*(const char*)>& lookup) {
  auto get = [&lookup](const char* name) -> const char* {
    const char* value = lookup ? lookup(name) : std::getenv(name);
    return value != nullptr && value[0] != '\0' ? value : nullptr;
  };
  const char* rank_text = get(kRankEnv);
  const char* world_text = get(kWorldSizeEnv);
  if (rank_text == nullptr && world_text == nullptr) return std::nullopt;
  if (rank_text == nullptr || world_text == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        rank_text == nullptr ? "WORLD_SIZE is set but RANK is not"
                             : "RANK is set but WORLD_SIZE is not",
        ": a distributed run needs both (RANK in [0, WORLD_SIZE), as torchrun sets them), or "
        "neither for a run on its own"));
  }
  DistributedConfig config;
  config.timeout = timeout;
  if (!absl::SimpleAtoi(world_text, &config.world_size) || config.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", world_text, ": expected an integer >= 1"));
  }
  if (!absl::SimpleAtoi(rank_text, &config.rank) || config.rank < 0 ||
      config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", rank_text, ": expected an integer in [0, ", config.world_size,
                     ") (WORLD_SIZE=", world_text, ")"));
  }
  if (config.world_size == 1) return std::nullopt;
  if (const char* addr = get(kMasterAddrEnv)) config.master_addr = addr;
  const char* port_text = get(kMasterPortEnv);
  if (port_text == nullptr || !absl::SimpleAtoi(port_text, &config.master_port) ||
      config.master_port < 1 || config.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(RankPrefix(config.rank, config.world_size),
                     "MASTER_PORT=", port_text == nullptr ? "(unset)" : port_text,
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
