// CUDA kernels: shape, data-movement and misc ops (backend/cpu/shape_ops.cc,
// data_movement.cc and misc.cc on the CPU): Reshape, Flatten, Squeeze,
// Unsqueeze, Identity, Dropout, Transpose, Expand, Shape, Size, Constant,
// ConstantOfShape, Range, Concat, Split, Slice, Gather, Tile, Pad, GatherND,
// ScatterND, GatherElements, ScatterElements, Trilu, DepthToSpace,
// SpaceToDepth, and the com.castor
// GatherGrad, GatherNDGrad and GatherElementsGrad.
//
// The data-movement kernels move bytes: they dispatch on the element size
// (1, 2, 4 or 8 bytes; 16 when rows are widened), never on the dtype, so
// every fixed-size dtype the CPU handles works. Output dims are computed on
// the host as the CPU computes them; shape-deciding inputs (shape, axes,
// starts, repeats, pads, split sizes, Range's scalars) are read back with a
// synchronising copy, all other data stays on the device.
//
// Most ops are one strided copy (CopyStrided): an N-d index space with
// source and destination element strides (negative for reversed Slices, 0
// for broadcasts). Its geometry is simplified first (size-1 dims dropped,
// dims contiguous in both views merged), rows contiguous in both views are
// copied in units of up to 16 bytes, and a batched two-axis transpose (the
// last-two-dims swap and every permutation that merges into one) goes
// through 32x32 shared-memory tiles so that reads and writes coalesce.
//
// Metadata-only ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
// inference Dropout) copy with CopyWithin, a no-op when the executor aliased
// output and input (in_place_ok, as on the CPU).
//
// Behaviour that differs from the CPU, because a device-side check could
// only be reported through a synchronisation: Gather, GatherND,
// GatherElements, the scatters and the gradients read their indices on the
// device, and an index outside [-size, size) gives zeros (the gathers) or
// is skipped (the scatters and gradients) instead of the CPU's error.
// Duplicate scatter indices with reduction none race (ONNX leaves the
// winner unspecified; the CPU applies them in order); with a reduction
// they combine atomically, float types in float32 (the CPU rounds 16-bit
// data after each update), int32/int64 in their own type; other dtypes
// take reduction none only.
// Dropout in training mode (a model run as it is) draws the CPU's
// numpy-style MT19937 mask on the host, uploads it and applies it on the
// device; reading training_mode and ratio synchronises. com.castor
// DropoutTraining, the form castor's training graphs run, draws its mask on
// the device with backend/common/philox.h, the CPU's arithmetic (the same
// mask bit for bit), and reads both the RNG state and the ratio on the
// device: nothing synchronises, so a recorded step (CUDA graph) replays
// with each step's counter. A ratio outside [0, 1) known only at run time
// (a constant one is refused by the verifier) gives NaN outputs and a false
// mask there instead of the CPU's error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <math_constants.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/depth_geometry.h"
#include "backend/common/op_geometry.h"
#include "backend/common/philox.h"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/half.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

// The most dims a strided copy or Pad handles after simplification (Tile
// doubles its rank).
constexpr int kMaxDims = 16;
constexpr int kTile = 32;     // transpose tile edge
constexpr int kTileRows = 8;  // rows of threads per transpose block
// Both sides of a transpose must be at least this long for the tiled path.
constexpr int64_t kMinTiledEdge = 16;

using common::ContiguousStrides;

using common::NormalizeAxis;

// A SupportsFn: every tensor of the node has a fixed element size (the
// kernels move bytes; string tensors are refused).
absl::Status FixedSizeTensors(const Node& node) {
  auto check = [](const Value* v) -> absl::Status {
    if (v == nullptr || v->dtype() == DType::kUndefined) return absl::OkStatus();
    const size_t size = DTypeSize(v->dtype());
    if (size == 1 || size == 2 || size == 4 || size == 8) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat("'", v->name(), "' is ", DTypeName(v->dtype()),
                                                 "; CUDA kernels move fixed-size elements only"));
  };
  for (const Value* v : node.inputs()) CASTOR_RETURN_IF_ERROR(check(v));
  for (const Value* v : node.outputs()) CASTOR_RETURN_IF_ERROR(check(v));
  return absl::OkStatus();
}

// Calls f(TypeTag<E>{}) with E an unsigned type of `size` bytes (uint4 for
// 16).
template <typename F>
absl::Status DispatchElementSize(const KernelContext& ctx, size_t size, F&& f) {
  switch (size) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    case 16: return f(TypeTag<uint4>{});
    default:
      return ctx.Unimplemented(absl::StrCat("no CUDA kernel moves elements of ", size, " bytes"));
  }
}

// ---- kernels -------------------------------------------------------------------

// An N-d index space and the element strides of its source and destination.
struct CopyGeometry {
  int rank = 0;
  int64_t dims[kMaxDims];
  int64_t src_strides[kMaxDims];
  int64_t dst_strides[kMaxDims];
};

template <typename E>
__global__ void StridedCopyKernel(const E* src, E* dst, CopyGeometry g, int64_t total) {
  CASTOR_GRID_STRIDE(i, total) {
    int64_t rest = i, src_offset = 0, dst_offset = 0;
    for (int k = g.rank - 1; k >= 0; --k) {
      const int64_t index = rest % g.dims[k];
      rest /= g.dims[k];
      src_offset += index * g.src_strides[k];
      dst_offset += index * g.dst_strides[k];
    }
    dst[dst_offset] = src[src_offset];
  }
}

// `batches` matrices: src [rows, cols] (row stride cols) -> dst [cols, rows]
// (row stride rows), batch b at src + b * src_batch_stride and dst + b *
// dst_batch_stride. Block (kTile, kTileRows); one 32x32 tile per iteration.
template <typename E>
__global__ void BatchedTransposeKernel(const E* src, E* dst, int64_t rows, int64_t cols,
                                       int64_t batches, int64_t src_batch_stride,
                                       int64_t dst_batch_stride) {
  __shared__ E tile[kTile][kTile + 1];
  const int64_t tiles_x = (cols + kTile - 1) / kTile;
  const int64_t tiles_y = (rows + kTile - 1) / kTile;
  const int64_t tiles = batches * tiles_x * tiles_y;
  // The bound and `t` depend on the block only: every thread reaches the
  // barriers.
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b = t / (tiles_x * tiles_y);
    const int64_t rest = t % (tiles_x * tiles_y);
    const int64_t row0 = rest / tiles_x * kTile;
    const int64_t col0 = rest % tiles_x * kTile;
    const E* s = src + b * src_batch_stride;
    E* d = dst + b * dst_batch_stride;
    const int64_t col = col0 + threadIdx.x;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t row = row0 + j;
      if (row < rows && col < cols) tile[j][threadIdx.x] = s[row * cols + col];
    }
    __syncthreads();
    const int64_t out_col = row0 + threadIdx.x;  // a src row
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t out_row = col0 + j;  // a src column
      if (out_row < cols && out_col < rows) d[out_row * rows + out_col] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

template <typename E>
__global__ void FillKernel(E* out, E value, int64_t n) {
  CASTOR_GRID_STRIDE(i, n) { out[i] = value; }
}

