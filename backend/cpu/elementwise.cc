// CPU kernels: elementwise family (ops of graph/ops/elementwise.cc).
//
// Unary math/activations (Neg Abs Sign Floor Ceil Round Relu LeakyRelu
// HardSigmoid HardSwish Elu Selu Celu Softplus Softsign ThresholdedRelu Mish
// Sigmoid Tanh Gelu Erf Exp Log Sqrt Reciprocal, the trigonometric Sin Cos
// Tan Asin Acos Atan and hyperbolic Sinh Cosh Asinh Acosh Atanh), PRelu (a slope broadcast to
// X), binary arithmetic with numpy broadcasting (Add Sub Mul Div Mod, Pow
// with a base and exponent of different dtypes), the comparisons Equal Less
// Greater LessOrEqual GreaterOrEqual (bool out), the logic And Or Xor Not,
// IsNaN/IsInf, the variadic Max/Min/Sum, Where and Clip. The scalar
// arithmetic of each op lives in backend/common/elementwise_math.h (shared
// with CUDA); this file loads, broadcasts and stores. 16-bit floats compute
// in float32 and round once on store (unary ops and same-dtype binary ops
// widen and narrow them in blocks with float_io.h's vectorized bulk
// conversions, and the float32 unary loop is built per instruction set,
// vector_clones.h; Add Sub Mul Div run fused on AVX-512, simd16.h); float64
// computes in double; integers in their own type (wrapping). Broadcast
// iteration is backend/cpu/broadcast.h, split across threads in chunks of
// kElementwiseGrain elements; a run where an input is dense or a single
// broadcast value gets its own tight loop. ReluGrad (com.castor,
// graph/ops/gradient_ops.cc) passes dY where Y > 0; GeluGrad (com.castor)
// is dY * Gelu'(X) in one float32 pass; castor's Gelu (com.castor, any
// opset) runs as ONNX's.
#include <algorithm>
#include <cstring>
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
#include "backend/cpu/simd16.h"
#include "backend/cpu/vector_clones.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                        DType::kFloat64};
const std::vector<DType> kIntTypes = {DType::kInt8,  DType::kInt16,  DType::kInt32,
                                      DType::kInt64, DType::kUInt8,  DType::kUInt16,
                                      DType::kUInt32, DType::kUInt64};

std::vector<DType> Join(std::vector<DType> a, const std::vector<DType>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

absl::Status UnsupportedDType(const KernelContext& ctx, int input, DType dtype) {
  return ctx.Unimplemented(
      absl::StrCat("input ", input, " has dtype ", DTypeName(dtype), ", which this kernel lacks"));
}

// ---- unary ----

// y[i] = op(x[i]) in float32 (y may be x), built for AVX-512, AVX2 and the
// baseline (vector_clones.h): ops written as branch-free float code
// (ErfFloat, Relu's compare) vectorise, with the same bits in every clone.
template <typename Op>
CASTOR_VECTOR_CLONES void UnaryFloat32(const Op& op, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(op(x[i]));
}

// y[i] = op(x[i]); floats always, integers when kIntegers.
template <bool kIntegers, typename Op>
absl::Status RunUnary(KernelContext& ctx, const Op& op) {
  const TensorView& x = ctx.input(0);
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, x.dims);
  if (!y.ok()) return y.status();
  const int64_t n = x.num_elements();
  auto body = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.as<T>();
    T* yp = (*y)->as<T>();
    ParallelFor(0, n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kIsFloat16Storage<T>) {
        // Widen a block, compute in float32, narrow once (in place is fine:
        // a block is read before it is written).
        float buffer[kFloatConvertBlock];
        for (int64_t i = lo; i < hi; i += kFloatConvertBlock) {
          const int64_t m = std::min(kFloatConvertBlock, hi - i);
          ToFloat32(xp + i, buffer, m);
          UnaryFloat32(op, buffer, buffer, m);
          FromFloat32(buffer, yp + i, m);
        }
      } else if constexpr (std::is_same_v<T, float>) {
        UnaryFloat32(op, xp + lo, yp + lo, hi - lo);
      } else {
        for (int64_t i = lo; i < hi; ++i) Store(&yp[i], op(Load(xp[i])));
      }
    });
  };
  bool ok = DispatchFloat(x.dtype, body);
  if constexpr (kIntegers) ok = ok || DispatchInteger(x.dtype, body);
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 0, x.dtype);
}

template <typename Op, bool kIntegers>
absl::Status UnaryKernel(KernelContext& ctx) {
  return RunUnary<kIntegers>(ctx, Op{});
}

