// The CPU backend: host memory, kernels in backend/cpu/ (one file per op
// family, registered in cpu_backend.cc), threads from parallel.h and
// OpenBLAS. It is the reference every other backend is checked against.
#pragma once

#include <string>

#include "backend/backend.h"

namespace castor {

struct CpuBackendOptions {
  int num_threads = 0;  // 0: all hardware threads
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(CpuBackendOptions options = {});

  std::string name() const override { return "cpu"; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* data) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status CopyWithin(void* dst, const void* src, size_t bytes) override;
  const KernelTable& kernels() const override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  StepKernels* step_kernels() override;

  int num_threads() const { return num_threads_; }

 private:
  int num_threads_;
};

}  // namespace castor
