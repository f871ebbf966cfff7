// The autodiff pass: reverse-mode differentiation of a scalar loss with
// respect to parameters, over the gradient rules stored with each op in the
// registry (graph/ops/gradient_rules.cc, written against
// graph/gradient_builder.h).
//
//   1. Mark the values on a path from a parameter to the loss (forward
//      reachability from the parameters intersected with backward
//      reachability from the loss); only those get gradients.
//   2. Seed dLoss/dLoss: a Constant 1 of the loss's dtype, or a given value
//      (dynamic loss scaling seeds the scale S, so every gradient is S times
//      the true one).
//   3. Walk the forward nodes in reverse topological order. For a node with
//      gradients on its outputs and marked inputs: sum each output's
//      gradient contributions (one Sum node when there are several), run the
//      op's rule, collect its input gradients. A marked node whose op has no
//      rule is an error naming the node, the op and the reason.
//   4. Infer the types of the whole backward graph and check every gradient
//      has its value's dtype (16-bit activations get 16-bit gradients; a
//      Cast's rule casts back, so float32 master weights get float32 ones).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace castor {

struct AutodiffRequest {
  std::string loss;                     // a float value with one element
  std::vector<std::string> parameters;  // values no node produces (initializers, inputs)
  // The gradient seeded at the loss, a value of the loss's dtype and shape;
  // "" seeds a Constant 1.
  std::string loss_seed;
  // Leave out the parameters with no differentiable path to the loss (a
  // float initializer read only as an op's setting, such as Dropout's
  // ratio, or by a branch the loss does not use) instead of refusing them.
  bool skip_unreached = false;
};

struct AutodiffResult {
  // (parameter, its gradient's value name), in the request's order.
  std::vector<std::pair<std::string, std::string>> gradients;
  std::vector<std::string> unreached;  // left out (skip_unreached), in the request's order
  int backward_nodes = 0;
};

// Appends the backward graph to `model` (which must have inferred types).
// Errors name the loss, the parameter or the node.
absl::StatusOr<AutodiffResult> BuildGradients(Model& model, const AutodiffRequest& request);

}  // namespace castor
