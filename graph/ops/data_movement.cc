// Ops that move or select data: Concat, Split, Slice, Gather, Tile, Pad,
// the indexing ops GatherND/ScatterND (index tuples), GatherElements/
// ScatterElements (one index per element), Trilu (a triangle of each
// matrix), and DepthToSpace/SpaceToDepth (channels <-> spatial blocks; mode
// CRD from opset 11).
// Concat, Slice and Gather also carry "shape values" (1-D int64 tensors
// whose entries are known dims, see InferenceContext::ShapeValue) so that
// shape arithmetic like Concat(Unsqueeze(Gather(Shape(x), 0)), [28, 28])
// keeps symbolic dims. Opset history handled here: Split's `split` moved
// from attribute to input at 13 and gained `num_outputs` at 18; Slice's
// starts/ends/axes were attributes until 10; Pad's pads moved to inputs at 11
// and gained an `axes` input at 18. GatherND gained batch_dims at 12;
// ScatterND and ScatterElements (which replaced Scatter at 11) gained
// `reduction` add/mul at 16 and max/min at 18; Trilu exists from 14.
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

std::vector<DType> AllTypesAt(const InferenceContext& ctx) {
  return ops::WithBFloat16Since(ctx, ops::AllTypes(), 13);
}

// The static length of 1-D input `i`, or -1.
int64_t StaticLength(const InferenceContext& ctx, int i) {
  const Shape& shape = ctx.input_shape(i);
  if (shape.rank_known() && shape.rank() == 1 && shape[0].is_static()) return shape[0].value();
  return -1;
}

// Checks input `i` is 1-D (when its rank is known); `what` names it.
absl::Status Require1D(const InferenceContext& ctx, int i, const char* what) {
  const Shape& shape = ctx.input_shape(i);
  if (shape.rank_known() && shape.rank() != 1) {
    return ctx.Error(absl::StrCat("input ", i, " (", what, ") must be 1-D; got shape ",
                                  shape.ToString()));
  }
  return absl::OkStatus();
}

// ---- Concat ------------------------------------------------------------------

absl::Status InferConcat(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, ctx.num_inputs() - 1));
  if (!ctx.has_attribute("axis")) return ctx.Error("attribute 'axis' is required");
  const int64_t axis_attr = ctx.GetInt("axis", 0);
  const DType dtype = ctx.input_dtype(0);

  int rank = -1;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
    const Shape& shape = ctx.input_shape(i);
    if (!shape.rank_known()) continue;
    if (rank >= 0 && shape.rank() != rank) {
      return ctx.Error(absl::StrCat("all inputs must have the same rank; input ", i,
                                    " has shape ", shape.ToString(), " but another has rank ",
                                    rank));
    }
    rank = shape.rank();
  }
  if (rank < 0) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  if (rank == 0) return ctx.Error("cannot concatenate scalars (inputs must have rank >= 1)");
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis, ops::NormalizeAxis(ctx, axis_attr, rank));

  std::vector<Dim> dims(rank);
  bool first = true;
  int64_t axis_total = 0;
  bool axis_static = true;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& shape = ctx.input_shape(i);
    if (!shape.rank_known()) {
      axis_static = false;
      continue;
    }
    for (int k = 0; k < rank; ++k) {
      const Dim& d = shape[k];
      if (k == axis) {
        if (d.is_static()) {
          axis_total += d.value();
        } else {
          axis_static = false;
        }
        continue;
      }
      Dim& merged = dims[k];
      if (first || merged.is_unknown() || (merged.is_symbolic() && d.is_static())) {
        merged = d;
      } else if (merged.is_static() && d.is_static() && merged.value() != d.value()) {
        return ctx.Error(absl::StrCat("input ", i, " has shape ", shape.ToString(),
                                      ", which differs from input 0 off axis ", axis,
                                      " (dim ", k, ")"));
      }
    }
    first = false;
  }
  dims[axis] = axis_static ? Dim(axis_total) : Dim::Unknown();
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));

  // Shape values: concatenating 1-D int tensors whose entries are known.
  if (rank == 1) {
    InferenceContext::ShapeValue value;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const auto& part = ctx.input_shape_value(i);
      if (!part) return absl::OkStatus();
      value.insert(value.end(), part->begin(), part->end());
    }
    ctx.SetOutputShapeValue(0, std::move(value));
  }
  return absl::OkStatus();
}

// ---- Split -------------------------------------------------------------------

