// Host-side planning of ops whose CPU and CUDA kernels share it: axis
// normalisation, the dtype and dims checks of a node's inputs, MatMul's
// shape rules (NumPy matmul: 1-D operands promoted and dropped, batch axes
// right-aligned and broadcast), Gemm's shapes and C broadcast, Slice's
// arguments and window, Reshape's, Flatten's, Squeeze's and Unsqueeze's
// output dims, Concat's and Split's pieces, Transpose, Expand and Tile as
// one strided copy each, Pad's geometry and index rule, Shape's window,
// ConstantOfShape's fill value, Clip's bound inputs, the axes Reduce*,
// ArgMax/ArgMin and ReduceToShapeOf reduce over, BatchNormalization's
// attributes and shapes, LayerNormalization's axis and parameters,
// InstanceNormalization's layout, the input checks of Conv, ConvTranspose,
// ConvGrad, BatchNormalizationGrad, LayerNormalizationGrad,
// InstanceNormalizationGrad, GlobalAveragePoolGrad and
// SoftmaxCrossEntropyLossGrad, GatherGrad's axis, and the lines
// (Log)Softmax and their gradients normalise.
// Each returns the node's error (through the KernelContext) for invalid
// attributes or inputs, so both backends word errors the same. Where a plan
// needs the values of an integer input (axes, starts...), the backend reads
// them (IntInputReader): the memory access stays the backend's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/common/dims.h"
#include "backend/kernel.h"
#include "graph/half.h"  // CASTOR_HOST_DEVICE

