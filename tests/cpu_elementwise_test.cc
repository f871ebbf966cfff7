// Tests of the CPU elementwise kernels (backend/cpu/elementwise.cc,
// broadcast.h, elementwise_math.h): values against float64 references
// computed here, 16-bit results equal to the float32 result rounded once,
// broadcasting (scalar, row, column, rank mismatch), integer semantics,
// mixed-type Pow, Equal/Where/Clip/variadic ops, in-place execution, and
// every ONNX conformance case whose model uses only elementwise ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "backend/common/elementwise_math.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd16.h"
#include "backend/kernel.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/gradient_builder.h"
#include "gtest/gtest.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::BF16;
using testing::Bits;
using testing::Bool;
using testing::ConformanceRoot;
using testing::ConformanceSummary;
using testing::Count;
using testing::Cpu;
using testing::F16;
using testing::F32;
using testing::F64;
using testing::I32;
using testing::I64;
using testing::I8;
using testing::Make;
using testing::Ramp;
using testing::RoundTo;
using testing::RunConformanceCasesOf;
using testing::RunOp;
using testing::SingleNode;
using testing::U8;
using testing::Values;

Tensor Omitted() { return Tensor(); }

// Row-major index of `out_index` (in out_dims) inside a tensor of `dims`
// broadcast to out_dims: the test's own broadcasting, independent of the
// kernels' collapsed plans.
int64_t BroadcastSource(const std::vector<int64_t>& dims, const std::vector<int64_t>& out_dims,
                        int64_t out_index) {
  const size_t pad = out_dims.size() - dims.size();
  std::vector<int64_t> index(out_dims.size());
  for (size_t d = out_dims.size(); d-- > 0;) {
    index[d] = out_index % out_dims[d];
    out_index /= out_dims[d];
  }
  int64_t source = 0;
  for (size_t d = 0; d < dims.size(); ++d) {
    source = source * dims[d] + (dims[d] == 1 ? 0 : index[pad + d]);
  }
  return source;
}

// ---------------- unary ----------------

struct UnaryCase {
  UnaryCase(std::string op, std::function<double(double)> reference, std::vector<float> inputs,
            std::vector<Attribute> attrs = {}, int64_t opset = 17)
      : op(std::move(op)),
        reference(std::move(reference)),
        inputs(std::move(inputs)),
        attrs(std::move(attrs)),
        opset(opset) {}
  std::string op;
  std::function<double(double)> reference;
  std::vector<float> inputs;
  std::vector<Attribute> attrs;
  int64_t opset;
};

TEST(CpuElementwiseTest, UnaryFloat32MatchesFloat64Reference) {
  const std::vector<float> mixed = {-3.5f, -1.0f, -0.25f, 0.0f, 0.5f, 1.0f, 2.75f, 10.0f};
  const std::vector<float> positive = {0.01f, 0.5f, 1.0f, 2.0f, 3.0f, 100.0f};
  const std::vector<float> unit = {-1.0f, -0.75f, -0.1f, 0.0f, 0.5f, 0.99f, 1.0f};
  const double kPi = 3.14159265358979323846;
  std::vector<UnaryCase> cases = {
      {"Neg", [](double x) { return -x; }, mixed},
      {"Abs", [](double x) { return std::fabs(x); }, mixed},
      {"Relu", [](double x) { return x > 0 ? x : 0.0; }, mixed},
      {"LeakyRelu", [](double x) { return x >= 0 ? x : static_cast<double>(0.01f) * x; }, mixed},
      {"LeakyRelu", [](double x) { return x >= 0 ? x : static_cast<double>(0.2f) * x; }, mixed,
       {Attribute::Float("alpha", 0.2f)}},
      {"Sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
       {-100.0f, -3.0f, -0.5f, 0.0f, 0.5f, 3.0f, 100.0f}},
      {"Tanh", [](double x) { return std::tanh(x); }, mixed},
      {"Erf", [](double x) { return std::erf(x); }, mixed},
      {"Exp", [](double x) { return std::exp(x); }, mixed},
      {"Log", [](double x) { return std::log(x); }, positive},
      {"Sqrt", [](double x) { return std::sqrt(x); }, positive},
      {"Reciprocal", [](double x) { return 1.0 / x; }, {-4.0f, -0.5f, 0.3f, 3.0f, 7.0f}},
      {"Sin", [](double x) { return std::sin(x); }, mixed},
      {"Cos", [](double x) { return std::cos(x); }, mixed},
      {"Tan", [](double x) { return std::tan(x); }, {-1.5f, -0.75f, 0.0f, 0.3f, 1.2f, 4.0f}},
      {"Asin", [](double x) { return std::asin(x); }, unit},
      {"Acos", [](double x) { return std::acos(x); }, unit},
      {"Atan", [](double x) { return std::atan(x); }, mixed},
      {"Sinh", [](double x) { return std::sinh(x); }, mixed},
      {"Cosh", [](double x) { return std::cosh(x); }, mixed},
      {"Asinh", [](double x) { return std::asinh(x); }, mixed},
      {"Acosh", [](double x) { return std::acosh(x); }, {1.0f, 1.25f, 2.0f, 10.0f, 1e6f}},
      {"Atanh", [](double x) { return std::atanh(x); }, {-0.99f, -0.5f, 0.0f, 0.25f, 0.9f}},
      {"Gelu", [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, mixed,
       {}, 20},
      {"Gelu",
       [&](double x) {
         return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
       },
       mixed, {Attribute::String("approximate", "tanh")}, 20},
  };
  for (const UnaryCase& c : cases) {
    const int64_t n = static_cast<int64_t>(c.inputs.size());
    Tensor y = RunOp(c.op, {F32({n}, c.inputs)}, c.attrs, c.opset);
    ASSERT_EQ(y.dtype(), DType::kFloat32) << c.op;
    ASSERT_EQ(y.num_elements(), n) << c.op;
    for (int64_t i = 0; i < n; ++i) {
      const double expected = c.reference(c.inputs[i]);
      EXPECT_NEAR(y.data<float>()[i], expected, 2e-6 * std::fabs(expected) + 1e-7)
          << c.op << "(" << c.inputs[i] << ")";
    }
    // float64 computes in double.
    std::vector<double> doubles(c.inputs.begin(), c.inputs.end());
    Tensor yd = RunOp(c.op, {F64({n}, doubles)}, c.attrs, c.opset);
    ASSERT_EQ(yd.dtype(), DType::kFloat64) << c.op;
    for (int64_t i = 0; i < n; ++i) {
      const double expected = c.reference(c.inputs[i]);
      EXPECT_NEAR(yd.data<double>()[i], expected, 1e-12 * std::fabs(expected) + 1e-15)
          << c.op << " float64 (" << c.inputs[i] << ")";
    }
  }
}

// The float32 unary loops are built per instruction set (vector_clones.h):
// whichever clone this CPU runs gives, on long runs with special values
// and ragged lengths, the bits of the scalar op compiled here for the
// baseline.
TEST(CpuElementwiseTest, UnaryFloat32LoopsGiveTheScalarOpsBits) {
  std::vector<float> inputs = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min(), -1e-30f, 3.9999f, 4.0f,
                               -4.0001f, 88.7f, -104.5f};
  for (int i = 0; i < 4999; ++i) inputs.push_back(-12.0f + 24.0f * static_cast<float>(i) / 4999);
  struct Case {
    std::string op;
    std::vector<Attribute> attrs;
    std::function<float(float)> scalar;
  };
  const std::vector<Case> cases = {
      {"Erf", {}, [](float x) { return math::ErfOp{}(x); }},
      {"Relu", {}, [](float x) { return math::ReluOp{}(x); }},
      {"Neg", {}, [](float x) { return math::NegOp{}(x); }},
      {"Abs", {}, [](float x) { return math::AbsOp{}(x); }},
      {"Exp", {}, [](float x) { return math::ExpOp{}(x); }},
      {"Sigmoid", {}, [](float x) { return math::SigmoidOp{}(x); }},
      {"Tanh", {}, [](float x) { return math::TanhOp{}(x); }},
      {"LeakyRelu", {Attribute::Float("alpha", 0.2f)},
       [](float x) { return math::LeakyReluOp{0.2f}(x); }},
      {"Gelu", {}, [](float x) { return math::GeluOp{false}(x); }},
      {"HardSigmoid", {Attribute::Float("alpha", 0.3f)},
       [](float x) { return math::HardSigmoidOp{0.3f, 0.5f}(x); }},
      {"HardSwish", {}, [](float x) { return math::HardSwishOp{}(x); }},
      {"Sin", {}, [](float x) { return math::SinOp{}(x); }},
      {"Cos", {}, [](float x) { return math::CosOp{}(x); }},
      {"Atan", {}, [](float x) { return math::AtanOp{}(x); }},
      {"Asinh", {}, [](float x) { return math::AsinhOp{}(x); }},
  };
  for (const Case& c : cases) {
    for (const int64_t n : {static_cast<int64_t>(inputs.size()), int64_t{13}}) {
      const std::vector<float> x(inputs.begin(), inputs.begin() + n);
      Tensor y = RunOp(c.op, {F32({n}, x)}, c.attrs, c.op == "Gelu" ? 20 : 17);
      ASSERT_EQ(y.num_elements(), n) << c.op;
      int64_t differing = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float want = c.scalar(x[i]);
        if (FloatBits(y.data<float>()[i]) != FloatBits(want) && ++differing <= 3) {
          ADD_FAILURE() << c.op << "(" << x[i] << ") = " << y.data<float>()[i] << ", scalar "
                        << want;
        }
      }
      EXPECT_EQ(differing, 0) << c.op << " over " << n << " inputs";
    }
  }
}

