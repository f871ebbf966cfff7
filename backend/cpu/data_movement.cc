// CPU kernels: data_movement family (ops of graph/ops/data_movement.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterDataMovementKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
