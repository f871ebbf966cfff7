// Tests of the CPU reduce and softmax kernels (backend/cpu/reduce.cc,
// softmax.cc): every Reduce* op against a float64 brute-force reference over
// many axis sets (attribute and input forms, keepdims, negative axes, empty
// axes with and without noop_with_empty_axes), float32 accumulation of
// 16-bit sums, empty-set identities, bool/integer reductions, ArgMax/ArgMin,
// CumSum, Softmax/LogSoftmax opset semantics, large-number stability and
// 16-bit rounding, and every ONNX conformance case of these ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_backend.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
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
using testing::I32;
using testing::I64;
using testing::Ramp;
using testing::RunConformanceCasesOf;
using testing::RunOp;
using testing::SingleNode;
using testing::Values;

// Brute-force reduction of x (dims) over `reduced` axes in double; returns
// values in the kept axes' row-major order.
std::vector<double> ReferenceReduce(const std::vector<float>& x, const std::vector<int64_t>& dims,
                                    const std::vector<bool>& reduced, const std::string& op) {
  const size_t rank = dims.size();
  std::vector<int64_t> out_dims;
  for (size_t d = 0; d < rank; ++d) out_dims.push_back(reduced[d] ? 1 : dims[d]);
  const int64_t out_n = Count(out_dims);
  std::vector<std::vector<double>> groups(static_cast<size_t>(out_n));
  for (int64_t i = 0; i < Count(dims); ++i) {
    int64_t rest = i, out_index = 0, stride = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t idx = rest % dims[d];
      rest /= dims[d];
      if (!reduced[d]) out_index += idx * stride;
      stride *= out_dims[d];
    }
    groups[out_index].push_back(x[i]);
  }
  std::vector<double> result;
  for (const std::vector<double>& g : groups) {
    double r = 0;
    if (op == "ReduceSum") {
      for (double v : g) r += v;
    } else if (op == "ReduceMean") {
      for (double v : g) r += v;
      r /= static_cast<double>(g.size());
    } else if (op == "ReduceMax") {
      r = -INFINITY;
      for (double v : g) r = std::max(r, v);
    } else if (op == "ReduceMin") {
      r = INFINITY;
      for (double v : g) r = std::min(r, v);
    } else if (op == "ReduceProd") {
      r = 1;
      for (double v : g) r *= v;
    } else if (op == "ReduceL1") {
      for (double v : g) r += std::fabs(v);
    } else if (op == "ReduceL2") {
      for (double v : g) r += v * v;
      r = std::sqrt(r);
    } else if (op == "ReduceSumSquare") {
      for (double v : g) r += v * v;
    } else if (op == "ReduceLogSumExp") {
      for (double v : g) r += std::exp(v);
      r = std::log(r);
    }
    result.push_back(r);
  }
  return result;
}

const std::vector<std::string> kReduceOps = {"ReduceSum",  "ReduceMean", "ReduceMax",
                                             "ReduceMin",  "ReduceProd", "ReduceL1",
                                             "ReduceL2",   "ReduceSumSquare", "ReduceLogSumExp"};

// The node for `op` reducing `axes` at `opset`: axes as an attribute before
// the op's axes-input opset, as a constant input after.
Tensor Reduce(const std::string& op, const Tensor& x, const std::vector<int64_t>& axes,
              bool keepdims, int64_t opset) {
  const int64_t since = op == "ReduceSum" ? 13 : 18;
  std::vector<Attribute> attrs = {Attribute::Int("keepdims", keepdims ? 1 : 0)};
  if (opset < since) {
    if (!axes.empty()) attrs.push_back(Attribute::Ints("axes", axes));
    return RunOp(op, {x}, attrs, opset);
  }
  return RunOp(op, {x, I64({static_cast<int64_t>(axes.size())}, axes)}, attrs, opset);
}