// data [outer, axis_size, inner] -> out [outer, count, inner] (inner in
// units of E); an index outside [-axis_size, axis_size) gives zeros.
template <typename E, typename I>
__global__ void GatherKernel(const E* data, const I* indices, E* out, int64_t count,
                             int64_t axis_size, int64_t inner, int64_t total) {
  CASTOR_GRID_STRIDE(i, total) {
    const int64_t e = i % inner;
    const int64_t j = i / inner;
    const int64_t k = j % count;
    const int64_t o = j / count;
    int64_t index = static_cast<int64_t>(indices[k]);
    if (index < 0) index += axis_size;
    out[i] = index >= 0 && index < axis_size ? data[(o * axis_size + index) * inner + e] : E{};
  }
}

// acc [outer, axis_size, inner] += dy [outer, count, inner] scattered by
// the indices (float32 atomics); out-of-range indices are skipped.
template <typename T, typename I>
__global__ void GatherGradKernel(const T* dy, const I* indices, float* acc, int64_t count,
                                 int64_t axis_size, int64_t inner, int64_t total) {
  CASTOR_GRID_STRIDE(i, total) {
    const int64_t e = i % inner;
    const int64_t j = i / inner;
    const int64_t k = j % count;
    const int64_t o = j / count;
    int64_t index = static_cast<int64_t>(indices[k]);
    if (index < 0) index += axis_size;
    if (index >= 0 && index < axis_size) {
      atomicAdd(acc + (o * axis_size + index) * inner + e, ToFloat(dy[i]));
    }
  }
}

// ---- indexing kernels ------------------------------------------------------------------

using common::ElementsIndexer;
using common::ScatterReduction;
using common::TupleIndexer;

// Where update element j of ScatterND (GatherND's output element j) lands
// in data: tuple j / slice of its batch, element j % slice of the slice;
// -1 for an out-of-range tuple.
struct NDTarget {
  TupleIndexer indexer;
  int64_t tuples = 1, slice = 1, data_batch = 1;
  template <typename I>
  __device__ int64_t operator()(const I* indices, int64_t j) const {
    const int64_t t = j / slice;
    const int64_t offset = indexer.Offset(indices + t * indexer.k);
    return offset < 0 ? -1 : t / tuples * data_batch + offset + j % slice;
  }
};

// Where element j of GatherElements' output / ScatterElements' updates
// lies in data; -1 for an out-of-range index.
struct ElementsTarget {
  ElementsIndexer indexer;
  template <typename I>
  __device__ int64_t operator()(const I* indices, int64_t j) const {
    return indexer.Offset(j, static_cast<int64_t>(indices[j]));
  }
};

// out[j] = data[target(j)] (zeros out of range).
template <typename E, typename I, typename Target>
__global__ void IndexedGatherKernel(const E* data, const I* indices, E* out, Target target,
                                    int64_t total) {
  CASTOR_GRID_STRIDE(j, total) {
    const int64_t at = target(indices, j);
    out[j] = at >= 0 ? data[at] : E{};
  }
}

// out[target(j)] = updates[j] (skipped out of range).
template <typename E, typename I, typename Target>
__global__ void IndexedScatterKernel(const E* updates, const I* indices, E* out, Target target,
                                     int64_t total) {
  CASTOR_GRID_STRIDE(j, total) {
    const int64_t at = target(indices, j);
    if (at >= 0) out[at] = updates[j];
  }
}

// *at = combine(*at, v), atomically.
__device__ void AtomicCombine(float* at, float v, ScatterReduction reduction) {
  if (reduction == ScatterReduction::kAdd) {
    atomicAdd(at, v);
    return;
  }
  int* bits = reinterpret_cast<int*>(at);
  int old = *bits, assumed;
  do {
    assumed = old;
    old = atomicCAS(bits, assumed,
                    __float_as_int(common::ScatterCombine(reduction, __int_as_float(assumed), v)));
  } while (assumed != old);
}
__device__ void AtomicCombine(int32_t* at, int32_t v, ScatterReduction reduction) {
  int old = *at, assumed;
  do {
    assumed = old;
    old = atomicCAS(at, assumed, common::ScatterCombine(reduction, assumed, v));
  } while (assumed != old);
}
__device__ void AtomicCombine(int64_t* at, int64_t v, ScatterReduction reduction) {
  auto* bits = reinterpret_cast<unsigned long long*>(at);  // NOLINT(runtime/int): atomicCAS's type
  unsigned long long old = *bits, assumed;                  // NOLINT(runtime/int)
  do {
    assumed = old;
    const int64_t combined =
        common::ScatterCombine(reduction, static_cast<int64_t>(assumed), v);
    old = atomicCAS(bits, assumed, static_cast<unsigned long long>(combined));  // NOLINT
  } while (assumed != old);
}

template <typename A, typename T>
__device__ __forceinline__ A LoadAs(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<A>(v);
  } else {
    return ToFloat(v);
  }
}

// acc[target(j)] = combine(acc[target(j)], updates[j]) for A float
// (updates of a float type) or A the updates' integer type.
template <typename A, typename T, typename I, typename Target>
__global__ void IndexedCombineKernel(const T* updates, const I* indices, A* acc, Target target,
                                     ScatterReduction reduction, int64_t total) {
  CASTOR_GRID_STRIDE(j, total) {
    const int64_t at = target(indices, j);
    if (at >= 0) AtomicCombine(acc + at, LoadAs<A>(updates[j]), reduction);
  }
}

// Trilu: zero the elements outside the triangle of each [rows, cols] matrix.
template <typename E>
__global__ void TriluKernel(const E* in, E* out, int64_t rows, int64_t cols, int64_t k,
                            bool upper, int64_t total) {
  CASTOR_GRID_STRIDE(i, total) {
    const int64_t col = i % cols;
    const int64_t row = i / cols % rows;
    out[i] = common::TriluKeeps(row, col, k, upper) ? in[i] : E{};
  }
}

using common::PadMode;
using common::PadSource;

// The geometry PadKernel reads (kernel-argument arrays).
struct PadKernelGeometry {
  int rank = 0;
  int64_t out_dims[kMaxDims];
  int64_t in_dims[kMaxDims];
  int64_t before[kMaxDims];
  int64_t in_strides[kMaxDims];
};

template <typename E>
__global__ void PadKernel(const E* in, E* out, const E* value, PadKernelGeometry g, PadMode mode,
                          int64_t total) {
  CASTOR_GRID_STRIDE(i, total) {
    int64_t rest = i, offset = 0;
    bool constant = false;
    for (int k = g.rank - 1; k >= 0; --k) {
      const int64_t o = rest % g.out_dims[k];
      rest /= g.out_dims[k];
      const int64_t s = PadSource(o, g.in_dims[k], g.before[k], mode);
      if (s < 0) {
        constant = true;
      } else {
        offset += s * g.in_strides[k];
      }
    }
    out[i] = constant ? *value : in[offset];
  }
}

// Range: out[i] = start + i * delta, in float64 for float types and int64
// for integers, as the CPU.
template <typename T>
__global__ void RangeKernel(T* out, T start, T delta, int64_t n) {
  CASTOR_GRID_STRIDE(i, n) {
    if constexpr (std::is_floating_point_v<T>) {
      out[i] = static_cast<T>(static_cast<double>(start) +
                              static_cast<double>(i) * static_cast<double>(delta));
    } else {
      out[i] = static_cast<T>(static_cast<int64_t>(start) + i * static_cast<int64_t>(delta));
    }
  }
}

// How DropoutTrainingKernel reads its ratio: absent (0.5) or the dtype of
// the one element in device memory.
enum class RatioKind : int { kAbsent, kFloat32, kFloat64, kFloat16, kBFloat16 };