// Relu: 16-bit floats on their bit patterns (the same results as widening:
// x <= 0 ? +0 : x keeps positives, +inf and NaNs, and gives +0 for -0 and
// the negatives), a select the loop vectorizes; the rest as RunUnary.
absl::Status ReluKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dtype != DType::kBFloat16 && x.dtype != DType::kFloat16) {
    return RunUnary<true>(ctx, math::ReluOp{});
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  const uint16_t infinity = x.dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00;
  const uint16_t* xp = static_cast<const uint16_t*>(x.data);
  uint16_t* yp = static_cast<uint16_t*>(y->data);
  ParallelFor(0, x.num_elements(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const uint16_t b = xp[i];
      // In (+0, +inf]: bits 1 to +inf's; NaN: magnitude bits above inf's.
      const bool kept = static_cast<uint16_t>(b - 1u) < infinity ||
                        static_cast<uint16_t>(b & 0x7fffu) > infinity;
      yp[i] = kept ? b : 0;
    }
  });
  return absl::OkStatus();
}

absl::Status LeakyReluKernel(KernelContext& ctx) {
  return RunUnary<false>(ctx, math::LeakyReluOp{ctx.GetFloat("alpha", 0.01f)});
}

// Not: bool in, bool out.
absl::Status NotKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dtype != DType::kBool) {
    return ctx.Error(absl::StrCat("input 0 is ", DTypeName(x.dtype), "; expected bool"));
  }
  absl::StatusOr<TensorView*> y = ctx.Output(0, DType::kBool, x.dims);
  if (!y.ok()) return y.status();
  const bool* xp = x.as<bool>();
  bool* yp = (*y)->as<bool>();
  ParallelFor(0, x.num_elements(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) yp[i] = math::NotOp{}(xp[i]);
  });
  return absl::OkStatus();
}

// IsNaN, IsInf: float in, bool out.
template <typename Op>
absl::Status RunPredicate(KernelContext& ctx, const Op& op) {
  const TensorView& x = ctx.input(0);
  absl::StatusOr<TensorView*> y = ctx.Output(0, DType::kBool, x.dims);
  if (!y.ok()) return y.status();
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.as<T>();
    bool* yp = (*y)->as<bool>();
    ParallelFor(0, x.num_elements(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) yp[i] = op(Load(xp[i]));
    });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 0, x.dtype);
}

absl::Status IsNanKernel(KernelContext& ctx) { return RunPredicate(ctx, math::IsNanOp{}); }

absl::Status IsInfKernel(KernelContext& ctx) {
  return RunPredicate(ctx, math::IsInfOp{ctx.GetInt("detect_negative", 1) != 0,
                                         ctx.GetInt("detect_positive", 1) != 0});
}

absl::Status EluKernel(KernelContext& ctx) {
  return RunUnary<false>(ctx, math::EluOp{ctx.GetFloat("alpha", 1.0f)});
}

absl::Status SeluKernel(KernelContext& ctx) {
  const math::SeluOp defaults;
  return RunUnary<false>(ctx, math::SeluOp{ctx.GetFloat("alpha", defaults.alpha),
                                           ctx.GetFloat("gamma", defaults.gamma)});
}

absl::Status CeluKernel(KernelContext& ctx) {
  return RunUnary<false>(ctx, math::CeluOp{ctx.GetFloat("alpha", 1.0f)});
}

absl::Status ThresholdedReluKernel(KernelContext& ctx) {
  return RunUnary<false>(ctx, math::ThresholdedReluOp{ctx.GetFloat("alpha", 1.0f)});
}

absl::Status HardSigmoidKernel(KernelContext& ctx) {
  return RunUnary<false>(
      ctx, math::HardSigmoidOp{ctx.GetFloat("alpha", 0.2f), ctx.GetFloat("beta", 0.5f)});
}

// GeluOp with its form fixed at compile time, so the exact (erf) form's
// float32 loop has no branch on it and vectorizes.
template <bool kTanh>
struct GeluForm {
  template <typename V>
  V operator()(V x) const {
    return math::GeluOp{kTanh}(x);
  }
};

absl::Status GeluKernel(KernelContext& ctx) {
  const std::string approximate = ctx.GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return ctx.Error(absl::StrCat("attribute 'approximate' is \"", approximate,
                                  "\"; expected \"none\" or \"tanh\""));
  }
  return approximate == "tanh" ? RunUnary<false>(ctx, GeluForm<true>{})
                               : RunUnary<false>(ctx, GeluForm<false>{});
}

// Clip: bounds from the float attributes min/max before opset 11, from the
// optional scalar inputs 1 and 2 (x's dtype) after; absent bounds are the
// dtype's extremes (+-inf for floats).
absl::Status ClipKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (absl::Status s = common::CheckClipBounds(ctx); !s.ok()) return s;
  absl::Status status;
  auto body = [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = ComputeType<T>;
    V low = std::numeric_limits<V>::lowest();
    V high = std::numeric_limits<V>::max();
    if constexpr (std::is_floating_point_v<V>) {
      low = -std::numeric_limits<V>::infinity();
      high = std::numeric_limits<V>::infinity();
    }
    if (ctx.opset() < 11) {
      if (ctx.node().has_attribute("min")) low = static_cast<V>(ctx.GetFloat("min", 0.0f));
      if (ctx.node().has_attribute("max")) high = static_cast<V>(ctx.GetFloat("max", 0.0f));
    } else {
      if (ctx.has_input(1)) low = Load(ctx.input(1).as<T>()[0]);
      if (ctx.has_input(2)) high = Load(ctx.input(2).as<T>()[0]);
    }
    status = RunUnary<true>(ctx, math::ClipOp<V>{low, high});
  };
  if (!DispatchNumeric(x.dtype, body)) return UnsupportedDType(ctx, 0, x.dtype);
  return status;
}

