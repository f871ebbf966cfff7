// Sliding-window geometry of Conv, ConvTranspose and the pools, which the
// CPU and CUDA kernels share: per spatial axis the input, kernel, strides,
// dilations, pads and output size, resolved from a node's attributes
// (auto_pad, ceil_mode) for concrete input dims, with the node's errors for
// attributes that do not fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/kernel.h"

namespace castor::common {

// Per spatial axis: input size, kernel, stride, dilation, begin/end pads and
// output size, resolved from the node's attributes for concrete input dims.
struct WindowGeometry {
  int num_spatial = 0;
  std::vector<int64_t> input, kernel, strides, dilations, pad_begin, pad_end, output;

  int64_t input_size() const;   // prod(input)
  int64_t kernel_size() const;  // prod(kernel)
  int64_t output_size() const;  // prod(output)
  // A 1x1 kernel at unit strides without pads: the input is its own
  // column matrix (and the output has the input's positions).
  bool pointwise() const;
};

// Reads strides, dilations, pads and auto_pad of `ctx`'s node for a forward
// window op (Conv and the pools) over `input` spatial dims with `kernel`, and
// computes the output dims as ONNX does (SAME_UPPER/SAME_LOWER: output =
// ceil(input / stride), the odd pad unit at the end / beginning; VALID: no
// pads; ceil_mode rounds up but drops a last window starting in the end pad).
absl::StatusOr<WindowGeometry> ForwardWindowGeometry(const KernelContext& ctx,
                                                     const std::vector<int64_t>& input,
                                                     const std::vector<int64_t>& kernel,
                                                     bool ceil_mode);

// Reads strides, dilations, pads, output_padding, output_shape and auto_pad
// of `ctx`'s ConvTranspose node over `input` spatial dims (X's) with
// `kernel`: `output` is the result's spatial dims, the pads those the
// output is cropped by, resolved as ONNX specifies
// (graph/ops/op_helpers.h's ResolveConvTransposeAxis). Read the other way,
// it is the geometry of the Conv from the output's space to X's that
// ConvTranspose is the adjoint of (with `input` and `output` swapped).
absl::StatusOr<WindowGeometry> TransposeWindowGeometry(const KernelContext& ctx,
                                                       const std::vector<int64_t>& input,
                                                       const std::vector<int64_t>& kernel);

// Attribute `name` as `count` ints (default `fill` when absent); an error
// naming the attribute when its length differs.
absl::StatusOr<std::vector<int64_t>> WindowInts(const KernelContext& ctx, const std::string& name,
                                                size_t count, int64_t fill);

}  // namespace castor::common
