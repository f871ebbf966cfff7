// CUDA kernels: softmax family (ops of graph/ops/softmax.cc and their
// com.castor gradients): Softmax, LogSoftmax, SoftmaxGrad, LogSoftmaxGrad.
//
// Every op normalises lines: the input is [outer, n, inner] and a line is
// the n values of one (outer, inner) pair, `inner` apart. Softmax and
// LogSoftmax follow backend/cpu/softmax.cc: before opset 13 the input is
// coerced to 2-D [prod(dims[:axis]), prod(dims[axis:])] (axis default 1),
// from opset 13 the line runs along the one axis `axis` (default -1). The
// gradients always use one axis (default -1):
//   SoftmaxGrad:    dX = Y * (dY - sum(dY * Y))
//   LogSoftmaxGrad: dX = dY - exp(Y) * sum(dY)
// Arithmetic is float32 for float32/float16/bfloat16 storage; the forward
// ops subtract the line maximum before exp, and each output rounds once.
//
// A line operation (LineOp below) is run by one of three launch shapes:
// a warp per line (contiguous lines of up to kWarpLineLimit values), a block
// per line (long lines, or few strided lines), or a thread per line (many
// strided lines: neighbouring threads read neighbouring columns, so the
// loads coalesce). Each reads its whole line (maximum, sum) before it
// writes any of it, and a line is only ever touched by its own warp, block
// or thread, so the forward ops may run in place.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/op_geometry.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

// Contiguous lines up to this length get a warp each; longer ones a block.
constexpr int64_t kWarpLineLimit = 1024;
// Strided lines longer than this get a block each when there are fewer than
// kFewLines of them (too few threads for the thread-per-line shape).
constexpr int64_t kThreadLineLimit = 1024;
constexpr int64_t kFewLines = 4096;

// ---- line operations -----------------------------------------------------------

// A LineOp gives, for element offset i of a line: MaxTerm(i) (reduced with
// max when kNeedsMax), SumTerm(i, max) (reduced with +) and Write(i, max,
// sum), which stores the output element i.

template <typename T, bool kLog>
struct SoftmaxOp {
  static constexpr bool kNeedsMax = true;
  const T* x;
  T* y;
  __device__ float MaxTerm(int64_t i) const { return ToFloat(x[i]); }
  __device__ float SumTerm(int64_t i, float max) const { return expf(ToFloat(x[i]) - max); }
  __device__ void Write(int64_t i, float max, float sum) const {
    const float shifted = ToFloat(x[i]) - max;
    y[i] = FromFloat<T>(kLog ? shifted - logf(sum) : expf(shifted) / sum);
  }
};

template <typename T, bool kLog>
struct SoftmaxGradOp {
  static constexpr bool kNeedsMax = false;
  const T* dy;
  const T* y;
  T* dx;
  __device__ float MaxTerm(int64_t) const { return 0.0f; }
  __device__ float SumTerm(int64_t i, float) const {
    return kLog ? ToFloat(dy[i]) : ToFloat(dy[i]) * ToFloat(y[i]);
  }
  __device__ void Write(int64_t i, float, float sum) const {
    const float yv = ToFloat(y[i]);
    const float g = ToFloat(dy[i]);
    dx[i] = FromFloat<T>(kLog ? g - expf(yv) * sum : yv * (g - sum));
  }
};

// The offset of the first element of line `line` of [outer, n, inner].
__device__ __forceinline__ int64_t LineBase(int64_t line, int64_t n, int64_t inner) {
  return (line / inner) * n * inner + line % inner;
}

// One thread per line.
template <typename Op>
__global__ void LinesByThread(Op op, int64_t lines, int64_t n, int64_t inner) {
  CASTOR_GRID_STRIDE(line, lines) {
    const int64_t base = LineBase(line, n, inner);
    float max = -INFINITY;
    if (Op::kNeedsMax) {
      for (int64_t k = 0; k < n; ++k) max = fmaxf(max, op.MaxTerm(base + k * inner));
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < n; ++k) sum += op.SumTerm(base + k * inner, max);
    for (int64_t k = 0; k < n; ++k) op.Write(base + k * inner, max, sum);
  }
}