// A 16-bit input gives exactly the float32 result rounded once.
TEST(CpuElementwiseTest, Unary16BitIsFloat32RoundedOnce) {
  struct Case {
    std::string op;
    float (*f)(float);
  };
  const std::vector<Case> cases = {
      {"Exp", [](float x) { return std::exp(x); }},
      {"Sqrt", [](float x) { return std::sqrt(x); }},
      {"Log", [](float x) { return std::log(x); }},
      {"Tanh", [](float x) { return std::tanh(x); }},
      {"Reciprocal", [](float x) { return 1.0f / x; }},
      {"Erf", [](float x) { return std::erf(x); }},
  };
  const std::vector<float> inputs = {0.1f, 0.3f, 0.7f, 1.1f, 1.7f, 2.3f, 3.1f, 5.9f};
  for (const Case& c : cases) {
    Tensor h = F16({8}, inputs);
    Tensor b = BF16({8}, inputs);
    Tensor yh = RunOp(c.op, {h});
    Tensor yb = RunOp(c.op, {b});
    ASSERT_EQ(yh.dtype(), DType::kFloat16);
    ASSERT_EQ(yb.dtype(), DType::kBFloat16);
    for (int i = 0; i < 8; ++i) {
      const float xh = HalfBitsToFloat(h.data<uint16_t>()[i]);
      const float xb = BFloat16BitsToFloat(b.data<uint16_t>()[i]);
      EXPECT_EQ(yh.data<uint16_t>()[i], FloatToHalfBits(c.f(xh))) << c.op << " half " << xh;
      EXPECT_EQ(yb.data<uint16_t>()[i], FloatToBFloat16Bits(c.f(xb))) << c.op << " bf16 " << xb;
    }
  }
}

TEST(CpuElementwiseTest, UnaryIntegers) {
  EXPECT_EQ(Values(RunOp("Abs", {I32({4}, {-5, 0, 7, std::numeric_limits<int32_t>::min() + 1})})),
            (std::vector<double>{5, 0, 7, 2147483647.0}));
  EXPECT_EQ(Values(RunOp("Neg", {I64({3}, {-5, 0, 1LL << 40})})),
            (std::vector<double>{5, 0, -1099511627776.0}));
  EXPECT_EQ(Values(RunOp("Neg", {I8({3}, {-5, 0, 127})})), (std::vector<double>{5, 0, -127}));
  EXPECT_EQ(Values(RunOp("Relu", {I32({4}, {-5, 0, 3, -1})}, {}, 14)),
            (std::vector<double>{0, 0, 3, 0}));
  EXPECT_EQ(Values(RunOp("Abs", {U8({2}, {0, 200})})), (std::vector<double>{0, 200}));
  // Erf of integers truncates: 0 near zero, +-1 far out.
  EXPECT_EQ(Values(RunOp("Erf", {I32({4}, {0, 1, -9, 9})})), (std::vector<double>{0, 0, -1, 1}));
}

TEST(CpuElementwiseTest, ReluKeepsNanAndSigmoidSaturates) {
  Tensor y = RunOp("Relu", {F32({4}, {std::nanf(""), -2.0f, 2.0f, -0.0f})});
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(y.data<float>()[1], 0.0f);
  // -0 becomes +0, so Relu commutes with MaxPool to the bit
  // (passes/training_graph.cc).
  EXPECT_FALSE(std::signbit(y.data<float>()[3]));
  Tensor s = RunOp("Sigmoid", {F32({2}, {-1000.0f, 1000.0f})});
  EXPECT_EQ(s.data<float>()[0], 0.0f);
  EXPECT_EQ(s.data<float>()[1], 1.0f);
}

// 16-bit Relu runs on the bit patterns: over every one of the 65536, the
// widened result rounded back (x <= 0 ? +0 : x), a NaN for a NaN.
TEST(CpuElementwiseTest, Relu16BitOnEveryBitPatternIsTheWidenedResult) {
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    Tensor x(dtype, {65536});
    for (int64_t i = 0; i < 65536; ++i) x.data<uint16_t>()[i] = static_cast<uint16_t>(i);
    const Tensor y = RunOp("Relu", {x});
    ASSERT_EQ(y.dtype(), dtype);
    const bool bf16 = dtype == DType::kBFloat16;
    int differing = 0;
    for (int64_t i = 0; i < 65536; ++i) {
      const uint16_t b = static_cast<uint16_t>(i);
      const float wide = bf16 ? BFloat16BitsToFloat(b) : HalfBitsToFloat(b);
      const float relu = math::ReluOp{}(wide);
      const uint16_t got = y.data<uint16_t>()[i];
      const float got_value = bf16 ? BFloat16BitsToFloat(got) : HalfBitsToFloat(got);
      if (std::isnan(relu)) {
        differing += !std::isnan(got_value);
      } else {
        differing += got != (bf16 ? FloatToBFloat16Bits(relu) : FloatToHalfBits(relu));
      }
    }
    EXPECT_EQ(differing, 0) << DTypeName(dtype);
  }
}

// ---------------- activations of exported models ----------------

// An activation against its float64 reference on every float dtype
// (bfloat16 from opset 22, where these activations take it): the
// reference is evaluated at the input as the dtype stores it; float64 must
// agree to 1e-12, float32 to 2e-6, float16/bfloat16 to their rounding.
// NaN where the reference is NaN, infinities exactly, and the sign of zero.
struct ActivationCase {
  std::string op;
  std::vector<Attribute> attrs;
  int64_t opset;
  std::function<double(double)> reference;
  // The size of an intermediate that cancels (HardSigmoid's alpha x + beta
  // near 0), where the dtype's rounding of it bounds the error; none if null.
  std::function<double(double)> intermediate = nullptr;
};

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Edge values: infinities, huge, the kinks of the hard activations (+-3),
// values one float32 step inside them, -0/+0, subnormals, NaN.
std::vector<float> ActivationInputs() {
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {-inf,    -1e30f,     -100.0f, -6.0f,  -3.0000002f, -3.0f,  -2.9999998f,
          -1.5f,   -0.25f,     -1e-40f, -denorm, -0.0f,      0.0f,   denorm,
          1e-40f,  0.25f,      1.5f,    2.9999998f, 3.0f,    3.0000002f, 6.0f,
          100.0f,  1e30f,      inf,     nan};
}

void ExpectActivationMatchesReference(const ActivationCase& c) {
  const std::vector<float> inputs = ActivationInputs();
  const int64_t n = static_cast<int64_t>(inputs.size());
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    if (dtype == DType::kBFloat16 && c.opset < 22) continue;  // these ops take it from 22
    const std::vector<double> as_stored =
        RoundTo(dtype, std::vector<double>(inputs.begin(), inputs.end()));
    Tensor y = RunOp(c.op, {Make(dtype, {n}, as_stored)}, c.attrs, c.opset);
    ASSERT_EQ(y.dtype(), dtype) << c.op;
    ASSERT_EQ(y.num_elements(), n) << c.op;
    const double rtol = dtype == DType::kFloat64   ? 1e-12
                        : dtype == DType::kFloat32 ? 2e-6
                        : dtype == DType::kFloat16 ? 1.0 / 1024
                                                   : 1.0 / 128;
    // Underflow: a float32 result may flush where float64 keeps a tiny value.
    const double atol = dtype == DType::kFloat64 ? 1e-300 : dtype == DType::kFloat16 ? 6e-8 : 1e-38;
    const std::vector<double> got = Values(y);
    for (int64_t i = 0; i < n; ++i) {
      const double expected = c.reference(as_stored[i]);
      const std::string what =
          absl::StrCat(c.op, " ", DTypeName(dtype), " (", as_stored[i], ") = ", got[i],
                       ", expected ", expected);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(got[i])) << what;
      } else if (std::isinf(expected)) {
        EXPECT_EQ(got[i], expected) << what;
      } else {
        const double scale = std::max(
            std::fabs(expected), c.intermediate ? std::fabs(c.intermediate(as_stored[i])) : 0.0);
        EXPECT_NEAR(got[i], expected, rtol * scale + atol) << what;
        if (expected == 0.0 && got[i] == 0.0) {
          EXPECT_EQ(std::signbit(got[i]), std::signbit(expected)) << what << " (sign of zero)";
        }
      }
    }
  }
}

