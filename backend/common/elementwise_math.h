// The scalar arithmetic of the elementwise, reduction and softmax kernels:
// one small functor per op, templated on the compute type V (float for
// float32/float16/bfloat16 storage, double for float64, the integer type
// itself for integers, bool for bool). Header-only and CASTOR_HOST_DEVICE so
// the CUDA backend can call exactly the arithmetic the CPU backend runs;
// only <cmath>, <cstdint>, <limits>, <type_traits> and graph/half.h here.
//
// Conventions (from the ONNX operator spec and its numpy reference):
// - integer Add/Sub/Mul/Neg/Abs wrap around (two's complement), never UB;
// - integer Div truncates toward zero; x / 0 gives 0 and MIN / -1 gives MIN;
// - Max/Min/Clip propagate NaN (np.maximum / np.minimum / np.clip);
// - a float result stored into an integer saturates, NaN becomes 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "graph/half.h"

namespace castor::math {

template <typename V>
inline constexpr bool kIsInt = std::is_integral_v<V> && !std::is_same_v<V, bool>;

// The unsigned type integer arithmetic of V wraps in: at least 32 bits wide,
// so uint16 * uint16 does not promote to a signed int that overflows.
template <typename V>
using WrapType = std::conditional_t<(sizeof(V) < 4), uint32_t, std::make_unsigned_t<V>>;

template <typename V>
CASTOR_HOST_DEVICE inline bool IsNan(V v) {
  if constexpr (std::is_floating_point_v<V>) {
    return v != v;
  } else {
    return false;
  }
}

// A floating value converted to integer type I: truncation toward zero,
// saturating at I's range, NaN -> 0 (what numpy's astype does on x86 for
// in-range values, without its undefined out-of-range behaviour).
template <typename I, typename F>
CASTOR_HOST_DEVICE inline I SaturatingCast(F value) {
  if constexpr (std::is_same_v<I, bool>) {
    return value != 0;
  } else if constexpr (std::is_floating_point_v<I>) {
    return static_cast<I>(value);
  } else {
    const double v = static_cast<double>(value);
    if (v != v) return 0;
    if (v <= static_cast<double>(std::numeric_limits<I>::lowest())) {
      return std::numeric_limits<I>::lowest();
    }
    if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return static_cast<I>(v);
  }
}

// ---- float32 exp and erf without branches ----
// Built from multiplies, adds, integer shifts and bitwise selects only, so
// a loop over them vectorizes (std::exp / std::erf are opaque library
// calls). The selects are bitwise on purpose: under GCC's default
// -ftrapping-math a `cond ? a : b` on floats stays a branch, which stops
// vectorization.

// cond ? a : b, as a bitwise blend.
CASTOR_HOST_DEVICE inline float SelectFloat(bool cond, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return BitsToFloat((FloatBits(a) & mask) | (FloatBits(b) & ~mask));
}

// e^x in float32: Cody-Waite reduction x = n ln2 + r with |r| <= ln2 / 2
// (ln2 split in a 9-bit head, so n * head is exact), Cephes' degree-7
// polynomial for e^r, then the scale 2^n as two exact powers of two (so
// n = 128 and results in the subnormal range scale correctly). Relative
// error below 1e-7 (about 1 ulp) for normal results; +inf above
// ln(FLT_MAX), 0 below -104 (under the smallest subnormal), NaN stays NaN.
CASTOR_HOST_DEVICE inline float ExpFloat(float x) {
  const float kMaxArg = 88.72283935546875f;  // ln(FLT_MAX), rounded down
  const float kMinArg = -104.0f;
  float clamped = SelectFloat(x < kMaxArg, x, kMaxArg);
  clamped = SelectFloat(clamped > kMinArg, clamped, kMinArg);
  // n = round(x / ln2) by the 1.5 * 2^23 trick (round to nearest even).
  const float kRound = 12582912.0f;
  const float n = (clamped * 1.44269504088896341f + kRound) - kRound;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float er = poly * r * r + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);  // in [-150, 128]
  const int32_t half = ni >> 1;
  const float scale_a = BitsToFloat(static_cast<uint32_t>(half + 127) << 23);
  const float scale_b = BitsToFloat(static_cast<uint32_t>(ni - half + 127) << 23);
  float result = er * scale_a * scale_b;
  result = SelectFloat(x > kMaxArg, std::numeric_limits<float>::infinity(), result);
  result = SelectFloat(x < kMinArg, 0.0f, result);
  return SelectFloat(x != x, x, result);
}

