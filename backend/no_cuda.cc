// The CUDA entry points for builds without the CUDA backend (CASTOR_CUDA=OFF
// or no nvcc): the probe says so, creating a backend fails saying so.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"

namespace castor {

namespace {
constexpr const char* kNotBuilt = "castor was built without the CUDA backend";
}  // namespace

CudaProbe ProbeCuda() {
  CudaProbe probe;
  probe.reason = kNotBuilt;
  return probe;
}

bool CudaBackendCompiled() { return false; }

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions&) {
  return absl::FailedPreconditionError(kNotBuilt);
}

const KernelTable* CudaKernelTable() { return nullptr; }

absl::StatusOr<DeviceMemoryStats> CudaMemoryStats(const Backend& backend) {
  return absl::InvalidArgumentError(
      absl::StrCat("backend '", backend.name(), "' is not a CUDA backend (", kNotBuilt, ")"));
}

}  // namespace castor
