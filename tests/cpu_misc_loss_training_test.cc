// CPU kernels of the misc, losses and training families: Cast (bit patterns
// of float16/bfloat16 rounding, every dtype pair), Constant,
// ConstantOfShape, Identity, Dropout, Range; SoftmaxCrossEntropyLoss and
// NegativeLogLikelihoodLoss against a float64 reference computed here
// (weights, ignore_index, reductions, log_prob, 16-bit scores); Adagrad,
// Adam and Momentum/Nesterov against hand-computed steps; plus the ONNX node
// conformance cases of these ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_node.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using testing::Bits;
using testing::ConformanceRoot;
using testing::ConformanceSummary;
using testing::Cpu;
using testing::F32;
using testing::F64;
using testing::I64;
using testing::RunConformanceCasesOf;
using testing::RunNodeOf;
using testing::RunOk;

Tensor Bits16(DType dtype, std::vector<int64_t> dims, const std::vector<uint16_t>& bits) {
  return Tensor::FromVector(dtype, std::move(dims), bits);
}
Tensor Bool(bool value) {
  return Tensor::FromVector(DType::kBool, {}, std::vector<uint8_t>{value});
}

// ---- Cast ----------------------------------------------------------------------

Tensor CastTo(const Tensor& in, DType to, int64_t opset = 19) {
  return RunOk("Cast", {in}, {Attribute::Int("to", DTypeToOnnx(to))}, opset)[0];
}

TEST(CpuCast, Float32ToFloat16RoundsToNearestEven) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<float, uint16_t>> cases = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {-0.0f, 0x8000},
      {65504.0f, 0x7bff},   // largest half
      {65519.99f, 0x7bff},  // just below the rounding boundary
      {65520.0f, 0x7c00},   // ties away to infinity
      {1e6f, 0x7c00},       // overflow
      {-1e6f, 0xfc00},
      {inf, 0x7c00},
      {-inf, 0xfc00},
      {1.0f + 1.0f / 2048, 0x3c00},                 // midpoint -> even (down)
      {1.0f + 3.0f / 2048, 0x3c02},                 // midpoint -> even (up)
      {1.0f + 1.0f / 2048 + 1.0f / 65536, 0x3c01},  // just above the midpoint
      {std::ldexp(1.0f, -24), 0x0001},              // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},              // half of it: tie to even zero
      {std::ldexp(3.0f, -26), 0x0001},              // 0.75 ulp rounds up
      {std::ldexp(1.0f, -14), 0x0400},              // smallest normal
  };
  std::vector<float> values;
  std::vector<uint16_t> expected;
  for (const auto& [v, bits] : cases) {
    values.push_back(v);
    expected.push_back(bits);
  }
  values.push_back(nan);
  const Tensor out = CastTo(F32({static_cast<int64_t>(values.size())}, values), DType::kFloat16);
  ASSERT_EQ(out.dtype(), DType::kFloat16);
  std::vector<uint16_t> bits = Bits(out);
  const uint16_t nan_bits = bits.back();
  bits.pop_back();
  EXPECT_EQ((nan_bits & 0x7c00), 0x7c00);
  EXPECT_NE((nan_bits & 0x03ff), 0) << "NaN must stay NaN";
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(bits[i], expected[i]) << "value " << values[i];
  }
}

TEST(CpuCast, Float32ToBFloat16RoundsToNearestEven) {
  const std::vector<std::pair<float, uint16_t>> cases = {
      {1.0f, 0x3f80},
      {1.0f + 1.0f / 256, 0x3f80},                  // midpoint -> even (down)
      {1.0f + 3.0f / 256, 0x3f82},                  // midpoint -> even (up)
      {1.0f + 1.0f / 256 + 1.0f / 65536, 0x3f81},   // above the midpoint
      {std::numeric_limits<float>::max(), 0x7f80},  // rounds to infinity
      {-std::numeric_limits<float>::infinity(), 0xff80},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {-0.0f, 0x8000},
  };
  std::vector<float> values;
  for (const auto& c : cases) values.push_back(c.first);
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  const std::vector<uint16_t> bits =
      Bits(CastTo(F32({static_cast<int64_t>(values.size())}, values), DType::kBFloat16));
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(bits[i], cases[i].second) << values[i];
  EXPECT_EQ((bits.back() & 0x7f80), 0x7f80);
  EXPECT_NE((bits.back() & 0x007f), 0) << "NaN must stay NaN";
}

