// Small helpers shared by the op definitions in graph/ops/: broadcasting,
// axis normalisation, reading axes that moved from attribute to input
// between opsets, and dtype checks with uniform error messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/op_registry.h"

namespace castor::ops {

// ONNX multidirectional (numpy) broadcasting of two shapes. Unknown rank in
// either gives unknown rank; a symbolic dim broadcast with 1 keeps the
// symbol; static mismatches (neither 1) are an error.
absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

// `axis` in [-rank, rank) mapped to [0, rank); error names the op's node.
absl::StatusOr<int64_t> NormalizeAxis(const InferenceContext& ctx, int64_t axis, int64_t rank);

// The op's axes: from the `axes` attribute (older opsets) or from input
// `input_index` (newer opsets, when given and constant). Absent axes give
// an empty list; nullopt means the axes are an input whose value is not
// known at build time.
// `from_input_since` is the first opset where axes is an input.
absl::StatusOr<std::optional<std::vector<int64_t>>> ReadAxes(const InferenceContext& ctx,
                                                              int64_t from_input_since,
                                                              int input_index);

// The integer values of input `i` when known at build time: its constant
// (any integer dtype), else its shape value when every entry is a static
// number. nullopt when the input is absent or its value is unknown.
std::optional<std::vector<int64_t>> ReadConstantInts(const InferenceContext& ctx, int i);

// Checks input `i` has one of `allowed` dtypes; the error names the op,
// node, input index and the dtypes allowed.
absl::Status RequireDType(const InferenceContext& ctx, int i, const std::vector<DType>& allowed);

// Checks inputs `first..last` (inclusive, present ones) share one dtype.
absl::Status RequireSameDType(const InferenceContext& ctx, int first, int last);

// An ai.onnx OpDef handling opsets min_opset..kMaxOnnxOpset with one output.
OpDef MakeDef(const std::string& op_type, int64_t min_opset, int min_inputs, int max_inputs,
              std::vector<AttrSpec> attributes, InferFn infer, const std::string& summary);

// The float dtypes ONNX float ops accept and castor carries.
const std::vector<DType>& FloatTypes();  // float16, bfloat16, float32, float64
// Float + int32/int64 (arithmetic ops), and everything numeric.
const std::vector<DType>& NumericTypes();
// Every dtype castor carries, bool and string included (ONNX's
// all_tensor_types).
const std::vector<DType>& AllTypes();
// `types` minus bfloat16 when the model's opset is below `since` (most ONNX
// ops accept bfloat16 from opset 13).
std::vector<DType> WithBFloat16Since(const InferenceContext& ctx, std::vector<DType> types,
                                     int64_t since);


// ---- Helpers shared by the elementwise, matmul, conv and pool families. ----

// One step of an op's dtype history: `dtypes` are accepted from opset `since`.
struct DTypesSince {
  int64_t since;
  std::vector<DType> dtypes;
};
// The dtypes accepted at the node's opset: the union of the steps up to it.
std::vector<DType> DTypesAt(const InferenceContext& ctx, const std::vector<DTypesSince>& history);

// An error when attribute `name` is set on a node whose opset is outside
// [first, last], the opsets whose schema has that attribute.
absl::Status CheckAttributeOpsets(const InferenceContext& ctx, const std::string& name,
                                  int64_t first, int64_t last = kMaxOnnxOpset);

// Multidirectional (numpy) broadcast of the present inputs first..last; the
// error names the node and the shapes that clash.
absl::StatusOr<Shape> BroadcastInputs(const InferenceContext& ctx, int first, int last);

// False when `from` provably cannot broadcast one way to `to` (ONNX
// unidirectional broadcasting: from's rank <= to's, and each right-aligned
// dim of `from` is 1 or equals to's). Unknown dims are given the benefit.
bool UnidirectionalBroadcastable(const Shape& from, const Shape& to);

// The sliding window of Conv, ConvTranspose and the pooling ops: the ONNX
// attributes kernel_shape, strides, dilations, pads and auto_pad, for the
// spatial axes.
struct WindowAttrs {
  std::vector<int64_t> kernel_shape;  // empty when not known at build time
  std::vector<int64_t> strides;       // default 1 per axis
  std::vector<int64_t> dilations;     // default 1 per axis
  std::vector<int64_t> pads;          // [x1_begin, x2_begin, ..., x1_end, ...]
  std::string auto_pad;               // NOTSET, SAME_UPPER, SAME_LOWER or VALID
  bool explicit_pads = false;         // `pads` came from the attribute

  // (kernel - 1) * dilation + 1 along spatial axis `axis`.
  int64_t EffectiveKernel(int axis) const {
    return (kernel_shape[axis] - 1) * dilations[axis] + 1;
  }
};
// Reads and validates the window attributes for `num_spatial` axes: list
// lengths, positive kernel/strides/dilations, non-negative pads, a known
// auto_pad, and no non-zero pads together with auto_pad. Without a
// kernel_shape attribute the kernel is `kernel_from_weight` (the weight's
// static spatial dims; nullopt when unknown), and an error when
// `require_kernel_shape`; with both, they must agree.
absl::StatusOr<WindowAttrs> ReadWindowAttrs(
    const InferenceContext& ctx, int num_spatial,
    const std::optional<std::vector<int64_t>>& kernel_from_weight, bool require_kernel_shape);

// The output size along spatial axis `axis` of a Conv or pooling window over
// an input of size `input` (ONNX convPoolShapeInference): SAME_* pads derived
// from the input size, floor or ceil mode, and in ceil mode a last window
// that would start in the end padding is dropped. Unknown when the input
// size or the kernel is not known; an error when the window does not fit.
absl::StatusOr<Dim> WindowOutputDim(const InferenceContext& ctx, const Dim& input,
                                    const WindowAttrs& attrs, int axis, bool ceil_mode);

// ConvTranspose along one spatial axis: its begin and end pads and output
// size, as ONNX specifies them. The full size is
// stride * (input - 1) + output_padding + kernel_extent. With an
// `output_size` (attribute output_shape), or auto_pad SAME_* (output
// input * stride, the total pad at least 0), the total pad is the
// difference, its odd unit at the end for SAME_UPPER and at the beginning
// otherwise; VALID pads nothing; else `pad_begin` and `pad_end` (the pads
// attribute) stay. The backends' kernels and the gradient rule share it.
struct ConvTransposeAxis {
  int64_t pad_begin = 0, pad_end = 0, output = 0;
};
ConvTransposeAxis ResolveConvTransposeAxis(int64_t input, int64_t kernel_extent, int64_t stride,
                                           int64_t output_padding, const std::string& auto_pad,
                                           std::optional<int64_t> output_size, int64_t pad_begin,
                                           int64_t pad_end);

}  // namespace castor::ops
