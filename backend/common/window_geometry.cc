// Window geometry of Conv, ConvTranspose and the pools (see window_geometry.h).
#include "backend/common/window_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor::common {
namespace {

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

}  // namespace

int64_t WindowGeometry::input_size() const { return Product(input); }
int64_t WindowGeometry::kernel_size() const { return Product(kernel); }
int64_t WindowGeometry::output_size() const { return Product(output); }

bool WindowGeometry::pointwise() const {
  for (int d = 0; d < num_spatial; ++d) {
    if (strides[d] != 1 || pad_begin[d] != 0 || pad_end[d] != 0 || kernel[d] != 1) return false;
  }
  return true;
}

absl::StatusOr<std::vector<int64_t>> WindowInts(const KernelContext& ctx, const std::string& name,
                                                size_t count, int64_t fill) {
  if (!ctx.node().has_attribute(name)) return std::vector<int64_t>(count, fill);
  std::vector<int64_t> values = ctx.GetInts(name);
  if (values.size() != count) {
    return ctx.Error(absl::StrCat("attribute '", name, "' has ", values.size(),
                                  " entries; expected ", count));
  }
  return values;
}

namespace {

// A geometry over `input` with `kernel` and the node's strides, dilations
// and pads attributes (the output left for the caller).
absl::StatusOr<WindowGeometry> WindowFromAttributes(const KernelContext& ctx,
                                                    const std::vector<int64_t>& input,
                                                    const std::vector<int64_t>& kernel) {
  const size_t n = input.size();
  WindowGeometry g;
  g.num_spatial = static_cast<int>(n);
  g.input = input;
  g.kernel = kernel;
  if (kernel.size() != n) {
    return ctx.Error(absl::StrCat("kernel has ", kernel.size(), " axes; the input has ", n,
                                  " spatial axes"));
  }
  CASTOR_ASSIGN_OR_RETURN(g.strides, WindowInts(ctx, "strides", n, 1));
  CASTOR_ASSIGN_OR_RETURN(g.dilations, WindowInts(ctx, "dilations", n, 1));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> pads, WindowInts(ctx, "pads", 2 * n, 0));
  g.pad_begin.assign(pads.begin(), pads.begin() + n);
  g.pad_end.assign(pads.begin() + n, pads.end());
  g.output.resize(n);
  return g;
}

}  // namespace

absl::StatusOr<WindowGeometry> ForwardWindowGeometry(const KernelContext& ctx,
                                                     const std::vector<int64_t>& input,
                                                     const std::vector<int64_t>& kernel,
                                                     bool ceil_mode) {
  const size_t n = input.size();
  CASTOR_ASSIGN_OR_RETURN(WindowGeometry g, WindowFromAttributes(ctx, input, kernel));
  const std::string auto_pad = ctx.GetString("auto_pad", "NOTSET");
  for (size_t i = 0; i < n; ++i) {
    if (g.strides[i] < 1 || g.dilations[i] < 1 || g.kernel[i] < 1) {
      return ctx.Error(absl::StrCat("axis ", i, ": kernel ", g.kernel[i], ", stride ",
                                    g.strides[i], ", dilation ", g.dilations[i],
                                    "; all must be >= 1"));
    }
    const int64_t window = (g.kernel[i] - 1) * g.dilations[i] + 1;
    const int64_t stride = g.strides[i];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t out = (input[i] + stride - 1) / stride;
      const int64_t total = std::max<int64_t>(0, (out - 1) * stride + window - input[i]);
      g.pad_begin[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pad_end[i] = total - g.pad_begin[i];
    } else if (auto_pad == "VALID") {
      g.pad_begin[i] = g.pad_end[i] = 0;
    } else if (auto_pad != "NOTSET") {
      return ctx.Error(absl::StrCat("attribute 'auto_pad' is \"", auto_pad,
                                    "\"; expected NOTSET, SAME_UPPER, SAME_LOWER or VALID"));
    }
    const int64_t padded = input[i] + g.pad_begin[i] + g.pad_end[i];
    if (padded < window) {
      return ctx.Error(absl::StrCat("spatial axis ", i, ": the window spans ", window,
                                    " but the padded input has only ", padded));
    }
    int64_t out = (padded - window + (ceil_mode ? stride - 1 : 0)) / stride + 1;
    if (ceil_mode && (out - 1) * stride >= input[i] + g.pad_begin[i]) --out;
    g.output[i] = out;
  }
  return g;
}

absl::StatusOr<WindowGeometry> TransposeWindowGeometry(const KernelContext& ctx,
                                                       const std::vector<int64_t>& input,
                                                       const std::vector<int64_t>& kernel) {
  const size_t n = input.size();
  CASTOR_ASSIGN_OR_RETURN(WindowGeometry g, WindowFromAttributes(ctx, input, kernel));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> output_padding,
                          WindowInts(ctx, "output_padding", n, 0));
  const std::string auto_pad = ctx.GetString("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID") {
    return ctx.Error(absl::StrCat("attribute 'auto_pad' is \"", auto_pad,
                                  "\"; expected NOTSET, SAME_UPPER, SAME_LOWER or VALID"));
  }
  std::vector<int64_t> output_shape;
  if (ctx.node().has_attribute("output_shape")) {
    output_shape = ctx.GetInts("output_shape");
    // A full [N, C, ...] form is accepted too (as the registry does).
    if (output_shape.size() == n + 2) {
      output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
    }
    if (output_shape.size() != n) {
      return ctx.Error(absl::StrCat("attribute 'output_shape' ",
                                    DimsToString(ctx.GetInts("output_shape")),
                                    " must have ", n, " entries (the spatial dims)"));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (g.strides[i] < 1 || g.dilations[i] < 1) {
      return ctx.Error(absl::StrCat("axis ", i, ": strides and dilations must be >= 1"));
    }
    const ops::ConvTransposeAxis axis = ops::ResolveConvTransposeAxis(
        input[i], (kernel[i] - 1) * g.dilations[i] + 1, g.strides[i], output_padding[i],
        auto_pad,
        output_shape.empty() ? std::nullopt : std::optional<int64_t>(output_shape[i]),
        g.pad_begin[i], g.pad_end[i]);
    g.pad_begin[i] = axis.pad_begin;
    g.pad_end[i] = axis.pad_end;
    g.output[i] = axis.output;
    if (g.output[i] < 0) {
      return ctx.Error(absl::StrCat("spatial axis ", i, ": the output size ", g.output[i],
                                    " is negative (pads too large)"));
    }
  }
  return g;
}

}  // namespace castor::common
