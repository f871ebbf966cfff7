// Tests of the CUDA elementwise kernels (backend/cuda/elementwise.cu) against
// the CPU backend: binary arithmetic on every dtype with broadcasting of each
// kind (same shape, scalar, row, column, middle axis, many axes, 100k+
// elements), int64 shape arithmetic with values beyond 32 bits and
// wrap-around, integer division by zero, Pow with float and int exponents,
// Equal and the ordered comparisons (bool out), And/Or/Xor/Not, Mod in both
// sign conventions, IsNaN/IsInf, Where's three-way broadcast, the variadic
// Sum/Max/Min (one input, several, more than one pass), every unary op and
// its attributes (LeakyRelu alpha, HardSigmoid alpha/beta, Gelu approximate,
// Clip's attribute and input bounds), special values (NaN, infinities, -0),
// Cast between every pair of the dtypes the kernel converts (exact: rounding,
// truncation, saturation and wrap-around as the CPU defines them), com.castor
// ReluGrad, castor's Gelu and GeluGrad, and the clear refusals of dtypes the CUDA kernels lack.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/attribute.h"
#include "graph/dtype.h"
#include "graph/gradient_builder.h"
#include "graph/tensor.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::Bool;
using testing::BF16;
using testing::Count;
using testing::CudaFloatTypes;
using testing::ExpectCudaMatchesCpu;
using testing::F16;
using testing::F32;
using testing::F64;
using testing::Gpu;
using testing::I32;
using testing::I64;
using testing::I8;
using testing::Make;
using testing::Random;
using testing::RandomTensor;
using testing::SingleNode;
using testing::Tolerance;
using testing::U8;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Float, int32 and int64: the dtypes of the CUDA binary arithmetic.
std::vector<DType> NumericTypes() {
  return {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kInt64};
}

// "[2,3,4]".
std::string DimsText(const std::vector<int64_t>& dims) {
  return Shape::FromDims(dims).ToString();
}

bool IsInt(DType dtype) { return dtype == DType::kInt32 || dtype == DType::kInt64; }

// Random values of `dtype`: floats uniform in [lo, hi), integers in [-3, 3].
Tensor Sample(DType dtype, const std::vector<int64_t>& dims, unsigned seed, double lo = -1.0,
              double hi = 1.0) {
  if (IsInt(dtype)) return Make(dtype, dims, Random(Count(dims), seed, /*integers=*/true));
  return RandomTensor(dtype, dims, seed, lo, hi);
}

std::string Name(const std::string& op, DType dtype, const std::vector<int64_t>& a,
                 const std::vector<int64_t>& b) {
  return absl::StrCat(op, " ", DTypeName(dtype), " ", DimsText(a), " with ",
                      DimsText(b));
}

// Pairs of input shapes: same shape, scalars, row, column, outer product,
// middle-axis broadcast, many axes, and more than 100k output elements.
const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& ShapePairs() {
  static const auto* pairs = new std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
      {{3, 5, 7}, {3, 5, 7}},
      {{}, {4, 6}},
      {{4, 6}, {}},
      {{1}, {5}},
      {{4, 6}, {6}},
      {{4, 1}, {1, 6}},
      {{2, 1, 5}, {2, 3, 5}},
      {{2, 3, 5}, {3, 1}},
      {{7, 1, 3, 1, 5}, {1, 2, 3, 4, 1}},
      {{2, 3, 4, 5}, {3, 1, 1}},
      {{301, 401}, {401}},
      {{0, 3}, {3}},
  };
  return *pairs;
}

// ---- binary ------------------------------------------------------------------------

