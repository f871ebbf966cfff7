// Reductions: ReduceMean/Sum/Max/Min/Prod/L1/L2/SumSquare/LogSumExp, the
// index reductions ArgMax/ArgMin and the scan CumSum. Their opset story:
// `axes` is an attribute until ReduceSum-13 / the others' version 18, then an
// optional input together with `noop_with_empty_axes`; bfloat16 arrives at
// opset 13, int8/uint8 for ReduceMax/Min at 12 and bool at 20.
#include <algorithm>
#include <climits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

// Normalises `axes` against `rank`, rejecting out-of-range and repeated axes.
absl::StatusOr<std::vector<bool>> ReducedAxesMask(const InferenceContext& ctx,
                                                  const std::vector<int64_t>& axes, int rank) {
  std::vector<bool> reduced(rank, false);
  for (int64_t axis : axes) {
    CASTOR_ASSIGN_OR_RETURN(int64_t a, ops::NormalizeAxis(ctx, axis, rank));
    if (reduced[a]) return ctx.Error(absl::StrCat("axis ", axis, " is listed twice in axes"));
    reduced[a] = true;
  }
  return reduced;
}

// The reduced shape of `input` when the axes are known (`axes`, nullopt when
// unknown). `axes_count` is the number of axes when at least that is known
// (the static length of an axes input), else -1.
absl::StatusOr<Shape> ReducedShape(const InferenceContext& ctx, const Shape& input,
                                   const std::optional<std::vector<int64_t>>& axes,
                                   int64_t axes_count, bool keepdims, bool noop_with_empty_axes) {
  if (!input.rank_known()) return Shape::Unknown();
  const int rank = input.rank();
  if (!axes) {
    if (keepdims) {
      // Each dim stays or becomes 1: only a static 1 is certain.
      std::vector<Dim> dims;
      for (const Dim& d : input.dims()) {
        dims.push_back(d.is_static() && d.value() == 1 ? Dim(1) : Dim::Unknown());
      }
      return Shape(std::move(dims));
    }
    if (axes_count == 0) return noop_with_empty_axes ? input : Shape::Scalar();
    if (axes_count > 0 && axes_count <= rank) {
      return Shape(std::vector<Dim>(rank - axes_count, Dim::Unknown()));
    }
    return Shape::Unknown();
  }
  if (axes->empty() && noop_with_empty_axes) return input;
  std::vector<bool> reduced(rank, true);
  if (!axes->empty()) {
    CASTOR_ASSIGN_OR_RETURN(reduced, ReducedAxesMask(ctx, *axes, rank));
  }
  std::vector<Dim> dims;
  for (int i = 0; i < rank; ++i) {
    if (!reduced[i]) {
      dims.push_back(input[i]);
    } else if (keepdims) {
      dims.push_back(Dim(1));
    }
  }
  return Shape(std::move(dims));
}

// The dtypes a Reduce* op accepts at the model's opset.
std::vector<DType> ReduceTypes(const InferenceContext& ctx, bool is_max_or_min) {
  std::vector<DType> types = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                              DType::kFloat64, DType::kInt32,    DType::kInt64,
                              DType::kUInt32,  DType::kUInt64};
  if (is_max_or_min && ctx.opset() >= 12) {
    types.push_back(DType::kInt8);
    types.push_back(DType::kUInt8);
  }
  if (is_max_or_min && ctx.opset() >= 20) types.push_back(DType::kBool);
  return ops::WithBFloat16Since(ctx, std::move(types), 13);
}

InferFn MakeReduceInfer(int64_t axes_input_since, bool is_max_or_min) {
  return [axes_input_since, is_max_or_min](InferenceContext& ctx) -> absl::Status {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ReduceTypes(ctx, is_max_or_min)));
    const bool axes_is_input = ctx.opset() >= axes_input_since;
    if (!axes_is_input && ctx.num_inputs() > 1) {
      return ctx.Error(absl::StrCat("takes one input before opset ", axes_input_since,
                                    " (axes is an attribute); got ", ctx.num_inputs()));
    }
    if (!axes_is_input && ctx.has_attribute("noop_with_empty_axes")) {
      return ctx.Error(absl::StrCat("attribute 'noop_with_empty_axes' exists from opset ",
                                    axes_input_since, "; the model imports opset ",
                                    ctx.opset()));
    }
    int64_t axes_count = -1;
    if (axes_is_input && ctx.has_input(1)) {
      CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
      const Shape& axes_shape = ctx.input_shape(1);
      if (axes_shape.rank_known() && axes_shape.rank() != 1) {
        return ctx.Error(absl::StrCat("input 1 (axes) must be 1-D; got shape ",
                                      axes_shape.ToString()));
      }
      if (axes_shape.rank_known() && axes_shape[0].is_static()) axes_count = axes_shape[0].value();
    }
    CASTOR_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes,
                            ops::ReadAxes(ctx, axes_input_since, 1));
    const bool keepdims = ctx.GetInt("keepdims", 1) != 0;
    const bool noop = axes_is_input && ctx.GetInt("noop_with_empty_axes", 0) != 0;
    CASTOR_ASSIGN_OR_RETURN(
        Shape shape, ReducedShape(ctx, ctx.input_shape(0), axes, axes_count, keepdims, noop));
    ctx.SetOutput(0, ctx.input_dtype(0), std::move(shape));
    return absl::OkStatus();
  };
}

