// Optimizer (see optimizer.h): option checks, restored state, and the host
// Step over Tensors, which applies backend/common/update_rules.h per element.
#include "training/optimizer.h"

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

std::vector<std::string> OptimizerSlotNames(const OptimizerOptions& options) {
  switch (OptimizerSlotCount(options)) {
    case 0: return {};
    case 1: return {"momentum"};
    default: return {"m", "v"};
  }
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
  ++step_;
  const UpdateScalars update = PrepareUpdate(options_, lr, step_, norm);
  const std::vector<std::string> slot_names = OptimizerSlotNames(options_);
  for (const ParameterGradient& p : parameters) {
    std::map<std::string, Tensor>& state = state_[p.name];
    float* slot[2] = {nullptr, nullptr};
    for (size_t k = 0; k < slot_names.size(); ++k) {
      if (!state.contains(slot_names[k])) {
        state[slot_names[k]] = Tensor(DType::kFloat32, p.weight->dims());  // zeros
      }
      slot[k] = state[slot_names[k]].data<float>();
    }
    float* w = p.weight->data<float>();
    const float* grad = p.gradient->data<float>();
    for (int64_t i = 0; i < p.weight->num_elements(); ++i) {
      OptimizerUpdate(options_, update, w[i], grad[i], slot[0] == nullptr ? nullptr : slot[0] + i,
                      slot[1] == nullptr ? nullptr : slot[1] + i);
    }
  }
  return norm;
}

}  // namespace castor