TEST(CudaElementwise, ArithmeticBroadcastsInEveryDType) {
  CASTOR_REQUIRE_CUDA();
  for (const std::string op : {"Add", "Sub", "Mul", "Div"}) {
    for (DType dtype : NumericTypes()) {
      unsigned seed = 10;
      for (const auto& [a_dims, b_dims] : ShapePairs()) {
        Tensor a = Sample(dtype, a_dims, ++seed);
        // Float divisors stay away from 0; int divisors include 0 (x / 0 = 0).
        Tensor b = op == "Div" && !IsInt(dtype) ? Sample(dtype, b_dims, ++seed, 0.5, 2.0)
                                                : Sample(dtype, b_dims, ++seed);
        SingleNode node(op, {a, b}, {}, 14);
        ExpectCudaMatchesCpu(node, Name(op, dtype, a_dims, b_dims));
      }
    }
  }
}

TEST(CudaElementwise, Int64ShapeArithmeticKeeps64BitsAndWraps) {
  CASTOR_REQUIRE_CUDA();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const Tensor a = I64({6}, {int64_t{1} << 40, -(int64_t{1} << 35) + 7, kMax, kMin, 12, -7});
  const Tensor b = I64({6}, {3, int64_t{1} << 20, 1, -1, 0, 2});
  for (const std::string op : {"Add", "Sub", "Mul", "Div"}) {
    SingleNode same(op, {a, b}, {}, 14);
    ExpectCudaMatchesCpu(same, op + " int64");
    SingleNode scalar(op, {a, I64({}, {-3})}, {}, 14);
    ExpectCudaMatchesCpu(scalar, op + " int64 by a scalar");
  }
  // int32 wraps in 32 bits.
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  const Tensor c = I32({4}, {kMax32, kMin32, 1 << 20, -5});
  for (const std::string op : {"Add", "Sub", "Mul", "Div"}) {
    SingleNode node(op, {c, I32({4}, {1, -1, 1 << 12, 0})}, {}, 14);
    ExpectCudaMatchesCpu(node, op + " int32");
  }
}

TEST(CudaElementwise, PowTakesFloatAndIntegerExponents) {
  CASTOR_REQUIRE_CUDA();
  for (DType dtype : CudaFloatTypes()) {
    Tensor base = Sample(dtype, {5, 7}, 1, 0.1, 2.0);
    SingleNode same("Pow", {base, Sample(dtype, {5, 7}, 2, -2.0, 2.0)}, {}, 15);
    ExpectCudaMatchesCpu(same, absl::StrCat("Pow ", DTypeName(dtype)));
    SingleNode scalar("Pow", {base, Make(dtype, {}, {2.0})}, {}, 15);
    ExpectCudaMatchesCpu(scalar, absl::StrCat("Pow by a scalar ", DTypeName(dtype)));
    for (DType exponent_type : NumericTypes()) {
      // Negative bases with integral exponents.
      Tensor signed_base = Sample(dtype, {3, 4}, 3, -2.0, 2.0);
      Tensor exponent = Make(exponent_type, {4}, {0, 1, 2, 3});
      SingleNode node("Pow", {signed_base, exponent}, {}, 15);
      ExpectCudaMatchesCpu(node, absl::StrCat("Pow ", DTypeName(dtype), " ^ ",
                                              DTypeName(exponent_type)));
    }
  }
  SingleNode large("Pow", {Sample(DType::kFloat32, {300, 400}, 4, 0.1, 3.0), F32({}, {0.5f})},
                   {}, 15);
  ExpectCudaMatchesCpu(large, "Pow 120k elements");
  // Exponents 2 and 1 are a multiply and a copy on both backends: the same
  // bits, not just within tolerance.
  for (float e : {2.0f, 1.0f}) {
    SingleNode exact("Pow", {Sample(DType::kFloat32, {64, 33}, 5, -3.0, 3.0), F32({}, {e})}, {},
                     15);
    ExpectCudaMatchesCpu(exact, absl::StrCat("Pow by ", e), Tolerance{0, 0});
  }
}

