// DescribeCudaProbe: the human-readable form of a CudaProbe.
#include "backend/cuda_probe.h"

#include "absl/strings/str_cat.h"

namespace castor {

std::string DescribeCudaProbe(const CudaProbe& probe) {
  if (!probe.compiled) return "CUDA backend: not compiled in (built without nvcc)";
  const std::string module =
      probe.module_path.empty() ? "" : absl::StrCat(" (", probe.module_path, ")");
  if (!probe.usable) {
    return absl::StrCat("CUDA backend: compiled", module, ", no usable GPU (", probe.reason, ")");
  }
  return absl::StrCat("CUDA backend", module, ": ", probe.device_count,
                      " device(s); device 0: ", probe.device_name, ", compute capability ",
                      probe.compute_capability_major, ".", probe.compute_capability_minor);
}

}  // namespace castor