// erf(x) in float32 as the odd/even rational approximation p(x) / q(x^2)
// on [-4, 4] that Eigen and XLA use (beyond, erf is +-1 in float32).
// Absolute and relative error below 5e-7 against double erf (4.3e-7 at
// worst over a dense grid of [-5, 5]; relative accuracy holds near 0 too,
// as p is odd). NaN stays NaN.
CASTOR_HOST_DEVICE inline float ErfFloat(float x) {
  float c = SelectFloat(x < 4.0f, x, 4.0f);
  c = SelectFloat(c > -4.0f, c, -4.0f);
  const float x2 = c * c;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  p = p * c;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return SelectFloat(x != x, x, p / q);
}

// ---- binary arithmetic ----

struct AddOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if constexpr (kIsInt<V>) {
      return static_cast<V>(static_cast<WrapType<V>>(a) + static_cast<WrapType<V>>(b));
    } else {
      return a + b;
    }
  }
};

struct SubOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if constexpr (kIsInt<V>) {
      return static_cast<V>(static_cast<WrapType<V>>(a) - static_cast<WrapType<V>>(b));
    } else {
      return a - b;
    }
  }
};

struct MulOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if constexpr (kIsInt<V>) {
      return static_cast<V>(static_cast<WrapType<V>>(a) * static_cast<WrapType<V>>(b));
    } else {
      return a * b;
    }
  }
};

struct DivOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if constexpr (kIsInt<V>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<V>) {
        if (b == -1) return static_cast<V>(static_cast<WrapType<V>>(0) - static_cast<WrapType<V>>(a));
      }
      return static_cast<V>(a / b);  // C++ truncates toward zero, as ONNX asks
    } else {
      return a / b;
    }
  }
};

// Integer power by squaring (wrapping); negative exponents give 1/x^n
// truncated: 1 for x = 1, +-1 for x = -1, else 0.
template <typename V, typename E>
CASTOR_HOST_DEVICE inline V IntegerPow(V base, E exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if constexpr (std::is_signed_v<V>) {
      if (base == -1) return (exponent % 2 == 0) ? V(1) : V(-1);
    }
    return 0;
  }
  WrapType<V> result = 1;
  WrapType<V> square = static_cast<WrapType<V>>(base);
  uint64_t e = static_cast<uint64_t>(exponent);
  while (e != 0) {
    if (e & 1u) result = static_cast<WrapType<V>>(result * square);
    square = static_cast<WrapType<V>>(square * square);
    e >>= 1;
  }
  return static_cast<V>(result);
}

// Pow: base compute type V, exponent compute type E (may differ, opset 12+).
// Float bases compute in V; integer bases with float exponents compute in
// double and truncate (numpy: power in float64, then astype(base dtype)).
// Exponents 2 and 1 (a decomposed LayerNorm's variance and its gradient)
// are a multiply and a copy: exact, where pow() is allowed an ulp, and
// about 20x faster.
struct PowOp {
  template <typename V, typename E>
  CASTOR_HOST_DEVICE V operator()(V base, E exponent) const {
    if constexpr (std::is_floating_point_v<V>) {
      const V e = static_cast<V>(exponent);
      if (e == V(2)) return base * base;
      if (e == V(1)) return base;
      return std::pow(base, e);
    } else if constexpr (kIsInt<E>) {
      return IntegerPow(base, exponent);
    } else {
      return SaturatingCast<V>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
    }
  }
};

// NaN-propagating maximum and minimum.
struct MaxOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if (IsNan(a)) return a;
    if (IsNan(b)) return b;
    return a < b ? b : a;
  }
};

struct MinOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if (IsNan(a)) return a;
    if (IsNan(b)) return b;
    return b < a ? b : a;
  }
};

struct EqualOp {
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V a, V b) const {
    return a == b;
  }
};

// Ordered comparisons: IEEE (any comparison with NaN is false, -0 == +0).
struct LessOp {
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V a, V b) const {
    return a < b;
  }
};

struct GreaterOp {
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V a, V b) const {
    return a > b;
  }
};

struct LessOrEqualOp {
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V a, V b) const {
    return a <= b;
  }
};