namespace castor::common {

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

// The values of the node's integer input `index` as int64, read by the
// backend from wherever it keeps the tensor (host memory on the CPU, a copy
// from the device on CUDA); the backend's own read errors pass through.
using IntInputReader = std::function<absl::StatusOr<std::vector<int64_t>>(int index)>;

// Slice of an input of `in_dims` by the node's starts/ends/axes/steps: the
// attributes before opset 10, inputs 1-4 (read by `read_input`) from then
// on. Axes default to 0..count-1, steps to 1. Indices count from the end
// when negative and clamp as ONNX says. Errors for missing starts/ends
// inputs, entry counts that differ, an axis out of range or listed twice, a
// zero step.
absl::StatusOr<SliceGeometry> PlanSlice(const KernelContext& ctx,
                                        const std::vector<int64_t>& in_dims,
                                        const IntInputReader& read_input);

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

// ---- input checks --------------------------------------------------------

// OK when input `i` (called `name`) has input `j`'s (`other`'s) dtype; else
// the error "input i (name) is <dtype> but input j (other) is <dtype>; they
// must match".
absl::Status RequireSameDType(const KernelContext& ctx, int i, const char* name, int j,
                              const char* other);

// OK when inputs first+1..last have input `first`'s dtype; else the error
// "input i is <dtype> but input first is <dtype>; they must match".
absl::Status RequireSameDType(const KernelContext& ctx, int first, int last);

// OK when input `i` (called `name`) has `expected` dims; else the error
// "input i (name) is <dims>; expected <expected> (<why>)".
absl::Status RequireDims(const KernelContext& ctx, int i, const char* name,
                         const std::vector<int64_t>& expected, const char* why);

// ---- Gemm ------------------------------------------------------------------

struct GemmGeometry {
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 1.0f;
  int64_t m = 0, n = 0, k = 0;  // Y [m, n] = A' [m, k] x B' [k, n]
  // C broadcast to [m, n] as c_rows x c_cols (1 = broadcast along it).
  int64_t c_rows = 1, c_cols = 1;
  bool use_c = false;  // C is given, non-empty and beta != 0
};

// Gemm's shapes from its inputs and transA/transB/alpha/beta; errors for A
// or B not 2-D, dtypes that differ (A, B, C), inner dims that differ, and a
// C of rank above 2 or that does not broadcast to [m, n].
absl::StatusOr<GemmGeometry> PlanGemm(const KernelContext& ctx);

// ---- Shape, ConstantOfShape, Clip --------------------------------------------

// Shape's output: `count` dims of the input from `start` (the start and end
// attributes, negative from the end, clamped to [0, rank]).
struct ShapeWindow {
  int64_t start = 0, count = 0;
};
ShapeWindow PlanShape(const KernelContext& ctx, int64_t rank);

// ConstantOfShape's fill value (the `value` attribute, float32 0 without
// one) for output `dims` (input 0 as the backend read it); errors for a
// negative dim or a value that is not one fixed-size element.
absl::StatusOr<Tensor> ConstantOfShapeFill(const KernelContext& ctx,
                                           const std::vector<int64_t>& dims);

// OK when Clip's optional inputs 1 (min) and 2 (max) each hold one value of
// input 0's dtype; else the node's error naming the input.
absl::Status CheckClipBounds(const KernelContext& ctx);

// ---- Reduce* ---------------------------------------------------------------

// The axes of input 0 a Reduce* node reduces, or `noop` when the input
// passes through (empty axes with noop_with_empty_axes).
struct ReduceAxes {
  std::vector<bool> reduced;  // per input axis
  bool noop = false;
};

// Reduce*'s axes: the `axes` attribute before opset `axes_input_since`,
// from then on input 1 (checked to be 1-D int64, then read by
// `read_input`); none means every axis. Errors for an axes input of
// another dtype or rank, an axis out of range or listed twice.
absl::StatusOr<ReduceAxes> PlanReduceAxes(const KernelContext& ctx, int64_t axes_input_since,
                                          const IntInputReader& read_input);

// ArgMax (`is_max`) / ArgMin over one axis of input 0.
struct ArgReduceGeometry {
  int64_t axis = 0;                     // non-negative (0 for a scalar)
  int64_t outer = 1, n = 1, inner = 1;  // input 0 as [outer, n, inner]
  std::vector<int64_t> out_dims;        // the axis dropped, or 1 with keepdims
  bool select_last = false;             // select_last_index
};

// ArgMax's / ArgMin's geometry from the axis, keepdims and
// select_last_index attributes; errors for an axis out of range and an
// empty axis with a non-empty output.
absl::StatusOr<ArgReduceGeometry> PlanArgReduce(const KernelContext& ctx, bool is_max);

// ReduceToShapeOf(dY, X): per axis of dY, whether it is summed (X,
// right-aligned, is 1 along it and dY is not); errors for an X of higher
// rank than dY or that does not broadcast to it.
absl::StatusOr<std::vector<bool>> PlanReduceToShapeOf(const KernelContext& ctx);

// ---- BatchNormalization ----------------------------------------------------

struct BatchNormGeometry {
  // training_mode (opset 14), else a wanted output 1; always for castor's
  // BatchNormalizationTraining.
  bool training = false;
  // The factor on the batch variance in the running-variance update: 1 for
  // ONNX's BatchNormalization (its spec and reference data use the biased
  // variance); count / (count - 1) for castor's BatchNormalizationTraining,
  // the unbiased variance PyTorch's running_var takes (count = batch *
  // inner, the values per feature).
  double running_var_factor = 1.0;
  float epsilon = 1e-5f, momentum = 0.9f;
  // X as [batch, features, inner]: features is C (the `spatial` attribute,
  // default 1), else C times the spatial dims.
  int64_t batch = 0, features = 0, inner = 1;
};

// BatchNormalization's (or castor's BatchNormalizationTraining's)
// attributes and X's layout; errors for X of rank below 2, scale/B/mean/var
// of other than `features` entries, and a BatchNormalizationTraining with
// one value per feature (no unbiased variance; PyTorch refuses it too).
absl::StatusOr<BatchNormGeometry> PlanBatchNorm(const KernelContext& ctx);

// ---- LayerNormalization ------------------------------------------------------

// X as [outer, inner] around the normalised axes [axis, rank).
struct LayerNormGeometry {
  int64_t axis = 0;  // non-negative
  int64_t outer = 1, inner = 1;
};

// LayerNormalization's `axis` (default -1) and X's layout; errors for an
// axis out of range, and a Scale or B of another dtype than X (float32
// beside a 16-bit X is castor's form) or that does not broadcast to X.
absl::StatusOr<LayerNormGeometry> PlanLayerNorm(const KernelContext& ctx);

// ---- InstanceNormalization ---------------------------------------------------

// X [N, C, D1, ...] as `rows` = N * C rows of `inner` = D1 * ... elements;
// row r belongs to channel r % channels.
struct InstanceNormGeometry {
  int64_t channels = 0, rows = 0, inner = 1;
};

// InstanceNormalization(X, scale, B)'s layout; errors for X of rank below
// 3 and a scale or B not of X's dtype or not [C].
absl::StatusOr<InstanceNormGeometry> PlanInstanceNorm(const KernelContext& ctx);

// ---- SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss ------------------------

// The scores [batch, classes, d1, ...] seen as [batch, classes, inner], the
// labels' dims [batch, d1, ...] and the `reduction` attribute.
struct LossGeometry {
  std::string reduction;  // "mean", "sum" or "none"
  int64_t batch = 0, classes = 0, inner = 1;
  std::vector<int64_t> label_dims;
};

// The loss(scores, labels[, weights]) forward ops' LossGeometry; errors for
// a reduction other than "mean", "sum" or "none", scores of rank below 2,
// labels not of the scores' dims without C or not int32/int64, and weights
// that are not [classes].
absl::StatusOr<LossGeometry> PlanLoss(const KernelContext& ctx);

// ---- Conv ----------------------------------------------------------------------

// The input checks Conv and ConvTranspose share: errors for X and W not of
// one rank >= 3, X, W and B not of one dtype, a group below 1, a B of other
// than `bias_size` entries, and a kernel_shape that is not W's spatial dims.
absl::Status CheckConvInputs(const KernelContext& ctx, int64_t group, int64_t bias_size);

// Conv's input checks: CheckConvInputs with a B of W.dim(0) entries, then
// errors for X's channels other than W.dim(1) * group and W.dim(0) not
// divisible by group.
absl::Status CheckConv(const KernelContext& ctx, int64_t group);

// ConvTranspose's input checks: CheckConvInputs with a B of W.dim(1) *
// group entries, then errors for X's channels other than W.dim(0) and not
// divisible by group.
absl::Status CheckConvTranspose(const KernelContext& ctx, int64_t group);

// ---- gradients ---------------------------------------------------------------

// ConvGrad(dY, X, W)'s input checks (dY's dims against Conv's output are the
// caller's, who plans the window): the `group` attribute, or errors for X
// and W not of one rank >= 3, dY or W not of X's dtype, a group below 1 or
// that W does not fit, and a kernel_shape that is not W's spatial dims.
absl::StatusOr<int64_t> CheckConvGrad(const KernelContext& ctx);

// BatchNormalizationGrad(dY, X, scale[, mean[, relu_output]])'s layout of
// X as [batch, channels, inner]; errors for X of rank below 2, dY or
// relu_output not of X's dtype and dims, a scale that is not [channels]
// and a mean that is not float32 [channels].
struct BatchNormGradGeometry {
  int64_t batch = 0, channels = 0, inner = 1;
};
absl::StatusOr<BatchNormGradGeometry> PlanBatchNormGrad(const KernelContext& ctx);

// LayerNormalizationGrad(dY, X, scale, ...)'s axis and X's layout; errors
// for dY not of X's dtype and dims, an axis out of range, and a scale that
// does not broadcast to X's normalised axes.
absl::StatusOr<LayerNormGeometry> PlanLayerNormGrad(const KernelContext& ctx);

// InstanceNormalizationGrad(dY, X, scale)'s layout of X; errors for X of
// rank below 3, dY not of X's dtype and dims, and a scale that is not [C]
// (any float dtype).
absl::StatusOr<InstanceNormGeometry> PlanInstanceNormGrad(const KernelContext& ctx);

// GlobalAveragePoolGrad(dY, X)'s input checks: errors for X of rank below
// 3 and dY not of X's dtype or not of GlobalAveragePool's output dims.
absl::Status CheckGlobalAveragePoolGrad(const KernelContext& ctx);

// SoftmaxCrossEntropyLossGrad(dLoss, scores, labels[, weights])'s
// LossGeometry; errors for a `reduction` other than "mean", "sum" or
// "none", scores of rank below 2, dLoss not of the scores' dtype, labels
// not int32/int64 or not of the scores' dims without C, weights not of the
// scores' dtype or not one per class, and a dLoss that is not the labels'
// shape (reduction "none") or a scalar.
absl::StatusOr<LossGeometry> PlanCrossEntropyGrad(const KernelContext& ctx);

// GatherGrad(dY, indices, data)'s axis (non-negative); errors for dY not of
// data's dtype, indices not int32/int64, an axis out of range, and dY not
// of Gather's output dims.
absl::StatusOr<int64_t> PlanGatherGrad(const KernelContext& ctx);

// (Log)SoftmaxGrad(dY, Y)'s lines along `axis` (default -1); errors for dY
// not of Y's dtype and dims, and an axis out of range (or a scalar Y).
absl::StatusOr<SoftmaxGeometry> PlanSoftmaxGrad(const KernelContext& ctx);

// ---- indexing: GatherND, ScatterND, GatherElements, ScatterElements --------

// The most axes an index tuple or an element-indexed tensor has (the
// indexers below are plain structs that CUDA kernels take by value).
inline constexpr int kMaxIndexedRank = 8;

// `index` in [-size, size) as a non-negative index, or -1 outside it.
CASTOR_HOST_DEVICE inline int64_t WrapIndex(int64_t index, int64_t size) {
  if (index < 0) index += size;
  return index >= 0 && index < size ? index : -1;
}

// How a scatter combines an update with the value already there (the
// `reduction` attribute of ScatterND and ScatterElements).
enum class ScatterReduction : int { kNone, kAdd, kMul, kMax, kMin };

// Integers add and multiply wrapping (in uint64, then truncated), as the
// reductions of the CPU backend do.
template <typename A>
CASTOR_HOST_DEVICE inline A ScatterCombine(ScatterReduction reduction, A old, A update) {
  switch (reduction) {
    case ScatterReduction::kAdd:
      if constexpr (std::is_integral_v<A>) {
        return static_cast<A>(static_cast<uint64_t>(old) + static_cast<uint64_t>(update));
      } else {
        return old + update;
      }
    case ScatterReduction::kMul:
      if constexpr (std::is_integral_v<A>) {
        return static_cast<A>(static_cast<uint64_t>(old) * static_cast<uint64_t>(update));
      } else {
        return old * update;
      }
    case ScatterReduction::kMax: return old < update ? update : old;
    case ScatterReduction::kMin: return update < old ? update : old;
    case ScatterReduction::kNone: break;
  }
  return update;
}

// The node's `reduction`: "none" (the default), from opset 16 "add" and
// "mul", from 18 "max" and "min"; errors for any other value or opset.
absl::StatusOr<ScatterReduction> PlanScatterReduction(const KernelContext& ctx);

// The element offset (within one batch of data) a GatherND/ScatterND index
// tuple addresses: entry e indexes the data axis of size dims[e], element
// stride strides[e]; negative entries count from the end.
struct TupleIndexer {
  int k = 0;  // entries per tuple
  int64_t dims[kMaxIndexedRank] = {};
  int64_t strides[kMaxIndexedRank] = {};

