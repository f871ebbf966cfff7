// The CUDA backend module's one exported symbol (see backend/cuda_module.h):
// the table of entry points backend/cuda_loader.cc calls once it has opened
// libcastor_cuda.so.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_collectives.h"
#include "backend/cuda_module.h"
#include "graph/version.h"

extern "C" __attribute__((visibility("default"))) const castor::CudaModule* castor_cuda_module() {
  static const castor::CudaModule module = {
      .abi_version = castor::kCudaModuleAbiVersion,
      .castor_version = CASTOR_VERSION_STRING,
      .build_id = CASTOR_BUILD_ID,
      .probe = castor::cuda::ProbeDevices,
      .create_backend = castor::cuda::CreateBackend,
      .kernel_table = castor::cuda::Kernels,
      .memory_stats = castor::cuda::MemoryStats,
      .load_collectives_library = castor::cuda::LoadNcclLibrary,
  };
  return &module;
}
