// Multi-input broadcast iteration for CPU elementwise kernels (ONNX
// multidirectional = numpy broadcasting), and dtype dispatch over every
// numeric storage type with the compute type its arithmetic runs in.
//
// A BroadcastPlan collapses the output's axes into as few as possible (size-1
// output axes dropped; neighbouring axes merged while every input is either
// present along both or broadcast along both), so iteration is a loop over
// "runs": stretches of output elements along the innermost collapsed axis,
// where each input advances by a fixed stride (0 = broadcast, 1 = dense):
//
//   BroadcastPlan plan = *MakeBroadcastPlan({a.dims, b.dims});
//   ParallelForEachRun(plan, [&](int64_t out, const int64_t* in, int64_t count,
//                                const int64_t* step) {
//     for (int64_t j = 0; j < count; ++j) y[out + j] = a[in[0] + j * step[0]] + b[in[1] + j * step[1]];
//   });
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/parallel.h"
#include "graph/dtype.h"

namespace castor::cpu {

// Elements per ParallelFor chunk for elementwise work.
inline constexpr int64_t kElementwiseGrain = 16384;

struct BroadcastPlan {
  std::vector<int64_t> out_dims;  // the broadcast output dims
  int64_t num_elements = 0;       // elements of the output
  // Collapsed iteration space (at least one axis; the last is the run axis).
  std::vector<int64_t> dims;
  // strides[k][d]: input k's element stride along collapsed axis d (0 where
  // input k is broadcast).
  std::vector<std::vector<int64_t>> strides;

  int num_inputs() const { return static_cast<int>(strides.size()); }
  // True when every input is dense (stride 1) or a single broadcast element
  // (stride 0) over the whole output: one run covers everything.
  bool flat() const { return dims.size() == 1; }
};

absl::StatusOr<BroadcastPlan> MakeBroadcastPlan(const std::vector<std::vector<int64_t>>& input_dims);

// Calls fn(out_offset, in_offsets, count, in_steps) for the runs covering
// output elements [begin, end); in_offsets/in_steps have one entry per input.
template <typename Fn>
void ForEachRun(const BroadcastPlan& plan, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  const int rank = static_cast<int>(plan.dims.size());
  const int n = plan.num_inputs();
  const int64_t inner = plan.dims[rank - 1];
  std::vector<int64_t> index(rank, 0);
  std::vector<int64_t> offsets(n, 0), steps(n, 0);
  // Multi-index of `begin`.
  int64_t rest = begin;
  for (int d = rank - 1; d >= 0; --d) {
    index[d] = rest % plan.dims[d];
    rest /= plan.dims[d];
  }
  for (int k = 0; k < n; ++k) {
    steps[k] = plan.strides[k][rank - 1];
    for (int d = 0; d < rank; ++d) offsets[k] += index[d] * plan.strides[k][d];
  }
  int64_t position = begin;
  while (position < end) {
    const int64_t count = std::min(inner - index[rank - 1], end - position);
    fn(position, static_cast<const int64_t*>(offsets.data()), count,
       static_cast<const int64_t*>(steps.data()));
    position += count;
    if (position >= end) break;
    // Advance to the start of the next row: rewind the run axis, carry.
    for (int k = 0; k < n; ++k) offsets[k] -= index[rank - 1] * steps[k];
    index[rank - 1] = 0;
    for (int d = rank - 2; d >= 0; --d) {
      ++index[d];
      for (int k = 0; k < n; ++k) offsets[k] += plan.strides[k][d];
      if (index[d] < plan.dims[d]) break;
      for (int k = 0; k < n; ++k) offsets[k] -= index[d] * plan.strides[k][d];
      index[d] = 0;
    }
  }
}

// ForEachRun over all output elements, split across threads.
template <typename Fn>
void ParallelForEachRun(const BroadcastPlan& plan, Fn&& fn) {
  ParallelFor(0, plan.num_elements, kElementwiseGrain,
              [&](int64_t begin, int64_t end) { ForEachRun(plan, begin, end, fn); });
}

// ---- dtype dispatch and compute types ----

// The type arithmetic on storage type T runs in: float for the 16-bit
// floats, T itself otherwise.
template <typename T>
struct ComputeTypeOf { using type = T; };
template <>
struct ComputeTypeOf<Half> { using type = float; };
template <>
struct ComputeTypeOf<BFloat16> { using type = float; };
template <typename T>
using ComputeType = typename ComputeTypeOf<T>::type;

template <typename T>
inline constexpr bool kIsFloatStorage =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
    std::is_same_v<T, BFloat16>;

template <typename T>
inline ComputeType<T> Load(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return LoadF(v);
  } else {
    return v;
  }
}

// Stores a compute value (rounding once for 16-bit floats).
template <typename T, typename V>
inline void Store(T* p, V v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    StoreF(p, static_cast<float>(v));
  } else {
    *p = static_cast<T>(v);
  }
}

// Calls fn(TypeTag<T>{}) for integer dtypes (int8..int64, uint8..uint64).
template <typename Fn>
bool DispatchInteger(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kInt8: fn(TypeTag<int8_t>{}); return true;
    case DType::kInt16: fn(TypeTag<int16_t>{}); return true;
    case DType::kInt32: fn(TypeTag<int32_t>{}); return true;
    case DType::kInt64: fn(TypeTag<int64_t>{}); return true;
    case DType::kUInt8: fn(TypeTag<uint8_t>{}); return true;
    case DType::kUInt16: fn(TypeTag<uint16_t>{}); return true;
    case DType::kUInt32: fn(TypeTag<uint32_t>{}); return true;
    case DType::kUInt64: fn(TypeTag<uint64_t>{}); return true;
    default: return false;
  }
}

// Float and integer dtypes.
template <typename Fn>
bool DispatchNumeric(DType dtype, Fn&& fn) {
  return DispatchFloat(dtype, fn) || DispatchInteger(dtype, fn);
}

// Numeric dtypes and bool.
template <typename Fn>
bool DispatchNumericOrBool(DType dtype, Fn&& fn) {
  if (dtype == DType::kBool) {
    fn(TypeTag<bool>{});
    return true;
  }
  return DispatchNumeric(dtype, fn);
}

}  // namespace castor::cpu
