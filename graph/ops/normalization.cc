// Normalization op definitions.
//
// BatchNormalization over X [N, C, D1, ...] with per-channel scale, B, mean
// and var [C]. Its outputs changed with the opset:
//   - opset 7-8:  `spatial` attribute (0: params are [C, D1, ...]);
//   - opset 7-13: Y plus up to four optional outputs (mean, var,
//                 saved_mean, saved_var), all of X's dtype;
//   - opset 14+:  `training_mode`; in training Y, running_mean, running_var
//                 (the latter of the mean/var inputs' dtype U), else Y only;
//   - opset 15+:  scale/B (T1) and mean/var (T2) may differ from X's dtype.
// com.castor BatchNormalizationTraining (castor's own op, version 1): the
// form castor's training graph gives every BatchNormalization, whatever its
// opset: PyTorch's train() semantics. Inputs as opset 15's (X: T; scale, B:
// T1; input_mean, input_var: T2), attributes epsilon and momentum (ONNX's
// meaning: the weight of the old running value), outputs Y, running_mean,
// running_var and optionally the batch mean and biased batch variance
// (opset 7-13's saved_mean and saved_var, in the statistics' dtype; the
// training graph keeps the mean for the gradient, which then need not
// compute it again: gradient_rules.cc), and attribute relu (default 0; 1:
// Y is Relu of the normalised values, the fuse-batchnorm-relu pass's form
// of a BatchNormalization -> Relu pair). Y uses the batch mean and biased batch
// variance, as ONNX's training mode; running_var is updated with the
// unbiased batch variance (times count / (count - 1)) as PyTorch does,
// where the ONNX spec's text and reference use the biased one (what the
// ONNX op keeps, conformance included).
// LayerNormalization (opset 17): normalizes over the axes from `axis` on;
// the optional Mean and InvStdDev outputs have dtype `stash_type` (float32
// by default) and X's shape with the normalized axes set to 1.
// com.castor LayerNormalization (castor's own op, version 1): the same op
// whose Scale and B may be float32 while X and Y are 16-bit, the form the
// fold-layernorm-casts pass gives a LayerNormalization kept float32
// between 16-bit neighbours (passes/training_graph.cc).
// InstanceNormalization (opset 6+; opset 1's consumed_inputs form is not
// taken): normalizes each (n, c) slice of X [N, C, D1, ...] over D1, ...
// with its own mean and biased variance, then Y = norm * scale[c] + B[c].
// torch.onnx.export writes nn.InstanceNorm*d as this op and nn.GroupNorm
// as Reshape [N, G, -1] -> InstanceNormalization (scale ones[G], B
// zeros[G]) -> Reshape -> Mul -> Add. T: float16/float32/float64, bfloat16
// from opset 22.
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
const std::vector<DType> kFloatsAndBFloat16 = {DType::kFloat16, DType::kFloat32, DType::kFloat64,
                                               DType::kBFloat16};

const char* const kBatchNormInputNames[] = {"X", "scale", "B", "mean", "var"};

absl::Status CheckBatchNormDTypes(const InferenceContext& ctx) {
  if (ctx.opset() < 14) {  // one T for everything
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, kFloats));
    return ops::RequireSameDType(ctx, 0, 4);
  }
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, kFloatsAndBFloat16));
  if (ctx.opset() == 14) {  // X, scale, B: T; mean, var: U
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
  } else {  // X: T; scale, B: T1; mean, var: T2
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, kFloatsAndBFloat16));
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 1, 2));
  }
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 3, kFloatsAndBFloat16));
  return ops::RequireSameDType(ctx, 3, 4);
}