TEST(CpuCast, Float64And64BitIntsRoundOnceTo16BitFloats) {
  // 1 + 2^-11 + 2^-40 rounds to float32 as the exact float16 midpoint; a
  // second rounding would go to even (0x3c00). One rounding gives 0x3c01.
  const double above_half_midpoint = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const double above_bf16_midpoint = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(Bits(CastTo(F64({2}, {above_half_midpoint, 1e300}), DType::kFloat16)),
            (std::vector<uint16_t>{0x3c01, 0x7c00}));
  EXPECT_EQ(Bits(CastTo(F64({2}, {above_bf16_midpoint, -1e300}), DType::kBFloat16)),
            (std::vector<uint16_t>{0x3f81, 0xff80}));
  // 2^24 + 2^16 + 1: float32 rounds it to the bfloat16 midpoint 2^24 + 2^16.
  EXPECT_EQ(Bits(CastTo(I64({2}, {16842753, -16842753}), DType::kBFloat16)),
            (std::vector<uint16_t>{0x4b81, 0xcb81}));
  EXPECT_EQ(Bits(CastTo(I64({3}, {2049, 65519, 70000}), DType::kFloat16)),
            (std::vector<uint16_t>{0x6800, 0x7bff, 0x7c00}));  // 2049 ties to 2048
}

TEST(CpuCast, FloatToIntTruncatesAndBoolIsNonZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor in = F32({7}, {2.7f, -2.7f, 0.5f, -0.0f, 0.0f, 100.9f, nan});
  EXPECT_EQ(CastTo(in, DType::kInt64).ToInt64Vector(),
            (std::vector<int64_t>{2, -2, 0, 0, 0, 100, 0}));
  EXPECT_EQ(CastTo(in, DType::kInt8).ToInt64Vector(),
            (std::vector<int64_t>{2, -2, 0, 0, 0, 100, 0}));
  EXPECT_EQ(CastTo(in, DType::kBool).ToInt64Vector(), (std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1}));
  Tensor flags = Tensor::FromVector(DType::kBool, {3}, std::vector<uint8_t>{1, 0, 1});
  EXPECT_EQ(CastTo(flags, DType::kFloat32), F32({3}, {1, 0, 1}));
  EXPECT_EQ(Bits(CastTo(flags, DType::kBFloat16)), (std::vector<uint16_t>{0x3f80, 0, 0x3f80}));
  EXPECT_EQ(CastTo(I64({2}, {300, -1}), DType::kUInt8).ToInt64Vector(),
            (std::vector<int64_t>{44, 255}));  // integer narrowing wraps
}

