// CPU kernels: data_movement family (ops of graph/ops/data_movement.cc):
// Concat, Split, Slice, Gather, Tile, Pad, GatherND, ScatterND,
// GatherElements, ScatterElements, Trilu, DepthToSpace and SpaceToDepth. All are dtype-agnostic (they
// move elements of DTypeSize bytes; a scatter with a reduction computes in
// the data's numeric type, 16-bit floats in float32) and compute their
// output dims from the input values. Indices out of range are the node's
// error naming the index; duplicate scatter indices apply in order (the
// last write wins with reduction none, as ONNX's reference). Opset forms: Split's sizes are an attribute before 13, an
// input from 13, or `num_outputs` chunks from 18; Slice's starts/ends/axes
// are attributes before 10 and inputs (with steps) from 10; Pad's pads are
// an attribute before 11, an input from 11, with an `axes` input from 18.
// GatherGrad, GatherNDGrad and GatherElementsGrad (com.castor,
// graph/ops/gradient_ops.cc) scatter-add dY into zeros of data's shape, in
// float32.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/depth_geometry.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/strided_copy.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// ---- Concat --------------------------------------------------------------------

absl::Status RunConcat(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::ConcatGeometry g, common::PlanConcat(ctx));
  const DType dtype = ctx.input(0).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, dtype, g.dims));
  const size_t element_size = DTypeSize(dtype);
  const int64_t out_row = g.dims[g.axis] * g.inner;
  int64_t offset = 0;  // elements into an output row
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const TensorView& in = ctx.input(i);
    const int64_t row = in.dims[g.axis] * g.inner;
    // The input as [outer, row] written into columns offset.. of [outer, out_row].
    StridedCopy({g.outer, row}, element_size, in.data, {row, 1},
                static_cast<char*>(out->data) + offset * element_size, {out_row, 1});
    offset += row;
  }
  return absl::OkStatus();
}

// ---- Split ---------------------------------------------------------------------

absl::Status RunSplit(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  std::optional<std::vector<int64_t>> split_input;
  if (ctx.opset() >= 13 && ctx.has_input(1)) split_input = ReadInts(ctx.input(1));
  CASTOR_ASSIGN_OR_RETURN(const common::SplitGeometry g, common::PlanSplit(ctx, split_input));
  const size_t element_size = DTypeSize(in.dtype);
  const int64_t in_row = in.dims[g.axis] * g.inner;
  int64_t offset = 0;
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    std::vector<int64_t> dims = in.dims;
    dims[g.axis] = g.sizes[i];
    const int64_t row = g.sizes[i] * g.inner;
    if (ctx.has_output(i)) {
      CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(i, in.dtype, dims));
      StridedCopy({g.outer, row}, element_size,
                  static_cast<const char*>(in.data) + offset * element_size, {in_row, 1}, out->data,
                  {row, 1});
    }
    offset += row;
  }
  return absl::OkStatus();
}

// ---- Slice ---------------------------------------------------------------------

absl::Status RunSlice(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::SliceGeometry slice,
                          common::PlanSlice(ctx, in.dims, HostIntInputs(ctx)));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, in.dtype, slice.dims));
  if (out->num_elements() == 0) return absl::OkStatus();
  const size_t element_size = DTypeSize(in.dtype);
  StridedCopy(slice.dims, element_size,
              static_cast<const char*>(in.data) + slice.offset * element_size, slice.src_strides,
              out->data, common::ContiguousStrides(slice.dims));
  return absl::OkStatus();
}

// ---- Gather --------------------------------------------------------------------