// ---- binary ----

#if defined(CASTOR_SIMD16_X86)
// The arithmetic ops on 16 float32 lanes: the same IEEE operation per lane
// as the scalar op.
template <typename Op>
inline constexpr bool kHasVectorOp =
    std::is_same_v<Op, math::AddOp> || std::is_same_v<Op, math::SubOp> ||
    std::is_same_v<Op, math::MulOp> || std::is_same_v<Op, math::DivOp>;

template <typename Op>
CASTOR_SIMD16_TARGET inline __m512 VectorOp(__m512 a, __m512 b) {
  if constexpr (std::is_same_v<Op, math::AddOp>) return _mm512_add_ps(a, b);
  if constexpr (std::is_same_v<Op, math::SubOp>) return _mm512_sub_ps(a, b);
  if constexpr (std::is_same_v<Op, math::MulOp>) return _mm512_mul_ps(a, b);
  if constexpr (std::is_same_v<Op, math::DivOp>) return _mm512_div_ps(a, b);
}

// One broadcast run of a 16-bit arithmetic op, fused: 16 lanes are widened,
// computed and rounded in registers (each input dense, step 1, or a single
// value, step 0). The same bits as Load/op/Store per element (see
// BinaryLoop16 for the one exception).
template <typename Op, typename T>
CASTOR_SIMD16_TARGET void FusedRun16(const T* a, int64_t step_a, const T* b, int64_t step_b,
                                     T* out, int64_t count) {
  int64_t j = 0;
  if constexpr (std::is_same_v<T, BFloat16>) {
    // Two dense bfloat16 inputs: 32 lanes a step (simd16.h's LoadWidened32,
    // whose order StoreRounded32 undoes; an output that is an input is read
    // whole before it is written).
    if (step_a == 1 && step_b == 1) {
      for (; j + 32 <= count; j += 32) {
        __m512 a_lo, a_hi, b_lo, b_hi;
        LoadWidened32(a + j, a_lo, a_hi);
        LoadWidened32(b + j, b_lo, b_hi);
        StoreRounded32(out + j, VectorOp<Op>(a_lo, b_lo), VectorOp<Op>(a_hi, b_hi));
      }
    }
  }
  const __m512 scalar_a = _mm512_set1_ps(LoadF(*a)), scalar_b = _mm512_set1_ps(LoadF(*b));
  for (; j < count; j += 16) {
    const __mmask16 lanes = TailMask(count - j);
    const __m512 va = step_a == 1 ? LoadWidened(a + j, lanes) : scalar_a;
    const __m512 vb = step_b == 1 ? LoadWidened(b + j, lanes) : scalar_b;
    StoreRounded(out + j, lanes, VectorOp<Op>(va, vb));
  }
  _mm256_zeroupper();  // the callers are SSE code (see float_io.cc's kZeroUpperNote)
}
#endif

// BinaryLoop for float16/bfloat16 inputs and output: Add/Sub/Mul/Div run
// fused (FusedRun16) where the CPU has AVX-512; otherwise each run goes in
// blocks that are widened to float32 scratch with the bulk conversion,
// computed in float32 and narrowed once. Either way the same bits as
// Load/fn/Store per element, except one case: when both inputs of an Add
// or Mul are NaN, which payload (and sign) the result keeps follows the
// operand order the compiler chose for the commutative instruction, which
// may differ between the paths (x86 returns the first operand's NaN).
template <typename T, typename Fn>
void BinaryLoop16(const BroadcastPlan& plan, const T* a, const T* b, T* out, const Fn& fn) {
#if defined(CASTOR_SIMD16_X86)
  if constexpr (kHasVectorOp<Fn>) {
    if (UseFusedSimd16()) {
      ParallelForEachRun(plan, [&](int64_t o, const int64_t* in, int64_t count,
                                   const int64_t* step) {
        FusedRun16<Fn>(a + in[0], step[0], b + in[1], step[1], out + o, count);
      });
      return;
    }
  }
#endif
  ParallelForEachRun(plan, [&](int64_t o, const int64_t* in, int64_t count, const int64_t* step) {
    const T* pa = a + in[0];
    const T* pb = b + in[1];
    T* po = out + o;
    if (step[0] == 0 && step[1] == 0) {
      T v;
      StoreF(&v, static_cast<float>(fn(LoadF(*pa), LoadF(*pb))));
      for (int64_t j = 0; j < count; ++j) po[j] = v;
      return;
    }
    float va[kFloatConvertBlock], vb[kFloatConvertBlock];
    const float scalar_a = LoadF(*pa), scalar_b = LoadF(*pb);
    for (int64_t j0 = 0; j0 < count; j0 += kFloatConvertBlock) {
      const int64_t m = std::min(kFloatConvertBlock, count - j0);
      if (step[0] == 1) ToFloat32(pa + j0, va, m);
      if (step[1] == 1) ToFloat32(pb + j0, vb, m);
      if (step[0] == 1 && step[1] == 1) {
        for (int64_t j = 0; j < m; ++j) va[j] = static_cast<float>(fn(va[j], vb[j]));
      } else if (step[0] == 1) {
        for (int64_t j = 0; j < m; ++j) va[j] = static_cast<float>(fn(va[j], scalar_b));
      } else {
        for (int64_t j = 0; j < m; ++j) va[j] = static_cast<float>(fn(scalar_a, vb[j]));
      }
      FromFloat32(va, po + j0, m);
    }
  });
}