// max(lo, min(hi, v)) with NaN kept.
double ClampReference(double v, double lo, double hi) {
  if (std::isnan(v)) return v;
  return v <= lo ? lo : v >= hi ? hi : v;
}

TEST(CpuElementwiseTest, HardSigmoidAndHardSwishMatchFloat64Reference) {
  // alpha x + beta rounds once in float32 before it is clamped.
  auto product_and_offset = [](double alpha, double beta) {
    return [=](double x) { return std::fabs(alpha * x) + std::fabs(beta); };
  };
  const std::vector<ActivationCase> cases = {
      {"HardSigmoid", {}, 7,
       [](double x) { return ClampReference(static_cast<double>(0.2f) * x + 0.5, 0.0, 1.0); },
       product_and_offset(0.2, 0.5)},
      {"HardSigmoid",
       {Attribute::Float("alpha", 1.0f / 6), Attribute::Float("beta", 0.5f)},
       17,
       [](double x) { return ClampReference(static_cast<double>(1.0f / 6) * x + 0.5, 0, 1); },
       product_and_offset(1.0 / 6, 0.5)},
      {"HardSigmoid",
       {Attribute::Float("alpha", -0.5f), Attribute::Float("beta", 0.25f)},
       22,
       [](double x) { return ClampReference(-0.5 * x + 0.25, 0.0, 1.0); },
       product_and_offset(0.5, 0.25)},
      // x * clamp(x + 3, 0, 6) / 6: -0 below -3 (x * +0), NaN stays NaN.
      {"HardSwish", {}, 14,
       [](double x) { return x * ClampReference(x + 3.0, 0.0, 6.0) / 6.0; }},
  };
  for (const ActivationCase& c : cases) ExpectActivationMatchesReference(c);
  // x = -inf: -inf * 0 is NaN in the reference and in PyTorch alike.
  EXPECT_TRUE(std::isnan(
      RunOp("HardSwish", {F32({1}, {-std::numeric_limits<float>::infinity()})}, {}, 14)
          .data<float>()[0]));
}

TEST(CpuElementwiseTest, ExponentialAndSoftActivationsMatchFloat64Reference) {
  const double selu_alpha = static_cast<double>(1.67326319217681884765625f);
  const double selu_gamma = static_cast<double>(1.05070102214813232421875f);
  auto softplus = [](double x) {
    return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  };
  const std::vector<ActivationCase> cases = {
      {"Elu", {}, 7, [](double x) { return x > 0 ? x : std::expm1(x); }},
      {"Elu", {Attribute::Float("alpha", 0.5f)}, 22,
       [](double x) { return x > 0 ? x : 0.5 * std::expm1(x); }},
      {"Selu", {}, 7,
       [&](double x) { return x > 0 ? selu_gamma * x : selu_gamma * selu_alpha * std::expm1(x); }},
      {"Selu", {Attribute::Float("alpha", 2.0f), Attribute::Float("gamma", 0.5f)}, 22,
       [](double x) { return x > 0 ? 0.5 * x : 0.5 * 2.0 * std::expm1(x); }},
      {"Softplus", {}, 7, softplus},
      {"Softsign", {}, 7, [](double x) { return x / (1.0 + std::fabs(x)); }},
      {"ThresholdedRelu", {}, 10,
       [](double x) { return std::isnan(x) ? x : x > 1.0 ? x : 0.0; }},
      {"ThresholdedRelu", {Attribute::Float("alpha", -0.25f)}, 22,
       [](double x) { return std::isnan(x) ? x : x > -0.25 ? x : 0.0; }},
      {"Mish", {}, 18, [&](double x) { return x * std::tanh(softplus(x)); }},
  };
  for (const ActivationCase& c : cases) ExpectActivationMatchesReference(c);
  // Celu is float32 only.
  const std::vector<float> inputs = ActivationInputs();
  const int64_t n = static_cast<int64_t>(inputs.size());
  for (float alpha : {1.0f, 2.5f}) {
    Tensor y = RunOp("Celu", {F32({n}, inputs)}, {Attribute::Float("alpha", alpha)}, 12);
    for (int64_t i = 0; i < n; ++i) {
      const double x = inputs[i];
      const double want =
          std::isnan(x) ? x : std::max(0.0, x) + std::min(0.0, alpha * std::expm1(x / alpha));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(y.data<float>()[i])) << "Celu(" << x << ")";
      } else if (std::isinf(want)) {
        EXPECT_EQ(y.data<float>()[i], want) << "Celu(" << x << ")";
      } else {
        EXPECT_NEAR(y.data<float>()[i], want, 2e-6 * std::fabs(want) + 1e-38)
            << "Celu alpha " << alpha << " (" << x << ")";
      }
    }
  }
  EXPECT_FALSE(testing::RunNodeOf("Celu", {F16({1}, {1})}, {}, 12).ok());
}

