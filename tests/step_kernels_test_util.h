// Test harness for backend/step_kernels.h: runs the end of one training
// step (unscale and decide, the multi-tensor optimizer, the commit of a
// running statistic) on any backend from host tensors, and returns what the
// backend holds afterwards. The CPU test checks it against the host
// Optimizer and LossScaler; the CUDA test against the CPU backend.
#pragma once

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/backend.h"
#include "backend/common/update_rules.h"
#include "graph/status.h"
#include "graph/tensor.h"

namespace castor {

struct StepCase {
  StepConfig config;
  StepState state;                 // before the step
  std::vector<Tensor> weights;     // float32
  std::vector<Tensor> gradients;   // scaled; float32, float16 or bfloat16
  std::vector<std::vector<Tensor>> slots;  // per parameter, OptimizerSlotCount of them
  Tensor loss = Tensor::Scalar(1.0f);
  Tensor statistic;                // a running statistic before the step
  Tensor updated_statistic;        // the graph's new value for it
};

struct StepOutcome {
  StepState state;
  float next_loss_scale = 0;
  std::vector<Tensor> weights;
  std::vector<Tensor> gradients;  // unscaled in place
  std::vector<std::vector<Tensor>> slots;
  Tensor statistic;
};

// Byte-identical tensors (same dtype and dims).
inline bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0;
}

// An optimizer of `kind` with these options, a cosine schedule (lr 0.05,
// one warm-up step, `total_steps`), and a loss scale starting at
// `initial_scale` that grows after 2 good steps.
inline StepConfig MakeStepConfig(OptimizerKind kind, double momentum, bool nesterov,
                                 double weight_decay, double clip_norm,
                                 double initial_scale = 1024.0, int64_t total_steps = 6) {
  StepConfig config;
  config.optimizer.kind = kind;
  config.optimizer.momentum = momentum;
  config.optimizer.nesterov = nesterov;
  config.optimizer.weight_decay = weight_decay;
  config.optimizer.clip_norm = clip_norm;
  config.lr.kind = LrSchedule::Kind::kCosine;
  config.lr.base_lr = 0.05;
  config.lr.warmup_steps = 1;
  config.lr.total_steps = total_steps;
  config.scaler.initial_scale = initial_scale;
  config.scaler.growth_interval = 2;
  return config;
}

