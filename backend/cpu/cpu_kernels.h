// Registration of the CPU kernel families, one per file in backend/cpu/,
// mirroring graph/ops/. Each registers the kernels of its ops.
#pragma once

#include "backend/kernel.h"

namespace castor::cpu {

void RegisterElementwiseKernels(KernelTable& table);
void RegisterMatMulKernels(KernelTable& table);
void RegisterConvKernels(KernelTable& table);
void RegisterPoolKernels(KernelTable& table);
void RegisterNormalizationKernels(KernelTable& table);
void RegisterSoftmaxKernels(KernelTable& table);
void RegisterLossKernels(KernelTable& table);
void RegisterTrainingKernels(KernelTable& table);
void RegisterReduceKernels(KernelTable& table);
void RegisterShapeKernels(KernelTable& table);
void RegisterDataMovementKernels(KernelTable& table);
void RegisterMiscKernels(KernelTable& table);
void RegisterGradientKernels(KernelTable& table);  // com.castor gradient ops

}  // namespace castor::cpu