// PRelu: the slope broadcasts to X (a scalar, per channel [C, 1, 1], a
// row), X's shape out; a slope that would grow X is an error.
TEST(CpuElementwiseTest, PReluBroadcastsTheSlopeToX) {
  const std::vector<float> x = {-2.0f, -0.0f, 0.0f, 1.5f, -1e-40f, -3.0f,
                                4.0f,  -5.0f, 0.5f, -0.5f, 2.0f,  -1.0f};
  struct Case {
    std::vector<int64_t> slope_dims;
    std::vector<float> slope;
  };
  const std::vector<int64_t> x_dims = {1, 3, 2, 2};
  for (const Case& c : std::vector<Case>{{{}, {0.25f}},
                                         {{3, 1, 1}, {0.1f, -2.0f, 0.5f}},
                                         {{2}, {0.3f, 3.0f}},
                                         {{1, 3, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const std::vector<double> xs = RoundTo(dtype, {x.begin(), x.end()});
      const std::vector<double> ss = RoundTo(dtype, {c.slope.begin(), c.slope.end()});
      Tensor y = RunOp("PRelu", {Make(dtype, x_dims, xs), Make(dtype, c.slope_dims, ss)}, {}, 16);
      ASSERT_EQ(y.dims(), x_dims);
      const std::vector<double> got = Values(y);
      for (int64_t i = 0; i < 12; ++i) {
        const double s = ss[BroadcastSource(c.slope_dims, x_dims, i)];
        const double want = RoundTo(dtype, {xs[i] < 0 ? s * xs[i] : xs[i]})[0];
        EXPECT_EQ(got[i], want) << DTypeName(dtype) << " PRelu(" << xs[i] << ", " << s << ")";
      }
    }
  }
  // Integers (opset 9+).
  EXPECT_EQ(Values(RunOp("PRelu", {I32({4}, {-3, 0, 5, -1}), I32({}, {2})}, {}, 9)),
            (std::vector<double>{-6, 0, 5, -2}));
  EXPECT_EQ(Values(RunOp("PRelu", {I64({2, 2}, {-3, 4, -5, -6}), I64({2, 1}, {-1, 3})}, {}, 9)),
            (std::vector<double>{3, 4, -15, -18}));
  absl::StatusOr<std::vector<Tensor>> grows =
      testing::RunNodeOf("PRelu", {F32({3}, {1, 2, 3}), F32({2, 3}, {1, 2, 3, 4, 5, 6})}, {}, 16);
  ASSERT_FALSE(grows.ok());
  EXPECT_NE(grows.status().message().find("unidirectional"), std::string::npos) << grows.status();
}

// Sign, Floor, Ceil, Round on the edge values (Round from opset 22 for
// bfloat16, the others from 13), halves for Round (to even), and Sign on
// every integer type.
TEST(CpuElementwiseTest, SignFloorCeilRoundMatchFloat64Reference) {
  const std::vector<ActivationCase> cases = {
      {"Sign", {}, 22, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x; }},
      {"Floor", {}, 22, [](double x) { return std::floor(x); }},
      {"Ceil", {}, 22, [](double x) { return std::ceil(x); }},
      {"Round", {}, 22, [](double x) { return std::nearbyint(x); }},
  };
  for (const ActivationCase& c : cases) ExpectActivationMatchesReference(c);
  const std::vector<float> halves = {-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 3.5f, 0.49999997f};
  EXPECT_EQ(Values(RunOp("Round", {F32({8}, halves)}, {}, 11)),
            (std::vector<double>{-2, -2, -0.0, 0, 2, 2, 4, 0}));
  EXPECT_TRUE(std::signbit(RunOp("Round", {F32({1}, {-0.5f})}, {}, 11).data<float>()[0]));
  const int32_t int32_min = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(Values(RunOp("Sign", {I32({4}, {-7, 0, 3, int32_min})}, {}, 13)),
            (std::vector<double>{-1, 0, 1, -1}));
  EXPECT_EQ(Values(RunOp("Sign", {I8({3}, {-128, 0, 127})}, {}, 13)),
            (std::vector<double>{-1, 0, 1}));
  EXPECT_EQ(Values(RunOp("Sign", {U8({3}, {0, 1, 255})}, {}, 13)), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(Values(RunOp("Sign", {I64({2}, {-(int64_t{1} << 40), int64_t{1} << 40})}, {}, 13)),
            (std::vector<double>{-1, 1}));
}

// HardSigmoid takes bfloat16 only from opset 22.
TEST(CpuElementwiseTest, HardSigmoidTakesBFloat16FromOpset22) {
  absl::StatusOr<std::vector<Tensor>> bf16 =
      testing::RunNodeOf("HardSigmoid", {BF16({2}, {1, 2})}, {}, 17);
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.status().message().find("bfloat16"), std::string::npos) << bf16.status();
}

// ---------------- binary ----------------

struct BinaryOpRef {
  std::string op;
  std::function<double(double, double)> f;
};

const std::vector<BinaryOpRef>& ArithmeticOps() {
  static const std::vector<BinaryOpRef> ops = {
      {"Add", [](double a, double b) { return a + b; }},
      {"Sub", [](double a, double b) { return a - b; }},
      {"Mul", [](double a, double b) { return a * b; }},
      {"Div", [](double a, double b) { return a / b; }},
  };
  return ops;
}

// Broadcast shapes: scalar, row, column, rank mismatch, both sides broadcast,
// same shape, large (threaded) and empty.
TEST(CpuElementwiseTest, ArithmeticBroadcastingFloat32) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{2, 3}, {}},        {{}, {2, 3}},          {{2, 3}, {3}},       {{2, 3}, {2, 1}},
      {{4, 1, 3}, {2, 1}}, {{2, 1, 3}, {1, 4, 1}}, {{2, 3, 4}, {2, 3, 4}}, {{1}, {5, 1, 1}},
      {{300, 1000}, {1000}}, {{257, 129}, {257, 1}}, {{100000}, {100000}}, {{0, 3}, {3}},
      {{3, 1, 2, 1}, {1, 4, 1, 5}},
  };
  for (const auto& [da, db] : shapes) {
    const std::vector<int64_t> out_dims = *common::BroadcastDims({da, db});
    const std::vector<float> a = Ramp(Count(da), 3.0f, 0.1f);
    std::vector<float> b = Ramp(Count(db), 2.0f, 4.5f);  // stays away from 0 for Div
    for (const BinaryOpRef& op : ArithmeticOps()) {
      Tensor y = RunOp(op.op, {F32(da, a), F32(db, b)});
      ASSERT_EQ(y.dims(), out_dims) << op.op;
      int mismatches = 0;
      for (int64_t i = 0; i < y.num_elements() && mismatches < 5; ++i) {
        const float x0 = a[BroadcastSource(da, out_dims, i)];
        const float x1 = b[BroadcastSource(db, out_dims, i)];
        // One correctly rounded float operation equals the double result rounded.
        const float expected = static_cast<float>(op.f(x0, x1));
        if (y.data<float>()[i] != expected) {
          ++mismatches;
          ADD_FAILURE() << op.op << " " << common::DimsToString(da) << " "
                        << common::DimsToString(db) << " element " << i << ": "
                        << y.data<float>()[i] << " vs " << expected;
        }
      }
    }
  }
}

TEST(CpuElementwiseTest, AddOfHalvesRoundsOnceToEven) {
  // 1 + 2^-11 lies exactly between two halves: ties to even (1.0);
  // (1 + 2^-10) + 2^-11 ties up to 1 + 2^-9.
  const float lsb = std::ldexp(1.0f, -10);
  Tensor y = RunOp("Add", {F16({3}, {1.0f, 1.0f + lsb, 1.0f}),
                         F16({3}, {lsb / 2, lsb / 2, lsb / 2 + lsb / 4})});
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_EQ(Bits(y), (std::vector<uint16_t>{FloatToHalfBits(1.0f), FloatToHalfBits(1.0f + 2 * lsb),
                                            FloatToHalfBits(1.0f + lsb)}));
  EXPECT_EQ(Bits(y)[0], 0x3c00);
  // bfloat16: 1 + 2^-8 ties to even 1.0; 1 + 2^-8 + 2^-9 rounds up.
  const float blsb = std::ldexp(1.0f, -7);
  Tensor z = RunOp("Add", {BF16({2}, {1.0f, 1.0f}), BF16({2}, {blsb / 2, blsb / 2 + blsb / 4})});
  EXPECT_EQ(Bits(z), (std::vector<uint16_t>{0x3f80, FloatToBFloat16Bits(1.0f + blsb)}));
}

TEST(CpuElementwiseTest, ArithmeticHalfMatchesFloat32RoundedOnce) {
  const std::vector<float> a = Ramp(64, 5.0f, 0.3f), b = Ramp(8, 3.0f, 4.1f);
  for (const BinaryOpRef& op : ArithmeticOps()) {
    Tensor ha = F16({8, 8}, a), hb = F16({8}, b);
    Tensor y = RunOp(op.op, {ha, hb});
    for (int i = 0; i < 64; ++i) {
      const float x0 = HalfBitsToFloat(ha.data<uint16_t>()[i]);
      const float x1 = HalfBitsToFloat(hb.data<uint16_t>()[i % 8]);
      EXPECT_EQ(y.data<uint16_t>()[i],
                FloatToHalfBits(static_cast<float>(op.f(x0, x1))))
          << op.op << " " << x0 << ", " << x1;
    }
  }
}

// Long 16-bit runs go through the fused AVX-512 loop (where the CPU has it)
// and the blocked path (widen a block with the bulk conversion, compute in
// float32, narrow once): every element must still be the float32 result of
// the widened inputs rounded once, across vector and block boundaries,
// tails, and each broadcast pattern (dense, row, column, scalar).
class Long16BitRuns : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam() && !cpu::HasSimd16()) GTEST_SKIP() << "this CPU has no AVX-512 (F/BW/VL)";
    scoped_.emplace(GetParam());
  }

 private:
  std::optional<cpu::ScopedFusedSimd16ForTesting> scoped_;
};

INSTANTIATE_TEST_SUITE_P(FusedAndBlocked, Long16BitRuns, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Fused" : "Blocked";
                         });

