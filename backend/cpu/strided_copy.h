// Dtype-agnostic copies of N-d strided views for CPU data-movement kernels.
//
// StridedCopy copies the elements of an N-d index space `dims` from `src`
// (element strides `src_strides`, which may be negative, as in a reversed
// Slice, or zero, as in a broadcast) to `dst` (element strides
// `dst_strides`, non-overlapping). Transpose is a permuted src stride,
// Slice an offset src pointer with step strides, Expand zero src strides,
// Tile an interleaved [repeat, dim] index space with zero repeat strides,
// and Concat/Pad a dense src written into a strided region of dst.
// Adjacent dims that are contiguous in both views are merged, contiguous
// inner rows go through memcpy (of a fixed size for rows of 16, 32 and 64
// bytes), and large copies run on ParallelFor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/common/op_geometry.h"
#include "backend/kernel.h"

namespace castor::cpu {

// Copies dims[0] x ... x dims[n-1] elements of `element_size` bytes.
// `src` and `dst` point at the element with index (0, ..., 0). All three
// vectors have the same length (0 = one element).
void StridedCopy(const std::vector<int64_t>& dims, size_t element_size, const void* src,
                 const std::vector<int64_t>& src_strides, void* dst,
                 const std::vector<int64_t>& dst_strides);

// A dense copy of `bytes` bytes, split over threads when large.
void ParallelMemcpy(void* dst, const void* src, size_t bytes);

// ---- Small helpers shared by the CPU data-movement kernel files ----------
// (shape_ops.cc, data_movement.cc, misc.cc).

// The entries of an integer tensor (int32/int64/other ints) as int64.
std::vector<int64_t> ReadInts(const TensorView& view);

// The CPU's IntInputReader for op_geometry.h's plans: ReadInts of the
// node's input (host memory; never an error). `ctx` must outlive it.
common::IntInputReader HostIntInputs(const KernelContext& ctx);

// A SupportsFn for dtype-agnostic kernels: every tensor of the node must
// have a fixed element size (no strings).
absl::Status NoStringTensors(const Node& node);

// Copies input 0 to a freshly allocated output 0 with `dims` (same element
// count); skips the copy when the executor aliased the two buffers.
absl::Status CopyInputToOutput(KernelContext& ctx, std::vector<int64_t> dims);

// Allocates output 0 (input 0's dtype, plan.out_dims) and copies input 0
// into it as `plan` (op_geometry.h) says.
absl::Status CopyByPlan(KernelContext& ctx, const common::CopyPlan& plan);

}  // namespace castor::cpu