TEST(CpuCast, EveryDTypePairKeepsSmallValues) {
  const std::vector<DType> types = {
      DType::kBool,     DType::kInt64,   DType::kInt32,  DType::kInt16,  DType::kInt8,
      DType::kUInt8,    DType::kUInt16,  DType::kUInt32, DType::kUInt64, DType::kFloat16,
      DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  int pairs = 0;
  for (DType from : types) {
    // Values every type holds exactly: {0, 1} for bool, more otherwise.
    std::vector<double> values = {0, 1};
    if (from != DType::kBool) values = {0, 1, 3, 100, 7, 64};
    const bool is_signed = IsSignedInteger(from) || IsFloatingPoint(from);
    if (is_signed) values.push_back(-5);
    Tensor source = CastTo(F64({static_cast<int64_t>(values.size())}, values), from);
    for (DType to : types) {
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
      const Tensor out = CastTo(source, to);
      ASSERT_EQ(out.dtype(), to);
      ASSERT_EQ(out.num_elements(), static_cast<int64_t>(values.size()));
      for (size_t i = 0; i < values.size(); ++i) {
        double expected = values[i];
        if (to == DType::kBool) expected = expected != 0 ? 1 : 0;
        if (expected < 0 && !IsSignedInteger(to) && !IsFloatingPoint(to) && to != DType::kBool) {
          // Negative to unsigned wraps modulo 2^bits.
          expected += std::ldexp(1.0, static_cast<int>(8 * DTypeSize(to)));
        }
        EXPECT_EQ(out.GetDouble(i), expected) << "value " << values[i];
      }
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, 13 * 13);
}

// ---- Constant / ConstantOfShape / Identity / Range ----------------------------

TEST(CpuConstant, EveryValueAttribute) {
  Tensor value = Tensor::FromVector(DType::kInt32, {2, 2}, std::vector<int32_t>{1, -2, 3, -4});
  EXPECT_EQ(RunOk("Constant", {}, {Attribute::TensorValue("value", value)}, 13)[0], value);
  EXPECT_EQ(RunOk("Constant", {}, {Attribute::Float("value_float", 2.5f)}, 13)[0],
            Tensor::Scalar(2.5f));
  EXPECT_EQ(RunOk("Constant", {}, {Attribute::Floats("value_floats", {1, 2})}, 13)[0],
            F32({2}, {1, 2}));
  EXPECT_EQ(RunOk("Constant", {}, {Attribute::Int("value_int", -7)}, 13)[0], I64({}, {-7}));
  EXPECT_EQ(RunOk("Constant", {}, {Attribute::Ints("value_ints", {4, 5, 6})}, 13)[0],
            I64({3}, {4, 5, 6}));
}

TEST(CpuConstantOfShape, DefaultsToFloatZeroAndFillsValue) {
  EXPECT_EQ(RunOk("ConstantOfShape", {I64({2}, {2, 3})}, {}, 13)[0],
            Tensor(DType::kFloat32, {2, 3}));
  Tensor seven = I64({1}, {7});
  EXPECT_EQ(RunOk("ConstantOfShape", {I64({3}, {2, 1, 2})},
                  {Attribute::TensorValue("value", seven)}, 13)[0],
            I64({2, 1, 2}, {7, 7, 7, 7}));
  Tensor half_one = Bits16(DType::kFloat16, {1}, {0x3c00});
  EXPECT_EQ(RunOk("ConstantOfShape", {I64({1}, {3})},
                  {Attribute::TensorValue("value", half_one)}, 13)[0],
            Bits16(DType::kFloat16, {3}, {0x3c00, 0x3c00, 0x3c00}));
  EXPECT_EQ(RunOk("ConstantOfShape", {I64({2}, {0, 4})}, {}, 13)[0].dims(),
            (std::vector<int64_t>{0, 4}));
  absl::StatusOr<std::vector<Tensor>> bad =
      RunNodeOf("ConstantOfShape", {I64({2}, {2, -1})}, {}, 13);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("[2,-1]"), std::string::npos) << bad.status();
}

TEST(CpuIdentity, CopiesEveryDType) {
  for (DType dtype : {DType::kBool, DType::kInt64, DType::kInt32, DType::kFloat16, DType::kBFloat16,
                      DType::kFloat32, DType::kFloat64, DType::kUInt8, DType::kInt8}) {
    Tensor in(dtype, {3, 2});
    for (size_t b = 0; b < in.byte_size(); ++b) {
      in.raw()[b] =
          dtype == DType::kBool ? static_cast<uint8_t>(b % 2) : static_cast<uint8_t>(b * 7 + 1);
    }
    EXPECT_EQ(RunOk("Identity", {in}, {}, 13)[0], in) << DTypeName(dtype);
  }
}

TEST(CpuRange, FloatAndIntTypes) {
  EXPECT_EQ(RunOk("Range", {Tensor::Scalar(1), Tensor::Scalar(5), Tensor::Scalar(1.5f)}, {}, 11)[0],
            F32({3}, {1, 2.5f, 4}));
  EXPECT_EQ(RunOk("Range", {I64({}, {10}), I64({}, {4}), I64({}, {-3})}, {}, 11)[0],
            I64({2}, {10, 7}));
  EXPECT_EQ(RunOk("Range", {I64({}, {1}), I64({}, {1}), I64({}, {1})}, {}, 11)[0].dims(),
            (std::vector<int64_t>{0}));
  EXPECT_EQ(RunOk("Range", {F64({}, {0.5}), F64({}, {-1}), F64({}, {-0.5})}, {}, 11)[0],
            F64({3}, {0.5, 0, -0.5}));
  const auto i16 = [](int16_t v) {
    return Tensor::FromVector(DType::kInt16, {}, std::vector<int16_t>{v});
  };
  EXPECT_EQ(RunOk("Range", {i16(-3), i16(4), i16(3)}, {}, 11)[0],
            Tensor::FromVector(DType::kInt16, {3}, std::vector<int16_t>{-3, 0, 3}));
  const auto i32 = [](int32_t v) {
    return Tensor::FromVector(DType::kInt32, {}, std::vector<int32_t>{v});
  };
  EXPECT_EQ(RunOk("Range", {i32(0), i32(7), i32(2)}, {}, 11)[0],
            Tensor::FromVector(DType::kInt32, {4}, std::vector<int32_t>{0, 2, 4, 6}));
  absl::StatusOr<std::vector<Tensor>> bad =
      RunNodeOf("Range", {I64({}, {0}), I64({}, {3}), I64({}, {0})}, {}, 11);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("delta is 0"), std::string::npos);
}

