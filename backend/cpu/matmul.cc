// CPU kernels: matmul family (ops of graph/ops/matmul.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterMatMulKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