// X, scale, B, mean, var's shapes; Y and the statistics outputs.
absl::Status InferBatchNormShapes(InferenceContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (x.rank_known() && x.rank() < 2) {
    return ctx.Error(
        absl::StrCat("input X must have rank >= 2 ([N, C, ...]); its shape is ", x.ToString()));
  }
  const bool spatial = ctx.GetInt("spatial", 1) != 0;
  Dim channels = x.rank_known() ? x[1] : Dim::Unknown();
  if (spatial) {
    for (int i = 1; i <= 4; ++i) {
      const Shape& p = ctx.input_shape(i);
      if (!p.rank_known()) continue;
      if (p.rank() != 1) {
        return ctx.Error(absl::StrCat("input ", i, " (", kBatchNormInputNames[i],
                                      ") must be 1-D [C]; its shape is ", p.ToString()));
      }
      if (channels.is_static() && p[0].is_static() && p[0].value() != channels.value()) {
        return ctx.Error(absl::StrCat("input ", i, " (", kBatchNormInputNames[i], ") has ",
                                      p[0].value(), " entries but X ", x.ToString(), " has ",
                                      channels.value(), " channels"));
      }
      if (!channels.is_static() && !p[0].is_unknown()) channels = p[0];
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  // The statistics outputs: [C] (the params' shape when spatial = 0).
  const Shape stats_shape = spatial ? Shape({channels}) : ctx.input_shape(3);
  const DType stats_dtype = ctx.input_dtype(3);
  for (int i = 1; i < ctx.num_outputs(); ++i) ctx.SetOutput(i, stats_dtype, stats_shape);
  return absl::OkStatus();
}

absl::Status InferBatchNormalization(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "spatial", 1, 8));
  CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "training_mode", 14));
  CASTOR_RETURN_IF_ERROR(CheckBatchNormDTypes(ctx));
  const bool training = ctx.GetInt("training_mode", 0) != 0;
  if (ctx.opset() >= 14) {
    if (!training && ctx.num_outputs() > 1) {
      return ctx.Error(absl::StrCat("has ", ctx.num_outputs(),
                                    " outputs but training_mode is 0; only Y is valid in "
                                    "inference mode (opset 14+)"));
    }
    if (ctx.num_outputs() > 3) {
      return ctx.Error(absl::StrCat("has ", ctx.num_outputs(),
                                    " outputs; from opset 14 there are at most 3 (Y, "
                                    "running_mean, running_var)"));
    }
  }
  return InferBatchNormShapes(ctx);
}

// castor's BatchNormalizationTraining: opset 15's dtypes, per-channel only.
absl::Status InferBatchNormalizationTraining(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, kFloatsAndBFloat16));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, kFloatsAndBFloat16));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 1, 2));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 3, kFloatsAndBFloat16));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 3, 4));
  return InferBatchNormShapes(ctx);
}

// ONNX's LayerNormalization (`castor_form` false: X, Scale and B of one
// dtype) or castor's (Scale and B also float32 with a 16-bit X).
absl::Status InferLayerNormalizationOf(InferenceContext& ctx, bool castor_form) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, kFloatsAndBFloat16));
  const DType x_dtype = ctx.input_dtype(0);
  const bool float32_parameters =
      castor_form && (x_dtype == DType::kFloat16 || x_dtype == DType::kBFloat16) &&
      ctx.input_dtype(1) == DType::kFloat32;
  if (float32_parameters) {
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 1, 2));
  } else {
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
  }
  const int64_t stash_code = ctx.GetInt("stash_type", 1);
  absl::StatusOr<DType> stash = DTypeFromOnnx(static_cast<int32_t>(stash_code));
  if (!stash.ok() || (*stash != DType::kFloat32 && *stash != DType::kBFloat16)) {
    return ctx.Error(absl::StrCat("attribute 'stash_type' is ", stash_code,
                                  "; expected 1 (float32) or 16 (bfloat16)"));
  }
  const Shape& x = ctx.input_shape(0);
  const char* const names[] = {"X", "Scale", "B"};
  for (int i = 1; i <= 2; ++i) {
    if (ctx.has_input(i) && !ops::UnidirectionalBroadcastable(ctx.input_shape(i), x)) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") shape ",
                                    ctx.input_shape(i).ToString(), " does not broadcast to X ",
                                    x.ToString()));
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  if (!x.rank_known()) {
    ctx.SetOutput(1, *stash, Shape::Unknown());
    ctx.SetOutput(2, *stash, Shape::Unknown());
    return absl::OkStatus();
  }
  CASTOR_ASSIGN_OR_RETURN(int64_t axis, ops::NormalizeAxis(ctx, ctx.GetInt("axis", -1), x.rank()));
  std::vector<Dim> stats_dims = x.dims();
  for (int k = static_cast<int>(axis); k < x.rank(); ++k) stats_dims[k] = Dim(1);
  ctx.SetOutput(1, *stash, Shape(stats_dims));
  ctx.SetOutput(2, *stash, Shape(stats_dims));
  return absl::OkStatus();
}

absl::Status InferLayerNormalization(InferenceContext& ctx) {
  return InferLayerNormalizationOf(ctx, /*castor_form=*/false);
}

absl::Status InferCastorLayerNormalization(InferenceContext& ctx) {
  return InferLayerNormalizationOf(ctx, /*castor_form=*/true);
}