absl::Status InferSplit(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  const int64_t opset = ctx.opset();
  const int outputs = ctx.num_outputs();
  const DType dtype = ctx.input_dtype(0);
  if (opset < 13 && ctx.num_inputs() > 1) {
    return ctx.Error(absl::StrCat("takes one input before opset 13 ('split' is an attribute); "
                                  "got ",
                                  ctx.num_inputs()));
  }
  if (opset >= 13 && ctx.has_attribute("split")) {
    return ctx.Error(absl::StrCat("'split' is an input since opset 13, not an attribute (model "
                                  "opset ",
                                  opset, ")"));
  }
  if (opset < 18 && ctx.has_attribute("num_outputs")) {
    return ctx.Error(absl::StrCat("attribute 'num_outputs' exists from opset 18; the model "
                                  "imports opset ",
                                  opset));
  }
  const bool has_split_input = opset >= 13 && ctx.has_input(1);
  if (has_split_input) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
    CASTOR_RETURN_IF_ERROR(Require1D(ctx, 1, "split"));
  }
  const bool has_num_outputs = ctx.has_attribute("num_outputs");
  if (has_split_input && has_num_outputs) {
    return ctx.Error("give either input 'split' or attribute 'num_outputs', not both");
  }
  if (opset >= 18 && !has_split_input && !has_num_outputs) {
    return ctx.Error("from opset 18 either input 'split' or attribute 'num_outputs' is required");
  }
  if (has_num_outputs && ctx.GetInt("num_outputs", 0) != outputs) {
    return ctx.Error(absl::StrCat("num_outputs is ", ctx.GetInt("num_outputs", 0),
                                  " but the node has ", outputs, " outputs"));
  }

  // The split sizes, when known.
  std::optional<std::vector<int64_t>> split;
  if (opset < 13) {
    if (ctx.has_attribute("split")) split = ctx.GetInts("split");
  } else if (has_split_input) {
    split = ops::ReadConstantInts(ctx, 1);
    if (!split && StaticLength(ctx, 1) >= 0 && StaticLength(ctx, 1) != outputs) {
      return ctx.Error(absl::StrCat("input 'split' has ", StaticLength(ctx, 1),
                                    " entries but the node has ", outputs, " outputs"));
    }
  }
  if (split) {
    if (static_cast<int>(split->size()) != outputs) {
      return ctx.Error(absl::StrCat("split [", absl::StrJoin(*split, ","), "] has ",
                                    split->size(), " entries but the node has ", outputs,
                                    " outputs"));
    }
    for (int64_t s : *split) {
      if (s < 0) {
        return ctx.Error(absl::StrCat("split [", absl::StrJoin(*split, ","),
                                      "] has a negative entry"));
      }
    }
  }

  const Shape& input = ctx.input_shape(0);
  if (!input.rank_known()) {
    for (int i = 0; i < outputs; ++i) ctx.SetOutput(i, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          ops::NormalizeAxis(ctx, ctx.GetInt("axis", 0), input.rank()));
  const Dim& dim = input[axis];
  std::vector<Dim> sizes(outputs);
  if (split) {
    int64_t total = 0;
    for (int i = 0; i < outputs; ++i) {
      sizes[i] = Dim((*split)[i]);
      total += (*split)[i];
    }
    if (dim.is_static() && total != dim.value()) {
      return ctx.Error(absl::StrCat("split [", absl::StrJoin(*split, ","), "] sums to ", total,
                                    " but axis ", axis, " of ", input.ToString(), " has size ",
                                    dim.value()));
    }
  } else if (!has_split_input && dim.is_static()) {
    const int64_t n = dim.value();
    if (has_num_outputs) {
      // Chunks of ceil(n / outputs); the last one takes what is left.
      const int64_t chunk = (n + outputs - 1) / outputs;
      const int64_t last = n - chunk * (outputs - 1);
      if (last < 0) {
        return ctx.Error(absl::StrCat("cannot split size ", n, " into ", outputs,
                                      " chunks of ", chunk));
      }
      for (int i = 0; i < outputs; ++i) sizes[i] = Dim(i + 1 < outputs ? chunk : last);
    } else {
      if (n % outputs != 0) {
        return ctx.Error(absl::StrCat("axis ", axis, " of ", input.ToString(),
                                      " does not split evenly into ", outputs, " outputs"));
      }
      for (int i = 0; i < outputs; ++i) sizes[i] = Dim(n / outputs);
    }
  } else if (!has_split_input && outputs == 1) {
    sizes[0] = dim;
  }
  for (int i = 0; i < outputs; ++i) {
    std::vector<Dim> dims = input.dims();
    dims[axis] = sizes[i];
    ctx.SetOutput(i, dtype, Shape(std::move(dims)));
  }
  return absl::OkStatus();
}

// ---- Slice -------------------------------------------------------------------

// The length of data[start:end:step] along a dim of size `dim` (ONNX rules:
// negative indices count from the end, then clamp to the valid range, which
// for negative steps is [-1, dim-1]).
int64_t SliceLength(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (dim == 0) return 0;
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    if (end <= start) return 0;
    return (end - start - 1) / step + 1;
  }
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  if (start <= end) return 0;
  return (start - end - 1) / -step + 1;
}

