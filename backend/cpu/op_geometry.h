// Host-side planning of ops whose CPU and CUDA kernels share it: axis
// normalisation, MatMul's shape rules (NumPy matmul: 1-D operands promoted
// and dropped, batch axes right-aligned and broadcast), Slice's window,
// Reshape's, Flatten's, Squeeze's and Unsqueeze's output dims, Concat's
// and Split's pieces, Transpose, Expand and Tile as one strided copy each,
// Pad's geometry and index rule, and the lines (Log)Softmax normalises.
// Each returns the node's error (through the KernelContext) for invalid
// attributes or inputs, so both backends word errors the same.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/kernel.h"
#include "graph/half.h"  // CASTOR_HOST_DEVICE

namespace castor::cpu {

// `axis` in [-rank, rank) as a non-negative axis; otherwise the node's error
// "<what> <axis> is out of range [-rank, rank-1] for rank <rank>".
absl::StatusOr<int64_t> NormalizeAxis(const KernelContext& ctx, int64_t axis, int64_t rank,
                                      const char* what);

struct MatMulGeometry {
  int64_t m = 0, n = 0, k = 0;  // each product: [m, k] x [k, n]
  std::vector<int64_t> batch;     // the broadcast batch dims
  // Per batch axis, the step in matrices of A and of B (0 where the
  // operand is broadcast along it).
  std::vector<int64_t> a_stride, b_stride;
  std::vector<int64_t> out_dims;  // batch dims, then m (unless A is 1-D), n (unless B is)
};

// The geometry of MatMul node `ctx` from its inputs' dims; errors for A and
// B of different dtypes, a rank-0 operand, inner dims that differ and batch
// dims that do not broadcast.
absl::StatusOr<MatMulGeometry> PlanMatMul(const KernelContext& ctx);

// What Slice copies from a dense input: output `dims`, the first element's
// offset and the element stride of each axis in the input (negative for a
// negative step).
struct SliceGeometry {
  std::vector<int64_t> dims;
  int64_t offset = 0;
  std::vector<int64_t> src_strides;
};

// Slice of an input of `in_dims` by starts/ends/axes/steps as read from the
// node (attributes before opset 10, inputs from 10): axes default to
// 0..count-1 when `has_axes` is false, steps to 1 when empty. Indices count
// from the end when negative and clamp as ONNX says. Errors for entry
// counts that differ, an axis out of range or listed twice, a zero step.
absl::StatusOr<SliceGeometry> PlanSlice(const KernelContext& ctx,
                                        const std::vector<int64_t>& in_dims,
                                        const std::vector<int64_t>& starts,
                                        const std::vector<int64_t>& ends, bool has_axes,
                                        std::vector<int64_t> axes, std::vector<int64_t> steps);

// Reshape's output dims for an input of `in_dims` and the `target` shape
// input (0 copies the input dim unless the node's allowzero is set, one -1
// is inferred); errors for a bad entry or an element count that differs.
absl::StatusOr<std::vector<int64_t>> PlanReshape(const KernelContext& ctx,
                                                 const std::vector<int64_t>& in_dims,
                                                 const std::vector<int64_t>& target);

// (Log)Softmax as `outer` x `inner` lines of `n` values `inner` apart: from
// opset 13 the lines run along `axis` (default -1); before, the input is
// coerced to 2-D at `axis` (default 1) and each row is a line. Errors for
// an axis out of range.
struct SoftmaxGeometry {
  int64_t outer = 1, n = 1, inner = 1;
};
absl::StatusOr<SoftmaxGeometry> PlanSoftmax(const KernelContext& ctx,
                                            const std::vector<int64_t>& dims);

enum class PadMode : int { kConstant, kReflect, kEdge, kWrap };

// The input index read for output index `o` along an axis of size `n` padded
// by `before`, or -1 for the constant value (n > 0 for the other modes).
CASTOR_HOST_DEVICE inline int64_t PadSource(int64_t o, int64_t n, int64_t before, PadMode mode) {
  const int64_t i = o - before;
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : n - 1;
    case PadMode::kWrap: return ((i % n) + n) % n;
    case PadMode::kReflect: break;
  }
  // reflect: mirror without repeating the edge, period 2 * (n - 1).
  if (n == 1) return 0;
  const int64_t period = 2 * (n - 1);
  const int64_t r = ((i % period) + period) % period;
  return r < n ? r : period - r;
}

