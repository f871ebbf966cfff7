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
// `input_index` (newer opsets, when given and constant). Returns nullopt
// when the axes are an input whose value is not known at build time.
// `from_input_since` is the first opset where axes is an input.
absl::StatusOr<std::optional<std::vector<int64_t>>> ReadAxes(const InferenceContext& ctx,
                                                              int64_t from_input_since,
                                                              int input_index);

// Checks input `i` has one of `allowed` dtypes; the error names the op,
// node, input index and the dtypes allowed.
absl::Status RequireDType(const InferenceContext& ctx, int i, const std::vector<DType>& allowed);

// Checks inputs `first..last` (inclusive, present ones) share one dtype.
absl::Status RequireSameDType(const InferenceContext& ctx, int first, int last);

// The float dtypes ONNX float ops accept and castor carries.
const std::vector<DType>& FloatTypes();  // float16, bfloat16, float32, float64
// Float + int32/int64 (arithmetic ops), and everything numeric.
const std::vector<DType>& NumericTypes();

}  // namespace castor::ops
