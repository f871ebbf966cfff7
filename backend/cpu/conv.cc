// CPU kernels: conv family (ops of graph/ops/conv.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterConvKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