// ---- Dropout -------------------------------------------------------------------

TEST(CpuDropout, InferenceIsIdentityWithAllTrueMask) {
  Tensor x = F32({2, 3}, {1, -2, 3, -4, 5, -6});
  Tensor all_true = Tensor::FromVector(DType::kBool, {2, 3}, std::vector<uint8_t>(6, 1));
  // Opset 13: no training_mode input.
  std::vector<Tensor> out = RunOk("Dropout", {x, Tensor::Scalar(0.5f)}, {}, 13, 2);
  EXPECT_EQ(out[0], x);
  EXPECT_EQ(out[1], all_true);
  // training_mode false.
  out = RunOk("Dropout", {x, Tensor::Scalar(0.5f), Bool(false)}, {}, 13, 2);
  EXPECT_EQ(out[0], x);
  EXPECT_EQ(out[1], all_true);
  // Training with ratio 0.
  out = RunOk("Dropout", {x, Tensor::Scalar(0.0f), Bool(true)}, {}, 13, 2);
  EXPECT_EQ(out[0], x);
  EXPECT_EQ(out[1], all_true);
  // Opset 7: ratio attribute, the mask has the data's dtype.
  out = RunOk("Dropout", {x}, {Attribute::Float("ratio", 0.3f)}, 7, 2);
  EXPECT_EQ(out[0], x);
  EXPECT_EQ(out[1], F32({2, 3}, {1, 1, 1, 1, 1, 1}));
}

TEST(CpuDropout, TrainingKeepsScaledElementsWithASeededMask) {
  const int64_t n = 20000;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = 0.25f * static_cast<float>(i % 17) + 1.0f;
  Tensor x = F32({n}, values);
  std::vector<Tensor> out =
      RunOk("Dropout", {x, Tensor::Scalar(0.75f), Bool(true)}, {Attribute::Int("seed", 42)}, 13, 2);
  ASSERT_EQ(out[1].dtype(), DType::kBool);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = out[1].data<uint8_t>()[i] != 0;
    kept += keep;
    EXPECT_EQ(out[0].data<float>()[i], keep ? values[i] * 4.0f : 0.0f) << i;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.25, 0.02);
  // Same seed, same mask; another seed, another mask.
  EXPECT_EQ(RunOk("Dropout", {x, Tensor::Scalar(0.75f), Bool(true)}, {Attribute::Int("seed", 42)},
                  13, 2)[1],
            out[1]);
  EXPECT_NE(RunOk("Dropout", {x, Tensor::Scalar(0.75f), Bool(true)}, {Attribute::Int("seed", 7)},
                  13, 2)[1],
            out[1]);
  // The uniform draws follow numpy's RandomState(seed).uniform: for seed 0
  // they start 0.5488, 0.7152, 0.6028.
  std::vector<Tensor> first =
      RunOk("Dropout", {F32({3}, {1, 1, 1}), Tensor::Scalar(0.6f), Bool(true)}, {}, 13, 2);
  EXPECT_EQ(first[1].ToInt64Vector(), (std::vector<int64_t>{0, 1, 1}));
  const float scale = 1.0f / (1.0f - 0.6f);  // as numpy computes it in float32
  EXPECT_EQ(first[0], F32({3}, {0, scale, scale}));
}

