// The module's probe (ProbeCuda once the loader has opened the module):
// queries the runtime and device 0. Every call is checked; on a machine
// without a GPU (or driver) the error text becomes the probe's reason. No
// global device state is kept.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"

namespace castor::cuda {

CudaProbe ProbeDevices() {
  CudaProbe probe;
  probe.compiled = true;
  cudaRuntimeGetVersion(&probe.runtime_version);
  if (cudaDriverGetVersion(&probe.driver_version) != cudaSuccess) probe.driver_version = 0;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    probe.reason = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    cudaGetLastError();  // clear the sticky error state for later callers
    return probe;
  }
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, 0);
  if (err != cudaSuccess) {
    probe.reason = cudaGetErrorString(err);
    return probe;
  }
  probe.usable = true;
  probe.device_count = count;
  probe.device_name = prop.name;
  probe.compute_capability_major = prop.major;
  probe.compute_capability_minor = prop.minor;
  return probe;
}

}  // namespace castor::cuda