// out = fn(a, b) over a two-input broadcast plan. Within a run each input's
// step is 1 (dense) or 0 (one broadcast value).
template <typename TA, typename TB, typename TO, typename Fn>
void BinaryLoop(const BroadcastPlan& plan, const TA* a, const TB* b, TO* out, const Fn& fn) {
  if constexpr (kIsFloat16Storage<TA> && std::is_same_v<TA, TB> && std::is_same_v<TA, TO>) {
    BinaryLoop16(plan, a, b, out, fn);
  } else {
    ParallelForEachRun(plan, [&](int64_t o, const int64_t* in, int64_t count, const int64_t* step) {
      const TA* pa = a + in[0];
      const TB* pb = b + in[1];
      TO* po = out + o;
      if (step[0] == 1 && step[1] == 1) {
        for (int64_t j = 0; j < count; ++j) Store(&po[j], fn(Load(pa[j]), Load(pb[j])));
      } else if (step[0] == 1) {
        const auto vb = Load(*pb);
        for (int64_t j = 0; j < count; ++j) Store(&po[j], fn(Load(pa[j]), vb));
      } else if (step[1] == 1) {
        const auto va = Load(*pa);
        for (int64_t j = 0; j < count; ++j) Store(&po[j], fn(va, Load(pb[j])));
      } else {
        const auto v = fn(Load(*pa), Load(*pb));
        for (int64_t j = 0; j < count; ++j) Store(&po[j], v);
      }
    });
  }
}

absl::StatusOr<BroadcastPlan> PlanInputs(const KernelContext& ctx, int first, int count) {
  std::vector<std::vector<int64_t>> dims;
  for (int i = first; i < first + count; ++i) dims.push_back(ctx.input(i).dims);
  absl::StatusOr<BroadcastPlan> plan = MakeBroadcastPlan(dims);
  if (!plan.ok()) return ctx.Error(std::string(plan.status().message()));
  return plan;
}

// Add, Sub, Mul, Div, Mod: floats and integers, output the inputs' dtype.
template <typename Op>
absl::Status RunArithmetic(KernelContext& ctx, const Op& op) {
  if (absl::Status s = common::RequireSameDType(ctx, 0, 1); !s.ok()) return s;
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, 2);
  if (!plan.ok()) return plan.status();
  const TensorView& a = ctx.input(0);
  absl::StatusOr<TensorView*> out = ctx.Output(0, a.dtype, plan->out_dims);
  if (!out.ok()) return out.status();
  const bool ok = DispatchNumeric(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    BinaryLoop(*plan, a.as<T>(), ctx.input(1).as<T>(), (*out)->as<T>(), op);
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 0, a.dtype);
}

template <typename Op>
absl::Status ArithmeticKernel(KernelContext& ctx) {
  return RunArithmetic(ctx, Op{});
}

absl::Status ModKernel(KernelContext& ctx) {
  const int64_t fmod = ctx.GetInt("fmod", 0);
  if (fmod != 0 && fmod != 1) {
    return ctx.Error(absl::StrCat("attribute 'fmod' is ", fmod, "; expected 0 or 1"));
  }
  return RunArithmetic(ctx, math::ModOp{fmod == 1});
}

// Equal, Less, Greater, LessOrEqual, GreaterOrEqual: any numeric dtype (or
// bool) in, bool out. Floats compare by value (+0 == -0; NaN compares
// false, so NaN != NaN).
template <typename Op>
absl::Status CompareKernel(KernelContext& ctx) {
  if (absl::Status s = common::RequireSameDType(ctx, 0, 1); !s.ok()) return s;
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, 2);
  if (!plan.ok()) return plan.status();
  const TensorView& a = ctx.input(0);
  absl::StatusOr<TensorView*> out = ctx.Output(0, DType::kBool, plan->out_dims);
  if (!out.ok()) return out.status();
  const bool ok = DispatchNumericOrBool(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    BinaryLoop(*plan, a.as<T>(), ctx.input(1).as<T>(), (*out)->as<bool>(), Op{});
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 0, a.dtype);
}

