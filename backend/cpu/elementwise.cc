// CPU kernels: elementwise family (ops of graph/ops/elementwise.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterElementwiseKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
