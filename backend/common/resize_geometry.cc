// Resize's geometry (see resize_geometry.h).
#include "backend/common/resize_geometry.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/dims.h"
#include "graph/status.h"

namespace castor::common {
namespace {

// The input coordinate output index `x` maps to along an axis resized from
// `in` to `out` elements by `scale` (ONNX coordinate_transformation_mode).
double SourceCoordinate(const std::string& mode, int64_t x, int64_t in, int64_t out,
                        double scale) {
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners") {
    // The resized length is in * scale, unrounded (ONNX's reference; it
    // differs from `out` only for scales whose product is not whole).
    return out == 1 ? 0.0 : static_cast<double>(x) * (in - 1) / (in * scale - 1.0);
  }
  if (mode == "asymmetric") return x / scale;
  if (mode == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

// The input index nearest_mode picks for coordinate `x` (before clamping).
int64_t NearestIndex(const std::string& mode, double x, double scale) {
  if (mode == "simple") {  // Resize-10: down when upsampling, up when downsampling
    return static_cast<int64_t>(scale < 1.0 ? std::ceil(x) : std::trunc(x));
  }
  if (mode == "floor") return static_cast<int64_t>(std::floor(x));
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  const bool half = x == std::floor(x) + 0.5;
  if (mode == "round_prefer_ceil") {
    return static_cast<int64_t>(half ? std::ceil(x) : std::round(x));
  }
  return static_cast<int64_t>(half ? std::floor(x) : std::round(x));  // round_prefer_floor
}

bool OneOf(const std::string& value, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (value == a) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<ResizeGeometry> PlanResize(const KernelContext& ctx,
                                          const std::vector<int64_t>& in_dims,
                                          const std::vector<float>& scales,
                                          const std::vector<int64_t>& sizes, bool opset10) {
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  const std::string mode = ctx.GetString("mode", "nearest");
  const std::string transform =
      opset10 ? "asymmetric" : ctx.GetString("coordinate_transformation_mode", "half_pixel");
  const std::string nearest_mode =
      opset10 ? "simple" : ctx.GetString("nearest_mode", "round_prefer_floor");
  if (mode == "cubic") {
    return ctx.Unimplemented("mode \"cubic\" (castor resizes with nearest and linear)");
  }
  if (mode != "nearest" && mode != "linear") {
    return ctx.Error(absl::StrCat("attribute 'mode' is \"", mode,
                                  "\"; expected \"nearest\", \"linear\" or \"cubic\""));
  }
  if (transform == "tf_crop_and_resize") {
    return ctx.Unimplemented("coordinate_transformation_mode \"tf_crop_and_resize\"");
  }
  if (!OneOf(transform, {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                         "tf_half_pixel_for_nn"})) {
    return ctx.Error(absl::StrCat("attribute 'coordinate_transformation_mode' is \"", transform,
                                  "\"; expected half_pixel, pytorch_half_pixel, align_corners, "
                                  "asymmetric, tf_half_pixel_for_nn or tf_crop_and_resize"));
  }
  if (!OneOf(nearest_mode, {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"})) {
    return ctx.Error(absl::StrCat("attribute 'nearest_mode' is \"", nearest_mode,
                                  "\"; expected round_prefer_floor, round_prefer_ceil, floor or "
                                  "ceil"));
  }
  if (ctx.GetInt("antialias", 0) != 0) return ctx.Unimplemented("antialias = 1");
  const std::string policy = ctx.GetString("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch") {
    return ctx.Unimplemented(absl::StrCat("keep_aspect_ratio_policy \"", policy, "\""));
  }
  if (rank == 0 || rank > kMaxResizeRank) {
    return ctx.Error(absl::StrCat("input X is ", DimsToString(in_dims), "; expected rank 1 to ",
                                  kMaxResizeRank));
  }
  if (scales.empty() == sizes.empty()) {
    return ctx.Error(absl::StrCat("give exactly one of scales (", scales.size(),
                                  " values) and sizes (", sizes.size(), " values)"));
  }
  // The axes scales/sizes list: opset 18's `axes`, else all.
  std::vector<int64_t> axes;
  const std::vector<int64_t> axes_attribute = ctx.GetInts("axes");
  if (!axes_attribute.empty()) {
    for (int64_t axis : axes_attribute) {
      if (axis < -rank || axis >= rank) {
        return ctx.Error(absl::StrCat("axes entry ", axis, " is out of range for rank ", rank));
      }
      axes.push_back(axis < 0 ? axis + rank : axis);
    }
  } else {
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  }
  const size_t given = scales.empty() ? sizes.size() : scales.size();
  if (given != axes.size()) {
    return ctx.Error(absl::StrCat(scales.empty() ? "sizes" : "scales", " has ", given,
                                  " values; expected ", axes.size(), " (one per axis of X ",
                                  DimsToString(in_dims), ")"));
  }
  ResizeGeometry g;
  g.out_dims = in_dims;
  std::vector<double> axis_scale(rank, 1.0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t a = axes[k];
    if (!scales.empty()) {
      if (!(scales[k] > 0.0f)) {
        return ctx.Error(absl::StrCat("scales [", absl::StrJoin(scales, ","),
                                      "] must be positive"));
      }
      axis_scale[a] = scales[k];
      g.out_dims[a] = static_cast<int64_t>(std::floor(in_dims[a] * static_cast<double>(scales[k])));
    } else {
      if (sizes[k] < 0) {
        return ctx.Error(absl::StrCat("sizes [", absl::StrJoin(sizes, ","),
                                      "] must not be negative"));
      }
      g.out_dims[a] = sizes[k];
      axis_scale[a] = in_dims[a] > 0 ? static_cast<double>(sizes[k]) / in_dims[a] : 1.0;
    }
    if (g.out_dims[a] > 0 && in_dims[a] == 0) {
      return ctx.Error(absl::StrCat("cannot resize the empty axis ", a, " of X ",
                                    DimsToString(in_dims), " to ", g.out_dims[a]));
    }
  }
  const bool linear = mode == "linear";
  const std::vector<int64_t> strides = ContiguousStrides(in_dims);
  g.indexer.rank = static_cast<int>(rank);
  bool leading_identity = true;
  for (int64_t a = 0; a < rank; ++a) {
    const int64_t in = in_dims[a], out = g.out_dims[a];
    g.indexer.out_dims[a] = out;
    g.indexer.in_strides[a] = strides[a];
    g.indexer.tap_offsets[a] = static_cast<int64_t>(g.taps.size());
    bool identity = in == out;
    for (int64_t x = 0; x < out; ++x) {
      const double source = SourceCoordinate(transform, x, in, out, axis_scale[a]);
      ResizeTap tap;
      if (linear) {
        const double clamped = std::clamp(source, 0.0, static_cast<double>(in - 1));
        tap.first = static_cast<int64_t>(std::floor(clamped));
        tap.second = std::min(tap.first + 1, in - 1);
        tap.frac = static_cast<float>(clamped - static_cast<double>(tap.first));
        if (tap.second == tap.first) tap.frac = 0.0f;
      } else {
        tap.first = std::clamp<int64_t>(NearestIndex(nearest_mode, source, axis_scale[a]), 0,
                                        in - 1);
        tap.second = tap.first;
      }
      identity = identity && tap.first == x && tap.frac == 0.0f;
      g.taps.push_back(tap);
    }
    if (leading_identity && identity) {
      g.blocks *= out;
    } else {
      leading_identity = false;
    }
  }
  const int64_t out_total = DimsProduct(g.out_dims, 0, g.out_dims.size());
  const int64_t in_total = DimsProduct(in_dims, 0, in_dims.size());
  if (g.blocks > 0) {
    g.out_block = out_total / g.blocks;
    g.in_block = in_total / g.blocks;
  }
  return g;
}

}  // namespace castor::common