TEST(CpuDropout, BFloat16TrainingScalesInFloat32) {
  Tensor x = Bits16(DType::kBFloat16, {3}, {0x3f80, 0x4000, 0xc040});  // 1, 2, -3
  std::vector<Tensor> out = RunOk("Dropout", {x, Tensor::Scalar(0.6f), Bool(true)}, {}, 13, 2);
  EXPECT_EQ(out[0].dtype(), DType::kBFloat16);
  EXPECT_EQ(out[0].GetDouble(0), 0.0);
  EXPECT_EQ(out[0].GetDouble(1), 5.0);
  EXPECT_EQ(out[0].GetDouble(2), -7.5);
}

// ---- Losses --------------------------------------------------------------------

struct LossCase {
  std::vector<int64_t> dims;  // [N, C, d...]
  bool weighted;
  bool ignore;
  int64_t ignore_index;
  std::string reduction;
};

// Float64 reference of both losses (NLL reads `scores` as log-probabilities).
struct LossReference {
  std::vector<double> per_position;
  double reduced = 0;
  std::vector<double> log_prob;
};

LossReference ReferenceLoss(bool softmax, const std::vector<double>& scores,
                            const std::vector<int64_t>& labels, const std::vector<double>* weights,
                            const LossCase& c) {
  const int64_t n_batch = c.dims[0], classes = c.dims[1];
  int64_t inner = 1;
  for (size_t k = 2; k < c.dims.size(); ++k) inner *= c.dims[k];
  LossReference ref;
  ref.log_prob = scores;
  if (softmax) {
    for (int64_t n = 0; n < n_batch; ++n) {
      for (int64_t d = 0; d < inner; ++d) {
        double sum = 0;
        for (int64_t k = 0; k < classes; ++k)
          sum += std::exp(scores[(n * classes + k) * inner + d]);
        for (int64_t k = 0; k < classes; ++k) {
          const int64_t at = (n * classes + k) * inner + d;
          ref.log_prob[at] = scores[at] - std::log(sum);
        }
      }
    }
  }
  double total = 0, weight_total = 0;
  for (int64_t n = 0; n < n_batch; ++n) {
    for (int64_t d = 0; d < inner; ++d) {
      const int64_t label = labels[n * inner + d];
      double loss = 0, w = 0;
      if (!(c.ignore && label == c.ignore_index)) {
        w = weights ? (*weights)[label] : 1.0;
        loss = -w * ref.log_prob[(n * classes + label) * inner + d];
      }
      ref.per_position.push_back(loss);
      total += loss;
      weight_total += w;
    }
  }
  ref.reduced = c.reduction == "sum" ? total : total / weight_total;
  return ref;
}

