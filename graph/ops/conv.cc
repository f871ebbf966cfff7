// Convolution op definitions: Conv and ConvTranspose over N-D inputs
// [N, C, D1, ..., Dn], with kernel_shape, strides, dilations, pads,
// auto_pad (NOTSET, SAME_UPPER, SAME_LOWER, VALID) and group, plus
// output_padding / output_shape for ConvTranspose. Output sizes follow the
// formulas of the ONNX spec:
//   Conv:          floor((D + pad_begin + pad_end - ((k - 1) * d + 1)) / s) + 1
//   ConvTranspose: s * (D - 1) + output_padding + ((k - 1) * d + 1)
//                  - pad_begin - pad_end   (or output_shape when given)
// Weights: Conv [M, C/group, k1, ...]; ConvTranspose [C, M/group, k1, ...];
// the optional bias is [M].
//
// com.castor Conv and com.castor ConvTranspose (castor's own ops, version
// 1): the ONNX ops as opset 22 defines them (bfloat16 included), for models
// of any opset. Only castor's training graph holds them: the autocast pass
// run by 'castor train' (AutocastOptions::training_graph_ops) gives a Conv
// that ONNX refuses in bfloat16 at the model's opset this form, while the
// model 'castor convert' writes keeps ONNX Conv in float32.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/gradient_builder.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

// Float types; bfloat16 from opset 22 (Conv-22, ConvTranspose-22), and at
// every version of castor's own forms.
std::vector<DType> ConvDTypes(const InferenceContext& ctx, bool castor_form) {
  if (castor_form) {
    return {DType::kFloat16, DType::kFloat32, DType::kFloat64, DType::kBFloat16};
  }
  return ops::DTypesAt(
      ctx, {{1, {DType::kFloat16, DType::kFloat32, DType::kFloat64}}, {22, {DType::kBFloat16}}});
}

std::vector<AttrSpec> ConvAttributes() {
  return {{"auto_pad", AttrKind::kString, false},  // default NOTSET
          {"dilations", AttrKind::kInts, false},   // default 1 per spatial axis
          {"group", AttrKind::kInt, false},        // default 1
          {"kernel_shape", AttrKind::kInts, false}, {"pads", AttrKind::kInts, false},  // default 0
          {"strides", AttrKind::kInts, false}};                                        // default 1
}

// What Conv and ConvTranspose share: dtype checks, ranks, group, and the
// number of spatial axes (nullopt when no input rank is known).
struct ConvInputs {
  std::optional<int> num_spatial;
  int64_t group = 1;
  std::optional<std::vector<int64_t>> kernel_from_weight;
};

absl::StatusOr<ConvInputs> ReadConvInputs(const InferenceContext& ctx, bool castor_form) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ConvDTypes(ctx, castor_form)));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  if (x.rank_known() && x.rank() < 3) {
    return ctx.Error(
        absl::StrCat("input X must have rank >= 3 ([N, C, D1, ...]); its shape is ", x.ToString()));
  }
  if (w.rank_known() && w.rank() < 3) {
    return ctx.Error(absl::StrCat("weight W must have rank >= 3; its shape is ", w.ToString()));
  }
  if (x.rank_known() && w.rank_known() && x.rank() != w.rank()) {
    return ctx.Error(absl::StrCat("input X ", x.ToString(), " and weight W ", w.ToString(),
                                  " must have the same rank"));
  }
  ConvInputs inputs;
  inputs.group = ctx.GetInt("group", 1);
  if (inputs.group < 1) {
    return ctx.Error(absl::StrCat("attribute 'group' is ", inputs.group, "; expected >= 1"));
  }
  if (x.rank_known()) {
    inputs.num_spatial = x.rank() - 2;
  } else if (w.rank_known()) {
    inputs.num_spatial = w.rank() - 2;
  }
  if (w.rank_known()) {
    const Shape spatial(std::vector<Dim>(w.dims().begin() + 2, w.dims().end()));
    inputs.kernel_from_weight = spatial.StaticDims();
  }
  if (const Shape& b = ctx.input_shape(2); ctx.has_input(2) && b.rank_known() && b.rank() != 1) {
    return ctx.Error(absl::StrCat("bias B must be 1-D; its shape is ", b.ToString()));
  }
  return inputs;
}

// Checks that two static dims agree; `what` describes the relation.
absl::Status CheckEqual(const InferenceContext& ctx, const Dim& a, int64_t b_value, bool b_known,
                        const std::string& what) {
  if (a.is_static() && b_known && a.value() != b_value) {
    return ctx.Error(absl::StrCat(what, ": ", a.value(), " vs ", b_value, " (X ",
                                  ctx.input_shape(0).ToString(), ", W ",
                                  ctx.input_shape(1).ToString(), ")"));
  }
  return absl::OkStatus();
}