struct GreaterOrEqualOp {
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V a, V b) const {
    return a >= b;
  }
};

// ---- boolean logic (bool in, bool out) ----

struct AndOp {
  CASTOR_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};

struct OrOp {
  CASTOR_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};

struct XorOp {
  CASTOR_HOST_DEVICE bool operator()(bool a, bool b) const { return a != b; }
};

struct NotOp {
  CASTOR_HOST_DEVICE bool operator()(bool x) const { return !x; }
};

// Mod-10/13. fmod = 0: the remainder takes the divisor's sign (numpy's
// np.mod, Python's %; PyTorch's remainder); fmod = 1: it takes the
// dividend's sign (C fmod, np.fmod; PyTorch's fmod). Integers: x mod 0 is 0
// (numpy's result) and MIN mod -1 is 0 (no overflow). Floats: x mod 0 is
// NaN, and a zero remainder with fmod = 0 takes the divisor's sign (np.mod).
struct ModOp {
  bool fmod = false;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V a, V b) const {
    if constexpr (kIsInt<V>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<V>) {
        if (b == -1) return 0;
        V r = static_cast<V>(a % b);  // truncated: the dividend's sign
        if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<V>(r + b);
        return r;
      } else {
        return static_cast<V>(a % b);
      }
    } else {
      V r = std::fmod(a, b);
      if (fmod) return r;
      if (r != V(0)) {
        if ((r < V(0)) != (b < V(0))) r += b;
      } else {
        r = std::copysign(V(0), b);
      }
      return r;
    }
  }
};

// ---- unary ----

struct NegOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if constexpr (kIsInt<V>) {
      return static_cast<V>(static_cast<WrapType<V>>(0) - static_cast<WrapType<V>>(x));
    } else {
      return -x;
    }
  }
};

struct AbsOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if constexpr (std::is_floating_point_v<V>) {
      return std::fabs(x);
    } else if constexpr (std::is_signed_v<V>) {
      return x < 0 ? NegOp()(x) : x;
    } else {
      return x;
    }
  }
};

// max(x, 0) with -0 mapped to +0 (so Relu(MaxPool(x)) == MaxPool(Relu(x))
// bit for bit, see passes/training_graph.cc); NaN stays NaN.
struct ReluOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x <= V(0) ? V(0) : x;
  }
};

struct LeakyReluOp {
  float alpha = 0.01f;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x < V(0) ? static_cast<V>(alpha) * x : x;
  }
};

// HardSigmoid: max(0, min(1, alpha * x + beta)); NaN stays NaN.
struct HardSigmoidOp {
  float alpha = 0.2f;
  float beta = 0.5f;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    const V z = static_cast<V>(alpha) * x + static_cast<V>(beta);
    if (IsNan(z)) return z;
    return z <= V(0) ? V(0) : (z >= V(1) ? V(1) : z);
  }
};

// HardSwish-14: x * max(0, min(1, x / 6 + 1/2)), evaluated as PyTorch's
// hardswish does, x * min(max(x + 3, 0), 6) / 6 (so an exported
// mobilenet_v3 gets PyTorch's bits); x < -3 gives -0 as there; NaN stays NaN.
struct HardSwishOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    const V shifted = x + V(3);
    if (IsNan(shifted)) return shifted;
    const V clamped = shifted <= V(0) ? V(0) : (shifted >= V(6) ? V(6) : shifted);
    return x * clamped / V(6);
  }
};

// Elu: x if x > 0, else alpha (e^x - 1) (expm1: exact near 0, as PyTorch).
struct EluOp {
  float alpha = 1.0f;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x > V(0) ? x : static_cast<V>(alpha) * std::expm1(x);
  }
};

// Selu: gamma x if x > 0, else gamma alpha (e^x - 1).
struct SeluOp {
  float alpha = 1.67326319217681884765625f;
  float gamma = 1.05070102214813232421875f;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    const V g = static_cast<V>(gamma);
    return x > V(0) ? g * x : g * static_cast<V>(alpha) * std::expm1(x);
  }
};

// Celu: max(0, x) + min(0, alpha (e^(x / alpha) - 1)).
struct CeluOp {
  float alpha = 1.0f;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    const V a = static_cast<V>(alpha);
    return x > V(0) ? x : a * std::expm1(x / a);
  }
};

