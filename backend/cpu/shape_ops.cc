// CPU kernels: shape_ops family (ops of graph/ops/shape_ops.cc).
#include "backend/cpu/cpu_kernels.h"

namespace castor::cpu {

void RegisterShapeKernels(KernelTable& table) { (void)table; }

}  // namespace castor::cpu
