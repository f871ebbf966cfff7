// Broadcasting, axis and dtype helpers for op inference.
#include "graph/ops/op_helpers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"

namespace castor::ops {

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  if (!a.rank_known() || !b.rank_known()) return Shape::Unknown();
  const int rank = std::max(a.rank(), b.rank());
  std::vector<Dim> dims(rank);
  for (int k = 0; k < rank; ++k) {
    const int ia = a.rank() - rank + k;
    const int ib = b.rank() - rank + k;
    const Dim da = ia >= 0 ? a[ia] : Dim(1);
    const Dim db = ib >= 0 ? b[ib] : Dim(1);
    if (da.is_static() && da.value() == 1) {
      dims[k] = db;
    } else if (db.is_static() && db.value() == 1) {
      dims[k] = da;
    } else if (da.is_static() && db.is_static()) {
      if (da.value() != db.value()) {
        return absl::InvalidArgumentError(absl::StrCat("shapes ", a.ToString(), " and ",
                                                       b.ToString(), " do not broadcast"));
      }
      dims[k] = da;
    } else if (da.is_static()) {
      dims[k] = da;  // the other is symbolic/unknown and must equal it
    } else if (db.is_static()) {
      dims[k] = db;
    } else if (da == db) {
      dims[k] = da;
    } else {
      dims[k] = Dim::Unknown();
    }
  }
  return Shape(std::move(dims));
}

absl::StatusOr<int64_t> NormalizeAxis(const InferenceContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    return ctx.Error(absl::StrCat("axis ", axis, " is out of range for rank ", rank));
  }
  return axis < 0 ? axis + rank : axis;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> ReadAxes(const InferenceContext& ctx,
                                                              int64_t from_input_since,
                                                              int input_index) {
  // Absent axes (attribute or input) read as an empty list; only an axes
  // input whose value is unknown at build time gives nullopt.
  if (ctx.opset() < from_input_since) {
    if (!ctx.has_attribute("axes")) return std::optional(std::vector<int64_t>{});
    return std::optional<std::vector<int64_t>>(ctx.GetInts("axes"));
  }
  if (ctx.has_attribute("axes")) {
    return ctx.Error(absl::StrCat("'axes' is an input since opset ", from_input_since,
                                  ", not an attribute (model opset ", ctx.opset(), ")"));
  }
  if (!ctx.has_input(input_index)) return std::optional(std::vector<int64_t>{});
  return ReadConstantInts(ctx, input_index);
}

std::optional<std::vector<int64_t>> ReadConstantInts(const InferenceContext& ctx, int i) {
  if (!ctx.has_input(i)) return std::nullopt;
  if (const Tensor* constant = ctx.input_constant(i)) {
    if (IsInteger(constant->dtype())) return constant->ToInt64Vector();
    return std::nullopt;
  }
  const std::optional<InferenceContext::ShapeValue>& value = ctx.input_shape_value(i);
  if (!value) return std::nullopt;
  std::vector<int64_t> ints;
  ints.reserve(value->size());
  for (const Dim& d : *value) {
    if (!d.is_static()) return std::nullopt;
    ints.push_back(d.value());
  }
  return ints;
}

absl::Status RequireDType(const InferenceContext& ctx, int i, const std::vector<DType>& allowed) {
  const DType dtype = ctx.input_dtype(i);
  if (std::find(allowed.begin(), allowed.end(), dtype) != allowed.end()) {
    return absl::OkStatus();
  }
  return ctx.Error(absl::StrCat(
      "input ", i, " has dtype ", DTypeName(dtype), "; expected one of ",
      absl::StrJoin(allowed, ", ",
                    [](std::string* out, DType d) { out->append(DTypeName(d)); })));
}

absl::Status RequireSameDType(const InferenceContext& ctx, int first, int last) {
  DType common = DType::kUndefined;
  for (int i = first; i <= last && i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    if (common == DType::kUndefined) {
      common = ctx.input_dtype(i);
    } else if (ctx.input_dtype(i) != common) {
      return ctx.Error(absl::StrCat("input ", i, " has dtype ", DTypeName(ctx.input_dtype(i)),
                                    " but input ", first, " has ", DTypeName(common),
                                    "; they must match"));
    }
  }
  return absl::OkStatus();
}

OpDef MakeDef(const std::string& op_type, int64_t min_opset, int min_inputs, int max_inputs,
              std::vector<AttrSpec> attributes, InferFn infer, const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.min_opset = min_opset;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = min_inputs;
  def.max_inputs = max_inputs;
  def.attributes = std::move(attributes);
  def.infer = std::move(infer);
  def.summary = summary;
  return def;
}

const std::vector<DType>& FloatTypes() {
  static const std::vector<DType> kTypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                            DType::kFloat64};
  return kTypes;
}

