// The autodiff pass (see autodiff.h for the algorithm).
#include "passes/autodiff.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "graph/gradient_builder.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "graph/status.h"

namespace castor {
namespace {

bool IsDifferentiable(const Value* value) {
  return value != nullptr && IsFloatingPoint(value->dtype());
}

std::string Quoted(const std::string& name) { return absl::StrCat("'", name, "'"); }

class Autodiff {
 public:
  Autodiff(Model& model, const AutodiffRequest& request)
      : model_(model), graph_(*model.graph), request_(request) {}

  absl::StatusOr<AutodiffResult> Run() {
    CASTOR_RETURN_IF_ERROR(Resolve());
    Mark();
    std::vector<std::string> unreached;
    if (request_.skip_unreached) {
      std::erase_if(parameters_, [&](const Value* parameter) {
        if (marked_.contains(parameter)) return false;
        unreached.push_back(parameter->name());
        return true;
      });
    }
    CASTOR_RETURN_IF_ERROR(Seed());
    const std::vector<Node*> forward = graph_.nodes();
    const int forward_count = static_cast<int>(forward.size());
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
      CASTOR_RETURN_IF_ERROR(Differentiate(**it));
    }
    AutodiffResult result;
    result.unreached = std::move(unreached);
    for (Value* parameter : parameters_) {
      CASTOR_ASSIGN_OR_RETURN(Value * grad, Accumulated(parameter));
      if (grad == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", Quoted(parameter->name()), " does not affect the loss ",
                         Quoted(loss_->name()), ": no path from it to the loss"));
      }
      result.gradients.emplace_back(parameter->name(), grad->name());
    }
    if (model_.OpsetVersion(kCastorDomain) == 0) {
      model_.opset_imports.push_back({kCastorDomain, 1});  // castor's gradient ops
    }
    absl::Status inferred = InferTypes(model_);
    if (!inferred.ok()) {
      return absl::InternalError(
          absl::StrCat("the backward graph does not type-check (a gradient rule bug): ",
                       inferred.message()));
    }
    for (const auto& [grad, value] : grad_of_) {
      if (grad->dtype() != value->dtype() || grad->shape().rank() != value->shape().rank()) {
        return absl::InternalError(absl::StrCat(
            "gradient ", Quoted(grad->name()), " is ", DTypeName(grad->dtype()), " of rank ",
            grad->shape().rank(), " but its value ", Quoted(value->name()), " is ",
            DTypeName(value->dtype()), " of rank ", value->shape().rank(),
            " (a gradient rule bug)"));
      }
    }
    grad_of_.clear();  // may name values RemoveIdentityReductions removes
    CASTOR_RETURN_IF_ERROR(RemoveIdentityReductions(result));
    result.backward_nodes = graph_.num_nodes() - forward_count;
    return result;
  }

 private:
  // A ReduceToShapeOf whose input provably has its target's shape is the
  // identity. The rules emit one wherever a node's output and input shapes
  // differ before inference has shaped the gradient (MatMul's dA: the
  // product dY @ B^T has A's shape when the batch dims agree), and its
  // kernel would copy the whole gradient: its readers read the input
  // instead, and a parameter whose gradient it was names the input.
  absl::Status RemoveIdentityReductions(AutodiffResult& result) {
    std::vector<Node*> identities;
    for (Node* node : graph_.nodes()) {
      if (node->op_type() != "ReduceToShapeOf" || node->domain() != kCastorDomain ||
          node->num_inputs() != 2 || node->num_outputs() != 1) {
        continue;
      }
      const Value* input = node->input(0);
      const Value* target = node->input(1);
      const Value* output = node->output(0);
      if (input == nullptr || target == nullptr || output == nullptr ||
          output->is_graph_output() || input->dtype() != output->dtype() ||
          !input->shape().ProvablyEquals(target->shape())) {
        continue;
      }
      identities.push_back(node);
    }
    for (Node* node : identities) {
      Value* input = node->input(0);
      for (auto& [parameter, grad] : result.gradients) {
        if (grad == node->output(0)->name()) grad = input->name();
      }
      graph_.ReplaceAllUsesWith(node->output(0), input);
      CASTOR_RETURN_IF_ERROR(graph_.RemoveNode(node));
    }
    return absl::OkStatus();
  }

  absl::Status Resolve() {
    loss_ = graph_.FindValue(request_.loss);
    if (loss_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("loss ", Quoted(request_.loss),
                                                     ": no value of that name in the model"));
    }
    if (!IsDifferentiable(loss_)) {
      return absl::InvalidArgumentError(absl::StrCat("loss ", Quoted(loss_->name()), " is ",
                                                     DTypeName(loss_->dtype()),
                                                     "; expected a floating-point value"));
    }
    if (std::optional<int64_t> elements = loss_->shape().NumElements();
        !elements.has_value() || *elements != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss ", Quoted(loss_->name()), " has shape ",
                       loss_->shape().ToString(), "; expected a single element"));
    }
    for (const std::string& name : request_.parameters) {
      Value* parameter = graph_.FindValue(name);
      if (parameter == nullptr || parameter->producer() != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", Quoted(name), ": ",
            parameter ? "produced by a node; expected an initializer or graph input"
                      : "no value of that name in the model"));
      }
      if (!IsDifferentiable(parameter)) {
        return absl::InvalidArgumentError(absl::StrCat("parameter ", Quoted(name), " is ",
                                                       DTypeName(parameter->dtype()),
                                                       "; expected a floating-point value"));
      }
      parameters_.push_back(parameter);
    }
    return absl::OkStatus();
  }

  // Step 1.
  void Mark() {
    absl::flat_hash_set<const Value*> from_parameters(parameters_.begin(), parameters_.end());
    for (const Node* node : graph_.nodes()) {
      const OpDef* def = OpRegistry::Global().Find(node->domain(), node->op_type());
      bool reached = false;
      for (int i = 0; i < node->num_inputs(); ++i) {
        if (def != nullptr && def->IsSettingInput(i)) continue;
        reached = reached || from_parameters.contains(node->input(i));
      }
      if (!reached) continue;
      for (const Value* out : node->outputs()) {
        if (IsDifferentiable(out)) from_parameters.insert(out);
      }
    }
    absl::flat_hash_set<const Value*> to_loss = {loss_};
    const std::vector<Node*>& nodes = graph_.nodes();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      bool reaches = false;
      for (const Value* out : (*it)->outputs()) reaches = reaches || to_loss.contains(out);
      if (!reaches) continue;
      const OpDef* def = OpRegistry::Global().Find((*it)->domain(), (*it)->op_type());
      for (int i = 0; i < (*it)->num_inputs(); ++i) {
        if (def != nullptr && def->IsSettingInput(i)) continue;
        if (const Value* in = (*it)->input(i)) to_loss.insert(in);
      }
    }
    for (const Value* value : from_parameters) {
      if (to_loss.contains(value)) marked_.insert(value);
    }
  }

  // Step 2.
  absl::Status Seed() {
    Value* seed = nullptr;
    if (!request_.loss_seed.empty()) {
      seed = graph_.FindValue(request_.loss_seed);
      if (seed == nullptr || seed->dtype() != loss_->dtype()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss seed ", Quoted(request_.loss_seed), ": ",
            seed ? absl::StrCat("is ", DTypeName(seed->dtype()), ", the loss is ",
                                DTypeName(loss_->dtype()))
                 : "no value of that name in the model"));
      }
    } else {
      const Node* producer = loss_->producer();
      if (producer == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("loss ", Quoted(loss_->name()), " is not computed by any node"));
      }
      GradientBuilder builder(graph_, *producer, 0, model_.OpsetVersion(""), {}, {});
      CASTOR_ASSIGN_OR_RETURN(seed, builder.Scalar(1.0, loss_->dtype()));
      if (loss_->shape().rank() > 0) {
        CASTOR_ASSIGN_OR_RETURN(Value * shape, builder.ShapeOf(loss_));
        CASTOR_ASSIGN_OR_RETURN(seed, builder.Emit1("Expand", {seed, shape}));
      }
    }
    contributions_[loss_].push_back(seed);
    return absl::OkStatus();
  }

  // The sum of a value's gradient contributions (nullptr when none).
  absl::StatusOr<Value*> Accumulated(Value* value) {
    auto it = contributions_.find(value);
    if (it == contributions_.end() || it->second.empty()) return nullptr;
    std::vector<Value*>& parts = it->second;
    if (parts.size() > 1) {
      const std::string name = graph_.UniqueName(absl::StrCat(value->name(), "/grad"));
      CASTOR_ASSIGN_OR_RETURN(Node * sum,
                              graph_.AddNode("Sum", parts, {name}, graph_.UniqueName(name + "/Sum")));
      parts = {sum->output(0)};
    }
    return parts[0];
  }

  // Step 3 for one node.
  absl::Status Differentiate(const Node& node) {
    const OpDef* def = OpRegistry::Global().Find(node.domain(), node.op_type());
    std::vector<bool> wants(node.num_inputs(), false);
    bool any_wanted = false;
    for (int i = 0; i < node.num_inputs(); ++i) {
      wants[i] = node.input(i) != nullptr && marked_.contains(node.input(i)) &&
                 (def == nullptr || !def->IsSettingInput(i));
      any_wanted = any_wanted || wants[i];
    }
    if (!any_wanted) return absl::OkStatus();
    std::vector<Value*> output_grads;
    bool any_grad = false;
    for (Value* out : node.outputs()) {
      CASTOR_ASSIGN_OR_RETURN(Value * grad, Accumulated(out));
      output_grads.push_back(grad);
      any_grad = any_grad || grad != nullptr;
    }
    if (!any_grad) return absl::OkStatus();

    if (def == nullptr || !def->gradient) {
      const std::string reason =
          def == nullptr ? "the op is unknown to castor"
          : def->no_gradient_reason.empty() ? "castor has no gradient rule for this op yet"
                                            : def->no_gradient_reason;
      return absl::UnimplementedError(absl::StrCat(
          "cannot train through node ", Quoted(node.name()), " (", node.op_type(),
          "): it lies between a parameter and the loss ", Quoted(loss_->name()),
          " but has no gradient: ", reason));
    }
    GradientBuilder builder(graph_, node, model_.OpsetVersion(node.domain()),
                            model_.OpsetVersion(""), output_grads, wants);
    absl::Status ruled = def->gradient(builder);
    if (!ruled.ok()) {
      return absl::Status(ruled.code(), absl::StrCat("gradient of node ", Quoted(node.name()),
                                                     " (", node.op_type(), "): ",
                                                     ruled.message()));
    }
    for (int i = 0; i < node.num_inputs(); ++i) {
      if (!wants[i]) continue;
      Value* grad = builder.input_grads()[i];
      if (grad == nullptr) {
        return absl::InternalError(absl::StrCat("the gradient rule of ", node.op_type(),
                                                " gave no gradient for input ", i, " of node ",
                                                Quoted(node.name())));
      }
      contributions_[node.input(i)].push_back(grad);
      grad_of_.emplace_back(grad, node.input(i));
    }
    return absl::OkStatus();
  }

  Model& model_;
  Graph& graph_;
  const AutodiffRequest& request_;
  Value* loss_ = nullptr;
  std::vector<Value*> parameters_;
  absl::flat_hash_set<const Value*> marked_;
  absl::flat_hash_map<const Value*, std::vector<Value*>> contributions_;
  // Every gradient and the value it belongs to, for the dtype check.
  std::vector<std::pair<const Value*, const Value*>> grad_of_;
};

}  // namespace

absl::StatusOr<AutodiffResult> BuildGradients(Model& model, const AutodiffRequest& request) {
  return Autodiff(model, request).Run();
}

}  // namespace castor
