// The CUDA backend as the rest of castor sees it, without CUDA headers:
// create one (or learn why not), reach its kernel table, and open the
// library of its device collectives (NCCL). Implemented by
// backend/cuda_loader.cc in every build: with CUDA it opens the backend's
// module, libcastor_cuda.so (backend/cuda_module.h), when first needed;
// without CUDA it says so. Callers need no #ifdefs.
//
// A CUDA backend owns one stream, its cuBLAS/cuBLASLt/cuDNN handles and a
// caching pool of device memory; it keeps no global device state, so two
// backends (say, on two devices) never share anything but the driver.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/kernel.h"

namespace castor {

struct CudaBackendOptions {
  int device = 0;
  // float32 MatMul/Gemm/Conv through TF32 tensor cores (faster, ~10-bit
  // mantissa products), and float32 convolutions through cuDNN's FFT and
  // Winograd algorithms as cuDNN ranks them. Off by default: float32 means
  // float32 (on an H200 the exact algorithms made the sample ResNet's
  // float32 training ~30% slower than Winograd's weight gradient).
  bool allow_tf32 = false;
};

// Device memory of one CUDA backend's pool.
struct DeviceMemoryStats {
  int64_t in_use_bytes = 0;    // handed out now
  int64_t peak_in_use_bytes = 0;
  int64_t reserved_bytes = 0;  // held from the driver (in use + cached)
  int64_t device_allocations = 0;  // cudaMalloc calls so far
};

// Whether this build has the CUDA backend compiled in.
bool CudaBackendCompiled();

// A CUDA backend on `options.device`. FailedPrecondition, saying why, when
// castor was built without CUDA, no driver or device is usable, the module
// cannot be loaded, or the device is older than compute capability 8.0 (the
// oldest castor's kernels are built for; it also brings bfloat16 math).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options = {});

// The CUDA backend's kernels. They are host-side descriptions (op, dtypes,
// entry point), so the table exists without a GPU: tools and tests use it
// to check that a graph could run on CUDA. Loads the module (without asking
// for a GPU); FailedPrecondition, saying why, in builds without CUDA or when
// the module cannot be loaded.
absl::StatusOr<const KernelTable*> CudaKernelTable();

// The memory statistics of `backend` when it is a CUDA backend.
absl::StatusOr<DeviceMemoryStats> CudaMemoryStats(const Backend& backend);

// The library of a CUDA backend's device collectives
// (Backend::device_collectives(), used by data-parallel runs): NCCL, which
// the module opens at run time, never links.
inline constexpr char kNcclLibraryFile[] = "libnccl.so.2";

// Opens NCCL as a data-parallel run on CUDA does (from `file`; tests name
// others), without asking for a GPU: its version, e.g. "NCCL 2.28.9", or
// FailedPrecondition "data-parallel training on cuda needs NCCL
// (libnccl.so.2): <why>" (and in builds without the CUDA backend, why not).
// Loads the module.
absl::StatusOr<std::string> LoadCudaCollectivesLibrary(const std::string& file = kNcclLibraryFile);

}  // namespace castor
