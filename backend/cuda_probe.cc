// DescribeCudaProbe: the human-readable form of a CudaProbe.
#include "backend/cuda_probe.h"

#include "absl/strings/str_cat.h"

namespace castor {

std::string DescribeCudaProbe(const CudaProbe& probe) {
  if (!probe.compiled) return "CUDA backend: not compiled in (built without nvcc)";
  if (!probe.usable) {
    const std::string module =
        probe.module_path.empty() ? "" : absl::StrCat(" (", probe.module_path, ")");
    return absl::StrCat("CUDA backend: compiled", module, ", no usable GPU (", probe.reason, ")");
  }
  return absl::StrCat("CUDA backend: ", probe.device_count,
                      " device(s); device 0: ", probe.device_name, ", compute capability ",
                      probe.compute_capability_major, ".", probe.compute_capability_minor,
                      " (module ", probe.module_path, ")");
}

}  // namespace castor
