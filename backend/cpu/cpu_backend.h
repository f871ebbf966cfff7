// The CPU backend: host memory, kernels in backend/cpu/ (one file per op
// family, registered in cpu_backend.cc), threads from parallel.h and
// OpenBLAS. It is the reference every other backend is checked against.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/backend.h"

namespace castor {

struct CpuBackendOptions {
  int num_threads = 0;  // 0: all hardware threads
  // The most bytes the backend holds at once; 0: the CASTOR_MEMORY_LIMIT
  // environment variable (bytes, or with a K/M/G/T suffix), else the
  // memory Linux reports available (MemAvailable) when the backend is made.
  // An allocation past it fails with a clear error instead of the kernel's
  // OOM killer ending the process once the pages are touched.
  int64_t memory_limit_bytes = 0;
};

// The most threads a CpuBackend runs (a pool thread per thread).
inline constexpr int64_t kMaxCpuThreads = 1024;

// Checks a --threads value: 0 (all hardware threads) to kMaxCpuThreads;
// the error names the flag.
absl::Status CheckCpuThreadsFlag(int64_t threads);

// The budget CpuBackendOptions{} gets: CASTOR_MEMORY_LIMIT, else
// MemAvailable (0 when neither can be read: no limit). An unparsable
// CASTOR_MEMORY_LIMIT is an error naming it.
absl::StatusOr<int64_t> DefaultCpuMemoryLimit();

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
  bool synchronous() const override { return true; }
  // BatchNormalization's training kernels and their gradient sum their
  // statistics across the ranks when a cross-rank sum is installed.
  bool supports_cross_rank_sum() const override { return true; }
  StepKernels* step_kernels() override;

  int num_threads() const { return num_threads_; }
  int64_t memory_limit_bytes() const { return memory_limit_bytes_; }  // 0: none
  int64_t bytes_in_use() const;

 private:
  int num_threads_;
  int64_t memory_limit_bytes_ = 0;
  mutable std::mutex mutex_;
  int64_t bytes_in_use_ = 0;
  absl::flat_hash_map<void*, int64_t> sizes_;  // every live allocation
};

}  // namespace castor