// `count` float32 values, normal(0, stddev), from `seed`.
inline Tensor RandomFloats(std::vector<int64_t> dims, uint32_t seed, float stddev = 1.0f) {
  Tensor t(DType::kFloat32, std::move(dims));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

// A case with parameters of `dims` (random weights, gradients scaled by
// the state's loss scale, zero slots), loss 1 and a 4-element statistic.
inline StepCase MakeStepCase(const StepConfig& config, const std::vector<std::vector<int64_t>>& dims,
                             uint32_t seed) {
  StepCase c;
  c.config = config;
  c.state.scaler.scale = config.scaler.initial_scale;
  const float scale = static_cast<float>(CurrentLossScale(config.scaler, c.state.scaler));
  for (size_t k = 0; k < dims.size(); ++k) {
    c.weights.push_back(RandomFloats(dims[k], seed + 3 * k));
    Tensor gradient = RandomFloats(dims[k], seed + 3 * k + 1, 0.1f);
    for (int64_t i = 0; i < gradient.num_elements(); ++i) gradient.data<float>()[i] *= scale;
    c.gradients.push_back(std::move(gradient));
    c.slots.emplace_back();
    for (int s = 0; s < OptimizerSlotCount(config.optimizer); ++s) {
      c.slots.back().push_back(Tensor(DType::kFloat32, dims[k]));
    }
  }
  c.statistic = RandomFloats({4}, seed + 1000);
  c.updated_statistic = RandomFloats({4}, seed + 1001);
  return c;
}

inline absl::StatusOr<StepOutcome> RunStepKernels(Backend& backend, const StepCase& c) {
  StepKernels* kernels = backend.step_kernels();
  if (kernels == nullptr) return absl::UnimplementedError("no step kernels");
  std::vector<void*> owned;
  struct Free {
    Backend& backend;
    std::vector<void*>& owned;
    ~Free() {
      for (void* p : owned) backend.Free(p);
    }
  } free_all{backend, owned};
  auto upload = [&](const void* data, size_t bytes) -> absl::StatusOr<void*> {
    CASTOR_ASSIGN_OR_RETURN(void* p, backend.Allocate(bytes == 0 ? 1 : bytes));
    owned.push_back(p);
    CASTOR_RETURN_IF_ERROR(backend.CopyFromHost(p, data, bytes));
    return p;
  };
  auto view = [&](const Tensor& t) -> absl::StatusOr<TensorView> {
    CASTOR_ASSIGN_OR_RETURN(void* p, upload(t.raw(), t.byte_size()));
    return TensorView{p, t.dtype(), t.dims()};
  };
  auto download = [&](const TensorView& v) -> absl::StatusOr<Tensor> {
    Tensor t(v.dtype, v.dims);
    CASTOR_RETURN_IF_ERROR(backend.CopyToHost(t.raw(), v.data, t.byte_size()));
    return t;
  };

  CASTOR_ASSIGN_OR_RETURN(void* state, upload(&c.state, sizeof(StepState)));
  const float stale_scale = -1.0f;
  CASTOR_ASSIGN_OR_RETURN(void* next_scale, upload(&stale_scale, sizeof(float)));
  CASTOR_ASSIGN_OR_RETURN(TensorView loss, view(c.loss));
  std::vector<TensorView> gradients;
  std::vector<ParameterUpdate> parameters;
  for (size_t k = 0; k < c.weights.size(); ++k) {
    ParameterUpdate p;
    p.name = absl::StrCat("w", k);
    CASTOR_ASSIGN_OR_RETURN(p.weight, view(c.weights[k]));
    CASTOR_ASSIGN_OR_RETURN(p.gradient, view(c.gradients[k]));
    for (size_t s = 0; s < c.slots[k].size(); ++s) {
      CASTOR_ASSIGN_OR_RETURN(TensorView slot, view(c.slots[k][s]));
      p.slots[s] = slot.as<float>();
    }
    gradients.push_back(p.gradient);
    parameters.push_back(std::move(p));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView statistic, view(c.statistic));
  CASTOR_ASSIGN_OR_RETURN(TensorView updated, view(c.updated_statistic));

  auto* device_state = static_cast<StepState*>(state);
  CASTOR_RETURN_IF_ERROR(kernels->UnscaleAndDecide(c.config, gradients, loss, device_state,
                                                   static_cast<float*>(next_scale)));
  CASTOR_RETURN_IF_ERROR(kernels->ApplyOptimizer(c.config, parameters, device_state));
  CASTOR_RETURN_IF_ERROR(kernels->CopyUnlessSkipped(statistic, updated, device_state));

  StepOutcome out;
  CASTOR_RETURN_IF_ERROR(backend.CopyToHost(&out.state, state, sizeof(StepState)));
  CASTOR_RETURN_IF_ERROR(backend.CopyToHost(&out.next_loss_scale, next_scale, sizeof(float)));
  for (size_t k = 0; k < parameters.size(); ++k) {
    CASTOR_ASSIGN_OR_RETURN(Tensor w, download(parameters[k].weight));
    CASTOR_ASSIGN_OR_RETURN(Tensor g, download(parameters[k].gradient));
    out.weights.push_back(std::move(w));
    out.gradients.push_back(std::move(g));
    out.slots.emplace_back();
    for (size_t s = 0; s < c.slots[k].size(); ++s) {
      CASTOR_ASSIGN_OR_RETURN(
          Tensor slot,
          download(TensorView{parameters[k].slots[s], DType::kFloat32, c.weights[k].dims()}));
      out.slots.back().push_back(std::move(slot));
    }
  }
  CASTOR_ASSIGN_OR_RETURN(out.statistic, download(statistic));
  return out;
}

}  // namespace castor
