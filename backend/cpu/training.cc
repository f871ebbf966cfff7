// CPU kernels: training family (ops of graph/ops/training.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterTrainingKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
