// Host-side planning shared by the CPU and CUDA kernels (see
// op_geometry.h).
#include "backend/common/op_geometry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::common {

absl::StatusOr<int64_t> NormalizeAxis(const KernelContext& ctx, int64_t axis, int64_t rank,
                                      const char* what) {
  if (axis < -rank || axis >= rank) {
    return ctx.Error(absl::StrCat(what, " ", axis, " is out of range [", -rank, ", ", rank - 1,
                                  "] for rank ", rank));
  }
  return axis < 0 ? axis + rank : axis;
}

absl::StatusOr<MatMulGeometry> PlanMatMul(const KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  if (a.dtype != b.dtype) {
    return ctx.Error(absl::StrCat("A is ", DTypeName(a.dtype), " but B is ", DTypeName(b.dtype)));
  }
  if (a.dims.empty() || b.dims.empty()) {
    return ctx.Error(absl::StrCat("operands must have rank >= 1; A is ", DimsToString(a.dims),
                                  ", B is ", DimsToString(b.dims)));
  }
  const bool a_vector = a.dims.size() == 1;
  const bool b_vector = b.dims.size() == 1;
  const int64_t m = a_vector ? 1 : a.dims[a.dims.size() - 2];
  const int64_t k = a.dims.back();
  const int64_t k_b = b_vector ? b.dims[0] : b.dims[b.dims.size() - 2];
  const int64_t n = b_vector ? 1 : b.dims.back();
  if (k != k_b) {
    return ctx.Error(absl::StrCat("inner dimensions differ: A ", DimsToString(a.dims), ", B ",
                                  DimsToString(b.dims)));
  }
  // Batch dims, right-aligned and broadcast.
  const std::vector<int64_t> a_batch(a.dims.begin(), a.dims.end() - (a_vector ? 1 : 2));
  const std::vector<int64_t> b_batch(b.dims.begin(), b.dims.end() - (b_vector ? 1 : 2));
  const size_t rank = std::max(a_batch.size(), b_batch.size());
  std::vector<int64_t> batch(rank), a_stride(rank, 0), b_stride(rank, 0);
  {
    int64_t a_step = 1, b_step = 1;
    for (size_t r = rank; r-- > 0;) {
      const size_t from_end = rank - 1 - r;
      const int64_t ad = from_end < a_batch.size() ? a_batch[a_batch.size() - 1 - from_end] : 1;
      const int64_t bd = from_end < b_batch.size() ? b_batch[b_batch.size() - 1 - from_end] : 1;
      if (ad != bd && ad != 1 && bd != 1) {
        return ctx.Error(absl::StrCat("batch dimensions of A ", DimsToString(a.dims), " and B ",
                                      DimsToString(b.dims), " do not broadcast"));
      }
      batch[r] = std::max(ad, bd);
      if (ad == 0 || bd == 0) batch[r] = 0;
      a_stride[r] = ad == 1 ? 0 : a_step;
      b_stride[r] = bd == 1 ? 0 : b_step;
      a_step *= ad;
      b_step *= bd;
    }
  }
  std::vector<int64_t> out_dims = batch;
  if (!a_vector) out_dims.push_back(m);
  if (!b_vector) out_dims.push_back(n);
  return MatMulGeometry{m, n, k, std::move(batch), std::move(a_stride), std::move(b_stride),
                        std::move(out_dims)};
}

absl::StatusOr<SliceGeometry> PlanSlice(const KernelContext& ctx,
                                        const std::vector<int64_t>& in_dims,
                                        const IntInputReader& read_input) {
  std::vector<int64_t> starts, ends, axes, steps;
  bool has_axes;
  if (ctx.opset() < 10) {
    starts = ctx.GetInts("starts");
    ends = ctx.GetInts("ends");
    has_axes = ctx.node().has_attribute("axes");
    if (has_axes) axes = ctx.GetInts("axes");
  } else {
    if (!ctx.has_input(1) || !ctx.has_input(2)) {
      return ctx.Error("inputs 'starts' and 'ends' are required from opset 10");
    }
    CASTOR_ASSIGN_OR_RETURN(starts, read_input(1));
    CASTOR_ASSIGN_OR_RETURN(ends, read_input(2));
    has_axes = ctx.has_input(3);
    if (has_axes) {
      CASTOR_ASSIGN_OR_RETURN(axes, read_input(3));
    }
    if (ctx.has_input(4)) {
      CASTOR_ASSIGN_OR_RETURN(steps, read_input(4));
    }
  }
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  const size_t count = starts.size();
  if (!has_axes) {
    for (size_t k = 0; k < count; ++k) axes.push_back(static_cast<int64_t>(k));
  }
  if (steps.empty()) steps.assign(count, 1);
  if (ends.size() != count || axes.size() != count || steps.size() != count) {
    return ctx.Error(
        absl::StrCat("starts, ends, axes and steps must have one entry per sliced "
                     "axis; got ",
                     count, ", ", ends.size(), ", ", axes.size(), ", ", steps.size()));
  }
  std::vector<int64_t> first(rank, 0), step_of(rank, 1), dims = in_dims;
  std::vector<bool> sliced(rank, false);
  for (size_t k = 0; k < count; ++k) {
    CASTOR_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis(ctx, axes[k], rank, "axis"));
    if (sliced[a]) {
      return ctx.Error(
          absl::StrCat("axes [", absl::StrJoin(axes, ","), "] list axis ", a, " twice"));
    }
    sliced[a] = true;
    const int64_t dim = in_dims[a];
    const int64_t step = steps[k];
    if (step == 0) return ctx.Error(absl::StrCat("steps entry ", k, " (axis ", a, ") is 0"));
    int64_t start = starts[k], end = ends[k];
    // Negative indices count from the end; then starts clamp to [0, dim]
    // (positive steps) or [0, dim-1] (negative steps), and ends to [0, dim]
    // or [-1, dim-1].
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    int64_t length;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      length = end > start ? (end - start - 1) / step + 1 : 0;
    } else if (dim == 0) {
      length = 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      length = start > end ? (start - end - 1) / -step + 1 : 0;
    }
    dims[a] = length;
    first[a] = length > 0 ? start : 0;
    step_of[a] = step;
  }
  const std::vector<int64_t> in_strides = ContiguousStrides(in_dims);
  SliceGeometry slice;
  slice.src_strides.resize(rank);
  for (int64_t a = 0; a < rank; ++a) {
    slice.offset += first[a] * in_strides[a];
    slice.src_strides[a] = step_of[a] * in_strides[a];
  }
  slice.dims = std::move(dims);
  return slice;
}

absl::StatusOr<std::vector<int64_t>> PlanReshape(const KernelContext& ctx,
                                                 const std::vector<int64_t>& in_dims,
                                                 const std::vector<int64_t>& target) {
  const bool allowzero = ctx.GetInt("allowzero", 0) != 0;
  const int64_t total = DimsProduct(in_dims, 0, in_dims.size());
  std::vector<int64_t> dims(target.size());
  int minus_one_at = -1;
  for (int i = 0; i < static_cast<int>(target.size()); ++i) {
    const int64_t v = target[i];
    if (v == 0 && !allowzero) {
      if (i >= static_cast<int>(in_dims.size())) {
        return ctx.Error(absl::StrCat("shape ", DimsToString(target), " entry ", i,
                                      " is 0 (copy the input dim) but the input ",
                                      DimsToString(in_dims), " has rank ", in_dims.size()));
      }
      dims[i] = in_dims[i];
    } else if (v == -1) {
      if (minus_one_at >= 0) {
        return ctx.Error(absl::StrCat("shape ", DimsToString(target), " has more than one -1"));
      }
      minus_one_at = i;
      dims[i] = 1;
    } else if (v < -1) {
      return ctx.Error(
          absl::StrCat("shape ", DimsToString(target), " has entry ", v, "; entries must be >= -1"));
    } else {
      dims[i] = v;
    }
  }
  if (minus_one_at >= 0) {
    const int64_t others = DimsProduct(dims, 0, dims.size());
    if (others == 0 || total % others != 0) {
      return ctx.Error(absl::StrCat("cannot reshape input ", DimsToString(in_dims), " (", total,
                                    " elements) to ", DimsToString(target),
                                    ": the -1 entry cannot be inferred"));
    }
    dims[minus_one_at] = total / others;
  }
  const int64_t count = DimsProduct(dims, 0, dims.size());
  if (count != total) {
    return ctx.Error(absl::StrCat("cannot reshape input ", DimsToString(in_dims), " (", total,
                                  " elements) to ", DimsToString(target), " = ", DimsToString(dims),
                                  " (", count, " elements)"));
  }
  return dims;
}

