// The CPU backend's training-step kernels (backend/step_kernels.h): loops
// over host memory applying backend/common/update_rules.h. The unscale pass
// runs on the backend's threads over fixed segments of the gradients, each
// summing its squares in float64 lanes (lane_sums.h), the totals added in
// parameter order: the gradient norm (and with it clipping) is the same
// from run to run and at any thread count. The optimizer update is
// elementwise and runs on the backend's threads too.
//
// The float32 loops are built for AVX-512, AVX2 and the baseline
// (vector_clones.h): at the baseline's two float64 lanes Adam and the
// unscale pass were a third of the MLP's training step. Every clone
// computes the same bits as the host Optimizer.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vector_clones.h"
#include "graph/half.h"
#include "graph/status.h"

namespace castor {
namespace {

using cpu::LaneSums;

// Gradients are unscaled in segments of this many elements, spread over
// the threads.
constexpr int64_t kUnscaleSegment = 1 << 16;

// The sum of squares is a long sum (lane_sums.h's kWideSumLanes).
using SquareSums = LaneSums<1, cpu::kWideSumLanes>;

// Multiplies `count` elements by `inverse` (float32 arithmetic, one
// rounding on store for 16-bit) and adds the squares of the stored values
// to `sums`, in one pass. That float64 sum is also the finiteness check: a
// float32 value squared is finite in float64, and so is a segment's sum of
// them, so the sum is inf or NaN exactly when a stored value is. (A
// non-finite value is stored too: its step is skipped, and nothing reads
// the gradients of a skipped step.) With inverse 1 (loss scaling off, or a
// scale of 1) the values are only read: storing them back would give the
// same bits.
template <typename Load, typename Store>
[[gnu::always_inline]] inline void Unscale(int64_t count, float inverse, Load load, Store store,
                                           SquareSums& sums) {
  if (inverse == 1.0f) {
    sums.Add(count, [&](int64_t i) {
      const float value = load(i);
      return std::array<double, 1>{double{value} * value};
    });
    return;
  }
  sums.Add(count, [&](int64_t i) {
    const float stored = store(i, load(i) * inverse);
    return std::array<double, 1>{double{stored} * stored};
  });
}

CASTOR_VECTOR_CLONES
void UnscaleFloat32(float* data, int64_t count, float inverse, SquareSums& sums) {
  Unscale(
      count, inverse, [data](int64_t i) { return data[i]; },
      [data](int64_t i, float v) { return data[i] = v; }, sums);
}

// Elements [begin, begin + count) of one gradient.
void UnscaleRange(const TensorView& gradient, int64_t begin, int64_t count, float inverse,
                  SquareSums& sums) {
  switch (gradient.dtype) {
    case DType::kFloat32:
      UnscaleFloat32(gradient.as<float>() + begin, count, inverse, sums);
      return;
    case DType::kFloat16: {
      uint16_t* data = gradient.as<uint16_t>() + begin;
      Unscale(
          count, inverse, [data](int64_t i) { return HalfBitsToFloat(data[i]); },
          [data](int64_t i, float v) {
            data[i] = FloatToHalfBits(v);
            return HalfBitsToFloat(data[i]);
          },
          sums);
      return;
    }
    case DType::kBFloat16: {
      uint16_t* data = gradient.as<uint16_t>() + begin;
      Unscale(
          count, inverse, [data](int64_t i) { return BFloat16BitsToFloat(data[i]); },
          [data](int64_t i, float v) {
            data[i] = FloatToBFloat16Bits(v);
            return BFloat16BitsToFloat(data[i]);
          },
          sums);
      return;
    }
    default:
      return;  // rejected by CheckStepInputs
  }
}

// The optimizer update of elements [0, n) of one parameter; slot0 and slot1
// as OptimizerUpdate takes them (nullptr where the optimizer has none).
CASTOR_VECTOR_CLONES
void UpdateRange(const OptimizerOptions& options, const UpdateScalars& update, float* weight,
                 const float* gradient, float* slot0, float* slot1, int64_t n) {
  const OptimizerOptions o = options;  // locals: the stores below cannot change them
  const UpdateScalars u = update;
  if (o.kind != OptimizerKind::kSgd) {
    for (int64_t i = 0; i < n; ++i) AdamUpdate(o, u, weight[i], gradient[i], slot0[i], slot1[i]);
  } else if (slot0 != nullptr) {
    for (int64_t i = 0; i < n; ++i) SgdUpdate(o, u, weight[i], gradient[i], slot0 + i);
  } else {
    for (int64_t i = 0; i < n; ++i) SgdUpdate(o, u, weight[i], gradient[i], nullptr);
  }
}

class CpuStepKernels : public StepKernels {
 public:
  absl::Status UnscaleAndDecide(const StepConfig& config, const std::vector<TensorView>& gradients,
                                const TensorView& loss, StepState* state,
                                float* next_loss_scale) override {
    CASTOR_RETURN_IF_ERROR(CheckStepInputs(gradients, loss));
    const float inverse = static_cast<float>(1.0 / CurrentLossScale(config.scaler, state->scaler));
    // Fixed segments of the gradients, so the sum's order does not depend
    // on the thread count: each segment's lanes are totalled on their own,
    // and the totals added in parameter order.
    struct Segment {
      const TensorView* gradient;
      int64_t begin, count;
    };
    std::vector<Segment> segments;
    for (const TensorView& gradient : gradients) {
      const int64_t n = gradient.num_elements();
      for (int64_t begin = 0; begin < n; begin += kUnscaleSegment) {
        segments.push_back({&gradient, begin, std::min(kUnscaleSegment, n - begin)});
      }
    }
    std::vector<double> totals(segments.size(), 0.0);
    cpu::ParallelFor(0, static_cast<int64_t>(segments.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        SquareSums squares;
        UnscaleRange(*segments[i].gradient, segments[i].begin, segments[i].count, inverse,
                     squares);
        totals[i] = squares.Total(0);
      }
    });
    state->non_finite = 0;
    double sum_squares = 0.0;
    for (size_t i = 0; i < segments.size(); ++i) {
      state->non_finite |= std::isfinite(totals[i]) ? 0 : 1;
      sum_squares += totals[i];
    }
    state->sum_squares = sum_squares;  // DecideStep clears it when a value was not finite
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
        UpdateRange(options, update, w + begin, g + begin,
                    slot0 == nullptr ? nullptr : slot0 + begin,
                    slot1 == nullptr ? nullptr : slot1 + begin, end - begin);
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
