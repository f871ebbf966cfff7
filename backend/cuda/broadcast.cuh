// NumPy-style (ONNX multidirectional) broadcasting and strided indexing for
// CUDA kernels. Geometry is built on the host from dims and passed to a
// kernel by value (it is a small trivially copyable struct); the kernel maps
// the row-major index of each output element to each input's element offset.
//
//   CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, BroadcastDims({a.dims, b.dims}));
//   CASTOR_ASSIGN_OR_RETURN(Broadcast<2> geometry, MakeBroadcast<2>({a.dims, b.dims}, out_dims));
//   Kernel<<<Blocks(n), kThreads, 0, Stream(ctx)>>>(geometry, a, b, y, n);
//   ...
//   __global__ void Kernel(Broadcast<2> geometry, const T* a, const T* b, T* y, int64_t n) {
//     CASTOR_GRID_STRIDE(i, n) {
//       int64_t offsets[2];
//       geometry.Offsets(i, offsets);
//       y[i] = a[offsets[0]] + b[offsets[1]];
//     }
//   }
//
// StridedIndexer is the one-tensor form: a row-major index over some dims
// mapped through arbitrary element strides (a subset of a tensor's axes, a
// permutation); the reduce kernels walk kept and reduced axes with it.
//
// Both collapse their axes before they reach the device: size-1 axes are
// dropped and neighbouring axes merged whenever every tensor walks them as
// one (dense along both, or broadcast along both), so a bias add
// [N, C, H, W] + [C, 1, 1] runs on 3 axes and a same-shape add on 1. When
// every input is contiguous with the output or a single element, the
// `simple` fast path does no index arithmetic at all. At most
// kMaxBroadcastDims axes may remain; more is an Unimplemented error from the
// host builders.
//
// Host functions return plain absl::Status errors (InvalidArgument for
// shapes that do not broadcast, Unimplemented for too many axes); kernels
// turn them into node errors with NodeStatus().
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/dims.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/kernel.h"

namespace castor::cuda {

// The most axes a geometry keeps after collapsing.
inline constexpr int kMaxBroadcastDims = 8;

// `status` as an error of ctx's node (its message prefixed with the node and
// op): InvalidArgument stays an argument error, anything else is
// Unimplemented. OK stays OK.
inline absl::Status NodeStatus(const KernelContext& ctx, const absl::Status& status) {
  if (status.ok()) return status;
  const std::string message(status.message());
  return status.code() == absl::StatusCode::kInvalidArgument ? ctx.Error(message)
                                                            : ctx.Unimplemented(message);
}

// ---- one tensor through dims and strides ----------------------------------------

// A row-major index over `dims` mapped to an element offset through
// `strides` (any strides: a permutation, a subset of a tensor's axes, 0 for
// a repeated axis). rank 0 maps every index to offset 0.
struct StridedIndexer {
  int rank = 0;
  int64_t dims[kMaxBroadcastDims] = {};
  int64_t strides[kMaxBroadcastDims] = {};

  // Offset of row-major index `index` (0 <= index < product of dims). The
  // outermost axis needs no division; a rank-1 indexer is one multiply.
  __device__ __forceinline__ int64_t Offset(int64_t index) const {
    int64_t offset = 0;
#pragma unroll
    for (int d = kMaxBroadcastDims - 1; d > 0; --d) {
      if (d < rank) {
        const int64_t quotient = index / dims[d];
        offset += (index - quotient * dims[d]) * strides[d];
        index = quotient;
      }
    }
    return rank > 0 ? offset + index * strides[0] : 0;
  }
};

// An indexer over `dims` with element `strides` (same length): size-1 axes
// dropped, and axis d-1 merged into axis d where strides[d-1] ==
// strides[d] * dims[d] (the pair walks memory as one axis). Unimplemented
// when more than kMaxBroadcastDims axes remain.
inline absl::StatusOr<StridedIndexer> MakeStridedIndexer(const std::vector<int64_t>& dims,
                                                         const std::vector<int64_t>& strides) {
  if (dims.size() != strides.size()) {
    return absl::InternalError(absl::StrCat("MakeStridedIndexer: ", dims.size(), " dims but ",
                                            strides.size(), " strides"));
  }
  std::vector<int64_t> kept_dims, kept_strides;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    if (!kept_dims.empty() && kept_strides.back() == strides[d] * dims[d]) {
      kept_dims.back() *= dims[d];
      kept_strides.back() = strides[d];
    } else {
      kept_dims.push_back(dims[d]);
      kept_strides.push_back(strides[d]);
    }
  }
  if (kept_dims.size() > static_cast<size_t>(kMaxBroadcastDims)) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA kernel indexes at most ", kMaxBroadcastDims, " axes after merging; dims ",
        DimsToString(dims), " with strides ", DimsToString(strides), " leave ", kept_dims.size()));
  }
  StridedIndexer indexer;
  indexer.rank = static_cast<int>(kept_dims.size());
  for (int d = 0; d < indexer.rank; ++d) {
    indexer.dims[d] = kept_dims[d];
    indexer.strides[d] = kept_strides[d];
  }
  return indexer;
}