  // The offset of the tuple at `tuple`, or -1 when an entry is out of range.
  template <typename I>
  CASTOR_HOST_DEVICE int64_t Offset(const I* tuple) const {
    int64_t offset = 0;
    for (int e = 0; e < k; ++e) {
      const int64_t index = WrapIndex(static_cast<int64_t>(tuple[e]), dims[e]);
      if (index < 0) return -1;
      offset += index * strides[e];
    }
    return offset;
  }
};

// data [b0..b(B-1), d(B)..d(B+k-1), rest...] indexed by indices [b0..b(B-1),
// n..., k] (B = batch_dims): per batch, `tuples` tuples each address a
// slice of `slice` contiguous data elements.
struct NDIndexGeometry {
  int64_t batches = 1;     // product of the batch dims
  int64_t tuples = 1;      // tuples per batch
  int64_t slice = 1;       // elements per addressed slice
  int64_t data_batch = 1;  // data elements per batch
  TupleIndexer indexer;
  // GatherND's output dims = ScatterND's updates dims: indices' dims
  // without the last, then data's dims after the indexed ones.
  std::vector<int64_t> gathered_dims;
};

// GatherND(data = input 0, indices = input 1) with the node's batch_dims;
// errors for indices not int32/int64, a scalar data or indices, batch_dims
// out of range or batch dims that differ, and a tuple length outside [1,
// rank(data) - batch_dims].
absl::StatusOr<NDIndexGeometry> PlanGatherND(const KernelContext& ctx);
// ScatterND(data, indices, updates): PlanGatherND's checks (batch_dims 0),
// then errors for updates not of data's dtype or not of the gathered dims.
absl::StatusOr<NDIndexGeometry> PlanScatterND(const KernelContext& ctx);
// GatherNDGrad(dY, indices, data): GatherND's geometry of (data, indices),
// then errors for dY not of data's dtype or not of GatherND's output dims.
absl::StatusOr<NDIndexGeometry> PlanGatherNDGrad(const KernelContext& ctx);

// GatherElements/ScatterElements: element j of indices (dims `index_dims`)
// addresses data at j's own position with the `axis` coordinate replaced
// by its index value.
struct ElementsIndexer {
  int rank = 0;
  int axis = 0;
  int64_t axis_size = 0;
  int64_t index_dims[kMaxIndexedRank] = {};
  int64_t data_strides[kMaxIndexedRank] = {};