absl::StatusOr<ConcatGeometry> PlanConcat(const KernelContext& ctx) {
  const TensorView& first = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(first.dims.size());
  if (rank == 0) return ctx.Error("cannot concatenate scalars (inputs must have rank >= 1)");
  ConcatGeometry g;
  CASTOR_ASSIGN_OR_RETURN(g.axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank, "axis"));
  g.dims = first.dims;
  g.dims[g.axis] = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
    const TensorView& in = ctx.input(i);
    bool same = static_cast<int64_t>(in.dims.size()) == rank && in.dtype == first.dtype;
    for (int64_t k = 0; same && k < rank; ++k) same = k == g.axis || in.dims[k] == first.dims[k];
    if (!same) {
      return ctx.Error(absl::StrCat("input ", i, " ", DimsToString(in.dims),
                                    " does not match input 0 ", DimsToString(first.dims),
                                    " off axis ", g.axis));
    }
    g.dims[g.axis] += in.dims[g.axis];
  }
  g.outer = DimsProduct(g.dims, 0, g.axis);
  g.inner = DimsProduct(g.dims, g.axis + 1, g.dims.size());
  return g;
}

absl::StatusOr<SplitGeometry> PlanSplit(const KernelContext& ctx,
                                        const std::optional<std::vector<int64_t>>& split_input) {
  const TensorView& in = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(in.dims.size());
  SplitGeometry g;
  CASTOR_ASSIGN_OR_RETURN(g.axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank, "axis"));
  const int outputs = ctx.num_outputs();
  const int64_t n = in.dims[g.axis];
  std::vector<int64_t>& sizes = g.sizes;
  if (ctx.opset() < 13 && ctx.node().has_attribute("split")) {
    sizes = ctx.GetInts("split");
  } else if (split_input.has_value()) {
    sizes = *split_input;
  } else if (ctx.node().has_attribute("num_outputs")) {
    const int64_t parts = ctx.GetInt("num_outputs", outputs);
    if (parts != outputs || parts <= 0) {
      return ctx.Error(
          absl::StrCat("num_outputs is ", parts, " but the node has ", outputs, " outputs"));
    }
    // Chunks of ceil(n / parts); the last takes what is left.
    const int64_t chunk = (n + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i) {
      sizes.push_back(std::min(chunk, n - std::min(n, i * chunk)));
    }
    if (n - chunk * (parts - 1) < 0) {
      return ctx.Error(absl::StrCat("cannot split axis ", g.axis, " of size ", n, " into ", parts,
                                    " chunks of ", chunk));
    }
  } else {
    if (n % outputs != 0) {
      return ctx.Error(absl::StrCat("axis ", g.axis, " of input ", DimsToString(in.dims),
                                    " does not split evenly into ", outputs, " outputs"));
    }
    sizes.assign(outputs, n / outputs);
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) {
      return ctx.Error(
          absl::StrCat("split [", absl::StrJoin(sizes, ","), "] has a negative entry"));
    }
    total += s;
  }
  if (static_cast<int>(sizes.size()) != outputs || total != n) {
    return ctx.Error(absl::StrCat("split [", absl::StrJoin(sizes, ","), "] (sum ", total,
                                  ") does not cut axis ", g.axis, " of input ",
                                  DimsToString(in.dims), " into the node's ", outputs,
                                  " outputs"));
  }
  g.outer = DimsProduct(in.dims, 0, g.axis);
  g.inner = DimsProduct(in.dims, g.axis + 1, in.dims.size());
  return g;
}

