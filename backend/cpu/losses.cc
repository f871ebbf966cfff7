// CPU kernels: losses family (ops of graph/ops/losses.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterLossKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