// Softplus: ln(1 + e^x) without overflow: x + ln(1 + e^-x) for x > 0.
struct SoftplusOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x > V(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
};

// Softsign: x / (1 + |x|).
struct SoftsignOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x / (V(1) + std::fabs(x));
  }
};

// ThresholdedRelu: x if x > alpha, else 0; NaN stays NaN (numpy's
// (x > alpha) * x, PyTorch's threshold).
struct ThresholdedReluOp {
  float alpha = 1.0f;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x <= static_cast<V>(alpha) ? V(0) : x;
  }
};

// Mish-18: x tanh(softplus(x)).
struct MishOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return x * std::tanh(SoftplusOp()(x));
  }
};

// PRelu: x if x >= 0, else slope x (integers wrap, as Mul).
struct PReluOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x, V slope) const {
    return x < V(0) ? MulOp()(slope, x) : x;
  }
};

// Sign: -1, 0 or 1 in x's type; NaN stays NaN, -0 stays -0 (np.sign).
struct SignOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if (x > V(0)) return V(1);
    if constexpr (std::is_signed_v<V> || std::is_floating_point_v<V>) {
      if (x < V(0)) return V(-1);
    }
    return x;  // 0, -0 or NaN
  }
};

struct FloorOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::floor(x);
  }
};

struct CeilOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::ceil(x);
  }
};

// Round-11: to the nearest integer, halves to even (np.round; rint under
// the default rounding mode).
struct RoundOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::rint(x);
  }
};

// 1 / (1 + e^-x), evaluated so that neither branch overflows.
struct SigmoidOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if (x >= V(0)) return V(1) / (V(1) + std::exp(-x));
    const V e = std::exp(x);
    return e / (V(1) + e);
  }
};

struct TanhOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::tanh(x);
  }
};

// Gelu-20: 0.5 x (1 + erf(x / sqrt 2)) (float32: ErfFloat), or with
// approximate = "tanh"
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
struct GeluOp {
  bool tanh_approximation = false;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if (tanh_approximation) {
      const V k = static_cast<V>(0.7978845608028654);  // sqrt(2 / pi)
      return V(0.5) * x * (V(1) + std::tanh(k * (x + static_cast<V>(0.044715) * x * x * x)));
    }
    const V scaled = x * static_cast<V>(0.7071067811865476);
    if constexpr (std::is_same_v<V, float>) {
      return V(0.5) * x * (V(1) + ErfFloat(scaled));
    } else {
      return V(0.5) * x * (V(1) + std::erf(scaled));
    }
  }
};

// GeluGrad (com.castor): dY * d/dX Gelu(X), the derivatives of GeluOp
// (formulas: graph/ops/gradient_rules.cc GeluGradient), in float32 through
// ErfFloat and ExpFloat (so a float32 loop over it vectorizes).
struct GeluGradOp {
  bool tanh_approximation = false;
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V dy, V x) const {
    if (tanh_approximation) {
      const V c = static_cast<V>(0.7978845608028654);  // sqrt(2 / pi)
      const V k = static_cast<V>(0.044715);
      const V t = std::tanh(c * (x + k * x * x * x));
      const V slope = V(0.5) * (V(1) + t) +
                      V(0.5) * x * (V(1) - t * t) * c * (V(1) + V(3) * k * x * x);
      return dy * slope;
    }
    const V inv_sqrt2 = static_cast<V>(0.7071067811865476);
    const V inv_sqrt_2pi = static_cast<V>(0.3989422804014327);
    V cdf, gauss;
    if constexpr (std::is_same_v<V, float>) {
      cdf = 0.5f * (1.0f + ErfFloat(x * inv_sqrt2));
      gauss = ExpFloat(-0.5f * x * x);
    } else {
      cdf = V(0.5) * (V(1) + std::erf(x * inv_sqrt2));
      gauss = std::exp(V(-0.5) * x * x);
    }
    return dy * (cdf + x * gauss * inv_sqrt_2pi);
  }
};

// erf (float32: ErfFloat); integer inputs compute in double and truncate (so 0 except for
// |x| >= 6 or so, where erf rounds to +-1).
struct ErfOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if constexpr (std::is_same_v<V, float>) {
      return ErfFloat(x);
    } else if constexpr (std::is_floating_point_v<V>) {
      return std::erf(x);
    } else {
      return SaturatingCast<V>(std::erf(static_cast<double>(x)));
    }
  }
};

