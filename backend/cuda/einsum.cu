// CUDA kernel of Einsum (graph/ops/einsum.cc) for float32 and float16: runs
// the steps of backend/common/einsum_plan.h, the CPU kernel
// (backend/cpu/einsum.cc) being the reference. A strided sum is one thread
// per output element summing in float32 and rounding once; a GEMM is
// castor's cuBLAS entry (row_major_gemm.cuh), strided-batched over the
// batch labels, accumulating in float32.
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/einsum_plan.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/row_major_gemm.cuh"

namespace castor::cuda {
namespace {

// The most target axes, and summed axes, one strided sum takes.
constexpr int kMaxEinsumAxes = 16;

struct StridedSumParams {
  int rank = 0, sum_rank = 0;
  int64_t dims[kMaxEinsumAxes] = {};
  int64_t strides[kMaxEinsumAxes] = {};
  int64_t sum_dims[kMaxEinsumAxes] = {};
  int64_t sum_strides[kMaxEinsumAxes] = {};
  int64_t sum_count = 1;
};

// out[o] = sum over s of in[o . strides + s . sum_strides], in float32.
template <typename T>
__global__ void StridedSumKernel(const T* in, T* out, StridedSumParams p, int64_t count) {
  CASTOR_GRID_STRIDE(o, count) {
    int64_t rest = o, offset = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      offset += (rest % p.dims[d]) * p.strides[d];
      rest /= p.dims[d];
    }
    float acc = 0.0f;
    for (int64_t s = 0; s < p.sum_count; ++s) {
      int64_t sum_rest = s, sum_offset = 0;
      for (int d = p.sum_rank - 1; d >= 0; --d) {
        sum_offset += (sum_rest % p.sum_dims[d]) * p.sum_strides[d];
        sum_rest /= p.sum_dims[d];
      }
      acc += ToFloat(in[offset + sum_offset]);
    }
    out[o] = FromFloat<T>(acc);
  }
}

absl::Status RunGather(const KernelContext& ctx, const common::EinsumGather& g, DType dtype,
                       const void* in, void* out) {
  if (g.dims.size() > kMaxEinsumAxes || g.sum_dims.size() > kMaxEinsumAxes) {
    return ctx.Unimplemented(absl::StrCat("a strided sum over ", g.dims.size(), " axes and ",
                                          g.sum_dims.size(), " summed axes; at most ",
                                          kMaxEinsumAxes, " of each"));
  }
  StridedSumParams p;
  p.rank = static_cast<int>(g.dims.size());
  p.sum_rank = static_cast<int>(g.sum_dims.size());
  int64_t count = 1;
  for (int d = 0; d < p.rank; ++d) {
    p.dims[d] = g.dims[d];
    p.strides[d] = g.strides[d];
    count *= g.dims[d];
  }
  for (int d = 0; d < p.sum_rank; ++d) {
    p.sum_dims[d] = g.sum_dims[d];
    p.sum_strides[d] = g.sum_strides[d];
    p.sum_count *= g.sum_dims[d];
  }
  return DispatchFloat(ctx, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    StridedSumKernel<T><<<Blocks(count), kThreads, 0, Stream(ctx)>>>(
        static_cast<const T*>(in), static_cast<T*>(out), p, count);
    return CheckLaunch(ctx);
  });
}

absl::Status RunGemm(const KernelContext& ctx, const common::EinsumGemm& g, DType dtype,
                     const void* a, const void* b, void* c) {
  GemmShape shape;
  shape.trans_a = g.trans_a;
  shape.trans_b = g.trans_b;
  shape.m = g.m;
  shape.n = g.n;
  shape.k = g.k;
  shape.lda = g.trans_a ? g.m : g.k;
  shape.ldb = g.trans_b ? g.k : g.n;
  shape.ldc = g.n;
  GemmBatch batch;
  batch.count = g.batch;
  batch.stride_a = g.m * g.k;
  batch.stride_b = g.k * g.n;
  batch.stride_c = g.m * g.n;
  return RowMajorGemm(ctx, dtype, shape, 1.0f, a, b, 0.0f, c, batch);
}

absl::Status EinsumKernel(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::EinsumPlan plan, common::PlanEinsum(ctx));
  const DType dtype = ctx.input(0).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, dtype, plan.out_dims));
  if (plan.zero_output) {  // all-zero bits are 0 in every float dtype
    CASTOR_CUDA_CALL(cudaMemsetAsync(y->data, 0, y->byte_size(), Stream(ctx)));
    return absl::OkStatus();
  }
  CASTOR_ASSIGN_OR_RETURN(const std::vector<void*> buffers,
                          common::EinsumBuffers(ctx, plan, dtype, y->data));
  for (const common::EinsumStep& step : plan.steps) {
    if (step.is_gemm) {
      CASTOR_RETURN_IF_ERROR(RunGemm(ctx, step.gemm, dtype, buffers[step.gemm.a],
                                     buffers[step.gemm.b], buffers[step.gemm.c]));
    } else {
      CASTOR_RETURN_IF_ERROR(RunGather(ctx, step.gather, dtype, buffers[step.gather.source],
                                       buffers[step.gather.target]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterEinsumKernels(KernelTable& table) {
  table.Register({"", "Einsum", InputDTypeIn(0, {DType::kFloat32, DType::kFloat16}),
                  EinsumKernel});
}

}  // namespace castor::cuda