TEST(CudaElementwise, EqualGivesBool) {
  CASTOR_REQUIRE_CUDA();
  for (DType dtype : NumericTypes()) {
    unsigned seed = 20;
    for (const auto& [a_dims, b_dims] : ShapePairs()) {
      // Small integers, so many elements compare equal.
      Tensor a = Make(dtype, a_dims, Random(Count(a_dims), ++seed, true));
      Tensor b = Make(dtype, b_dims, Random(Count(b_dims), ++seed, true));
      SingleNode node("Equal", {a, b}, {}, 13);
      ExpectCudaMatchesCpu(node, Name("Equal", dtype, a_dims, b_dims));
    }
  }
  SingleNode special("Equal",
                     {F32({4}, {kNaN, 0.0f, -0.0f, kInf}), F32({4}, {kNaN, -0.0f, 0.0f, kInf})},
                     {}, 13);
  ExpectCudaMatchesCpu(special, "Equal NaN, -0, inf");
  SingleNode bools("Equal", {Bool({2, 2}, {0, 1, 1, 0}), Bool({2}, {1, 0})}, {}, 13);
  ExpectCudaMatchesCpu(bools, "Equal bool");
}

TEST(CudaElementwise, OrderedComparisonsGiveBool) {
  CASTOR_REQUIRE_CUDA();
  for (const std::string op : {"Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    for (DType dtype : NumericTypes()) {
      unsigned seed = 60;
      for (const auto& [a_dims, b_dims] : ShapePairs()) {
        // Small integers, so many elements tie.
        Tensor a = Make(dtype, a_dims, Random(Count(a_dims), ++seed, true));
        Tensor b = Make(dtype, b_dims, Random(Count(b_dims), ++seed, true));
        SingleNode node(op, {a, b}, {}, 16);
        ExpectCudaMatchesCpu(node, Name(op, dtype, a_dims, b_dims));
      }
    }
    SingleNode special(op, {F32({5}, {kNaN, 0.0f, -0.0f, kInf, -kInf}),
                            F32({5}, {1.0f, -0.0f, 0.0f, kInf, 0.0f})},
                       {}, 16);
    ExpectCudaMatchesCpu(special, op + " NaN, -0, inf");
  }
}

TEST(CudaElementwise, LogicAndNot) {
  CASTOR_REQUIRE_CUDA();
  for (const std::string op : {"And", "Or", "Xor"}) {
    unsigned seed = 70;
    for (const auto& [a_dims, b_dims] : ShapePairs()) {
      std::vector<uint8_t> a_bits, b_bits;
      for (double v : Random(Count(a_dims), ++seed)) a_bits.push_back(v > 0 ? 1 : 0);
      for (double v : Random(Count(b_dims), ++seed)) b_bits.push_back(v > 0 ? 1 : 0);
      SingleNode node(op, {Bool(a_dims, a_bits), Bool(b_dims, b_bits)}, {}, 7);
      ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DimsText(a_dims), " with ",
                                              DimsText(b_dims)));
    }
  }
  std::vector<uint8_t> bits;
  for (double v : Random(1031, 80)) bits.push_back(v > 0 ? 1 : 0);
  SingleNode negation("Not", {Bool({1031}, bits)}, {}, 7);
  ExpectCudaMatchesCpu(negation, "Not");
}

TEST(CudaElementwise, ModBothConventions) {
  CASTOR_REQUIRE_CUDA();
  for (int fmod : {0, 1}) {
    for (DType dtype : NumericTypes()) {
      unsigned seed = 90;
      for (const auto& [a_dims, b_dims] : ShapePairs()) {
        // Integers in [-3, 3] (a zero divisor gives 0); float divisors of
        // both signs away from 0.
        Tensor a = Sample(dtype, a_dims, ++seed, -10.0, 10.0);
        std::vector<double> divisors = Random(Count(b_dims), ++seed, IsInt(dtype));
        if (!IsInt(dtype)) {
          for (double& d : divisors) d = d < 0 ? d * 3 - 0.5 : d * 3 + 0.5;
        }
        SingleNode node("Mod", {a, Make(dtype, b_dims, divisors)},
                        {Attribute::Int("fmod", fmod)}, 13);
        ExpectCudaMatchesCpu(node, absl::StrCat(Name("Mod", dtype, a_dims, b_dims), " fmod ",
                                                fmod));
      }
    }
    SingleNode special("Mod", {F32({4}, {kInf, 3.0f, -0.0f, 5.0f}),
                               F32({4}, {2.0f, 0.0f, 2.0f, -kInf})},
                       {Attribute::Int("fmod", fmod)}, 13);
    ExpectCudaMatchesCpu(special, absl::StrCat("Mod special values fmod ", fmod));
  }
}