TEST(CpuReduceTest, AllReductionsMatchFloat64Reference) {
  const std::vector<int64_t> dims = {2, 3, 4};
  std::vector<float> x = Ramp(24, 1.5f, 0.2f);
  const std::vector<std::vector<int64_t>> axes_sets = {{0}, {1}, {2}, {-1}, {0, 2}, {1, 2},
                                                       {-3, -2}, {0, 1, 2}, {}};
  for (const std::string& op : kReduceOps) {
    for (int64_t opset : {13, 18}) {
      for (const auto& axes : axes_sets) {
        for (bool keepdims : {true, false}) {
          std::vector<bool> reduced(3, axes.empty());
          for (int64_t a : axes) reduced[a < 0 ? a + 3 : a] = true;
          std::vector<int64_t> out_dims;
          for (int d = 0; d < 3; ++d) {
            if (!reduced[d]) {
              out_dims.push_back(dims[d]);
            } else if (keepdims) {
              out_dims.push_back(1);
            }
          }
          Tensor y = Reduce(op, F32(dims, x), axes, keepdims, opset);
          const std::string what = absl::StrCat(op, " opset ", opset, " axes ",
                                                common::DimsToString(axes), " keepdims ", keepdims);
          ASSERT_EQ(y.dtype(), DType::kFloat32) << what;
          ASSERT_EQ(y.dims(), out_dims) << what;
          const std::vector<double> expected = ReferenceReduce(x, dims, reduced, op);
          ASSERT_EQ(y.num_elements(), static_cast<int64_t>(expected.size())) << what;
          for (size_t i = 0; i < expected.size(); ++i) {
            EXPECT_NEAR(y.data<float>()[i], expected[i], 1e-5 * std::fabs(expected[i]) + 1e-6)
                << what << " element " << i;
          }
        }
      }
    }
  }
}

TEST(CpuReduceTest, LargeReductionsOnEveryLayout) {
  const std::vector<int64_t> dims = {16, 300, 9};
  const std::vector<float> x = Ramp(Count(dims), 2.0f, 0.5f);
  for (const std::vector<int64_t>& axes :
       std::vector<std::vector<int64_t>>{{1}, {2}, {0}, {0, 2}, {1, 2}, {0, 1}}) {
    std::vector<bool> reduced(3, false);
    for (int64_t a : axes) reduced[a] = true;
    for (const std::string& op : {std::string("ReduceSum"), std::string("ReduceMax"),
                                  std::string("ReduceLogSumExp")}) {
      Tensor y = Reduce(op, F32(dims, x), axes, /*keepdims=*/false, 18);
      const std::vector<double> expected = ReferenceReduce(x, dims, reduced, op);
      ASSERT_EQ(y.num_elements(), static_cast<int64_t>(expected.size()));
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_NEAR(y.data<float>()[i], expected[i], 1e-5 * std::fabs(expected[i]) + 1e-5)
            << op << " axes " << common::DimsToString(axes) << " element " << i;
      }
    }
  }
}

