// Collectives in a backend's own memory (issue #31): what lets a
// data-parallel run average its gradients where they are, instead of
// copying them to the host for the communicator (training/distributed/).
// A backend offers them through Backend::device_collectives(); the CUDA
// backend does, with NCCL (backend/cuda/nccl_collectives.cc), which it
// loads at run time, so a machine without NCCL still trains on one GPU.
//
// A group forms in three moves, each rank at the same point of its run
// (training/distributed/device_group.h does it over the host
// communicator): every rank Load()s the library; rank 0 draws a NewGroupId
// and the others receive its bytes; every rank Joins with them.
// Then AverageInPlace queues an average of several buffers at once, in
// the backend's stream order, and Wait bounds how long the host waits for
// it: a peer that died or hangs makes the group fail (and abort) within
// the timeout, never hang. Every error names the rank ("rank 1 of 2: ").
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/kernel.h"

namespace castor {

// One rank's membership of a joined group. It uses its backend's device
// and stream, so it must not outlive the backend; one host thread at a
// time drives it (the one that drives the backend).
class DeviceCollectiveGroup {
 public:
  virtual ~DeviceCollectiveGroup() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The library and its version, e.g. "NCCL 2.28.9".
  virtual std::string engine() const = 0;

  // Queues, after the work already queued on the backend, the average
  // over the ranks of each of `buffers` in place (float32, float16 or
  // bfloat16; every rank passes the same dtypes and sizes in the same
  // order), all in one group. Every rank ends with the same bits; an inf or
  // NaN on any rank reaches every rank. Does not wait for the device.
  // `what` names the step in errors.
  virtual absl::Status AverageInPlace(const std::vector<TensorView>& buffers,
                                      const std::string& what) = 0;
  // Waits until everything AverageInPlace queued since the last Wait is
  // done, at most the group's timeout; returns the seconds it took on the
  // device (waiting for the slowest rank included; 0 when nothing was
  // queued). A timeout or a failure the library reports aborts the group:
  // this and every later call fail, naming the rank.
  virtual absl::StatusOr<double> Wait(const std::string& what) = 0;
};

// What a backend offers to form groups (owned by the backend).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;

  // The library, e.g. "NCCL", for messages before it is loaded.
  virtual std::string library() const = 0;
  // Loads the library (once; later calls give the same answer): OK, or
  // FailedPrecondition saying what is missing, e.g. "data-parallel
  // training on cuda needs NCCL (libnccl.so.2): <the loader's error>".
  virtual absl::Status Load() = 0;
  // The size of a group id, the same on every rank.
  virtual size_t group_id_bytes() const = 0;
  // A new group id (rank 0 draws it), group_id_bytes() long.
  virtual absl::StatusOr<std::string> NewGroupId() = 0;
  // Joins the group `id` names as `rank` of `world_size`, on this backend's
  // device; waits for every rank to join, at most `timeout` (which also
  // bounds every Wait of the group).
  virtual absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> Join(
      const std::string& id, int rank, int world_size, std::chrono::milliseconds timeout) = 0;
};

}  // namespace castor
