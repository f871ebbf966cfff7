// The rules of a training update, written once for every backend: the
// learning-rate schedules, the optimizers' per-element updates (PyTorch's
// SGD, Adam and AdamW on float32 master weights), the dynamic loss scaler's
// state machine and the decision that ends a step (skip it, or apply the
// optimizer with these scalars). The functions are `CASTOR_HOST_DEVICE`:
// the host optimizer (training/optimizer.h), the CPU backend's step kernels
// and the CUDA kernels call the same code. The host optimizer and the CPU
// kernels agree to the bit; CUDA agrees to rounding (nvcc fuses a * b + c
// into one FMA, and its pow and its order of summing squares differ).
//
// Everything here is plain data: the option structs travel to a device as
// kernel arguments, and StepState lives in backend memory, where the step
// kernels (backend/step_kernels.h) read and write it without the host.
//
//   SGD:   g = grad * clip + wd * w; buf = momentum * buf + g (buf starts at
//          0, so the first step gives buf = g); g = nesterov ? g + momentum *
//          buf : buf (when momentum > 0); w -= lr * g
//   Adam:  g = grad * clip + wd * w; m = b1 m + (1 - b1) g;
//          v = b2 v + (1 - b2) g^2;
//          w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//   AdamW: w *= 1 - lr * wd; then Adam's update without the wd term
// SGD runs in double per element, Adam in float32 (as PyTorch's does);
// both store float32 and match PyTorch's float32 optimizers to rounding.
#pragma once

#include <math.h>

#include <cstdint>

#include "graph/half.h"

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

struct LossScalerOptions {
  bool enabled = true;
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;      // the floor
  int64_t floor_patience = 5;  // overflows in a row at the floor before the diagnosis
};

// What the loss scaler carries from step to step (and a checkpoint keeps).
struct LossScalerState {
  double scale = 65536.0;  // S for the next step (while enabled)
  int64_t good_steps = 0;  // finite steps since the scale last moved
  int64_t skipped_steps = 0;
  int64_t overflows_at_floor = 0;  // in a row, with the scale at its floor
};

// The per-step scalars of an optimizer update.
struct UpdateScalars {
  double lr = 0.0;
  double clip = 1.0;         // factor on every gradient (clipping by global norm)
  double correction1 = 1.0;  // Adam's bias corrections 1 - beta^t
  double correction2 = 1.0;
  // Derived from the above by PrepareUpdate (the only place that fills an
  // UpdateScalars for an update), so that an Adam element takes one
  // division and one square root instead of three divisions and one.
  double lr_over_correction1 = 0.0;
  double inverse_correction2 = 1.0;
};

// Everything a step needs beyond the tensors.
struct StepConfig {
  OptimizerOptions optimizer;
  LrSchedule lr;
  LossScalerOptions scaler;
};

// The training state a step reads and writes in backend memory, and what
// the step decided. The host reads it once per step, for logging.
struct StepState {
  LossScalerState scaler;
  int64_t optimizer_step = 0;  // updates applied so far
  // Written by the latest step:
  double scale_used = 1.0;   // the loss scale its gradients carried
  double sum_squares = 0.0;  // of the unscaled gradients; 0 when skipped
  double grad_norm = 0.0;    // sqrt(sum_squares); 0 when skipped
  UpdateScalars update;      // lr is set even when the step is skipped
  int32_t non_finite = 0;    // a gradient or the loss held inf/NaN
  int32_t skipped = 0;       // nothing was updated
};

CASTOR_HOST_DEVICE inline bool IsFiniteFloat(float value) {
  return (FloatBits(value) & 0x7f800000u) != 0x7f800000u;
}

// The learning rate of step `step` (counted from 1).
CASTOR_HOST_DEVICE inline double LearningRate(const LrSchedule& schedule, int64_t step) {
  if (schedule.warmup_steps > 0 && step <= schedule.warmup_steps) {
    return schedule.base_lr * static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
  }
  switch (schedule.kind) {
    case LrSchedule::Kind::kConstant:
      return schedule.base_lr;
    case LrSchedule::Kind::kStep: {
      const int64_t after = step - 1 - schedule.warmup_steps;
      return schedule.base_lr * pow(schedule.gamma, static_cast<double>(after / schedule.step_size));
    }
    case LrSchedule::Kind::kCosine: {
      const double span = static_cast<double>(schedule.total_steps - schedule.warmup_steps);
      const double ratio = static_cast<double>(step - schedule.warmup_steps) / span;
      const double done = ratio < 1.0 ? ratio : 1.0;
      return schedule.min_lr +
             0.5 * (schedule.base_lr - schedule.min_lr) * (1.0 + cos(M_PI * done));
    }
  }
  return schedule.base_lr;
}

// The scalars of update number `step` (counted from 1) with learning rate
// `lr`, for gradients whose global L2 norm is `norm`.
CASTOR_HOST_DEVICE inline UpdateScalars PrepareUpdate(const OptimizerOptions& options, double lr,
                                                     int64_t step, double norm) {
  UpdateScalars u;
  u.lr = lr;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1.
  if (options.clip_norm > 0) {
    const double factor = options.clip_norm / (norm + 1e-6);
    u.clip = factor < 1.0 ? factor : 1.0;
  }
  const double t = static_cast<double>(step);
  u.correction1 = 1.0 - pow(options.beta1, t);
  u.correction2 = 1.0 - pow(options.beta2, t);
  u.lr_over_correction1 = lr / u.correction1;
  u.inverse_correction2 = 1.0 / u.correction2;
  return u;
}

