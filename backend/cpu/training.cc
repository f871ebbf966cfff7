// CPU kernels: training family (ops of graph/ops/training.cc), the
// ai.onnx.preview.training optimizers Adagrad, Adam and Momentum. Each node
// updates n tensors; inputs are R (scalar learning rate), T (int64 step
// count), then the groups X..., G..., [V...], [H...], and outputs the
// groups X_new..., then the state groups, in the order of the ONNX spec.
// The update rules are those of the ONNX reference implementation
// (onnx/reference/ops/aionnx_preview_training):
//
//   Adagrad:  r' = R / (1 + T * decay_factor);  g = norm_coefficient * x + G
//             h' = h + g^2;  x' = x - r' * g / (sqrt(h') + epsilon)
//   Adam:     g = norm_coefficient * x + G;  v' = alpha * v + (1 - alpha) * g
//             h' = beta * h + (1 - beta) * g^2
//             r' = T > 0 ? R * sqrt(1 - beta^T) / (1 - alpha^T) : R
//             x' = (1 - norm_coefficient_post) * (x - r' * v' / (sqrt(h') + epsilon))
//   Momentum: g = norm_coefficient * x + G;  b = T > 0 ? beta : 1
//             v' = alpha * v + b * g
//             standard: x' = x - R * v';  nesterov: x' = x - R * (g + alpha * v')
//
// Scalar coefficients are computed once in float64; the elementwise update
// runs in float32 for float32 tensors (float64 for float64). The per-element
// arithmetic is a plain function of scalars so a CUDA kernel can share it.
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/parallel.h"
#include "graph/op_registry.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// ---- Per-element update rules --------------------------------------------------

template <typename F>
struct AdagradCoefficients {
  F rate, norm_coefficient, epsilon;
};
template <typename F>
inline void AdagradStep(const AdagradCoefficients<F>& k, F x, F grad, F h, F* x_new, F* h_new) {
  const F g = k.norm_coefficient * x + grad;
  const F h2 = h + g * g;
  *h_new = h2;
  *x_new = x - k.rate * g / (std::sqrt(h2) + k.epsilon);
}

template <typename F>
struct AdamCoefficients {
  F rate, norm_coefficient, norm_coefficient_post, alpha, beta, epsilon;
};
template <typename F>
inline void AdamStep(const AdamCoefficients<F>& k, F x, F grad, F v, F h, F* x_new, F* v_new,
                     F* h_new) {
  const F g = k.norm_coefficient * x + grad;
  const F v2 = k.alpha * v + (F(1) - k.alpha) * g;
  const F h2 = k.beta * h + (F(1) - k.beta) * (g * g);
  *v_new = v2;
  *h_new = h2;
  *x_new = (F(1) - k.norm_coefficient_post) * (x - k.rate * (v2 / (std::sqrt(h2) + k.epsilon)));
}

template <typename F>
struct MomentumCoefficients {
  F rate, norm_coefficient, alpha, beta;
  bool nesterov;
};
template <typename F>
inline void MomentumStep(const MomentumCoefficients<F>& k, F x, F grad, F v, F* x_new, F* v_new) {
  const F g = k.norm_coefficient * x + grad;
  const F v2 = k.alpha * v + k.beta * g;
  *v_new = v2;
  *x_new = k.nesterov ? x - k.rate * (g + k.alpha * v2) : x - k.rate * v2;
}

// ---- Shared plumbing -----------------------------------------------------------

struct Scalars {
  double rate;
  int64_t step;
};