const std::vector<DType>& AllTypes() {
  static const std::vector<DType> kTypes = {
      DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
      DType::kInt16,   DType::kInt32,    DType::kInt64,   DType::kUInt8,   DType::kUInt16,
      DType::kUInt32,  DType::kUInt64,   DType::kBool,    DType::kString};
  return kTypes;
}

std::vector<DType> WithBFloat16Since(const InferenceContext& ctx, std::vector<DType> types,
                                     int64_t since) {
  if (ctx.opset() < since) std::erase(types, DType::kBFloat16);
  return types;
}

const std::vector<DType>& NumericTypes() {
  static const std::vector<DType> kTypes = {
      DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
      DType::kInt16,   DType::kInt32,    DType::kInt64,   DType::kUInt8,   DType::kUInt16,
      DType::kUInt32,  DType::kUInt64};
  return kTypes;
}


// ---- Helpers shared by the elementwise, matmul, conv and pool families. ----

std::vector<DType> DTypesAt(const InferenceContext& ctx, const std::vector<DTypesSince>& history) {
  std::vector<DType> result;
  for (const DTypesSince& step : history) {
    if (step.since > ctx.opset()) continue;
    for (DType d : step.dtypes) {
      if (std::find(result.begin(), result.end(), d) == result.end()) result.push_back(d);
    }
  }
  return result;
}

absl::Status CheckAttributeOpsets(const InferenceContext& ctx, const std::string& name,
                                  int64_t first, int64_t last) {
  if (!ctx.has_attribute(name) || (ctx.opset() >= first && ctx.opset() <= last)) {
    return absl::OkStatus();
  }
  if (ctx.opset() < first) {
    return ctx.Error(absl::StrCat("attribute '", name, "' exists from opset ", first,
                                  "; the model imports opset ", ctx.opset()));
  }
  return ctx.Error(absl::StrCat("attribute '", name, "' exists up to opset ", last,
                                "; the model imports opset ", ctx.opset()));
}

absl::StatusOr<Shape> BroadcastInputs(const InferenceContext& ctx, int first, int last) {
  std::optional<Shape> result;
  for (int i = first; i <= last && i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    if (!result) {
      result = ctx.input_shape(i);
      continue;
    }
    absl::StatusOr<Shape> merged = BroadcastShapes(*result, ctx.input_shape(i));
    if (!merged.ok()) {
      return ctx.Error(absl::StrCat("input ", i, " shape ", ctx.input_shape(i).ToString(),
                                    " does not broadcast with ",
                                    i == first + 1 ? "input " : "the broadcast of inputs ",
                                    i == first + 1 ? absl::StrCat(first)
                                                   : absl::StrCat(first, "..", i - 1),
                                    " shape ", result->ToString()));
    }
    result = *std::move(merged);
  }
  return result ? *result : Shape::Unknown();
}

bool UnidirectionalBroadcastable(const Shape& from, const Shape& to) {
  if (!from.rank_known() || !to.rank_known()) return true;
  if (from.rank() > to.rank()) return false;
  const int offset = to.rank() - from.rank();
  for (int k = 0; k < from.rank(); ++k) {
    const Dim& f = from[k];
    const Dim& t = to[offset + k];
    if (!f.is_static() || f.value() == 1) continue;
    if (t.is_static() && t.value() != f.value()) return false;
  }
  return true;
}

namespace {

std::string IntsToString(const std::vector<int64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}

// Reads an ints attribute of `size` entries, each at least `min_value`;
// absent gives `size` copies of `default_value`.
absl::StatusOr<std::vector<int64_t>> ReadWindowInts(const InferenceContext& ctx,
                                                    const std::string& name, size_t size,
                                                    int64_t default_value, int64_t min_value) {
  if (!ctx.has_attribute(name)) return std::vector<int64_t>(size, default_value);
  std::vector<int64_t> values = ctx.GetInts(name);
  if (values.size() != size) {
    return ctx.Error(absl::StrCat("attribute '", name, "' ", IntsToString(values), " has ",
                                  values.size(), " entries; expected ", size));
  }
  for (int64_t v : values) {
    if (v < min_value) {
      return ctx.Error(absl::StrCat("attribute '", name, "' ", IntsToString(values),
                                    " has an entry below ", min_value));
    }
  }
  return values;
}

}  // namespace

