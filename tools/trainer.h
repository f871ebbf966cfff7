// One training step on a backend: runs the training graph
// (passes/training_graph.h) with the loss scale as an input, unscales and
// checks every gradient in one pass (passes/loss_scaler.h), and unless the
// step overflowed, applies the optimizer (passes/optimizer.h) to the float32
// master weights and writes them, and the BatchNormalization running
// statistics, back to the backend. On an overflow nothing the model holds
// changes: weights, optimizer moments and running statistics stay
// bit-identical, the scale backs off and the step is counted as skipped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/executor.h"
#include "graph/graph.h"
#include "passes/loss_scaler.h"
#include "passes/optimizer.h"
#include "passes/training_graph.h"

namespace castor::tools {

struct TrainerOptions {
  OptimizerOptions optimizer;
  LrSchedule lr;
  LossScalerOptions scaler;
  // On a skipped step, find the first non-finite node (costs one more run).
  bool name_first_non_finite = true;
};

struct StepResult {
  int64_t step = 0;         // steps taken, skipped ones included
  double loss = 0.0;        // unscaled
  bool skipped = false;
  double loss_scale = 1.0;  // the scale this step used
  double lr = 0.0;
  double grad_norm = 0.0;   // global L2 norm of the unscaled gradients (0 when skipped)
  std::string diagnosis;    // from the loss scaler, when the floor is hit repeatedly
  // On a skipped step: the first node whose output went inf/NaN, e.g.
  // "node 'fc1/grad/MatMul' (MatMul) output 'fc1.weight/grad': 12 of 4096
  // elements non-finite"; "" when not searched or not found.
  std::string first_non_finite;
  Tensor output;            // the model output the loss is attached to
};

class Trainer {
 public:
  // `model` must already be the training graph BuildTrainingGraph made,
  // with `graph` its description.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Model model, TrainingGraph graph,
                                                         const TrainerOptions& options,
                                                         Backend& backend);

  // One step on a batch: `inputs` feed the model's inputs by name, `labels`
  // the loss's targets.
  absl::StatusOr<StepResult> Step(std::vector<std::pair<std::string, Tensor>> inputs,
                                  Tensor labels);

  // The loss and model output on a batch without changing anything: the
  // forward-only evaluation graph, with BatchNormalization reading its
  // running statistics.
  absl::StatusOr<StepResult> Evaluate(std::vector<std::pair<std::string, Tensor>> inputs,
                                      Tensor labels);

  // Continues a saved run (a checkpoint): the weights and running
  // statistics by name (every tensor of state(), same dtype and dims; the
  // backend copies are updated), the optimizer with its step and moments,
  // the loss scaler, and the number of steps taken.
  absl::Status Restore(const std::map<std::string, Tensor>& state, Optimizer optimizer,
                       LossScaler scaler, int64_t steps);

  // Peak activation bytes of the latest run (the executor's plan statistics).
  int64_t peak_activation_bytes() const { return executor_->last_stats().peak_activation_bytes; }

  // The float32 master weights and BatchNormalization statistics by name.
  const std::map<std::string, Tensor>& state() const { return state_; }
  const LossScaler& scaler() const { return scaler_; }
  const Optimizer& optimizer() const { return optimizer_; }
  const Model& model() const { return model_; }
  const TrainingGraph& training_graph() const { return graph_; }
  int64_t steps() const { return steps_; }

 private:
  Trainer(Model model, TrainingGraph graph, Optimizer optimizer, LossScaler scaler,
          LrSchedule lr)
      : model_(std::move(model)),
        graph_(std::move(graph)),
        optimizer_(std::move(optimizer)),
        scaler_(std::move(scaler)),
        lr_(lr) {}

  Model model_;
  TrainingGraph graph_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Executor> eval_executor_;
  bool eval_stale_ = false;  // the evaluation graph's weights lag state_
  bool name_first_non_finite_ = true;
  Optimizer optimizer_;
  LossScaler scaler_;
  LrSchedule lr_;
  std::map<std::string, Tensor> state_;
  int64_t steps_ = 0;
};

}  // namespace castor::tools