// One element of an SGD update; `buffer` is the momentum slot (nullptr
// when momentum is 0).
CASTOR_HOST_DEVICE inline void SgdUpdate(const OptimizerOptions& options, const UpdateScalars& u,
                                         float& weight, float grad, float* buffer) {
  double g = grad * u.clip + options.weight_decay * weight;
  if (buffer != nullptr) {
    *buffer = static_cast<float>(options.momentum * *buffer + g);
    g = options.nesterov ? g + options.momentum * *buffer : *buffer;
  }
  weight = static_cast<float>(weight - u.lr * g);
}

// One element of an Adam or AdamW update, in float32 arithmetic as
// PyTorch's Adam computes it (the scalars rounded to float32 once): its
// square root and division are a float32 vector's single instructions, so
// the update runs at the speed memory delivers the four arrays (670k
// weights, one thread, AVX-512: 0.38 ms; in float64 0.97 ms; a plain copy
// of the arrays 0.37 ms).
CASTOR_HOST_DEVICE inline void AdamUpdate(const OptimizerOptions& options, const UpdateScalars& u,
                                          float& weight, float grad, float& m, float& v) {
  const float beta1 = static_cast<float>(options.beta1);
  const float beta2 = static_cast<float>(options.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - options.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  float w = weight;
  float g = grad * static_cast<float>(u.clip);
  if (options.kind == OptimizerKind::kAdamW) {
    w *= static_cast<float>(1.0 - u.lr * options.weight_decay);
  } else {
    g += static_cast<float>(options.weight_decay) * w;
  }
  m = beta1 * m + one_minus_beta1 * g;
  v = beta2 * v + one_minus_beta2 * (g * g);
  // lr * (m / correction1) / (sqrt(v / correction2) + eps)
  const float denominator =
      sqrtf(v * static_cast<float>(u.inverse_correction2)) + static_cast<float>(options.eps);
  weight = w - static_cast<float>(u.lr_over_correction1) * m / denominator;
}

// One element of any optimizer: `slot0` is SGD's momentum buffer (nullptr
// without momentum) or Adam's m, `slot1` Adam's v.
CASTOR_HOST_DEVICE inline void OptimizerUpdate(const OptimizerOptions& options,
                                               const UpdateScalars& u, float& weight, float grad,
                                               float* slot0, float* slot1) {
  if (options.kind == OptimizerKind::kSgd) {
    SgdUpdate(options, u, weight, grad, slot0);
  } else {
    AdamUpdate(options, u, weight, grad, *slot0, *slot1);
  }
}

// The optimizer slots a parameter needs: 0 (plain SGD), 1 or 2.
CASTOR_HOST_DEVICE inline int OptimizerSlotCount(const OptimizerOptions& options) {
  if (options.kind == OptimizerKind::kSgd) return options.momentum > 0 ? 1 : 0;
  return 2;
}

// The loss scale the next step multiplies the loss by (1 when disabled).
CASTOR_HOST_DEVICE inline double CurrentLossScale(const LossScalerOptions& options,
                                                  const LossScalerState& state) {
  return options.enabled ? state.scale : 1.0;
}

// Records a step's outcome and moves the scale (GradScaler's rules with a
// floor; see training/loss_scaler.h).
CASTOR_HOST_DEVICE inline void UpdateLossScale(const LossScalerOptions& options, bool all_finite,
                                               LossScalerState& state) {
  if (!all_finite) {
    ++state.skipped_steps;
    state.good_steps = 0;
    if (options.enabled) {
      const bool was_at_floor = state.scale <= options.min_scale;
      const double backed_off = state.scale * options.backoff_factor;
      state.scale = backed_off > options.min_scale ? backed_off : options.min_scale;
      state.overflows_at_floor = was_at_floor ? state.overflows_at_floor + 1 : 0;
    } else {
      ++state.overflows_at_floor;  // no scaling: every overflow is one "at the floor"
    }
  } else {
    state.overflows_at_floor = 0;
    if (options.enabled && ++state.good_steps >= options.growth_interval) {
      state.scale *= options.growth_factor;
      state.good_steps = 0;
    } else if (!options.enabled) {
      ++state.good_steps;
    }
  }
}

// Whether the floor was hit `floor_patience` times in a row (the latest
// step overflowed with the scale at its floor, and so did the ones before).
CASTOR_HOST_DEVICE inline bool FloorHitRepeatedly(const LossScalerOptions& options,
                                                  const LossScalerState& state) {
  return state.overflows_at_floor >= options.floor_patience;
}

// Ends a step once its gradients were unscaled and checked
// (state.non_finite, state.sum_squares): records the scale they carried,
// moves the loss scale, and either marks the step skipped or counts the
// update and prepares its scalars.
CASTOR_HOST_DEVICE inline void DecideStep(const StepConfig& config, bool loss_finite,
                                          StepState& state) {
  const bool finite = loss_finite && state.non_finite == 0;
  state.scale_used = CurrentLossScale(config.scaler, state.scaler);
  UpdateLossScale(config.scaler, finite, state.scaler);
  state.skipped = finite ? 0 : 1;
  const double lr = LearningRate(config.lr, state.optimizer_step + 1);
  if (!finite) {
    state.sum_squares = 0.0;  // partial: the backends stop at different elements
    state.grad_norm = 0.0;
    state.update = UpdateScalars{};
    state.update.lr = lr;
    return;
  }
  state.grad_norm = sqrt(state.sum_squares);
  ++state.optimizer_step;
  state.update = PrepareUpdate(config.optimizer, lr, state.optimizer_step, state.grad_norm);
}

}  // namespace castor