// And, Or, Xor: bool in, bool out.
template <typename Op>
absl::Status LogicKernel(KernelContext& ctx) {
  for (int i : {0, 1}) {
    if (ctx.input(i).dtype != DType::kBool) {
      return ctx.Error(absl::StrCat("input ", i, " is ", DTypeName(ctx.input(i).dtype),
                                    "; expected bool"));
    }
  }
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, 2);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<TensorView*> out = ctx.Output(0, DType::kBool, plan->out_dims);
  if (!out.ok()) return out.status();
  BinaryLoop(*plan, ctx.input(0).as<bool>(), ctx.input(1).as<bool>(), (*out)->as<bool>(), Op{});
  return absl::OkStatus();
}

// Pow: base float or int32/int64, exponent any numeric dtype; output the
// base's dtype.
absl::Status PowKernel(KernelContext& ctx) {
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, 2);
  if (!plan.ok()) return plan.status();
  const TensorView& base = ctx.input(0);
  const TensorView& exponent = ctx.input(1);
  absl::StatusOr<TensorView*> out = ctx.Output(0, base.dtype, plan->out_dims);
  if (!out.ok()) return out.status();
  bool exponent_ok = true;
  auto with_base = [&](auto base_tag) {
    using TB = typename decltype(base_tag)::type;
    exponent_ok = DispatchNumeric(exponent.dtype, [&](auto exponent_tag) {
      using TE = typename decltype(exponent_tag)::type;
      BinaryLoop(*plan, base.as<TB>(), exponent.as<TE>(), (*out)->as<TB>(), math::PowOp{});
    });
  };
  bool base_ok = DispatchFloat(base.dtype, with_base);
  if (!base_ok && base.dtype == DType::kInt32) {
    with_base(TypeTag<int32_t>{});
    base_ok = true;
  } else if (!base_ok && base.dtype == DType::kInt64) {
    with_base(TypeTag<int64_t>{});
    base_ok = true;
  }
  if (!base_ok) return UnsupportedDType(ctx, 0, base.dtype);
  if (!exponent_ok) return UnsupportedDType(ctx, 1, exponent.dtype);
  return absl::OkStatus();
}

// PRelu: X and a slope that broadcasts to X's shape; output X's shape.
absl::Status PReluKernel(KernelContext& ctx) {
  if (absl::Status s = common::RequireSameDType(ctx, 0, 1); !s.ok()) return s;
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, 2);
  if (!plan.ok()) return plan.status();
  const TensorView& x = ctx.input(0);
  if (plan->out_dims != x.dims) {
    return ctx.Error(absl::StrCat("slope ", common::DimsToString(ctx.input(1).dims),
                                  " must broadcast to X ", common::DimsToString(x.dims),
                                  " without growing it (unidirectional)"));
  }
  absl::StatusOr<TensorView*> out = ctx.Output(0, x.dtype, x.dims);
  if (!out.ok()) return out.status();
  const bool ok = DispatchNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    BinaryLoop(*plan, x.as<T>(), ctx.input(1).as<T>(), (*out)->as<T>(), math::PReluOp{});
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 0, x.dtype);
}

// ---- variadic ----

// Max, Min, Sum of one or more broadcast inputs; accumulates in the compute
// type and rounds once.
template <typename Op>
absl::Status VariadicKernel(KernelContext& ctx) {
  const int n = ctx.num_inputs();
  if (n < 1) return ctx.Error("needs at least one input");
  for (int i = 0; i < n; ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
  }
  if (absl::Status s = common::RequireSameDType(ctx, 0, n - 1); !s.ok()) return s;
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, n);
  if (!plan.ok()) return plan.status();
  const DType dtype = ctx.input(0).dtype;
  absl::StatusOr<TensorView*> out = ctx.Output(0, dtype, plan->out_dims);
  if (!out.ok()) return out.status();
  const bool ok = DispatchNumeric(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* y = (*out)->as<T>();
    if (n == 1) {
      const T* x = ctx.input(0).as<T>();
      if (x != y) std::memmove(y, x, (*out)->byte_size());
      return;
    }
    if (n == 2) {
      BinaryLoop(*plan, ctx.input(0).as<T>(), ctx.input(1).as<T>(), y, Op{});
      return;
    }
    std::vector<const T*> x(n);
    for (int i = 0; i < n; ++i) x[i] = ctx.input(i).as<T>();
    const Op op;
    if constexpr (kIsFloat16Storage<T>) {
      // Blocks of float32 accumulators; inputs in input order, as below.
      ParallelForEachRun(*plan, [&](int64_t o, const int64_t* in, int64_t count,
                                    const int64_t* step) {
        float acc[kFloatConvertBlock], values[kFloatConvertBlock];
        for (int64_t j0 = 0; j0 < count; j0 += kFloatConvertBlock) {
          const int64_t m = std::min(kFloatConvertBlock, count - j0);
          for (int i = 0; i < n; ++i) {
            float* dst = i == 0 ? acc : values;
            if (step[i] == 1) {
              ToFloat32(x[i] + in[i] + j0, dst, m);
            } else {
              std::fill(dst, dst + m, LoadF(x[i][in[i]]));
            }
            if (i > 0) {
              for (int64_t j = 0; j < m; ++j) acc[j] = static_cast<float>(op(acc[j], values[j]));
            }
          }
          FromFloat32(acc, y + o + j0, m);
        }
      });
      return;
    }
    ParallelForEachRun(*plan, [&](int64_t o, const int64_t* in, int64_t count,
                                  const int64_t* step) {
      for (int64_t j = 0; j < count; ++j) {
        auto acc = Load(x[0][in[0] + j * step[0]]);
        for (int i = 1; i < n; ++i) acc = op(acc, Load(x[i][in[i] + j * step[i]]));
        Store(&y[o + j], acc);
      }
    });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 0, dtype);
}