absl::Status InferInstanceNormalization(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(
      ops::RequireDType(ctx, 0, ops::DTypesAt(ctx, {{1, kFloats}, {22, {DType::kBFloat16}}})));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
  const Shape& x = ctx.input_shape(0);
  if (x.rank_known() && x.rank() < 3) {
    return ctx.Error(absl::StrCat("input X must have rank >= 3 ([N, C, D1, ...]); its shape is ",
                                  x.ToString()));
  }
  Dim channels = x.rank_known() ? x[1] : Dim::Unknown();
  const char* const names[] = {"X", "scale", "B"};
  for (int i = 1; i <= 2; ++i) {
    const Shape& p = ctx.input_shape(i);
    if (!p.rank_known()) continue;
    if (p.rank() != 1) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") must be 1-D [C]; its shape is ",
                                    p.ToString()));
    }
    if (channels.is_static() && p[0].is_static() && p[0].value() != channels.value()) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") has ", p[0].value(),
                                    " entries but X ", x.ToString(), " has ", channels.value(),
                                    " channels"));
    }
    if (!channels.is_static() && !p[0].is_unknown()) channels = p[0];
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

}  // namespace

void RegisterNormalizationOps(OpRegistry& registry) {
  {
    OpDef def;
    def.op_type = "BatchNormalization";
    def.min_opset = kMinOnnxOpset;
    def.max_opset = kMaxOnnxOpset;
    def.min_inputs = 5;
    def.max_inputs = 5;
    def.min_outputs = 1;
    def.max_outputs = 5;  // 3 from opset 14 (checked by inference)
    def.attributes = {{"epsilon", AttrKind::kFloat, false},       // default 1e-5
                      {"momentum", AttrKind::kFloat, false},      // default 0.9
                      {"spatial", AttrKind::kInt, false},         // opset 7-8, default 1
                      {"training_mode", AttrKind::kInt, false}};  // opset 14+, default 0
    def.infer = InferBatchNormalization;
    def.summary = "per-channel normalization of X [N,C,...] by mean/var (batch stats in training)";
    registry.Register(std::move(def));
  }
  {
    OpDef def;
    def.op_type = "BatchNormalizationTraining";
    def.domain = kCastorDomain;
    def.min_opset = 1;
    def.max_opset = 1;
    def.min_inputs = 5;
    def.max_inputs = 5;
    def.min_outputs = 3;
    def.max_outputs = 5;  // + the batch mean and variance
    def.attributes = {{"epsilon", AttrKind::kFloat, false},   // default 1e-5
                      {"momentum", AttrKind::kFloat, false},  // default 0.9
                      {"relu", AttrKind::kInt, false}};       // default 0
    def.infer = InferBatchNormalizationTraining;
    def.summary =
        "castor's training BatchNormalization (PyTorch's train()): Y from batch statistics; "
        "running_var updated with the unbiased batch variance";
    registry.Register(std::move(def));
  }
  for (const std::string domain : {"", kCastorDomain}) {
    const bool onnx = domain.empty();
    OpDef def;
    def.op_type = "LayerNormalization";
    def.domain = domain;
    def.min_opset = onnx ? 17 : 1;
    def.max_opset = onnx ? kMaxOnnxOpset : 1;
    def.min_inputs = 2;
    def.max_inputs = 3;
    def.min_outputs = 1;
    def.max_outputs = 3;
    def.attributes = {{"axis", AttrKind::kInt, false},         // default -1
                      {"epsilon", AttrKind::kFloat, false},    // default 1e-5
                      {"stash_type", AttrKind::kInt, false}};  // default 1 (float32)
    def.infer = onnx ? InferLayerNormalization : InferCastorLayerNormalization;
    def.summary = "normalizes X over the axes from `axis` on, then Y = norm * Scale + B";
    if (!onnx) {
      def.summary +=
          " (castor's form for the training graph: Scale and B may be float32 with a 16-bit X)";
    }
    registry.Register(std::move(def));
  }
  {
    OpDef def;
    def.op_type = "InstanceNormalization";
    def.min_opset = kMinOnnxOpset;
    def.max_opset = kMaxOnnxOpset;
    def.min_inputs = 3;
    def.max_inputs = 3;
    def.min_outputs = 1;
    def.max_outputs = 1;
    def.attributes = {{"epsilon", AttrKind::kFloat, false}};  // default 1e-5
    def.infer = InferInstanceNormalization;
    def.summary =
        "normalizes each (n, c) slice of X [N,C,D1,...] over D1,... then Y = norm * scale[c] + "
        "B[c]";
    registry.Register(std::move(def));
  }
}

}  // namespace castor