// Checks the input/output counts and dtypes of an optimizer node with
// `groups` input groups (after R and T) and `output_groups` output groups;
// reads R and T; returns n, the number of optimized tensors.
absl::StatusOr<int> CheckOptimizer(const KernelContext& ctx, int groups, int output_groups,
                                   Scalars* scalars) {
  const int tensors = ctx.num_inputs() - 2;
  if (tensors < groups || tensors % groups != 0) {
    return ctx.Error(
        absl::StrCat("has ", ctx.num_inputs(), " inputs; expected 2 + ", groups, " * n"));
  }
  const int n = tensors / groups;
  if (ctx.num_outputs() != output_groups * n) {
    return ctx.Error(absl::StrCat("has ", ctx.num_outputs(), " outputs; expected ",
                                  output_groups * n, " for ", n, " optimized tensors"));
  }
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
  }
  const TensorView& r = ctx.input(0);
  const TensorView& t = ctx.input(1);
  if (r.num_elements() != 1 || t.num_elements() != 1) {
    return ctx.Error("inputs R and T must hold one value each");
  }
  if (r.dtype == DType::kFloat32) {
    scalars->rate = *r.as<float>();
  } else if (r.dtype == DType::kFloat64) {
    scalars->rate = *r.as<double>();
  } else {
    return ctx.Error(
        absl::StrCat("input 0 (R) is ", DTypeName(r.dtype), "; expected float32 or float64"));
  }
  if (t.dtype != DType::kInt64) {
    return ctx.Error(absl::StrCat("input 1 (T) is ", DTypeName(t.dtype), "; expected int64"));
  }
  scalars->step = *t.as<int64_t>();
  const DType dtype = ctx.input(2).dtype;
  for (int t_index = 0; t_index < n; ++t_index) {
    const TensorView& x = ctx.input(2 + t_index);
    for (int g = 0; g < groups; ++g) {
      const TensorView& other = ctx.input(2 + g * n + t_index);
      if (other.dtype != dtype || other.dims != x.dims) {
        return ctx.Error(absl::StrCat("input ", 2 + g * n + t_index, " (", DTypeName(other.dtype),
                                      ", ", other.num_elements(),
                                      " elements) must have the dtype and shape of input ",
                                      2 + t_index, " (", DTypeName(x.dtype), ")"));
      }
    }
  }
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return ctx.Error(
        absl::StrCat("optimized tensors are ", DTypeName(dtype), "; expected float32 or float64"));
  }
  return n;
}

// Runs `step(i, inputs..., outputs...)` over the elements of tensor
// `t_index`: `in[g]` is group g's input, `out[o]` output group o's result.
template <typename F, int kIn, int kOut, typename StepFn>
absl::Status ForEachTensor(KernelContext& ctx, int n, const int (&output_input_group)[kOut],
                           StepFn step) {
  for (int t_index = 0; t_index < n; ++t_index) {
    const F* in[kIn];
    F* out[kOut];
    for (int g = 0; g < kIn; ++g) in[g] = ctx.input(2 + g * n + t_index).template as<F>();
    for (int o = 0; o < kOut; ++o) {
      const TensorView& like = ctx.input(2 + output_input_group[o] * n + t_index);
      CASTOR_ASSIGN_OR_RETURN(TensorView * view,
                              ctx.Output(o * n + t_index, like.dtype, like.dims));
      out[o] = view->as<F>();
    }
    const int64_t count = ctx.input(2 + t_index).num_elements();
    ParallelFor(0, count, 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) step(i, in, out);
    });
  }
  return absl::OkStatus();
}

// ---- Kernels -------------------------------------------------------------------

template <typename F>
absl::Status AdagradTyped(KernelContext& ctx, int n, const Scalars& s) {
  const double decay = ctx.GetFloat("decay_factor", 0.0f);
  const AdagradCoefficients<F> k{static_cast<F>(s.rate / (1.0 + s.step * decay)),
                                 static_cast<F>(ctx.GetFloat("norm_coefficient", 0.0f)),
                                 static_cast<F>(ctx.GetFloat("epsilon", 1e-6f))};
  constexpr int kOutputs[2] = {0, 2};  // X_new, H_new
  return ForEachTensor<F, 3, 2>(
      ctx, n, kOutputs, [&](int64_t i, const F* const* in, F* const* out) {
        AdagradStep(k, in[0][i], in[1][i], in[2][i], &out[0][i], &out[1][i]);
      });
}

absl::Status RunAdagrad(KernelContext& ctx) {
  Scalars s;
  CASTOR_ASSIGN_OR_RETURN(const int n, CheckOptimizer(ctx, 3, 2, &s));
  return ctx.input(2).dtype == DType::kFloat64 ? AdagradTyped<double>(ctx, n, s)
                                               : AdagradTyped<float>(ctx, n, s);
}