__device__ float LoadRatio(const void* ratio, RatioKind kind) {
  switch (kind) {
    case RatioKind::kFloat32: return *static_cast<const float*>(ratio);
    case RatioKind::kFloat64: return static_cast<float>(*static_cast<const double*>(ratio));
    case RatioKind::kFloat16: return __half2float(*static_cast<const __half*>(ratio));
    case RatioKind::kBFloat16: return __bfloat162float(*static_cast<const __nv_bfloat16*>(ratio));
    default: return 0.5f;
  }
}

// DropoutTraining: keep as backend/common/philox.h decides, y = keep ?
// x / (1 - ratio) : 0, in float32 (float64 for float64 data). The run seed
// and call counter are rng[0] and rng[1], the ratio read here too (device
// memory: no host read, so the launch records into a CUDA graph). A ratio
// outside [0, 1) gives NaN and a false mask.
template <typename T>
__global__ void DropoutTrainingKernel(const T* x, T* y, uint8_t* mask, const int64_t* rng,
                                      const void* ratio_data, RatioKind ratio_kind,
                                      uint64_t node_stream, int64_t n) {
  const uint64_t run_seed = static_cast<uint64_t>(rng[0]);
  const uint64_t call = static_cast<uint64_t>(rng[1]);
  const uint64_t key = common::DropoutKey(run_seed, node_stream);
  const float ratio = LoadRatio(ratio_data, ratio_kind);
  const bool valid = ratio >= 0.0f && ratio < 1.0f;
  const uint32_t threshold = common::DropoutThreshold(ratio);
  const float scale = 1.0f / (1.0f - ratio);
  CASTOR_GRID_STRIDE(i, n) {
    const bool keep =
        valid && common::DropoutKeeps(key, call, static_cast<uint64_t>(i), threshold);
    if (mask != nullptr) mask[i] = keep ? 1 : 0;
    if constexpr (std::is_same_v<T, double>) {
      y[i] = !valid ? CUDART_NAN : keep ? x[i] * static_cast<double>(scale) : 0.0;
    } else {
      y[i] = FromFloat<T>(!valid ? CUDART_NAN_F : keep ? ToFloat(x[i]) * scale : 0.0f);
    }
  }
}

// Dropout outside training graphs: y = keep ? x / (1 - ratio) : 0 with a
// mask drawn on the host, in float32 (float64 for float64 data).
template <typename T>
__global__ void ApplyDropoutKernel(const T* x, const uint8_t* keep, T* y, float scale, int64_t n) {
  CASTOR_GRID_STRIDE(i, n) {
    if constexpr (std::is_same_v<T, double>) {
      y[i] = keep[i] ? x[i] * static_cast<double>(scale) : 0.0;
    } else {
      y[i] = FromFloat<T>(keep[i] ? ToFloat(x[i]) * scale : 0.0f);
    }
  }
}

// ---- host helpers ----------------------------------------------------------------

// Whether the simplified geometry `g` (dense destination) is a batched
// two-axis transpose: dims [batch?, A, B] with source strides [?, 1, A].
bool IsBatchedTranspose(const CopyGeometry& g) {
  if (g.rank != 2 && g.rank != 3) return false;
  const int r = g.rank;
  const int64_t a = g.dims[r - 2], b = g.dims[r - 1];
  return g.src_strides[r - 2] == 1 && g.src_strides[r - 1] == a && g.dst_strides[r - 1] == 1 &&
         g.dst_strides[r - 2] == b && a >= kMinTiledEdge && b >= kMinTiledEdge;
}

// Copies the index space `dims` of `element_size`-byte elements from `src`
// (element strides `src_strides`) to `dst` (`dst_strides`); src and dst
// point at element (0, ..., 0). dst must not overlap src.
absl::Status CopyStrided(const KernelContext& ctx, const std::vector<int64_t>& dims,
                         size_t element_size, const void* src,
                         const std::vector<int64_t>& src_strides, void* dst,
                         const std::vector<int64_t>& dst_strides) {
  // Simplify: drop size-1 dims, merge neighbours contiguous in both views.
  std::vector<int64_t> d, s, t;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0) return absl::OkStatus();
    if (dims[k] == 1) continue;
    if (!d.empty() && s.back() == src_strides[k] * dims[k] &&
        t.back() == dst_strides[k] * dims[k]) {
      d.back() *= dims[k];
      s.back() = src_strides[k];
      t.back() = dst_strides[k];
    } else {
      d.push_back(dims[k]);
      s.push_back(src_strides[k]);
      t.push_back(dst_strides[k]);
    }
  }
  if (d.empty()) {
    d = {1};
    s = {1};
    t = {1};
  }
  // Rows contiguous in both views move in units of up to 16 bytes.
  const int rank = static_cast<int>(d.size());
  if (s.back() == 1 && t.back() == 1) {
    for (size_t width : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
      if (width <= element_size) break;
      const int64_t w = static_cast<int64_t>(width), es = static_cast<int64_t>(element_size);
      bool ok = d.back() * es % w == 0 && reinterpret_cast<uintptr_t>(src) % width == 0 &&
                reinterpret_cast<uintptr_t>(dst) % width == 0;
      for (int k = 0; ok && k + 1 < rank; ++k) ok = s[k] * es % w == 0 && t[k] * es % w == 0;
      if (!ok) continue;
      const int64_t factor = w / es;
      d.back() /= factor;
      for (int k = 0; k + 1 < rank; ++k) {
        s[k] /= factor;
        t[k] /= factor;
      }
      element_size = width;
      break;
    }
  }
  if (rank > kMaxDims) {
    return ctx.Unimplemented(absl::StrCat("the copy needs ", rank,
                                          " dims after merging; the CUDA "
                                          "kernel handles at most ",
                                          kMaxDims));
  }
  CopyGeometry g;
  g.rank = rank;
  int64_t total = 1;
  for (int k = 0; k < rank; ++k) {
    g.dims[k] = d[k];
    g.src_strides[k] = s[k];
    g.dst_strides[k] = t[k];
    total *= d[k];
  }
  return DispatchElementSize(ctx, element_size, [&](auto tag) {
    using E = typename decltype(tag)::type;
    const E* from = static_cast<const E*>(src);
    E* to = static_cast<E*>(dst);
    if constexpr (sizeof(E) <= 8) {
      if (IsBatchedTranspose(g)) {
        const int r = g.rank;
        const int64_t batches = r == 3 ? g.dims[0] : 1;
        const int64_t rows = g.dims[r - 1], cols = g.dims[r - 2];
        const int64_t tiles = batches * ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
        const unsigned blocks =
            static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, int64_t{1} << 20));
        BatchedTransposeKernel<E><<<blocks, dim3(kTile, kTileRows), 0, Stream(ctx)>>>(
            from, to, rows, cols, batches, r == 3 ? g.src_strides[0] : 0,
            r == 3 ? g.dst_strides[0] : 0);
        return CheckLaunch(ctx);
      }
    }
    StridedCopyKernel<E><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(from, to, g, total);
    return CheckLaunch(ctx);
  });
}

