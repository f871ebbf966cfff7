// The end of a training step on a backend, after the training graph ran
// (DESIGN.md "Training", "Dynamic loss scaling"):
//
//   1. UnscaleAndDecide: one fused pass over every gradient divides it by
//      the loss scale in place, checks the unscaled values (and the
//      loss) for inf/NaN and sums their squares; then the step is decided
//      (backend/common/update_rules.h DecideStep): skipped, or counted
//      with its learning rate, clipping and bias corrections; the loss
//      scale moves
//      and the next step's scale is written where the training graph
//      reads it.
//   2. ApplyOptimizer: the optimizer over all parameters at once
//      (multi-tensor), unless the step was skipped.
//   3. CopyUnlessSkipped: BatchNormalization running statistics are
//      committed only by a step that was not skipped.
//
// Every input lives in backend memory, the StepState included, and every
// decision is read from there: the host queues the whole step without
// waiting for the device, and reads the StepState once afterwards, for
// logging. The rules are backend/common/update_rules.h, the same for every
// backend.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "backend/common/update_rules.h"
#include "backend/kernel.h"

namespace castor {

// One parameter of the multi-tensor update, all in backend memory: the
// float32 master weight, its float32 gradient (same dims) and its
// optimizer slots (OptimizerSlotCount of them; float32, same dims).
struct ParameterUpdate {
  std::string name;  // for errors
  TensorView weight;
  TensorView gradient;
  float* slots[2] = {nullptr, nullptr};
};

class StepKernels {
 public:
  virtual ~StepKernels() = default;

  // `gradients`: float32, float16 or bfloat16 (16-bit ones rounded once on
  // store); `loss`: the float32 scalar loss; `state`: a StepState in
  // backend memory; `next_loss_scale`: the training graph's float32
  // loss-scale input in backend memory.
  virtual absl::Status UnscaleAndDecide(const StepConfig& config,
                                        const std::vector<TensorView>& gradients,
                                        const TensorView& loss, StepState* state,
                                        float* next_loss_scale) = 0;

  // Applies the update `state` prepared to every parameter; nothing when the
  // step was skipped.
  virtual absl::Status ApplyOptimizer(const StepConfig& config,
                                      const std::vector<ParameterUpdate>& parameters,
                                      const StepState* state) = 0;

  // destination = source (same byte size), unless the step was skipped.
  virtual absl::Status CopyUnlessSkipped(const TensorView& destination, const TensorView& source,
                                         const StepState* state) = 0;
};

// The checks every implementation runs first; errors name what is wrong.
absl::Status CheckStepInputs(const std::vector<TensorView>& gradients, const TensorView& loss);
absl::Status CheckParameters(const OptimizerOptions& options,
                             const std::vector<ParameterUpdate>& parameters);
absl::Status CheckCopy(const TensorView& destination, const TensorView& source);

}  // namespace castor