void CheckLoss(const std::string& op, const LossCase& c, DType score_dtype) {
  SCOPED_TRACE(absl::StrCat(op, " ", DTypeName(score_dtype), " dims ", c.dims.size(),
                            c.weighted ? " weighted" : "", c.ignore ? " ignore_index" : "", " ",
                            c.reduction));
  const bool softmax = op == "SoftmaxCrossEntropyLoss";
  std::mt19937 rng(static_cast<uint32_t>(c.dims.size() * 7 + c.weighted * 3 + c.ignore));
  std::uniform_real_distribution<double> uniform(-3.0, 3.0);
  int64_t count = 1, inner = 1;
  for (int64_t d : c.dims) count *= d;
  for (size_t k = 2; k < c.dims.size(); ++k) inner *= c.dims[k];
  const int64_t classes = c.dims[1];
  std::vector<int64_t> label_dims = {c.dims[0]};
  for (size_t k = 2; k < c.dims.size(); ++k) label_dims.push_back(c.dims[k]);
  // Scores: rounded to the score dtype first, so the reference sees the
  // exact inputs.
  std::vector<double> raw(count);
  for (double& v : raw) v = uniform(rng);
  Tensor scores = Tensor::FromVector(DType::kFloat64, c.dims, raw);
  if (score_dtype != DType::kFloat64) scores = CastTo(scores, score_dtype);
  std::vector<double> exact(count);
  for (int64_t i = 0; i < count; ++i) exact[i] = scores.GetDouble(i);
  std::vector<int64_t> labels(c.dims[0] * inner);
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<int64_t>(rng() % classes);
    if (c.ignore && i % 3 == 1) labels[i] = c.ignore_index;
  }
  std::vector<double> weight_values;
  for (int64_t k = 0; k < classes; ++k) weight_values.push_back(0.5 + 0.25 * k);
  Tensor weights = CastTo(F64({classes}, weight_values), score_dtype);
  for (int64_t k = 0; k < classes; ++k) weight_values[k] = weights.GetDouble(k);

  std::vector<Tensor> inputs = {scores, I64(label_dims, labels)};
  if (c.weighted) inputs.push_back(weights);
  std::vector<Attribute> attributes = {Attribute::String("reduction", c.reduction)};
  if (c.ignore) attributes.push_back(Attribute::Int("ignore_index", c.ignore_index));
  const int outputs = softmax ? 2 : 1;
  std::vector<Tensor> out = RunOk(op, inputs, attributes, 22, outputs);  // NLL: bfloat16 from 22
  const LossReference ref =
      ReferenceLoss(softmax, exact, labels, c.weighted ? &weight_values : nullptr, c);
  // float32 math: ~1e-6 relative; 16-bit outputs: one rounding of the result.
  const double rtol = score_dtype == DType::kFloat64   ? 1e-12
                      : score_dtype == DType::kFloat32 ? 1e-5
                      : score_dtype == DType::kFloat16 ? 1e-3
                                                       : 8e-3;
  ASSERT_EQ(out[0].dtype(), score_dtype);
  if (c.reduction == "none") {
    ASSERT_EQ(out[0].dims(), label_dims);
    for (size_t i = 0; i < ref.per_position.size(); ++i) {
      EXPECT_NEAR(out[0].GetDouble(i), ref.per_position[i],
                  1e-6 + rtol * std::fabs(ref.per_position[i]))
          << "position " << i;
    }
  } else {
    ASSERT_TRUE(out[0].dims().empty());
    EXPECT_NEAR(out[0].GetDouble(0), ref.reduced, 1e-6 + rtol * std::fabs(ref.reduced));
  }
  if (softmax) {
    ASSERT_EQ(out[1].dims(), c.dims);
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_NEAR(out[1].GetDouble(i), ref.log_prob[i], 1e-6 + rtol * std::fabs(ref.log_prob[i]))
          << "log_prob " << i;
    }
  }
}

TEST(CpuLosses, MatchFloat64ReferenceWithWeightsIgnoreIndexAndReductions) {
  const std::vector<std::vector<int64_t>> shapes = {{4, 5}, {3, 4, 6}, {2, 3, 2, 3}};
  for (const std::string op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
    for (const auto& dims : shapes) {
      for (const std::string reduction : {"none", "sum", "mean"}) {
        for (bool weighted : {false, true}) {
          for (bool ignore : {false, true}) {
            // An ignore_index outside [0, C) (as PyTorch's -100) and inside.
            for (int64_t ignore_index : {int64_t{-100}, int64_t{1}}) {
              if (!ignore && ignore_index != -100) continue;
              CheckLoss(op, {dims, weighted, ignore, ignore_index, reduction}, DType::kFloat32);
            }
          }
        }
      }
    }
  }
}

TEST(CpuLosses, SixteenBitScoresAccumulateInFloat32) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    for (const std::string op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
      CheckLoss(op, {{16, 7, 40}, true, true, 2, "mean"}, dtype);
      CheckLoss(op, {{16, 7, 40}, false, false, -100, "sum"}, dtype);
      CheckLoss(op, {{3, 4, 2}, true, false, -100, "none"}, dtype);
    }
  }
  // 640 float16 losses summed: a 16-bit accumulator would lose it, float32
  // keeps it within one float16 rounding of the reference (checked above).
}

TEST(CpuLosses, Int32LabelsAndOutOfRangeLabel) {
  Tensor scores = F32({2, 3}, {0.1f, 0.2f, 0.3f, 1.0f, 2.0f, 3.0f});
  Tensor labels = Tensor::FromVector(DType::kInt32, {2}, std::vector<int32_t>{2, 0});
  std::vector<Tensor> out = RunOk("NegativeLogLikelihoodLoss", {scores, labels},
                                  {Attribute::String("reduction", "sum")}, 13);
  EXPECT_FLOAT_EQ(out[0].data<float>()[0], -(0.3f + 1.0f));
  Tensor bad_labels = Tensor::FromVector(DType::kInt32, {2}, std::vector<int32_t>{3, 0});
  absl::StatusOr<std::vector<Tensor>> bad =
      RunNodeOf("SoftmaxCrossEntropyLoss", {scores, bad_labels}, {}, 13);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("label 3"), std::string::npos) << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("[0, 3)"), std::string::npos);
}