absl::StatusOr<CopyPlan> PlanTranspose(const KernelContext& ctx,
                                       const std::vector<int64_t>& in_dims) {
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  std::vector<int64_t> perm = ctx.GetInts("perm");
  if (!ctx.node().has_attribute("perm")) {
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  std::vector<bool> seen(rank, false);
  bool valid = static_cast<int64_t>(perm.size()) == rank;
  for (int64_t p : perm) {
    valid = valid && p >= 0 && p < rank && !seen[p];
    if (valid) seen[p] = true;
  }
  if (!valid) {
    return ctx.Error(absl::StrCat("perm [", absl::StrJoin(perm, ","),
                                  "] is not a permutation of the axes of input ",
                                  DimsToString(in_dims)));
  }
  const std::vector<int64_t> in_strides = ContiguousStrides(in_dims);
  CopyPlan plan;
  plan.out_dims.resize(rank);
  plan.src_strides.resize(rank);
  for (int64_t i = 0; i < rank; ++i) {
    plan.out_dims[i] = in_dims[perm[i]];
    plan.src_strides[i] = in_strides[perm[i]];
  }
  plan.copy_dims = plan.out_dims;
  return plan;
}

absl::StatusOr<CopyPlan> PlanExpand(const KernelContext& ctx, const std::vector<int64_t>& in_dims,
                                    const std::vector<int64_t>& shape) {
  const size_t rank = std::max(in_dims.size(), shape.size());
  const std::vector<int64_t> in_strides = ContiguousStrides(in_dims);
  CopyPlan plan;
  plan.out_dims.resize(rank);
  plan.src_strides.assign(rank, 0);
  for (size_t i = 0; i < rank; ++i) {
    const size_t from_end = rank - 1 - i;
    const bool has_in = from_end < in_dims.size();
    const bool has_shape = from_end < shape.size();
    const int64_t d = has_in ? in_dims[in_dims.size() - 1 - from_end] : 1;
    const int64_t t = has_shape ? shape[shape.size() - 1 - from_end] : 1;
    if (d != t && d != 1 && t != 1) {
      return ctx.Error(absl::StrCat("cannot expand input ", DimsToString(in_dims), " to shape ",
                                    DimsToString(shape), ": dim ", d, " vs ", t));
    }
    if (t < 0) {
      return ctx.Error(absl::StrCat("shape ", DimsToString(shape), " has a negative entry"));
    }
    plan.out_dims[i] = d == 1 ? t : d;
    if (has_in && d != 1) plan.src_strides[i] = in_strides[in_dims.size() - 1 - from_end];
  }
  plan.copy_dims = plan.out_dims;
  return plan;
}

absl::StatusOr<CopyPlan> PlanTile(const KernelContext& ctx, const std::vector<int64_t>& in_dims,
                                  const std::vector<int64_t>& repeats) {
  const size_t rank = in_dims.size();
  if (repeats.size() != rank) {
    return ctx.Error(absl::StrCat("repeats [", absl::StrJoin(repeats, ","), "] has ",
                                  repeats.size(), " entries but the input ", DimsToString(in_dims),
                                  " has rank ", rank));
  }
  const std::vector<int64_t> in_strides = ContiguousStrides(in_dims);
  CopyPlan plan;
  for (size_t i = 0; i < rank; ++i) {
    if (repeats[i] < 0) {
      return ctx.Error(
          absl::StrCat("repeats [", absl::StrJoin(repeats, ","), "] has a negative entry"));
    }
    plan.out_dims.push_back(in_dims[i] * repeats[i]);
    plan.copy_dims.push_back(repeats[i]);
    plan.copy_dims.push_back(in_dims[i]);
    plan.src_strides.push_back(0);
    plan.src_strides.push_back(in_strides[i]);
  }
  return plan;
}

absl::StatusOr<std::vector<int64_t>> PlanFlatten(const KernelContext& ctx,
                                                 const std::vector<int64_t>& in_dims) {
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  int64_t axis = ctx.GetInt("axis", 1);
  if (axis < -rank || axis > rank) {
    return ctx.Error(absl::StrCat("axis ", axis, " is out of range [", -rank, ", ", rank,
                                  "] for input ", DimsToString(in_dims)));
  }
  if (axis < 0) axis += rank;
  return std::vector<int64_t>{DimsProduct(in_dims, 0, axis),
                              DimsProduct(in_dims, axis, in_dims.size())};
}

namespace {

// The axes of Squeeze/Unsqueeze: the attribute before opset 13, input 1
// from then on; nullopt when none are given.
std::optional<std::vector<int64_t>> SqueezeAxes(
    const KernelContext& ctx, const std::optional<std::vector<int64_t>>& axes_input) {
  if (ctx.opset() >= 13) return axes_input;
  if (!ctx.node().has_attribute("axes")) return std::nullopt;
  return ctx.GetInts("axes");
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> PlanSqueeze(
    const KernelContext& ctx, const std::vector<int64_t>& in_dims,
    const std::optional<std::vector<int64_t>>& axes_input) {
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  std::vector<bool> squeezed(rank, false);
  if (std::optional<std::vector<int64_t>> axes = SqueezeAxes(ctx, axes_input);
      axes && !axes->empty()) {
    for (int64_t axis : *axes) {
      CASTOR_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis(ctx, axis, rank, "axis"));
      if (in_dims[a] != 1) {
        return ctx.Error(absl::StrCat("cannot squeeze axis ", axis, " of input ",
                                      DimsToString(in_dims), ": its size is ", in_dims[a],
                                      ", not 1"));
      }
      squeezed[a] = true;
    }
  } else {
    for (int64_t a = 0; a < rank; ++a) squeezed[a] = in_dims[a] == 1;
  }
  std::vector<int64_t> dims;
  for (int64_t a = 0; a < rank; ++a) {
    if (!squeezed[a]) dims.push_back(in_dims[a]);
  }
  return dims;
}

absl::StatusOr<std::vector<int64_t>> PlanUnsqueeze(
    const KernelContext& ctx, const std::vector<int64_t>& in_dims,
    const std::optional<std::vector<int64_t>>& axes_input) {
  const std::optional<std::vector<int64_t>> axes = SqueezeAxes(ctx, axes_input);
  if (!axes) {
    return ctx.Error(ctx.opset() < 13 ? "attribute 'axes' is required before opset 13"
                                      : "input 1 (axes) is required from opset 13");
  }
  const int64_t out_rank = static_cast<int64_t>(in_dims.size() + axes->size());
  std::vector<bool> inserted(out_rank, false);
  for (int64_t axis : *axes) {
    CASTOR_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis(ctx, axis, out_rank, "axis"));
    if (inserted[a]) {
      return ctx.Error(
          absl::StrCat("axes [", absl::StrJoin(*axes, ","), "] list axis ", axis, " twice"));
    }
    inserted[a] = true;
  }
  std::vector<int64_t> dims;
  size_t next = 0;
  for (int64_t a = 0; a < out_rank; ++a) dims.push_back(inserted[a] ? 1 : in_dims[next++]);
  return dims;
}

absl::StatusOr<PadGeometry> PlanPad(const KernelContext& ctx, const std::vector<int64_t>& in_dims,
                                    const std::optional<std::vector<int64_t>>& pads_input,
                                    const std::optional<std::vector<int64_t>>& axes_input) {
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  PadGeometry g;
  const std::string mode = ctx.GetString("mode", "constant");
  if (mode == "constant") {
    g.mode = PadMode::kConstant;
  } else if (mode == "reflect") {
    g.mode = PadMode::kReflect;
  } else if (mode == "edge") {
    g.mode = PadMode::kEdge;
  } else if (mode == "wrap") {
    g.mode = PadMode::kWrap;
  } else {
    return ctx.Error(absl::StrCat("mode '", mode, "' is not constant, reflect, edge or wrap"));
  }
  std::vector<int64_t> pads;
  if (ctx.opset() < 11) {
    pads = ctx.GetInts("pads");
  } else if (pads_input.has_value()) {
    pads = *pads_input;
  } else {
    return ctx.Error("input 1 (pads) is required from opset 11");
  }
  std::vector<int64_t> axes;
  if (axes_input.has_value()) {
    for (int64_t axis : *axes_input) {
      CASTOR_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis(ctx, axis, rank, "axis"));
      axes.push_back(a);
    }
  } else {
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  }
  const int64_t n = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * n) {
    return ctx.Error(absl::StrCat("pads [", absl::StrJoin(pads, ","), "] has ", pads.size(),
                                  " entries; expected ", 2 * n, " (begin and end for each of ", n,
                                  " axes) for input ", DimsToString(in_dims)));
  }
  g.before.assign(rank, 0);
  std::vector<int64_t> after(rank, 0);
  for (int64_t k = 0; k < n; ++k) {
    g.before[axes[k]] += pads[k];
    after[axes[k]] += pads[k + n];
  }
  g.dims.resize(rank);
  for (int64_t a = 0; a < rank; ++a) {
    g.dims[a] = in_dims[a] + g.before[a] + after[a];
    if (g.dims[a] < 0) {
      return ctx.Error(absl::StrCat("pads [", absl::StrJoin(pads, ","), "] make axis ", a,
                                    " of input ", DimsToString(in_dims), " negative"));
    }
    if (g.mode != PadMode::kConstant && in_dims[a] == 0 && g.dims[a] > 0) {
      return ctx.Error(absl::StrCat("cannot ", mode, "-pad axis ", a, " of input ",
                                    DimsToString(in_dims), ": it is empty"));
    }
  }
  return g;
}

absl::StatusOr<SoftmaxGeometry> PlanSoftmax(const KernelContext& ctx,
                                            const std::vector<int64_t>& dims) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  const bool coerce_2d = ctx.opset() < 13;
  const int64_t axis_attr = ctx.GetInt("axis", coerce_2d ? 1 : -1);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  // Opset < 13 allows axis == rank (rows of one element); a scalar input is
  // one line of one element either way.
  const bool axis_ok = rank == 0 ? (axis_attr == 0 || axis_attr == -1 || axis_attr == 1)
                                 : (axis >= 0 && (axis < rank || (coerce_2d && axis == rank)));
  if (!axis_ok) {
    return ctx.Error(absl::StrCat("axis ", axis_attr, " is out of range for input of rank ", rank,
                                  " ", DimsToString(dims)));
  }
  SoftmaxGeometry geometry;
  for (int64_t i = 0; i < rank; ++i) {
    if (i < axis) {
      geometry.outer *= dims[i];
    } else if (coerce_2d || i == axis) {
      geometry.n *= dims[i];
    } else {
      geometry.inner *= dims[i];
    }
  }
  return geometry;
}

