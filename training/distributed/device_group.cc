// JoinDeviceGroup (see device_group.h).
#include "training/distributed/device_group.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"

namespace castor::distributed {

absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> JoinDeviceGroup(
    Backend& backend, Communicator& communicator, std::chrono::milliseconds timeout) {
  const int rank = communicator.rank(), world_size = communicator.world_size();
  const std::string prefix = RankPrefix(rank, world_size);
  DeviceCollectives* collectives = backend.device_collectives();
  // 1. Per rank: 0 none offered, 1 offered and loaded, 2 offered, not loaded.
  absl::Status loaded = collectives != nullptr ? collectives->Load() : absl::OkStatus();
  std::vector<double> states(static_cast<size_t>(world_size), 0.0);
  if (collectives != nullptr) states[static_cast<size_t>(rank)] = loaded.ok() ? 1.0 : 2.0;
  CASTOR_RETURN_IF_ERROR(communicator.AllreduceSum(
      states.data(), states.size(), "whether the ranks have device collectives"));
  // 2.
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat(prefix, loaded.message()));
  }
  std::vector<int> failed;
  int offering = 0;
  for (int r = 0; r < world_size; ++r) {
    const double state = states[static_cast<size_t>(r)];
    if (state == 2.0) failed.push_back(r);
    if (state == 1.0) ++offering;
  }
  if (!failed.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "rank(s) ", absl::StrJoin(failed, ", "), " cannot load ",
        collectives != nullptr ? collectives->library() : "their device collectives",
        " for this data-parallel run (their errors say why)"));
  }
  if (offering < world_size) return nullptr;
  // 3. Rank 0's id: one status byte (1: drawn), then the id.
  std::string message(1 + collectives->group_id_bytes(), '\0');
  absl::Status drawn;
  if (rank == 0) {
    absl::StatusOr<std::string> id = collectives->NewGroupId();
    if (id.ok() && id->size() != collectives->group_id_bytes()) {
      id = absl::InternalError(absl::StrCat("a ", collectives->library(), " group id of ",
                                            id->size(), " bytes, not ",
                                            collectives->group_id_bytes()));
    }
    drawn = id.status();
    if (id.ok()) {
      message[0] = 1;
      message.replace(1, id->size(), *id);
    }
  }
  CASTOR_RETURN_IF_ERROR(communicator.Broadcast(message.data(), message.size(), 0,
                                                absl::StrCat("the ", collectives->library(),
                                                             " group id")));
  if (!drawn.ok()) return absl::Status(drawn.code(), absl::StrCat(prefix, drawn.message()));
  if (message[0] != 1) {
    return absl::UnavailableError(absl::StrCat(prefix, "rank 0 could not create the ",
                                               collectives->library(),
                                               " group (its error says why)"));
  }
  // 4.
  return collectives->Join(message.substr(1), rank, world_size, timeout);
}

}  // namespace castor::distributed