TEST(CudaElementwise, IsNaNAndIsInf) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<double> special = {kNaN, kInf, -kInf, 0.0, -0.0, 1e-30, 7e4, -7e4, 3.0};
  for (DType dtype : CudaFloatTypes()) {
    SingleNode nan("IsNaN", {Make(dtype, {9}, special)}, {}, 20);
    ExpectCudaMatchesCpu(nan, absl::StrCat("IsNaN ", DTypeName(dtype)));
    for (int neg : {0, 1}) {
      for (int pos : {0, 1}) {
        SingleNode inf("IsInf", {Make(dtype, {9}, special)},
                       {Attribute::Int("detect_negative", neg),
                        Attribute::Int("detect_positive", pos)},
                       20);
        ExpectCudaMatchesCpu(inf, absl::StrCat("IsInf ", DTypeName(dtype), " ", neg, pos));
      }
    }
  }
}

TEST(CudaElementwise, WhereBroadcastsAllThreeInputs) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> condition, x, y;
  };
  const std::vector<Case> cases = {
      {{3, 4}, {3, 4}, {3, 4}},       {{}, {3, 4}, {4}},          {{3, 4}, {}, {}},
      {{2, 1, 4}, {3, 1}, {2, 3, 4}}, {{1, 5}, {4, 1}, {1}},      {{300, 1}, {1, 400}, {400}},
  };
  std::vector<DType> dtypes = NumericTypes();
  dtypes.push_back(DType::kBool);
  for (DType dtype : dtypes) {
    unsigned seed = 30;
    for (const Case& c : cases) {
      std::vector<uint8_t> bits;
      for (double v : Random(Count(c.condition), ++seed)) bits.push_back(v > 0 ? 1 : 0);
      Tensor condition = Bool(c.condition, bits);
      Tensor x, y;
      if (dtype == DType::kBool) {
        x = Bool(c.x, std::vector<uint8_t>(Count(c.x), 1));
        y = Bool(c.y, std::vector<uint8_t>(Count(c.y), 0));
      } else {
        x = Sample(dtype, c.x, ++seed);
        y = Sample(dtype, c.y, ++seed);
      }
      SingleNode node("Where", {condition, x, y}, {}, 16);
      ExpectCudaMatchesCpu(node, absl::StrCat("Where ", DTypeName(dtype), " ",
                                              DimsText(c.condition), " ",
                                              DimsText(c.x), " ", DimsText(c.y)));
    }
  }
}

// ---- variadic ----------------------------------------------------------------------

TEST(CudaElementwise, VariadicSumMaxMinBroadcast) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<std::vector<std::vector<int64_t>>> shape_sets = {
      {{3, 4}},
      {{3, 4}, {4}},
      {{2, 3, 4}, {3, 1}, {4}},
      {{}, {5, 1}, {1, 6}, {5, 6}},
      // More inputs than one pass takes (8): a float32 scratch carries the
      // accumulator between passes.
      {{2, 3}, {3}, {2, 1}, {}, {2, 3}, {1, 3}, {3}, {2, 3}, {1}, {2, 3}, {3}},
      {{250, 401}, {401}, {250, 1}},
  };
  for (const std::string op : {"Sum", "Max", "Min"}) {
    for (DType dtype : CudaFloatTypes()) {
      unsigned seed = 40;
      for (const auto& shapes : shape_sets) {
        std::vector<Tensor> inputs;
        for (const auto& dims : shapes) inputs.push_back(Sample(dtype, dims, ++seed));
        SingleNode node(op, inputs, {}, 13);
        ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " of ",
                                                shapes.size(), " inputs"));
      }
    }
    // NaN propagates through Max and Min.
    SingleNode nan(op, {F32({3}, {kNaN, 1.0f, 2.0f}), F32({3}, {0.0f, kNaN, -kInf}),
                        F32({3}, {1.0f, 2.0f, kNaN})},
                   {}, 13);
    ExpectCudaMatchesCpu(nan, op + " with NaN");
  }
}