TEST(CpuReduceTest, EmptyAxesReduceAllOrPassThrough) {
  const Tensor x = F32({2, 2}, {1, 2, 3, 4});
  // Empty axes input with noop_with_empty_axes: the input passes through.
  Tensor y = RunOp("ReduceSum", {x, I64({0}, {})}, {Attribute::Int("noop_with_empty_axes", 1)}, 13);
  EXPECT_EQ(y.dims(), x.dims());
  EXPECT_EQ(Values(y), Values(x));
  y = RunOp("ReduceMean", {x, I64({0}, {})},
            {Attribute::Int("noop_with_empty_axes", 1), Attribute::Int("keepdims", 0)}, 18);
  EXPECT_EQ(Values(y), Values(x));
  // Without it (or with axes omitted), everything is reduced.
  y = RunOp("ReduceSum", {x, I64({0}, {})}, {}, 13);
  EXPECT_EQ(y.dims(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(Values(y), (std::vector<double>{10}));
  y = RunOp("ReduceMax", {x}, {Attribute::Int("keepdims", 0)}, 18);
  EXPECT_EQ(y.dims(), (std::vector<int64_t>{}));
  EXPECT_EQ(Values(y), (std::vector<double>{4}));
  y = RunOp("ReduceMean", {x}, {}, 11);
  EXPECT_EQ(Values(y), (std::vector<double>{2.5}));
}

TEST(CpuReduceTest, HalfReduceSumAccumulatesInFloat32) {
  // 4096 ones: float16 accumulation would stop at 2048 (2048 + 1 rounds to 2048).
  Tensor y = RunOp("ReduceSum", {F16({4096}, std::vector<float>(4096, 1.0f)), I64({1}, {0})},
                   {Attribute::Int("keepdims", 0)}, 13);
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_EQ(Bits(y)[0], FloatToHalfBits(4096.0f));
  Tensor b = RunOp("ReduceSum", {BF16({2, 4096}, std::vector<float>(8192, 1.0f)), I64({1}, {1})},
                   {}, 13);
  EXPECT_EQ(Bits(b), (std::vector<uint16_t>{FloatToBFloat16Bits(4096.0f),
                                            FloatToBFloat16Bits(4096.0f)}));
  // A mean of halves is the float32 mean rounded once.
  Tensor h = F16({2, 3}, {0.1f, 0.2f, 0.7f, 1.3f, 2.9f, 3.3f});
  Tensor m = RunOp("ReduceMean", {h, I64({1}, {1})}, {}, 18);
  for (int r = 0; r < 2; ++r) {
    float sum = 0;
    for (int c = 0; c < 3; ++c) sum += HalfBitsToFloat(h.data<uint16_t>()[r * 3 + c]);
    EXPECT_EQ(Bits(m)[r], FloatToHalfBits(sum / 3.0f)) << r;
  }
}

TEST(CpuReduceTest, EmptySetReductionsGiveIdentities) {
  const Tensor x = F32({2, 0, 4}, {});
  struct Case {
    std::string op;
    double expected;
  };
  for (const Case& c : std::vector<Case>{{"ReduceSum", 0},
                                         {"ReduceProd", 1},
                                         {"ReduceMax", -INFINITY},
                                         {"ReduceMin", INFINITY},
                                         {"ReduceL1", 0},
                                         {"ReduceL2", 0},
                                         {"ReduceSumSquare", 0},
                                         {"ReduceLogSumExp", -INFINITY}}) {
    Tensor y = Reduce(c.op, x, {1}, true, 18);
    ASSERT_EQ(y.dims(), (std::vector<int64_t>{2, 1, 4})) << c.op;
    for (double v : Values(y)) EXPECT_EQ(v, c.expected) << c.op;
  }
  Tensor mean = Reduce("ReduceMean", x, {1}, true, 18);
  EXPECT_TRUE(std::isnan(mean.data<float>()[0]));
  Tensor imax = Reduce("ReduceMax", I32({2, 0}, {}), {1}, false, 18);
  EXPECT_EQ(Values(imax), (std::vector<double>{-2147483648.0, -2147483648.0}));
  // Reducing a non-empty axis of an empty tensor gives an empty result.
  Tensor e = Reduce("ReduceSum", x, {2}, true, 18);
  EXPECT_EQ(e.dims(), (std::vector<int64_t>{2, 0, 1}));
}

TEST(CpuReduceTest, BoolAndIntegerReductions) {
  Tensor b = Bool({3, 2}, {1, 0, 0, 0, 1, 1});
  Tensor any = RunOp("ReduceMax", {b, I64({1}, {1})}, {Attribute::Int("keepdims", 0)}, 20);
  ASSERT_EQ(any.dtype(), DType::kBool);
  EXPECT_EQ(Values(any), (std::vector<double>{1, 0, 1}));
  Tensor all = RunOp("ReduceMin", {b, I64({1}, {1})}, {Attribute::Int("keepdims", 0)}, 20);
  EXPECT_EQ(Values(all), (std::vector<double>{0, 0, 1}));

  Tensor i = I32({2, 3}, {1, 2, 4, -7, 5, 3});
  EXPECT_EQ(Values(Reduce("ReduceSum", i, {1}, false, 13)), (std::vector<double>{7, 1}));
  // Integer means truncate: 7/3 -> 2, 1/3 -> 0.
  EXPECT_EQ(Values(Reduce("ReduceMean", i, {1}, false, 18)), (std::vector<double>{2, 0}));
  EXPECT_EQ(Values(Reduce("ReduceProd", i, {1}, false, 18)), (std::vector<double>{8, -105}));
  EXPECT_EQ(Values(Reduce("ReduceMax", i, {0}, false, 18)), (std::vector<double>{1, 5, 4}));
  EXPECT_EQ(Values(Reduce("ReduceMin", i, {0}, false, 18)), (std::vector<double>{-7, 2, 3}));
  EXPECT_EQ(Values(Reduce("ReduceL1", i, {1}, false, 18)), (std::vector<double>{7, 15}));
  EXPECT_EQ(Values(Reduce("ReduceSumSquare", i, {1}, false, 18)), (std::vector<double>{21, 83}));
  Tensor big = I64({2}, {1LL << 40, 1LL << 40});
  EXPECT_EQ(Values(Reduce("ReduceSum", big, {0}, false, 13)),
            (std::vector<double>{2199023255552.0}));
}

TEST(CpuReduceTest, ReduceMaxPropagatesNan) {
  Tensor y = Reduce("ReduceMax", F32({2, 2}, {1, std::nanf(""), 3, 4}), {1}, false, 18);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(y.data<float>()[1], 4.0f);
}

TEST(CpuArgReduceTest, ArgMaxArgMin) {
  Tensor x = F32({2, 3}, {1, 9, 9, 4, -2, 4});
  Tensor y = RunOp("ArgMax", {x}, {Attribute::Int("axis", 1)}, 13);
  ASSERT_EQ(y.dtype(), DType::kInt64);
  EXPECT_EQ(y.dims(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0}));
  y = RunOp("ArgMax", {x}, {Attribute::Int("axis", -1), Attribute::Int("select_last_index", 1),
                            Attribute::Int("keepdims", 0)},
            13);
  EXPECT_EQ(y.dims(), (std::vector<int64_t>{2}));
  EXPECT_EQ(Values(y), (std::vector<double>{2, 2}));
  y = RunOp("ArgMin", {x}, {Attribute::Int("keepdims", 0)}, 13);  // axis 0
  EXPECT_EQ(Values(y), (std::vector<double>{0, 1, 1}));
  y = RunOp("ArgMin", {x}, {Attribute::Int("axis", 1), Attribute::Int("keepdims", 0)}, 13);
  EXPECT_EQ(Values(y), (std::vector<double>{0, 1}));
  // Integers and float16.
  y = RunOp("ArgMax", {I32({4}, {3, -1, 8, 8})}, {Attribute::Int("keepdims", 0)}, 13);
  EXPECT_EQ(Values(y), (std::vector<double>{2}));
  y = RunOp("ArgMin", {F16({2, 2}, {0.5f, -1.0f, 2.0f, 3.0f})}, {Attribute::Int("axis", 1)}, 13);
  EXPECT_EQ(Values(y), (std::vector<double>{1, 0}));
  // NaN wins (first NaN, as numpy).
  y = RunOp("ArgMax", {F32({4}, {1, std::nanf(""), 5, std::nanf("")})},
            {Attribute::Int("keepdims", 0)}, 13);
  EXPECT_EQ(Values(y), (std::vector<double>{1}));
}

TEST(CpuArgReduceTest, EmptyAxisIsAnError) {
  SingleNode node("ArgMax", {F32({0, 3}, {})}, {}, 13);
  ASSERT_TRUE(node.status().ok()) << node.status();
  absl::StatusOr<std::vector<Tensor>> out = node.Run(Cpu());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("empty axis"), std::string::npos) << out.status();
}