absl::StatusOr<WindowAttrs> ReadWindowAttrs(
    const InferenceContext& ctx, int num_spatial,
    const std::optional<std::vector<int64_t>>& kernel_from_weight, bool require_kernel_shape) {
  const size_t n = static_cast<size_t>(num_spatial);
  WindowAttrs attrs;
  CASTOR_ASSIGN_OR_RETURN(attrs.strides, ReadWindowInts(ctx, "strides", n, 1, 1));
  CASTOR_ASSIGN_OR_RETURN(attrs.dilations, ReadWindowInts(ctx, "dilations", n, 1, 1));
  attrs.auto_pad = ctx.GetString("auto_pad", "NOTSET");
  if (attrs.auto_pad != "NOTSET" && attrs.auto_pad != "SAME_UPPER" &&
      attrs.auto_pad != "SAME_LOWER" && attrs.auto_pad != "VALID") {
    return ctx.Error(absl::StrCat("attribute 'auto_pad' is \"", attrs.auto_pad,
                                  "\"; expected NOTSET, SAME_UPPER, SAME_LOWER or VALID"));
  }
  attrs.explicit_pads = ctx.has_attribute("pads");
  CASTOR_ASSIGN_OR_RETURN(attrs.pads, ReadWindowInts(ctx, "pads", 2 * n, 0, 0));
  if (attrs.explicit_pads && attrs.auto_pad != "NOTSET" &&
      std::any_of(attrs.pads.begin(), attrs.pads.end(), [](int64_t p) { return p != 0; })) {
    return ctx.Error(absl::StrCat("attribute 'pads' ", IntsToString(attrs.pads),
                                  " cannot be used together with auto_pad \"", attrs.auto_pad,
                                  "\""));
  }
  if (ctx.has_attribute("kernel_shape")) {
    CASTOR_ASSIGN_OR_RETURN(attrs.kernel_shape, ReadWindowInts(ctx, "kernel_shape", n, 1, 1));
    if (kernel_from_weight && *kernel_from_weight != attrs.kernel_shape) {
      return ctx.Error(absl::StrCat("attribute 'kernel_shape' ", IntsToString(attrs.kernel_shape),
                                    " does not match the weight's spatial dims ",
                                    IntsToString(*kernel_from_weight)));
    }
  } else if (require_kernel_shape) {
    return ctx.Error("attribute 'kernel_shape' is required");
  } else if (kernel_from_weight) {
    attrs.kernel_shape = *kernel_from_weight;
  }
  return attrs;
}

namespace {
// Python's floor division (ONNX's pad formulas use it for negative totals).
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
}  // namespace

ConvTransposeAxis ResolveConvTransposeAxis(int64_t input, int64_t kernel_extent, int64_t stride,
                                           int64_t output_padding, const std::string& auto_pad,
                                           std::optional<int64_t> output_size, int64_t pad_begin,
                                           int64_t pad_end) {
  const int64_t full = stride * (input - 1) + output_padding + kernel_extent;
  ConvTransposeAxis axis;
  if (output_size.has_value() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    int64_t total;
    if (output_size.has_value()) {
      axis.output = *output_size;
      total = full - axis.output;
    } else {
      total = std::max<int64_t>(0, full - input * stride);
      axis.output = full - total;
    }
    if (auto_pad == "SAME_UPPER") {
      axis.pad_begin = FloorDiv(total, 2);
      axis.pad_end = total - axis.pad_begin;
    } else {
      axis.pad_end = FloorDiv(total, 2);
      axis.pad_begin = total - axis.pad_end;
    }
    return axis;
  }
  if (auto_pad != "VALID") {
    axis.pad_begin = pad_begin;
    axis.pad_end = pad_end;
  }
  axis.output = full - axis.pad_begin - axis.pad_end;
  return axis;
}

absl::StatusOr<Dim> WindowOutputDim(const InferenceContext& ctx, const Dim& input,
                                    const WindowAttrs& attrs, int axis, bool ceil_mode) {
  if (!input.is_static() || attrs.kernel_shape.empty()) return Dim::Unknown();
  const int n = static_cast<int>(attrs.strides.size());
  const int64_t in = input.value();
  const int64_t stride = attrs.strides[axis];
  const int64_t kernel = attrs.EffectiveKernel(axis);
  int64_t pad_begin = attrs.pads[axis];
  int64_t pad_end = attrs.pads[axis + n];
  if (attrs.auto_pad == "SAME_UPPER" || attrs.auto_pad == "SAME_LOWER") {
    // Pad so that output = ceil(input / stride); the odd unit goes to the
    // end (SAME_UPPER) or the beginning (SAME_LOWER).
    const int64_t residual = in % stride;
    const int64_t total = std::max<int64_t>(0, residual == 0 ? kernel - stride : kernel - residual);
    const int64_t small = total / 2;
    pad_begin = attrs.auto_pad == "SAME_UPPER" ? small : total - small;
    pad_end = total - pad_begin;
  } else if (attrs.auto_pad == "VALID") {
    pad_begin = pad_end = 0;
  }
  const int64_t padded = in + pad_begin + pad_end;
  if (padded < kernel) {
    return ctx.Error(absl::StrCat("spatial axis ", axis, ": the window (kernel ",
                                  attrs.kernel_shape[axis], ", dilation ", attrs.dilations[axis],
                                  ") spans ", kernel, " but the padded input has only ", padded));
  }
  int64_t out = (padded - kernel + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  // As PyTorch: in ceil mode a last window that would start in the end
  // padding is dropped.
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  return Dim(out);
}

}  // namespace castor::ops
