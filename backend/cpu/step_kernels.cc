// The CPU backend's training-step kernels (backend/step_kernels.h): plain
// loops over host memory applying graph/update_rules.h. The unscale pass
// sums squares in parameter order, element by element, so the gradient
// norm (and with it clipping) is the same from run to run; the optimizer
// update is elementwise and runs on the backend's threads.
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/parallel.h"
#include "graph/half.h"
#include "graph/status.h"

namespace castor {
namespace {

// Divides `count` elements by the scale (multiplies by `inverse`, float32
// arithmetic, one rounding on store for 16-bit) and adds the squares of the
// stored values to `sum_squares`; false at the first non-finite element
// (the step is skipped, the rest need no unscaling).
template <typename Load, typename Store>
bool Unscale(int64_t count, float inverse, Load load, Store store, double& sum_squares) {
  for (int64_t i = 0; i < count; ++i) {
    const float value = load(i);
    if (!IsFiniteFloat(value)) return false;
    const float stored = store(i, value * inverse);
    sum_squares += double{stored} * stored;
  }
  return true;
}

bool UnscaleTensor(const TensorView& gradient, float inverse, double& sum_squares) {
  const int64_t count = gradient.num_elements();
  switch (gradient.dtype) {
    case DType::kFloat32: {
      float* data = gradient.as<float>();
      return Unscale(
          count, inverse, [data](int64_t i) { return data[i]; },
          [data](int64_t i, float v) { return data[i] = v; }, sum_squares);
    }
    case DType::kFloat16: {
      uint16_t* data = gradient.as<uint16_t>();
      return Unscale(
          count, inverse, [data](int64_t i) { return HalfBitsToFloat(data[i]); },
          [data](int64_t i, float v) {
            data[i] = FloatToHalfBits(v);
            return HalfBitsToFloat(data[i]);
          },
          sum_squares);
    }
    case DType::kBFloat16: {
      uint16_t* data = gradient.as<uint16_t>();
      return Unscale(
          count, inverse, [data](int64_t i) { return BFloat16BitsToFloat(data[i]); },
          [data](int64_t i, float v) {
            data[i] = FloatToBFloat16Bits(v);
            return BFloat16BitsToFloat(data[i]);
          },
          sum_squares);
    }
    default:
      return true;  // rejected by CheckStepInputs
  }
}

class CpuStepKernels : public StepKernels {
 public:
  absl::Status UnscaleAndDecide(const StepConfig& config, const std::vector<TensorView>& gradients,
                                const TensorView& loss, StepState* state,
                                float* next_loss_scale) override {
    CASTOR_RETURN_IF_ERROR(CheckStepInputs(gradients, loss));
    const float inverse = static_cast<float>(1.0 / CurrentLossScale(config.scaler, state->scaler));
    state->sum_squares = 0.0;
    state->non_finite = 0;
    for (const TensorView& gradient : gradients) {
      if (!UnscaleTensor(gradient, inverse, state->sum_squares)) {
        state->non_finite = 1;
        break;
      }
    }
    DecideStep(config, IsFiniteFloat(*loss.as<float>()), *state);
    *next_loss_scale = static_cast<float>(CurrentLossScale(config.scaler, state->scaler));
    return absl::OkStatus();
  }

  absl::Status ApplyOptimizer(const StepConfig& config,
                              const std::vector<ParameterUpdate>& parameters,
                              const StepState* state) override {
    CASTOR_RETURN_IF_ERROR(CheckParameters(config.optimizer, parameters));
    if (state->skipped) return absl::OkStatus();
    const OptimizerOptions& options = config.optimizer;
    const UpdateScalars update = state->update;
    for (const ParameterUpdate& p : parameters) {
      float* w = p.weight.as<float>();
      const float* g = p.gradient.as<float>();
      float* slot0 = p.slots[0];
      float* slot1 = p.slots[1];
      cpu::ParallelFor(0, p.weight.num_elements(), 1 << 14, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          OptimizerUpdate(options, update, w[i], g[i], slot0 == nullptr ? nullptr : slot0 + i,
                          slot1 == nullptr ? nullptr : slot1 + i);
        }
      });
    }
    return absl::OkStatus();
  }

  absl::Status CopyUnlessSkipped(const TensorView& destination, const TensorView& source,
                                 const StepState* state) override {
    CASTOR_RETURN_IF_ERROR(CheckCopy(destination, source));
    if (!state->skipped && destination.data != source.data) {
      std::memcpy(destination.data, source.data, source.byte_size());
    }
    return absl::OkStatus();
  }
};

}  // namespace

StepKernels* CpuBackend::step_kernels() {
  static CpuStepKernels kernels;
  return &kernels;
}

}  // namespace castor
