// Broadcasting, axis and dtype helpers for op inference.
#include "graph/ops/op_helpers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
  if (ctx.opset() < from_input_since) {
    if (!ctx.has_attribute("axes")) return std::optional<std::vector<int64_t>>();
    return std::optional<std::vector<int64_t>>(ctx.GetInts("axes"));
  }
  if (ctx.has_attribute("axes")) {
    return ctx.Error(absl::StrCat("'axes' is an input since opset ", from_input_since,
                                  ", not an attribute (model opset ", ctx.opset(), ")"));
  }
  if (!ctx.has_input(input_index)) return std::optional<std::vector<int64_t>>();
  const Tensor* axes = ctx.input_constant(input_index);
  if (!axes) return absl::StatusOr<std::optional<std::vector<int64_t>>>(std::nullopt);
  return std::optional<std::vector<int64_t>>(axes->ToInt64Vector());
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

const std::vector<DType>& FloatTypes() {
  static const std::vector<DType> kTypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                            DType::kFloat64};
  return kTypes;
}

const std::vector<DType>& NumericTypes() {
  static const std::vector<DType> kTypes = {
      DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
      DType::kInt16,   DType::kInt32,    DType::kInt64,   DType::kUInt8,   DType::kUInt16,
      DType::kUInt32,  DType::kUInt64};
  return kTypes;
}

}  // namespace castor::ops
