// CPU kernels: misc family (ops of graph/ops/misc.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterMiscKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