// The first index data[start:end:step] reads (after clamping).
int64_t SliceStart(int64_t dim, int64_t start, int64_t step) {
  if (dim == 0) return 0;
  if (start < 0) start += dim;
  return step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, 0, dim - 1);
}

absl::Status InferSlice(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  const DType dtype = ctx.input_dtype(0);
  const Shape& input = ctx.input_shape(0);
  const bool from_attributes = ctx.opset() < 10;

  std::optional<std::vector<int64_t>> starts, ends, axes, steps;
  int64_t count = -1;  // number of sliced axes, when known
  if (from_attributes) {
    if (ctx.num_inputs() > 1) {
      return ctx.Error(absl::StrCat("takes one input before opset 10 (starts/ends/axes are "
                                    "attributes); got ",
                                    ctx.num_inputs()));
    }
    if (!ctx.has_attribute("starts") || !ctx.has_attribute("ends")) {
      return ctx.Error("attributes 'starts' and 'ends' are required before opset 10");
    }
    starts = ctx.GetInts("starts");
    ends = ctx.GetInts("ends");
    if (ctx.has_attribute("axes")) axes = ctx.GetInts("axes");
    steps = std::vector<int64_t>(starts->size(), 1);
    count = static_cast<int64_t>(starts->size());
  } else {
    for (const char* name : {"starts", "ends", "axes"}) {
      if (ctx.has_attribute(name)) {
        return ctx.Error(absl::StrCat("'", name, "' is an input since opset 10, not an attribute"));
      }
    }
    if (ctx.num_inputs() < 3 || !ctx.has_input(1) || !ctx.has_input(2)) {
      return ctx.Error("inputs 'starts' and 'ends' are required from opset 10");
    }
    const char* const kNames[] = {"", "starts", "ends", "axes", "steps"};
    for (int i = 1; i <= 4; ++i) {
      if (!ctx.has_input(i)) continue;
      CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, i, {DType::kInt32, DType::kInt64}));
      CASTOR_RETURN_IF_ERROR(Require1D(ctx, i, kNames[i]));
    }
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 1, 4));
    starts = ops::ReadConstantInts(ctx, 1);
    ends = ops::ReadConstantInts(ctx, 2);
    if (ctx.has_input(3)) axes = ops::ReadConstantInts(ctx, 3);
    steps = ctx.has_input(4) ? ops::ReadConstantInts(ctx, 4) : std::nullopt;
    for (int i = 1; i <= 4 && count < 0; ++i) {
      if (ctx.has_input(i)) count = StaticLength(ctx, i);
    }
    if (starts) count = static_cast<int64_t>(starts->size());
    if (!ctx.has_input(4) && count >= 0) steps = std::vector<int64_t>(count, 1);
  }
  if (!input.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  const int rank = input.rank();
  // Axes default to 0..count-1.
  const bool axes_given = from_attributes ? ctx.has_attribute("axes") : ctx.has_input(3);
  if (!axes_given && count >= 0) {
    axes = std::vector<int64_t>();
    for (int64_t i = 0; i < count; ++i) axes->push_back(i);
  }
  auto check_length = [&](const std::optional<std::vector<int64_t>>& v,
                          const char* name) -> absl::Status {
    if (v && count >= 0 && static_cast<int64_t>(v->size()) != count) {
      return ctx.Error(absl::StrCat("'", name, "' has ", v->size(), " entries; expected ", count,
                                    " (one per sliced axis)"));
    }
    return absl::OkStatus();
  };
  CASTOR_RETURN_IF_ERROR(check_length(starts, "starts"));
  CASTOR_RETURN_IF_ERROR(check_length(ends, "ends"));
  CASTOR_RETURN_IF_ERROR(check_length(axes, "axes"));
  CASTOR_RETURN_IF_ERROR(check_length(steps, "steps"));
  if (steps) {
    for (int64_t s : *steps) {
      if (s == 0) return ctx.Error("'steps' entries must not be 0");
    }
  }
  if (!axes) {
    // Any axis may be sliced: only the rank is known.
    ctx.SetOutput(0, dtype, Shape(std::vector<Dim>(rank)));
    return absl::OkStatus();
  }
  std::vector<int> slot_of_axis(rank, -1);
  for (int k = 0; k < static_cast<int>(axes->size()); ++k) {
    CASTOR_ASSIGN_OR_RETURN(int64_t a, ops::NormalizeAxis(ctx, (*axes)[k], rank));
    if (slot_of_axis[a] >= 0) {
      return ctx.Error(absl::StrCat("axis ", (*axes)[k], " is listed twice in axes"));
    }
    slot_of_axis[a] = k;
  }
  const bool bounds_known = starts && ends && steps;
  std::vector<Dim> dims = input.dims();
  for (int a = 0; a < rank; ++a) {
    const int k = slot_of_axis[a];
    if (k < 0) continue;
    if (!bounds_known) {
      dims[a] = Dim::Unknown();
      continue;
    }
    const int64_t start = (*starts)[k], end = (*ends)[k], step = (*steps)[k];
    if (input[a].is_static()) {
      dims[a] = Dim(SliceLength(input[a].value(), start, end, step));
    } else if (!(step == 1 && start == 0 && end >= INT32_MAX)) {
      dims[a] = Dim::Unknown();  // else: the whole axis, symbol kept
    }
  }
  ctx.SetOutput(0, dtype, Shape(dims));

  // Shape values: slicing a 1-D int tensor with known entries.
  const auto& value = ctx.input_shape_value(0);
  if (value && rank == 1 && bounds_known && slot_of_axis[0] >= 0) {
    const int k = slot_of_axis[0];
    const int64_t n = static_cast<int64_t>(value->size());
    const int64_t step = (*steps)[k];
    const int64_t length = SliceLength(n, (*starts)[k], (*ends)[k], step);
    InferenceContext::ShapeValue sliced;
    for (int64_t i = 0, at = SliceStart(n, (*starts)[k], step); i < length; ++i, at += step) {
      sliced.push_back((*value)[at]);
    }
    ctx.SetOutputShapeValue(0, std::move(sliced));
  }
  return absl::OkStatus();
}

