// Warp- and block-wide reductions for the CUDA kernels: every lane (warp
// helpers) or thread (block helpers) passes one value and gets back the
// combination of all of them.
//
//   float sum = 0.0f;
//   for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += ToFloat(x[i]);
//   sum = BlockSum(sum);  // the block's total, in every thread
//
// Rules for callers:
// - Warp helpers shuffle with the full mask, so all 32 lanes of the warp
//   must call them together (no lane may have left a loop or branch the
//   others are in). A lane with nothing to contribute passes the identity
//   (0 for sums, -INFINITY for maxima).
// - Block helpers need a 1-D block whose blockDim.x is a multiple of 32, at
//   most 1024, and every thread of the block must call them at the same
//   point (they synchronise the block). They may be called several times in
//   a row, also in a loop with a block-uniform bound; each call begins with
//   a barrier, so it never overwrites the shared scratch a previous call's
//   threads may still be reading. Each call also ends after a barrier that
//   follows every thread's contribution: work a thread did before the call
//   is complete block-wide once any thread returns.
// - The combination order is a fixed butterfly tree (lane i with lane i ^ 16,
//   then ^ 8, ...), so a float sum may differ from a sequential one by
//   rounding only.
//
// Value types: anything __shfl_xor_sync takes (int, unsigned, float,
// double, ...) with a combine functor for it. SumCombine adds any of them;
// MaxCombine takes float or double and ignores NaN (fmaxf: a NaN loses to
// any number); kernels that need NaN-propagating or other combinations pass
// their own functor.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace castor::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarpMask = 0xffffffffu;
// The most warps in a block (1024 threads).
inline constexpr int kMaxBlockWarps = 1024 / kWarpSize;

// a + b.
struct SumCombine {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// The larger of a and b; a NaN loses to a number (fmaxf / fmax).
struct MaxCombine {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};

// The combination of the 32 lanes' `v`, in every lane (xor-shuffle
// butterfly). All 32 lanes of the warp must call it.
template <typename T, typename Combine>
__device__ __forceinline__ T WarpReduce(T v, Combine combine) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = combine(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  return WarpReduce(v, SumCombine());
}

template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  return WarpReduce(v, MaxCombine());
}

// The combination of every thread's `v` over the block, in every thread;
// `identity` is what combining with changes nothing (it pads the partial
// results of absent warps). Every thread of the block must call it; see
// the rules above.
template <typename T, typename Combine>
__device__ __forceinline__ T BlockReduce(T v, Combine combine, T identity) {
  __shared__ T warp_results[kMaxBlockWarps];
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int warps = static_cast<int>(blockDim.x / kWarpSize);
  v = WarpReduce(v, combine);
  __syncthreads();  // every reader of a previous call's warp_results is done
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  // Every warp combines the per-warp results itself, so all threads get the
  // total without a third barrier.
  return WarpReduce(lane < warps ? warp_results[lane] : identity, combine);
}

template <typename T>
__device__ __forceinline__ T BlockSum(T v) {
  return BlockReduce(v, SumCombine(), T(0));
}

// The block's maximum (NaN ignored, as MaxCombine); -INFINITY when every
// thread passes -INFINITY.
template <typename T>
__device__ __forceinline__ T BlockMax(T v) {
  return BlockReduce(v, MaxCombine(), static_cast<T>(-INFINITY));
}

}  // namespace castor::cuda
