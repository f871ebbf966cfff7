// CPU kernels: softmax family (ops of graph/ops/softmax.cc).
//
// Softmax and LogSoftmax. Before opset 13 the input is coerced to 2-D
// [prod(dims[:axis]), prod(dims[axis:])] (axis default 1) and each row is
// normalised as a whole; from opset 13 the normalisation runs along the one
// axis `axis` (default -1). Both become (outer, n, inner): `n` values with
// stride `inner`. Each line subtracts its maximum before exp (no overflow for
// large inputs), computes in float32 (float64 for float64 inputs) and rounds
// once on store. float32 exp is elementwise_math.h's vectorizable ExpFloat;
// lines along the last axis (inner == 1) get their own contiguous loops.
// The gradients SoftmaxGrad and LogSoftmaxGrad (com.castor, formulas in
// graph/ops/gradient_ops.cc) run per line in float32 too.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/elementwise_math.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gradient_util.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vector_clones.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// Columns of the inner dimension one task handles at a time.
constexpr int64_t kColumnBlock = 64;

// e^x in the compute type: the vectorizable float32 exp of
// elementwise_math.h, std::exp for float64.
template <typename V>
inline V ExpOf(V x) {
  if constexpr (std::is_same_v<V, float>) {
    return math::ExpFloat(x);
  } else {
    return std::exp(x);
  }
}

// Lines of one block of SoftmaxLinesInto: about this many values.
constexpr int64_t kLineBlockValues = 1024;

// Softmax / LogSoftmax of `count` lines of n contiguous values (inner == 1,
// the common last-axis case), a block of whole lines at a time: each line's
// max and x - max into `e`; then e^ over the block as one flat loop (short
// lines, like attention's 28 tokens, vectorize across line ends instead of
// each leaving a scalar tail); then each line's sum (four partial sums) and
// the normalised values. The max may skip a NaN, but the NaN then reaches
// the sum, so the line is NaN either way, as with a NaN-propagating max.
// `e` holds block_lines * n values, `maxima` block_lines.
template <bool kLog, typename T, typename V>
[[gnu::always_inline]] inline void SoftmaxLinesInto(const T* in, T* out, int64_t count, int64_t n,
                                                    int64_t block_lines, V* e, V* maxima) {
  for (int64_t first = 0; first < count; first += block_lines) {
    const int64_t lines = std::min(block_lines, count - first);
    const T* x = in + first * n;
    T* y = out + first * n;
    for (int64_t line = 0; line < lines; ++line) {
      const T* row = x + line * n;
      V line_max = Load(row[0]);
      for (int64_t i = 1; i < n; ++i) {
        const V v = Load(row[i]);
        line_max = v > line_max ? v : line_max;
      }
      maxima[line] = line_max;
      V* shifted = e + line * n;
      for (int64_t i = 0; i < n; ++i) shifted[i] = Load(row[i]) - line_max;
    }
    const int64_t values = lines * n;
    for (int64_t i = 0; i < values; ++i) e[i] = ExpOf(e[i]);
    for (int64_t line = 0; line < lines; ++line) {
      const V* exps = e + line * n;
      V partial[4] = {0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        for (int j = 0; j < 4; ++j) partial[j] += exps[i + j];
      }
      for (; i < n; ++i) partial[0] += exps[i];
      const V sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
      const T* row = x + line * n;
      T* result = y + line * n;
      if constexpr (kLog) {
        for (int64_t k = 0; k < n; ++k) {
          Store(&result[k], math::LogSoftmaxValue(Load(row[k]), maxima[line], sum));
        }
      } else {
        for (int64_t k = 0; k < n; ++k) Store(&result[k], exps[k] / sum);
      }
    }
  }
}

// The float32 lines, built for AVX-512, AVX2 and the baseline
// (vector_clones.h: ExpFloat and the explicit partial sums give the same
// bits in every clone). At the baseline's four lanes the exp of the
// transformer's attention softmax was 5% of its training step.
CASTOR_VECTOR_CLONES
void SoftmaxLinesFloat32(const float* in, float* out, int64_t count, int64_t n,
                         int64_t block_lines, float* e, float* maxima) {
  SoftmaxLinesInto<false>(in, out, count, n, block_lines, e, maxima);
}

CASTOR_VECTOR_CLONES
void LogSoftmaxLinesFloat32(const float* in, float* out, int64_t count, int64_t n,
                            int64_t block_lines, float* e, float* maxima) {
  SoftmaxLinesInto<true>(in, out, count, n, block_lines, e, maxima);
}

template <bool kLog, typename T, typename V>
void SoftmaxLines(const T* in, T* out, int64_t count, int64_t n) {
  const int64_t block_lines = std::clamp<int64_t>(kLineBlockValues / n, 1, count);
  std::vector<V> e(static_cast<size_t>(block_lines * n));
  std::vector<V> maxima(static_cast<size_t>(block_lines));
  if constexpr (std::is_same_v<T, float>) {
    (kLog ? LogSoftmaxLinesFloat32 : SoftmaxLinesFloat32)(in, out, count, n, block_lines,
                                                          e.data(), maxima.data());
  } else {
    SoftmaxLinesInto<kLog>(in, out, count, n, block_lines, e.data(), maxima.data());
  }
}