// ---- Optimizers ----------------------------------------------------------------

std::vector<Tensor> RunOptimizer(const std::string& op, std::vector<Tensor> inputs,
                                 std::vector<Attribute> attributes, int outputs) {
  return RunOk(op, std::move(inputs), std::move(attributes), 1, outputs, kTrainingDomain);
}

TEST(CpuOptimizers, MomentumStandardAndNesterovHandComputed) {
  const std::vector<Attribute> base = {Attribute::Float("alpha", 0.9f),
                                       Attribute::Float("beta", 0.8f),
                                       Attribute::Float("norm_coefficient", 0.0f)};
  auto with_mode = [&](const char* mode) {
    std::vector<Attribute> a = base;
    a.push_back(Attribute::String("mode", mode));
    return a;
  };
  // x = 1, g = 0.5, v = 0.2, r = 0.1, T = 1:
  //   v' = 0.9 * 0.2 + 0.8 * 0.5 = 0.58; standard x' = 1 - 0.1 * 0.58 = 0.942
  //   nesterov x' = 1 - 0.1 * (0.5 + 0.9 * 0.58) = 0.8978
  std::vector<Tensor> out = RunOptimizer("Momentum",
                                         {Tensor::Scalar(0.1f), I64({}, {1}), F32({1}, {1}),
                                          F32({1}, {0.5f}), F32({1}, {0.2f})},
                                         with_mode("standard"), 2);
  EXPECT_NEAR(out[0].GetDouble(0), 0.942, 1e-6);
  EXPECT_NEAR(out[1].GetDouble(0), 0.58, 1e-6);
  out = RunOptimizer("Momentum",
                     {Tensor::Scalar(0.1f), I64({}, {1}), F32({1}, {1}), F32({1}, {0.5f}),
                      F32({1}, {0.2f})},
                     with_mode("nesterov"), 2);
  EXPECT_NEAR(out[0].GetDouble(0), 0.8978, 1e-6);
  EXPECT_NEAR(out[1].GetDouble(0), 0.58, 1e-6);
  // T = 0: the gradient's coefficient is 1: v' = 0.18 + 0.5 = 0.68.
  out = RunOptimizer("Momentum",
                     {Tensor::Scalar(0.1f), I64({}, {0}), F32({1}, {1}), F32({1}, {0.5f}),
                      F32({1}, {0.2f})},
                     with_mode("standard"), 2);
  EXPECT_NEAR(out[1].GetDouble(0), 0.68, 1e-6);
  EXPECT_NEAR(out[0].GetDouble(0), 0.932, 1e-6);
}

TEST(CpuOptimizers, AdagradWithDecayAndNormCoefficient) {
  // r = 0.1, T = 2, decay 0.5 -> r' = 0.05; x = 1, g = 0.5, h = 0.75,
  // norm 0.1 -> g' = 0.6, h' = 1.11, x' = 1 - 0.05 * 0.6 / (sqrt(1.11) + 1e-6).
  std::vector<Tensor> out =
      RunOptimizer("Adagrad",
                   {Tensor::Scalar(0.1f), I64({}, {2}), F32({2}, {1, -2}),
                    F32({2}, {0.5f, 0}), F32({2}, {0.75f, 0})},
                   {Attribute::Float("decay_factor", 0.5f),
                    Attribute::Float("norm_coefficient", 0.1f), Attribute::Float("epsilon", 1e-6f)},
                   2);
  EXPECT_NEAR(out[0].GetDouble(0), 1 - 0.05 * 0.6 / (std::sqrt(1.11) + 1e-6), 1e-6);
  EXPECT_NEAR(out[1].GetDouble(0), 1.11, 1e-6);
  // x = -2, g = 0, h = 0: g' = -0.2, h' = 0.04, x' = -2 + 0.05 * 0.2 / (0.2 + 1e-6).
  EXPECT_NEAR(out[0].GetDouble(1), -2 + 0.05 * 0.2 / (0.2 + 1e-6), 1e-6);
  EXPECT_NEAR(out[1].GetDouble(1), 0.04, 1e-7);
}