// ---- unary -------------------------------------------------------------------------

struct UnaryCase {
  std::string op;
  double lo, hi;  // input range
  std::vector<Attribute> attributes;
  int64_t opset;
};

std::vector<UnaryCase> UnaryCases() {
  return {
      {"Neg", -4, 4, {}, 13},
      {"Abs", -4, 4, {}, 13},
      {"Relu", -4, 4, {}, 14},
      {"Erf", -4, 4, {}, 13},
      {"Sigmoid", -8, 8, {}, 13},
      {"Tanh", -4, 4, {}, 13},
      {"Exp", -5, 5, {}, 13},
      {"Log", 0.01, 4, {}, 13},
      {"Sqrt", 0, 4, {}, 13},
      {"Reciprocal", 0.1, 3, {}, 13},
      {"Sin", -6, 6, {}, 22},
      {"Cos", -6, 6, {}, 22},
      {"Tan", -1.2, 1.2, {}, 22},
      {"Asin", -0.99, 0.99, {}, 22},
      {"Acos", -0.99, 0.99, {}, 22},
      {"Atan", -5, 5, {}, 22},
      {"Sinh", -5, 5, {}, 22},
      {"Cosh", -5, 5, {}, 22},
      {"Asinh", -5, 5, {}, 22},
      {"Acosh", 1, 5, {}, 22},
      {"Atanh", -0.99, 0.99, {}, 22},
      {"LeakyRelu", -4, 4, {}, 16},
      {"LeakyRelu", -4, 4, {Attribute::Float("alpha", 0.2f)}, 16},
      {"HardSigmoid", -5, 5, {}, 22},
      {"HardSigmoid", -5, 5, {Attribute::Float("alpha", 1.0f / 6), Attribute::Float("beta", 0.5f)},
       17},
      {"HardSwish", -5, 5, {}, 14},
      {"HardSwish", -5, 5, {}, 22},
      {"Sign", -4, 4, {}, 13},
      {"Floor", -4, 4, {}, 13},
      {"Ceil", -4, 4, {}, 13},
      {"Round", -4, 4, {}, 22},
      {"Elu", -5, 5, {}, 22},
      {"Elu", -5, 5, {Attribute::Float("alpha", 0.3f)}, 22},
      {"Selu", -5, 5, {}, 22},
      {"Selu", -5, 5, {Attribute::Float("alpha", 2.0f), Attribute::Float("gamma", 0.5f)}, 22},
      {"Celu", -5, 5, {Attribute::Float("alpha", 2.0f)}, 12},
      {"Softplus", -30, 30, {}, 22},
      {"Softsign", -5, 5, {}, 22},
      {"ThresholdedRelu", -3, 3, {}, 22},
      {"ThresholdedRelu", -3, 3, {Attribute::Float("alpha", -0.5f)}, 22},
      {"Mish", -30, 30, {}, 22},
      {"Gelu", -5, 5, {}, 20},
      {"Gelu", -5, 5, {Attribute::String("approximate", "none")}, 20},
      {"Gelu", -5, 5, {Attribute::String("approximate", "tanh")}, 20},
      {"Clip", -4, 4, {}, 13},
      {"Clip", -4, 4, {Attribute::Float("min", -1.5f), Attribute::Float("max", 2.5f)}, 6},
      {"Clip", -4, 4, {Attribute::Float("max", 1.0f)}, 6},
      {"Clip", -4, 4, {Attribute::Float("min", 0.5f)}, 6},
  };
}

