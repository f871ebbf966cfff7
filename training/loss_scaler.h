// Dynamic loss scaling (DESIGN.md "Training"): the scale S the loss is
// multiplied by before backward and the update of S after the fused
// unscale-and-check over every gradient (a backend step kernel,
// backend/step_kernels.h), with PyTorch GradScaler's defaults and rules
// plus a floor (the rule itself is UpdateLossScale, backend/common/update_rules.h):
//   overflow (any gradient inf/NaN): the step is skipped (no weight,
//     moment or BatchNorm-statistic update), S = max(S * backoff, floor),
//     the good-step counter restarts;
//   otherwise: counter + 1; after growth_interval good steps in a row,
//     S = S * growth and the counter restarts.
// Hitting the floor and still overflowing `floor_patience` steps in a row
// is diagnosed (the gradients are non-finite even unscaled: the run
// diverged or the forward pass overflows in 16 bits) instead of skipping
// forever in silence. Disabled (the default for bfloat16 and float32), the
// scale stays 1, but a step with non-finite gradients is still skipped,
// counted and, when it persists, diagnosed: nothing corrupts the weights.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "backend/common/update_rules.h"
#include "graph/json.h"

namespace castor {

// What one step's check decided.
struct ScalerStep {
  bool skipped = false;       // the update must not be applied
  double scale_used = 1.0;    // S the gradients were scaled by
  double next_scale = 1.0;    // S for the next step
  // Set when the floor is hit repeatedly: what happened and what to try.
  std::string diagnosis;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // Options must be positive (growth > 1, 0 < backoff < 1, floor <= initial
  // scale); errors name the option.
  static absl::StatusOr<LossScaler> Create(LossScalerOptions options);

  // The scale for the next step (1 when disabled).
  double scale() const { return CurrentLossScale(options_, state_); }
  bool enabled() const { return options_.enabled; }

  // Records the step's outcome and moves the scale (UpdateLossScale in
  // backend/common/update_rules.h). The fused unscale-and-check that decides
  // `all_finite` is a backend's step kernel (backend/step_kernels.h).
  ScalerStep Update(bool all_finite);

  // The state the step kernels carry in backend memory, and its copy back
  // after a step there; `diagnosis` as Update would give it.
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }
  std::string Diagnosis() const;

  int64_t good_steps() const { return state_.good_steps; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  const LossScalerOptions& options() const { return options_; }

  // The state a checkpoint keeps (scale, counters, options), and its
  // inverse; FromJson errors name the field.
  Json ToJson() const;
  static absl::StatusOr<LossScaler> FromJson(const Json& json);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace castor