// Row-major element strides of a dense tensor of `dims`.
inline std::vector<int64_t> DenseStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size());
  int64_t step = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    strides[d] = step;
    step *= dims[d];
  }
  return strides;
}

// ---- several inputs broadcast to one output ---------------------------------------

// The numpy broadcast of `shapes`, or an InvalidArgument error naming the
// shapes and the axis where they disagree: the CPU backend's own planning.
using common::BroadcastDims;

// Up to kInputs inputs broadcast to one output: the collapsed output dims
// and each input's element strides along them (0 where it is broadcast).
template <int kInputs>
struct Broadcast {
  static_assert(kInputs >= 1, "a broadcast has at least one input");
  int rank = 0;        // collapsed output axes (0: a single output element)
  int num_inputs = 0;  // inputs described (<= kInputs); the rest have offset 0
  // Every input is contiguous with the output or a single element: offsets
  // need no index arithmetic.
  bool simple = true;
  bool contiguous[kInputs] = {};  // input k's offset is the output index
  int64_t dims[kMaxBroadcastDims] = {};
  int64_t strides[kInputs][kMaxBroadcastDims] = {};

  // offsets[k] = element offset in input k of output element `index`.
  __device__ __forceinline__ void Offsets(int64_t index, int64_t (&offsets)[kInputs]) const {
    if (simple) {
#pragma unroll
      for (int k = 0; k < kInputs; ++k) offsets[k] = contiguous[k] ? index : 0;
      return;
    }
#pragma unroll
    for (int k = 0; k < kInputs; ++k) offsets[k] = 0;
#pragma unroll
    for (int d = kMaxBroadcastDims - 1; d >= 0; --d) {
      if (d < rank) {
        int64_t position = index;  // the outermost axis needs no division
        if (d > 0) {
          const int64_t quotient = index / dims[d];
          position = index - quotient * dims[d];
          index = quotient;
        }
#pragma unroll
        for (int k = 0; k < kInputs; ++k) offsets[k] += position * strides[k][d];
      }
    }
  }
};

// The geometry of `input_dims` (at most kInputs shapes) broadcast to
// `out_dims` (normally BroadcastDims(input_dims)). InvalidArgument when an
// input does not broadcast to out_dims; Unimplemented for more than
// kMaxBroadcastDims collapsed axes.
template <int kInputs>
absl::StatusOr<Broadcast<kInputs>> MakeBroadcast(
    const std::vector<std::vector<int64_t>>& input_dims, const std::vector<int64_t>& out_dims) {
  const size_t n = input_dims.size();
  if (n > static_cast<size_t>(kInputs)) {
    return absl::InternalError(
        absl::StrCat("MakeBroadcast: ", n, " inputs for a geometry of ", kInputs));
  }
  const size_t rank = out_dims.size();
  int64_t out_count = 1;
  for (int64_t d : out_dims) out_count *= d;
  Broadcast<kInputs> geometry;
  geometry.num_inputs = static_cast<int>(n);
  for (size_t k = 0; k < n; ++k) {
    const std::vector<int64_t>& in = input_dims[k];
    bool fits = in.size() <= rank;
    for (size_t i = 0; fits && i < in.size(); ++i) {
      const int64_t o = out_dims[rank - in.size() + i];
      fits = in[i] == o || in[i] == 1;
    }
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat("input ", k, " ", DimsToString(in),
                                                     " does not broadcast to ",
                                                     DimsToString(out_dims)));
    }
    int64_t count = 1;
    for (int64_t d : in) count *= d;
    geometry.contiguous[k] = count == out_count;
    geometry.simple = geometry.simple && (count == out_count || count == 1);
  }
  // Group the non-trivial output axes by which inputs are dense along them.
  std::vector<int64_t> group_sizes;
  std::vector<std::vector<bool>> group_dense;  // [group][input]
  for (size_t axis = 0; axis < rank; ++axis) {
    if (out_dims[axis] == 1) continue;
    std::vector<bool> dense(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t pad = rank - input_dims[k].size();
      dense[k] = axis >= pad && input_dims[k][axis - pad] != 1;
    }
    if (!group_sizes.empty() && group_dense.back() == dense) {
      group_sizes.back() *= out_dims[axis];
    } else {
      group_sizes.push_back(out_dims[axis]);
      group_dense.push_back(std::move(dense));
    }
  }
  if (group_sizes.size() > static_cast<size_t>(kMaxBroadcastDims)) {
    std::vector<std::string> all;
    for (const auto& t : input_dims) all.push_back(DimsToString(t));
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA kernel broadcasts over at most ", kMaxBroadcastDims,
        " merged axes; shapes ", absl::StrJoin(all, ", "), " need ", group_sizes.size()));
  }
  geometry.rank = static_cast<int>(group_sizes.size());
  for (int g = 0; g < geometry.rank; ++g) geometry.dims[g] = group_sizes[g];
  for (size_t k = 0; k < n; ++k) {
    int64_t step = 1;
    for (int g = geometry.rank - 1; g >= 0; --g) {
      if (!group_dense[g][k]) continue;
      geometry.strides[k][g] = step;
      step *= group_sizes[g];
    }
  }
  return geometry;
}

}  // namespace castor::cuda
