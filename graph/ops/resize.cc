// Resize (opsets 10-19 forms): scales an input by interpolation. Opset 10
// takes (X, scales) and resizes as Upsample did (asymmetric coordinates);
// 11 added roi, sizes, coordinate_transformation_mode, nearest_mode and
// cubic mode (roi and scales required, possibly empty); from 13 roi and
// scales are optional; 18 added axes, antialias and
// keep_aspect_ratio_policy. What torch.onnx.export writes for nn.Upsample /
// F.interpolate (nearest: asymmetric + floor; bilinear: half_pixel,
// pytorch_half_pixel or align_corners) is what the kernels compute
// (backend/common/resize_geometry.h); cubic, tf_crop_and_resize and
// antialias are accepted here and refused by the kernels.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

bool IsOneOf(const std::string& value, const std::vector<std::string>& allowed) {
  for (const std::string& a : allowed) {
    if (value == a) return true;
  }
  return false;
}

// An input given and not empty (an empty tensor stands for "absent").
bool Given(const InferenceContext& ctx, int i) {
  if (i >= ctx.num_inputs() || !ctx.has_input(i)) return false;
  const std::optional<int64_t> count = ctx.input_shape(i).NumElements();
  return !count || *count > 0;
}

absl::Status InferResize(InferenceContext& ctx) {
  const int64_t opset = ctx.opset();
  if (opset < 11) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::AllTypes()));
    if (ctx.num_inputs() != 2) {
      return ctx.Error(absl::StrCat("takes (X, scales) before opset 11; got ", ctx.num_inputs(),
                                    " inputs"));
    }
    for (const char* name : {"coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                             "exclude_outside", "extrapolation_value"}) {
      CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, name, 11));
    }
  } else {
    CASTOR_RETURN_IF_ERROR(
        ops::RequireDType(ctx, 0, ops::WithBFloat16Since(ctx, ops::NumericTypes(), 13)));
    if (opset < 13 && (ctx.num_inputs() < 3 || !ctx.has_input(1) || !ctx.has_input(2))) {
      return ctx.Error("inputs roi and scales are required before opset 13 (they may be empty)");
    }
  }
  for (const char* name : {"axes", "antialias", "keep_aspect_ratio_policy"}) {
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, name, 18));
  }
  const std::string mode = ctx.GetString("mode", "nearest");
  if (!IsOneOf(mode, {"nearest", "linear", "cubic"})) {
    return ctx.Error(absl::StrCat("attribute 'mode' is \"", mode,
                                  "\"; expected nearest, linear or cubic"));
  }
  const std::string transform = ctx.GetString("coordinate_transformation_mode", "half_pixel");
  if (!IsOneOf(transform, {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                           "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"})) {
    return ctx.Error(absl::StrCat("attribute 'coordinate_transformation_mode' is \"", transform,
                                  "\"; not an ONNX mode"));
  }
  const std::string nearest = ctx.GetString("nearest_mode", "round_prefer_floor");
  if (!IsOneOf(nearest, {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})) {
    return ctx.Error(absl::StrCat("attribute 'nearest_mode' is \"", nearest,
                                  "\"; expected round_prefer_floor, round_prefer_ceil, floor or "
                                  "ceil"));
  }
  const int scales_at = opset < 11 ? 1 : 2;
  const int sizes_at = opset < 11 ? -1 : 3;
  if (opset >= 11 && ctx.has_input(1)) {
    CASTOR_RETURN_IF_ERROR(
        ops::RequireDType(ctx, 1, {DType::kFloat16, DType::kFloat32, DType::kFloat64}));
  }
  if (scales_at < ctx.num_inputs() && ctx.has_input(scales_at)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, scales_at, {DType::kFloat32}));
  }
  if (sizes_at > 0 && sizes_at < ctx.num_inputs() && ctx.has_input(sizes_at)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, sizes_at, {DType::kInt64}));
  }
  const bool has_scales = Given(ctx, scales_at);
  const bool has_sizes = sizes_at > 0 && Given(ctx, sizes_at);
  if (has_scales && has_sizes) return ctx.Error("give scales or sizes, not both");
  if (!has_scales && !has_sizes) return ctx.Error("one of scales and sizes is required");

  const Shape& input = ctx.input_shape(0);
  const DType dtype = ctx.input_dtype(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  const int rank = input.rank();
  std::vector<int64_t> axes;
  if (ctx.has_attribute("axes")) {
    for (int64_t axis : ctx.GetInts("axes")) {
      CASTOR_ASSIGN_OR_RETURN(const int64_t a, ops::NormalizeAxis(ctx, axis, rank));
      axes.push_back(a);
    }
  } else {
    for (int a = 0; a < rank; ++a) axes.push_back(a);
  }
  std::vector<Dim> dims = input.dims();
  if (has_sizes) {
    if (std::optional<std::vector<int64_t>> sizes = ops::ReadConstantInts(ctx, sizes_at)) {
      if (sizes->size() != axes.size()) {
        return ctx.Error(absl::StrCat("sizes has ", sizes->size(), " values; expected ",
                                      axes.size(), " (one per resized axis)"));
      }
      for (size_t k = 0; k < axes.size(); ++k) dims[axes[k]] = Dim((*sizes)[k]);
    } else {
      for (int64_t a : axes) dims[a] = Dim::Unknown();
    }
  } else if (const Tensor* scales = ctx.input_constant(scales_at)) {
    if (static_cast<size_t>(scales->num_elements()) != axes.size()) {
      return ctx.Error(absl::StrCat("scales has ", scales->num_elements(), " values; expected ",
                                    axes.size(), " (one per resized axis)"));
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      const double scale = static_cast<float>(scales->GetDouble(static_cast<int64_t>(k)));
      if (!(scale > 0)) {
        return ctx.Error(absl::StrCat("scales entry ", k, " is ", scale, "; expected > 0"));
      }
      const Dim& d = input[axes[k]];
      if (scale == 1.0) continue;
      dims[axes[k]] =
          d.is_static() ? Dim(static_cast<int64_t>(std::floor(d.value() * scale))) : Dim::Unknown();
    }
  } else {
    for (int64_t a : axes) dims[a] = Dim::Unknown();
  }
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));
  return absl::OkStatus();
}

}  // namespace

void RegisterResizeOps(OpRegistry& registry) {
  registry.Register(ops::MakeDef(
      "Resize", 10, 1, 4,
      {{"mode", AttrKind::kString},
       {"coordinate_transformation_mode", AttrKind::kString},
       {"nearest_mode", AttrKind::kString},
       {"cubic_coeff_a", AttrKind::kFloat},
       {"exclude_outside", AttrKind::kInt},
       {"extrapolation_value", AttrKind::kFloat},
       {"antialias", AttrKind::kInt},
       {"axes", AttrKind::kInts},
       {"keep_aspect_ratio_policy", AttrKind::kString}},
      InferResize,
      "Resizes X by scales or to sizes, interpolating (nearest, linear or cubic)."));
}

}  // namespace castor