// Fills `n` elements of `element_size` bytes at `dst` with the element at
// `value` (host memory).
absl::Status FillBytes(const KernelContext& ctx, void* dst, int64_t n, size_t element_size,
                       const void* value) {
  if (n == 0) return absl::OkStatus();
  return DispatchElementSize(ctx, element_size, [&](auto tag) {
    using E = typename decltype(tag)::type;
    E v;
    std::memcpy(&v, value, sizeof(E));
    FillKernel<E><<<Blocks(n), kThreads, 0, Stream(ctx)>>>(static_cast<E*>(dst), v, n);
    return CheckLaunch(ctx);
  });
}

// Copies input 0 to output 0 with `dims` (same element count); nothing to
// do when the executor aliased the two.
absl::Status CopyInputToOutput(KernelContext& ctx, std::vector<int64_t> dims) {
  const TensorView& input = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * output, ctx.Output(0, input.dtype, std::move(dims)));
  if (output->num_elements() != input.num_elements()) {
    return ctx.Error(absl::StrCat("internal: output ", DimsToString(output->dims), " and input ",
                                  DimsToString(input.dims), " differ in element count"));
  }
  return ctx.backend().CopyWithin(output->data, input.data, input.byte_size());
}

// Allocates output 0 (input 0's dtype, plan.out_dims) and copies input 0
// into it as `plan` (common/op_geometry.h) says.
absl::Status CopyByPlan(KernelContext& ctx, const common::CopyPlan& plan) {
  const TensorView& input = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, input.dtype, plan.out_dims));
  return CopyStrided(ctx, plan.copy_dims, DTypeSize(input.dtype), input.data, plan.src_strides,
                     out->data, ContiguousStrides(plan.copy_dims));
}

// The bytes of the one element of input `index` on the host: the executor's
// host copy when it has one (integers), else a copy that synchronises.
absl::Status ReadScalarBytes(const KernelContext& ctx, int index, void* host, size_t size) {
  const TensorView& t = ctx.input(index);
  if (DTypeSize(t.dtype) != size) {
    return ctx.Error(absl::StrCat("internal: input ", index, " is ", DTypeName(t.dtype)));
  }
  if (t.host_data != nullptr) {
    std::memcpy(host, t.host_data, size);
    return absl::OkStatus();
  }
  return ctx.backend().CopyToHost(host, t.data, size);
}

// The one value of float input `index` as float32 (synchronises).
absl::StatusOr<float> ReadFloatScalar(const KernelContext& ctx, int index, const char* what) {
  const TensorView& t = ctx.input(index);
  switch (t.dtype) {
    case DType::kFloat32: {
      float v = 0;
      CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, index, &v, sizeof(v)));
      return v;
    }
    case DType::kFloat64: {
      double v = 0;
      CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, index, &v, sizeof(v)));
      return static_cast<float>(v);
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t bits = 0;
      CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, index, &bits, sizeof(bits)));
      return t.dtype == DType::kFloat16 ? HalfBitsToFloat(bits) : BFloat16BitsToFloat(bits);
    }
    default:
      return ctx.Error(absl::StrCat("input ", index, " (", what, ") is ", DTypeName(t.dtype),
                                    "; expected a float type"));
  }
}

// ---- Reshape / Flatten / Squeeze / Unsqueeze / Identity -----------------------------

absl::Status RunReshape(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> target, ReadInt64s(ctx, 1));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                          common::PlanReshape(ctx, ctx.input(0).dims, target));
  return CopyInputToOutput(ctx, std::move(dims));
}

absl::Status RunFlatten(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims, common::PlanFlatten(ctx, ctx.input(0).dims));
  return CopyInputToOutput(ctx, std::move(dims));
}

// Input 1 (the axes of Squeeze/Unsqueeze, from opset 13) when the node has it.
absl::StatusOr<std::optional<std::vector<int64_t>>> AxesInput(const KernelContext& ctx) {
  if (ctx.opset() < 13 || !ctx.has_input(1)) return std::optional<std::vector<int64_t>>();
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReadInt64s(ctx, 1));
  return std::optional<std::vector<int64_t>>(std::move(axes));
}

absl::Status RunSqueeze(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const std::optional<std::vector<int64_t>> axes, AxesInput(ctx));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                          common::PlanSqueeze(ctx, ctx.input(0).dims, axes));
  return CopyInputToOutput(ctx, std::move(dims));
}

absl::Status RunUnsqueeze(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const std::optional<std::vector<int64_t>> axes, AxesInput(ctx));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                          common::PlanUnsqueeze(ctx, ctx.input(0).dims, axes));
  return CopyInputToOutput(ctx, std::move(dims));
}

absl::Status RunIdentity(KernelContext& ctx) { return CopyInputToOutput(ctx, ctx.input(0).dims); }

// ---- Dropout ---------------------------------------------------------------------

// One element of `dtype` holding 1 (`bytes` has 8 bytes).
absl::Status OneOf(const KernelContext& ctx, DType dtype, unsigned char* bytes) {
  std::memset(bytes, 0, 8);
  switch (dtype) {
    case DType::kFloat32: {
      const float one = 1.0f;
      std::memcpy(bytes, &one, sizeof(one));
      return absl::OkStatus();
    }
    case DType::kFloat64: {
      const double one = 1.0;
      std::memcpy(bytes, &one, sizeof(one));
      return absl::OkStatus();
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const uint16_t one =
          dtype == DType::kFloat16 ? FloatToHalfBits(1.0f) : FloatToBFloat16Bits(1.0f);
      std::memcpy(bytes, &one, sizeof(one));
      return absl::OkStatus();
    }
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8: bytes[0] = 1; return absl::OkStatus();
    default: return ctx.Error(absl::StrCat("mask dtype ", DTypeName(dtype)));
  }
}

// Writes the all-true mask (bool, or 1 in the data dtype before opset 10).
absl::Status WriteKeepAllMask(KernelContext& ctx, const TensorView& data) {
  if (ctx.num_outputs() < 2 || !ctx.has_output(1)) return absl::OkStatus();
  const DType mask_dtype = ctx.opset() < 10 ? data.dtype : DType::kBool;
  CASTOR_ASSIGN_OR_RETURN(TensorView * mask, ctx.Output(1, mask_dtype, data.dims));
  unsigned char one[8];
  CASTOR_RETURN_IF_ERROR(OneOf(ctx, mask_dtype, one));
  return FillBytes(ctx, mask->data, mask->num_elements(), DTypeSize(mask_dtype), one);
}

// The CPU's mask outside training graphs: MT19937 seeded with `seed`, u
// from 53 random bits (genrand_res53), keep when u >= ratio; drawn on the
// host and uploaded.
absl::Status DropoutLikeNumpy(KernelContext& ctx, const TensorView& data, TensorView& out,
                              float ratio) {
  const int64_t n = data.num_elements();
  std::vector<uint8_t> keep(static_cast<size_t>(n));
  std::mt19937 rng(static_cast<uint32_t>(ctx.GetInt("seed", 0)));
  const double threshold = ratio;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = rng() >> 5, b = rng() >> 6;
    const double u = (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
    keep[i] = u >= threshold ? 1 : 0;
  }
  void* keep_device = nullptr;
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * mask, ctx.Output(1, DType::kBool, data.dims));
    keep_device = mask->data;
  } else {
    CASTOR_ASSIGN_OR_RETURN(keep_device, ctx.Scratch(static_cast<size_t>(n)));
  }
  if (n == 0) return absl::OkStatus();
  // The copy from pageable memory returns once `keep` is staged.
  CASTOR_RETURN_IF_ERROR(ctx.backend().CopyFromHost(keep_device, keep.data(), keep.size()));
  const float scale = 1.0f / (1.0f - ratio);
  const uint8_t* keep_bytes = static_cast<const uint8_t*>(keep_device);
  auto apply = [&](auto tag) {
    using T = typename decltype(tag)::type;
    ApplyDropoutKernel<T>
        <<<Blocks(n), kThreads, 0, Stream(ctx)>>>(data.as<T>(), keep_bytes, out.as<T>(), scale, n);
    return CheckLaunch(ctx);
  };
  if (data.dtype == DType::kFloat64) return apply(TypeTag<double>{});
  return DispatchFloat(ctx, data.dtype, apply);
}

