// Conversion of device buffers between the CUDA float types (float,
// __half, __nv_bfloat16) through float32: widening parameters to float32
// staging buffers, and rounding float32 accumulators (atomicAdd scratch,
// statistics) once into an output's dtype.
//
//   CASTOR_RETURN_IF_ERROR(ConvertFloats(ctx, accumulator, n, dx->as<T>()));
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "backend/cuda/cuda_common.cuh"

namespace castor::cuda {

// dst[i] = src[i] for i < n, through float32 (exact when widening; 16-bit
// results round to nearest even).
template <typename Src, typename Dst>
__global__ void ConvertFloatsKernel(const Src* __restrict__ src, int64_t n,
                                    Dst* __restrict__ dst) {
  CASTOR_GRID_STRIDE(i, n) { dst[i] = FromFloat<Dst>(ToFloat(src[i])); }
}

// Queues ConvertFloatsKernel over the `n` elements of `src` and `dst`
// (device buffers that do not overlap) on the node's stream; a launch error
// is the node's.
template <typename Src, typename Dst>
absl::Status ConvertFloats(const KernelContext& ctx, const Src* src, int64_t n, Dst* dst) {
  if (n == 0) return absl::OkStatus();
  ConvertFloatsKernel<Src, Dst><<<Blocks(n), kThreads, 0, Stream(ctx)>>>(src, n, dst);
  return CheckLaunch(ctx);
}

}  // namespace castor::cuda
