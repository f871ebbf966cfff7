// Cast, Constant, Identity, Dropout, Range and ConstantOfShape: ops whose
// output dtype comes from an attribute or that pass data through. Opset
// history handled here: Cast gains string at 9, bfloat16 at 13 and
// `saturate` (float8 only, so ignored) at 19; Constant gains sparse_value at
// 11 and the value_* shorthands at 12; Dropout's mask is the data type until
// 10 (then bool) and its ratio moves from attribute to input at 12.
#include <algorithm>
#include <cmath>
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

std::vector<DType> AllTypesAt(const InferenceContext& ctx) {
  return ops::WithBFloat16Since(ctx, ops::AllTypes(), 13);
}

// Checks input `i` is a scalar (when its rank is known); `what` names it.
absl::Status RequireScalar(const InferenceContext& ctx, int i, const char* what) {
  const Shape& shape = ctx.input_shape(i);
  if (shape.rank_known() && shape.rank() != 0) {
    return ctx.Error(absl::StrCat("input ", i, " (", what, ") must be a scalar; got shape ",
                                  shape.ToString()));
  }
  return absl::OkStatus();
}

// The shape value of a 0-D/1-D integer tensor: its entries as dims
// (negative entries, meaningless as dims, become unknown).
std::optional<InferenceContext::ShapeValue> ShapeValueOf(const Tensor& t) {
  if ((t.dtype() != DType::kInt64 && t.dtype() != DType::kInt32) || t.dims().size() > 1) {
    return std::nullopt;
  }
  InferenceContext::ShapeValue value;
  for (int64_t v : t.ToInt64Vector()) value.push_back(v >= 0 ? Dim(v) : Dim::Unknown());
  return value;
}

// ---- Cast --------------------------------------------------------------------

// The dtypes Cast accepts (in and out) at the model's opset.
std::vector<DType> CastTypes(const InferenceContext& ctx) {
  std::vector<DType> types = AllTypesAt(ctx);
  if (ctx.opset() < 9) std::erase(types, DType::kString);
  return types;
}

absl::Status InferCast(InferenceContext& ctx) {
  if (!ctx.has_attribute("to")) return ctx.Error("attribute 'to' is required");
  const Attribute* to_attr = ctx.node().attribute("to");
  if (to_attr->kind != AttrKind::kInt) {
    return ctx.Error(absl::StrCat("attribute 'to' must be an int (an ONNX TensorProto.DataType "
                                  "code); got a ",
                                  AttrKindName(to_attr->kind)));
  }
  const int64_t code = to_attr->i;
  absl::StatusOr<DType> to = DTypeFromOnnx(static_cast<int32_t>(code));
  if (!to.ok()) {
    return ctx.Error(absl::StrCat("cannot cast to 'to' = ", code, ": ",
                                  std::string(to.status().message())));
  }
  const std::vector<DType> types = CastTypes(ctx);
  if (std::find(types.begin(), types.end(), *to) == types.end()) {
    return ctx.Error(absl::StrCat("casting to ", DTypeName(*to), " needs a newer opset than ",
                                  ctx.opset(), " (bfloat16: 13, string: 9)"));
  }
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, types));
  if (ctx.opset() < 19 && ctx.has_attribute("saturate")) {
    return ctx.Error(absl::StrCat("attribute 'saturate' exists from opset 19; the model imports "
                                  "opset ",
                                  ctx.opset()));
  }
  // `saturate` and `round_mode` only affect float8 targets, which castor
  // does not carry: nothing to check beyond their presence.
  ctx.SetOutput(0, *to, ctx.input_shape(0));
  const auto& value = ctx.input_shape_value(0);
  if (value && (*to == DType::kInt64 || *to == DType::kInt32)) {
    ctx.SetOutputShapeValue(0, *value);
  }
  return absl::OkStatus();
}

// ---- Constant ----------------------------------------------------------------

