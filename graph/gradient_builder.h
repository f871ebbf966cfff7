// What a gradient rule sees while the autodiff pass (passes/autodiff.h)
// builds the backward graph: one forward node, the gradients reaching its
// outputs, which of its inputs need a gradient, and a way to add backward
// nodes and hand each input its gradient.
//
// A rule (graph/ops/gradient_rules.cc) reads, for example:
//   // Y = Relu(X): dX = ReluGrad(dY, Y)
//   CASTOR_ASSIGN_OR_RETURN(Value* dx, g.Emit1("ReluGrad", {g.output_grad(0), g.output(0)},
//                                              {}, kCastorDomain));
//   g.SetInputGrad(0, dx);
//
// Backward nodes are appended to the graph and named after the forward node
// ("<node>/grad/<Op>"); their types are inferred by the pass once the whole
// backward graph exists, and each input gradient must then have its input's
// dtype and shape (so gradients of 16-bit activations are 16-bit and a
// Cast's rule casts back).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/attribute.h"
#include "graph/graph.h"

namespace castor {

// The domain of castor's own gradient ops (graph/ops/gradient_ops.cc).
inline constexpr const char* kCastorDomain = "com.castor";

class GradientBuilder {
 public:
  // `opset`: the model's opset of the node's domain; `onnx_opset`: of the
  // ONNX domain (the same for ONNX nodes).
  GradientBuilder(Graph& graph, const Node& node, int64_t opset, int64_t onnx_opset,
                  std::vector<Value*> output_grads, std::vector<bool> wants_input_grad);

  const Node& node() const { return node_; }
  // The opset of the node's domain in the model.
  int64_t opset() const { return opset_; }
  // The model's ONNX opset: the version of the ONNX ops a rule emits for a
  // node of castor's domain (com.castor ConvTranspose's ReduceSum).
  int64_t onnx_opset() const { return onnx_opset_; }
  Value* input(int i) const { return node_.input(i); }
  Value* output(int i) const { return node_.output(i); }
  // dLoss/d output(i), or nullptr when no gradient reaches that output.
  Value* output_grad(int i) const;
  // True when input(i) lies on a path from a parameter to the loss.
  bool wants_input_grad(int i) const;

  // Records dLoss/d input(i); ignored when the input wants none.
  void SetInputGrad(int i, Value* grad);
  const std::vector<Value*>& input_grads() const { return input_grads_; }

  // Adds one backward node reading `inputs` (nullptr for an omitted
  // optional input) and returns its `num_outputs` outputs.
  absl::StatusOr<std::vector<Value*>> Emit(const std::string& op_type,
                                           const std::vector<Value*>& inputs, int num_outputs,
                                           std::vector<Attribute> attributes = {},
                                           const std::string& domain = "");
  absl::StatusOr<Value*> Emit1(const std::string& op_type, const std::vector<Value*>& inputs,
                               std::vector<Attribute> attributes = {},
                               const std::string& domain = "");
  // A scalar Constant of `dtype` (float32, float16 or bfloat16), rounded to
  // nearest even.
  absl::StatusOr<Value*> Scalar(double value, DType dtype);
  // A 1-D int64 Constant (shapes, axes, permutations).
  absl::StatusOr<Value*> Int64s(const std::vector<int64_t>& values);
  // Shape(value) as an int64 tensor.
  absl::StatusOr<Value*> ShapeOf(Value* value);

 private:
  Graph& graph_;
  const Node& node_;
  int64_t opset_;
  int64_t onnx_opset_;
  std::vector<Value*> output_grads_;
  std::vector<bool> wants_input_grad_;
  std::vector<Value*> input_grads_;
};

}  // namespace castor
