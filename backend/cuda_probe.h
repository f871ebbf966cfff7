// Asks whether the CUDA backend is compiled in and whether a usable GPU is
// present. Implemented by backend/cuda_loader.cc in every build, so callers
// never need #ifdefs: it asks the NVIDIA driver for a device first and only
// then loads the CUDA backend's module, whose probe (backend/cuda/
// cuda_probe.cu) describes the device. Without a GPU every CUDA call returns
// an error code; the probe turns it into `usable == false` with the reason,
// never a crash.
#pragma once

#include <string>

namespace castor {

struct CudaProbe {
  bool compiled = false;  // built with the CUDA backend
  std::string module_path;  // the backend's module libcastor_cuda.so, found (not yet loaded)
  bool usable = false;    // a device can be used now
  std::string reason;     // why not usable (driver/runtime error text)
  int device_count = 0;
  std::string device_name;           // of device 0
  int compute_capability_major = 0;  // of device 0
  int compute_capability_minor = 0;
  // Filled in once a device was found (the module's probe ran).
  int runtime_version = 0;  // e.g. 13000
  int driver_version = 0;
};

CudaProbe ProbeCuda();

// One line for `castor --version` and logs, e.g.
// "CUDA backend: compiled (/opt/castor/libcastor_cuda.so), no usable GPU (no
// NVIDIA driver: libcuda.so.1: cannot open shared object file: ...)" or
// "CUDA backend: 1 device(s); device 0: NVIDIA H200, compute capability 9.0
// (module /opt/castor/libcastor_cuda.so)".
std::string DescribeCudaProbe(const CudaProbe& probe);

}  // namespace castor