absl::Status RunGather(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  if (rank == 0) return ctx.Error("input 0 (data) must have rank >= 1; got a scalar");
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          common::NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank, "axis"));
  const int64_t axis_size = data.dims[axis];
  std::vector<int64_t> index_values = ReadInts(indices);
  for (int64_t& index : index_values) {
    if (index < -axis_size || index >= axis_size) {
      return ctx.Error(absl::StrCat("index ", index, " is out of range for axis ", axis,
                                    " of size ", axis_size, " (data ",
                                    common::DimsToString(data.dims), ")"));
    }
    if (index < 0) index += axis_size;
  }
  std::vector<int64_t> dims(data.dims.begin(), data.dims.begin() + axis);
  dims.insert(dims.end(), indices.dims.begin(), indices.dims.end());
  dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, dims));
  const size_t element_size = DTypeSize(data.dtype);
  const int64_t outer = common::DimsProduct(data.dims, 0, axis);
  const int64_t inner = common::DimsProduct(data.dims, axis + 1, data.dims.size());
  const int64_t count = static_cast<int64_t>(index_values.size());
  const size_t block = static_cast<size_t>(inner) * element_size;
  if (block == 0 || outer * count == 0) return absl::OkStatus();
  const char* src = static_cast<const char*>(data.data);
  char* dst = static_cast<char*>(out->data);
  const int64_t grain = std::max<int64_t>(1, 65536 / static_cast<int64_t>(block));
  ParallelFor(0, outer * count, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t o = j / count, k = j % count;
      std::memcpy(dst + j * block, src + (o * axis_size + index_values[k]) * block, block);
    }
  });
  return absl::OkStatus();
}

// ---- Tile ----------------------------------------------------------------------

absl::Status RunTile(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanTile(ctx, in.dims, ReadInts(ctx.input(1))));
  return CopyByPlan(ctx, plan);
}

// ---- Pad -----------------------------------------------------------------------

// The constant fill value as one element of `dtype` (`bytes` has 8 bytes).
void PadValueBytes(const KernelContext& ctx, DType dtype, unsigned char* bytes) {
  std::memset(bytes, 0, 8);
  const size_t element_size = DTypeSize(dtype);
  if (ctx.opset() >= 11) {
    if (ctx.has_input(2) && ctx.input(2).num_elements() > 0) {
      std::memcpy(bytes, ctx.input(2).data, element_size);
    }
    return;
  }
  const float value = ctx.GetFloat("value", 0.0f);
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    StoreF(&v, value);
    std::memcpy(bytes, &v, sizeof(T));
  });
}

absl::Status RunPad(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(in.dims.size());
  std::optional<std::vector<int64_t>> pads, axes;
  if (ctx.opset() >= 11 && ctx.has_input(1)) pads = ReadInts(ctx.input(1));
  if (ctx.opset() >= 11 && ctx.has_input(3)) axes = ReadInts(ctx.input(3));
  CASTOR_ASSIGN_OR_RETURN(const common::PadGeometry g, common::PlanPad(ctx, in.dims, pads, axes));
  const std::vector<int64_t>& dims = g.dims;
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, in.dtype, dims));
  const int64_t total = out->num_elements();
  if (total == 0) return absl::OkStatus();
  if (rank == 0) {
    std::memcpy(out->data, in.data, DTypeSize(in.dtype));
    return absl::OkStatus();
  }
  // Per axis: output index -> input index (-1: the constant).
  std::vector<std::vector<int64_t>> source(rank);
  for (int64_t a = 0; a < rank; ++a) {
    source[a].resize(dims[a]);
    for (int64_t o = 0; o < dims[a]; ++o) {
      source[a][o] = common::PadSource(o, in.dims[a], g.before[a], g.mode);
    }
  }
  unsigned char value[8];
  PadValueBytes(ctx, in.dtype, value);
  const size_t element_size = DTypeSize(in.dtype);
  const std::vector<int64_t> in_strides = common::ContiguousStrides(in.dims);
  const int64_t row_length = dims[rank - 1];
  const int64_t rows = total / row_length;
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out->data);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_length));
  ParallelFor(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      // The input row this output row reads, or none (constant row).
      int64_t in_offset = 0;
      bool constant_row = false;
      for (int64_t a = rank - 2, rest = row; a >= 0; --a) {
        const int64_t s = source[a][rest % dims[a]];
        rest /= dims[a];
        if (s < 0) constant_row = true;
        in_offset += s * in_strides[a];
      }
      char* out_row = dst + row * row_length * element_size;
      const std::vector<int64_t>& inner = source[rank - 1];
      for (int64_t o = 0; o < row_length; ++o) {
        const int64_t s = constant_row ? -1 : inner[o];
        std::memcpy(out_row + o * element_size,
                    s < 0 ? static_cast<const void*>(value)
                          : static_cast<const void*>(src + (in_offset + s) * element_size),
                    element_size);
      }
    }
  });
  return absl::OkStatus();
}

