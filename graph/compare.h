// Structural comparison of two castor models, for round-trip tests and
// tools: everything ONNX import keeps (model fields, opsets, metadata, graph
// inputs/outputs/initializers with types and tensor bytes, nodes in order
// with their inputs, outputs, attributes, doc strings, metadata and implicit
// inputs, and the declared types of values).
#pragma once

#include <string>

#include "graph/graph.h"

namespace castor {

// "" when the models are equal; otherwise the first difference in words,
// e.g. "node 3 'conv1': attribute 'pads' [0,0,0,0] vs [1,1,1,1]".
std::string DescribeModelDifference(const Model& a, const Model& b);

// "" when the tensors are equal (dtype, dims, bytes or strings); otherwise
// what differs, e.g. "element 5 differs: 1.5 vs 2".
std::string DescribeTensorDifference(const Tensor& a, const Tensor& b);

}  // namespace castor
