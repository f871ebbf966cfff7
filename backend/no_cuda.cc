// ProbeCuda for builds without the CUDA backend (CASTOR_CUDA=OFF or no nvcc).
#include "backend/cuda_probe.h"

namespace castor {

CudaProbe ProbeCuda() {
  CudaProbe probe;
  probe.reason = "castor was built without the CUDA backend";
  return probe;
}

}  // namespace castor