absl::Status InferConvForm(InferenceContext& ctx, bool castor_form) {
  CASTOR_ASSIGN_OR_RETURN(ConvInputs inputs, ReadConvInputs(ctx, castor_form));
  const DType dtype = ctx.input_dtype(0);
  if (!inputs.num_spatial) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  const int n = *inputs.num_spatial;
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  CASTOR_ASSIGN_OR_RETURN(ops::WindowAttrs attrs,
                          ops::ReadWindowAttrs(ctx, n, inputs.kernel_from_weight, false));
  const Dim batch = x.rank_known() ? x[0] : Dim::Unknown();
  const Dim in_channels = x.rank_known() ? x[1] : Dim::Unknown();
  const Dim out_channels = w.rank_known() ? w[0] : Dim::Unknown();
  if (w.rank_known() && w[1].is_static()) {
    CASTOR_RETURN_IF_ERROR(CheckEqual(ctx, in_channels, w[1].value() * inputs.group, true,
                                      "input channels C must equal W.dim(1) * group"));
  }
  if (out_channels.is_static() && out_channels.value() % inputs.group != 0) {
    return ctx.Error(absl::StrCat("output channels M = ", out_channels.value(),
                                  " (W.dim(0)) is not divisible by group ", inputs.group));
  }
  if (ctx.has_input(2) && ctx.input_shape(2).rank_known()) {
    CASTOR_RETURN_IF_ERROR(CheckEqual(ctx, ctx.input_shape(2)[0], out_channels.value(),
                                      out_channels.is_static(),
                                      "bias B must have M = W.dim(0) entries"));
  }
  std::vector<Dim> dims = {batch, out_channels};
  for (int i = 0; i < n; ++i) {
    const Dim input = x.rank_known() ? x[2 + i] : Dim::Unknown();
    CASTOR_ASSIGN_OR_RETURN(Dim out, ops::WindowOutputDim(ctx, input, attrs, i, false));
    dims.push_back(out);
  }
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));
  return absl::OkStatus();
}