TEST(CpuOptimizers, AdamBiasCorrectionAndNormCoefficientPost) {
  // alpha 0.9, beta 0.999, T = 1, x = 1, g = 0.5, v = h = 0, r = 0.1:
  // v' = 0.05, h' = 0.00025, r' = 0.1 * sqrt(0.001) / 0.1,
  // x' = (1 - 0.1) * (1 - r' * 0.05 / (sqrt(0.00025) + 1e-6)).
  const double r_adjusted = 0.1 * std::sqrt(1 - 0.999) / (1 - 0.9);
  const double expected_x = 0.9 * (1 - r_adjusted * 0.05 / (std::sqrt(0.00025) + 1e-6));
  std::vector<Tensor> out = RunOptimizer("Adam",
                                         {Tensor::Scalar(0.1f), I64({}, {1}), F32({1}, {1}),
                                          F32({1}, {0.5f}), F32({1}, {0}), F32({1}, {0})},
                                         {Attribute::Float("norm_coefficient_post", 0.1f)}, 3);
  EXPECT_NEAR(out[0].GetDouble(0), expected_x, 1e-5);
  EXPECT_NEAR(out[1].GetDouble(0), 0.05, 1e-7);
  // beta is the float attribute 0.999f: 1 - beta = 0.00099998713.
  EXPECT_NEAR(out[2].GetDouble(0), (1 - static_cast<double>(0.999f)) * 0.25, 1e-10);
  // T = 0: no bias correction: x' = 1 - 0.1 * 0.05 / (sqrt(0.00025) + 1e-6).
  out = RunOptimizer("Adam",
                     {Tensor::Scalar(0.1f), I64({}, {0}), F32({1}, {1}), F32({1}, {0.5f}),
                      F32({1}, {0}), F32({1}, {0})},
                     {}, 3);
  EXPECT_NEAR(out[0].GetDouble(0), 1 - 0.1 * 0.05 / (std::sqrt(0.00025) + 1e-6), 1e-5);
}

TEST(CpuOptimizers, SeveralTensorsPerNodeAndFloat64) {
  // Momentum over two tensors of different shapes, float64: outputs are
  // X1_new, X2_new, V1_new, V2_new.
  std::vector<Tensor> out = RunOptimizer(
      "Momentum",
      {F64({}, {0.5}), I64({}, {3}), F64({1}, {1}), F64({2}, {2, 3}),
       F64({1}, {1}), F64({2}, {-1, 0}), F64({1}, {0}), F64({2}, {1, 1})},
      {Attribute::Float("alpha", 0.5f), Attribute::Float("beta", 1.0f),
       Attribute::Float("norm_coefficient", 0.0f), Attribute::String("mode", "standard")},
      4);
  ASSERT_EQ(out[1].dims(), (std::vector<int64_t>{2}));
  EXPECT_EQ(out[0], F64({1}, {0.5}));         // v1' = 1, x1' = 1 - 0.5
  EXPECT_EQ(out[1], F64({2}, {2.25, 2.75}));  // v2' = (-0.5, 0.5)
  EXPECT_EQ(out[2], F64({1}, {1}));
  EXPECT_EQ(out[3], F64({2}, {-0.5, 0.5}));
}

// ---- Conformance ----------------------------------------------------------------

TEST(CpuMiscLossTrainingConformance, NodeCasesOfTheseOpsPass) {
  if (!fs::is_directory(ConformanceRoot())) {
    GTEST_SKIP() << "no conformance data at " << ConformanceRoot();
  }
  const ConformanceSummary summary = RunConformanceCasesOf(
      Cpu(), {"Cast", "Constant", "ConstantOfShape", "Dropout", "Identity", "Range",
              "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "Adagrad", "Adam",
              "Momentum"});
  std::cout << "misc/loss/training conformance: " << summary.passed << " passed, "
            << summary.failures.size() << " failed, " << summary.multi_node.size()
            << " multi-node skipped\n";
  for (const std::string& f : summary.failures) ADD_FAILURE() << f;
  for (const std::string& m : summary.multi_node) {
    std::cout << "  skipped (multi-node): " << m << "\n";
  }
  EXPECT_GE(summary.passed, 50);
}

}  // namespace
}  // namespace castor