TEST_P(Long16BitRuns, MatchPerElementReference) {
  constexpr int64_t kRows = 3, kCols = 1037;  // runs over two 512 blocks plus a tail
  std::vector<float> wide(kRows * kCols), row(kCols), column(kRows);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = 40.0f * std::sin(0.37f * i) + 0.01f * i;
  for (size_t i = 0; i < row.size(); ++i) row[i] = 3.0f * std::cos(0.11f * i) + 0.5f;
  for (size_t i = 0; i < column.size(); ++i) column[i] = -1.75f + 2.5f * i;
  wide[700] = std::numeric_limits<float>::infinity();
  wide[701] = std::nanf("");
  struct Shape {
    const char* name;
    std::vector<int64_t> dims;
    const std::vector<float>* values;
    // Element (r, c) of the broadcast is values[r * row_stride + c * column_stride].
    int64_t row_stride, column_stride;
  };
  const std::vector<float> scalar = {1.3f};
  const Shape dense{"dense", {kRows, kCols}, &wide, kCols, 1};
  const std::vector<Shape> others = {dense, {"row", {kCols}, &row, 0, 1},
                                     {"column", {kRows, 1}, &column, 1, 0},
                                     {"scalar", {}, &scalar, 0, 0}};
  for (bool half : {true, false}) {
    auto make = [&](const Shape& s) {
      return half ? F16(s.dims, *s.values) : BF16(s.dims, *s.values);
    };
    auto widen = [&](const Tensor& t, int64_t i) {
      const uint16_t bits = t.data<uint16_t>()[i];
      return half ? HalfBitsToFloat(bits) : BFloat16BitsToFloat(bits);
    };
    auto narrow = [&](float v) { return half ? FloatToHalfBits(v) : FloatToBFloat16Bits(v); };
    const Tensor a = make(dense);
    for (const Shape& other : others) {
      const Tensor b = make(other);
      for (const BinaryOpRef& op : ArithmeticOps()) {
        for (bool swap : {false, true}) {
          Tensor y = swap ? RunOp(op.op, {b, a}) : RunOp(op.op, {a, b});
          ASSERT_EQ(y.num_elements(), kRows * kCols);
          for (int64_t r = 0; r < kRows; ++r) {
            for (int64_t c = 0; c < kCols; ++c) {
              const float x0 = widen(a, r * kCols + c);
              const float x1 = widen(b, r * other.row_stride + c * other.column_stride);
              const float expected = static_cast<float>(swap ? op.f(x1, x0) : op.f(x0, x1));
              ASSERT_EQ(y.data<uint16_t>()[r * kCols + c], narrow(expected))
                  << op.op << (half ? " half " : " bf16 ") << "other " << other.name
                  << (swap ? " swapped" : "") << " at " << r << "," << c;
            }
          }
        }
      }
      // Sum of three (variadic path): accumulated in float32 in input order.
      Tensor sum = RunOp("Sum", {a, b, a}, {}, 13);
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t c = 0; c < kCols; ++c) {
          const float x0 = widen(a, r * kCols + c);
          const float x1 = widen(b, r * other.row_stride + c * other.column_stride);
          ASSERT_EQ(sum.data<uint16_t>()[r * kCols + c], narrow((x0 + x1) + x0))
              << "Sum " << other.name << " at " << r << "," << c;
        }
      }
    }
    Tensor e = RunOp("Exp", {a});
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      ASSERT_EQ(e.data<uint16_t>()[i], narrow(std::exp(widen(a, i)))) << "Exp at " << i;
    }
  }
}

TEST(CpuElementwiseTest, IntegerArithmetic) {
  // Div truncates toward zero.
  EXPECT_EQ(Values(RunOp("Div", {I32({4}, {-7, 7, -7, 7}), I32({4}, {2, 2, -2, -2})})),
            (std::vector<double>{-3, 3, 3, -3}));
  EXPECT_EQ(Values(RunOp("Div", {I64({3}, {9, -9, 100}), I64({}, {4})})),
            (std::vector<double>{2, -2, 25}));
  EXPECT_EQ(Values(RunOp("Add", {I64({2}, {1LL << 40, -5}), I64({1}, {3})})),
            (std::vector<double>{1099511627779.0, -2}));
  EXPECT_EQ(Values(RunOp("Mul", {I32({2, 1}, {3, -4}), I32({3}, {1, 2, 3})})),
            (std::vector<double>{3, 6, 9, -4, -8, -12}));
  EXPECT_EQ(Values(RunOp("Sub", {I8({2}, {-100, 5}), I8({2}, {100, 10})}, {}, 14)),
            (std::vector<double>{56, -5}));  // -200 wraps to 56 in int8
  EXPECT_EQ(Values(RunOp("Add", {U8({2}, {250, 1}), U8({2}, {10, 2})}, {}, 14)),
            (std::vector<double>{4, 3}));
}

TEST(CpuElementwiseTest, PowMixedTypes) {
  // float32 base, int32 / int64 exponents.
  Tensor y = RunOp("Pow", {F32({3}, {2.0f, -3.0f, 0.5f}), I32({3}, {3, 2, -2})}, {}, 15);
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  EXPECT_EQ(Values(y), (std::vector<double>{8, 9, 4}));
  y = RunOp("Pow", {F32({2, 2}, {1.5f, 2.0f, 3.0f, 4.0f}), I64({2}, {2, 3})}, {}, 15);
  EXPECT_EQ(Values(y), (std::vector<double>{2.25, 8, 9, 64}));
  // int64 base, float32 exponent: computed in double, truncated.
  y = RunOp("Pow", {I64({3}, {2, 3, 10}), F32({3}, {0.5f, 2.0f, -1.0f})}, {}, 15);
  EXPECT_EQ(y.dtype(), DType::kInt64);
  EXPECT_EQ(Values(y), (std::vector<double>{1, 9, 0}));
  // int32 base, int32 exponent.
  y = RunOp("Pow", {I32({4}, {2, -3, 7, 1}), I32({4}, {10, 3, 0, -5})}, {}, 15);
  EXPECT_EQ(Values(y), (std::vector<double>{1024, -27, 1, 1}));
  // float32 ** float32 with a scalar exponent, opset 7 (same types).
  y = RunOp("Pow", {F32({3}, {4.0f, 9.0f, 2.0f}), F32({}, {0.5f})}, {}, 7);
  EXPECT_NEAR(y.data<float>()[0], 2.0f, 1e-6);
  EXPECT_NEAR(y.data<float>()[1], 3.0f, 1e-6);
  EXPECT_NEAR(y.data<float>()[2], std::sqrt(2.0f), 1e-6);
  // float16 base, float32 exponent: float32 power rounded once.
  Tensor h = F16({2}, {1.1f, 3.3f});
  y = RunOp("Pow", {h, F32({2}, {2.5f, 1.7f})}, {}, 15);
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_EQ(y.data<uint16_t>()[0],
            FloatToHalfBits(std::pow(HalfBitsToFloat(h.data<uint16_t>()[0]), 2.5f)));
  EXPECT_EQ(y.data<uint16_t>()[1],
            FloatToHalfBits(std::pow(HalfBitsToFloat(h.data<uint16_t>()[1]), 1.7f)));
}

// Exponents 2 and 1 are a multiply and a copy: the correctly rounded
// square (pow may be an ulp off), and the special values pow gives.
TEST(CpuElementwiseTest, PowSquareAndIdentityAreExact) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> bases = {1.1f, -3.7f, 1e-30f, 3e30f, -0.0f, -inf, 0.1f, 7.77f};
  Tensor x = F32({8}, bases);
  Tensor squared = RunOp("Pow", {x, F32({}, {2.0f})}, {}, 15);
  Tensor same = RunOp("Pow", {x, I64({}, {1})}, {}, 15);
  for (size_t i = 0; i < bases.size(); ++i) {
    const float b = bases[i];
    EXPECT_EQ(squared.data<float>()[i], b * b) << "base " << b;
    EXPECT_EQ(same.data<float>()[i], b) << "base " << b;
    EXPECT_EQ(std::signbit(same.data<float>()[i]), std::signbit(b)) << "base " << b;
  }
  EXPECT_EQ(squared.data<float>()[2], 0.0f);   // underflows to +0
  EXPECT_EQ(squared.data<float>()[3], inf);    // overflows
  EXPECT_EQ(squared.data<float>()[5], inf);    // (-inf)^2
  Tensor nan = RunOp("Pow", {F32({1}, {std::nanf("")}), F32({}, {2.0f})}, {}, 15);
  EXPECT_TRUE(std::isnan(nan.data<float>()[0]));
}

TEST(CpuElementwiseTest, EqualReturnsBoolOnEveryDtype) {
  Tensor y = RunOp("Equal", {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({3}, {1, 5, 6})}, {}, 13);
  ASSERT_EQ(y.dtype(), DType::kBool);
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0, 0, 0, 1, 1}));
  y = RunOp("Equal", {I64({3}, {7, -1, 3}), I64({}, {7})});
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0, 0}));
  y = RunOp("Equal", {Bool({4}, {1, 1, 0, 0}), Bool({4}, {1, 0, 1, 0})});
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0, 0, 1}));
  y = RunOp("Equal", {I32({2, 1}, {1, 2}), I32({1, 2}, {2, 1})});
  EXPECT_EQ(Values(y), (std::vector<double>{0, 1, 1, 0}));
  // Floats compare by value: +0 == -0, NaN != NaN.
  y = RunOp("Equal", {F16({3}, {0.0f, std::nanf(""), 1.5f}), F16({3}, {-0.0f, std::nanf(""), 1.5f})});
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0, 1}));
  y = RunOp("Equal", {U8({2}, {3, 4}), U8({2}, {3, 5})});
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0}));
}