absl::Status RequireSameDType(const KernelContext& ctx, int i, const char* name, int j,
                              const char* other) {
  if (ctx.input(i).dtype != ctx.input(j).dtype) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") is ", DTypeName(ctx.input(i).dtype),
                                  " but input ", j, " (", other, ") is ",
                                  DTypeName(ctx.input(j).dtype), "; they must match"));
  }
  return absl::OkStatus();
}

absl::Status RequireSameDType(const KernelContext& ctx, int first, int last) {
  for (int i = first + 1; i <= last; ++i) {
    if (ctx.input(i).dtype != ctx.input(first).dtype) {
      return ctx.Error(absl::StrCat("input ", i, " is ", DTypeName(ctx.input(i).dtype),
                                    " but input ", first, " is ",
                                    DTypeName(ctx.input(first).dtype), "; they must match"));
    }
  }
  return absl::OkStatus();
}

absl::Status RequireDims(const KernelContext& ctx, int i, const char* name,
                         const std::vector<int64_t>& expected, const char* why) {
  if (ctx.input(i).dims != expected) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") is ", DimsToString(ctx.input(i).dims),
                                  "; expected ", DimsToString(expected), " (", why, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerNormGeometry> PlanLayerNorm(const KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  const int64_t axis = ctx.GetInt("axis", -1);
  if (axis < -rank || axis >= rank) {
    return ctx.Error(absl::StrCat("attribute 'axis' is ", axis, "; X ", DimsToString(x.dims),
                                  " has rank ", rank));
  }
  LayerNormGeometry g;
  g.axis = axis < 0 ? axis + rank : axis;
  g.outer = DimsProduct(x.dims, 0, g.axis);
  g.inner = DimsProduct(x.dims, g.axis, x.dims.size());
  const char* const names[] = {"X", "Scale", "B"};
  // Scale and B: X's dtype, or float32 beside a 16-bit X (castor's form;
  // ONNX's op is refused that by type inference).
  const DType parameters = ctx.input(1).dtype;
  const bool float32_parameters = parameters == DType::kFloat32 &&
                                  (x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16);
  for (int i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    const bool dtype_ok =
        ctx.input(i).dtype == x.dtype || (float32_parameters && ctx.input(i).dtype == parameters);
    if (!dtype_ok) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") is ",
                                    DTypeName(ctx.input(i).dtype), "; X is ", DTypeName(x.dtype),
                                    " (expected ", DTypeName(x.dtype),
                                    ", or float32 for both Scale and B beside a 16-bit X)"));
    }
    if (!BroadcastsTo(ctx.input(i).dims, x.dims)) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") ",
                                    DimsToString(ctx.input(i).dims), " does not broadcast to X ",
                                    DimsToString(x.dims)));
    }
  }
  return g;
}

namespace {

// X [N, C, D1, ...] of rank >= 3 as InstanceNorm rows (X is input `x_index`).
absl::StatusOr<InstanceNormGeometry> InstanceNormRows(const KernelContext& ctx, int x_index) {
  const TensorView& x = ctx.input(x_index);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat("input ", x_index, " (X) must have rank >= 3 ([N, C, D1, ...]); "
                                  "it is ", DimsToString(x.dims)));
  }
  InstanceNormGeometry g;
  g.channels = x.dims[1];
  g.rows = x.dims[0] * x.dims[1];
  g.inner = DimsProduct(x.dims, 2, x.dims.size());
  return g;
}