absl::Status RunDropout(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  float ratio = 0.5f;
  bool training = false;
  if (ctx.opset() < 12) {
    ratio = ctx.GetFloat("ratio", 0.5f);
  } else {
    if (ctx.has_input(1) && ctx.input(1).num_elements() != 1) {
      return ctx.Error("input 1 (ratio) must hold one value");
    }
    if (ctx.has_input(2)) {
      if (ctx.input(2).num_elements() != 1) {
        return ctx.Error("input 2 (training_mode) must hold one value");
      }
      uint8_t mode = 0;
      CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, 2, &mode, sizeof(mode)));
      training = mode != 0;
    }
    // The ratio only matters in training; inference reads nothing back.
    if (training && ctx.has_input(1)) {
      CASTOR_ASSIGN_OR_RETURN(ratio, ReadFloatScalar(ctx, 1, "ratio"));
    }
  }
  if (!training || ratio == 0.0f) {
    CASTOR_RETURN_IF_ERROR(CopyInputToOutput(ctx, data.dims));
    return WriteKeepAllMask(ctx, data);
  }
  if (!(ratio > 0.0f && ratio < 1.0f)) {
    return ctx.Error(absl::StrCat("ratio ", ratio, " is outside [0, 1)"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, data.dims));
  return DropoutLikeNumpy(ctx, data, *out, ratio);
}

// com.castor DropoutTraining(data, ratio?, rng): the state and the ratio
// are read on the device (see DropoutTrainingKernel).
absl::Status RunDropoutTraining(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  RatioKind ratio_kind = RatioKind::kAbsent;
  const void* ratio_data = nullptr;
  if (ctx.has_input(1)) {
    const TensorView& ratio = ctx.input(1);
    if (ratio.num_elements() != 1) return ctx.Error("input 1 (ratio) must hold one value");
    switch (ratio.dtype) {
      case DType::kFloat32: ratio_kind = RatioKind::kFloat32; break;
      case DType::kFloat64: ratio_kind = RatioKind::kFloat64; break;
      case DType::kFloat16: ratio_kind = RatioKind::kFloat16; break;
      case DType::kBFloat16: ratio_kind = RatioKind::kBFloat16; break;
      default:
        return ctx.Error(absl::StrCat("input 1 (ratio) is ", DTypeName(ratio.dtype),
                                      "; expected a float type"));
    }
    ratio_data = ratio.data;
  }
  if (!ctx.has_input(2)) return ctx.Error("input 2 (RNG state) is missing");
  const TensorView& state = ctx.input(2);
  if (state.dtype != DType::kInt64 || state.num_elements() != 2) {
    return ctx.Error("input 2 (RNG state) must be int64 [seed, counter]");
  }
  const int64_t n = data.num_elements();
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, data.dims));
  uint8_t* mask = nullptr;
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * m, ctx.Output(1, DType::kBool, data.dims));
    mask = static_cast<uint8_t*>(m->data);
  }
  if (n == 0) return absl::OkStatus();
  const uint64_t node_stream = common::DropoutNodeStream(ctx.node().name());
  auto apply = [&](auto tag) {
    using T = typename decltype(tag)::type;
    DropoutTrainingKernel<T><<<Blocks(n), kThreads, 0, Stream(ctx)>>>(
        data.as<T>(), out->as<T>(), mask, state.as<int64_t>(), ratio_data, ratio_kind,
        node_stream, n);
    return CheckLaunch(ctx);
  };
  if (data.dtype == DType::kFloat64) return apply(TypeTag<double>{});
  return DispatchFloat(ctx, data.dtype, apply);
}

// ---- Transpose / Expand / Tile -------------------------------------------------------

absl::Status RunTranspose(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanTranspose(ctx, ctx.input(0).dims));
  return CopyByPlan(ctx, plan);
}

absl::Status RunExpand(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> shape, ReadInt64s(ctx, 1));
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanExpand(ctx, ctx.input(0).dims, shape));
  return CopyByPlan(ctx, plan);
}

absl::Status RunTile(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> repeats, ReadInt64s(ctx, 1));
  CASTOR_ASSIGN_OR_RETURN(const common::CopyPlan plan,
                          common::PlanTile(ctx, ctx.input(0).dims, repeats));
  return CopyByPlan(ctx, plan);
}

// ---- Shape / Size / Constant / ConstantOfShape / Range --------------------------------

absl::Status RunShape(KernelContext& ctx) {
  const std::vector<int64_t>& in = ctx.input(0).dims;
  const common::ShapeWindow w = common::PlanShape(ctx, static_cast<int64_t>(in.size()));
  const auto first = in.begin() + w.start;
  return WriteInt64Output(ctx, 0, {w.count}, std::vector<int64_t>(first, first + w.count));
}

absl::Status RunSize(KernelContext& ctx) {
  return WriteInt64Output(ctx, 0, {}, {ctx.input(0).num_elements()});
}

absl::Status WriteTensor(KernelContext& ctx, const Tensor& value) {
  if (DTypeSize(value.dtype()) == 0) {
    return ctx.Unimplemented(
        absl::StrCat("a ", DTypeName(value.dtype()), " constant (only fixed-size dtypes)"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, value.dtype(), value.dims()));
  // From pageable memory the copy returns once `value` is staged.
  return ctx.backend().CopyFromHost(out->data, value.raw(), value.byte_size());
}

absl::Status RunConstant(KernelContext& ctx) {
  const Node& node = ctx.node();
  if (const Attribute* a = node.attribute("value")) return WriteTensor(ctx, a->t);
  if (const Attribute* a = node.attribute("value_float")) {
    return WriteTensor(ctx, Tensor::Scalar(a->f));
  }
  if (const Attribute* a = node.attribute("value_floats")) {
    return WriteTensor(
        ctx,
        Tensor::FromVector(DType::kFloat32, {static_cast<int64_t>(a->floats.size())}, a->floats));
  }
  if (const Attribute* a = node.attribute("value_int")) {
    return WriteTensor(ctx, Tensor::FromVector(DType::kInt64, {}, std::vector<int64_t>{a->i}));
  }
  if (const Attribute* a = node.attribute("value_ints")) {
    return WriteTensor(ctx, Tensor::Int64s(a->ints));
  }
  return ctx.Unimplemented(
      "needs one of the attributes value, value_float(s), value_int(s) (string and sparse "
      "constants are not supported by the CUDA backend)");
}

absl::Status RunConstantOfShape(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> dims, ReadInt64s(ctx, 0));
  CASTOR_ASSIGN_OR_RETURN(const Tensor fill, common::ConstantOfShapeFill(ctx, dims));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, fill.dtype(), dims));
  return FillBytes(ctx, out->data, out->num_elements(), DTypeSize(fill.dtype()), fill.raw());
}