absl::Status InferConstant(InferenceContext& ctx) {
  static const char* const kValueAttributes[] = {
      "value",     "sparse_value", "value_float",  "value_floats",
      "value_int", "value_ints",   "value_string", "value_strings"};
  std::vector<std::string> present;
  for (const char* name : kValueAttributes) {
    if (ctx.has_attribute(name)) present.push_back(name);
  }
  if (present.size() != 1) {
    return ctx.Error(absl::StrCat("needs exactly one of the value attributes (value, "
                                  "sparse_value, value_float(s), value_int(s), "
                                  "value_string(s)); got ",
                                  present.size()));
  }
  const std::string& name = present[0];
  if (name == "sparse_value") {
    if (ctx.opset() < 11) return ctx.Error("attribute 'sparse_value' exists from opset 11");
    return ctx.Error("sparse constants (attribute 'sparse_value') are not supported by castor; "
                     "convert the constant to a dense 'value' tensor");
  }
  if (name != "value" && ctx.opset() < 12) {
    return ctx.Error(absl::StrCat("attribute '", name, "' exists from opset 12; the model "
                                  "imports opset ",
                                  ctx.opset()));
  }
  const Attribute* attr = ctx.node().attribute(name);
  auto require_kind = [&](AttrKind kind) -> absl::Status {
    if (attr->kind != kind) {
      return ctx.Error(absl::StrCat("attribute '", name, "' must be of kind ", AttrKindName(kind),
                                    "; got ", AttrKindName(attr->kind)));
    }
    return absl::OkStatus();
  };
  if (name == "value") {
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kTensor));
    const Tensor& t = attr->t;
    std::vector<DType> types = AllTypesAt(ctx);
    if (ctx.opset() < 9) types = {DType::kFloat16, DType::kFloat32, DType::kFloat64};
    if (std::find(types.begin(), types.end(), t.dtype()) == types.end()) {
      return ctx.Error(absl::StrCat("a ", DTypeName(t.dtype()),
                                    " constant is not allowed at opset ", ctx.opset()));
    }
    ctx.SetOutput(0, t.dtype(), t.shape());
    if (auto value = ShapeValueOf(t)) ctx.SetOutputShapeValue(0, *std::move(value));
  } else if (name == "value_float") {
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kFloat));
    ctx.SetOutput(0, DType::kFloat32, Shape::Scalar());
  } else if (name == "value_floats") {
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kFloats));
    ctx.SetOutput(0, DType::kFloat32, Shape({Dim(static_cast<int64_t>(attr->floats.size()))}));
  } else if (name == "value_int") {
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kInt));
    ctx.SetOutput(0, DType::kInt64, Shape::Scalar());
    ctx.SetOutputShapeValue(0, {attr->i >= 0 ? Dim(attr->i) : Dim::Unknown()});
  } else if (name == "value_ints") {
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kInts));
    ctx.SetOutput(0, DType::kInt64, Shape({Dim(static_cast<int64_t>(attr->ints.size()))}));
    ctx.SetOutputShapeValue(0, *ShapeValueOf(Tensor::Int64s(attr->ints)));
  } else if (name == "value_string") {
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kString));
    ctx.SetOutput(0, DType::kString, Shape::Scalar());
  } else {  // value_strings
    CASTOR_RETURN_IF_ERROR(require_kind(AttrKind::kStrings));
    ctx.SetOutput(0, DType::kString, Shape({Dim(static_cast<int64_t>(attr->strings.size()))}));
  }
  return absl::OkStatus();
}

// ---- Identity ----------------------------------------------------------------

absl::Status InferIdentity(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  if (const auto& value = ctx.input_shape_value(0)) ctx.SetOutputShapeValue(0, *value);
  return absl::OkStatus();
}

// ---- Dropout -----------------------------------------------------------------

absl::Status InferDropout(InferenceContext& ctx) {
  const int64_t opset = ctx.opset();
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      ops::WithBFloat16Since(ctx, {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                   DType::kFloat64},
                             13)));
  if (opset < 12) {
    if (ctx.num_inputs() > 1) {
      return ctx.Error(absl::StrCat("takes one input before opset 12 (ratio is an attribute); "
                                    "got ",
                                    ctx.num_inputs()));
    }
    if (ctx.has_attribute("seed")) return ctx.Error("attribute 'seed' exists from opset 12");
  } else {
    if (ctx.has_attribute("ratio")) {
      return ctx.Error("'ratio' is an input since opset 12, not an attribute");
    }
    if (ctx.has_input(1)) {
      CASTOR_RETURN_IF_ERROR(ops::RequireDType(
          ctx, 1,
          ops::WithBFloat16Since(ctx, {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                       DType::kFloat64},
                                 22)));
      CASTOR_RETURN_IF_ERROR(RequireScalar(ctx, 1, "ratio"));
    }
    if (ctx.has_input(2)) {
      CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 2, {DType::kBool}));
      CASTOR_RETURN_IF_ERROR(RequireScalar(ctx, 2, "training_mode"));
    }
  }
  const float ratio = ctx.GetFloat("ratio", 0.5f);
  if (opset < 12 && !(ratio >= 0.0f && ratio < 1.0f)) {
    return ctx.Error(absl::StrCat("ratio ", ratio, " is outside [0, 1)"));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  // The mask is the data's type until opset 10, bool from then on.
  ctx.SetOutput(1, opset < 10 ? ctx.input_dtype(0) : DType::kBool, ctx.input_shape(0));
  return absl::OkStatus();
}