// Input i (`name`) of InstanceNormalization or its gradient must be [C].
absl::Status RequireChannelVector(const KernelContext& ctx, int i, const char* name,
                                  const InstanceNormGeometry& g, const TensorView& x) {
  const std::vector<int64_t>& dims = ctx.input(i).dims;
  if (dims.size() != 1 || dims[0] != g.channels) {
    return ctx.Error(absl::StrCat("input ", i, " (", name, ") is ", DimsToString(dims),
                                  "; expected [", g.channels, "] (C of X ", DimsToString(x.dims),
                                  ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InstanceNormGeometry> PlanInstanceNorm(const KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const InstanceNormGeometry g, InstanceNormRows(ctx, 0));
  const char* const names[] = {"X", "scale", "B"};
  for (int i = 1; i <= 2; ++i) {
    CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, i, names[i], 0, "X"));
    CASTOR_RETURN_IF_ERROR(RequireChannelVector(ctx, i, names[i], g, ctx.input(0)));
  }
  return g;
}

absl::Status CheckConvInputs(const KernelContext& ctx, int64_t group, int64_t bias_size) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  if (x.dims.size() < 3 || w.dims.size() != x.dims.size()) {
    return ctx.Error(absl::StrCat("X ", DimsToString(x.dims), " and W ", DimsToString(w.dims),
                                  " must have the same rank >= 3"));
  }
  if (w.dtype != x.dtype || (ctx.has_input(2) && ctx.input(2).dtype != x.dtype)) {
    return ctx.Error("X, W and B must have the same dtype");
  }
  if (group < 1) return ctx.Error(absl::StrCat("attribute 'group' is ", group, "; expected >= 1"));
  if (ctx.has_input(2) && ctx.input(2).num_elements() != bias_size) {
    return ctx.Error(absl::StrCat("bias B ", DimsToString(ctx.input(2).dims), " must have ",
                                  bias_size, " entries"));
  }
  // kernel_shape, when given, must match W's spatial dims.
  if (ctx.node().has_attribute("kernel_shape")) {
    const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
    if (ctx.GetInts("kernel_shape") != kernel) {
      return ctx.Error(absl::StrCat("attribute 'kernel_shape' ",
                                    DimsToString(ctx.GetInts("kernel_shape")),
                                    " does not match W's spatial dims ", DimsToString(kernel)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckConv(const KernelContext& ctx, int64_t group) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(CheckConvInputs(ctx, group, w.dims.empty() ? 0 : w.dims[0]));
  const int64_t channels = x.dims[1], out_channels = w.dims[0];
  if (w.dims[1] * group != channels) {
    return ctx.Error(absl::StrCat("input channels ", channels, " (X ", DimsToString(x.dims),
                                  ") must equal W.dim(1) * group = ", w.dims[1], " * ", group));
  }
  if (out_channels % group != 0) {
    return ctx.Error(
        absl::StrCat("output channels ", out_channels, " are not divisible by group ", group));
  }
  return absl::OkStatus();
}

absl::Status CheckConvTranspose(const KernelContext& ctx, int64_t group) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t out_channels = w.dims.size() >= 2 ? w.dims[1] * group : 0;
  CASTOR_RETURN_IF_ERROR(CheckConvInputs(ctx, group, out_channels));
  const int64_t channels = x.dims[1];
  if (w.dims[0] != channels) {
    return ctx.Error(absl::StrCat("input channels ", channels, " (X ", DimsToString(x.dims),
                                  ") must equal W.dim(0) = ", w.dims[0]));
  }
  if (channels % group != 0) {
    return ctx.Error(
        absl::StrCat("input channels ", channels, " are not divisible by group ", group));
  }
  return absl::OkStatus();
}

namespace {

// The reduction attribute (default "mean") when it is "mean", "sum" or
// "none", else the node's error `error(reduction)`.
template <typename ErrorText>
absl::StatusOr<std::string> LossReduction(const KernelContext& ctx, ErrorText error) {
  std::string reduction = ctx.GetString("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean") {
    return ctx.Error(error(reduction));
  }
  return reduction;
}

// Scores [batch, classes, d1, ...] as [batch, classes, inner] and the
// labels' dims [batch, d1, ...] (scores of rank >= 2).
void LossLayout(const std::vector<int64_t>& scores, LossGeometry& g) {
  g.batch = scores[0];
  g.classes = scores[1];
  g.inner = DimsProduct(scores, 2, scores.size());
  g.label_dims = {scores[0]};
  g.label_dims.insert(g.label_dims.end(), scores.begin() + 2, scores.end());
}

}  // namespace

absl::StatusOr<LossGeometry> PlanLoss(const KernelContext& ctx) {
  const TensorView& scores = ctx.input(0);
  const TensorView& labels = ctx.input(1);
  LossGeometry g;
  CASTOR_ASSIGN_OR_RETURN(g.reduction, LossReduction(ctx, [](const std::string& reduction) {
                            return absl::StrCat("reduction \"", reduction,
                                                "\" is not none, sum or mean");
                          }));
  if (scores.dims.size() < 2) {
    return ctx.Error(absl::StrCat("input 0 must have rank >= 2 ([N, C, d1, ...]); got ",
                                  DimsToString(scores.dims)));
  }
  LossLayout(scores.dims, g);
  if (labels.dims != g.label_dims) {
    return ctx.Error(absl::StrCat("labels ", DimsToString(labels.dims), " do not match scores ",
                                  DimsToString(scores.dims), " (expected ",
                                  DimsToString(g.label_dims), ")"));
  }
  if (labels.dtype != DType::kInt32 && labels.dtype != DType::kInt64) {
    return ctx.Error(
        absl::StrCat("labels are ", DTypeName(labels.dtype), "; expected int32 or int64"));
  }
  if (ctx.has_input(2)) {
    const TensorView& weights = ctx.input(2);
    if (weights.dims.size() != 1 || weights.dims[0] != g.classes) {
      return ctx.Error(
          absl::StrCat("weights ", DimsToString(weights.dims), " must be [C] = [", g.classes, "]"));
    }
  }
  return g;
}

absl::StatusOr<GemmGeometry> PlanGemm(const KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  if (a.dims.size() != 2 || b.dims.size() != 2) {
    return ctx.Error(absl::StrCat("A and B must be 2-D; they are ", DimsToString(a.dims), " and ",
                                  DimsToString(b.dims)));
  }
  if (a.dtype != b.dtype) {
    return ctx.Error(absl::StrCat("A is ", DTypeName(a.dtype), " but B is ", DTypeName(b.dtype)));
  }
  GemmGeometry g;
  g.trans_a = ctx.GetInt("transA", 0) != 0;
  g.trans_b = ctx.GetInt("transB", 0) != 0;
  g.alpha = ctx.GetFloat("alpha", 1.0f);
  g.beta = ctx.GetFloat("beta", 1.0f);
  g.m = a.dims[g.trans_a ? 1 : 0];
  g.k = a.dims[g.trans_a ? 0 : 1];
  const int64_t k_b = b.dims[g.trans_b ? 1 : 0];
  g.n = b.dims[g.trans_b ? 0 : 1];
  if (g.k != k_b) {
    return ctx.Error(absl::StrCat("inner dimensions differ: A ", DimsToString(a.dims),
                                  g.trans_a ? " (transposed)" : "", ", B ", DimsToString(b.dims),
                                  g.trans_b ? " (transposed)" : ""));
  }
  if (!ctx.has_input(2)) return g;
  const TensorView& c = ctx.input(2);
  if (c.dtype != a.dtype) {
    return ctx.Error(absl::StrCat("C is ", DTypeName(c.dtype), " but A is ", DTypeName(a.dtype)));
  }
  if (c.dims.size() > 2) {
    return ctx.Error(absl::StrCat("C ", DimsToString(c.dims), " has rank above 2"));
  }
  if (c.dims.size() >= 1) g.c_cols = c.dims.back();
  if (c.dims.size() == 2) g.c_rows = c.dims[0];
  if ((g.c_rows != 1 && g.c_rows != g.m) || (g.c_cols != 1 && g.c_cols != g.n)) {
    return ctx.Error(absl::StrCat("C ", DimsToString(c.dims), " does not broadcast to [", g.m,
                                  ",", g.n, "]"));
  }
  g.use_c = g.beta != 0.0f && c.num_elements() > 0;
  return g;
}

ShapeWindow PlanShape(const KernelContext& ctx, int64_t rank) {
  auto clamp = [rank](int64_t index) {
    if (index < 0) index += rank;
    return std::clamp<int64_t>(index, 0, rank);
  };
  const int64_t start = clamp(ctx.GetInt("start", 0));
  const int64_t end = clamp(ctx.GetInt("end", rank));
  return ShapeWindow{start, std::max<int64_t>(0, end - start)};
}

absl::StatusOr<Tensor> ConstantOfShapeFill(const KernelContext& ctx,
                                           const std::vector<int64_t>& dims) {
  for (int64_t d : dims) {
    if (d < 0) {
      return ctx.Error(absl::StrCat("shape ", DimsToString(dims), " has a negative entry"));
    }
  }
  const Attribute* a = ctx.node().attribute("value");
  if (a == nullptr) return Tensor::Scalar(0.0f);
  if (a->t.num_elements() != 1 || DTypeSize(a->t.dtype()) == 0) {
    return ctx.Error(absl::StrCat("attribute 'value' must hold one fixed-size element; it is a ",
                                  DTypeName(a->t.dtype()), " tensor of ", a->t.num_elements(),
                                  " elements"));
  }
  return a->t;
}

absl::Status CheckClipBounds(const KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  for (int i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    const TensorView& bound = ctx.input(i);
    if (bound.dtype != x.dtype) {
      return ctx.Error(absl::StrCat("input ", i, " (", i == 1 ? "min" : "max", ") is ",
                                    DTypeName(bound.dtype), "; expected input 0's dtype ",
                                    DTypeName(x.dtype)));
    }
    if (bound.num_elements() != 1) {
      return ctx.Error(absl::StrCat("input ", i, " (", i == 1 ? "min" : "max",
                                    ") must hold one value; its shape is ",
                                    DimsToString(bound.dims)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReduceAxes> PlanReduceAxes(const KernelContext& ctx, int64_t axes_input_since,
                                          const IntInputReader& read_input) {
  const int rank = static_cast<int>(ctx.input(0).dims.size());
  std::vector<int64_t> axes;
  if (ctx.opset() >= axes_input_since) {
    if (ctx.has_input(1)) {
      const TensorView& t = ctx.input(1);
      if (t.dtype != DType::kInt64) {
        return ctx.Error(absl::StrCat("input 1 (axes) is ", DTypeName(t.dtype),
                                      "; expected int64"));
      }
      if (t.dims.size() > 1) {
        return ctx.Error(absl::StrCat("input 1 (axes) must be 1-D; its shape is ",
                                      DimsToString(t.dims)));
      }
      CASTOR_ASSIGN_OR_RETURN(axes, read_input(1));
    }
  } else {
    axes = ctx.GetInts("axes");
  }
  ReduceAxes choice;
  if (axes.empty()) {
    choice.noop = ctx.opset() >= axes_input_since && ctx.GetInt("noop_with_empty_axes", 0) != 0;
    choice.reduced.assign(rank, !choice.noop);
    return choice;
  }
  choice.reduced.assign(rank, false);
  for (int64_t axis : axes) {
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank) {
      return ctx.Error(absl::StrCat("axis ", axis, " is out of range for input of rank ", rank,
                                    " ", DimsToString(ctx.input(0).dims)));
    }
    if (choice.reduced[a]) return ctx.Error(absl::StrCat("axis ", axis, " is listed twice"));
    choice.reduced[a] = true;
  }
  return choice;
}

absl::StatusOr<ArgReduceGeometry> PlanArgReduce(const KernelContext& ctx, bool is_max) {
  const TensorView& x = ctx.input(0);
  const int rank = static_cast<int>(x.dims.size());
  const int64_t axis_attr = ctx.GetInt("axis", 0);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis >= std::max(rank, 1) || (rank == 0 && axis != 0)) {
    return ctx.Error(absl::StrCat("axis ", axis_attr, " is out of range for input of rank ", rank));
  }
  const bool keepdims = ctx.GetInt("keepdims", 1) != 0;
  ArgReduceGeometry g;
  g.axis = axis;
  g.select_last = ctx.GetInt("select_last_index", 0) != 0;
  g.n = rank == 0 ? 1 : x.dims[axis];
  for (int i = 0; i < axis; ++i) g.outer *= x.dims[i];
  for (int i = static_cast<int>(axis) + 1; i < rank; ++i) g.inner *= x.dims[i];
  for (int i = 0; i < rank; ++i) {
    if (i != axis) {
      g.out_dims.push_back(x.dims[i]);
    } else if (keepdims) {
      g.out_dims.push_back(1);
    }
  }
  if (g.n == 0 && g.outer * g.inner > 0) {
    return ctx.Error(absl::StrCat("cannot take the arg", is_max ? "max" : "min",
                                  " of an empty axis ", axis, " of ", DimsToString(x.dims)));
  }
  return g;
}

absl::StatusOr<std::vector<bool>> PlanReduceToShapeOf(const KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  const size_t rank = dy.dims.size();
  if (x.dims.size() > rank) {
    return ctx.Error(absl::StrCat("input 1 (X) ", DimsToString(x.dims),
                                  " has more axes than input 0 (dY) ", DimsToString(dy.dims)));
  }
  const size_t offset = rank - x.dims.size();
  std::vector<bool> summed(rank, false);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t xd = d < offset ? 1 : x.dims[d - offset];
    if (xd != dy.dims[d] && xd != 1) {
      return ctx.Error(absl::StrCat("input 1 (X) ", DimsToString(x.dims),
                                    " does not broadcast to input 0 (dY) ", DimsToString(dy.dims)));
    }
    summed[d] = xd == 1 && dy.dims[d] != 1;
  }
  return summed;
}

absl::StatusOr<BatchNormGeometry> PlanBatchNorm(const KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dims.size() < 2) {
    return ctx.Error(absl::StrCat("input X must have rank >= 2; it is ", DimsToString(x.dims)));
  }
  BatchNormGeometry g;
  const bool castor_training = ctx.node().domain() == kCastorDomain;
  if (castor_training) {
    g.training = true;
  } else {
    g.training = ctx.opset() >= 14 ? ctx.GetInt("training_mode", 0) != 0
                                   : (ctx.num_outputs() > 1 && ctx.has_output(1));
  }
  const bool spatial = castor_training || ctx.GetInt("spatial", 1) != 0;
  g.epsilon = ctx.GetFloat("epsilon", 1e-5f);
  g.momentum = ctx.GetFloat("momentum", 0.9f);
  g.batch = x.dims[0];
  g.features = x.dims[1];
  g.inner = 1;  // elements per (image, feature)
  for (size_t d = 2; d < x.dims.size(); ++d) (spatial ? g.inner : g.features) *= x.dims[d];
  const char* const names[] = {"X", "scale", "B", "mean", "var"};
  for (int i = 1; i <= 4; ++i) {
    if (ctx.input(i).num_elements() != g.features) {
      return ctx.Error(absl::StrCat("input ", i, " (", names[i], ") ",
                                    DimsToString(ctx.input(i).dims), " must have ", g.features,
                                    " entries for X ", DimsToString(x.dims)));
    }
  }
  if (castor_training) {
    const int64_t count = g.batch * g.inner;
    if (count < 2 && g.features > 0) {
      return ctx.Error(absl::StrCat("X ", DimsToString(x.dims), " has ", count,
                                    " value per channel; training needs more than 1 (the "
                                    "unbiased batch variance divides by count - 1)"));
    }
    g.running_var_factor = static_cast<double>(count) / static_cast<double>(count - 1);
  }
  return g;
}

absl::StatusOr<int64_t> CheckConvGrad(const KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  const TensorView& w = ctx.input(2);
  const int64_t group = ctx.GetInt("group", 1);
  if (x.dims.size() < 3 || w.dims.size() != x.dims.size()) {
    return ctx.Error(absl::StrCat("input 1 (X) ", DimsToString(x.dims), " and input 2 (W) ",
                                  DimsToString(w.dims), " must have the same rank >= 3"));
  }
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 2, "W", 1, "X"));
  if (group < 1) return ctx.Error(absl::StrCat("attribute 'group' is ", group, "; expected >= 1"));
  if (w.dims[1] * group != x.dims[1] || w.dims[0] % group != 0) {
    return ctx.Error(absl::StrCat("input 2 (W) ", DimsToString(w.dims), " does not fit X ",
                                  DimsToString(x.dims), " with group ", group,
                                  " (W.dim(1) * group must be C; W.dim(0) divisible by group)"));
  }
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  if (ctx.node().has_attribute("kernel_shape") && ctx.GetInts("kernel_shape") != kernel) {
    return ctx.Error(absl::StrCat("attribute 'kernel_shape' ",
                                  DimsToString(ctx.GetInts("kernel_shape")),
                                  " does not match W's spatial dims ", DimsToString(kernel)));
  }
  return group;
}

absl::StatusOr<BatchNormGradGeometry> PlanBatchNormGrad(const KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  const TensorView& scale = ctx.input(2);
  if (x.dims.size() < 2) {
    return ctx.Error(absl::StrCat("input 1 (X) must have rank >= 2 ([N, C, ...]); it is ",
                                  DimsToString(x.dims)));
  }
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 0, "dY", x.dims, "X's shape"));
  BatchNormGradGeometry g;
  g.batch = x.dims[0];
  g.channels = x.dims[1];
  g.inner = DimsProduct(x.dims, 2, x.dims.size());
  if (scale.dims.size() != 1 || scale.dims[0] != g.channels) {
    return ctx.Error(absl::StrCat("input 2 (scale) is ", DimsToString(scale.dims), "; expected [",
                                  g.channels, "] (C of X ", DimsToString(x.dims), ")"));
  }
  if (ctx.has_input(3)) {
    const TensorView& mean = ctx.input(3);
    if (mean.dtype != DType::kFloat32 || mean.dims.size() != 1 || mean.dims[0] != g.channels) {
      return ctx.Error(absl::StrCat("input 3 (mean) is ", DTypeName(mean.dtype), " ",
                                    DimsToString(mean.dims), "; expected float32 [", g.channels,
                                    "]"));
    }
  }
  if (ctx.has_input(4)) {
    CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 4, "relu_output", 1, "X"));
    CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 4, "relu_output", x.dims, "X's shape"));
  }
  return g;
}