absl::Status RunRange(KernelContext& ctx) {
  const TensorView& start = ctx.input(0);
  for (int i = 0; i < 3; ++i) {
    const TensorView& t = ctx.input(i);
    if (t.num_elements() != 1) return ctx.Error("start, limit and delta must hold one value");
    if (t.dtype != start.dtype) return ctx.Error("start, limit and delta must share a dtype");
  }
  auto fill = [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    T s, l, d;
    CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, 0, &s, sizeof(T)));
    CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, 1, &l, sizeof(T)));
    CASTOR_RETURN_IF_ERROR(ReadScalarBytes(ctx, 2, &d, sizeof(T)));
    if (d == 0) return ctx.Error("delta is 0");
    int64_t count;
    if constexpr (std::is_floating_point_v<T>) {
      count = static_cast<int64_t>(std::max(std::ceil((static_cast<double>(l) - s) / d), 0.0));
    } else {
      const int64_t span = static_cast<int64_t>(l) - static_cast<int64_t>(s);
      const int64_t step = d;
      count =
          (span > 0) != (step > 0) || span == 0 ? 0 : (span + step + (step > 0 ? -1 : 1)) / step;
    }
    CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, start.dtype, {count}));
    if (count == 0) return absl::OkStatus();
    RangeKernel<T><<<Blocks(count), kThreads, 0, Stream(ctx)>>>(out->as<T>(), s, d, count);
    return CheckLaunch(ctx);
  };
  switch (start.dtype) {
    case DType::kFloat32: return fill(TypeTag<float>{});
    case DType::kFloat64: return fill(TypeTag<double>{});
    case DType::kInt16: return fill(TypeTag<int16_t>{});
    case DType::kInt32: return fill(TypeTag<int32_t>{});
    case DType::kInt64: return fill(TypeTag<int64_t>{});
    default:
      return ctx.Error(absl::StrCat("inputs are ", DTypeName(start.dtype),
                                    "; Range takes float32, float64, int16, int32 or int64"));
  }
}

// ---- Concat / Split / Slice ------------------------------------------------------------

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
    CASTOR_RETURN_IF_ERROR(CopyStrided(ctx, {g.outer, row}, element_size, in.data, {row, 1},
                                       static_cast<char*>(out->data) + offset * element_size,
                                       {out_row, 1}));
    offset += row;
  }
  return absl::OkStatus();
}

absl::Status RunSplit(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  std::optional<std::vector<int64_t>> split_input;
  if (ctx.opset() >= 13 && ctx.has_input(1)) {
    CASTOR_ASSIGN_OR_RETURN(split_input, ReadInt64s(ctx, 1));
  }
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
      CASTOR_RETURN_IF_ERROR(CopyStrided(ctx, {g.outer, row}, element_size,
                                         static_cast<const char*>(in.data) + offset * element_size,
                                         {in_row, 1}, out->data, {row, 1}));
    }
    offset += row;
  }
  return absl::OkStatus();
}

absl::Status RunSlice(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(
      const common::SliceGeometry slice,
      common::PlanSlice(ctx, in.dims, [&ctx](int i) { return ReadInt64s(ctx, i); }));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, in.dtype, slice.dims));
  if (out->num_elements() == 0) return absl::OkStatus();
  const size_t element_size = DTypeSize(in.dtype);
  return CopyStrided(ctx, slice.dims, element_size,
                     static_cast<const char*>(in.data) + slice.offset * element_size,
                     slice.src_strides, out->data, ContiguousStrides(slice.dims));
}

// ---- Gather / GatherGrad ---------------------------------------------------------------

// Calls f(TypeTag<I>{}) for int32/int64 indices.
template <typename F>
absl::Status DispatchIndex(const KernelContext& ctx, const TensorView& indices, const char* what,
                           F&& f) {
  if (indices.dtype == DType::kInt32) return f(TypeTag<int32_t>{});
  if (indices.dtype == DType::kInt64) return f(TypeTag<int64_t>{});
  return ctx.Error(
      absl::StrCat(what, " is ", DTypeName(indices.dtype), "; expected int32 or int64"));
}

absl::Status RunGather(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  if (rank == 0) return ctx.Error("input 0 (data) must have rank >= 1; got a scalar");
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank, "axis"));
  std::vector<int64_t> dims(data.dims.begin(), data.dims.begin() + axis);
  dims.insert(dims.end(), indices.dims.begin(), indices.dims.end());
  dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  return DispatchIndex(ctx, indices, "input 1 (indices)", [&](auto index_tag) -> absl::Status {
    using I = typename decltype(index_tag)::type;
    CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, dims));
    const int64_t outer = common::DimsProduct(data.dims, 0, axis);
    const int64_t inner = common::DimsProduct(data.dims, axis + 1, data.dims.size());
    const int64_t count = indices.num_elements();
    if (out->num_elements() == 0) return absl::OkStatus();
    // Rows of `inner` elements move in the widest unit that divides them.
    size_t unit = DTypeSize(data.dtype);
    const size_t row_bytes = static_cast<size_t>(inner) * unit;
    for (size_t width : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
      if (width <= unit) break;
      if (row_bytes % width == 0 && reinterpret_cast<uintptr_t>(data.data) % width == 0 &&
          reinterpret_cast<uintptr_t>(out->data) % width == 0) {
        unit = width;
        break;
      }
    }
    const int64_t inner_units = static_cast<int64_t>(row_bytes / unit);
    return DispatchElementSize(ctx, unit, [&](auto tag) {
      using E = typename decltype(tag)::type;
      const int64_t total = outer * count * inner_units;
      GatherKernel<E, I><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
          static_cast<const E*>(data.data), indices.as<I>(), static_cast<E*>(out->data), count,
          data.dims[axis], inner_units, total);
      return CheckLaunch(ctx);
    });
  });
}

absl::Status RunGatherGrad(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const TensorView& data = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis, common::PlanGatherGrad(ctx));
  return DispatchIndex(ctx, indices, "input 1 (indices)", [&](auto index_tag) -> absl::Status {
    using I = typename decltype(index_tag)::type;
    CASTOR_ASSIGN_OR_RETURN(TensorView * dd, ctx.Output(0, data.dtype, data.dims));
    const int64_t n = dd->num_elements();
    if (n == 0) return absl::OkStatus();
    // Accumulate in float32: the output itself, or scratch converted once.
    float* acc = nullptr;
    if (data.dtype == DType::kFloat32) {
      acc = dd->as<float>();
    } else {
      CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(static_cast<size_t>(n) * sizeof(float)));
      acc = static_cast<float*>(buffer);
    }
    CASTOR_CUDA_CALL(cudaMemsetAsync(acc, 0, static_cast<size_t>(n) * sizeof(float), Stream(ctx)));
    return DispatchFloat(ctx, data.dtype, [&](auto tag) -> absl::Status {
      using T = typename decltype(tag)::type;
      const int64_t total = dy.num_elements();
      if (total > 0) {
        GatherGradKernel<T, I><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
            dy.as<T>(), indices.as<I>(), acc, indices.num_elements(), data.dims[axis],
            common::DimsProduct(data.dims, axis + 1, data.dims.size()), total);
        CASTOR_RETURN_IF_ERROR(CheckLaunch(ctx));
      }
      if constexpr (!std::is_same_v<T, float>) {
        CASTOR_RETURN_IF_ERROR(ConvertFloats(ctx, acc, n, dd->as<T>()));
      }
      return absl::OkStatus();
    });
  });
}