// castor's DropoutTraining: data, ratio (optional), RNG state int64 [2].
absl::Status InferDropoutTraining(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::FloatTypes()));
  if (ctx.has_input(1)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, ops::FloatTypes()));
    CASTOR_RETURN_IF_ERROR(RequireScalar(ctx, 1, "ratio"));
    const Tensor* ratio = ctx.input_constant(1);
    if (ratio != nullptr && ratio->num_elements() == 1) {
      const double r = ratio->GetDouble(0);
      if (!(r >= 0.0 && r < 1.0)) return ctx.Error(absl::StrCat("ratio ", r, " is outside [0, 1)"));
    }
  }
  if (!ctx.has_input(2)) {
    return ctx.Error("input 2 (the RNG state, int64 [seed, counter]) is missing");
  }
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 2, {DType::kInt64}));
  const Shape& state = ctx.input_shape(2);
  if (state.rank_known() &&
      (state.rank() != 1 || (state[0].is_static() && state[0].value() != 2))) {
    return ctx.Error(absl::StrCat("input 2 (the RNG state) must be int64 [2] (seed, counter); got ",
                                  state.ToString()));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  ctx.SetOutput(1, DType::kBool, ctx.input_shape(0));
  return absl::OkStatus();
}

// ---- Range -------------------------------------------------------------------

// The entry count of Range(start, limit, delta): max(ceil((limit-start)/delta), 0).
absl::StatusOr<int64_t> RangeLength(const InferenceContext& ctx, const Tensor& start,
                                    const Tensor& limit, const Tensor& delta) {
  if (IsInteger(start.dtype())) {
    const int64_t s = start.GetInt64(0), l = limit.GetInt64(0), d = delta.GetInt64(0);
    if (d == 0) return ctx.Error("delta is 0");
    const int64_t span = l - s;
    if ((span > 0) != (d > 0) || span == 0) return 0;
    return (span + d + (d > 0 ? -1 : 1)) / d;
  }
  const double s = start.GetDouble(0), l = limit.GetDouble(0), d = delta.GetDouble(0);
  if (d == 0) return ctx.Error("delta is 0");
  return static_cast<int64_t>(std::max(std::ceil((l - s) / d), 0.0));
}

absl::Status InferRange(InferenceContext& ctx) {
  const std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kInt16,
                                    DType::kInt32, DType::kInt64};
  const char* const kNames[] = {"start", "limit", "delta"};
  for (int i = 0; i < 3; ++i) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, i, types));
    CASTOR_RETURN_IF_ERROR(RequireScalar(ctx, i, kNames[i]));
  }
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
  const DType dtype = ctx.input_dtype(0);
  const Tensor* start = ctx.input_constant(0);
  const Tensor* limit = ctx.input_constant(1);
  const Tensor* delta = ctx.input_constant(2);
  if (!start || !limit || !delta) {
    ctx.SetOutput(0, dtype, Shape({Dim()}));
    return absl::OkStatus();
  }
  for (const Tensor* t : {start, limit, delta}) {
    if (t->num_elements() != 1) return ctx.Error("start, limit and delta must hold one value");
  }
  CASTOR_ASSIGN_OR_RETURN(const int64_t length, RangeLength(ctx, *start, *limit, *delta));
  ctx.SetOutput(0, dtype, Shape({Dim(length)}));
  // Small integer ranges are shape values (e.g. axes lists built by Range).
  constexpr int64_t kMaxShapeValueLength = 64;
  if ((dtype == DType::kInt64 || dtype == DType::kInt32) && length <= kMaxShapeValueLength) {
    InferenceContext::ShapeValue value;
    for (int64_t k = 0, v = start->GetInt64(0); k < length; ++k, v += delta->GetInt64(0)) {
      value.push_back(v >= 0 ? Dim(v) : Dim::Unknown());
    }
    ctx.SetOutputShapeValue(0, std::move(value));
  }
  return absl::OkStatus();
}

// ---- ConstantOfShape ---------------------------------------------------------