TEST(CpuCumSumTest, Variants) {
  const Tensor x = F32({5}, {1, 2, 3, 4, 5});
  EXPECT_EQ(Values(RunOp("CumSum", {x, I32({}, {0})}, {}, 14)),
            (std::vector<double>{1, 3, 6, 10, 15}));
  EXPECT_EQ(Values(RunOp("CumSum", {x, I64({}, {0})}, {Attribute::Int("exclusive", 1)}, 14)),
            (std::vector<double>{0, 1, 3, 6, 10}));
  EXPECT_EQ(Values(RunOp("CumSum", {x, I64({}, {0})}, {Attribute::Int("reverse", 1)}, 14)),
            (std::vector<double>{15, 14, 12, 9, 5}));
  EXPECT_EQ(Values(RunOp("CumSum", {x, I64({}, {-1})},
                         {Attribute::Int("reverse", 1), Attribute::Int("exclusive", 1)}, 14)),
            (std::vector<double>{14, 12, 9, 5, 0}));
  const Tensor m = I64({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(Values(RunOp("CumSum", {m, I32({1}, {0})}, {}, 14)),
            (std::vector<double>{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(Values(RunOp("CumSum", {m, I32({1}, {1})}, {}, 14)),
            (std::vector<double>{1, 3, 6, 4, 9, 15}));
  // float16: each prefix sum is the float32 running sum rounded once.
  const Tensor h = F16({4}, {2048, 1, 1, 1});
  EXPECT_EQ(Bits(RunOp("CumSum", {h, I64({}, {0})}, {}, 14)),
            (std::vector<uint16_t>{FloatToHalfBits(2048), FloatToHalfBits(2049),
                                   FloatToHalfBits(2050), FloatToHalfBits(2051)}));
}

// ---------------- softmax ----------------

// Softmax / LogSoftmax reference in double over lines (outer, n, inner).
std::vector<double> ReferenceSoftmax(const std::vector<float>& x, int64_t outer, int64_t n,
                                     int64_t inner, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < inner; ++k) {
      double m = -INFINITY, s = 0;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[(o * n + i) * inner + k]));
      for (int64_t i = 0; i < n; ++i) s += std::exp(x[(o * n + i) * inner + k] - m);
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[(o * n + i) * inner + k] - m;
        y[(o * n + i) * inner + k] = log ? v - std::log(s) : std::exp(v) / s;
      }
    }
  }
  return y;
}

