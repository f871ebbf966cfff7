// The seam between castor and its CUDA backend module. The CUDA backend
// (backend/cuda/) is built as a loadable module, libcastor_cuda.so, beside
// the castor executable; backend/cuda_loader.cc opens it on first use, so a
// run that never touches a GPU never maps cuBLAS, cuBLASLt and cuDNN (about
// 150 MiB resident and 50 ms of start-up on a CPU machine).
//
// The module exports one C function returning a CudaModule: the entry
// points backend/cuda_backend.h and backend/cuda_probe.h promise.
// The module is part of one build with the executable that loads it: it
// takes castor's own code (graph/, backend/) from that executable (which
// exports its symbols), so the types passed across are the same types.
// `abi_version`, `castor_version` and `build_id` (drawn once per build
// directory) let the loader refuse a module from another build with a
// clear error rather than a crash.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"
#include "backend/kernel.h"

namespace castor {

// Raised whenever CudaModule or the types it passes change shape.
inline constexpr int kCudaModuleAbiVersion = 2;

struct CudaModule {
  int abi_version;             // kCudaModuleAbiVersion of the module's build
  const char* castor_version;  // CASTOR_VERSION_STRING of the module's build
  const char* build_id;        // CASTOR_BUILD_ID of the module's build directory
  CudaProbe (*probe)();
  absl::StatusOr<std::unique_ptr<Backend>> (*create_backend)(const CudaBackendOptions& options);
  const KernelTable* (*kernel_table)();
  absl::StatusOr<DeviceMemoryStats> (*memory_stats)(const Backend& backend);
  absl::StatusOr<std::string> (*load_collectives_library)(const std::string& file);
};

}  // namespace castor

// The module's one exported entry point (looked up by this name).
#define CASTOR_CUDA_MODULE_ENTRY "castor_cuda_module"
extern "C" const castor::CudaModule* castor_cuda_module();
