// A data-parallel run's group of device collectives
// (backend/device_collectives.h: NCCL on the CUDA backend), formed over the
// host communicator, so that the trainer averages gradients where they are
// instead of through the host (issue #31). Every rank calls
// JoinDeviceGroup at the same point of its run (Trainer::Create):
//   1. a rank whose backend offers device collectives loads their library;
//      one AllreduceSum tells every rank which ranks offer them and which
//      could not load them;
//   2. when a rank could not, every rank fails: that one with its own
//      error ("data-parallel training on cuda needs NCCL (libnccl.so.2):
//      ..."), the others naming it; when not every rank offers them (under
//      --backend auto some ranks may train on the CPU), every rank gets
//      nullptr and the host path averages for all;
//   3. rank 0 draws a group id and Broadcasts its bytes, with whether it
//      could (if not, every rank fails);
//   4. every rank joins with it, waiting for the others at most `timeout`.
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/device_collectives.h"
#include "training/distributed/communicator.h"

namespace castor::distributed {

// The joined group (which must not outlive `backend`), or nullptr for the
// host path (see above). Errors name this rank.
absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> JoinDeviceGroup(
    Backend& backend, Communicator& communicator, std::chrono::milliseconds timeout);

}  // namespace castor::distributed