TEST(CpuSoftmaxTest, AxesAndOpsetSemantics) {
  const std::vector<int64_t> dims = {2, 3, 4};
  const std::vector<float> x = Ramp(24, 4.0f, 0.0f);
  struct Case {
    int64_t opset;
    std::optional<int64_t> axis;
    int64_t outer, n, inner;
  };
  const std::vector<Case> cases = {
      {13, std::nullopt, 6, 4, 1}, {13, 2, 6, 4, 1}, {13, 1, 2, 3, 4},  {13, 0, 1, 2, 12},
      {13, -2, 2, 3, 4},           {11, std::nullopt, 2, 12, 1},        {11, 0, 1, 24, 1},
      {11, 2, 6, 4, 1},            {11, -1, 6, 4, 1},
  };
  for (bool log : {false, true}) {
    const std::string op = log ? "LogSoftmax" : "Softmax";
    for (const Case& c : cases) {
      std::vector<Attribute> attrs;
      if (c.axis) attrs.push_back(Attribute::Int("axis", *c.axis));
      Tensor y = RunOp(op, {F32(dims, x)}, attrs, c.opset);
      ASSERT_EQ(y.dims(), dims);
      const std::vector<double> expected = ReferenceSoftmax(x, c.outer, c.n, c.inner, log);
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_NEAR(y.data<float>()[i], expected[i], 1e-6 * std::fabs(expected[i]) + 1e-7)
            << op << " opset " << c.opset << " axis " << (c.axis ? *c.axis : 99) << " element "
            << i;
      }
    }
  }
}