absl::Status InferConvTransposeForm(InferenceContext& ctx, bool castor_form) {
  CASTOR_ASSIGN_OR_RETURN(ConvInputs inputs, ReadConvInputs(ctx, castor_form));
  const DType dtype = ctx.input_dtype(0);
  if (!inputs.num_spatial) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  const int n = *inputs.num_spatial;
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  CASTOR_ASSIGN_OR_RETURN(ops::WindowAttrs attrs,
                          ops::ReadWindowAttrs(ctx, n, inputs.kernel_from_weight, false));

  std::vector<int64_t> output_padding = ctx.GetInts("output_padding", std::vector<int64_t>(n, 0));
  if (static_cast<int>(output_padding.size()) != n) {
    return ctx.Error(absl::StrCat("attribute 'output_padding' has ", output_padding.size(),
                                  " entries; expected ", n));
  }
  for (int i = 0; i < n; ++i) {
    if (output_padding[i] < 0 ||
        output_padding[i] >= std::max(attrs.strides[i], attrs.dilations[i])) {
      return ctx.Error(absl::StrCat("attribute 'output_padding' [",
                                    absl::StrJoin(output_padding, ","),
                                    "] must be >= 0 and less than the stride or dilation of its "
                                    "axis (axis ",
                                    i, ")"));
    }
  }
  // output_shape names the spatial dims; a full [N, C, ...] form is accepted
  // too (as ONNX Runtime does) and its leading two entries ignored.
  std::optional<std::vector<int64_t>> output_shape;
  if (ctx.has_attribute("output_shape")) {
    std::vector<int64_t> values = ctx.GetInts("output_shape");
    if (static_cast<int>(values.size()) == n + 2) values.erase(values.begin(), values.begin() + 2);
    if (static_cast<int>(values.size()) != n) {
      return ctx.Error(absl::StrCat("attribute 'output_shape' has ",
                                    ctx.GetInts("output_shape").size(), " entries; expected ", n,
                                    " (the spatial dims)"));
    }
    for (int64_t v : values) {
      if (v < 1) return ctx.Error("attribute 'output_shape' has an entry below 1");
    }
    output_shape = std::move(values);
  }

  const Dim batch = x.rank_known() ? x[0] : Dim::Unknown();
  const Dim in_channels = x.rank_known() ? x[1] : Dim::Unknown();
  Dim out_channels;
  if (w.rank_known()) {
    if (w[0].is_static()) {
      CASTOR_RETURN_IF_ERROR(
          CheckEqual(ctx, in_channels, w[0].value(), true, "input channels C must equal W.dim(0)"));
    }
    if (w[0].is_static() && w[0].value() % inputs.group != 0) {
      return ctx.Error(
          absl::StrCat("W.dim(0) = ", w[0].value(), " is not divisible by group ", inputs.group));
    }
    if (w[1].is_static())
      out_channels = Dim(w[1].value() * inputs.group);
    else if (inputs.group == 1)
      out_channels = w[1];
  }
  if (ctx.has_input(2) && ctx.input_shape(2).rank_known()) {
    CASTOR_RETURN_IF_ERROR(CheckEqual(ctx, ctx.input_shape(2)[0], out_channels.value(),
                                      out_channels.is_static(),
                                      "bias B must have M = W.dim(1) * group entries"));
  }

  std::vector<Dim> dims = {batch, out_channels};
  for (int i = 0; i < n; ++i) {
    if (output_shape) {
      dims.push_back((*output_shape)[i]);
      continue;
    }
    const Dim input = x.rank_known() ? x[2 + i] : Dim::Unknown();
    if (!input.is_static() || attrs.kernel_shape.empty()) {
      dims.push_back(Dim::Unknown());
      continue;
    }
    const int64_t kernel = attrs.EffectiveKernel(i);
    const int64_t stride = attrs.strides[i];
    int64_t pad_total = attrs.pads[i] + attrs.pads[i + n];
    if (attrs.auto_pad == "SAME_UPPER" || attrs.auto_pad == "SAME_LOWER") {
      // Pads chosen so that the output is input * stride (as ONNX Runtime).
      pad_total = std::max<int64_t>(0, kernel + output_padding[i] - stride);
    } else if (attrs.auto_pad == "VALID") {
      pad_total = 0;
    }
    const int64_t out = stride * (input.value() - 1) + output_padding[i] + kernel - pad_total;
    if (out < 1) {
      return ctx.Error(absl::StrCat("spatial axis ", i, ": the output size ", out,
                                    " is not positive (pads too large)"));
    }
    dims.push_back(out);
  }
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));
  return absl::OkStatus();
}

absl::Status InferConv(InferenceContext& ctx) { return InferConvForm(ctx, false); }
absl::Status InferCastorConv(InferenceContext& ctx) { return InferConvForm(ctx, true); }
absl::Status InferConvTranspose(InferenceContext& ctx) {
  return InferConvTransposeForm(ctx, false);
}
absl::Status InferCastorConvTranspose(InferenceContext& ctx) {
  return InferConvTransposeForm(ctx, true);
}

// The ONNX op (domain "") or castor's form of it (kCastorDomain, version 1).
OpDef MakeConvOp(const std::string& op_type, const std::string& domain) {
  OpDef def;
  def.op_type = op_type;
  def.domain = domain;
  def.min_opset = domain.empty() ? kMinOnnxOpset : 1;
  def.max_opset = domain.empty() ? kMaxOnnxOpset : 1;
  def.min_inputs = 2;
  def.max_inputs = 3;
  def.attributes = ConvAttributes();
  return def;
}

constexpr const char* kCastorFormSummary =
    " (castor's form for the training graph: ONNX opset 22's op, bfloat16 included, at any "
    "model opset)";

}  // namespace

void RegisterConvOps(OpRegistry& registry) {
  for (const std::string domain : {"", kCastorDomain}) {
    const std::string form = domain.empty() ? "" : kCastorFormSummary;
    {
      OpDef def = MakeConvOp("Conv", domain);
      def.infer = domain.empty() ? InferConv : InferCastorConv;
      def.summary =
          "N-D convolution of X [N,C,D...] with W [M,C/group,k...], optional bias [M]" + form;
      registry.Register(std::move(def));
    }
    {
      OpDef def = MakeConvOp("ConvTranspose", domain);
      def.attributes.push_back({"output_padding", AttrKind::kInts, false});
      def.attributes.push_back({"output_shape", AttrKind::kInts, false});
      def.infer = domain.empty() ? InferConvTranspose : InferCastorConvTranspose;
      def.summary =
          "N-D transposed convolution of X [N,C,D...] with W [C,M/group,k...], optional bias "
          "[M]" +
          form;
      registry.Register(std::move(def));
    }
  }
}

}  // namespace castor