  // The data offset for indices element `j` holding `index`, or -1 when the
  // index is outside [-axis_size, axis_size).
  CASTOR_HOST_DEVICE int64_t Offset(int64_t j, int64_t index) const {
    const int64_t wrapped = WrapIndex(index, axis_size);
    if (wrapped < 0) return -1;
    int64_t offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t coordinate = j % index_dims[d];
      j /= index_dims[d];
      offset += (d == axis ? wrapped : coordinate) * data_strides[d];
    }
    return offset;
  }
};

// GatherElements(data = input 0, indices = input 1) with the node's axis;
// errors for indices not int32/int64, ranks that differ or exceed
// kMaxIndexedRank, a scalar data, an axis out of range, and an indices dim
// above data's off the axis.
absl::StatusOr<ElementsIndexer> PlanGatherElements(const KernelContext& ctx);
// ScatterElements(data, indices, updates): GatherElements' checks, then
// errors for updates not of data's dtype or not of indices' dims.
absl::StatusOr<ElementsIndexer> PlanScatterElements(const KernelContext& ctx);
// GatherElementsGrad(dY, indices, data): GatherElements' geometry of
// (data, indices), then errors for dY not of data's dtype or indices' dims.
absl::StatusOr<ElementsIndexer> PlanGatherElementsGrad(const KernelContext& ctx);