template <typename F>
absl::Status AdamTyped(KernelContext& ctx, int n, const Scalars& s) {
  const double alpha = ctx.GetFloat("alpha", 0.9f);
  const double beta = ctx.GetFloat("beta", 0.999f);
  double rate = s.rate;
  if (s.step > 0) {
    const double t = static_cast<double>(s.step);
    rate = s.rate * std::sqrt(1.0 - std::pow(beta, t)) / (1.0 - std::pow(alpha, t));
  }
  const AdamCoefficients<F> k{static_cast<F>(rate),
                              static_cast<F>(ctx.GetFloat("norm_coefficient", 0.0f)),
                              static_cast<F>(ctx.GetFloat("norm_coefficient_post", 0.0f)),
                              static_cast<F>(alpha),
                              static_cast<F>(beta),
                              static_cast<F>(ctx.GetFloat("epsilon", 1e-6f))};
  constexpr int kOutputs[3] = {0, 2, 3};  // X_new, V_new, H_new
  return ForEachTensor<F, 4, 3>(
      ctx, n, kOutputs, [&](int64_t i, const F* const* in, F* const* out) {
        AdamStep(k, in[0][i], in[1][i], in[2][i], in[3][i], &out[0][i], &out[1][i], &out[2][i]);
      });
}

absl::Status RunAdam(KernelContext& ctx) {
  Scalars s;
  CASTOR_ASSIGN_OR_RETURN(const int n, CheckOptimizer(ctx, 4, 3, &s));
  return ctx.input(2).dtype == DType::kFloat64 ? AdamTyped<double>(ctx, n, s)
                                               : AdamTyped<float>(ctx, n, s);
}

template <typename F>
absl::Status MomentumTyped(KernelContext& ctx, int n, const Scalars& s, bool nesterov) {
  const MomentumCoefficients<F> k{
      static_cast<F>(s.rate), static_cast<F>(ctx.GetFloat("norm_coefficient", 0.0f)),
      static_cast<F>(ctx.GetFloat("alpha", 0.0f)),
      // The gradient's coefficient is 1 on the first step (T == 0).
      s.step > 0 ? static_cast<F>(ctx.GetFloat("beta", 0.0f)) : F(1), nesterov};
  constexpr int kOutputs[2] = {0, 2};  // X_new, V_new
  return ForEachTensor<F, 3, 2>(
      ctx, n, kOutputs, [&](int64_t i, const F* const* in, F* const* out) {
        MomentumStep(k, in[0][i], in[1][i], in[2][i], &out[0][i], &out[1][i]);
      });
}

absl::Status RunMomentum(KernelContext& ctx) {
  const std::string mode = ctx.GetString("mode", "");
  if (mode != "standard" && mode != "nesterov") {
    return ctx.Error(absl::StrCat("mode \"", mode, "\" is not \"standard\" or \"nesterov\""));
  }
  for (const char* name : {"alpha", "beta", "norm_coefficient"}) {
    if (!ctx.node().has_attribute(name)) {
      return ctx.Error(absl::StrCat("attribute '", name, "' is required"));
    }
  }
  Scalars s;
  CASTOR_ASSIGN_OR_RETURN(const int n, CheckOptimizer(ctx, 3, 2, &s));
  const bool nesterov = mode == "nesterov";
  return ctx.input(2).dtype == DType::kFloat64 ? MomentumTyped<double>(ctx, n, s, nesterov)
                                               : MomentumTyped<float>(ctx, n, s, nesterov);
}

}  // namespace

void RegisterTrainingKernels(KernelTable& table) {
  const SupportsFn float32_or_64 = FloatDTypesIn({DType::kFloat32, DType::kFloat64});
  table.Register(KernelDef{kTrainingDomain, "Adagrad", float32_or_64, RunAdagrad, false});
  table.Register(KernelDef{kTrainingDomain, "Adam", float32_or_64, RunAdam, false});
  table.Register(KernelDef{kTrainingDomain, "Momentum", float32_or_64, RunMomentum, false});
}

}  // namespace castor::cpu
