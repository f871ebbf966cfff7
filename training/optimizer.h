// Optimizers on float32 master weights, with PyTorch's definitions and
// defaults (torch.optim.SGD, Adam, AdamW), gradient clipping by global norm
// (torch.nn.utils.clip_grad_norm_) and learning-rate schedules (constant,
// step, cosine with linear warmup). The rules themselves are in
// backend/common/update_rules.h, shared with the backends' step kernels; this is the
// host side: option checks, the per-parameter state a checkpoint keeps, and
// a host Step over Tensors (the reference the step kernels are tested
// against).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/common/update_rules.h"
#include "graph/tensor.h"

namespace castor {

// "sgd", "adam", "adamw".
absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
const char* OptimizerKindName(OptimizerKind kind);

// The per-parameter state slots, in OptimizerUpdate's order: none (plain
// SGD), "momentum" (SGD with momentum), "m" and "v" (Adam, AdamW).
std::vector<std::string> OptimizerSlotNames(const OptimizerOptions& options);

// "constant", "step", "cosine".
const char* LrScheduleKindName(LrSchedule::Kind kind);

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
