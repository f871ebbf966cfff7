// The narrow backend interface (DESIGN.md "Core abstractions", after
// ggml-backend): memory, host copies, which nodes it can run, running one
// node's kernel, synchronisation, and the end of a training step. Everything above it (the executor's plan,
// buffer reuse, the training loop) is backend-neutral.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/kernel.h"
#include "backend/step_kernels.h"

namespace castor {

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

  // The end of a training step in this backend's memory (unscale and check,
  // loss-scale update, multi-tensor optimizer); nullptr when the backend
  // cannot train.
  virtual StepKernels* step_kernels() { return nullptr; }
};

}  // namespace castor
