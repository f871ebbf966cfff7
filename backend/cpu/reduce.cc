// CPU kernels: reduce family (ops of graph/ops/reduce.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterReduceKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