TEST(CpuSoftmaxTest, LargeNumbersAreStable) {
  const Tensor x = F32({2, 4}, {1000, 1001, 1002, 1003, -1000, -1001, -1002, 3.4e38f});
  Tensor y = RunOp("Softmax", {x}, {}, 13);
  const std::vector<double> expected =
      ReferenceSoftmax({1000, 1001, 1002, 1003, -1000, -1001, -1002, 3.4e38f}, 2, 4, 1, false);
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isfinite(y.data<float>()[i])) << i;
    EXPECT_NEAR(y.data<float>()[i], expected[i], 1e-6) << i;
  }
  Tensor l = RunOp("LogSoftmax", {x}, {}, 13);
  const std::vector<double> log_expected =
      ReferenceSoftmax({1000, 1001, 1002, 1003, -1000, -1001, -1002, 3.4e38f}, 2, 4, 1, true);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(l.data<float>()[i], log_expected[i], 1e-5) << i;
  EXPECT_NEAR(l.data<float>()[0], -3.4401897, 1e-5);
}

TEST(CpuSoftmaxTest, SixteenBitIsFloat32ResultRoundedOnce) {
  const std::vector<float> v = Ramp(3 * 70, 3.0f, 0.1f);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const Tensor x16 = dtype == DType::kFloat16 ? F16({3, 70}, v) : BF16({3, 70}, v);
      std::vector<float> widened;
      for (double d : Values(x16)) widened.push_back(static_cast<float>(d));
      const Tensor y32 = RunOp(op, {F32({3, 70}, widened)}, {}, 13);
      const Tensor y16 = RunOp(op, {x16}, {}, 13);
      ASSERT_EQ(y16.dtype(), dtype);
      for (int i = 0; i < 210; ++i) {
        const float f = y32.data<float>()[i];
        EXPECT_EQ(Bits(y16)[i],
                  dtype == DType::kFloat16 ? FloatToHalfBits(f) : FloatToBFloat16Bits(f))
            << op << " " << DTypeName(dtype) << " element " << i;
      }
    }
  }
}

TEST(CpuSoftmaxTest, LargeTensorAlongInnerAxis) {
  // Softmax along axis 1 of [8, 50, 300]: strided lines, threaded.
  const std::vector<int64_t> dims = {8, 50, 300};
  const std::vector<float> x = Ramp(Count(dims), 5.0f, 0.0f);
  Tensor y = RunOp("Softmax", {F32(dims, x)}, {Attribute::Int("axis", 1)}, 13);
  const std::vector<double> expected = ReferenceSoftmax(x, 8, 50, 300, false);
  for (size_t i = 0; i < expected.size(); i += 7) {
    ASSERT_NEAR(y.data<float>()[i], expected[i], 1e-6 * expected[i] + 1e-8) << i;
  }
}

TEST(CpuReduceSoftmaxTest, ConformanceCasesOfReduceAndSoftmaxOps) {
  if (!std::filesystem::exists(ConformanceRoot())) {
    GTEST_SKIP() << "no conformance data at " << ConformanceRoot();
  }
  const ConformanceSummary summary = RunConformanceCasesOf(
      Cpu(), {"ArgMax",     "ArgMin",        "CumSum",   "ReduceL1",        "ReduceL2",
              "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",     "ReduceProd",
              "ReduceSum",  "ReduceSumSquare", "Softmax", "LogSoftmax"});
  for (const std::string& failure : summary.failures) ADD_FAILURE() << failure;
  for (const std::string& name : summary.multi_node) {
    ADD_FAILURE() << name << ": not a single-node model";
  }
  const int ran = summary.ran() + static_cast<int>(summary.multi_node.size());
  std::cout << "reduce/softmax conformance: " << summary.passed << "/" << ran << " passed\n";
  EXPECT_GT(ran, 30);
}

}  // namespace
}  // namespace castor
