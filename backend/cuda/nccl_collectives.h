// The CUDA backend's device collectives (backend/device_collectives.h) on
// NCCL. NCCL is not linked: nccl_collectives.cc opens libnccl.so.2 with
// dlopen the first time a data-parallel run asks for it (torch's wheels,
// the CUDA toolkit and NVIDIA's packages all ship it under that name), so
// the module loads, and trains on one GPU, where NCCL is missing.
//
// This header includes CUDA headers and is only for backend/cuda/.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend/device_collectives.h"

namespace castor::cuda {

class CudaBackend;

// The collectives of `backend` (which must outlive them and their groups);
// nothing is loaded before their Load().
std::unique_ptr<DeviceCollectives> MakeNcclCollectives(CudaBackend& backend);

// Opens NCCL from `file` and checks its version as Load() does, without a
// device: "NCCL 2.28.9", or the error Load() would give. The module's entry
// point for castor::LoadCudaCollectivesLibrary (backend/cuda_backend.h).
absl::StatusOr<std::string> LoadNcclLibrary(const std::string& file);

}  // namespace castor::cuda