// One warp per line; blockDim.x is a multiple of the warp size.
template <typename Op>
__global__ void LinesByWarp(Op op, int64_t lines, int64_t n, int64_t inner) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps_per_block = blockDim.x / kWarpSize;
  const int64_t first = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize;
  const int64_t step = warps_per_block * gridDim.x;
  // Every lane of a warp runs the same iterations (the bound depends on the
  // warp only), so the full-mask shuffles are safe.
  for (int64_t line = first; line < lines; line += step) {
    const int64_t base = LineBase(line, n, inner);
    float max = -INFINITY;
    if (Op::kNeedsMax) {
      for (int64_t k = lane; k < n; k += kWarpSize) max = fmaxf(max, op.MaxTerm(base + k * inner));
      max = WarpMax(max);
    }
    float sum = 0.0f;
    for (int64_t k = lane; k < n; k += kWarpSize) sum += op.SumTerm(base + k * inner, max);
    sum = WarpSum(sum);
    for (int64_t k = lane; k < n; k += kWarpSize) op.Write(base + k * inner, max, sum);
  }
}

// One block per line.
template <typename Op>
__global__ void LinesByBlock(Op op, int64_t lines, int64_t n, int64_t inner) {
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    const int64_t base = LineBase(line, n, inner);
    float max = -INFINITY;
    if (Op::kNeedsMax) {
      for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        max = fmaxf(max, op.MaxTerm(base + k * inner));
      }
      max = BlockMax(max);
    }
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) sum += op.SumTerm(base + k * inner, max);
    // BlockSum returns after a barrier that follows every thread's reads:
    // the whole line has been read before any thread writes.
    sum = BlockSum(sum);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) op.Write(base + k * inner, max, sum);
  }
}

// Runs `op` over the outer * inner lines of n values.
template <typename Op>
absl::Status RunLines(const KernelContext& ctx, const Op& op, int64_t outer, int64_t n,
                      int64_t inner) {
  const int64_t lines = outer * inner;
  if (lines == 0 || n == 0) return absl::OkStatus();
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  const cudaStream_t stream = Stream(ctx);
  if (inner == 1 && n <= kWarpLineLimit) {
    constexpr int64_t kWarpsPerBlock = kThreads / kWarpSize;
    const int64_t blocks = std::min(kMaxBlocks, (lines + kWarpsPerBlock - 1) / kWarpsPerBlock);
    LinesByWarp<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(op, lines, n, inner);
  } else if (inner == 1 || (n > kThreadLineLimit && lines < kFewLines)) {
    const int64_t blocks = std::min(kMaxBlocks, lines);
    LinesByBlock<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(op, lines, n, inner);
  } else {
    LinesByThread<<<Blocks(lines), kThreads, 0, stream>>>(op, lines, n, inner);
  }
  return CheckLaunch(ctx);
}

// ---- Softmax / LogSoftmax --------------------------------------------------------

template <bool kLog>
absl::Status SoftmaxKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::SoftmaxGeometry lines, common::PlanSoftmax(ctx, x.dims));
  const int64_t outer = lines.outer, n = lines.n, inner = lines.inner;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunLines(ctx, SoftmaxOp<T, kLog>{x.as<T>(), y->as<T>()}, outer, n, inner);
  });
}

// ---- SoftmaxGrad / LogSoftmaxGrad --------------------------------------------------

template <bool kLog>
absl::Status SoftmaxGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& y = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::SoftmaxGeometry lines, common::PlanSoftmaxGrad(ctx));
  const int64_t outer = lines.outer, n = lines.n, inner = lines.inner;
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, y.dtype, y.dims));
  return DispatchFloat(ctx, y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunLines(ctx, SoftmaxGradOp<T, kLog>{dy.as<T>(), y.as<T>(), dx->as<T>()}, outer, n,
                    inner);
  });
}

}  // namespace

void RegisterSoftmaxKernels(KernelTable& table) {
  for (const bool log : {false, true}) {
    KernelDef def;
    def.op_type = log ? "LogSoftmax" : "Softmax";
    def.supports = InputDTypeIn(0, CudaFloatDTypes());
    def.run = log ? &SoftmaxKernel<true> : &SoftmaxKernel<false>;
    // Each line is read completely before any of it is written (see top).
    def.in_place_ok = true;
    table.Register(std::move(def));
  }
  table.Register(
      {kCastorDomain, "SoftmaxGrad", FloatDTypesIn(CudaFloatDTypes()), &SoftmaxGradKernel<false>});
  table.Register({kCastorDomain, "LogSoftmaxGrad", FloatDTypesIn(CudaFloatDTypes()),
                  &SoftmaxGradKernel<true>});
}

}  // namespace castor::cuda