// ---- GatherGrad ------------------------------------------------------------------

absl::Status GatherGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const TensorView& data = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis, common::PlanGatherGrad(ctx));
  const int64_t outer = common::DimsProduct(data.dims, 0, axis);
  const int64_t axis_dim = data.dims[axis];
  const int64_t inner = common::DimsProduct(data.dims, axis + 1, data.dims.size());
  const int64_t count = indices.num_elements();
  std::vector<int64_t> wrapped(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = IntAt(indices, k);
    if (index < -axis_dim || index >= axis_dim) {
      return ctx.Error(absl::StrCat("input 1 (indices): index ", index, " at position ", k,
                                    " is out of range [", -axis_dim, ", ", axis_dim, ")"));
    }
    wrapped[k] = index < 0 ? index + axis_dim : index;
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * dd, ctx.Output(0, data.dtype, data.dims));
  const Float32Out out(dd);
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  DispatchFloat(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    float* acc = out.data();
    ParallelFor(0, outer * blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t task = lo; task < hi; ++task) {
        const int64_t o = task / blocks;
        const int64_t i0 = task % blocks * kBlock;
        const int64_t i1 = std::min(inner, i0 + kBlock);
        for (int64_t k = 0; k < count; ++k) {
          const T* src = dyp + (o * count + k) * inner;
          float* dst = acc + (o * axis_dim + wrapped[k]) * inner;
          for (int64_t i = i0; i < i1; ++i) dst[i] += LoadF(src[i]);
        }
      }
    });
  });
  out.Finish();
  return absl::OkStatus();
}
// ---- GatherND / ScatterND / GatherNDGrad -----------------------------------------

// The data offset of each index tuple (batch-major, as the tuples lie in
// indices), checked against the indexed dims.
absl::StatusOr<std::vector<int64_t>> TupleOffsets(const KernelContext& ctx,
                                                  const common::NDIndexGeometry& g,
                                                  const TensorView& indices) {
  const int k = g.indexer.k;
  std::vector<int64_t> offsets(static_cast<size_t>(g.batches * g.tuples));
  int64_t tuple[common::kMaxIndexedRank];
  for (int64_t t = 0; t < static_cast<int64_t>(offsets.size()); ++t) {
    for (int e = 0; e < k; ++e) tuple[e] = IntAt(indices, t * k + e);
    const int64_t offset = g.indexer.Offset(tuple);
    if (offset < 0) {
      std::vector<int64_t> entries(tuple, tuple + k);
      std::vector<int64_t> dims(g.indexer.dims, g.indexer.dims + k);
      return ctx.Error(absl::StrCat("input 1 (indices): tuple ", t, " [", absl::StrJoin(entries, ","),
                                    "] is out of range for the indexed data dims ",
                                    common::DimsToString(dims)));
    }
    offsets[t] = t / g.tuples * g.data_batch + offset;
  }
  return offsets;
}

absl::Status RunGatherND(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::NDIndexGeometry g, common::PlanGatherND(ctx));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, TupleOffsets(ctx, g, ctx.input(1)));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, g.gathered_dims));
  const size_t block = static_cast<size_t>(g.slice) * DTypeSize(data.dtype);
  if (block == 0) return absl::OkStatus();
  const char* src = static_cast<const char*>(data.data);
  char* dst = static_cast<char*>(out->data);
  const int64_t grain = std::max<int64_t>(1, 65536 / static_cast<int64_t>(block));
  ParallelFor(0, static_cast<int64_t>(offsets.size()), grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      std::memcpy(dst + t * block, src + offsets[t] * DTypeSize(data.dtype), block);
    }
  });
  return absl::OkStatus();
}

