// Dynamic loss scaling (DESIGN.md "Training"): the scale S the loss is
// multiplied by before backward, the fused unscale-and-check over every
// gradient after it, and the update of S, with PyTorch GradScaler's defaults
// and rules plus a floor:
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
#include <vector>

#include "absl/status/statusor.h"
#include "graph/json.h"
#include "graph/tensor.h"

namespace castor {

struct LossScalerOptions {
  bool enabled = true;
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;      // the floor
  int64_t floor_patience = 5;  // overflows in a row at the floor before the diagnosis
};

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
  double scale() const { return options_.enabled ? scale_ : 1.0; }
  bool enabled() const { return options_.enabled; }

  // The fused pass: divides every gradient (float32, float16 or bfloat16
  // tensors; 16-bit ones rounded once) by scale() in place and reports
  // whether all elements are finite. Stops unscaling at the first
  // non-finite element (the step is skipped anyway).
  bool UnscaleAndCheckFinite(const std::vector<Tensor*>& gradients) const;

  // Records the step's outcome and moves the scale.
  ScalerStep Update(bool all_finite);

  int64_t good_steps() const { return good_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  const LossScalerOptions& options() const { return options_; }

  // The state a checkpoint keeps (scale, counters, options), and its
  // inverse; FromJson errors name the field.
  Json ToJson() const;
  static absl::StatusOr<LossScaler> FromJson(const Json& json);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t overflows_at_floor_ = 0;
};

}  // namespace castor