absl::StatusOr<LayerNormGeometry> PlanLayerNormGrad(const KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 0, "dY", x.dims, "X's shape"));
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  const int64_t axis = ctx.GetInt("axis", -1);
  if (axis < -rank || axis >= rank) {
    return ctx.Error(absl::StrCat("attribute 'axis' ", axis, " is out of range for input 1 (X) ",
                                  DimsToString(x.dims)));
  }
  LayerNormGeometry g;
  g.axis = axis < 0 ? axis + rank : axis;
  g.outer = DimsProduct(x.dims, 0, g.axis);
  g.inner = DimsProduct(x.dims, g.axis, x.dims.size());
  // scale broadcasts (right-aligned) against the normalised axes only.
  const std::vector<int64_t> norm_dims(x.dims.begin() + g.axis, x.dims.end());
  const std::vector<int64_t>& sd = ctx.input(2).dims;
  if (!BroadcastsTo(sd, norm_dims)) {
    return ctx.Error(absl::StrCat("input 2 (scale) ", DimsToString(sd),
                                  " does not broadcast to X's normalised axes ",
                                  DimsToString(norm_dims)));
  }
  return g;
}

absl::StatusOr<InstanceNormGeometry> PlanInstanceNormGrad(const KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const InstanceNormGeometry g, InstanceNormRows(ctx, 1));
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "X"));
  CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 0, "dY", x.dims, "X's shape"));
  CASTOR_RETURN_IF_ERROR(RequireChannelVector(ctx, 2, "scale", g, x));
  return g;
}