// ---- Where ----

// out = condition ? X : Y with three-way broadcasting; X and Y are copied
// as raw elements of their size, so every dtype but string works.
template <typename Raw>
void WhereLoop(const BroadcastPlan& plan, const bool* cond, const Raw* x, const Raw* y, Raw* out) {
  ParallelForEachRun(plan, [&](int64_t o, const int64_t* in, int64_t count, const int64_t* step) {
    const bool* c = cond + in[0];
    const Raw* px = x + in[1];
    const Raw* py = y + in[2];
    Raw* po = out + o;
    for (int64_t j = 0; j < count; ++j) {
      po[j] = c[j * step[0]] ? px[j * step[1]] : py[j * step[2]];
    }
  });
}

absl::Status WhereKernel(KernelContext& ctx) {
  const TensorView& cond = ctx.input(0);
  if (cond.dtype != DType::kBool) {
    return ctx.Error(absl::StrCat("input 0 (condition) is ", DTypeName(cond.dtype),
                                  "; expected bool"));
  }
  if (absl::Status s = common::RequireSameDType(ctx, 1, 2); !s.ok()) return s;
  absl::StatusOr<BroadcastPlan> plan = PlanInputs(ctx, 0, 3);
  if (!plan.ok()) return plan.status();
  const DType dtype = ctx.input(1).dtype;
  absl::StatusOr<TensorView*> out = ctx.Output(0, dtype, plan->out_dims);
  if (!out.ok()) return out.status();
  const void* x = ctx.input(1).data;
  const void* y = ctx.input(2).data;
  void* o = (*out)->data;
  switch (DTypeSize(dtype)) {
    case 1:
      WhereLoop(*plan, cond.as<bool>(), static_cast<const uint8_t*>(x),
                static_cast<const uint8_t*>(y), static_cast<uint8_t*>(o));
      return absl::OkStatus();
    case 2:
      WhereLoop(*plan, cond.as<bool>(), static_cast<const uint16_t*>(x),
                static_cast<const uint16_t*>(y), static_cast<uint16_t*>(o));
      return absl::OkStatus();
    case 4:
      WhereLoop(*plan, cond.as<bool>(), static_cast<const uint32_t*>(x),
                static_cast<const uint32_t*>(y), static_cast<uint32_t*>(o));
      return absl::OkStatus();
    case 8:
      WhereLoop(*plan, cond.as<bool>(), static_cast<const uint64_t*>(x),
                static_cast<const uint64_t*>(y), static_cast<uint64_t*>(o));
      return absl::OkStatus();
    default:
      return UnsupportedDType(ctx, 1, dtype);
  }
}

void Add(KernelTable& table, const std::string& op, std::vector<DType> dtypes, KernelFn run,
         bool in_place_ok = true, int checked_input = 0, const char* domain = "") {
  KernelDef def;
  def.domain = domain;
  def.op_type = op;
  def.supports = InputDTypeIn(checked_input, std::move(dtypes));
  def.run = run;
  def.in_place_ok = in_place_ok;
  table.Register(std::move(def));
}

// ---- GeluGrad -------------------------------------------------------------------

// dX[i] = GeluGradOp(dY[i], X[i]) in float32, built for AVX-512, AVX2 and the
// baseline (vector_clones.h; ErfFloat and ExpFloat vectorize).
template <bool kTanh>
CASTOR_VECTOR_CLONES void GeluGradFloat32(const float* dy, const float* x, float* dx,
                                          int64_t n) {
  const math::GeluGradOp op{kTanh};
  for (int64_t i = 0; i < n; ++i) dx[i] = op(dy[i], x[i]);
}