struct PadGeometry {
  PadMode mode = PadMode::kConstant;
  std::vector<int64_t> before;  // per axis
  std::vector<int64_t> dims;    // the output's
};

// Pad of an input of `in_dims` by the node's mode and pads: the `pads`
// attribute before opset 11, else input 1 (`pads_input`, as the caller read
// it); the axes input 3 (`axes_input`; every axis when the node has none).
// Errors for an unknown mode, a missing or miscounted pads, an axis out of
// range, a negative output dim, or a non-constant pad of an empty axis.
absl::StatusOr<PadGeometry> PlanPad(const KernelContext& ctx, const std::vector<int64_t>& in_dims,
                                    const std::optional<std::vector<int64_t>>& pads_input,
                                    const std::optional<std::vector<int64_t>>& axes_input);

// Row-major element strides of a dense tensor with `dims`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& dims);

// Flatten's output dims [d0 * ... * d(axis-1), d(axis) * ...]; errors for
// an axis outside [-rank, rank].
absl::StatusOr<std::vector<int64_t>> PlanFlatten(const KernelContext& ctx,
                                                 const std::vector<int64_t>& in_dims);

// Squeeze's and Unsqueeze's output dims. Their axes are the `axes`
// attribute before opset 13 and input 1 from then on: `axes_input` is that
// input as the caller read it (nullopt when the node has none). Squeeze
// without axes drops every axis of size 1; errors for an axis out of range
// or (Squeeze) not of size 1, (Unsqueeze) listed twice or missing.
absl::StatusOr<std::vector<int64_t>> PlanSqueeze(
    const KernelContext& ctx, const std::vector<int64_t>& in_dims,
    const std::optional<std::vector<int64_t>>& axes_input);
absl::StatusOr<std::vector<int64_t>> PlanUnsqueeze(
    const KernelContext& ctx, const std::vector<int64_t>& in_dims,
    const std::optional<std::vector<int64_t>>& axes_input);

// The product of dims[begin, end) (1 when empty).
int64_t DimsProduct(const std::vector<int64_t>& dims, size_t begin, size_t end);

// Concat and Split move rows: each tensor seen as [outer, size along the
// axis * inner].
struct ConcatGeometry {
  int64_t axis = 0;
  std::vector<int64_t> dims;  // the output's
  int64_t outer = 1, inner = 1;
};

// Concat of the node's inputs; errors for scalars, a missing input, or an
// input whose dtype or dims off the axis differ from input 0's.
absl::StatusOr<ConcatGeometry> PlanConcat(const KernelContext& ctx);

struct SplitGeometry {
  int64_t axis = 0;
  std::vector<int64_t> sizes;  // each output's size along the axis
  int64_t outer = 1, inner = 1;
};

// Split of input 0 into the node's outputs: sizes from the `split`
// attribute (before opset 13), the split input (`split_input`, read by the
// caller when opset >= 13 and the node has it), num_outputs (chunks of
// ceil(n / parts)), or equal parts. Errors for sizes that are negative,
// not one per output or not summing to the axis.
absl::StatusOr<SplitGeometry> PlanSplit(const KernelContext& ctx,
                                        const std::optional<std::vector<int64_t>>& split_input);

// A data-movement op as one strided copy from a dense input into a dense
// output: `copy_dims` is the copy's index space (the output's dims, or a
// finer view of the same layout), `src_strides` the input's element stride
// along each of its axes (0 where the input repeats).
struct CopyPlan {
  std::vector<int64_t> out_dims;
  std::vector<int64_t> copy_dims;
  std::vector<int64_t> src_strides;
};

// Transpose by the node's perm (default: the axes reversed); errors for a
// perm that is not a permutation of the input's axes.
absl::StatusOr<CopyPlan> PlanTranspose(const KernelContext& ctx,
                                       const std::vector<int64_t>& in_dims);
// Expand to `shape` (broadcast both ways); errors for dims that do not
// broadcast or a negative entry.
absl::StatusOr<CopyPlan> PlanExpand(const KernelContext& ctx, const std::vector<int64_t>& in_dims,
                                    const std::vector<int64_t>& shape);
// Tile by `repeats`: the output [r0*d0, r1*d1, ...] laid out as [r0, d0,
// r1, d1, ...] with stride 0 over each repeat axis; errors for a count that
// is not the input's rank or a negative entry.
absl::StatusOr<CopyPlan> PlanTile(const KernelContext& ctx, const std::vector<int64_t>& in_dims,
                                  const std::vector<int64_t>& repeats);

}  // namespace castor::cpu