absl::Status CheckGlobalAveragePoolGrad(const KernelContext& ctx) {
  const TensorView& x = ctx.input(1);
  if (x.dims.size() < 3) {
    return ctx.Error(absl::StrCat("input 1 (X) must have rank >= 3 ([N, C, D1, ...]); it is ",
                                  DimsToString(x.dims)));
  }
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "X"));
  std::vector<int64_t> y_dims(x.dims.size(), 1);
  y_dims[0] = x.dims[0];
  y_dims[1] = x.dims[1];
  return RequireDims(ctx, 0, "dY", y_dims, "GlobalAveragePool's output for X");
}

absl::StatusOr<LossGeometry> PlanCrossEntropyGrad(const KernelContext& ctx) {
  const TensorView& d_loss = ctx.input(0);
  const TensorView& scores = ctx.input(1);
  const TensorView& labels = ctx.input(2);
  LossGeometry g;
  CASTOR_ASSIGN_OR_RETURN(g.reduction, LossReduction(ctx, [](const std::string& reduction) {
                            return absl::StrCat("attribute 'reduction' is \"", reduction,
                                                "\"; expected \"mean\", \"sum\" or \"none\"");
                          }));
  if (scores.dims.size() < 2) {
    return ctx.Error(absl::StrCat("input 1 (scores) must have rank >= 2 ([N, C, d1, ...]); it is ",
                                  DimsToString(scores.dims)));
  }
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dLoss", 1, "scores"));
  if (labels.dtype != DType::kInt32 && labels.dtype != DType::kInt64) {
    return ctx.Error(
        absl::StrCat("input 2 (labels) is ", DTypeName(labels.dtype), "; expected int32 or int64"));
  }
  LossLayout(scores.dims, g);
  CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 2, "labels", g.label_dims, "scores without C"));
  if (ctx.has_input(3)) {
    CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 3, "weights", 1, "scores"));
    CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 3, "weights", {g.classes}, "one per class"));
  }
  if (g.reduction == "none") {
    CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 0, "dLoss", g.label_dims, "labels' shape for 'none'"));
  } else if (d_loss.num_elements() != 1) {
    return ctx.Error(absl::StrCat("input 0 (dLoss) is ", DimsToString(d_loss.dims),
                                  "; expected a scalar for reduction \"", g.reduction, "\""));
  }
  return g;
}

absl::StatusOr<int64_t> PlanGatherGrad(const KernelContext& ctx) {
  const TensorView& indices = ctx.input(1);
  const TensorView& data = ctx.input(2);
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 2, "data"));
  if (indices.dtype != DType::kInt32 && indices.dtype != DType::kInt64) {
    return ctx.Error(absl::StrCat("input 1 (indices) is ", DTypeName(indices.dtype),
                                  "; expected int32 or int64"));
  }
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  const int64_t axis_attr = ctx.GetInt("axis", 0);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis >= rank) {
    return ctx.Error(absl::StrCat("attribute 'axis' ", axis_attr,
                                  " is out of range for input 2 (data) ", DimsToString(data.dims)));
  }
  std::vector<int64_t> y_dims(data.dims.begin(), data.dims.begin() + axis);
  y_dims.insert(y_dims.end(), indices.dims.begin(), indices.dims.end());
  y_dims.insert(y_dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  CASTOR_RETURN_IF_ERROR(
      RequireDims(ctx, 0, "dY", y_dims, "Gather's output for data and indices"));
  return axis;
}

absl::StatusOr<SoftmaxGeometry> PlanSoftmaxGrad(const KernelContext& ctx) {
  const TensorView& y = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "Y"));
  CASTOR_RETURN_IF_ERROR(RequireDims(ctx, 0, "dY", y.dims, "Y's shape"));
  const int64_t rank = static_cast<int64_t>(y.dims.size());
  const int64_t axis_attr = ctx.GetInt("axis", -1);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (rank == 0 || axis < 0 || axis >= rank) {
    return ctx.Error(absl::StrCat("attribute 'axis' ", axis_attr,
                                  " is out of range for input 1 (Y) ", DimsToString(y.dims)));
  }
  return SoftmaxGeometry{DimsProduct(y.dims, 0, axis), y.dims[axis],
                         DimsProduct(y.dims, axis + 1, y.dims.size())};
}

// ---- indexing ------------------------------------------------------------------

absl::StatusOr<ScatterReduction> PlanScatterReduction(const KernelContext& ctx) {
  const std::string reduction = ctx.GetString("reduction", "none");
  const int64_t opset = ctx.opset();
  if (reduction == "none") return ScatterReduction::kNone;
  if (reduction == "add" && opset >= 16) return ScatterReduction::kAdd;
  if (reduction == "mul" && opset >= 16) return ScatterReduction::kMul;
  if (reduction == "max" && opset >= 18) return ScatterReduction::kMax;
  if (reduction == "min" && opset >= 18) return ScatterReduction::kMin;
  return ctx.Error(absl::StrCat("attribute 'reduction' is \"", reduction, "\"; opset ", opset,
                                " takes \"none\"", opset >= 16 ? ", \"add\", \"mul\"" : "",
                                opset >= 18 ? ", \"max\", \"min\"" : ""));
}