// Clip takes bfloat16 from opset 13 (attribute bounds end at opset 10),
// HardSigmoid and HardSwish from 22.
bool Takes(const UnaryCase& c, DType dtype) {
  if (dtype != DType::kBFloat16) return true;
  if (c.op == "Clip") return c.opset >= 13;
  if (c.op == "HardSigmoid" || c.op == "HardSwish") return c.opset >= 22;
  return true;
}

// Celu is float32 only.
bool TakesDType(const UnaryCase& c, DType dtype) {
  return Takes(c, dtype) && (c.op != "Celu" || dtype == DType::kFloat32);
}

std::string CaseName(const UnaryCase& c, DType dtype, int64_t n) {
  std::string name = absl::StrCat(c.op, " ", DTypeName(dtype), " ", n, " elements opset ", c.opset);
  for (const Attribute& a : c.attributes) absl::StrAppend(&name, " ", a.name);
  return name;
}

TEST(CudaElementwise, UnaryOpsInEveryFloatDType) {
  CASTOR_REQUIRE_CUDA();
  for (const UnaryCase& c : UnaryCases()) {
    for (DType dtype : CudaFloatTypes()) {
      if (!TakesDType(c, dtype)) continue;
      for (const std::vector<int64_t>& dims :
           std::vector<std::vector<int64_t>>{{}, {1031}, {3, 0}, {257, 401}}) {
        SingleNode node(c.op, {Sample(dtype, dims, 50, c.lo, c.hi)}, c.attributes, c.opset);
        ExpectCudaMatchesCpu(node, CaseName(c, dtype, Count(dims)));
      }
    }
  }
}

TEST(CudaElementwise, UnaryOpsOnSpecialValues) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<float> special = {kNaN, kInf, -kInf, 0.0f, -0.0f, 1e-30f, -1e-30f,
                                      88.0f, -88.0f, 100.0f, -100.0f, 1e30f, -1e30f};
  const int64_t n = static_cast<int64_t>(special.size());
  for (const UnaryCase& c : UnaryCases()) {
    for (DType dtype : CudaFloatTypes()) {
      if (!TakesDType(c, dtype)) continue;
      std::vector<double> values(special.begin(), special.end());
      SingleNode node(c.op, {Make(dtype, {n}, values)}, c.attributes, c.opset);
      ExpectCudaMatchesCpu(node, CaseName(c, dtype, n) + " special values");
    }
  }
}

TEST(CudaElementwise, PReluBroadcastsTheSlope) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{2, 3, 4, 5}, {}}, {{2, 3, 4, 5}, {3, 1, 1}}, {{2, 3, 4, 5}, {5}},
      {{2, 3, 4, 5}, {2, 3, 4, 5}}, {{301, 401}, {401}}, {{0, 3}, {3}}};
  for (DType dtype : NumericTypes()) {
    unsigned seed = 100;
    for (const auto& [x_dims, slope_dims] : shapes) {
      SingleNode node("PRelu", {Sample(dtype, x_dims, ++seed), Sample(dtype, slope_dims, ++seed)},
                      {}, 16);
      ExpectCudaMatchesCpu(node, Name("PRelu", dtype, x_dims, slope_dims));
    }
  }
}

TEST(CudaElementwise, ClipBoundsFromInputs) {
  CASTOR_REQUIRE_CUDA();
  const Tensor omitted;
  for (DType dtype : CudaFloatTypes()) {
    const Tensor x = Make(dtype, {4}, {-2.0, kNaN, 0.7, 5.0});
    Tensor big = Sample(dtype, {300, 400}, 61, -3, 3);
    const Tensor low = Make(dtype, {}, {-1.0});
    const Tensor high = Make(dtype, {1}, {1.5});
    const std::string what = absl::StrCat("Clip ", DTypeName(dtype));
    SingleNode both("Clip", {big, low, high}, {}, 13);
    ExpectCudaMatchesCpu(both, what + " min and max");
    SingleNode min_only("Clip", {big, low}, {}, 13);
    ExpectCudaMatchesCpu(min_only, what + " min only");
    SingleNode max_only("Clip", {big, omitted, high}, {}, 13);
    ExpectCudaMatchesCpu(max_only, what + " max only");
    SingleNode crossed("Clip", {big, Make(dtype, {}, {2.0}), Make(dtype, {}, {-2.0})}, {}, 13);
    ExpectCudaMatchesCpu(crossed, what + " min above max");
    SingleNode nan("Clip", {x, low, high}, {}, 13);
    ExpectCudaMatchesCpu(nan, what + " NaN stays NaN");
  }
}