// Less, Greater, LessOrEqual, GreaterOrEqual on every dtype against the
// test's own comparison of the values as stored, broadcast both ways; IEEE
// on floats (NaN compares false, -0 equals +0, infinities order).
TEST(CpuElementwiseTest, OrderedComparisonsReturnBoolOnEveryDtype) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a_values = {1.5f, -2.0f, 0.0f, -0.0f, nan, inf, -inf, 3.0f};
  const std::vector<float> b_values = {1.5f, -1.0f, -0.0f, 0.0f, 1.0f, inf, 0.0f, nan};
  struct Case {
    std::string op;
    std::function<bool(double, double)> reference;
    int64_t opset;
  };
  const std::vector<Case> cases = {
      {"Less", [](double a, double b) { return a < b; }, 13},
      {"Greater", [](double a, double b) { return a > b; }, 13},
      {"LessOrEqual", [](double a, double b) { return a <= b; }, 16},
      {"GreaterOrEqual", [](double a, double b) { return a >= b; }, 16},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const std::vector<double> a = RoundTo(dtype, {a_values.begin(), a_values.end()});
      const std::vector<double> b = RoundTo(dtype, {b_values.begin(), b_values.end()});
      Tensor y = RunOp(c.op, {Make(dtype, {8}, a), Make(dtype, {8}, b)}, {}, c.opset);
      ASSERT_EQ(y.dtype(), DType::kBool) << c.op;
      for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(y.data<bool>()[i], c.reference(a[i], b[i]))
            << c.op << " " << DTypeName(dtype) << " " << a[i] << " vs " << b[i];
      }
    }
    // Broadcasting: [2, 1] against [3] gives [2, 3]; integer types.
    Tensor y = RunOp(c.op, {I64({2, 1}, {2, -5}), I64({3}, {1, 2, 3})}, {}, c.opset);
    ASSERT_EQ(y.dims(), (std::vector<int64_t>{2, 3})) << c.op;
    const std::vector<int64_t> col = {2, -5}, row = {1, 2, 3};
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(y.data<bool>()[i], c.reference(static_cast<double>(col[i / 3]), row[i % 3]))
          << c.op << " int64 [" << i << "]";
    }
    // int8 and uint8 extremes compare in their own type.
    Tensor s = RunOp(c.op, {I8({3}, {-128, 127, 0}), I8({}, {0})}, {}, c.opset);
    Tensor u = RunOp(c.op, {U8({3}, {255, 0, 7}), U8({}, {7})}, {}, c.opset);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(s.data<bool>()[i], c.reference(std::vector<double>{-128, 127, 0}[i], 0)) << c.op;
      EXPECT_EQ(u.data<bool>()[i], c.reference(std::vector<double>{255, 0, 7}[i], 7)) << c.op;
    }
    Tensor i32 = RunOp(c.op, {I32({2}, {std::numeric_limits<int32_t>::min(), 4}), I32({2}, {4, 4})},
                       {}, c.opset);
    EXPECT_EQ(i32.data<bool>()[0], c.reference(-2147483648.0, 4)) << c.op;
    EXPECT_EQ(i32.data<bool>()[1], c.reference(4, 4)) << c.op;
  }
}

// Less/Greater have no bfloat16 before opset 13; both inputs share a dtype.
TEST(CpuElementwiseTest, ComparisonsFollowTheirOpsetHistory) {
  absl::StatusOr<std::vector<Tensor>> bf16 =
      testing::RunNodeOf("Less", {BF16({1}, {1}), BF16({1}, {2})}, {}, 12);
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.status().message().find("bfloat16"), std::string::npos) << bf16.status();
  EXPECT_FALSE(testing::RunNodeOf("Less", {F32({1}, {1}), I32({1}, {2})}, {}, 13).ok());
}

TEST(CpuElementwiseTest, LogicTruthTablesWithBroadcasting) {
  // [4] x [2, 1] covers every pair of truth values twice.
  const Tensor a = Bool({4}, {0, 1, 0, 1});
  const Tensor b = Bool({2, 1}, {0, 1});
  const std::vector<std::pair<std::string, std::function<bool(bool, bool)>>> ops = {
      {"And", [](bool x, bool y) { return x && y; }},
      {"Or", [](bool x, bool y) { return x || y; }},
      {"Xor", [](bool x, bool y) { return x != y; }}};
  for (const auto& [op, reference] : ops) {
    Tensor y = RunOp(op, {a, b}, {}, 7);
    ASSERT_EQ(y.dtype(), DType::kBool) << op;
    ASSERT_EQ(y.dims(), (std::vector<int64_t>{2, 4})) << op;
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(y.data<bool>()[i], reference(a.data<bool>()[i % 4], b.data<bool>()[i / 4]))
          << op << " [" << i << "]";
    }
  }
  EXPECT_EQ(Values(RunOp("Not", {Bool({2, 2}, {0, 1, 1, 0})}, {}, 7)),
            (std::vector<double>{1, 0, 0, 1}));
  EXPECT_EQ(RunOp("Not", {Bool({0}, {})}, {}, 7).num_elements(), 0);
  // Logic ops take bool only.
  absl::StatusOr<std::vector<Tensor>> ints =
      testing::RunNodeOf("And", {I32({1}, {1}), I32({1}, {1})}, {}, 7);
  ASSERT_FALSE(ints.ok());
  EXPECT_NE(ints.status().message().find("And"), std::string::npos) << ints.status();
}

// Mod against the test's own remainders: fmod = 0 takes the divisor's sign
// (Python's %, floor division), fmod = 1 the dividend's (C's %, fmod).
int64_t FloorMod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  const int64_t q = static_cast<int64_t>(std::floor(static_cast<long double>(a) / b));
  return a - q * b;
}
int64_t TruncMod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  const int64_t q = static_cast<int64_t>(std::trunc(static_cast<long double>(a) / b));
  return a - q * b;
}

TEST(CpuElementwiseTest, ModIntegersBothSignConventions) {
  const std::vector<int64_t> a = {7, -7, 7, -7, 6, -6, 0, 5, 100, -101};
  const std::vector<int64_t> b = {3, 3, -3, -3, 3, -3, 4, 0, 7, 10};
  const int64_t n = static_cast<int64_t>(a.size());
  for (int fmod : {0, 1}) {
    for (DType dtype : {DType::kInt32, DType::kInt64}) {
      Tensor y = RunOp("Mod", {Make(dtype, {n}, {a.begin(), a.end()}),
                               Make(dtype, {n}, {b.begin(), b.end()})},
                       {Attribute::Int("fmod", fmod)}, 13);
      ASSERT_EQ(y.dtype(), dtype);
      const std::vector<double> got = Values(y);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t want = fmod ? TruncMod(a[i], b[i]) : FloorMod(a[i], b[i]);
        EXPECT_EQ(got[i], static_cast<double>(want))
            << "fmod=" << fmod << " " << DTypeName(dtype) << " " << a[i] << " mod " << b[i];
      }
    }
    // int8 extremes: -128 mod -1 is 0 (no overflow), -128 mod 3.
    Tensor small = RunOp("Mod", {I8({3}, {-128, -128, 127}), I8({3}, {-1, 3, -2})},
                         {Attribute::Int("fmod", fmod)}, 13);
    EXPECT_EQ(Values(small), (std::vector<double>{0, static_cast<double>(fmod ? TruncMod(-128, 3)
                                                                               : FloorMod(-128, 3)),
                                                  static_cast<double>(fmod ? TruncMod(127, -2)
                                                                           : FloorMod(127, -2))}));
    // Unsigned: one convention; broadcast a scalar divisor.
    Tensor u =
        RunOp("Mod", {U8({3}, {250, 7, 0}), U8({}, {7})}, {Attribute::Int("fmod", fmod)}, 13);
    EXPECT_EQ(Values(u), (std::vector<double>{5, 0, 0}));
  }
}

