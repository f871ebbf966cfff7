// Optimizers on float32 master weights, with PyTorch's definitions and
// defaults (torch.optim.SGD, Adam, AdamW), gradient clipping by global norm
// (torch.nn.utils.clip_grad_norm_) and learning-rate schedules (constant,
// step, cosine with linear warmup). Host-side: the trainer hands each step
// the parameters and their unscaled float32 gradients.
//
//   SGD:   g = grad + wd * w; buf = momentum * buf + g (buf = g on the first
//          step); g = nesterov ? g + momentum * buf : buf (when momentum > 0);
//          w -= lr * g
//   Adam:  g = grad + wd * w; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//          w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//   AdamW: w *= 1 - lr * wd; then Adam's update without the wd term
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/tensor.h"

namespace castor {

enum class OptimizerKind { kSgd, kAdam, kAdamW };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdam;
  double momentum = 0.0;   // SGD
  bool nesterov = false;   // SGD, needs momentum > 0
  double beta1 = 0.9;      // Adam, AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2 for SGD/Adam, decoupled for AdamW (PyTorch's default 1e-2 there)
  double clip_norm = 0.0;     // clip gradients to this global L2 norm; 0 = off
};

// "sgd", "adam", "adamw".
absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
const char* OptimizerKindName(OptimizerKind kind);

struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;  // linear from base_lr / warmup to base_lr (all kinds)
  int64_t step_size = 1000;  // kStep: multiply by gamma every step_size steps
  double gamma = 0.1;
  int64_t total_steps = 0;   // kCosine: reaches min_lr at total_steps
  double min_lr = 0.0;
};

// "constant", "step", "cosine".
const char* LrScheduleKindName(LrSchedule::Kind kind);

// The learning rate of step `step` (counted from 1).
double LearningRate(const LrSchedule& schedule, int64_t step);

// One parameter's update input: its master weight and its gradient.
struct ParameterGradient {
  std::string name;
  Tensor* weight = nullptr;      // float32, updated in place
  const Tensor* gradient = nullptr;  // float32, same shape
};

class Optimizer {
 public:
  // Validates the options (betas in [0, 1), eps > 0, nesterov needs
  // momentum, ...); errors name the option.
  static absl::StatusOr<Optimizer> Create(OptimizerOptions options);
  // An optimizer that continues a saved run (a checkpoint): `step` updates
  // applied and the per-parameter state as state() returned it. Errors name
  // the parameter and the slot (one the kind does not use, not float32).
  static absl::StatusOr<Optimizer> Restore(
      OptimizerOptions options, int64_t step,
      std::map<std::string, std::map<std::string, Tensor>> state);

  // Clips (when clip_norm > 0) and applies one update with learning rate
  // `lr` to every parameter; the step counter advances once. Returns the
  // gradients' global L2 norm before clipping. Errors name the parameter
  // (dtype or shape mismatch).
  absl::StatusOr<double> Step(const std::vector<ParameterGradient>& parameters, double lr);

  int64_t step() const { return step_; }
  const OptimizerOptions& options() const { return options_; }
  // Per-parameter state by name: "momentum" (SGD), "m" and "v" (Adam/AdamW).
  const std::map<std::string, std::map<std::string, Tensor>>& state() const { return state_; }

 private:
  explicit Optimizer(OptimizerOptions options) : options_(options) {}

  OptimizerOptions options_;
  int64_t step_ = 0;
  std::map<std::string, std::map<std::string, Tensor>> state_;
};

}  // namespace castor