// GeluGrad (com.castor): one pass, 16-bit inputs widened a block at a time
// and dX rounded once.
absl::Status GeluGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  if (absl::Status st = common::RequireSameDType(ctx, 0, "dY", 1, "X"); !st.ok()) return st;
  if (absl::Status st = common::RequireDims(ctx, 0, "dY", x.dims, "X's shape"); !st.ok()) return st;
  const std::string approximate = ctx.GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return ctx.Error(absl::StrCat("attribute 'approximate' is \"", approximate,
                                  "\"; expected \"none\" or \"tanh\""));
  }
  const auto product = approximate == "tanh" ? GeluGradFloat32<true> : GeluGradFloat32<false>;
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    const T* xp = x.as<T>();
    T* dxp = dx->as<T>();
    ParallelFor(0, x.num_elements(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kIsFloat16Storage<T>) {
        float dy_block[kFloatConvertBlock], x_block[kFloatConvertBlock];
        for (int64_t i = lo; i < hi; i += kFloatConvertBlock) {
          const int64_t m = std::min(kFloatConvertBlock, hi - i);
          ToFloat32(dyp + i, dy_block, m);
          ToFloat32(xp + i, x_block, m);
          product(dy_block, x_block, dy_block, m);
          FromFloat32(dy_block, dxp + i, m);
        }
      } else if constexpr (std::is_same_v<T, float>) {
        product(dyp + lo, xp + lo, dxp + lo, hi - lo);
      } else {
        const math::GeluGradOp op{approximate == "tanh"};
        for (int64_t i = lo; i < hi; ++i) Store(&dxp[i], op(Load(dyp[i]), Load(xp[i])));
      }
    });
  });
  return ok ? absl::OkStatus() : UnsupportedDType(ctx, 1, x.dtype);
}

// ---- ReluGrad ------------------------------------------------------------------

absl::Status ReluGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& y = ctx.input(1);
  if (absl::Status st = common::RequireSameDType(ctx, 0, "dY", 1, "Y"); !st.ok()) return st;
  if (absl::Status st = common::RequireDims(ctx, 0, "dY", y.dims, "Y's shape"); !st.ok()) return st;
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, y.dtype, y.dims));
  DispatchFloat(y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* dyp = dy.as<T>();
    const T* yp = y.as<T>();
    T* dxp = dx->as<T>();
    ParallelFor(0, y.num_elements(), kElementGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kIsFloat16Storage<T>) {
        // On the bit patterns: Y > 0 exactly when its bits lie in
        // [1, +inf's] (+0, negatives, -0 and NaNs lie outside), so one
        // unsigned compare selects dY or +0's pattern (0), and the loop
        // vectorizes.
        const uint16_t positive_infinity = std::is_same_v<T, Half> ? 0x7c00 : 0x7f80;
        const uint16_t* y_bits = reinterpret_cast<const uint16_t*>(yp);
        const uint16_t* dy_bits = reinterpret_cast<const uint16_t*>(dyp);
        uint16_t* dx_bits = reinterpret_cast<uint16_t*>(dxp);
        for (int64_t i = lo; i < hi; ++i) {
          const uint16_t d = dy_bits[i];
          dx_bits[i] = static_cast<uint16_t>(y_bits[i] - 1u) < positive_infinity ? d : 0;
        }
      } else {
        // A select, not a branch: vectorized, and no mispredictions on
        // signs that alternate at random.
        // (dY is loaded unconditionally, so the loop has no control flow.)
        for (int64_t i = lo; i < hi; ++i) {
          const T d = dyp[i];
          dxp[i] = LoadF(yp[i]) > 0.0f ? d : T(0);
        }
      }
    });
  });
  return absl::OkStatus();
}
}  // namespace