TEST(CpuElementwiseTest, ModFloatsBothSignConventionsAndSpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> a = {5.5, -5.5, 5.5, -5.5, 6.0, -6.0, 0.25, 1.0, inf, 3.0, 1e-40};
  const std::vector<double> b = {2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.125, 2.0, inf, 3.0};
  const int64_t n = static_cast<int64_t>(a.size());
  for (int fmod : {0, 1}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const std::vector<double> as = RoundTo(dtype, a), bs = RoundTo(dtype, b);
      Tensor y = RunOp("Mod", {Make(dtype, {n}, as), Make(dtype, {n}, bs)},
                       {Attribute::Int("fmod", fmod)}, 13);
      ASSERT_EQ(y.dtype(), dtype);
      const std::vector<double> got = Values(y);
      for (int64_t i = 0; i < n; ++i) {
        // The reference: C fmod in double, moved to the divisor's sign for
        // fmod = 0, a zero result signed like the divisor (numpy's np.mod).
        double want = std::fmod(as[i], bs[i]);
        if (fmod == 0 && !std::isnan(want)) {
          if (want != 0 && (want < 0) != (bs[i] < 0)) want += bs[i];
          if (want == 0) want = std::copysign(0.0, bs[i]);
        }
        const std::string what = absl::StrCat("fmod=", fmod, " ", DTypeName(dtype), " ", as[i],
                                              " mod ", bs[i], " = ", got[i], ", expected ", want);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got[i])) << what;
        } else {
          const double rounded = RoundTo(dtype, {want})[0];
          EXPECT_EQ(got[i], rounded) << what;
          EXPECT_EQ(std::signbit(got[i]), std::signbit(rounded)) << what;
        }
      }
    }
  }
  // Broadcasting: [2, 1] mod [3].
  Tensor y = RunOp("Mod", {F32({2, 1}, {7.0f, -7.0f}), F32({3}, {2.0f, -3.0f, 4.0f})}, {}, 13);
  EXPECT_EQ(Values(y), (std::vector<double>{1, -2, 3, 1, -1, 1}));
  // fmod must be 0 or 1.
  absl::StatusOr<std::vector<Tensor>> bad = testing::RunNodeOf(
      "Mod", {F32({1}, {1}), F32({1}, {2})}, {Attribute::Int("fmod", 2)}, 13);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fmod"), std::string::npos) << bad.status();
}

TEST(CpuElementwiseTest, IsNaNAndIsInf) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<double> x = {1.0, std::nan(""), inf, -inf, -0.0, 1e-40, -3e38};
  const int64_t n = static_cast<int64_t>(x.size());
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const std::vector<double> stored = RoundTo(dtype, x);  // -3e38 is -inf in float16
    Tensor nan = RunOp("IsNaN", {Make(dtype, {n}, stored)}, {}, 20);
    ASSERT_EQ(nan.dtype(), DType::kBool);
    const std::vector<std::pair<int, int>> detect = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};
    for (const auto& [neg, pos] : detect) {
      Tensor isinf = RunOp("IsInf", {Make(dtype, {n}, stored)},
                           {Attribute::Int("detect_negative", neg),
                            Attribute::Int("detect_positive", pos)},
                           20);
      ASSERT_EQ(isinf.dtype(), DType::kBool);
      for (int64_t i = 0; i < n; ++i) {
        const bool want = std::isinf(stored[i]) && (stored[i] > 0 ? pos : neg);
        EXPECT_EQ(isinf.data<bool>()[i], want)
            << DTypeName(dtype) << " IsInf(" << stored[i] << ") neg=" << neg << " pos=" << pos;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(nan.data<bool>()[i], std::isnan(stored[i])) << DTypeName(dtype) << " " << stored[i];
    }
  }
  // IsInf takes float16 only from opset 20.
  EXPECT_FALSE(testing::RunNodeOf("IsInf", {F16({1}, {1})}, {}, 19).ok());
}

TEST(CpuElementwiseTest, WhereBroadcastsThreeWays) {
  Tensor cond = Bool({2, 1}, {1, 0});
  Tensor y = RunOp("Where", {cond, F32({1, 3}, {1, 2, 3}), F32({}, {-1})}, {}, 16);
  EXPECT_EQ(y.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values(y), (std::vector<double>{1, 2, 3, -1, -1, -1}));
  y = RunOp("Where", {Bool({3}, {0, 1, 0}), I64({2, 1}, {10, 20}), I64({2, 3}, {1, 2, 3, 4, 5, 6})},
          {}, 16);
  EXPECT_EQ(Values(y), (std::vector<double>{1, 10, 3, 4, 20, 6}));
  Tensor h = RunOp("Where", {Bool({2}, {1, 0}), F16({2}, {0.1f, 0.2f}), F16({2}, {0.3f, 0.4f})});
  EXPECT_EQ(Bits(h), (std::vector<uint16_t>{FloatToHalfBits(0.1f), FloatToHalfBits(0.4f)}));
  Tensor b = RunOp("Where", {Bool({2}, {1, 0}), Bool({2}, {1, 1}), Bool({2}, {0, 0})});
  EXPECT_EQ(Values(b), (std::vector<double>{1, 0}));
}

TEST(CpuElementwiseTest, VariadicMaxMinSum) {
  // Three inputs with broadcasting: [3], [2,1], [].
  Tensor a = F32({3}, {1, 5, -2}), b = F32({2, 1}, {0, 4}), c = F32({}, {2});
  EXPECT_EQ(Values(RunOp("Max", {a, b, c}, {}, 13)), (std::vector<double>{2, 5, 2, 4, 5, 4}));
  EXPECT_EQ(Values(RunOp("Min", {a, b, c}, {}, 13)), (std::vector<double>{0, 0, -2, 1, 2, -2}));
  EXPECT_EQ(Values(RunOp("Sum", {a, b, c}, {}, 13)), (std::vector<double>{3, 7, 0, 7, 11, 4}));
  // One input: a copy.
  EXPECT_EQ(Values(RunOp("Sum", {a}, {}, 13)), (std::vector<double>{1, 5, -2}));
  EXPECT_EQ(Values(RunOp("Max", {I32({2}, {3, -3})}, {}, 13)), (std::vector<double>{3, -3}));
  // Integers, two inputs.
  EXPECT_EQ(Values(RunOp("Max", {I64({3}, {1, 9, -4}), I64({3}, {2, 3, -5})}, {}, 13)),
            (std::vector<double>{2, 9, -4}));
  EXPECT_EQ(Values(RunOp("Min", {I32({3}, {1, 9, -4}), I32({1}, {2})}, {}, 13)),
            (std::vector<double>{1, 2, -4}));
  // NaN propagates through Max and Min.
  Tensor y = RunOp("Max", {F32({2}, {std::nanf(""), 1}), F32({2}, {3, std::nanf("")})}, {}, 13);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_TRUE(std::isnan(y.data<float>()[1]));
}

TEST(CpuElementwiseTest, HalfSumOfThreeRoundsOnce) {
  // 1 + 2^-11 + 2^-20 in float32 is just above the midpoint between 1 and
  // 1 + 2^-10: rounded once it is 1 + 2^-10; pairwise half rounding gives 1.
  Tensor y = RunOp("Sum",
                 {F16({1}, {1.0f}), F16({1}, {std::ldexp(1.0f, -11)}),
                  F16({1}, {std::ldexp(1.0f, -20)})},
                 {}, 13);
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_EQ(Bits(y)[0], FloatToHalfBits(1.0f + std::ldexp(1.0f, -10)));
}

TEST(CpuElementwiseTest, ClipAttributesAndInputs) {
  const Tensor x = F32({5}, {-3, -1, 0, 2, 7});
  // Opset 7: attributes.
  EXPECT_EQ(Values(RunOp("Clip", {x}, {Attribute::Float("min", -1.5f), Attribute::Float("max", 2.5f)},
                       7)),
            (std::vector<double>{-1.5, -1, 0, 2, 2.5}));
  EXPECT_EQ(Values(RunOp("Clip", {x}, {Attribute::Float("max", 1.0f)}, 7)),
            (std::vector<double>{-3, -1, 0, 1, 1}));
  // Opset 13: scalar inputs, either may be omitted.
  EXPECT_EQ(Values(RunOp("Clip", {x, F32({}, {-2}), F32({}, {1})}, {}, 13)),
            (std::vector<double>{-2, -1, 0, 1, 1}));
  EXPECT_EQ(Values(RunOp("Clip", {x, Omitted(), F32({}, {0})}, {}, 13)),
            (std::vector<double>{-3, -1, 0, 0, 0}));
  EXPECT_EQ(Values(RunOp("Clip", {x, F32({}, {0})}, {}, 13)), (std::vector<double>{0, 0, 0, 2, 7}));
  EXPECT_EQ(Values(RunOp("Clip", {x}, {}, 13)), Values(x));
  // min > max: everything becomes max.
  EXPECT_EQ(Values(RunOp("Clip", {x, F32({}, {3}), F32({}, {1})}, {}, 13)),
            (std::vector<double>{1, 1, 1, 1, 1}));
  // Integers.
  EXPECT_EQ(Values(RunOp("Clip", {I32({4}, {-9, 0, 5, 100}), I32({}, {-1}), I32({}, {10})}, {}, 13)),
            (std::vector<double>{-1, 0, 5, 10}));
  EXPECT_EQ(Values(RunOp("Clip", {I64({2}, {-9, 100}), Omitted(), I64({}, {10})}, {}, 13)),
            (std::vector<double>{-9, 10}));
  // NaN stays NaN.
  Tensor y = RunOp("Clip", {F32({1}, {std::nanf("")}), F32({}, {0}), F32({}, {1})}, {}, 13);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  // float16 bounds.
  Tensor h = RunOp("Clip", {F16({3}, {-5, 0.3f, 5}), F16({}, {-1}), F16({}, {1})}, {}, 13);
  EXPECT_EQ(Bits(h), (std::vector<uint16_t>{FloatToHalfBits(-1), FloatToHalfBits(0.3f),
                                            FloatToHalfBits(1)}));
}