// ---- ReluGrad ----------------------------------------------------------------------

TEST(CudaElementwise, ReluGradPassesGradientWhereOutputPositive) {
  CASTOR_REQUIRE_CUDA();
  for (DType dtype : CudaFloatTypes()) {
    for (const std::vector<int64_t>& dims :
         std::vector<std::vector<int64_t>>{{}, {7, 3}, {1000, 103}}) {
      // Y = Relu(X) has exact zeros; dY is arbitrary.
      SingleNode relu("Relu", {Sample(dtype, dims, 70)}, {}, 14);
      absl::StatusOr<std::vector<Tensor>> y = relu.Run(testing::Cpu());
      ASSERT_TRUE(y.ok()) << y.status();
      SingleNode node("ReluGrad", {Sample(dtype, dims, 71), (*y)[0]}, {}, 1, 1, kCastorDomain);
      ExpectCudaMatchesCpu(node, absl::StrCat("ReluGrad ", DTypeName(dtype), " ",
                                              DimsText(dims)));
    }
  }
}

// ---- Gelu's training form and GeluGrad ----------------------------------------------

// castor's Gelu (com.castor, any opset) and its one-pass gradient, both
// forms, against the CPU backend.
TEST(CudaElementwise, CastorGeluAndGeluGradMatchTheCpu) {
  CASTOR_REQUIRE_CUDA();
  for (DType dtype : CudaFloatTypes()) {
    for (const char* approximate : {"none", "tanh"}) {
      for (const std::vector<int64_t>& dims :
           std::vector<std::vector<int64_t>>{{}, {7, 3}, {1000, 103}}) {
        const std::string what =
            absl::StrCat(DTypeName(dtype), " ", approximate, " ", DimsText(dims));
        const std::vector<Attribute> form = {Attribute::String("approximate", approximate)};
        SingleNode gelu("Gelu", {Sample(dtype, dims, 72)}, form, 1, 1, kCastorDomain);
        ExpectCudaMatchesCpu(gelu, "castor Gelu " + what);
        SingleNode grad("GeluGrad", {Sample(dtype, dims, 73), Sample(dtype, dims, 74)}, form, 1,
                        1, kCastorDomain);
        ExpectCudaMatchesCpu(grad, "GeluGrad " + what);
      }
    }
  }
}

// ---- Cast --------------------------------------------------------------------------

// The dtypes the CUDA Cast converts between.
std::vector<DType> CastTypes() {
  return {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt8,
          DType::kUInt8,   DType::kInt32,   DType::kInt64,   DType::kBool};
}

// Values that exercise each source dtype's conversions: halves and ties,
// truncation, int8/uint8/int32 range edges (wrap-around), 16-bit float
// range edges and rounding, 2^24 + 1, NaN and infinities.
Tensor CastSource(DType dtype) {
  const std::vector<double> floats = {
      0.0,   -0.0,   0.5,   -0.5,   1.5,  -1.5,    2.5,          100.7,        -100.7,
      127.9, 128.5,  255.5, 256.0,  -129, 1e10,    -1e10,        3e9,          -3e9,
      65519, 65520,  1e-8,  -1e-30, 16777217.0,    2049.0,       1.00048828125 + 1e-9,
      1e300, -1e300, 9.3e18, -9.3e18, std::nan(""), HUGE_VAL,   -HUGE_VAL};
  const int64_t n = static_cast<int64_t>(floats.size());
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16: {
      // Make rounds through float32 (1e300 becomes inf), as these dtypes hold it.
      return Make(dtype, {n}, floats);
    }
    case DType::kFloat64: return F64({n}, floats);
    case DType::kInt8: return I8({6}, {0, 1, -1, 127, -128, 55});
    case DType::kUInt8: return U8({6}, {0, 1, 2, 127, 128, 255});
    case DType::kInt32:
      return I32({9}, {0, 1, -1, 127, 128, 255, 256, std::numeric_limits<int32_t>::max(),
                       std::numeric_limits<int32_t>::min()});
    case DType::kInt64:
      return I64({10}, {0, -1, 300, 16777217, 33554435, -16842753, int64_t{1} << 40,
                        (int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max(),
                        std::numeric_limits<int64_t>::min()});
    case DType::kBool: return Bool({4}, {0, 1, 2, 0});
    default: return Tensor();
  }
}

