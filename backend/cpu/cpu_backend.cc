// CpuBackend (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/parallel.h"

namespace castor {

CpuBackend::CpuBackend(CpuBackendOptions options)
    : num_threads_(options.num_threads > 0
                       ? options.num_threads
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  cpu::SetNumThreads(num_threads_);
}

absl::StatusOr<void*> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cpu: out of memory allocating ", bytes,
                                                     " bytes"));
  }
  return p;
}

void CpuBackend::Free(void* data) { std::free(data); }

absl::Status CpuBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::CopyWithin(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

const KernelTable& CpuBackend::kernels() const {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    cpu::RegisterElementwiseKernels(*t);
    cpu::RegisterMatMulKernels(*t);
    cpu::RegisterConvKernels(*t);
    cpu::RegisterConvGradKernels(*t);
    cpu::RegisterPoolKernels(*t);
    cpu::RegisterPoolGradKernels(*t);
    cpu::RegisterNormalizationKernels(*t);
    cpu::RegisterNormalizationGradKernels(*t);
    cpu::RegisterSoftmaxKernels(*t);
    cpu::RegisterLossKernels(*t);
    cpu::RegisterTrainingKernels(*t);
    cpu::RegisterReduceKernels(*t);
    cpu::RegisterShapeKernels(*t);
    cpu::RegisterDataMovementKernels(*t);
    cpu::RegisterResizeKernels(*t);
    cpu::RegisterMiscKernels(*t);
    return t;
  }();
  return *table;
}

}  // namespace castor
