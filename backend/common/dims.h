// Small helpers over tensor dims that the CPU and CUDA backends share: the
// text form kernels' error messages print ("[2,3,4]"), the numpy broadcast
// of several shapes and one-way broadcasting, row-major strides and
// products of dims.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castor::common {

// "[2,3,4]".
std::string DimsToString(const std::vector<int64_t>& dims);

// The numpy broadcast of `shapes`, or an error naming the shapes and the axis
// where they disagree.
absl::StatusOr<std::vector<int64_t>> BroadcastDims(const std::vector<std::vector<int64_t>>& shapes);

// Whether `dims` broadcasts one way (right-aligned, 1 = repeated) to `to`.
bool BroadcastsTo(const std::vector<int64_t>& dims, const std::vector<int64_t>& to);

// Row-major element strides of a dense tensor with `dims`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& dims);

// The product of dims[begin, end) (1 when empty).
int64_t DimsProduct(const std::vector<int64_t>& dims, size_t begin, size_t end);

}  // namespace castor::common
