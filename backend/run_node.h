// Runs one node's kernel on a backend with host tensors in and out: uploads
// the inputs, runs the kernel the backend picks, downloads the outputs.
// Used by kernel tests (every kernel against float32 math or the CPU
// backend) and to fold constants; the executor runs whole graphs.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "graph/graph.h"
#include "graph/tensor.h"

namespace castor {

// `inputs[i]` may be nullptr for an omitted optional input. Returns one
// Tensor per node output (an empty Tensor for outputs the kernel did not
// produce).
absl::StatusOr<std::vector<Tensor>> RunNode(Backend& backend, const Node& node, int64_t opset,
                                            const std::vector<const Tensor*>& inputs);

}  // namespace castor