TEST(CpuElementwiseTest, KernelReportsShapesThatDoNotBroadcast) {
  SingleNode node("Add", {F32({2, 3}, Ramp(6, 1, 0)), F32({3}, {1, 2, 3})}, {}, 17);
  ASSERT_TRUE(node.status().ok()) << node.status();
  const Tensor a = F32({2, 3}, Ramp(6, 1, 0)), b = F32({4}, {1, 2, 3, 4});
  absl::StatusOr<std::vector<Tensor>> out = RunNode(Cpu(), node.node(), 17, {&a, &b});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("do not broadcast"), std::string::npos) << out.status();
  EXPECT_NE(out.status().message().find("Add node"), std::string::npos) << out.status();
}

// ---------------- in place ----------------

// Hands out input 0's buffer as output 0, as the executor does when it
// reuses an input in place; the other outputs get buffers of their own.
class AliasingAllocator : public OutputAllocator {
 public:
  explicit AliasingAllocator(void* input0) : input0_(input0) {}
  absl::StatusOr<void*> AllocateOutput(int index, DType dtype,
                                       const std::vector<int64_t>& dims) override {
    if (index == 0) return input0_;
    others_.emplace_back(dtype, dims);
    return others_.back().raw();
  }
  std::vector<Tensor> others() const { return {others_.begin(), others_.end()}; }
  absl::StatusOr<void*> AllocateScratch(size_t bytes) override {
    scratch_.emplace_back(bytes);
    return scratch_.back().data();
  }

 private:
  void* input0_;
  std::vector<std::vector<uint8_t>> scratch_;
  std::deque<Tensor> others_;  // element addresses stay put as it grows
};

// Runs the node's kernel with output 0 sharing input 0's buffer; returns
// input 0's tensor after the run (`others`: the other outputs).
Tensor RunInPlace(const std::string& op, std::vector<Tensor> inputs, int64_t opset = 17,
                  int num_outputs = 1, const std::string& domain = "",
                  std::vector<Tensor>* others = nullptr) {
  SingleNode node(op, inputs, {}, opset, num_outputs, domain);
  EXPECT_TRUE(node.status().ok()) << node.status();
  absl::StatusOr<const KernelDef*> kernel = Cpu().kernels().Find(node.node());
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  if (!kernel.ok()) return Tensor();
  EXPECT_TRUE((*kernel)->in_place_ok) << op;
  std::vector<TensorView> views;
  for (Tensor& t : inputs) views.push_back(TensorView{t.raw(), t.dtype(), t.dims()});
  std::vector<const TensorView*> ptrs;
  for (const TensorView& v : views) ptrs.push_back(&v);
  AliasingAllocator allocator(inputs[0].raw());
  KernelContext ctx(node.node(), opset, Cpu(), ptrs, allocator);
  absl::Status s = (*kernel)->run(ctx);
  EXPECT_TRUE(s.ok()) << s;
  if (others != nullptr) *others = allocator.others();
  return inputs[0];
}

TEST(CpuElementwiseTest, InPlaceKernelsReadBeforeWriting) {
  const std::vector<int64_t> big = {70, 1000};
  const std::vector<float> a = Ramp(70000, 2.0f, 0.5f), b = Ramp(1000, 1.0f, 3.0f);
  Tensor y = RunInPlace("Mul", {F32(big, a), F32({1000}, b)});
  for (int64_t i = 0; i < 70000; i += 997) {
    EXPECT_EQ(y.data<float>()[i], a[i] * b[i % 1000]) << i;
  }
  y = RunInPlace("Sub", {F32({3, 2}, {1, 2, 3, 4, 5, 6}), F32({3, 1}, {1, 2, 3})});
  EXPECT_EQ(Values(y), (std::vector<double>{0, 1, 1, 2, 2, 3}));
  y = RunInPlace("Relu", {F32({4}, {-1, 2, -3, 4})});
  EXPECT_EQ(Values(y), (std::vector<double>{0, 2, 0, 4}));
  y = RunInPlace("Sum", {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {10, 20}), F32({}, {100})}, 13);
  EXPECT_EQ(Values(y), (std::vector<double>{111, 122, 113, 124}));
  y = RunInPlace("Pow", {F32({3}, {2, 3, 4}), I64({}, {2})}, 15);
  EXPECT_EQ(Values(y), (std::vector<double>{4, 9, 16}));
}

// The gradient kernels that write dX over dY (ReluGrad, GeluGrad,
// BatchNormalizationGrad) give the bits of their out-of-place runs, in
// float32 and bfloat16, over more than one thread's share.
TEST(CpuElementwiseTest, InPlaceGradientKernelsMatchTheirOutOfPlaceRuns) {
  const std::vector<int64_t> dims = {6, 5, 33, 41};
  const int64_t n = 6 * 5 * 33 * 41;
  // x of both signs (ReluGrad's mask), around a mean away from zero.
  const Tensor dy = F32(dims, Ramp(n, 1.5f, 0.1f)), x = F32(dims, Ramp(n, 3.0f, 0.7f));
  const Tensor scale = F32({5}, {0.5f, 1.5f, -2.0f, 1.0f, 0.25f});
  auto same_bytes = [](const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.dims() == b.dims() &&
           std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0;
  };
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    // (Tensors copy their bytes: the in-place runs overwrite copies.)
    const Tensor dy_t = Make(dtype, dims, Values(dy)), x_t = Make(dtype, dims, Values(x));
    for (const char* op : {"ReluGrad", "GeluGrad"}) {
      const std::vector<Tensor> expected = testing::RunOk(op, {dy_t, x_t}, {}, 1, 1, kCastorDomain);
      const Tensor in_place = RunInPlace(op, {dy_t, x_t}, 1, 1, kCastorDomain);
      EXPECT_TRUE(same_bytes(in_place, expected[0])) << op;
    }
    const std::vector<Tensor> expected =
        testing::RunOk("BatchNormalizationGrad", {dy_t, x_t, scale}, {}, 1, 3, kCastorDomain);
    std::vector<Tensor> others;
    const Tensor in_place = RunInPlace("BatchNormalizationGrad", {dy_t, x_t, scale}, 1, 3,
                                       kCastorDomain, &others);
    EXPECT_TRUE(same_bytes(in_place, expected[0]));
    ASSERT_EQ(others.size(), 2u);
    EXPECT_TRUE(same_bytes(others[0], expected[1]));
    EXPECT_TRUE(same_bytes(others[1], expected[2]));
  }
}

// ---------------- conformance ----------------

TEST(CpuElementwiseTest, ConformanceCasesOfElementwiseOps) {
  if (!std::filesystem::exists(ConformanceRoot())) {
    GTEST_SKIP() << "no conformance data at " << ConformanceRoot();
  }
  const ConformanceSummary summary = RunConformanceCasesOf(
      Cpu(), {"Abs",  "Add", "Clip", "Div",     "Equal",      "Erf",     "Exp",  "Gelu",
              "LeakyRelu", "Log", "Max", "Min", "Mul",        "Neg",     "Pow",  "Reciprocal",
              "Relu", "Sigmoid", "Sqrt", "Sub", "Sum", "Tanh", "Where",
              "HardSigmoid", "HardSwish", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
              "And", "Or", "Xor", "Not", "Mod", "IsNaN", "IsInf", "Elu", "Selu", "Celu",
              "Softplus", "Softsign", "ThresholdedRelu", "Mish", "PRelu", "Sign", "Floor",
              "Ceil", "Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
              "Asinh", "Acosh", "Atanh"});
  for (const std::string& failure : summary.failures) ADD_FAILURE() << failure;
  for (const std::string& name : summary.multi_node) {
    ADD_FAILURE() << name << ": not a single-node model";
  }
  const int ran = summary.ran() + static_cast<int>(summary.multi_node.size());
  std::cout << "elementwise conformance: " << summary.passed << "/" << ran << " passed\n";
  EXPECT_GT(ran, 50);
}

}  // namespace
}  // namespace castor
