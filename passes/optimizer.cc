// Optimizer and learning-rate schedules (see optimizer.h). Updates run in
// double per element and store float32, so results match PyTorch's float32
// optimizers to rounding.
#include "passes/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"

namespace castor {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name, "'; expected sgd, adam or adamw"));
}

const char* LrScheduleKindName(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::kConstant:
      return "constant";
    case LrSchedule::Kind::kStep:
      return "step";
    case LrSchedule::Kind::kCosine:
      return "cosine";
  }
  return "?";
}

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
}

double LearningRate(const LrSchedule& schedule, int64_t step) {
  if (schedule.warmup_steps > 0 && step <= schedule.warmup_steps) {
    return schedule.base_lr * static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
  }
  switch (schedule.kind) {
    case LrSchedule::Kind::kConstant:
      return schedule.base_lr;
    case LrSchedule::Kind::kStep: {
      const int64_t after = step - 1 - schedule.warmup_steps;
      return schedule.base_lr * std::pow(schedule.gamma, static_cast<double>(after / schedule.step_size));
    }
    case LrSchedule::Kind::kCosine: {
      const double span = static_cast<double>(schedule.total_steps - schedule.warmup_steps);
      const double done = std::min(1.0, static_cast<double>(step - schedule.warmup_steps) / span);
      return schedule.min_lr +
             0.5 * (schedule.base_lr - schedule.min_lr) * (1.0 + std::cos(M_PI * done));
    }
  }
  return schedule.base_lr;
}

absl::StatusOr<Optimizer> Optimizer::Create(OptimizerOptions options) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: ", what));
  };
  if (options.momentum < 0) return bad(absl::StrFormat("momentum must be >= 0, got %g", options.momentum));
  if (options.nesterov && (options.kind != OptimizerKind::kSgd || options.momentum <= 0)) {
    return bad("nesterov needs sgd with momentum > 0");
  }
  if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1)) {
    return bad(absl::StrFormat("betas must be in [0, 1), got %g and %g", options.beta1,
                               options.beta2));
  }
  if (!(options.eps > 0)) return bad(absl::StrFormat("eps must be > 0, got %g", options.eps));
  if (options.weight_decay < 0) {
    return bad(absl::StrFormat("weight decay must be >= 0, got %g", options.weight_decay));
  }
  if (options.clip_norm < 0) {
    return bad(absl::StrFormat("clip norm must be >= 0 (0 = off), got %g", options.clip_norm));
  }
  return Optimizer(options);
}

absl::StatusOr<Optimizer> Optimizer::Restore(
    OptimizerOptions options, int64_t step,
    std::map<std::string, std::map<std::string, Tensor>> state) {
  CASTOR_ASSIGN_OR_RETURN(Optimizer optimizer, Create(options));
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("optimizer: step ", step, " < 0"));
  const bool sgd = options.kind == OptimizerKind::kSgd;
  for (const auto& [parameter, slots] : state) {
    for (const auto& [slot, tensor] : slots) {
      const bool known = sgd ? slot == "momentum" && options.momentum > 0
                             : slot == "m" || slot == "v";
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state of parameter '", parameter, "': unknown slot '", slot, "'; ",
            OptimizerKindName(options.kind), " keeps ",
            sgd ? "'momentum' (when momentum > 0)" : "'m' and 'v'"));
      }
      if (tensor.dtype() != DType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state of parameter '", parameter, "': slot '", slot, "' is ",
            DTypeName(tensor.dtype()), ", expected float32"));
      }
    }
  }
  optimizer.step_ = step;
  optimizer.state_ = std::move(state);
  return optimizer;
}

absl::StatusOr<double> Optimizer::Step(const std::vector<ParameterGradient>& parameters,
                                       double lr) {
  double squares = 0.0;
  for (const ParameterGradient& p : parameters) {
    if (p.weight->dtype() != DType::kFloat32 || p.gradient->dtype() != DType::kFloat32 ||
        p.weight->dims() != p.gradient->dims()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: parameter '", p.name, "' is ", DTypeName(p.weight->dtype()),
          p.weight->shape().ToString(), " with a ", DTypeName(p.gradient->dtype()),
          p.gradient->shape().ToString(), " gradient; expected float32 of the same shape"));
    }
    const float* g = p.gradient->data<float>();
    for (int64_t i = 0; i < p.gradient->num_elements(); ++i) squares += double{g[i]} * g[i];
  }
  const double norm = std::sqrt(squares);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1.
  const double clip = options_.clip_norm > 0 ? std::min(1.0, options_.clip_norm / (norm + 1e-6)) : 1.0;
  ++step_;
  const double t = static_cast<double>(step_);
  const double wd = options_.weight_decay;
  for (const ParameterGradient& p : parameters) {
    float* w = p.weight->data<float>();
    const float* grad = p.gradient->data<float>();
    const int64_t n = p.weight->num_elements();
    std::map<std::string, Tensor>& state = state_[p.name];
    switch (options_.kind) {
      case OptimizerKind::kSgd: {
        const bool first = !state.contains("momentum");
        if (options_.momentum > 0 && first) {
          state["momentum"] = Tensor(DType::kFloat32, p.weight->dims());
        }
        float* buf = options_.momentum > 0 ? state["momentum"].data<float>() : nullptr;
        for (int64_t i = 0; i < n; ++i) {
          double g = grad[i] * clip + wd * w[i];
          if (buf != nullptr) {
            const double b = first ? g : options_.momentum * buf[i] + g;
            buf[i] = static_cast<float>(b);
            g = options_.nesterov ? g + options_.momentum * buf[i] : buf[i];
          }
          w[i] = static_cast<float>(w[i] - lr * g);
        }
        break;
      }
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        if (!state.contains("m")) {
          state["m"] = Tensor(DType::kFloat32, p.weight->dims());
          state["v"] = Tensor(DType::kFloat32, p.weight->dims());
        }
        float* m = state["m"].data<float>();
        float* v = state["v"].data<float>();
        const bool decoupled = options_.kind == OptimizerKind::kAdamW;
        const double correction1 = 1.0 - std::pow(options_.beta1, t);
        const double correction2 = 1.0 - std::pow(options_.beta2, t);
        for (int64_t i = 0; i < n; ++i) {
          double weight = w[i];
          double g = grad[i] * clip;
          if (decoupled) {
            weight *= 1.0 - lr * wd;
          } else {
            g += wd * weight;
          }
          const double m_next = options_.beta1 * m[i] + (1.0 - options_.beta1) * g;
          const double v_next = options_.beta2 * v[i] + (1.0 - options_.beta2) * g * g;
          m[i] = static_cast<float>(m_next);
          v[i] = static_cast<float>(v_next);
          const double denominator = std::sqrt(v_next / correction2) + options_.eps;
          w[i] = static_cast<float>(weight - lr * (m_next / correction1) / denominator);
        }
        break;
      }
    }
  }
  return norm;
}

}  // namespace castor