namespace {

absl::Status RequireIndexDType(const KernelContext& ctx, int i) {
  const DType dtype = ctx.input(i).dtype;
  if (dtype != DType::kInt32 && dtype != DType::kInt64) {
    return ctx.Error(absl::StrCat("input ", i, " (indices) is ", DTypeName(dtype),
                                  "; expected int32 or int64"));
  }
  return absl::OkStatus();
}

// GatherND's geometry of data input `d` indexed by indices input `i`.
absl::StatusOr<NDIndexGeometry> PlanNDIndex(const KernelContext& ctx, int d, int i,
                                            int64_t batch_dims) {
  CASTOR_RETURN_IF_ERROR(RequireIndexDType(ctx, i));
  const std::vector<int64_t>& data = ctx.input(d).dims;
  const std::vector<int64_t>& indices = ctx.input(i).dims;
  const int64_t data_rank = static_cast<int64_t>(data.size());
  const int64_t index_rank = static_cast<int64_t>(indices.size());
  if (data_rank == 0 || index_rank == 0) {
    return ctx.Error(absl::StrCat("data ", DimsToString(data), " and indices ",
                                  DimsToString(indices), " must both have rank >= 1"));
  }
  if (batch_dims < 0 || batch_dims >= std::min(data_rank, index_rank)) {
    return ctx.Error(absl::StrCat("attribute 'batch_dims' is ", batch_dims, "; expected [0, ",
                                  std::min(data_rank, index_rank) - 1, "] for data ",
                                  DimsToString(data), " and indices ", DimsToString(indices)));
  }
  for (int64_t b = 0; b < batch_dims; ++b) {
    if (data[b] != indices[b]) {
      return ctx.Error(absl::StrCat("batch dim ", b, " differs: data ", DimsToString(data),
                                    ", indices ", DimsToString(indices)));
    }
  }
  const int64_t k = indices.back();
  if (k < 1 || k > data_rank - batch_dims) {
    return ctx.Error(absl::StrCat("indices ", DimsToString(indices), " hold tuples of ", k,
                                  " entries; expected 1 to ", data_rank - batch_dims,
                                  " for data ", DimsToString(data), " and batch_dims ",
                                  batch_dims));
  }
  if (k > kMaxIndexedRank) {
    return ctx.Unimplemented(absl::StrCat("index tuples of ", k, " entries (at most ",
                                          kMaxIndexedRank, ")"));
  }
  NDIndexGeometry g;
  g.batches = DimsProduct(data, 0, batch_dims);
  g.tuples = DimsProduct(indices, batch_dims, index_rank - 1);
  g.slice = DimsProduct(data, batch_dims + k, data_rank);
  g.data_batch = DimsProduct(data, batch_dims, data_rank);
  g.indexer.k = static_cast<int>(k);
  for (int64_t e = 0; e < k; ++e) {
    g.indexer.dims[e] = data[batch_dims + e];
    g.indexer.strides[e] = DimsProduct(data, batch_dims + e + 1, data_rank);
  }
  g.gathered_dims.assign(indices.begin(), indices.end() - 1);
  g.gathered_dims.insert(g.gathered_dims.end(), data.begin() + batch_dims + k, data.end());
  return g;
}

// GatherElements' indexer of data input `d` by indices input `i`.
absl::StatusOr<ElementsIndexer> PlanElementsIndex(const KernelContext& ctx, int d, int i) {
  CASTOR_RETURN_IF_ERROR(RequireIndexDType(ctx, i));
  const std::vector<int64_t>& data = ctx.input(d).dims;
  const std::vector<int64_t>& indices = ctx.input(i).dims;
  const int64_t rank = static_cast<int64_t>(data.size());
  if (rank == 0 || indices.size() != data.size()) {
    return ctx.Error(absl::StrCat("data ", DimsToString(data), " and indices ",
                                  DimsToString(indices), " must have one rank >= 1"));
  }
  if (rank > kMaxIndexedRank) {
    return ctx.Unimplemented(absl::StrCat("data of rank ", rank, " (at most ", kMaxIndexedRank,
                                          ")"));
  }
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank, "axis"));
  ElementsIndexer g;
  g.rank = static_cast<int>(rank);
  g.axis = static_cast<int>(axis);
  g.axis_size = data[axis];
  const std::vector<int64_t> strides = ContiguousStrides(data);
  for (int64_t a = 0; a < rank; ++a) {
    if (a != axis && indices[a] > data[a]) {
      return ctx.Error(absl::StrCat("indices ", DimsToString(indices), " exceed data ",
                                    DimsToString(data), " along axis ", a, " (not the indexed axis ",
                                    axis, ")"));
    }
    g.index_dims[a] = indices[a];
    g.data_strides[a] = strides[a];
  }
  return g;
}

// Input `u` (called `name`) must have input `d`'s dtype and `dims`.
absl::Status RequireLike(const KernelContext& ctx, int u, const char* name, int d,
                         const std::vector<int64_t>& dims, const char* why) {
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, u, name, d, "data"));
  return RequireDims(ctx, u, name, dims, why);
}

}  // namespace

absl::StatusOr<NDIndexGeometry> PlanGatherND(const KernelContext& ctx) {
  return PlanNDIndex(ctx, 0, 1, ctx.GetInt("batch_dims", 0));
}

absl::StatusOr<NDIndexGeometry> PlanScatterND(const KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(NDIndexGeometry g, PlanNDIndex(ctx, 0, 1, 0));
  CASTOR_RETURN_IF_ERROR(
      RequireLike(ctx, 2, "updates", 0, g.gathered_dims, "indices' dims but the last, then "
                                                         "data's dims after the indexed ones"));
  return g;
}

absl::StatusOr<NDIndexGeometry> PlanGatherNDGrad(const KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(NDIndexGeometry g, PlanNDIndex(ctx, 2, 1, ctx.GetInt("batch_dims", 0)));
  CASTOR_RETURN_IF_ERROR(
      RequireLike(ctx, 0, "dY", 2, g.gathered_dims, "GatherND's output for data and indices"));
  return g;
}

absl::StatusOr<ElementsIndexer> PlanGatherElements(const KernelContext& ctx) {
  return PlanElementsIndex(ctx, 0, 1);
}

absl::StatusOr<ElementsIndexer> PlanScatterElements(const KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(ElementsIndexer g, PlanElementsIndex(ctx, 0, 1));
  CASTOR_RETURN_IF_ERROR(RequireLike(ctx, 2, "updates", 0, ctx.input(1).dims, "indices' dims"));
  return g;
}

absl::StatusOr<ElementsIndexer> PlanGatherElementsGrad(const KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(ElementsIndexer g, PlanElementsIndex(ctx, 2, 1));
  CASTOR_RETURN_IF_ERROR(
      RequireLike(ctx, 0, "dY", 2, ctx.input(1).dims, "GatherElements' output: indices' dims"));
  return g;
}

// ---- Trilu, CumSum ---------------------------------------------------------------

absl::StatusOr<TriluGeometry> PlanTrilu(const KernelContext& ctx,
                                        const std::optional<std::vector<int64_t>>& k_input) {
  const std::vector<int64_t>& dims = ctx.input(0).dims;
  if (dims.size() < 2) {
    return ctx.Error(absl::StrCat("input 0 is ", DimsToString(dims),
                                  "; expected rank >= 2 (matrices in the last two axes)"));
  }
  TriluGeometry g;
  g.rows = dims[dims.size() - 2];
  g.cols = dims.back();
  g.matrices = DimsProduct(dims, 0, dims.size() - 2);
  g.upper = ctx.GetInt("upper", 1) != 0;
  if (k_input) {
    if (k_input->size() != 1) {
      return ctx.Error(absl::StrCat("input 1 (k) holds ", k_input->size(),
                                    " values; expected one"));
    }
    g.k = (*k_input)[0];
  }
  return g;
}

absl::StatusOr<CumSumGeometry> PlanCumSum(const KernelContext& ctx,
                                          const std::vector<int64_t>& axis_input) {
  const TensorView& axis_tensor = ctx.input(1);
  if (axis_tensor.dtype != DType::kInt32 && axis_tensor.dtype != DType::kInt64) {
    return ctx.Error(absl::StrCat("input 1 (axis) is ", DTypeName(axis_tensor.dtype),
                                  "; expected int32 or int64"));
  }
  if (axis_input.size() != 1) {
    return ctx.Error(absl::StrCat("input 1 (axis) must hold one value; its shape is ",
                                  DimsToString(axis_tensor.dims)));
  }
  const std::vector<int64_t>& dims = ctx.input(0).dims;
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t axis = axis_input[0] < 0 ? axis_input[0] + rank : axis_input[0];
  if (axis < 0 || axis >= rank) {
    return ctx.Error(absl::StrCat("axis ", axis_input[0], " is out of range for input of rank ",
                                  rank));
  }
  CumSumGeometry g;
  g.outer = DimsProduct(dims, 0, axis);
  g.n = dims[axis];
  g.inner = DimsProduct(dims, axis + 1, dims.size());
  g.exclusive = ctx.GetInt("exclusive", 0) != 0;
  g.reverse = ctx.GetInt("reverse", 0) != 0;
  return g;
}

}  // namespace castor::common