// out = data, then for each update element in order (n of them),
// out[target(j)] = combine(out[target(j)], updates[j]): a byte copy for
// reduction none, else the numeric type's arithmetic.
template <typename TargetFn>
absl::Status Scatter(KernelContext& ctx, common::ScatterReduction reduction, int64_t n,
                     TargetFn target) {
  const TensorView& data = ctx.input(0);
  const TensorView& updates = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, data.dims));
  const size_t element_size = DTypeSize(data.dtype);
  if (out->data != data.data) {
    std::memcpy(out->data, data.data, static_cast<size_t>(data.num_elements()) * element_size);
  }
  if (reduction == common::ScatterReduction::kNone) {
    char* dst = static_cast<char*>(out->data);
    const char* src = static_cast<const char*>(updates.data);
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(dst + target(j) * element_size, src + j * element_size, element_size);
    }
    return absl::OkStatus();
  }
  const bool ok = DispatchNumeric(data.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = out->as<T>();
    const T* src = updates.as<T>();
    for (int64_t j = 0; j < n; ++j) {
      T* at = dst + target(j);
      Store(at, common::ScatterCombine(reduction, Load(*at), Load(src[j])));
    }
  });
  if (!ok) {
    return ctx.Error(absl::StrCat("reduction \"", ctx.GetString("reduction", "none"),
                                  "\" needs numeric data; got ", DTypeName(data.dtype)));
  }
  return absl::OkStatus();
}

absl::Status RunScatterND(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::NDIndexGeometry g, common::PlanScatterND(ctx));
  CASTOR_ASSIGN_OR_RETURN(const common::ScatterReduction reduction,
                          common::PlanScatterReduction(ctx));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, TupleOffsets(ctx, g, ctx.input(1)));
  const int64_t slice = g.slice;
  return Scatter(ctx, reduction, static_cast<int64_t>(offsets.size()) * slice,
                 [&](int64_t j) { return offsets[j / slice] + j % slice; });
}

absl::Status GatherNDGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& data = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::NDIndexGeometry g, common::PlanGatherNDGrad(ctx));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, TupleOffsets(ctx, g, ctx.input(1)));
  CASTOR_ASSIGN_OR_RETURN(TensorView * dd, ctx.Output(0, data.dtype, data.dims));
  const Float32Out out(dd);
  const Float32In grad(dy);
  float* acc = out.data();
  const float* src = grad.data();
  // Slices of one batch may overlap: a batch is one task, its tuples in order.
  ParallelFor(0, g.batches, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      for (int64_t t = b * g.tuples; t < (b + 1) * g.tuples; ++t) {
        for (int64_t s = 0; s < g.slice; ++s) acc[offsets[t] + s] += src[t * g.slice + s];
      }
    }
  });
  out.Finish();
  return absl::OkStatus();
}

// ---- GatherElements / ScatterElements / GatherElementsGrad -----------------------

// The data offset each element of `indices` addresses.
absl::StatusOr<std::vector<int64_t>> ElementOffsets(const KernelContext& ctx,
                                                    const common::ElementsIndexer& g,
                                                    const TensorView& indices) {
  std::vector<int64_t> offsets(static_cast<size_t>(indices.num_elements()));
  for (int64_t j = 0; j < static_cast<int64_t>(offsets.size()); ++j) {
    const int64_t index = IntAt(indices, j);
    offsets[j] = g.Offset(j, index);
    if (offsets[j] < 0) {
      return ctx.Error(absl::StrCat("input 1 (indices): index ", index, " at position ", j,
                                    " is out of range for axis ", g.axis, " of size ",
                                    g.axis_size));
    }
  }
  return offsets;
}