// ---- GatherND / ScatterND / GatherElements / ScatterElements ---------------------------

NDTarget MakeNDTarget(const common::NDIndexGeometry& g) {
  NDTarget target;
  target.indexer = g.indexer;
  target.tuples = g.tuples;
  target.slice = g.slice;
  target.data_batch = g.data_batch;
  return target;
}

// out [total] = data gathered through `target`.
template <typename Target>
absl::Status IndexedGather(KernelContext& ctx, const std::vector<int64_t>& out_dims,
                           Target target) {
  const TensorView& data = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  return DispatchIndex(ctx, indices, "input 1 (indices)", [&](auto index_tag) -> absl::Status {
    using I = typename decltype(index_tag)::type;
    CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, out_dims));
    const int64_t total = out->num_elements();
    if (total == 0) return absl::OkStatus();
    return DispatchElementSize(ctx, DTypeSize(data.dtype), [&](auto tag) {
      using E = typename decltype(tag)::type;
      IndexedGatherKernel<E, I, Target><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
          static_cast<const E*>(data.data), indices.as<I>(), static_cast<E*>(out->data), target,
          total);
      return CheckLaunch(ctx);
    });
  });
}

// Calls f(TypeTag<A>{}, TypeTag<T>{}): the accumulator and storage types of
// a scatter with a reduction (float for the float types, else int32/int64).
template <typename F>
absl::Status DispatchCombine(const KernelContext& ctx, DType dtype, F&& f) {
  if (dtype == DType::kInt32) return f(TypeTag<int32_t>{}, TypeTag<int32_t>{});
  if (dtype == DType::kInt64) return f(TypeTag<int64_t>{}, TypeTag<int64_t>{});
  if (!IsCudaFloat(dtype)) {
    return ctx.Unimplemented(absl::StrCat("a scatter reduction of ", DTypeName(dtype),
                                          " data (CUDA: float32, float16, bfloat16, int32, int64)"));
  }
  return DispatchFloat(ctx, dtype, [&](auto tag) { return f(TypeTag<float>{}, tag); });
}

// `acc` (n elements of type A) combined with `values` (n_values of dtype
// `dtype`) scattered through `target`; indices are input `index_input`.
template <typename Target>
absl::Status CombineInto(KernelContext& ctx, DType dtype, const void* values, int64_t n_values,
                         const TensorView& indices, void* acc, Target target,
                         ScatterReduction reduction) {
  if (n_values == 0) return absl::OkStatus();
  return DispatchIndex(ctx, indices, "input 1 (indices)", [&](auto index_tag) -> absl::Status {
    using I = typename decltype(index_tag)::type;
    return DispatchCombine(ctx, dtype, [&](auto acc_tag, auto tag) -> absl::Status {
      using A = typename decltype(acc_tag)::type;
      using T = typename decltype(tag)::type;
      IndexedCombineKernel<A, T, I, Target><<<Blocks(n_values), kThreads, 0, Stream(ctx)>>>(
          static_cast<const T*>(values), indices.as<I>(), static_cast<A*>(acc), target, reduction,
          n_values);
      return CheckLaunch(ctx);
    });
  });
}

// ScatterND / ScatterElements: out = data, then updates (input 2) written
// or combined through `target`.
template <typename Target>
absl::Status IndexedScatter(KernelContext& ctx, ScatterReduction reduction, Target target) {
  const TensorView& data = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const TensorView& updates = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, data.dims));
  const int64_t n = out->num_elements();
  const int64_t total = updates.num_elements();
  const size_t element_size = DTypeSize(data.dtype);
  if (n == 0) return absl::OkStatus();
  if (reduction == ScatterReduction::kNone || total == 0) {
    CASTOR_RETURN_IF_ERROR(
        ctx.backend().CopyWithin(out->data, data.data, static_cast<size_t>(n) * element_size));
    if (total == 0) return absl::OkStatus();
    return DispatchIndex(ctx, indices, "input 1 (indices)", [&](auto index_tag) -> absl::Status {
      using I = typename decltype(index_tag)::type;
      return DispatchElementSize(ctx, element_size, [&](auto tag) {
        using E = typename decltype(tag)::type;
        IndexedScatterKernel<E, I, Target><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
            static_cast<const E*>(updates.data), indices.as<I>(), static_cast<E*>(out->data),
            target, total);
        return CheckLaunch(ctx);
      });
    });
  }
  if (!IsCudaFloat(data.dtype) || data.dtype == DType::kFloat32) {
    CASTOR_RETURN_IF_ERROR(
        ctx.backend().CopyWithin(out->data, data.data, static_cast<size_t>(n) * element_size));
    return CombineInto(ctx, data.dtype, updates.data, total, indices, out->data, target,
                       reduction);
  }
  // 16-bit floats: combine in a float32 copy, round once.
  CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(static_cast<size_t>(n) * sizeof(float)));
  float* acc = static_cast<float*>(buffer);
  return DispatchFloat(ctx, data.dtype, [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    CASTOR_RETURN_IF_ERROR(ConvertFloats(ctx, data.as<T>(), n, acc));
    CASTOR_RETURN_IF_ERROR(
        CombineInto(ctx, data.dtype, updates.data, total, indices, acc, target, reduction));
    return ConvertFloats(ctx, acc, n, out->as<T>());
  });
}

// GatherNDGrad / GatherElementsGrad: zeros of data's (input 2's) shape with
// dY (input 0) added through `target`, in float32.
template <typename Target>
absl::Status IndexedScatterAdd(KernelContext& ctx, Target target) {
  const TensorView& dy = ctx.input(0);
  const TensorView& indices = ctx.input(1);
  const TensorView& data = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(TensorView * dd, ctx.Output(0, data.dtype, data.dims));
  const int64_t n = dd->num_elements();
  if (n == 0) return absl::OkStatus();
  float* acc = nullptr;
  if (data.dtype == DType::kFloat32) {
    acc = dd->as<float>();
  } else {
    CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(static_cast<size_t>(n) * sizeof(float)));
    acc = static_cast<float*>(buffer);
  }
  CASTOR_CUDA_CALL(cudaMemsetAsync(acc, 0, static_cast<size_t>(n) * sizeof(float), Stream(ctx)));
  CASTOR_RETURN_IF_ERROR(CombineInto(ctx, dy.dtype, dy.data, dy.num_elements(), indices, acc,
                                     target, ScatterReduction::kAdd));
  return DispatchFloat(ctx, data.dtype, [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, float>) {
      CASTOR_RETURN_IF_ERROR(ConvertFloats(ctx, acc, n, dd->as<T>()));
    }
    return absl::OkStatus();
  });
}

absl::Status RunGatherND(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::NDIndexGeometry g, common::PlanGatherND(ctx));
  return IndexedGather(ctx, g.gathered_dims, MakeNDTarget(g));
}

absl::Status RunScatterND(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::NDIndexGeometry g, common::PlanScatterND(ctx));
  CASTOR_ASSIGN_OR_RETURN(const ScatterReduction reduction, common::PlanScatterReduction(ctx));
  return IndexedScatter(ctx, reduction, MakeNDTarget(g));
}

absl::Status RunGatherNDGrad(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::NDIndexGeometry g, common::PlanGatherNDGrad(ctx));
  return IndexedScatterAdd(ctx, MakeNDTarget(g));
}