void RegisterReduce(OpRegistry& registry, const std::string& op_type, int64_t axes_input_since,
                    bool is_max_or_min, const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.min_opset = kMinOnnxOpset;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = 1;
  def.max_inputs = 2;
  def.attributes = {{"axes", AttrKind::kInts},
                    {"keepdims", AttrKind::kInt},
                    {"noop_with_empty_axes", AttrKind::kInt}};
  def.infer = MakeReduceInfer(axes_input_since, is_max_or_min);
  def.summary = summary;
  registry.Register(std::move(def));
}

// ArgMax / ArgMin: one `axis`, int64 indices out.
absl::Status InferArgReduce(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      ops::WithBFloat16Since(ctx,
                             {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                              DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                              DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64},
                             13)));
  if (ctx.opset() < 12 && ctx.has_attribute("select_last_index")) {
    return ctx.Error(absl::StrCat("attribute 'select_last_index' exists from opset 12; the model "
                                  "imports opset ",
                                  ctx.opset()));
  }
  const Shape& input = ctx.input_shape(0);
  const bool keepdims = ctx.GetInt("keepdims", 1) != 0;
  Shape shape;
  if (input.rank_known()) {
    CASTOR_ASSIGN_OR_RETURN(
        shape, ReducedShape(ctx, input, std::vector<int64_t>{ctx.GetInt("axis", 0)}, 1, keepdims,
                            /*noop_with_empty_axes=*/false));
  }
  ctx.SetOutput(0, DType::kInt64, std::move(shape));
  return absl::OkStatus();
}

absl::Status InferCumSum(InferenceContext& ctx) {
  std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kInt32,
                              DType::kInt64,   DType::kUInt32,  DType::kUInt64};
  if (ctx.opset() >= 14) {
    types.push_back(DType::kFloat16);
    types.push_back(DType::kBFloat16);
  }
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, types));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt32, DType::kInt64}));
  const Shape& axis_shape = ctx.input_shape(1);
  if (axis_shape.rank_known() &&
      !(axis_shape.rank() == 0 ||
        (axis_shape.rank() == 1 && axis_shape[0].is_static() && axis_shape[0].value() == 1))) {
    return ctx.Error(absl::StrCat("input 1 (axis) must be a scalar; got shape ",
                                  axis_shape.ToString()));
  }
  const Shape& input = ctx.input_shape(0);
  if (input.rank_known()) {
    if (std::optional<std::vector<int64_t>> axis = ops::ReadConstantInts(ctx, 1)) {
      if (axis->size() != 1) return ctx.Error("input 1 (axis) must hold one value");
      CASTOR_RETURN_IF_ERROR(ops::NormalizeAxis(ctx, (*axis)[0], input.rank()).status());
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), input);
  return absl::OkStatus();
}

}  // namespace

void RegisterReduceOps(OpRegistry& registry) {
  RegisterReduce(registry, "ReduceMean", 18, false, "Mean of the elements over the given axes.");
  RegisterReduce(registry, "ReduceSum", 13, false, "Sum of the elements over the given axes.");
  RegisterReduce(registry, "ReduceMax", 18, true, "Maximum of the elements over the given axes.");
  RegisterReduce(registry, "ReduceMin", 18, true, "Minimum of the elements over the given axes.");
  RegisterReduce(registry, "ReduceProd", 18, false,
                 "Product of the elements over the given axes.");
  RegisterReduce(registry, "ReduceL1", 18, false,
                 "Sum of absolute values over the given axes (L1 norm).");
  RegisterReduce(registry, "ReduceL2", 18, false,
                 "Square root of the sum of squares over the given axes (L2 norm).");
  RegisterReduce(registry, "ReduceSumSquare", 18, false,
                 "Sum of squared elements over the given axes.");
  RegisterReduce(registry, "ReduceLogSumExp", 18, false,
                 "log(sum(exp(x))) over the given axes.");

  for (const char* op_type : {"ArgMax", "ArgMin"}) {
    OpDef def;
    def.op_type = op_type;
    def.min_opset = kMinOnnxOpset;
    def.max_opset = kMaxOnnxOpset;
    def.min_inputs = 1;
    def.max_inputs = 1;
    def.attributes = {{"axis", AttrKind::kInt},
                      {"keepdims", AttrKind::kInt},
                      {"select_last_index", AttrKind::kInt}};
    def.infer = InferArgReduce;
    def.summary = std::string("Index (int64) of the ") +
                  (def.op_type == "ArgMax" ? "largest" : "smallest") +
                  " element along one axis.";
    registry.Register(std::move(def));
  }

  OpDef cumsum;
  cumsum.op_type = "CumSum";
  cumsum.min_opset = 11;
  cumsum.max_opset = kMaxOnnxOpset;
  cumsum.min_inputs = 2;
  cumsum.max_inputs = 2;
  cumsum.attributes = {{"exclusive", AttrKind::kInt}, {"reverse", AttrKind::kInt}};
  cumsum.infer = InferCumSum;
  cumsum.summary = "Cumulative sum along the axis given as input 1.";
  registry.Register(std::move(cumsum));
}

}  // namespace castor