// ---- Gather ------------------------------------------------------------------

absl::Status InferGather(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt32, DType::kInt64}));
  const DType dtype = ctx.input_dtype(0);
  const Shape& data = ctx.input_shape(0);
  const Shape& indices = ctx.input_shape(1);
  if (!data.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  if (data.rank() == 0) return ctx.Error("input 0 (data) must have rank >= 1; got a scalar");
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          ops::NormalizeAxis(ctx, ctx.GetInt("axis", 0), data.rank()));
  std::optional<std::vector<int64_t>> index_values;
  if (const Tensor* constant = ctx.input_constant(1)) index_values = constant->ToInt64Vector();
  const Dim& axis_dim = data[axis];
  if (index_values && axis_dim.is_static()) {
    for (int64_t index : *index_values) {
      if (index < -axis_dim.value() || index >= axis_dim.value()) {
        return ctx.Error(absl::StrCat("index ", index, " is out of range for axis ", axis,
                                      " of size ", axis_dim.value()));
      }
    }
  }
  if (!indices.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  std::vector<Dim> dims(data.dims().begin(), data.dims().begin() + axis);
  dims.insert(dims.end(), indices.dims().begin(), indices.dims().end());
  dims.insert(dims.end(), data.dims().begin() + axis + 1, data.dims().end());
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));

  // Shape values: picking entries of a 1-D int tensor with constant indices.
  const auto& value = ctx.input_shape_value(0);
  if (value && data.rank() == 1 && indices.rank() <= 1) {
    if (!index_values) index_values = ops::ReadConstantInts(ctx, 1);
    if (!index_values) return absl::OkStatus();
    const int64_t n = static_cast<int64_t>(value->size());
    InferenceContext::ShapeValue picked;
    for (int64_t index : *index_values) {
      if (index < -n || index >= n) {
        return ctx.Error(absl::StrCat("index ", index, " is out of range for a shape of ", n,
                                      " entries"));
      }
      picked.push_back((*value)[index < 0 ? index + n : index]);
    }
    ctx.SetOutputShapeValue(0, std::move(picked));
  }
  return absl::OkStatus();
}

// ---- Tile --------------------------------------------------------------------

absl::Status InferTile(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
  CASTOR_RETURN_IF_ERROR(Require1D(ctx, 1, "repeats"));
  const Shape& input = ctx.input_shape(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape::Unknown());
    return absl::OkStatus();
  }
  const int rank = input.rank();
  const int64_t length = StaticLength(ctx, 1);
  if (length >= 0 && length != rank) {
    return ctx.Error(absl::StrCat("input 1 (repeats) has ", length,
                                  " entries but the input has rank ", rank));
  }
  std::vector<Dim> dims(rank);
  if (std::optional<std::vector<int64_t>> repeats = ops::ReadConstantInts(ctx, 1)) {
    for (int i = 0; i < rank; ++i) {
      const int64_t r = (*repeats)[i];
      if (r < 0) return ctx.Error(absl::StrCat("repeats entry ", i, " is negative (", r, ")"));
      const Dim& d = input[i];
      if (r == 1) {
        dims[i] = d;
      } else if (r == 0 || d.is_static()) {
        dims[i] = Dim(r == 0 ? 0 : d.value() * r);
      }
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(dims)));
  return absl::OkStatus();
}

