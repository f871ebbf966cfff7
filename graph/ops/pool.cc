// Pooling op definitions: MaxPool (optional int64 Indices output, ceil_mode,
// dilations, storage_order), AveragePool (ceil_mode, count_include_pad,
// dilations from opset 19), GlobalAveragePool and GlobalMaxPool. Windowed
// output sizes follow ONNX convPoolShapeInference (shared with Conv in
// op_helpers): floor((D + pads - ((k - 1) * d + 1)) / s) + 1, or ceil in
// ceil_mode, where a last window that would start in the end padding is
// dropped. Attributes are checked against the opset that introduced them.
//
// com.castor MaxPool, AveragePool and GlobalAveragePool (castor's own ops,
// version 1): the ONNX ops as opset 22 defines them (bfloat16 included,
// every attribute), for models of any opset, as com.castor Conv
// (graph/ops/conv.cc): only the training graph of 'castor train' holds
// them, where autocast runs a pool ONNX refuses in bfloat16 at the model's
// opset in bfloat16 instead of casting its input to float32 and back.
// (GlobalMaxPool has none: its gradient is built from ONNX ops that take
// bfloat16 only from opset 13.)
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/gradient_builder.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

const std::vector<DType> kFloats = {DType::kFloat16, DType::kFloat32, DType::kFloat64};

absl::Status RequirePoolInput(const InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (x.rank_known() && x.rank() < 3) {
    return ctx.Error(
        absl::StrCat("input X must have rank >= 3 ([N, C, D1, ...]); its shape is ", x.ToString()));
  }
  return absl::OkStatus();
}

// The output shape [N, C, out1, ...] of a windowed pool over input 0.
absl::StatusOr<Shape> WindowedPoolShape(const InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (!ctx.has_attribute("kernel_shape")) return ctx.Error("attribute 'kernel_shape' is required");
  const int n =
      x.rank_known() ? x.rank() - 2 : static_cast<int>(ctx.GetInts("kernel_shape").size());
  CASTOR_ASSIGN_OR_RETURN(ops::WindowAttrs attrs, ops::ReadWindowAttrs(ctx, n, std::nullopt, true));
  const int64_t ceil_mode = ctx.GetInt("ceil_mode", 0);
  if (ceil_mode != 0 && ceil_mode != 1) {
    return ctx.Error(absl::StrCat("attribute 'ceil_mode' is ", ceil_mode, "; expected 0 or 1"));
  }
  if (!x.rank_known()) {
    std::vector<Dim> dims(n + 2);
    return Shape(std::move(dims));
  }
  std::vector<Dim> dims = {x[0], x[1]};
  for (int i = 0; i < n; ++i) {
    CASTOR_ASSIGN_OR_RETURN(Dim out, ops::WindowOutputDim(ctx, x[2 + i], attrs, i, ceil_mode == 1));
    dims.push_back(out);
  }
  return Shape(std::move(dims));
}

// The element types the op takes: `since` lists what each opset added; a
// castor form (opset 22's op at any model opset) takes all of them.
std::vector<DType> PoolDTypes(const InferenceContext& ctx, bool castor_form,
                              const std::vector<ops::DTypesSince>& since) {
  if (!castor_form) return ops::DTypesAt(ctx, since);
  std::vector<DType> all;
  for (const ops::DTypesSince& step : since) {
    all.insert(all.end(), step.dtypes.begin(), step.dtypes.end());
  }
  return all;
}

// MaxPool, or castor's form of it (no attribute or output is too new for it).
absl::Status InferMaxPoolForm(InferenceContext& ctx, bool castor_form) {
  // T: floats; int8/uint8 from opset 12; bfloat16 from 22.
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      PoolDTypes(ctx, castor_form,
                 {{1, kFloats}, {12, {DType::kInt8, DType::kUInt8}}, {22, {DType::kBFloat16}}})));
  if (!castor_form) {
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "storage_order", 8));
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "ceil_mode", 10));
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "dilations", 10));
    if (ctx.num_outputs() > 1 && ctx.opset() < 8) {
      return ctx.Error(absl::StrCat(
          "the Indices output exists from opset 8; the model imports opset ", ctx.opset()));
    }
  }
  const int64_t storage_order = ctx.GetInt("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) {
    return ctx.Error(absl::StrCat("attribute 'storage_order' is ", storage_order,
                                  "; expected 0 (row major) or 1 (column major)"));
  }
  CASTOR_RETURN_IF_ERROR(RequirePoolInput(ctx));
  CASTOR_ASSIGN_OR_RETURN(Shape shape, WindowedPoolShape(ctx));
  ctx.SetOutput(0, ctx.input_dtype(0), shape);
  ctx.SetOutput(1, DType::kInt64, shape);  // Indices, when requested
  return absl::OkStatus();
}