absl::Status RunGatherElements(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const ElementsIndexer g, common::PlanGatherElements(ctx));
  return IndexedGather(ctx, ctx.input(1).dims, ElementsTarget{g});
}

absl::Status RunScatterElements(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const ElementsIndexer g, common::PlanScatterElements(ctx));
  CASTOR_ASSIGN_OR_RETURN(const ScatterReduction reduction, common::PlanScatterReduction(ctx));
  return IndexedScatter(ctx, reduction, ElementsTarget{g});
}

absl::Status RunGatherElementsGrad(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const ElementsIndexer g, common::PlanGatherElementsGrad(ctx));
  return IndexedScatterAdd(ctx, ElementsTarget{g});
}

// ---- Trilu -----------------------------------------------------------------------------

absl::Status RunTrilu(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  std::optional<std::vector<int64_t>> k_input;
  if (ctx.has_input(1)) {
    CASTOR_ASSIGN_OR_RETURN(k_input, ReadInt64s(ctx, 1));
  }
  CASTOR_ASSIGN_OR_RETURN(const common::TriluGeometry g, common::PlanTrilu(ctx, k_input));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, in.dtype, in.dims));
  const int64_t total = out->num_elements();
  if (total == 0) return absl::OkStatus();
  return DispatchElementSize(ctx, DTypeSize(in.dtype), [&](auto tag) {
    using E = typename decltype(tag)::type;
    TriluKernel<E><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
        static_cast<const E*>(in.data), static_cast<E*>(out->data), g.rows, g.cols, g.k, g.upper,
        total);
    return CheckLaunch(ctx);
  });
}

// ---- DepthToSpace / SpaceToDepth: one strided copy each ---------------------------------

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

// ---- Pad -------------------------------------------------------------------------------

absl::Status RunPad(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(in.dims.size());
  std::optional<std::vector<int64_t>> pads, axes;
  if (ctx.opset() >= 11 && ctx.has_input(1)) {
    CASTOR_ASSIGN_OR_RETURN(pads, ReadInt64s(ctx, 1));
  }
  if (ctx.opset() >= 11 && ctx.has_input(3)) {
    CASTOR_ASSIGN_OR_RETURN(axes, ReadInt64s(ctx, 3));
  }
  CASTOR_ASSIGN_OR_RETURN(const common::PadGeometry plan,
                          common::PlanPad(ctx, in.dims, pads, axes));
  const std::vector<int64_t>& dims = plan.dims;
  const PadMode mode = plan.mode;
  if (rank > kMaxDims) {
    return ctx.Unimplemented(
        absl::StrCat("input of rank ", rank, "; the CUDA kernel pads at most ", kMaxDims, " dims"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, in.dtype, dims));
  const int64_t total = out->num_elements();
  if (total == 0) return absl::OkStatus();
  const size_t element_size = DTypeSize(in.dtype);
  // The constant: input 2 on the device from opset 11 (zero when absent or
  // empty); before 11 the float attribute 'value' for float data (zero for
  // other dtypes, as the CPU).
  const void* value = nullptr;
  if (ctx.opset() >= 11 && ctx.has_input(2) && ctx.input(2).num_elements() > 0) {
    value = ctx.input(2).data;
  } else {
    unsigned char bytes[8] = {0};
    if (ctx.opset() < 11) {
      const float v = ctx.GetFloat("value", 0.0f);
      if (in.dtype == DType::kFloat32) {
        std::memcpy(bytes, &v, sizeof(v));
      } else if (in.dtype == DType::kFloat64) {
        const double wide = v;
        std::memcpy(bytes, &wide, sizeof(wide));
      } else if (in.dtype == DType::kFloat16 || in.dtype == DType::kBFloat16) {
        const uint16_t bits =
            in.dtype == DType::kFloat16 ? FloatToHalfBits(v) : FloatToBFloat16Bits(v);
        std::memcpy(bytes, &bits, sizeof(bits));
      }
    }
    CASTOR_ASSIGN_OR_RETURN(void* buffer, ctx.Scratch(sizeof(bytes)));
    CASTOR_RETURN_IF_ERROR(ctx.backend().CopyFromHost(buffer, bytes, sizeof(bytes)));
    value = buffer;
  }
  PadKernelGeometry g;
  g.rank = static_cast<int>(rank);
  const std::vector<int64_t> in_strides = ContiguousStrides(in.dims);
  for (int64_t a = 0; a < rank; ++a) {
    g.out_dims[a] = dims[a];
    g.in_dims[a] = in.dims[a];
    g.before[a] = plan.before[a];
    g.in_strides[a] = in_strides[a];
  }
  return DispatchElementSize(ctx, element_size, [&](auto tag) {
    using E = typename decltype(tag)::type;
    PadKernel<E><<<Blocks(total), kThreads, 0, Stream(ctx)>>>(
        static_cast<const E*>(in.data), static_cast<E*>(out->data), static_cast<const E*>(value), g,
        mode, total);
    return CheckLaunch(ctx);
  });
}

}  // namespace

void RegisterShapeKernels(KernelTable& table) {
  struct Entry {
    const char* op_type;
    KernelFn run;
    bool in_place_ok;
  };
  const Entry entries[] = {
      {"Reshape", RunReshape, true},      {"Flatten", RunFlatten, true},
      {"Squeeze", RunSqueeze, true},      {"Unsqueeze", RunUnsqueeze, true},
      {"Identity", RunIdentity, true},    {"Dropout", RunDropout, true},
      {"Transpose", RunTranspose, false}, {"Expand", RunExpand, false},
      {"Shape", RunShape, false},         {"Size", RunSize, false},
      {"Constant", RunConstant, false},   {"ConstantOfShape", RunConstantOfShape, false},
      {"Concat", RunConcat, false},       {"Split", RunSplit, false},
      {"Slice", RunSlice, false},         {"Gather", RunGather, false},
      {"Tile", RunTile, false},           {"Pad", RunPad, false},
      {"GatherND", RunGatherND, false},   {"ScatterND", RunScatterND, false},
      {"GatherElements", RunGatherElements, false},
      {"ScatterElements", RunScatterElements, false},
      {"Trilu", RunTrilu, false},
      {"DepthToSpace", RunDepthToSpace, false},
      {"SpaceToDepth", RunSpaceToDepth, false},
  };
  for (const Entry& e : entries) {
    table.Register(KernelDef{"", e.op_type, FixedSizeTensors, e.run, e.in_place_ok});
  }
  table.Register(KernelDef{"", "Range",
                           InputDTypeIn(0, {DType::kFloat32, DType::kFloat64, DType::kInt16,
                                            DType::kInt32, DType::kInt64}),
                           RunRange, false});
  table.Register(KernelDef{kCastorDomain, "GatherGrad", FloatDTypesIn(CudaFloatDTypes()),
                           RunGatherGrad, false});
  table.Register(KernelDef{kCastorDomain, "GatherNDGrad", FloatDTypesIn(CudaFloatDTypes()),
                           RunGatherNDGrad, false});
  table.Register(KernelDef{kCastorDomain, "GatherElementsGrad",
                           FloatDTypesIn(CudaFloatDTypes()), RunGatherElementsGrad, false});
  table.Register(KernelDef{kCastorDomain, "DropoutTraining",
                           FloatDTypesIn({DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                          DType::kFloat64}),
                           RunDropoutTraining, true});
}

}  // namespace castor::cuda