// ---- Pad ---------------------------------------------------------------------

absl::Status InferPad(InferenceContext& ctx) {
  const int64_t opset = ctx.opset();
  if (opset < 11) {
    CASTOR_RETURN_IF_ERROR(
        ops::RequireDType(ctx, 0, {DType::kFloat16, DType::kFloat32, DType::kFloat64}));
  } else if (opset < 13) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(
        ctx, 0,
        {DType::kFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8, DType::kInt16,
         DType::kInt32, DType::kInt64, DType::kUInt8, DType::kUInt16, DType::kUInt32,
         DType::kUInt64}));
  } else {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  }
  const std::string mode = ctx.GetString("mode", "constant");
  const bool mode_ok = mode == "constant" || mode == "reflect" || mode == "edge" ||
                       (mode == "wrap" && opset >= 19);
  if (!mode_ok) {
    return ctx.Error(absl::StrCat("mode '", mode, "' is not one of constant, reflect, edge",
                                  opset >= 19 ? ", wrap" : " (wrap needs opset 19)"));
  }
  std::optional<std::vector<int64_t>> pads;
  std::optional<std::vector<int64_t>> axes;
  if (opset < 11) {
    if (ctx.num_inputs() > 1) {
      return ctx.Error("takes one input before opset 11 ('pads' is an attribute)");
    }
    if (!ctx.has_attribute("pads")) {
      return ctx.Error("attribute 'pads' is required before opset 11");
    }
    pads = ctx.GetInts("pads");
  } else {
    if (ctx.has_attribute("pads")) {
      return ctx.Error("'pads' is an input since opset 11, not an attribute");
    }
    if (!ctx.has_input(1)) return ctx.Error("input 1 (pads) is required from opset 11");
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
    CASTOR_RETURN_IF_ERROR(Require1D(ctx, 1, "pads"));
    if (ctx.has_input(2) && ctx.input_dtype(2) != ctx.input_dtype(0)) {
      return ctx.Error(absl::StrCat("input 2 (constant_value) has dtype ",
                                    DTypeName(ctx.input_dtype(2)), " but input 0 has ",
                                    DTypeName(ctx.input_dtype(0)), "; they must match"));
    }
    if (ctx.has_input(3)) {
      if (opset < 18) return ctx.Error("input 3 (axes) exists from opset 18");
      CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 3, {DType::kInt32, DType::kInt64}));
      CASTOR_RETURN_IF_ERROR(Require1D(ctx, 3, "axes"));
      axes = ops::ReadConstantInts(ctx, 3);
    }
    pads = ops::ReadConstantInts(ctx, 1);
  }
  const Shape& input = ctx.input_shape(0);
  const DType dtype = ctx.input_dtype(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  const int rank = input.rank();
  const bool axes_given = ctx.has_input(3);
  if (!pads || (axes_given && !axes)) {
    ctx.SetOutput(0, dtype, Shape(std::vector<Dim>(rank)));
    return absl::OkStatus();
  }
  std::vector<int64_t> axis_list;
  if (axes_given) {
    for (int64_t axis : *axes) {
      CASTOR_ASSIGN_OR_RETURN(int64_t a, ops::NormalizeAxis(ctx, axis, rank));
      axis_list.push_back(a);
    }
  } else {
    for (int i = 0; i < rank; ++i) axis_list.push_back(i);
  }
  const int n = static_cast<int>(axis_list.size());
  if (static_cast<int>(pads->size()) != 2 * n) {
    return ctx.Error(absl::StrCat("pads has ", pads->size(), " entries; expected ", 2 * n,
                                  " (begin and end for each of ", n, " axes)"));
  }
  std::vector<Dim> dims = input.dims();
  for (int k = 0; k < n; ++k) {
    const int64_t a = axis_list[k];
    const int64_t added = (*pads)[k] + (*pads)[k + n];
    if (added == 0) continue;
    if (!input[a].is_static()) {
      dims[a] = Dim::Unknown();
      continue;
    }
    const int64_t size = input[a].value() + added;
    if (size < 0) {
      return ctx.Error(absl::StrCat("pads make axis ", a, " of ", input.ToString(),
                                    " negative (", size, ")"));
    }
    dims[a] = Dim(size);
  }
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));
  return absl::OkStatus();
}

// ---- GatherND / ScatterND ------------------------------------------------------