absl::Status InferAveragePoolForm(InferenceContext& ctx, bool castor_form) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0, PoolDTypes(ctx, castor_form, {{1, kFloats}, {22, {DType::kBFloat16}}})));
  if (!castor_form) {
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "ceil_mode", 10));
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "dilations", 19));
  }
  const int64_t count_include_pad = ctx.GetInt("count_include_pad", 0);
  if (count_include_pad != 0 && count_include_pad != 1) {
    return ctx.Error(
        absl::StrCat("attribute 'count_include_pad' is ", count_include_pad, "; expected 0 or 1"));
  }
  CASTOR_RETURN_IF_ERROR(RequirePoolInput(ctx));
  CASTOR_ASSIGN_OR_RETURN(Shape shape, WindowedPoolShape(ctx));
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(shape));
  return absl::OkStatus();
}

// GlobalAveragePool / GlobalMaxPool: [N, C, D1, ...] -> [N, C, 1, ...].
absl::Status InferGlobalPoolForm(InferenceContext& ctx, bool castor_form) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0, PoolDTypes(ctx, castor_form, {{1, kFloats}, {22, {DType::kBFloat16}}})));
  CASTOR_RETURN_IF_ERROR(RequirePoolInput(ctx));
  const Shape& x = ctx.input_shape(0);
  if (!x.rank_known()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape::Unknown());
    return absl::OkStatus();
  }
  std::vector<Dim> dims = {x[0], x[1]};
  dims.resize(x.rank(), Dim(1));
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(dims)));
  return absl::OkStatus();
}

absl::Status InferMaxPool(InferenceContext& ctx) { return InferMaxPoolForm(ctx, false); }
absl::Status InferCastorMaxPool(InferenceContext& ctx) { return InferMaxPoolForm(ctx, true); }
absl::Status InferAveragePool(InferenceContext& ctx) { return InferAveragePoolForm(ctx, false); }
absl::Status InferCastorAveragePool(InferenceContext& ctx) {
  return InferAveragePoolForm(ctx, true);
}
absl::Status InferGlobalPool(InferenceContext& ctx) { return InferGlobalPoolForm(ctx, false); }
absl::Status InferCastorGlobalPool(InferenceContext& ctx) { return InferGlobalPoolForm(ctx, true); }

std::vector<AttrSpec> WindowAttributes() {
  return {{"auto_pad", AttrKind::kString, false},  // default NOTSET
          {"ceil_mode", AttrKind::kInt, false},    // default 0; opset 10+
          {"dilations", AttrKind::kInts, false},   // default 1 per axis
          {"kernel_shape", AttrKind::kInts, true}, {"pads", AttrKind::kInts, false},  // default 0
          {"strides", AttrKind::kInts, false}};                                       // default 1
}

constexpr const char* kCastorFormSummary =
    " (castor's form for the training graph: ONNX opset 22's op, bfloat16 included, at any "
    "model opset)";

// The ONNX op (domain "") or castor's form of it (kCastorDomain, version 1).
OpDef MakePoolOp(const std::string& op_type, InferFn infer, const std::string& summary,
                 const std::string& domain = "") {
  OpDef def;
  def.op_type = op_type;
  def.domain = domain;
  def.min_opset = domain.empty() ? kMinOnnxOpset : 1;
  def.max_opset = domain.empty() ? kMaxOnnxOpset : 1;
  def.min_inputs = 1;
  def.max_inputs = 1;
  def.infer = std::move(infer);
  def.summary = domain.empty() ? summary : summary + kCastorFormSummary;
  return def;
}

}  // namespace

void RegisterPoolOps(OpRegistry& registry) {
  for (const std::string domain : {"", kCastorDomain}) {
    const bool onnx = domain.empty();
    {
      OpDef def = MakePoolOp("MaxPool", onnx ? InferMaxPool : InferCastorMaxPool,
                             "max over sliding windows of X [N,C,D...]; optional int64 Indices",
                             domain);
      def.max_outputs = 2;
      def.attributes = WindowAttributes();                                 // dilations: opset 10+
      def.attributes.push_back({"storage_order", AttrKind::kInt, false});  // default 0; opset 8+
      registry.Register(std::move(def));
    }
    {
      OpDef def = MakePoolOp("AveragePool", onnx ? InferAveragePool : InferCastorAveragePool,
                             "mean over sliding windows of X [N,C,D...]", domain);
      def.attributes = WindowAttributes();  // dilations: opset 19+
      def.attributes.push_back({"count_include_pad", AttrKind::kInt, false});  // default 0
      registry.Register(std::move(def));
    }
    registry.Register(MakePoolOp("GlobalAveragePool",
                                 onnx ? InferGlobalPool : InferCastorGlobalPool,
                                 "mean over all spatial dims: [N,C,D...] -> [N,C,1...]", domain));
  }
  registry.Register(MakePoolOp("GlobalMaxPool", InferGlobalPool,
                               "max over all spatial dims: [N,C,D...] -> [N,C,1...]"));
}

}  // namespace castor