// e^x (float32, so 16-bit inputs too: ExpFloat, which vectorizes).
struct ExpOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if constexpr (std::is_same_v<V, float>) {
      return ExpFloat(x);
    } else {
      return std::exp(x);
    }
  }
};

struct LogOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::log(x);
  }
};

// Trigonometric and hyperbolic functions: the C library's (CUDA's on the
// device), in float32 for float32 and 16-bit inputs.
struct SinOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::sin(x);
  }
};
struct CosOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::cos(x);
  }
};
struct TanOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::tan(x);
  }
};
struct AsinOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::asin(x);
  }
};
struct AcosOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::acos(x);
  }
};
struct AtanOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::atan(x);
  }
};
struct SinhOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::sinh(x);
  }
};
struct CoshOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::cosh(x);
  }
};
struct AsinhOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::asinh(x);
  }
};
struct AcoshOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::acosh(x);
  }
};
struct AtanhOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::atanh(x);
  }
};

struct SqrtOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return std::sqrt(x);
  }
};

struct ReciprocalOp {
  template <typename V>
  CASTOR_HOST_DEVICE V operator()(V x) const {
    return V(1) / x;
  }
};

// ---- float predicates (float in, bool out) ----

struct IsNanOp {
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V x) const {
    return x != x;
  }
};

// IsInf-10/20: +inf when detect_positive, -inf when detect_negative.
struct IsInfOp {
  bool detect_negative = true;
  bool detect_positive = true;
  template <typename V>
  CASTOR_HOST_DEVICE bool operator()(V x) const {
    const V inf = std::numeric_limits<V>::infinity();
    return (detect_positive && x == inf) || (detect_negative && x == -inf);
  }
};

// Clip: min(max(x, low), high); NaN stays NaN; low > high gives high.
template <typename V>
struct ClipOp {
  V low;
  V high;
  CASTOR_HOST_DEVICE V operator()(V x) const {
    if (IsNan(x)) return x;
    const V raised = x < low ? low : x;
    return high < raised ? high : raised;
  }
};

// ---- reductions: the accumulator's start value and combine step ----

struct SumReduce {
  template <typename A>
  CASTOR_HOST_DEVICE static A Init() { return A(0); }
  template <typename A>
  CASTOR_HOST_DEVICE static A Combine(A acc, A x) { return AddOp()(acc, x); }
};

struct ProdReduce {
  template <typename A>
  CASTOR_HOST_DEVICE static A Init() { return A(1); }
  template <typename A>
  CASTOR_HOST_DEVICE static A Combine(A acc, A x) { return MulOp()(acc, x); }
};

struct MaxReduce {
  template <typename A>
  CASTOR_HOST_DEVICE static A Init() {
    if constexpr (std::is_same_v<A, bool>) {
      return false;
    } else if constexpr (std::is_floating_point_v<A>) {
      return -std::numeric_limits<A>::infinity();
    } else {
      return std::numeric_limits<A>::lowest();
    }
  }
  template <typename A>
  CASTOR_HOST_DEVICE static A Combine(A acc, A x) {
    if constexpr (std::is_same_v<A, bool>) {
      return acc || x;
    } else {
      return MaxOp()(acc, x);
    }
  }
};

struct MinReduce {
  template <typename A>
  CASTOR_HOST_DEVICE static A Init() {
    if constexpr (std::is_same_v<A, bool>) {
      return true;
    } else if constexpr (std::is_floating_point_v<A>) {
      return std::numeric_limits<A>::infinity();
    } else {
      return std::numeric_limits<A>::max();
    }
  }
  template <typename A>
  CASTOR_HOST_DEVICE static A Combine(A acc, A x) {
    if constexpr (std::is_same_v<A, bool>) {
      return acc && x;
    } else {
      return MinOp()(acc, x);
    }
  }
};

// Softmax of one row element given the row's max and sum of exp(x - max).
template <typename V>
CASTOR_HOST_DEVICE inline V SoftmaxValue(V x, V row_max, V row_sum) {
  return std::exp(x - row_max) / row_sum;
}
template <typename V>
CASTOR_HOST_DEVICE inline V LogSoftmaxValue(V x, V row_max, V row_sum) {
  return x - row_max - std::log(row_sum);
}

}  // namespace castor::math