// Checks the constant indices of input `i` (tuples of the last dim's
// length) against data's static dims `indexed` (the axes the entries
// index); the error names the tuple and the axis.
absl::Status CheckConstantTuples(const InferenceContext& ctx, int i,
                                 const std::vector<Dim>& indexed) {
  const Tensor* constant = ctx.input_constant(i);
  if (constant == nullptr || indexed.empty()) return absl::OkStatus();
  const std::vector<int64_t> values = constant->ToInt64Vector();
  const int64_t k = static_cast<int64_t>(indexed.size());
  for (size_t at = 0; at < values.size(); ++at) {
    const Dim& dim = indexed[at % k];
    if (!dim.is_static()) continue;
    if (values[at] < -dim.value() || values[at] >= dim.value()) {
      return ctx.Error(absl::StrCat("index ", values[at], " (tuple ", at / k, ", entry ", at % k,
                                    ") is out of range for a data axis of size ", dim.value()));
    }
  }
  return absl::OkStatus();
}

// GatherND's output shape for data input `d` and indices input `i`, or
// nullopt when a rank or the tuple length is unknown.
absl::StatusOr<std::optional<Shape>> GatheredShape(const InferenceContext& ctx, int d, int i,
                                                   int64_t batch_dims) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, i, {DType::kInt32, DType::kInt64}));
  const Shape& data = ctx.input_shape(d);
  const Shape& indices = ctx.input_shape(i);
  if (!data.rank_known() || !indices.rank_known()) return std::optional<Shape>();
  const int64_t data_rank = data.rank(), index_rank = indices.rank();
  if (data_rank == 0 || index_rank == 0) {
    return ctx.Error(absl::StrCat("data ", data.ToString(), " and indices ", indices.ToString(),
                                  " must both have rank >= 1"));
  }
  if (batch_dims < 0 || batch_dims >= std::min(data_rank, index_rank)) {
    return ctx.Error(absl::StrCat("attribute 'batch_dims' is ", batch_dims, "; expected [0, ",
                                  std::min(data_rank, index_rank) - 1, "]"));
  }
  const Dim& last = indices[index_rank - 1];
  if (!last.is_static()) return std::optional<Shape>();
  const int64_t k = last.value();
  if (k < 1 || k > data_rank - batch_dims) {
    return ctx.Error(absl::StrCat("indices ", indices.ToString(), " hold tuples of ", k,
                                  " entries; expected 1 to ", data_rank - batch_dims,
                                  " for data ", data.ToString()));
  }
  CASTOR_RETURN_IF_ERROR(CheckConstantTuples(
      ctx, i,
      std::vector<Dim>(data.dims().begin() + batch_dims, data.dims().begin() + batch_dims + k)));
  std::vector<Dim> dims(indices.dims().begin(), indices.dims().end() - 1);
  dims.insert(dims.end(), data.dims().begin() + batch_dims + k, data.dims().end());
  return std::optional<Shape>(Shape(std::move(dims)));
}

absl::Status InferGatherND(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "batch_dims", 12));
  CASTOR_ASSIGN_OR_RETURN(std::optional<Shape> shape,
                          GatheredShape(ctx, 0, 1, ctx.GetInt("batch_dims", 0)));
  ctx.SetOutput(0, ctx.input_dtype(0), shape ? *shape : Shape::Unknown());
  return absl::OkStatus();
}

// The `reduction` attribute of ScatterND / ScatterElements at the opset.
absl::Status CheckScatterReduction(const InferenceContext& ctx) {
  if (!ctx.has_attribute("reduction")) return absl::OkStatus();
  const std::string reduction = ctx.GetString("reduction", "none");
  const int64_t opset = ctx.opset();
  const bool ok = reduction == "none" || (opset >= 16 && (reduction == "add" || reduction == "mul")) ||
                  (opset >= 18 && (reduction == "max" || reduction == "min"));
  if (ok) return absl::OkStatus();
  return ctx.Error(absl::StrCat("attribute 'reduction' is \"", reduction, "\"; opset ", opset,
                                " takes \"none\"", opset >= 16 ? ", \"add\", \"mul\"" : "",
                                opset >= 18 ? ", \"max\", \"min\"" : ""));
}

// Input `u` (updates) must have static dims equal to `expected` where both
// are known.
absl::Status RequireUpdatesShape(const InferenceContext& ctx, int u, const Shape& expected,
                                 const char* why) {
  const Shape& updates = ctx.input_shape(u);
  if (!updates.rank_known() || !expected.rank_known()) return absl::OkStatus();
  bool differs = updates.rank() != expected.rank();
  for (int a = 0; !differs && a < updates.rank(); ++a) {
    differs = updates[a].is_static() && expected[a].is_static() &&
              updates[a].value() != expected[a].value();
  }
  if (differs) {
    return ctx.Error(absl::StrCat("input ", u, " (updates) has shape ", updates.ToString(),
                                  "; expected ", expected.ToString(), " (", why, ")"));
  }
  return absl::OkStatus();
}

