// GradientBuilder (see gradient_builder.h): backward nodes named after their
// forward node, constants in the gradient's dtype.
#include "graph/gradient_builder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/half.h"
#include "graph/status.h"
#include "graph/tensor.h"

namespace castor {

GradientBuilder::GradientBuilder(Graph& graph, const Node& node, int64_t opset,
                                 int64_t onnx_opset, std::vector<Value*> output_grads,
                                 std::vector<bool> wants_input_grad)
    : graph_(graph),
      node_(node),
      opset_(opset),
      onnx_opset_(onnx_opset),
      output_grads_(std::move(output_grads)),
      wants_input_grad_(std::move(wants_input_grad)),
      input_grads_(node.num_inputs(), nullptr) {}

Value* GradientBuilder::output_grad(int i) const {
  return i >= 0 && i < static_cast<int>(output_grads_.size()) ? output_grads_[i] : nullptr;
}

bool GradientBuilder::wants_input_grad(int i) const {
  return i >= 0 && i < static_cast<int>(wants_input_grad_.size()) && wants_input_grad_[i];
}

void GradientBuilder::SetInputGrad(int i, Value* grad) {
  if (wants_input_grad(i)) input_grads_[i] = grad;
}

absl::StatusOr<std::vector<Value*>> GradientBuilder::Emit(const std::string& op_type,
                                                          const std::vector<Value*>& inputs,
                                                          int num_outputs,
                                                          std::vector<Attribute> attributes,
                                                          const std::string& domain) {
  const std::string base = absl::StrCat(node_.name(), "/grad/", op_type);
  std::vector<std::string> output_names;
  for (int k = 0; k < num_outputs; ++k) {
    output_names.push_back(graph_.UniqueName(absl::StrCat(base, "_out", k)));
  }
  CASTOR_ASSIGN_OR_RETURN(Node * node,
                          graph_.AddNode(op_type, inputs, output_names, graph_.UniqueName(base),
                                         domain));
  for (Attribute& attribute : attributes) node->SetAttribute(std::move(attribute));
  return node->outputs();
}

absl::StatusOr<Value*> GradientBuilder::Emit1(const std::string& op_type,
                                              const std::vector<Value*>& inputs,
                                              std::vector<Attribute> attributes,
                                              const std::string& domain) {
  CASTOR_ASSIGN_OR_RETURN(std::vector<Value*> outputs,
                          Emit(op_type, inputs, 1, std::move(attributes), domain));
  return outputs[0];
}

absl::StatusOr<Value*> GradientBuilder::Scalar(double value, DType dtype) {
  Tensor tensor;
  switch (dtype) {
    case DType::kFloat32:
      tensor = Tensor::Scalar(static_cast<float>(value));
      break;
    case DType::kFloat16:
      tensor = Tensor::FromVector<uint16_t>(DType::kFloat16, {},
                                            {FloatToHalfBits(static_cast<float>(value))});
      break;
    case DType::kBFloat16:
      tensor = Tensor::FromVector<uint16_t>(DType::kBFloat16, {},
                                            {FloatToBFloat16Bits(static_cast<float>(value))});
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no scalar constant of dtype ", DTypeName(dtype)));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * out, Emit1("Constant", {}));
  out->producer()->SetAttribute(Attribute::TensorValue("value", std::move(tensor)));
  return out;
}

absl::StatusOr<Value*> GradientBuilder::Int64s(const std::vector<int64_t>& values) {
  CASTOR_ASSIGN_OR_RETURN(Value * out, Emit1("Constant", {}));
  out->producer()->SetAttribute(Attribute::TensorValue("value", Tensor::Int64s(values)));
  return out;
}

absl::StatusOr<Value*> GradientBuilder::ShapeOf(Value* value) { return Emit1("Shape", {value}); }

}  // namespace castor