// ---- Trilu, CumSum ---------------------------------------------------------

// Input 0 as `matrices` [rows, cols] matrices; Trilu keeps the elements on
// and above (upper) or on and below (lower) the k-th diagonal.
struct TriluGeometry {
  int64_t matrices = 1, rows = 0, cols = 0;
  int64_t k = 0;
  bool upper = true;
};
CASTOR_HOST_DEVICE inline bool TriluKeeps(int64_t row, int64_t col, int64_t k, bool upper) {
  return upper ? col - row >= k : col - row <= k;
}
// Trilu's geometry from the `upper` attribute and the optional k input
// (`k_input`, as the backend read it); errors for an input of rank below
// 2 and a k that is not one value.
absl::StatusOr<TriluGeometry> PlanTrilu(const KernelContext& ctx,
                                        const std::optional<std::vector<int64_t>>& k_input);

// CumSum of input 0 as `outer` x `inner` lines of `n` values `inner` apart.
struct CumSumGeometry {
  int64_t outer = 1, n = 1, inner = 1;
  bool exclusive = false, reverse = false;
};
// CumSum's lines from the axis input (`axis_input`, as the backend read
// it) and the exclusive/reverse attributes; errors for an axis that is not
// one int32/int64 value or is out of range.
absl::StatusOr<CumSumGeometry> PlanCumSum(const KernelContext& ctx,
                                          const std::vector<int64_t>& axis_input);

}  // namespace castor::common
