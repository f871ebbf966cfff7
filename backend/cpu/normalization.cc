// CPU kernels: normalization family (ops of graph/ops/normalization.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterNormalizationKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
