// Test helpers for kernels: build a one-node model, infer its types, run the
// node on a backend with host tensors and compare results.
//
//   SingleNode n("Add", {a, b}, {}, /*opset=*/17);
//   ASSERT_OK_AND_ASSIGN-style: auto out = n.Run(backend);  // std::vector<Tensor>
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/run_node.h"
#include "graph/graph.h"
#include "graph/shape_inference.h"
#include "graph/tensor.h"

namespace castor::testing {

class SingleNode {
 public:
  // `inputs[i]` with dtype kUndefined is an omitted optional input. Inputs are
  // graph inputs (not initializers) unless `constant_inputs` lists their index.
  SingleNode(const std::string& op_type, std::vector<Tensor> inputs,
             std::vector<Attribute> attributes, int64_t opset, int num_outputs = 1,
             const std::string& domain = "", std::vector<int> constant_inputs = {})
      : inputs_(std::move(inputs)) {
    model_.ir_version = 8;
    model_.opset_imports.push_back({"", domain.empty() ? opset : 17});
    if (!domain.empty()) model_.opset_imports.push_back({domain, opset});
    opset_ = opset;
    Graph& g = *model_.graph;
    std::vector<Value*> values;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i].dtype() == DType::kUndefined) {
        values.push_back(nullptr);
        continue;
      }
      std::string name = absl::StrCat("in", i);
      bool constant = false;
      for (int c : constant_inputs) constant |= (c == static_cast<int>(i));
      absl::StatusOr<Value*> v =
          constant ? g.AddInitializer(name, inputs_[i])
                   : g.AddInput(name, inputs_[i].dtype(), inputs_[i].shape());
      status_ = v.status();
      if (!status_.ok()) return;
      values.push_back(*v);
    }
    std::vector<std::string> outs;
    for (int i = 0; i < num_outputs; ++i) outs.push_back(absl::StrCat("out", i));
    absl::StatusOr<Node*> node = g.AddNode(op_type, values, outs, "node", domain);
    status_ = node.status();
    if (!status_.ok()) return;
    node_ = *node;
    for (Attribute& a : attributes) node_->SetAttribute(std::move(a));
    for (Value* out : node_->outputs()) g.AddOutput(out);
    status_ = InferTypes(model_);
  }

  const absl::Status& status() const { return status_; }
  const Node& node() const { return *node_; }
  Model& model() { return model_; }

  absl::StatusOr<std::vector<Tensor>> Run(Backend& backend) {
    if (!status_.ok()) return status_;
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : inputs_) ptrs.push_back(t.dtype() == DType::kUndefined ? nullptr : &t);
    return RunNode(backend, *node_, opset_, ptrs);
  }

 private:
  Model model_;
  std::vector<Tensor> inputs_;
  Node* node_ = nullptr;
  int64_t opset_ = 0;
  absl::Status status_;
};

}  // namespace castor::testing