TEST(CudaElementwise, CastBetweenEveryPairExactly) {
  CASTOR_REQUIRE_CUDA();
  for (DType from : CastTypes()) {
    for (DType to : CastTypes()) {
      SingleNode node("Cast", {CastSource(from)}, {Attribute::Int("to", DTypeToOnnx(to))}, 19);
      ExpectCudaMatchesCpu(node, absl::StrCat("Cast ", DTypeName(from), " -> ", DTypeName(to)),
                           Tolerance{0, 0});
    }
  }
}

TEST(CudaElementwise, CastLargeTensors) {
  CASTOR_REQUIRE_CUDA();
  for (DType from : CudaFloatTypes()) {
    for (DType to : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64}) {
      SingleNode node("Cast", {Sample(from, {301, 401}, 80, -300, 300)},
                      {Attribute::Int("to", DTypeToOnnx(to))}, 13);
      ExpectCudaMatchesCpu(node, absl::StrCat("Cast 120k ", DTypeName(from), " -> ",
                                              DTypeName(to)),
                           Tolerance{0, 0});
    }
  }
}

// ---- refusals ----------------------------------------------------------------------

// Runs `node` on the GPU expecting a clear error containing `needle`.
void ExpectGpuRefuses(SingleNode& node, const std::string& needle, const std::string& what) {
  ASSERT_TRUE(node.status().ok()) << what << ": " << node.status();
  absl::StatusOr<std::vector<Tensor>> result = node.Run(Gpu());
  ASSERT_FALSE(result.ok()) << what << " ran on CUDA";
  EXPECT_NE(std::string(result.status().message()).find(needle), std::string::npos)
      << what << ": " << result.status();
}

TEST(CudaElementwise, NegAbsSignOnIntegers) {
  CASTOR_REQUIRE_CUDA();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  for (const std::string op : {"Neg", "Abs", "Sign"}) {
    SingleNode wide(op, {I64({5}, {kMin64, -(int64_t{1} << 40), 0, 7, kMin64 + 1})}, {}, 13);
    ExpectCudaMatchesCpu(wide, op + " int64");
    SingleNode narrow(op, {I32({5}, {kMin32, -9, 0, 7, kMin32 + 1})}, {}, 13);
    ExpectCudaMatchesCpu(narrow, op + " int32");
    SingleNode large(op, {Sample(DType::kInt32, {257, 401}, 110)}, {}, 13);
    ExpectCudaMatchesCpu(large, op + " int32 [257,401]");
  }
}

TEST(CudaElementwise, RefusesDTypesItLacks) {
  CASTOR_REQUIRE_CUDA();
  SingleNode add("Add", {U8({2}, {1, 2}), U8({2}, {3, 4})}, {}, 14);
  ExpectGpuRefuses(add, "no kernel supports it", "Add uint8");
  SingleNode cast("Cast", {F32({2}, {1, 2})}, {Attribute::Int("to", DTypeToOnnx(DType::kUInt16))},
                  19);
  ExpectGpuRefuses(cast, "uint16", "Cast to uint16");
  SingleNode relu("Relu", {I32({2}, {-1, 2})}, {}, 14);
  ExpectGpuRefuses(relu, "no kernel supports it", "Relu int32");
}

}  // namespace
}  // namespace castor