absl::Status InferConstantOfShape(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, {DType::kInt64}));
  const Shape& shape_shape = ctx.input_shape(0);
  if (shape_shape.rank_known() && shape_shape.rank() != 1) {
    return ctx.Error(absl::StrCat("input 0 (shape) must be 1-D; got shape ",
                                  shape_shape.ToString()));
  }
  DType dtype = DType::kFloat32;
  if (const Attribute* value = ctx.node().attribute("value")) {
    if (value->kind != AttrKind::kTensor) {
      return ctx.Error(absl::StrCat("attribute 'value' must be a tensor; got a ",
                                    AttrKindName(value->kind)));
    }
    if (value->t.num_elements() != 1) {
      return ctx.Error(absl::StrCat("attribute 'value' must hold one element; it holds ",
                                    value->t.num_elements()));
    }
    dtype = value->t.dtype();
    std::vector<DType> types = ops::WithBFloat16Since(ctx, ops::AllTypes(), 20);
    std::erase(types, DType::kString);
    if (std::find(types.begin(), types.end(), dtype) == types.end()) {
      return ctx.Error(absl::StrCat("a ", DTypeName(dtype), " fill value is not allowed at opset ",
                                    ctx.opset()));
    }
  }
  Shape output;
  if (const auto& value = ctx.input_shape_value(0)) {
    output = Shape(*value);
  } else if (shape_shape.rank_known() && shape_shape[0].is_static()) {
    output = Shape(std::vector<Dim>(shape_shape[0].value()));
  }
  if (const Tensor* constant = ctx.input_constant(0)) {
    for (int64_t d : constant->ToInt64Vector()) {
      if (d < 0) return ctx.Error(absl::StrCat("shape entry ", d, " is negative"));
    }
  }
  ctx.SetOutput(0, dtype, std::move(output));
  return absl::OkStatus();
}

using ops::MakeDef;

}  // namespace

void RegisterMiscOps(OpRegistry& registry) {
  registry.Register(MakeDef("Cast", kMinOnnxOpset, 1, 1,
                            {{"to", AttrKind::kInt, /*required=*/true},
                             {"saturate", AttrKind::kInt},
                             {"round_mode", AttrKind::kString}},
                            InferCast, "Converts the elements to the dtype `to`."));
  OpDef constant = MakeDef("Constant", kMinOnnxOpset, 0, 0,
                           {{"value", AttrKind::kTensor},
                            {"sparse_value", AttrKind::kSparseTensor},
                            {"value_float", AttrKind::kFloat},
                            {"value_floats", AttrKind::kFloats},
                            {"value_int", AttrKind::kInt},
                            {"value_ints", AttrKind::kInts},
                            {"value_string", AttrKind::kString},
                            {"value_strings", AttrKind::kStrings}},
                           InferConstant, "A constant tensor given by one value attribute.");
  registry.Register(std::move(constant));
  registry.Register(MakeDef("Identity", kMinOnnxOpset, 1, 1, {}, InferIdentity,
                            "Passes the input through unchanged."));
  OpDef dropout = MakeDef("Dropout", kMinOnnxOpset, 1, 3,
                          {{"ratio", AttrKind::kFloat}, {"seed", AttrKind::kInt}}, InferDropout,
                          "Zeroes random elements in training (scaling the rest); identity in "
                          "inference. Optional mask output.");
  dropout.max_outputs = 2;
  registry.Register(std::move(dropout));
  {
    OpDef def;
    def.op_type = "DropoutTraining";
    def.domain = kCastorDomain;
    def.min_opset = 1;
    def.max_opset = 1;
    def.min_inputs = 1;  // the ratio may be omitted; inference asks for the state
    def.max_inputs = 3;
    def.min_outputs = 1;
    def.max_outputs = 2;
    def.infer = InferDropoutTraining;
    def.summary =
        "castor's training Dropout: keeps each element with probability 1 - ratio (scaled by "
        "1/(1-ratio)), the mask a function of the RNG state input [seed, counter] and the node";
    registry.Register(std::move(def));
  }
  registry.Register(MakeDef("Range", 11, 3, 3, {}, InferRange,
                            "1-D sequence start, start+delta, ... up to (excluding) limit."));
  registry.Register(MakeDef("ConstantOfShape", 9, 1, 1, {{"value", AttrKind::kTensor}},
                            InferConstantOfShape,
                            "A tensor of the shape input, filled with `value` (default 0.0f)."));
}

}  // namespace castor
