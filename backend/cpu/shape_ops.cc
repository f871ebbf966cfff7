// CPU kernels: shape_ops family (ops of graph/ops/shape_ops.cc): Reshape,
// Flatten, Squeeze, Unsqueeze (a copy with new dims, aliasable in place),
// Transpose and Expand (strided copies), Shape and Size (int64 readers).
// Every kernel is dtype-agnostic: it moves elements of DTypeSize bytes.
// Output dims are computed from the input values at run time (the inferred
// shapes may be symbolic), and the checks name both shapes when they clash.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backend/common/op_geometry.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/strided_copy.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// ---- Reshape -----------------------------------------------------------------

absl::Status RunReshape(KernelContext& ctx) {
  const std::vector<int64_t> target = ReadInts(ctx.input(1));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                          common::PlanReshape(ctx, ctx.input(0).dims, target));
  return CopyInputToOutput(ctx, std::move(dims));
}

// ---- Flatten -----------------------------------------------------------------

absl::Status RunFlatten(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims, common::PlanFlatten(ctx, ctx.input(0).dims));
  return CopyInputToOutput(ctx, std::move(dims));
}

// ---- Squeeze / Unsqueeze -------------------------------------------------------

// Input 1 (the axes, from opset 13) when the node has it.
std::optional<std::vector<int64_t>> AxesInput(const KernelContext& ctx) {
  if (ctx.opset() < 13 || !ctx.has_input(1)) return std::nullopt;
  return ReadInts(ctx.input(1));
}

absl::Status RunSqueeze(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                          common::PlanSqueeze(ctx, ctx.input(0).dims, AxesInput(ctx)));
  return CopyInputToOutput(ctx, std::move(dims));
}

absl::Status RunUnsqueeze(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                          common::PlanUnsqueeze(ctx, ctx.input(0).dims, AxesInput(ctx)));
  return CopyInputToOutput(ctx, std::move(dims));
}

// ---- Transpose -----------------------------------------------------------------

absl::Status RunTranspose(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan, common::PlanTranspose(ctx, data.dims));
  return CopyByPlan(ctx, plan);
}

// ---- Expand --------------------------------------------------------------------

absl::Status RunExpand(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanExpand(ctx, data.dims, ReadInts(ctx.input(1))));
  return CopyByPlan(ctx, plan);
}

// ---- Shape / Size ----------------------------------------------------------------

absl::Status RunShape(KernelContext& ctx) {
  const std::vector<int64_t>& in = ctx.input(0).dims;
  const common::ShapeWindow w = common::PlanShape(ctx, static_cast<int64_t>(in.size()));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, DType::kInt64, {w.count}));
  for (int64_t i = 0; i < w.count; ++i) out->as<int64_t>()[i] = in[w.start + i];
  return absl::OkStatus();
}

absl::Status RunSize(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, DType::kInt64, {}));
  *out->as<int64_t>() = ctx.input(0).num_elements();
  return absl::OkStatus();
}

void Add(KernelTable& table, const char* op_type, KernelFn run, bool in_place_ok) {
  table.Register(KernelDef{"", op_type, NoStringTensors, run, in_place_ok});
}

}  // namespace

void RegisterShapeKernels(KernelTable& table) {
  Add(table, "Reshape", RunReshape, /*in_place_ok=*/true);
  Add(table, "Flatten", RunFlatten, /*in_place_ok=*/true);
  Add(table, "Squeeze", RunSqueeze, /*in_place_ok=*/true);
  Add(table, "Unsqueeze", RunUnsqueeze, /*in_place_ok=*/true);
  Add(table, "Transpose", RunTranspose, /*in_place_ok=*/false);
  Add(table, "Expand", RunExpand, /*in_place_ok=*/false);
  Add(table, "Shape", RunShape, /*in_place_ok=*/false);
  Add(table, "Size", RunSize, /*in_place_ok=*/false);
}

}  // namespace castor::cpu