absl::Status RunGatherElements(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::ElementsIndexer g, common::PlanGatherElements(ctx));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, ElementOffsets(ctx, g, indices));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, indices.dims));
  const size_t element_size = DTypeSize(data.dtype);
  const char* src = static_cast<const char*>(data.data);
  char* dst = static_cast<char*>(out->data);
  ParallelFor(0, static_cast<int64_t>(offsets.size()), kElementGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      std::memcpy(dst + j * element_size, src + offsets[j] * element_size, element_size);
    }
  });
  return absl::OkStatus();
}

absl::Status RunScatterElements(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::ElementsIndexer g, common::PlanScatterElements(ctx));
  CASTOR_ASSIGN_OR_RETURN(const common::ScatterReduction reduction,
                          common::PlanScatterReduction(ctx));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                          ElementOffsets(ctx, g, ctx.input(1)));
  return Scatter(ctx, reduction, static_cast<int64_t>(offsets.size()),
                 [&](int64_t j) { return offsets[j]; });
}

absl::Status GatherElementsGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& data = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const common::ElementsIndexer g, common::PlanGatherElementsGrad(ctx));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                          ElementOffsets(ctx, g, ctx.input(1)));
  CASTOR_ASSIGN_OR_RETURN(TensorView * dd, ctx.Output(0, data.dtype, data.dims));
  const Float32Out out(dd);
  const Float32In grad(dy);
  float* acc = out.data();
  const float* src = grad.data();
  for (int64_t j = 0; j < static_cast<int64_t>(offsets.size()); ++j) acc[offsets[j]] += src[j];
  out.Finish();
  return absl::OkStatus();
}

// ---- Trilu -----------------------------------------------------------------------

absl::Status RunTrilu(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  std::optional<std::vector<int64_t>> k_input;
  if (ctx.has_input(1)) k_input = ReadInts(ctx.input(1));
  CASTOR_ASSIGN_OR_RETURN(const common::TriluGeometry g, common::PlanTrilu(ctx, k_input));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, in.dtype, in.dims));
  const size_t element_size = DTypeSize(in.dtype);
  const int64_t rows = g.matrices * g.rows;
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out->data);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.cols));
  ParallelFor(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t row = r % g.rows;
      for (int64_t col = 0; col < g.cols; ++col) {
        const size_t at = static_cast<size_t>(r * g.cols + col) * element_size;
        if (common::TriluKeeps(row, col, g.k, g.upper)) {
          if (dst != src) std::memcpy(dst + at, src + at, element_size);
        } else {
          std::memset(dst + at, 0, element_size);
        }
      }
    }
  });
  return absl::OkStatus();
}
// ---- DepthToSpace / SpaceToDepth ----------------------------------------------------

absl::Status RunDepthToSpace(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanDepthToSpace(ctx, ctx.input(0).dims));
  return CopyByPlan(ctx, plan);
}

absl::Status RunSpaceToDepth(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanSpaceToDepth(ctx, ctx.input(0).dims));
  return CopyByPlan(ctx, plan);
}

}  // namespace

void RegisterDataMovementKernels(KernelTable& table) {
  const std::vector<std::pair<const char*, KernelFn>> kernels = {
      {"Concat", RunConcat},       {"Split", RunSplit},
      {"Slice", RunSlice},         {"Gather", RunGather},
      {"Tile", RunTile},           {"Pad", RunPad},
      {"GatherND", RunGatherND},   {"ScatterND", RunScatterND},
      {"GatherElements", RunGatherElements},
      {"ScatterElements", RunScatterElements},
      {"Trilu", RunTrilu},         {"DepthToSpace", RunDepthToSpace},
      {"SpaceToDepth", RunSpaceToDepth}};
  for (auto [op_type, run] : kernels) {
    table.Register(KernelDef{"", op_type, NoStringTensors, run, /*in_place_ok=*/false});
  }
  RegisterGradientKernel(table, "GatherGrad", GatherGradKernel);
  RegisterGradientKernel(table, "GatherNDGrad", GatherNDGradKernel);
  RegisterGradientKernel(table, "GatherElementsGrad", GatherElementsGradKernel);
}

}  // namespace castor::cpu