template <bool kLog>
absl::Status SoftmaxKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(const common::SoftmaxGeometry lines, common::PlanSoftmax(ctx, x.dims));
  const int64_t outer = lines.outer, n = lines.n, inner = lines.inner;
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
  if (!y.ok()) return y.status();
  if (outer * n * inner == 0) return absl::OkStatus();

  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ComputeType<T>;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    if (inner == 1) {
      ParallelFor(0, outer, std::max<int64_t>(1, kElementwiseGrain / n),
                  [&](int64_t lo, int64_t hi) {
                    SoftmaxLines<kLog, T, V>(xp + lo * n, yp + lo * n, hi - lo, n);
                  });
      return;
    }
    const int64_t blocks_per_outer = (inner + kColumnBlock - 1) / kColumnBlock;
    const int64_t tasks = outer * blocks_per_outer;
    const int64_t work_per_task = n * std::min(inner, kColumnBlock);
    ParallelFor(0, tasks, std::max<int64_t>(1, kElementwiseGrain / work_per_task),
                [&](int64_t lo, int64_t hi) {
                  std::vector<V> shifted;  // x - max, then exp(x - max) for Softmax
                  std::vector<V> line_max, line_sum;
                  for (int64_t task = lo; task < hi; ++task) {
                    const int64_t o = task / blocks_per_outer;
                    const int64_t k0 = (task % blocks_per_outer) * kColumnBlock;
                    const int64_t width = std::min(kColumnBlock, inner - k0);
                    const T* in = xp + o * n * inner + k0;
                    T* out = yp + o * n * inner + k0;
                    line_max.assign(width, -std::numeric_limits<V>::infinity());
                    line_sum.assign(width, V(0));
                    shifted.resize(static_cast<size_t>(n * width));
                    for (int64_t i = 0; i < n; ++i) {
                      for (int64_t k = 0; k < width; ++k) {
                        line_max[k] = math::MaxOp()(line_max[k], Load(in[i * inner + k]));
                      }
                    }
                    for (int64_t i = 0; i < n; ++i) {
                      for (int64_t k = 0; k < width; ++k) {
                        const V e = ExpOf(Load(in[i * inner + k]) - line_max[k]);
                        shifted[i * width + k] = e;
                        line_sum[k] += e;
                      }
                    }
                    for (int64_t i = 0; i < n; ++i) {
                      for (int64_t k = 0; k < width; ++k) {
                        if constexpr (kLog) {
                          Store(&out[i * inner + k],
                                math::LogSoftmaxValue(Load(in[i * inner + k]), line_max[k],
                                                      line_sum[k]));
                        } else {
                          Store(&out[i * inner + k], shifted[i * width + k] / line_sum[k]);
                        }
                      }
                    }
                  }
                });
  });
  if (!ok) {
    return ctx.Unimplemented(absl::StrCat("input 0 has dtype ", DTypeName(x.dtype),
                                          ", which this kernel lacks"));
  }
  return absl::OkStatus();
}

// ---- SoftmaxGrad / LogSoftmaxGrad --------------------------------------------

template <bool kLog>
absl::Status SoftmaxGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& y = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::SoftmaxGeometry geometry, common::PlanSoftmaxGrad(ctx));
  const int64_t outer = geometry.outer, n = geometry.n, inner = geometry.inner;
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, y.dtype, y.dims));
  DispatchFloat(y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    const T* yp = y.as<T>();
    T* dxp = dx->as<T>();
    const int64_t lines = outer * inner;
    ParallelFor(0, lines, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, n)),
                [&](int64_t lo, int64_t hi) {
                  for (int64_t line = lo; line < hi; ++line) {
                    const int64_t base = (line / inner) * n * inner + line % inner;
                    float sum = 0;
                    for (int64_t k = 0; k < n; ++k) {
                      const int64_t i = base + k * inner;
                      sum += kLog ? LoadF(dyp[i]) : LoadF(dyp[i]) * LoadF(yp[i]);
                    }
                    for (int64_t k = 0; k < n; ++k) {
                      const int64_t i = base + k * inner;
                      const float yv = LoadF(yp[i]);
                      const float g = LoadF(dyp[i]);
                      StoreF(&dxp[i], kLog ? g - std::exp(yv) * sum : yv * (g - sum));
                    }
                  }
                });
  });
  return absl::OkStatus();
}
}  // namespace

void RegisterSoftmaxKernels(KernelTable& table) {
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                     DType::kFloat64};
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    KernelDef def;
    def.op_type = op;
    def.supports = InputDTypeIn(0, floats);
    def.run = std::string(op) == "Softmax" ? &SoftmaxKernel<false> : &SoftmaxKernel<true>;
    // Each line is read completely before any of it is written.
    def.in_place_ok = true;
    table.Register(std::move(def));
  }
  RegisterGradientKernel(table, "SoftmaxGrad", SoftmaxGradKernel<false>);
  RegisterGradientKernel(table, "LogSoftmaxGrad", SoftmaxGradKernel<true>);
}

}  // namespace castor::cpu
