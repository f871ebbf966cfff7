// Registration of the CUDA kernel families, one per file in backend/cuda/,
// mirroring backend/cpu/. Each registers the kernels of its ops; the CPU
// backend is the reference each is tested against (tests/cuda_*_test.cc).
#pragma once

#include <memory>

#include "backend/kernel.h"
#include "backend/step_kernels.h"

namespace castor::cuda {

class CudaBackend;

void RegisterElementwiseKernels(KernelTable& table);  // elementwise.cu: unary, binary, Cast...
void RegisterReduceKernels(KernelTable& table);       // reduce.cu: Reduce*, ReduceToShapeOf
void RegisterMatMulKernels(KernelTable& table);       // matmul.cu: MatMul, Gemm (cuBLAS)
void RegisterEinsumKernels(KernelTable& table);       // einsum.cu: Einsum (cuBLAS + strided sums)
void RegisterConvKernels(KernelTable& table);         // conv.cu: Conv, ConvGrad (cuDNN)
void RegisterPoolKernels(KernelTable& table);         // pool.cu: pooling and its gradients
void RegisterNormalizationKernels(KernelTable& table);  // normalization.cu: BN, LayerNorm
void RegisterSoftmaxKernels(KernelTable& table);      // softmax.cu: (Log)Softmax and gradients
void RegisterLossKernels(KernelTable& table);         // losses.cu: cross-entropy, NLL
void RegisterShapeKernels(KernelTable& table);        // shape_ops.cu: Reshape, Transpose...
void RegisterResizeKernels(KernelTable& table);       // resize.cu: Resize, ResizeGrad

// step_kernels.cu: unscale-and-check, the step decision, the multi-tensor
// optimizer, on `backend`'s stream.
std::unique_ptr<StepKernels> MakeCudaStepKernels(CudaBackend& backend);

}  // namespace castor::cuda
