// Trainer (see trainer.h).
#include "tools/trainer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "graph/status.h"

namespace castor::tools {

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(Model model, TrainingGraph graph,
                                                         const TrainerOptions& options,
                                                         Backend& backend) {
  CASTOR_ASSIGN_OR_RETURN(Optimizer optimizer, Optimizer::Create(options.optimizer));
  CASTOR_ASSIGN_OR_RETURN(LossScaler scaler, LossScaler::Create(options.scaler));
  std::unique_ptr<Trainer> trainer(new Trainer(
      std::move(model), std::move(graph), std::move(optimizer), std::move(scaler), options.lr));
  const Graph& g = *trainer->model_.graph;
  auto keep = [&](const std::string& name) -> absl::Status {
    const Value* value = g.FindValue(name);
    if (value == nullptr || value->initializer() == nullptr) {
      return absl::InternalError(absl::StrCat("training state '", name, "' is no initializer"));
    }
    trainer->state_[name] = *value->initializer();
    return absl::OkStatus();
  };
  for (const auto& [parameter, gradient] : trainer->graph_.gradients) {
    CASTOR_RETURN_IF_ERROR(keep(parameter));
  }
  for (const auto& [statistic, updated] : trainer->graph_.running_stats) {
    CASTOR_RETURN_IF_ERROR(keep(statistic));
  }
  CASTOR_ASSIGN_OR_RETURN(trainer->executor_, Executor::Create(trainer->model_, backend));
  if (trainer->graph_.evaluation == nullptr) {
    return absl::InvalidArgumentError("the training graph has no evaluation graph");
  }
  CASTOR_ASSIGN_OR_RETURN(trainer->eval_executor_,
                          Executor::Create(*trainer->graph_.evaluation, backend));
  trainer->name_first_non_finite_ = options.name_first_non_finite;
  return trainer;
}

absl::Status Trainer::Restore(const std::map<std::string, Tensor>& state, Optimizer optimizer,
                              LossScaler scaler, int64_t steps) {
  for (auto& [name, current] : state_) {
    auto saved = state.find(name);
    if (saved == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat("resume: no saved value for '", name, "'"));
    }
    if (saved->second.dtype() != current.dtype() || saved->second.dims() != current.dims()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume: '", name, "' is saved as ", DTypeName(saved->second.dtype()), " ",
          Shape::FromDims(saved->second.dims()).ToString(), ", the model has ",
          DTypeName(current.dtype()), " ", Shape::FromDims(current.dims()).ToString()));
    }
  }
  for (auto& [name, current] : state_) {
    current = state.at(name);
    CASTOR_RETURN_IF_ERROR(executor_->UpdateResident(name, current));
  }
  optimizer_ = std::move(optimizer);
  scaler_ = std::move(scaler);
  steps_ = steps;
  eval_stale_ = true;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Evaluate(std::vector<std::pair<std::string, Tensor>> inputs,
                                             Tensor labels) {
  StepResult result;
  result.step = steps_;
  if (eval_stale_) {
    for (const auto& [name, tensor] : state_) {
      CASTOR_RETURN_IF_ERROR(eval_executor_->UpdateResident(name, tensor));
    }
    eval_stale_ = false;
  }
  inputs.emplace_back(kLabelsInput, std::move(labels));
  CASTOR_ASSIGN_OR_RETURN(std::vector<Tensor> outputs, eval_executor_->Run(inputs));
  result.loss = outputs[0].data<float>()[0];
  result.output = std::move(outputs[1]);
  return result;
}

absl::StatusOr<StepResult> Trainer::Step(std::vector<std::pair<std::string, Tensor>> inputs,
                                         Tensor labels) {
  StepResult result;
  result.loss_scale = scaler_.scale();
  inputs.emplace_back(kLabelsInput, std::move(labels));
  inputs.emplace_back(kLossScaleInput, Tensor::Scalar(static_cast<float>(result.loss_scale)));
  CASTOR_ASSIGN_OR_RETURN(std::vector<Tensor> outputs, executor_->Run(inputs));
  // Outputs: loss, model output, gradients..., running statistics...
  const size_t num_gradients = graph_.gradients.size();
  result.loss = outputs[0].data<float>()[0];
  result.output = std::move(outputs[1]);
  std::vector<Tensor*> gradients;
  for (size_t k = 0; k < num_gradients; ++k) gradients.push_back(&outputs[2 + k]);
  const bool finite = std::isfinite(result.loss) && scaler_.UnscaleAndCheckFinite(gradients);
  const ScalerStep scaled = scaler_.Update(finite);
  ++steps_;
  result.step = steps_;
  result.skipped = scaled.skipped;
  result.diagnosis = scaled.diagnosis;
  result.lr = LearningRate(lr_, optimizer_.step() + 1);
  if (scaled.skipped) {
    if (name_first_non_finite_) {
      CASTOR_ASSIGN_OR_RETURN(std::optional<NonFiniteOutput> first,
                              executor_->FindFirstNonFinite(inputs));
      if (first.has_value()) {
        result.first_non_finite =
            absl::StrCat("node '", first->node, "' (", first->op_type, ") output '", first->value,
                         "': ", first->non_finite, " of ", first->elements, " elements non-finite");
      }
    }
    return result;
  }
  eval_stale_ = true;

  std::vector<ParameterGradient> parameters;
  for (size_t k = 0; k < num_gradients; ++k) {
    const std::string& name = graph_.gradients[k].first;
    parameters.push_back({name, &state_.at(name), gradients[k]});
  }
  CASTOR_ASSIGN_OR_RETURN(result.grad_norm, optimizer_.Step(parameters, result.lr));
  for (const ParameterGradient& parameter : parameters) {
    CASTOR_RETURN_IF_ERROR(executor_->UpdateResident(parameter.name, *parameter.weight));
  }
  for (size_t k = 0; k < graph_.running_stats.size(); ++k) {
    const std::string& name = graph_.running_stats[k].first;
    state_.at(name) = std::move(outputs[2 + num_gradients + k]);
    CASTOR_RETURN_IF_ERROR(executor_->UpdateResident(name, state_.at(name)));
  }
  return result;
}

}  // namespace castor::tools
