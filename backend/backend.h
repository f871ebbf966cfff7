// The narrow backend interface (DESIGN.md "Core abstractions", after
// ggml-backend): memory, host copies, which nodes it can run, running one
// node's kernel, synchronisation, the end of a training step, (where the
// device has it) recording queued work once to replay it, the
// cross-rank sums of synchronised BatchNormalization and (where the
// backend has them) collectives in its own memory. Everything
// above it (the executor's plan, buffer reuse, the training loop) is
// backend-neutral.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/kernel.h"
#include "backend/step_kernels.h"

namespace castor {

class DeviceCollectives;  // backend/device_collectives.h

// Work a backend recorded between BeginCapture and EndCapture (a CUDA
// graph). Replay queues the same kernels on the same buffers again, reading
// whatever those buffers hold by then; it does not wait for the device.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual absl::Status Replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0", ...
  virtual std::string name() const = 0;

  // Memory in this backend's address space, aligned to at least 64 bytes.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyWithin(void* dst, const void* src, size_t bytes) = 0;

  // The kernels this backend runs.
  virtual const KernelTable& kernels() const = 0;
  // OK when a kernel supports `node`, else the reason (names node and op).
  absl::Status Supports(const Node& node) const { return kernels().Find(node).status(); }

  // Waits until all queued work is done (a no-op on the CPU).
  virtual absl::Status Synchronize() = 0;
  // Whether a kernel's work is done when its call returns (the CPU), so a
  // buffer can be read as soon as its node ran; false where kernels are
  // queued (CUDA streams).
  virtual bool synchronous() const { return false; }

  // The end of a training step in this backend's memory (unscale and check,
  // loss-scale update, multi-tensor optimizer); nullptr when the backend
  // cannot train.
  virtual StepKernels* step_kernels() { return nullptr; }

  // Recording. Between BeginCapture and EndCapture the work queued on this
  // backend (kernels, CopyWithin, CopyFromHost from a copy of the source
  // taken at the call) is recorded instead of run; reading the backend on
  // the host (CopyToHost, Synchronize) fails, and so fails the capture.
  // Memory allocated while recording stays with the backend for as long as
  // it lives, so a recording never reads memory given back to the device.
  // The caller keeps every buffer the recording uses alive and in place
  // while it replays. A backend that cannot record says why in
  // CaptureUnsupportedReason (empty when it can).
  virtual std::string CaptureUnsupportedReason() const {
    return "the " + name() + " backend runs each kernel as it is queued";
  }
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError(CaptureUnsupportedReason());
  }
  virtual absl::StatusOr<std::unique_ptr<CapturedWork>> EndCapture() {
    return absl::UnimplementedError(CaptureUnsupportedReason());
  }
  // Ends a capture that failed part way, dropping what was recorded.
  virtual void AbortCapture() {}

  // Data-parallel training with synchronised BatchNormalization
  // (--sync-batchnorm): sums `count` doubles in place across the ranks,
  // `what` naming them in errors. The trainer installs it on a backend
  // whose batch-statistics kernels use it (supports_cross_rank_sum); when
  // it is empty, kernels use this rank's batch alone.
  using CrossRankSum =
      std::function<absl::Status(double* values, size_t count, const std::string& what)>;
  virtual bool supports_cross_rank_sum() const { return false; }
  void set_cross_rank_sum(CrossRankSum sum) { cross_rank_sum_ = std::move(sum); }
  const CrossRankSum& cross_rank_sum() const { return cross_rank_sum_; }

  // Data-parallel training: collectives that average buffers in this
  // backend's memory across the ranks (backend/device_collectives.h; the
  // CUDA backend's NCCL), owned by the backend; nullptr when it has none
  // and the trainer averages through the host.
  virtual DeviceCollectives* device_collectives() { return nullptr; }

 private:
  CrossRankSum cross_rank_sum_;
};

}  // namespace castor
