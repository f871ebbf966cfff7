// Registration of the CPU kernel families, one per file in backend/cpu/,
// mirroring graph/ops/. Each registers the kernels of its ops, castor's
// gradient ops (com.castor) included, as backend/cuda/ does; the conv,
// pool and normalization families keep theirs in a file of their own
// (conv_grad.cc, pool_grad.cc, normalization_grad.cc), registered apart.
#pragma once

#include "backend/kernel.h"

namespace castor::cpu {

void RegisterElementwiseKernels(KernelTable& table);
void RegisterMatMulKernels(KernelTable& table);
void RegisterEinsumKernels(KernelTable& table);
void RegisterConvKernels(KernelTable& table);
void RegisterConvGradKernels(KernelTable& table);
void RegisterPoolKernels(KernelTable& table);
void RegisterPoolGradKernels(KernelTable& table);
void RegisterNormalizationKernels(KernelTable& table);
void RegisterNormalizationGradKernels(KernelTable& table);
void RegisterSoftmaxKernels(KernelTable& table);
void RegisterLossKernels(KernelTable& table);
void RegisterTrainingKernels(KernelTable& table);
void RegisterReduceKernels(KernelTable& table);
void RegisterShapeKernels(KernelTable& table);
void RegisterDataMovementKernels(KernelTable& table);
void RegisterResizeKernels(KernelTable& table);
void RegisterMiscKernels(KernelTable& table);

}  // namespace castor::cpu