absl::Status InferScatterND(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  if (ctx.input_dtype(2) != ctx.input_dtype(0)) {
    return ctx.Error(absl::StrCat("input 2 (updates) has dtype ", DTypeName(ctx.input_dtype(2)),
                                  " but input 0 (data) has ", DTypeName(ctx.input_dtype(0)),
                                  "; they must match"));
  }
  CASTOR_RETURN_IF_ERROR(CheckScatterReduction(ctx));
  CASTOR_ASSIGN_OR_RETURN(std::optional<Shape> gathered, GatheredShape(ctx, 0, 1, 0));
  if (gathered) {
    CASTOR_RETURN_IF_ERROR(RequireUpdatesShape(
        ctx, 2, *gathered, "indices' dims but the last, then data's dims after the indexed ones"));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

// ---- GatherElements / ScatterElements ------------------------------------------

// Checks data (input 0) and indices (input 1) for the element-indexed ops:
// one rank, the axis in range, constant indices in range along it.
absl::Status CheckElementsIndexing(const InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt32, DType::kInt64}));
  const Shape& data = ctx.input_shape(0);
  const Shape& indices = ctx.input_shape(1);
  if (!data.rank_known()) return absl::OkStatus();
  if (data.rank() == 0) return ctx.Error("input 0 (data) must have rank >= 1; got a scalar");
  if (indices.rank_known() && indices.rank() != data.rank()) {
    return ctx.Error(absl::StrCat("data ", data.ToString(), " and indices ", indices.ToString(),
                                  " must have the same rank"));
  }
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          ops::NormalizeAxis(ctx, ctx.GetInt("axis", 0), data.rank()));
  const Dim& axis_dim = data[axis];
  if (const Tensor* constant = ctx.input_constant(1); constant != nullptr && axis_dim.is_static()) {
    for (int64_t index : constant->ToInt64Vector()) {
      if (index < -axis_dim.value() || index >= axis_dim.value()) {
        return ctx.Error(absl::StrCat("index ", index, " is out of range for axis ", axis,
                                      " of size ", axis_dim.value()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status InferGatherElements(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(CheckElementsIndexing(ctx));
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(1));
  return absl::OkStatus();
}

absl::Status InferScatterElements(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  if (ctx.input_dtype(2) != ctx.input_dtype(0)) {
    return ctx.Error(absl::StrCat("input 2 (updates) has dtype ", DTypeName(ctx.input_dtype(2)),
                                  " but input 0 (data) has ", DTypeName(ctx.input_dtype(0)),
                                  "; they must match"));
  }
  CASTOR_RETURN_IF_ERROR(CheckScatterReduction(ctx));
  CASTOR_RETURN_IF_ERROR(CheckElementsIndexing(ctx));
  CASTOR_RETURN_IF_ERROR(RequireUpdatesShape(ctx, 2, ctx.input_shape(1), "indices' shape"));
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

// ---- Trilu ---------------------------------------------------------------------

absl::Status InferTrilu(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::AllTypes()));
  const Shape& input = ctx.input_shape(0);
  if (input.rank_known() && input.rank() < 2) {
    return ctx.Error(absl::StrCat("input 0 has shape ", input.ToString(),
                                  "; expected rank >= 2 (matrices in the last two axes)"));
  }
  if (ctx.num_inputs() > 1 && ctx.has_input(1)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
    const Shape& k = ctx.input_shape(1);
    const std::optional<int64_t> count = k.NumElements();
    if (k.rank_known() && (k.rank() > 1 || (count && *count != 1))) {
      return ctx.Error(absl::StrCat("input 1 (k) has shape ", k.ToString(),
                                    "; expected a scalar"));
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), input);
  return absl::OkStatus();
}

// ---- DepthToSpace / SpaceToDepth ------------------------------------------------

// `to_space`: DepthToSpace [N, C, H, W] -> [N, C/b^2, H*b, W*b]; else
// SpaceToDepth [N, C, H, W] -> [N, C*b^2, H/b, W/b].
absl::Status InferDepthSpace(InferenceContext& ctx, bool to_space) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  const int64_t b = ctx.GetInt("blocksize", 0);
  if (!ctx.has_attribute("blocksize") || b < 1) {
    return ctx.Error(absl::StrCat("attribute 'blocksize' is required and >= 1; got ", b));
  }
  if (to_space) {
    CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "mode", 11));
    const std::string mode = ctx.GetString("mode", "DCR");
    if (mode != "DCR" && mode != "CRD") {
      return ctx.Error(absl::StrCat("attribute 'mode' is \"", mode, "\"; expected DCR or CRD"));
    }
  }
  const Shape& input = ctx.input_shape(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::vector<Dim>(4)));
    return absl::OkStatus();
  }
  if (input.rank() != 4) {
    return ctx.Error(absl::StrCat("input has shape ", input.ToString(), "; expected [N, C, H, W]"));
  }
  std::vector<Dim> dims = input.dims();
  auto scaled = [&](const Dim& d, bool multiply, int64_t by) -> absl::StatusOr<Dim> {
    if (!d.is_static()) return Dim::Unknown();
    if (!multiply && d.value() % by != 0) {
      return ctx.Error(absl::StrCat("input ", input.ToString(), " has a dim ", d.value(),
                                    " not divisible by ", by));
    }
    return Dim(multiply ? d.value() * by : d.value() / by);
  };
  CASTOR_ASSIGN_OR_RETURN(dims[1], scaled(input[1], !to_space, b * b));
  CASTOR_ASSIGN_OR_RETURN(dims[2], scaled(input[2], to_space, b));
  CASTOR_ASSIGN_OR_RETURN(dims[3], scaled(input[3], to_space, b));
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(dims)));
  return absl::OkStatus();
}

