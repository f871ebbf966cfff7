// CPU kernels: pool family (ops of graph/ops/pool.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterPoolKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
