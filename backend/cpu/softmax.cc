// CPU kernels: softmax family (ops of graph/ops/softmax.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterSoftmaxKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