using ops::MakeDef;

}  // namespace

void RegisterDataMovementOps(OpRegistry& registry) {
  registry.Register(MakeDef("Concat", kMinOnnxOpset, 1, INT_MAX,
                            {{"axis", AttrKind::kInt, /*required=*/true}}, InferConcat,
                            "Concatenates the inputs along `axis`."));
  OpDef split = MakeDef("Split", kMinOnnxOpset, 1, 2,
                        {{"axis", AttrKind::kInt},
                         {"split", AttrKind::kInts},
                         {"num_outputs", AttrKind::kInt}},
                        InferSplit, "Splits along `axis` into the given sizes or equal parts.");
  split.max_outputs = INT_MAX;
  registry.Register(std::move(split));
  registry.Register(MakeDef("Slice", kMinOnnxOpset, 1, 5,
                            {{"starts", AttrKind::kInts},
                             {"ends", AttrKind::kInts},
                             {"axes", AttrKind::kInts}},
                            InferSlice, "Takes data[start:end:step] along the given axes."));
  registry.Register(MakeDef("Gather", kMinOnnxOpset, 2, 2, {{"axis", AttrKind::kInt}},
                            InferGather, "Picks entries along `axis` at the given indices."));
  registry.Register(MakeDef("Tile", kMinOnnxOpset, 2, 2, {}, InferTile,
                            "Repeats the input `repeats[i]` times along each axis i."));
  registry.Register(MakeDef("Pad", kMinOnnxOpset, 1, 4,
                            {{"mode", AttrKind::kString},
                             {"pads", AttrKind::kInts},
                             {"value", AttrKind::kFloat}},
                            InferPad,
                            "Pads each axis (constant, reflect, edge or wrap)."));
  registry.Register(MakeDef("GatherND", 11, 2, 2, {{"batch_dims", AttrKind::kInt}}, InferGatherND,
                            "Picks the slices of data that index tuples (indices' last dim) "
                            "address."));
  registry.Register(MakeDef("ScatterND", 11, 3, 3, {{"reduction", AttrKind::kString}},
                            InferScatterND,
                            "Copies data and writes (or combines) updates at the slices index "
                            "tuples address."));
  registry.Register(MakeDef("GatherElements", 11, 2, 2, {{"axis", AttrKind::kInt}},
                            InferGatherElements,
                            "out[p] = data[p with its axis coordinate replaced by indices[p]]."));
  registry.Register(MakeDef("ScatterElements", 11, 3, 3,
                            {{"axis", AttrKind::kInt}, {"reduction", AttrKind::kString}},
                            InferScatterElements,
                            "Copies data and writes (or combines) updates[p] at p with its axis "
                            "coordinate replaced by indices[p]."));
  registry.Register(MakeDef("DepthToSpace", kMinOnnxOpset, 1, 1,
                            {{"blocksize", AttrKind::kInt, /*required=*/true},
                             {"mode", AttrKind::kString}},
                            [](InferenceContext& ctx) { return InferDepthSpace(ctx, true); },
                            "Moves blocksize x blocksize blocks of channels into space (DCR or "
                            "CRD order)."));
  registry.Register(MakeDef("SpaceToDepth", kMinOnnxOpset, 1, 1,
                            {{"blocksize", AttrKind::kInt, /*required=*/true}},
                            [](InferenceContext& ctx) { return InferDepthSpace(ctx, false); },
                            "Moves blocksize x blocksize spatial blocks into channels."));
  registry.Register(MakeDef("Trilu", 14, 1, 2, {{"upper", AttrKind::kInt}}, InferTrilu,
                            "Keeps the upper (or lower) triangle of each matrix from the k-th "
                            "diagonal, zeroing the rest."));
}

}  // namespace castor
