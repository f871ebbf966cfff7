// CPU kernels: Resize (graph/ops/resize.cc) and its gradient ResizeGrad
// (com.castor, graph/ops/gradient_ops.cc). Both walk the taps of
// backend/common/resize_geometry.h: Resize sums the input elements each
// output element reads times their weights (nearest: one element, moved
// as bytes in any dtype; linear: float dtypes, in float32, rounded once);
// ResizeGrad adds each dY element times the same weights into zeros of X's
// shape, in float32, in parallel over the leading axes Resize leaves as
// they are (N and C of NCHW). Resize reads scales/sizes at input 1 (opset
// 10) or inputs 2/3; ResizeGrad at inputs 2/3. An empty tensor is absent.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/resize_geometry.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/strided_copy.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// The scales (float32) at input `scales_at` and sizes at `sizes_at` (-1:
// none), empty when absent or empty.
absl::StatusOr<common::ResizeGeometry> PlanFromInputs(const KernelContext& ctx,
                                                      const std::vector<int64_t>& in_dims,
                                                      int scales_at, int sizes_at, bool opset10) {
  std::vector<float> scales;
  std::vector<int64_t> sizes;
  if (scales_at < ctx.num_inputs() && ctx.has_input(scales_at)) {
    const TensorView& t = ctx.input(scales_at);
    if (t.num_elements() > 0 && t.dtype != DType::kFloat32) {
      return ctx.Error(absl::StrCat("input ", scales_at, " (scales) is ", DTypeName(t.dtype),
                                    "; expected float32"));
    }
    scales.assign(t.as<float>(), t.as<float>() + t.num_elements());
  }
  if (sizes_at >= 0 && sizes_at < ctx.num_inputs() && ctx.has_input(sizes_at)) {
    sizes = ReadInts(ctx.input(sizes_at));
  }
  CASTOR_ASSIGN_OR_RETURN(common::ResizeGeometry g,
                          common::PlanResize(ctx, in_dims, scales, sizes, opset10));
  g.indexer.taps = g.taps.data();
  return g;
}

absl::Status RunResize(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const bool opset10 = ctx.opset() < 11;
  CASTOR_ASSIGN_OR_RETURN(const common::ResizeGeometry g,
                          PlanFromInputs(ctx, x.dims, opset10 ? 1 : 2, opset10 ? -1 : 3, opset10));
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, g.out_dims));
  const int64_t total = y->num_elements();
  if (total == 0) return absl::OkStatus();
  const common::ResizeIndexer& indexer = g.indexer;
  if (ctx.GetString("mode", "nearest") == "nearest") {
    const size_t size = DTypeSize(x.dtype);
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(0, total, kElementGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        indexer.ForEachSource(o, [&](int64_t offset, float) {
          std::memcpy(dst + o * size, src + offset * size, size);
        });
      }
    });
    return absl::OkStatus();
  }
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = x.as<T>();
    T* dst = y->as<T>();
    ParallelFor(0, total, kElementGrain / 4, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        float sum = 0.0f;
        indexer.ForEachSource(o, [&](int64_t offset, float weight) {
          sum += weight * LoadF(src[offset]);
        });
        StoreF(dst + o, sum);
      }
    });
  });
  if (!ok) {
    return ctx.Error(absl::StrCat("mode \"linear\" needs float data; X is ",
                                  DTypeName(x.dtype)));
  }
  return absl::OkStatus();
}

absl::Status ResizeGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  if (dy.dtype != x.dtype) {
    return ctx.Error(absl::StrCat("input 0 (dY) is ", DTypeName(dy.dtype), " but input 1 (X) is ",
                                  DTypeName(x.dtype), "; they must match"));
  }
  CASTOR_ASSIGN_OR_RETURN(const common::ResizeGeometry g,
                          PlanFromInputs(ctx, x.dims, 2, 3, /*opset10=*/false));
  if (dy.dims != g.out_dims) {
    return ctx.Error(absl::StrCat("input 0 (dY) is ", common::DimsToString(dy.dims),
                                  "; expected Resize's output ", common::DimsToString(g.out_dims)));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const Float32Out out(dx);
  const Float32In grad(dy);
  float* acc = out.data();
  const float* src = grad.data();
  const common::ResizeIndexer& indexer = g.indexer;
  ParallelFor(0, g.blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      for (int64_t o = b * g.out_block; o < (b + 1) * g.out_block; ++o) {
        const float value = src[o];
        indexer.ForEachSource(o, [&](int64_t offset, float weight) { acc[offset] += weight * value; });
      }
    }
  });
  out.Finish();
  return absl::OkStatus();
}

}  // namespace

void RegisterResizeKernels(KernelTable& table) {
  table.Register(KernelDef{"", "Resize", NoStringTensors, RunResize, /*in_place_ok=*/false});
  RegisterGradientKernel(table, "ResizeGrad", ResizeGradKernel);
}

}  // namespace castor::cpu