void RegisterElementwiseKernels(KernelTable& table) {
  using namespace math;  // NOLINT: the functor names read best unqualified here
  const std::vector<DType> numeric = Join(kFloatTypes, kIntTypes);
  const std::vector<DType> floats = kFloatTypes;

  Add(table, "Add", numeric, &ArithmeticKernel<AddOp>);
  Add(table, "Sub", numeric, &ArithmeticKernel<SubOp>);
  Add(table, "Mul", numeric, &ArithmeticKernel<MulOp>);
  Add(table, "Div", numeric, &ArithmeticKernel<DivOp>);
  Add(table, "Pow", Join(floats, {DType::kInt32, DType::kInt64}), &PowKernel);
  Add(table, "Mod", numeric, &ModKernel);
  // Not in place: a bool output over a float input of the same byte size
  // would overwrite inputs still to be read.
  Add(table, "Equal", Join(numeric, {DType::kBool}), &CompareKernel<EqualOp>,
      /*in_place_ok=*/false);
  Add(table, "Less", numeric, &CompareKernel<LessOp>, /*in_place_ok=*/false);
  Add(table, "Greater", numeric, &CompareKernel<GreaterOp>, /*in_place_ok=*/false);
  Add(table, "LessOrEqual", numeric, &CompareKernel<LessOrEqualOp>, /*in_place_ok=*/false);
  Add(table, "GreaterOrEqual", numeric, &CompareKernel<GreaterOrEqualOp>, /*in_place_ok=*/false);
  Add(table, "And", {DType::kBool}, &LogicKernel<AndOp>, /*in_place_ok=*/false);
  Add(table, "Or", {DType::kBool}, &LogicKernel<OrOp>, /*in_place_ok=*/false);
  Add(table, "Xor", {DType::kBool}, &LogicKernel<XorOp>, /*in_place_ok=*/false);
  Add(table, "Not", {DType::kBool}, &NotKernel);
  Add(table, "IsNaN", floats, &IsNanKernel, /*in_place_ok=*/false);
  Add(table, "IsInf", floats, &IsInfKernel, /*in_place_ok=*/false);

  Add(table, "Neg", numeric, &UnaryKernel<NegOp, true>);
  Add(table, "Abs", numeric, &UnaryKernel<AbsOp, true>);
  Add(table, "Sign", numeric, &UnaryKernel<SignOp, true>);
  Add(table, "Floor", floats, &UnaryKernel<FloorOp, false>);
  Add(table, "Ceil", floats, &UnaryKernel<CeilOp, false>);
  Add(table, "Round", floats, &UnaryKernel<RoundOp, false>);
  Add(table, "Relu", numeric, &ReluKernel);
  Add(table, "Erf", numeric, &UnaryKernel<ErfOp, true>);
  Add(table, "LeakyRelu", floats, &LeakyReluKernel);
  Add(table, "Gelu", floats, &GeluKernel);
  // castor's form of Gelu for the training graph (graph/ops/elementwise.cc).
  Add(table, "Gelu", floats, &GeluKernel, /*in_place_ok=*/true, 0, kCastorDomain);
  Add(table, "HardSigmoid", floats, &HardSigmoidKernel);
  Add(table, "HardSwish", floats, &UnaryKernel<HardSwishOp, false>);
  Add(table, "Elu", floats, &EluKernel);
  Add(table, "Selu", floats, &SeluKernel);
  Add(table, "Celu", floats, &CeluKernel);
  Add(table, "Softplus", floats, &UnaryKernel<SoftplusOp, false>);
  Add(table, "Softsign", floats, &UnaryKernel<SoftsignOp, false>);
  Add(table, "ThresholdedRelu", floats, &ThresholdedReluKernel);
  Add(table, "Mish", floats, &UnaryKernel<MishOp, false>);
  Add(table, "PRelu", numeric, &PReluKernel);
  Add(table, "Sigmoid", floats, &UnaryKernel<SigmoidOp, false>);
  Add(table, "Tanh", floats, &UnaryKernel<TanhOp, false>);
  Add(table, "Exp", floats, &UnaryKernel<ExpOp, false>);
  Add(table, "Log", floats, &UnaryKernel<LogOp, false>);
  Add(table, "Sqrt", floats, &UnaryKernel<SqrtOp, false>);
  Add(table, "Reciprocal", floats, &UnaryKernel<ReciprocalOp, false>);
  Add(table, "Sin", floats, &UnaryKernel<SinOp, false>);
  Add(table, "Cos", floats, &UnaryKernel<CosOp, false>);
  Add(table, "Tan", floats, &UnaryKernel<TanOp, false>);
  Add(table, "Asin", floats, &UnaryKernel<AsinOp, false>);
  Add(table, "Acos", floats, &UnaryKernel<AcosOp, false>);
  Add(table, "Atan", floats, &UnaryKernel<AtanOp, false>);
  Add(table, "Sinh", floats, &UnaryKernel<SinhOp, false>);
  Add(table, "Cosh", floats, &UnaryKernel<CoshOp, false>);
  Add(table, "Asinh", floats, &UnaryKernel<AsinhOp, false>);
  Add(table, "Acosh", floats, &UnaryKernel<AcoshOp, false>);
  Add(table, "Atanh", floats, &UnaryKernel<AtanhOp, false>);
  Add(table, "Clip", numeric, &ClipKernel);

  Add(table, "Max", numeric, &VariadicKernel<MaxOp>);
  Add(table, "Min", numeric, &VariadicKernel<MinOp>);
  Add(table, "Sum", floats, &VariadicKernel<AddOp>);

  std::vector<DType> where_values = Join(numeric, {DType::kBool});
  Add(table, "Where", where_values, &WhereKernel, /*in_place_ok=*/false, /*checked_input=*/1);

  // dX over dY: each element (GeluGrad's 16-bit blocks: each block) is read
  // before its result is stored.
  RegisterGradientKernel(table, "ReluGrad", ReluGradKernel, /*in_place_ok=*/true);
  RegisterGradientKernel(table, "GeluGrad", GeluGradKernel, /*in_place_ok=*/true);
}

}  // namespace castor::cpu
