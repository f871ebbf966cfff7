// castor's gradient ops (graph/ops/gradient_ops.cc; their CPU kernels, backend/cpu/,
// live with their op families)
// against finite differences of their forward ONNX ops on the CPU backend:
// for float32 inputs x and a random upstream gradient dY, each kernel's
// gradient is compared with central differences of L(x) = sum(forward(x) *
// dY) (the forward runs in float64 on the same values, h = 1e-3). Also: one
// float16 and one bfloat16 case per op family against the float32 kernel on
// the same (rounded) inputs, MaxPoolGrad's tie rule, SoftmaxCrossEntropyLossGrad's
// ignore_index and weights, the registry entries, an output nothing reads
// left out, and error messages for bad inputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/batch_norm_loops.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/grid_conv.h"
#include "backend/cpu/simd16.h"
#include "graph/gradient_builder.h"
#include "graph/half.h"
#include "graph/op_registry.h"
#include "gtest/gtest.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::Count;
using testing::Cpu;
using testing::ExpectNear;
using testing::Make;
using testing::RunNodeOf;
using testing::SameBits;
using testing::Values;

constexpr double kStep = 1e-3;
constexpr double kRelTol = 1e-2;
constexpr double kAbsTol = 1e-3;

Tensor Convert(const Tensor& t, DType dtype) { return Make(dtype, t.dims(), Values(t)); }

// Uniform in [lo, hi), float32-exact.
std::vector<double> Random(int64_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(real(rng));
  return v;
}

Tensor RandomTensor(const std::vector<int64_t>& dims, unsigned seed, double lo = -1.0,
                    double hi = 1.0) {
  return Make(DType::kFloat32, dims, Random(Count(dims), seed, lo, hi));
}

// Runs one node; a failure is reported and gives no outputs.
std::vector<Tensor> RunOp(const std::string& op, std::vector<Tensor> inputs,
                        std::vector<Attribute> attrs, int num_outputs = 1,
                        const std::string& domain = kCastorDomain, int64_t opset = 1,
                        std::vector<int> constant_inputs = {}) {
  absl::StatusOr<std::vector<Tensor>> out =
      RunNodeOf(op, std::move(inputs), std::move(attrs), opset, num_outputs, domain,
                std::move(constant_inputs));
  if (!out.ok()) {
    ADD_FAILURE() << op << ": " << out.status();
    return {};
  }
  return *std::move(out);
}

// The status of building and running one node.
absl::Status RunStatus(const std::string& op, std::vector<Tensor> inputs,
                       std::vector<Attribute> attrs, int num_outputs = 1) {
  return RunNodeOf(op, std::move(inputs), std::move(attrs), 1, num_outputs, kCastorDomain).status();
}

// Output 0 of the forward op for `inputs` (float64 where they are float).
using Forward = std::function<Tensor(const std::vector<Tensor>&)>;

Forward OnnxForward(const std::string& op, std::vector<Attribute> attrs, int64_t opset,
                    int num_outputs = 1, std::vector<int> constant_inputs = {}) {
  return [=](const std::vector<Tensor>& inputs) {
    std::vector<Tensor> out = RunOp(op, inputs, attrs, num_outputs, "", opset, constant_inputs);
    return out.empty() ? Tensor() : out[0];
  };
}

// d/d inputs[wrt] of sum(forward(inputs) * dy) by central differences. Float
// inputs run as float64.
std::vector<double> NumericGradient(const Forward& forward, std::vector<Tensor> inputs, int wrt,
                                    const std::vector<double>& dy, double h = kStep) {
  for (Tensor& t : inputs) {
    if (t.dtype() == DType::kFloat32) t = Convert(t, DType::kFloat64);
  }
  std::vector<double> grad(static_cast<size_t>(inputs[wrt].num_elements()));
  for (size_t i = 0; i < grad.size(); ++i) {
    std::vector<Tensor> plus = inputs, minus = inputs;
    plus[wrt].data<double>()[i] += h;
    minus[wrt].data<double>()[i] -= h;
    const Tensor yp = forward(plus);
    const Tensor ym = forward(minus);
    if (yp.num_elements() != static_cast<int64_t>(dy.size()) ||
        ym.num_elements() != static_cast<int64_t>(dy.size())) {
      ADD_FAILURE() << "forward output has " << yp.num_elements() << " elements; dY has "
                    << dy.size();
      return grad;
    }
    double sum = 0;
    for (size_t j = 0; j < dy.size(); ++j) {
      sum += (yp.GetDouble(static_cast<int64_t>(j)) - ym.GetDouble(static_cast<int64_t>(j))) *
             dy[j];
    }
    grad[i] = sum / (2 * h);
  }
  return grad;
}

// The gradient `grad` (a kernel output) against finite differences over
// forward input `wrt`.
void ExpectMatchesFiniteDifference(const Tensor& grad, const Forward& forward,
                                   const std::vector<Tensor>& forward_inputs, int wrt,
                                   const std::vector<double>& dy, const std::string& what) {
  ExpectNear(NumericGradient(forward, forward_inputs, wrt, dy), grad, kRelTol, kAbsTol, what);
}

// Runs the gradient op on inputs converted to `dtype` (the indices in
// `float_inputs`; the others as given) and on the same rounded values in
// float32, and compares every output within one 16-bit rounding.
void ExpectLowPrecisionMatches(const std::string& op, const std::vector<Tensor>& inputs,
                               const std::vector<int>& float_inputs, std::vector<Attribute> attrs,
                               int num_outputs, DType dtype) {
  std::vector<Tensor> low = inputs, rounded = inputs;
  for (int i : float_inputs) {
    low[i] = Convert(inputs[i], dtype);
    rounded[i] = Convert(low[i], DType::kFloat32);
  }
  const std::vector<Tensor> expected = RunOp(op, rounded, attrs, num_outputs);
  const std::vector<Tensor> actual = RunOp(op, low, attrs, num_outputs);
  ASSERT_EQ(expected.size(), static_cast<size_t>(num_outputs)) << op;
  ASSERT_EQ(actual.size(), static_cast<size_t>(num_outputs)) << op;
  const double rtol = dtype == DType::kFloat16 ? 1.0 / 1024 : 1.0 / 128;
  for (int i = 0; i < num_outputs; ++i) {
    const std::string what = op + " " + DTypeName(dtype) + " output " + std::to_string(i);
    EXPECT_EQ(actual[i].dims(), expected[i].dims()) << what;
    ExpectNear(Values(expected[i]), actual[i], rtol, 1e-6, what);
  }
}

void ExpectLowPrecisionMatchesBoth(const std::string& op, const std::vector<Tensor>& inputs,
                                   const std::vector<int>& float_inputs,
                                   const std::vector<Attribute>& attrs, int num_outputs = 1) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    ExpectLowPrecisionMatches(op, inputs, float_inputs, attrs, num_outputs, dtype);
  }
}

// ---- registry ----------------------------------------------------------------

TEST(GradientOps, RegisteredWithCategoryAndNoSecondOrderGradient) {
  const char* follow[] = {"ConvGrad", "MaxPoolGrad",     "AveragePoolGrad", "GlobalAveragePoolGrad",
                          "ReluGrad", "GeluGrad", "ReduceToShapeOf", "GatherGrad"};
  const char* deny[] = {"BatchNormalizationGrad", "LayerNormalizationGrad", "SoftmaxGrad",
                        "LogSoftmaxGrad", "SoftmaxCrossEntropyLossGrad"};
  auto check = [](const char* op, AutocastCategory category) {
    const OpDef* def = OpRegistry::Global().Find(kCastorDomain, op);
    ASSERT_NE(def, nullptr) << op;
    EXPECT_EQ(def->autocast, category) << op;
    EXPECT_EQ(def->no_gradient_reason, "second-order gradients are not supported") << op;
    EXPECT_TRUE(Cpu().kernels().HasOp(kCastorDomain, op)) << op;
  };
  for (const char* op : follow) check(op, AutocastCategory::kFollow);
  for (const char* op : deny) check(op, AutocastCategory::kDeny);
}

// ---- ConvGrad ----------------------------------------------------------------

void CheckConvGrad(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& w_dims,
                   const std::vector<Attribute>& attrs, unsigned seed) {
  const Tensor x = RandomTensor(x_dims, seed);
  const Tensor w = RandomTensor(w_dims, seed + 1);
  const Tensor b = RandomTensor({w_dims[0]}, seed + 2);
  const Forward conv = OnnxForward("Conv", attrs, 17);
  const Tensor y = conv({Convert(x, DType::kFloat64), Convert(w, DType::kFloat64),
                         Convert(b, DType::kFloat64)});
  const Tensor dy = RandomTensor(y.dims(), seed + 3);
  const std::vector<Tensor> out = RunOp("ConvGrad", {dy, x, w}, attrs, 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].dims(), x_dims);
  EXPECT_EQ(out[1].dims(), w_dims);
  EXPECT_EQ(out[2].dims(), std::vector<int64_t>{w_dims[0]});
  const std::vector<double> dyv = Values(dy);
  ExpectMatchesFiniteDifference(out[0], conv, {x, w, b}, 0, dyv, "ConvGrad dX");
  ExpectMatchesFiniteDifference(out[1], conv, {x, w, b}, 1, dyv, "ConvGrad dW");
  ExpectMatchesFiniteDifference(out[2], conv, {x, w, b}, 2, dyv, "ConvGrad dB");
}

TEST(ConvGrad, MatchesFiniteDifferences2DGroupsStridesPadsDilations) {
  CheckConvGrad({2, 4, 5, 6}, {6, 2, 3, 3},
                {Attribute::Int("group", 2), Attribute::Ints("strides", {2, 1}),
                 Attribute::Ints("pads", {1, 0, 1, 1}), Attribute::Ints("dilations", {1, 2})},
                11);
}

TEST(ConvGrad, MatchesFiniteDifferences2DSingleImage) {
  CheckConvGrad({1, 3, 4, 4}, {2, 3, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}, 21);
}

// Pads wider than the kernel's reach: dY's zero border is cut (dY rows and
// columns no input position reaches) on the grid's dX path.
TEST(ConvGrad, MatchesFiniteDifferences2DPadsWiderThanTheKernel) {
  CheckConvGrad({2, 2, 4, 4}, {3, 2, 1, 2}, {Attribute::Ints("pads", {1, 2, 0, 1})}, 25);
}

// Few output positions per image: the images' columns side by side in one
// GEMM (1x1 images under a padded 3x3 kernel; grouped, strided down to 2x2),
// batches large enough that a slice of the test backend's 4 threads puts
// several images in one GEMM.
TEST(ConvGrad, MatchesFiniteDifferencesFewPositionsPerImage) {
  CheckConvGrad({9, 4, 1, 1}, {5, 4, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}, 27);
  CheckConvGrad({9, 4, 3, 4}, {6, 2, 3, 3},
                {Attribute::Int("group", 2), Attribute::Ints("strides", {2, 2}),
                 Attribute::Ints("pads", {1, 1, 1, 1})},
                29);
}

// The few-position columns drop the taps that read only padding while dY
// is finite (their dW is then exactly zero) and keep them when dY holds a
// NaN, whose products with the padding's zeros make those dW entries NaN.
TEST(ConvGrad, FewPositionsDeadTapsGiveZeroOrNaNAsTheirSums) {
  const std::vector<Attribute> attrs = {Attribute::Ints("pads", {1, 1, 1, 1})};
  const Tensor x = RandomTensor({6, 2, 1, 1}, 71);
  const Tensor w = RandomTensor({3, 2, 3, 3}, 72);
  for (bool nan_in_dy : {false, true}) {
    SCOPED_TRACE(nan_in_dy ? "NaN in dY" : "finite dY");
    std::vector<double> dyv = Values(RandomTensor({6, 3, 1, 1}, 73));
    if (nan_in_dy) dyv[4] = std::numeric_limits<double>::quiet_NaN();  // image 1, channel 1
    const Tensor dy = Make(DType::kFloat32, {6, 3, 1, 1}, dyv);
    const std::vector<Tensor> out = RunOp("ConvGrad", {dy, x, w}, attrs, 3);
    ASSERT_EQ(out.size(), 3u);
    const std::vector<double> dw = Values(out[1]);
    for (int64_t m = 0; m < 3; ++m) {
      for (int64_t c = 0; c < 2; ++c) {
        for (int64_t tap = 0; tap < 9; ++tap) {
          const double v = dw[(m * 2 + c) * 9 + tap];
          if (nan_in_dy && m == 1) {
            EXPECT_TRUE(std::isnan(v)) << m << "," << c << "," << tap;
          } else if (tap != 4) {
            EXPECT_EQ(v, 0.0) << m << "," << c << "," << tap;
          } else {
            EXPECT_TRUE(std::isfinite(v) && v != 0.0) << m << "," << c;
          }
        }
      }
    }
  }
}

TEST(ConvGrad, MatchesFiniteDifferences1D) {
  CheckConvGrad({3, 3, 7}, {4, 3, 3}, {Attribute::Ints("strides", {2}),
                                       Attribute::Ints("pads", {1, 1})},
                31);
}

TEST(ConvGrad, MatchesFiniteDifferences3DSameUpper) {
  CheckConvGrad({1, 2, 4, 3, 3}, {3, 2, 2, 2, 2},
                {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("strides", {2, 1, 1})},
                41);
}

// dX and dW of a 2-D Conv by direct float64 sums over every (output, kernel)
// pair, with the sums of absolute terms (the scale of float32 rounding).
struct DirectConvGrad {
  std::vector<double> dx, dx_scale, dw, dw_scale;
};
DirectConvGrad DirectConvGrad2D(const std::vector<double>& x, const std::vector<int64_t>& xd,
                                const std::vector<double>& w, const std::vector<int64_t>& wd,
                                const std::vector<double>& dy, const std::vector<int64_t>& yd,
                                int64_t group, const std::vector<int64_t>& pads,
                                const std::vector<int64_t>& dilations,
                                const std::vector<int64_t>& strides) {
  const int64_t n_images = xd[0], c_in = xd[1], h = xd[2], wi = xd[3];
  const int64_t m_out = wd[0], cg = wd[1], kh_n = wd[2], kw_n = wd[3];
  const int64_t oh_n = yd[2], ow_n = yd[3], mg = m_out / group;
  DirectConvGrad r;
  r.dx.assign(x.size(), 0.0);
  r.dx_scale.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  r.dw_scale.assign(w.size(), 0.0);
  for (int64_t n = 0; n < n_images; ++n) {
    for (int64_t m = 0; m < m_out; ++m) {
      for (int64_t c = 0; c < cg; ++c) {
        const int64_t ci = m / mg * cg + c;
        for (int64_t kh = 0; kh < kh_n; ++kh) {
          for (int64_t kw = 0; kw < kw_n; ++kw) {
            const int64_t wk = ((m * cg + c) * kh_n + kh) * kw_n + kw;
            for (int64_t oh = 0; oh < oh_n; ++oh) {
              const int64_t ih = oh * strides[0] - pads[0] + kh * dilations[0];
              if (ih < 0 || ih >= h) continue;
              for (int64_t ow = 0; ow < ow_n; ++ow) {
                const int64_t iw = ow * strides[1] - pads[1] + kw * dilations[1];
                if (iw < 0 || iw >= wi) continue;
                const int64_t xi = ((n * c_in + ci) * h + ih) * wi + iw;
                const double g = dy[((n * m_out + m) * oh_n + oh) * ow_n + ow];
                r.dx[xi] += w[wk] * g;
                r.dx_scale[xi] += std::abs(w[wk] * g);
                r.dw[wk] += x[xi] * g;
                r.dw_scale[wk] += std::abs(x[xi] * g);
              }
            }
          }
        }
      }
    }
  }
  return r;
}

// 2-D convs take the padded-grid path (backend/cpu/im2col.h's PaddedGrid,
// grid_conv.h's products; dX per stride phase): images large enough for
// several vectors per line, with groups, dilations and uneven pads (also
// wider than the kernel's reach), and strides whose phases some taps never
// reach, against direct sums. On the test backend's 4 threads, batch 3 runs
// images in parallel slices and batch 1 one image with the products split
// across threads.
struct GridConvGradCase {
  std::vector<int64_t> xd, wd, pads, dilations, strides;
  int64_t group;
};

void CheckConvGradAgainstDirectSums(const GridConvGradCase& c, int64_t batch, unsigned seed) {
  std::vector<int64_t> xd = c.xd;
  xd[0] = batch;
  std::vector<int64_t> yd = {batch, c.wd[0], 0, 0};
  for (int d = 0; d < 2; ++d) {
    const int64_t reach = (c.wd[2 + d] - 1) * c.dilations[d] + 1;
    yd[2 + d] = (xd[2 + d] + c.pads[d] + c.pads[2 + d] - reach) / c.strides[d] + 1;
  }
  SCOPED_TRACE(::testing::Message() << "X " << ::testing::PrintToString(xd) << " W "
                                    << ::testing::PrintToString(c.wd) << " strides "
                                    << ::testing::PrintToString(c.strides) << " pads "
                                    << ::testing::PrintToString(c.pads) << " dilations "
                                    << ::testing::PrintToString(c.dilations));
  const std::vector<Attribute> attrs = {
      Attribute::Int("group", c.group), Attribute::Ints("pads", c.pads),
      Attribute::Ints("dilations", c.dilations), Attribute::Ints("strides", c.strides)};
  const Tensor x = RandomTensor(xd, seed);
  const Tensor w = RandomTensor(c.wd, seed + 1);
  const Tensor dy = RandomTensor(yd, seed + 2);
  // dX where a stride phase gets no tap is zeroed, not computed: every
  // element must still be written.
  testing::PoisonFreedMemory(DType::kFloat32, xd);
  const std::vector<Tensor> out = RunOp("ConvGrad", {dy, x, w}, attrs, 2);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].dims(), xd);
  ASSERT_EQ(out[1].dims(), c.wd);
  const DirectConvGrad want =
      DirectConvGrad2D(Values(x), xd, Values(w), c.wd, Values(dy), yd, c.group,
                       {c.pads[0], c.pads[1]}, c.dilations, c.strides);
  const std::vector<double> dx = Values(out[0]), dw = Values(out[1]);
  int dx_bad = 0, dw_bad = 0;
  for (size_t i = 0; i < dx.size(); ++i) {
    if (std::abs(dx[i] - want.dx[i]) > 1e-6 * (want.dx_scale[i] + 1) && ++dx_bad <= 5) {
      ADD_FAILURE() << "dX[" << i << "] = " << dx[i] << ", direct sum " << want.dx[i];
    }
  }
  for (size_t i = 0; i < dw.size(); ++i) {
    if (std::abs(dw[i] - want.dw[i]) > 1e-6 * (want.dw_scale[i] + 1) && ++dw_bad <= 5) {
      ADD_FAILURE() << "dW[" << i << "] = " << dw[i] << ", direct sum " << want.dw[i];
    }
  }
  EXPECT_EQ(dx_bad, 0);
  EXPECT_EQ(dw_bad, 0);
}

TEST(ConvGrad, GridPathMatchesDirectSums) {
  const GridConvGradCase cases[] = {
      // unit strides: grouped, dilated, uneven pads
      {{0, 32, 23, 61}, {8, 16, 3, 3}, {2, 1, 1, 0}, {2, 1}, {1, 1}, 2},
      // pads wider than the kernel's reach
      {{0, 3, 9, 21}, {4, 3, 2, 3}, {3, 1, 2, 4}, {1, 1}, {1, 1}, 1},
      // stride 2 both ways (dX spread from a scratch), the resnet shape
      {{0, 16, 28, 28}, {32, 16, 3, 3}, {1, 1, 1, 1}, {1, 1}, {2, 2}, 1},
      // 1x1 stride 2: three of four phases get no tap (zeros)
      {{0, 16, 14, 14}, {32, 16, 1, 1}, {0, 0, 0, 0}, {1, 1}, {2, 2}, 1},
      // stride 2 rows only (dX written in place), dilation 2: odd rows get no tap
      {{0, 6, 17, 19}, {4, 3, 3, 2}, {2, 0, 1, 1}, {2, 1}, {2, 1}, 2},
      // stride 3 with a 2-wide kernel: phase 2 gets no tap; uneven pads
      {{0, 4, 13, 20}, {5, 4, 2, 2}, {0, 1, 2, 0}, {1, 1}, {3, 3}, 1},
      // groups with strides both ways (each group's W per phase, spread)
      {{0, 4, 11, 13}, {6, 2, 3, 3}, {1, 1, 1, 1}, {1, 1}, {2, 2}, 2},
  };
  // Every instruction set of the grid products; the portable one means the
  // column path (grid_conv.h's UseGridProducts).
  for (cpu::GridIsa isa : {cpu::GridIsa::kPortable, cpu::GridIsa::kAvx2, cpu::GridIsa::kAvx512}) {
    if (!cpu::GridIsaSupported(isa)) continue;
    const cpu::GridIsa isa_before = cpu::SetGridIsaForTesting(isa);
    SCOPED_TRACE(cpu::GridIsaName(isa));
    unsigned seed = 61;
    for (const GridConvGradCase& c : cases) {
      CheckConvGradAgainstDirectSums(c, 3, seed);
      CheckConvGradAgainstDirectSums(c, 1, seed + 3);
      seed += 7;
    }
    cpu::SetGridIsaForTesting(isa_before);
  }
}

// X = [1, 2, inf], W = [w0, w1] (1x2, unit stride): dW[0] = x0 dy0 + x1 dy1
// is finite; only dW[1] sees the inf. The grid's extra position after each
// line reads the inf under kernel column 0 and must not reach dW[0].
TEST(ConvGrad, AnInfOnlyTheGridsExtraPositionsReadStaysOut) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Tensor> out = RunOp(
      "ConvGrad",
      {Make(DType::kFloat32, {1, 1, 1, 2}, {3, 5}), Make(DType::kFloat32, {1, 1, 1, 3}, {1, 2, inf}),
       Make(DType::kFloat32, {1, 1, 1, 2}, {7, 11})},
      {}, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values(out[0]), (std::vector<double>{21, 7 * 5 + 11 * 3, 11 * 5}));
  const std::vector<double> dw = Values(out[1]);
  ASSERT_EQ(dw.size(), 2u);
  EXPECT_EQ(dw[0], 1 * 3 + 2 * 5);
  EXPECT_EQ(dw[1], inf);
}

TEST(ConvGrad, OnlyRequestedOutputs) {
  const Tensor x = RandomTensor({2, 2, 4, 4}, 51);
  const Tensor w = RandomTensor({3, 2, 3, 3}, 52);
  const Tensor dy = RandomTensor({2, 3, 2, 2}, 53);
  const std::vector<Tensor> all = RunOp("ConvGrad", {dy, x, w}, {}, 3);
  const std::vector<Tensor> dx_only = RunOp("ConvGrad", {dy, x, w}, {}, 1);
  ASSERT_EQ(all.size(), 3u);
  ASSERT_EQ(dx_only.size(), 1u);
  EXPECT_EQ(Values(dx_only[0]), Values(all[0]));
}

// The autodiff emits all three outputs of ConvGrad; dX of an input image
// has no reader (KernelContext::output_read), so the kernel leaves it out
// and computes the same dW and dB.
TEST(ConvGrad, SkipsAnOutputNothingReads) {
  std::vector<Tensor> inputs = {RandomTensor({2, 3, 2, 2}, 53), RandomTensor({2, 2, 4, 4}, 51),
                                RandomTensor({3, 2, 3, 3}, 52)};
  const std::vector<Tensor> all = RunOp("ConvGrad", inputs, {}, 3);
  ASSERT_EQ(all.size(), 3u);
  testing::SingleNode node("ConvGrad", inputs, {}, 1, 3, kCastorDomain);
  ASSERT_TRUE(node.status().ok()) << node.status();
  Graph& graph = *node.model().graph;
  graph.ClearOutputs();
  graph.AddOutput(node.node().output(1));
  graph.AddOutput(node.node().output(2));
  std::vector<TensorView> views;
  for (Tensor& t : inputs) views.push_back({t.raw(), t.dtype(), t.dims()});
  std::vector<const TensorView*> pointers;
  for (const TensorView& v : views) pointers.push_back(&v);
  absl::StatusOr<const KernelDef*> kernel = Cpu().kernels().Find(node.node());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  testing::HostOutputAllocator allocator;
  KernelContext ctx(node.node(), 1, Cpu(), pointers, allocator);
  EXPECT_FALSE(ctx.output_read(0));
  EXPECT_TRUE(ctx.output_read(1));
  {  // an output the caller keeps (the executor's keep_values) counts as read
    KernelContext kept(node.node(), 1, Cpu(), pointers, allocator);
    kept.SetKeptOutputs({true, false, false});
    EXPECT_TRUE(kept.output_read(0));
  }
  ASSERT_TRUE((*kernel)->run(ctx).ok());
  EXPECT_FALSE(allocator.allocated(0));
  ASSERT_TRUE(allocator.allocated(1));
  ASSERT_TRUE(allocator.allocated(2));
  for (int k = 1; k <= 2; ++k) {
    const std::vector<double> want = Values(all[k]);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(allocator.floats(k)[i], want[i]) << "output " << k << " element " << i;
    }
  }
}

TEST(ConvGrad, Float16AndBFloat16MatchFloat32) {
  const Tensor x = RandomTensor({2, 4, 6, 6}, 61);
  const Tensor w = RandomTensor({4, 2, 3, 3}, 62);
  const Tensor dy = RandomTensor({2, 4, 3, 3}, 63);
  ExpectLowPrecisionMatchesBoth(
      "ConvGrad", {dy, x, w}, {0, 1, 2},
      {Attribute::Int("group", 2), Attribute::Ints("strides", {2, 2}),
       Attribute::Ints("pads", {1, 1, 0, 0})},
      3);
}

// ---- pools -------------------------------------------------------------------

// Distinct values 0.01 apart (more than 2h), shuffled: no ties, no kinks.
Tensor DistinctTensor(const std::vector<int64_t>& dims, unsigned seed) {
  std::vector<double> v(static_cast<size_t>(Count(dims)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(0.01 * (i - v.size() / 2.0));
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return Make(DType::kFloat32, dims, v);
}

void CheckPoolGrad(const std::string& forward_op, const Tensor& x,
                   const std::vector<Attribute>& attrs, int64_t opset, unsigned seed) {
  const Forward pool = OnnxForward(forward_op, attrs, opset);
  const Tensor y = pool({Convert(x, DType::kFloat64)});
  const Tensor dy = RandomTensor(y.dims(), seed);
  const std::vector<Tensor> out = RunOp(forward_op + "Grad", {dy, x}, attrs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), x.dims());
  ExpectMatchesFiniteDifference(out[0], pool, {x}, 0, Values(dy), forward_op + "Grad dX");
}

TEST(MaxPoolGrad, MatchesFiniteDifferencesOverlappingPadded) {
  CheckPoolGrad("MaxPool", DistinctTensor({2, 2, 5, 5}, 71),
                {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 1}),
                 Attribute::Ints("pads", {1, 1, 1, 1})},
                17, 72);
}

TEST(MaxPoolGrad, MatchesFiniteDifferencesCeilModeDilations1DAnd3D) {
  CheckPoolGrad("MaxPool", DistinctTensor({1, 3, 6, 7}, 73),
                {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("strides", {2, 2}),
                 Attribute::Ints("dilations", {2, 1}), Attribute::Int("ceil_mode", 1)},
                17, 74);
  CheckPoolGrad("MaxPool", DistinctTensor({2, 2, 9}, 75),
                {Attribute::Ints("kernel_shape", {3}), Attribute::String("auto_pad", "SAME_UPPER")},
                17, 76);
  CheckPoolGrad("MaxPool", DistinctTensor({1, 2, 3, 4, 4}, 77),
                {Attribute::Ints("kernel_shape", {2, 2, 2}), Attribute::Ints("strides", {1, 2, 1})},
                17, 78);
}

TEST(MaxPoolGrad, TiesGoToTheFirstMaximumAndOverlapsAccumulate) {
  // X = [[0, 0, 0], [0, 0, 0]], 2x2 windows at columns 0 and 1: each window's
  // gradient goes to its first (top-left) element.
  const Tensor zeros = Make(DType::kFloat32, {1, 1, 2, 3}, {0, 0, 0, 0, 0, 0});
  const std::vector<Tensor> tie =
      RunOp("MaxPoolGrad", {Make(DType::kFloat32, {1, 1, 1, 2}, {1, 2}), zeros},
          {Attribute::Ints("kernel_shape", {2, 2})});
  ASSERT_EQ(tie.size(), 1u);
  EXPECT_EQ(Values(tie[0]), (std::vector<double>{1, 2, 0, 0, 0, 0}));
  // X = [1, 5, 5, 2], windows of 2 with stride 1: window 0 and 1 both pick
  // index 1 (the first 5), window 2 picks index 2.
  const std::vector<Tensor> overlap =
      RunOp("MaxPoolGrad",
          {Make(DType::kFloat32, {1, 1, 3}, {1, 10, 100}),
           Make(DType::kFloat32, {1, 1, 4}, {1, 5, 5, 2})},
          {Attribute::Ints("kernel_shape", {2})});
  ASSERT_EQ(overlap.size(), 1u);
  EXPECT_EQ(Values(overlap[0]), (std::vector<double>{0, 11, 100, 0}));
}

TEST(MaxPoolGrad, NaNWinsOverNumbersAndTheFirstNaNWins) {
  // 2-D (its own loop) and 1-D (the generic window walk) pick the same.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Tensor> two_d =
      RunOp("MaxPoolGrad",
            {Make(DType::kFloat32, {1, 1, 1, 2}, {1, 2}),
             Make(DType::kFloat32, {1, 1, 2, 3}, {1, nan, 9, 3, nan, 2})},
            {Attribute::Ints("kernel_shape", {2, 2})});
  ASSERT_EQ(two_d.size(), 1u);
  EXPECT_EQ(Values(two_d[0]), (std::vector<double>{0, 3, 0, 0, 0, 0}));
  const std::vector<Tensor> one_d =
      RunOp("MaxPoolGrad",
            {Make(DType::kFloat32, {1, 1, 2}, {1, 2}),
             Make(DType::kFloat32, {1, 1, 4}, {5, nan, 7, nan})},
            {Attribute::Ints("kernel_shape", {3})});
  ASSERT_EQ(one_d.size(), 1u);
  EXPECT_EQ(Values(one_d[0]), (std::vector<double>{0, 3, 0, 0}));
}

// 2x2 windows at stride 2 (each input in at most one window: their own
// loop, 16 windows at a time on AVX-512 where the CPU has it, else
// branch-free scalar code: both are run) against the rule written out: dY
// goes to the window's first maximum in row-major order, a NaN winning over
// numbers and the first NaN over later ones; positions in no window (the
// odd last row and column here) get 0. Values from {0, 1, 2, NaN} make ties
// and NaNs common; rows of 4, 20 and 32 windows leave partial and whole
// vectors.
TEST(MaxPoolGrad, DisjointTwoByTwoWindowsFollowTheFirstMaximumRule) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const bool fused : {true, false}) {
    if (fused && !cpu::HasSimd16()) {
      std::cout << "no AVX-512 here: the 16-window rows are not tested\n";
      continue;
    }
    for (const int64_t in_w : {9, 41, 64}) {
      SCOPED_TRACE(::testing::Message() << (fused ? "AVX-512 rows" : "scalar rows") << ", width "
                                        << in_w);
      const cpu::ScopedFusedSimd16ForTesting scoped_fused(fused);
      const int64_t planes = 6, in_h = 7, out_h = 3, out_w = in_w / 2;
      std::mt19937 rng(91 + static_cast<unsigned>(in_w));
      std::vector<double> x(static_cast<size_t>(planes * in_h * in_w));
      for (double& v : x) {
        const int pick = static_cast<int>(rng() % 4);
        v = pick == 3 ? nan : pick;
      }
      const Tensor dy = RandomTensor({2, 3, out_h, out_w}, 92);
      const std::vector<double> dy_values = Values(dy);
      // The kernel writes every dX element itself (its output is not zeroed
      // first): a same-sized output freed just before the run leaves 7s in
      // the memory the allocator is likely to hand out next, which must not
      // show through. (The inputs are made first, so they do not take that
      // memory.)
      std::vector<Tensor> inputs;
      inputs.push_back(dy);
      inputs.push_back(Make(DType::kFloat32, {2, 3, in_h, in_w}, x));
      {
        const std::vector<double> sevens(x.size(), 7.0);
        const std::vector<Tensor> poison = RunOp(
            "Identity", {Make(DType::kFloat32, {2, 3, in_h, in_w}, sevens)}, {}, 1, "", 17);
        ASSERT_EQ(poison.size(), 1u);
        ASSERT_EQ(Values(poison[0]), sevens);
      }
      const std::vector<Tensor> out =
          RunOp("MaxPoolGrad", std::move(inputs),
                {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("strides", {2, 2})});
      ASSERT_EQ(out.size(), 1u);
      std::vector<double> want(x.size(), 0.0);
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t oh = 0; oh < out_h; ++oh) {
          for (int64_t ow = 0; ow < out_w; ++ow) {
            int64_t best = -1;
            for (int64_t kh = 0; kh < 2; ++kh) {
              for (int64_t kw = 0; kw < 2; ++kw) {
                const int64_t at = (p * in_h + 2 * oh + kh) * in_w + 2 * ow + kw;
                if (best < 0 || x[at] > x[best] ||
                    (std::isnan(x[at]) && !std::isnan(x[best]))) {
                  best = at;
                }
              }
            }
            want[best] = dy_values[(p * out_h + oh) * out_w + ow];
          }
        }
      }
      EXPECT_EQ(Values(out[0]), want);
    }
  }
}

TEST(MaxPoolGrad, Float16AndBFloat16MatchFloat32) {
  ExpectLowPrecisionMatchesBoth(
      "MaxPoolGrad", {RandomTensor({2, 3, 3, 3}, 81), DistinctTensor({2, 3, 6, 6}, 82)}, {0, 1},
      {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
       Attribute::Ints("pads", {1, 1, 1, 1})});
  ExpectLowPrecisionMatchesBoth(  // disjoint 2x2 windows: their own loop
      "MaxPoolGrad", {RandomTensor({2, 3, 3, 3}, 83), DistinctTensor({2, 3, 6, 7}, 84)}, {0, 1},
      {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("strides", {2, 2})});
}

TEST(AveragePoolGrad, MatchesFiniteDifferences) {
  const std::vector<Attribute> base = {Attribute::Ints("kernel_shape", {3, 2}),
                                       Attribute::Ints("strides", {2, 2}),
                                       Attribute::Ints("pads", {1, 0, 1, 1})};
  for (int include_pad : {0, 1}) {
    for (int ceil_mode : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "count_include_pad " << include_pad << " ceil_mode "
                                      << ceil_mode);
      std::vector<Attribute> attrs = base;
      attrs.push_back(Attribute::Int("count_include_pad", include_pad));
      attrs.push_back(Attribute::Int("ceil_mode", ceil_mode));
      CheckPoolGrad("AveragePool", RandomTensor({2, 2, 6, 5}, 91), attrs, 17, 92);
    }
  }
  CheckPoolGrad("AveragePool", RandomTensor({2, 3, 7}, 93),
                {Attribute::Ints("kernel_shape", {3}), Attribute::String("auto_pad", "SAME_LOWER"),
                 Attribute::Ints("strides", {2})},
                17, 94);
  CheckPoolGrad("AveragePool", RandomTensor({1, 2, 5, 5}, 95),
                {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("dilations", {2, 2})},
                19, 96);
}

TEST(AveragePoolGrad, Float16AndBFloat16MatchFloat32) {
  ExpectLowPrecisionMatchesBoth(
      "AveragePoolGrad", {RandomTensor({2, 3, 3, 3}, 101), RandomTensor({2, 3, 6, 6}, 102)},
      {0, 1},
      {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
       Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Int("count_include_pad", 1)});
}

TEST(GlobalAveragePoolGrad, MatchesFiniteDifferences) {
  CheckPoolGrad("GlobalAveragePool", RandomTensor({2, 3, 4, 5}, 111), {}, 17, 112);
  CheckPoolGrad("GlobalAveragePool", RandomTensor({3, 2, 5}, 113), {}, 17, 114);
}

TEST(GlobalAveragePoolGrad, Float16AndBFloat16MatchFloat32) {
  ExpectLowPrecisionMatchesBoth("GlobalAveragePoolGrad",
                                {RandomTensor({2, 3, 1, 1}, 121), RandomTensor({2, 3, 5, 3}, 122)},
                                {0, 1}, {});
}

// ---- normalisation -------------------------------------------------------------

TEST(BatchNormalizationGrad, MatchesFiniteDifferences) {
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{4, 3, 2, 3}, std::vector<int64_t>{6, 4}}) {
    const int64_t c = dims[1];
    const Tensor x = RandomTensor(dims, 131, -2.0, 2.0);
    const Tensor scale = RandomTensor({c}, 132, 0.5, 1.5);
    const Tensor bias = RandomTensor({c}, 133);
    const Tensor mean = RandomTensor({c}, 134);
    const Tensor var = RandomTensor({c}, 135, 0.5, 1.5);
    const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-3f)};
    std::vector<Attribute> forward_attrs = attrs;
    forward_attrs.push_back(Attribute::Int("training_mode", 1));
    const Forward bn = OnnxForward("BatchNormalization", forward_attrs, 15, 3);
    const Tensor dy = RandomTensor(dims, 136);
    const std::vector<Tensor> out = RunOp("BatchNormalizationGrad", {dy, x, scale}, attrs, 3);
    ASSERT_EQ(out.size(), 3u);
    const std::vector<Tensor> inputs = {x, scale, bias, mean, var};
    ExpectMatchesFiniteDifference(out[0], bn, inputs, 0, Values(dy), "BN dX");
    ExpectMatchesFiniteDifference(out[1], bn, inputs, 1, Values(dy), "BN dScale");
    ExpectMatchesFiniteDifference(out[2], bn, inputs, 2, Values(dy), "BN dBias");
  }
}

TEST(BatchNormalizationGrad, Float16AndBFloat16ActivationsWithFloat32Parameters) {
  const Tensor x = RandomTensor({4, 3, 2, 2}, 141, -2.0, 2.0);
  const Tensor dy = RandomTensor({4, 3, 2, 2}, 142);
  const Tensor scale = RandomTensor({3}, 143, 0.5, 1.5);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const std::vector<Tensor> out =
        RunOp("BatchNormalizationGrad", {Convert(dy, dtype), Convert(x, dtype), scale}, {}, 3);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0].dtype(), dtype);
    EXPECT_EQ(out[1].dtype(), DType::kFloat32);
    EXPECT_EQ(out[2].dtype(), DType::kFloat32);
  }
  ExpectLowPrecisionMatchesBoth("BatchNormalizationGrad", {dy, x, scale}, {0, 1}, {}, 3);
}

// The training graph hands BatchNormalizationTraining's batch mean (its
// output 3) to the gradient, which then skips its own pass over X for it:
// the gradients are the bits of the recomputing form, for float32 and
// 16-bit X and runs longer than the kernels' 32 float32 lanes, and the
// mean given is the one used (a shifted one changes dX).
TEST(BatchNormalizationGrad, ForwardBatchMeanGivesTheRecomputedBits) {
  const std::vector<int64_t> dims = {5, 3, 7, 11};
  const Tensor scale = RandomTensor({3}, 161, 0.5, 1.5);
  const Tensor bias = RandomTensor({3}, 162);
  const Tensor running_mean = RandomTensor({3}, 163);
  const Tensor running_var = RandomTensor({3}, 164, 0.5, 1.5);
  const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-3f)};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor x = Convert(RandomTensor(dims, 165, -2.0, 3.0), dtype);
    const Tensor dy = Convert(RandomTensor(dims, 166), dtype);
    const std::vector<Tensor> forward =
        RunOp("BatchNormalizationTraining", {x, scale, bias, running_mean, running_var}, attrs, 4);
    ASSERT_EQ(forward.size(), 4u);
    const Tensor& batch_mean = forward[3];
    ASSERT_EQ(batch_mean.dtype(), DType::kFloat32);
    for (int64_t c = 0; c < 3; ++c) {
      double sum = 0;
      for (int64_t n = 0; n < 5; ++n) {
        for (int64_t i = 0; i < 77; ++i) sum += x.GetDouble((n * 3 + c) * 77 + i);
      }
      EXPECT_NEAR(batch_mean.GetDouble(c), sum / 385, 1e-6) << c;
    }
    const std::vector<Tensor> recomputed =
        RunOp("BatchNormalizationGrad", {dy, x, scale}, attrs, 3);
    const std::vector<Tensor> given =
        RunOp("BatchNormalizationGrad", {dy, x, scale, batch_mean}, attrs, 3);
    ASSERT_EQ(recomputed.size(), 3u);
    ASSERT_EQ(given.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(SameBits(given[i], recomputed[i])) << "output " << i;
    std::vector<double> shifted = Values(batch_mean);
    shifted[1] += 0.25;
    const std::vector<Tensor> off = RunOp(
        "BatchNormalizationGrad", {dy, x, scale, Make(DType::kFloat32, {3}, shifted)}, attrs, 1);
    ASSERT_EQ(off.size(), 1u);
    EXPECT_FALSE(SameBits(off[0], recomputed[0]));
  }
}

// relu_output (input 4: the output of a Relu fused after the
// BatchNormalization) applies ReluGrad's select to dY as the kernel reads
// it: the bits of ReluGrad(dY, relu_output) fed to the plain gradient, with
// and without the forward's mean, where relu_output holds zeros of both
// signs, NaN, Inf and positives at the bottom of each dtype's range.
TEST(BatchNormalizationGrad, FusedReluOutputGivesReluGradsBits) {
  const std::vector<int64_t> dims = {4, 3, 5, 9};
  const int64_t count = Count(dims);
  const Tensor scale = RandomTensor({3}, 171, 0.5, 1.5);
  const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-3f)};
  std::vector<double> relu_values = Random(count, 172);
  const double specials[] = {0.0, -0.0, std::nan(""), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(), 1e-40, 1e-7, -1e-40};
  for (int64_t i = 0; i < count; i += 7) relu_values[i] = specials[(i / 7) % std::size(specials)];
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor x = Convert(RandomTensor(dims, 173, -2.0, 3.0), dtype);
    const Tensor dy = Convert(RandomTensor(dims, 174), dtype);
    const Tensor relu_output = Make(dtype, dims, relu_values);
    const Tensor masked = RunOp("ReluGrad", {dy, relu_output}, {})[0];
    ASSERT_EQ(masked.dtype(), dtype);
    std::vector<double> mean(3, 0.0);
    for (int64_t i = 0; i < count; ++i) mean[(i / 45) % 3] += x.GetDouble(i) / 180;
    const Tensor mean_f = Make(DType::kFloat32, {3}, mean);
    for (bool with_mean : {false, true}) {
      SCOPED_TRACE(with_mean ? "mean given" : "mean recomputed");
      const Tensor mean_in = with_mean ? mean_f : Tensor();
      const std::vector<Tensor> unfused =
          RunOp("BatchNormalizationGrad", {masked, x, scale, mean_in}, attrs, 3);
      const std::vector<Tensor> fused =
          RunOp("BatchNormalizationGrad", {dy, x, scale, mean_in, relu_output}, attrs, 3);
      ASSERT_EQ(unfused.size(), 3u);
      ASSERT_EQ(fused.size(), 3u);
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(SameBits(fused[i], unfused[i])) << "output " << i;
      // The mask matters: the plain gradient of dY differs.
      const std::vector<Tensor> plain =
          RunOp("BatchNormalizationGrad", {dy, x, scale, mean_in}, attrs, 1);
      ASSERT_EQ(plain.size(), 1u);
      EXPECT_FALSE(SameBits(plain[0], unfused[0]));
    }
  }
}

// BatchNormalization's training loops (batch_norm_loops.h) in AVX-512
// registers give the bits of their portable loops (GCC's vector clones) on
// bfloat16 channels (float32 and float16 ones take the clones either way),
// dY bfloat16 or float32: every loop, runs that end anywhere in or past the
// 32 sum lanes and the 32-value steps (one to 100 values), the fused Relu's
// mask, and values that are NaN, infinite, subnormal, signed zeros or
// overflow in a * x + b. A vector loop that multiplied and added in one FMA
// fails it, as does a Relu mask that passes zeros.
TEST(BatchNormLoops, VectorRunsGiveThePortableBits) {
  if (!cpu::HasSimd16()) GTEST_SKIP() << "this CPU has no AVX-512 (F/BW/VL): no vector runs";
  const float specials[] = {0.0f, -0.0f, std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 1e-40f, -3e-39f, 3e38f,
                            1e-45f, 1.1754944e-38f};
  const int64_t batch = 3, channels = 2;
  const DType dtype = DType::kBFloat16;
  const size_t bytes = DTypeSize(dtype);
  for (int64_t inner : {1, 5, 16, 31, 32, 33, 47, 48, 51, 64, 100}) {
    for (bool with_specials : {false, true}) {
      SCOPED_TRACE(absl::StrCat("inner ", inner, with_specials ? " with specials" : ""));
      const int64_t count = batch * channels * inner;
      auto tensor = [&](unsigned seed, int64_t every) {
        std::vector<double> v = Random(count, seed, -2.0, 3.0);
        for (int64_t i = 0; with_specials && i < count; i += every) {
          v[i] = specials[(i / every + seed) % std::size(specials)];
        }
        return Make(dtype, {batch, channels, inner}, v);
      };
      const Tensor x = tensor(301, 7), dy = tensor(302, 5), relu_output = tensor(303, 3);
      // A float32 dY beside bfloat16 X: the loops read each in its own dtype.
      const Tensor dy_float32 = Make(DType::kFloat32, dy.dims(), Values(dy));
      // Channel 1 of [batch, channels, inner].
      auto runs = [&](const Tensor& t) {
        return cpu::ChannelRuns{
            t.dtype(), reinterpret_cast<const char*>(t.raw()) + inner * DTypeSize(t.dtype()),
            batch, channels * inner, inner};
      };
      const cpu::ChannelRuns no_relu{dtype, nullptr, batch, channels * inner, inner};
      struct Results {
        std::vector<double> sums;
        std::vector<Tensor> outputs;
      };
      auto run_loops = [&](bool vector) {
        const cpu::ScopedFusedSimd16ForTesting fused(vector);
        Results r;
        r.sums.push_back(cpu::ChannelSum(runs(x)));
        r.sums.push_back(cpu::ChannelSquaredDeviations(runs(x), 0.375));
        for (const cpu::ChannelRuns& relu : {no_relu, runs(relu_output)}) {
          for (const Tensor* gradient : {&dy, &dy_float32}) {
            for (double s : cpu::ChannelGradientSums(runs(x), runs(*gradient), relu, 0.375)) {
              r.sums.push_back(s);
            }
            Tensor dx = Make(dtype, {batch, channels, inner}, std::vector<double>(count, 0.0));
            cpu::ChannelInputGradient(
                runs(x), runs(*gradient), relu, {1.25f, 0.375f, 0.75f, -0.125f, 0.5f},
                cpu::ChannelOut{dtype, reinterpret_cast<char*>(dx.raw()) + inner * bytes});
            r.outputs.push_back(std::move(dx));
          }
        }
        for (bool relu : {false, true}) {
          // The second pair makes subnormal products of the values near 1.
          for (auto [a, b] : {std::pair{1.5f, -0.25f}, std::pair{1e-38f, 0.0f}}) {
            Tensor y = Make(dtype, {batch, channels, inner}, std::vector<double>(count, 0.0));
            cpu::ChannelScaleShift(
                runs(x), a, b,
                cpu::ChannelOut{dtype, reinterpret_cast<char*>(y.raw()) + inner * bytes}, relu);
            r.outputs.push_back(std::move(y));
          }
        }
        return r;
      };
      const Results vector = run_loops(true), portable = run_loops(false);
      ASSERT_EQ(vector.sums.size(), portable.sums.size());
      for (size_t i = 0; i < vector.sums.size(); ++i) {
        uint64_t a, b;
        std::memcpy(&a, &vector.sums[i], 8);
        std::memcpy(&b, &portable.sums[i], 8);
        EXPECT_EQ(a, b) << "sum " << i << ": " << vector.sums[i] << " vs " << portable.sums[i];
      }
      ASSERT_EQ(vector.outputs.size(), portable.outputs.size());
      for (size_t i = 0; i < vector.outputs.size(); ++i) {
        EXPECT_TRUE(SameBits(vector.outputs[i], portable.outputs[i])) << "output " << i;
      }
    }
  }
}

// --sync-batchnorm's gradient (a backend with a cross-rank sum), here on a
// world of two ranks holding the same batch (the sum doubles every value):
// the global statistics are this batch's, so every output keeps the bits
// of the one-process gradient. Given the forward's mean (already the
// global one), the kernel skips its own mean and that sum: one sum of 3C
// + 1 values (the count with the gradient sums) instead of C + 1 and 3C.
TEST(BatchNormalizationGrad, SyncedGradientTakesTheForwardsGlobalMean) {
  const std::vector<int64_t> dims = {4, 3, 5, 7};
  CpuBackend synced(CpuBackendOptions{2});
  std::vector<size_t> sums;
  synced.set_cross_rank_sum([&](double* values, size_t count, const std::string&) {
    sums.push_back(count);
    for (size_t i = 0; i < count; ++i) values[i] *= 2;
    return absl::OkStatus();
  });
  const Tensor scale = RandomTensor({3}, 181, 0.5, 1.5);
  const Tensor bias = RandomTensor({3}, 182);
  const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-3f)};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor x = Convert(RandomTensor(dims, 183, -2.0, 3.0), dtype);
    const Tensor dy = Convert(RandomTensor(dims, 184), dtype);
    const std::vector<Tensor> forward =
        RunOp("BatchNormalizationTraining",
              {x, scale, bias, RandomTensor({3}, 185), RandomTensor({3}, 186, 0.5, 1.5)},
              {Attribute::Float("epsilon", 1e-3f), Attribute::Int("relu", 1)}, 4);
    ASSERT_EQ(forward.size(), 4u);
    const Tensor& relu_output = forward[0];
    const Tensor& mean = forward[3];
    for (bool relu : {false, true}) {
      SCOPED_TRACE(relu ? "with a fused Relu's output" : "plain");
      const Tensor relu_in = relu ? relu_output : Tensor();
      const std::vector<Tensor> one =
          RunOp("BatchNormalizationGrad", {dy, x, scale, Tensor(), relu_in}, attrs, 3);
      ASSERT_EQ(one.size(), 3u);
      for (bool given_mean : {false, true}) {
        SCOPED_TRACE(given_mean ? "the forward's mean" : "the mean summed across ranks");
        sums.clear();
        testing::SingleNode node("BatchNormalizationGrad",
                        {dy, x, scale, given_mean ? mean : Tensor(), relu_in}, attrs, 1, 3,
                        kCastorDomain);
        absl::StatusOr<std::vector<Tensor>> out = node.Run(synced);
        ASSERT_TRUE(out.ok()) << out.status();
        ASSERT_EQ(out->size(), 3u);
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(SameBits((*out)[i], one[i])) << "output " << i;
        const std::vector<size_t> expected_sums =
            given_mean ? std::vector<size_t>{10} : std::vector<size_t>{4, 9};
        EXPECT_EQ(sums, expected_sums);
      }
    }
  }
}


TEST(LayerNormalizationGrad, MatchesFiniteDifferences) {
  const std::vector<int64_t> dims = {3, 4, 5};
  // axis 1 twice: a [4, 5] scale (one element per position, the dense
  // path) and a [5] scale broadcast over the 4 (the indexed path).
  for (const auto& [axis, broadcast_scale] :
       std::vector<std::pair<int64_t, bool>>{{-1, false}, {1, false}, {1, true}}) {
    SCOPED_TRACE(::testing::Message() << "axis " << axis << (broadcast_scale ? " [5] scale" : ""));
    const std::vector<int64_t> norm_dims =
        axis == -1 || broadcast_scale ? std::vector<int64_t>{5} : std::vector<int64_t>{4, 5};
    const Tensor x = RandomTensor(dims, 151, -2.0, 2.0);
    const Tensor scale = RandomTensor(norm_dims, 152, 0.5, 1.5);
    const Tensor bias = RandomTensor(norm_dims, 153);
    const std::vector<Attribute> attrs = {Attribute::Int("axis", axis),
                                          Attribute::Float("epsilon", 1e-3f)};
    const Forward ln = OnnxForward("LayerNormalization", attrs, 17);
    const Tensor dy = RandomTensor(dims, 154);
    const std::vector<Tensor> out = RunOp("LayerNormalizationGrad", {dy, x, scale}, attrs, 3);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[1].dims(), norm_dims);
    const std::vector<Tensor> inputs = {x, scale, bias};
    ExpectMatchesFiniteDifference(out[0], ln, inputs, 0, Values(dy), "LN dX");
    ExpectMatchesFiniteDifference(out[1], ln, inputs, 1, Values(dy), "LN dScale");
    ExpectMatchesFiniteDifference(out[2], ln, inputs, 2, Values(dy), "LN dBias");
  }
}

// With a dense scale ([D] on a [..., D] input) rows run in 8 float64
// lanes on AVX-512 (where the CPU has it): the same bits as the scalar
// rows, for widths with and without a partial block, in float32 and 16-bit.
TEST(LayerNormalizationGrad, VectorRowsMatchScalarRowsBitForBit) {
  if (!cpu::HasSimd16()) GTEST_SKIP() << "this CPU has no AVX-512 (F/BW/VL): no vector rows";
  for (int64_t width : {1, 5, 8, 37, 64, 130}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << "width " << width << " " << DTypeName(dtype));
      const Tensor x = Convert(RandomTensor({6, 3, width}, 171, -3.0, 3.0), dtype);
      const Tensor dy = Convert(RandomTensor({6, 3, width}, 172), dtype);
      const Tensor scale = Convert(RandomTensor({width}, 173, 0.5, 1.5), dtype);
      const std::vector<Attribute> attrs = {Attribute::Int("axis", -1)};
      std::vector<Tensor> vector_rows, scalar_rows;
      {
        const cpu::ScopedFusedSimd16ForTesting fused(true);
        vector_rows = RunOp("LayerNormalizationGrad", {dy, x, scale}, attrs, 3);
      }
      {
        const cpu::ScopedFusedSimd16ForTesting fused(false);
        scalar_rows = RunOp("LayerNormalizationGrad", {dy, x, scale}, attrs, 3);
      }
      ASSERT_EQ(vector_rows.size(), 3u);
      ASSERT_EQ(scalar_rows.size(), 3u);
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(vector_rows[k].byte_size(), scalar_rows[k].byte_size());
        EXPECT_EQ(std::memcmp(vector_rows[k].raw(), scalar_rows[k].raw(),
                              vector_rows[k].byte_size()),
                  0)
            << "output " << k;
      }
    }
  }
}

TEST(LayerNormalizationGrad, Float16AndBFloat16MatchFloat32) {
  const Tensor x = RandomTensor({4, 8}, 161, -2.0, 2.0);
  const Tensor dy = RandomTensor({4, 8}, 162);
  const Tensor scale = RandomTensor({8}, 163, 0.5, 1.5);
  // 16-bit X with float32 parameters, and all 16-bit.
  ExpectLowPrecisionMatchesBoth("LayerNormalizationGrad", {dy, x, scale}, {0, 1}, {}, 3);
  ExpectLowPrecisionMatchesBoth("LayerNormalizationGrad", {dy, x, scale}, {0, 1, 2}, {}, 3);
}

// ---- softmax -------------------------------------------------------------------

void CheckSoftmaxGrad(const std::string& forward_op, int64_t axis, unsigned seed) {
  const std::vector<int64_t> dims = {2, 3, 4};
  const Tensor x = RandomTensor(dims, seed, -2.0, 2.0);
  const std::vector<Attribute> attrs = {Attribute::Int("axis", axis)};
  const Forward softmax = OnnxForward(forward_op, attrs, 13);
  const Tensor y = Convert(softmax({Convert(x, DType::kFloat64)}), DType::kFloat32);
  const Tensor dy = RandomTensor(dims, seed + 1);
  const std::vector<Tensor> out = RunOp(forward_op + "Grad", {dy, y}, attrs);
  ASSERT_EQ(out.size(), 1u);
  ExpectMatchesFiniteDifference(out[0], softmax, {x}, 0, Values(dy), forward_op + "Grad dX");
}

TEST(SoftmaxGrad, MatchesFiniteDifferences) {
  for (int64_t axis : {-1, 1, 0}) {
    SCOPED_TRACE(::testing::Message() << "axis " << axis);
    CheckSoftmaxGrad("Softmax", axis, 171);
  }
}

TEST(LogSoftmaxGrad, MatchesFiniteDifferences) {
  for (int64_t axis : {-1, 1, 0}) {
    SCOPED_TRACE(::testing::Message() << "axis " << axis);
    CheckSoftmaxGrad("LogSoftmax", axis, 181);
  }
}

TEST(SoftmaxGrad, Float16AndBFloat16MatchFloat32) {
  const Tensor dy = RandomTensor({3, 5}, 191);
  const Tensor y = RandomTensor({3, 5}, 192, 0.0, 0.5);
  ExpectLowPrecisionMatchesBoth("SoftmaxGrad", {dy, y}, {0, 1}, {});
  ExpectLowPrecisionMatchesBoth("LogSoftmaxGrad", {dy, RandomTensor({3, 5}, 193, -3.0, -0.1)},
                                {0, 1}, {Attribute::Int("axis", 0)});
}

// ---- GeluGrad -------------------------------------------------------------------

// dX against finite differences of ONNX's Gelu (opset 20, float64), both
// forms, over [-6, 6] (erf saturates past about 4).
TEST(GeluGrad, MatchesFiniteDifferences) {
  for (const char* approximate : {"none", "tanh"}) {
    SCOPED_TRACE(approximate);
    const std::vector<Attribute> form = {Attribute::String("approximate", approximate)};
    const Tensor x = RandomTensor({4, 9}, 201, -6.0, 6.0);
    const Tensor dy = RandomTensor({4, 9}, 202);
    const std::vector<Tensor> out = RunOp("GeluGrad", {dy, x}, form);
    ASSERT_EQ(out.size(), 1u);
    ExpectMatchesFiniteDifference(out[0], OnnxForward("Gelu", form, 20), {x}, 0, Values(dy),
                                  "GeluGrad dX");
  }
}

TEST(GeluGrad, Float16AndBFloat16MatchFloat32) {
  const Tensor dy = RandomTensor({3, 37}, 203);
  const Tensor x = RandomTensor({3, 37}, 204, -4.0, 4.0);
  ExpectLowPrecisionMatchesBoth("GeluGrad", {dy, x}, {0, 1}, {});
  ExpectLowPrecisionMatchesBoth("GeluGrad", {dy, x}, {0, 1},
                                {Attribute::String("approximate", "tanh")});
}

// ---- SoftmaxCrossEntropyLossGrad ---------------------------------------------

void CheckCrossEntropyGrad(const std::vector<int64_t>& score_dims,
                           const std::vector<double>& labels, bool with_weights,
                           std::vector<Attribute> attrs, unsigned seed) {
  std::vector<int64_t> label_dims = {score_dims[0]};
  label_dims.insert(label_dims.end(), score_dims.begin() + 2, score_dims.end());
  const Tensor scores = RandomTensor(score_dims, seed, -2.0, 2.0);
  const Tensor label_tensor = Make(DType::kInt64, label_dims, labels);
  std::vector<Tensor> inputs = {scores, label_tensor};
  if (with_weights) inputs.push_back(RandomTensor({score_dims[1]}, seed + 1, 0.2, 2.0));
  const Forward loss = OnnxForward("SoftmaxCrossEntropyLoss", attrs, 13);
  const Tensor y = loss({Convert(scores, DType::kFloat64), inputs[1],
                         with_weights ? Convert(inputs[2], DType::kFloat64) : Tensor()});
  const Tensor d_loss = RandomTensor(y.dims(), seed + 2, 0.5, 2.0);
  std::vector<Tensor> grad_inputs = {d_loss, scores, label_tensor};
  if (with_weights) grad_inputs.push_back(inputs[2]);
  const std::vector<Tensor> out = RunOp("SoftmaxCrossEntropyLossGrad", grad_inputs, attrs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), score_dims);
  ExpectMatchesFiniteDifference(out[0], loss, inputs, 0, Values(d_loss), "SCE dScores");
}

TEST(SoftmaxCrossEntropyLossGrad, MatchesFiniteDifferencesEachReduction) {
  for (const char* reduction : {"mean", "sum", "none"}) {
    for (bool weights : {false, true}) {
      SCOPED_TRACE(::testing::Message() << reduction << (weights ? " weighted" : ""));
      CheckCrossEntropyGrad({4, 3}, {0, 2, 1, 2}, weights,
                            {Attribute::String("reduction", reduction)}, 201);
      CheckCrossEntropyGrad({2, 3, 2, 2}, {0, 2, 1, 1, 2, 0, 0, 1}, weights,
                            {Attribute::String("reduction", reduction)}, 202);
    }
  }
}

TEST(SoftmaxCrossEntropyLossGrad, IgnoreIndexGivesZeroRowsAndIsLeftOutOfTheMean) {
  for (bool weights : {false, true}) {
    SCOPED_TRACE(weights ? "weighted" : "unweighted");
    CheckCrossEntropyGrad({5, 3}, {0, -1, 2, -1, 1}, weights,
                          {Attribute::Int("ignore_index", -1)}, 211);
  }
  // Exact values: scores 0 give softmax 1/3; labels {1, ignored}; mean over
  // one position with weight 2: dScores row 0 = (1/3 - onehot(1)) * 2 / 2.
  const std::vector<Tensor> out = RunOp(
      "SoftmaxCrossEntropyLossGrad",
      {Make(DType::kFloat32, {}, {1.0}), Make(DType::kFloat32, {2, 3}, {0, 0, 0, 0, 0, 0}),
       Make(DType::kInt32, {2}, {1, 4}), Make(DType::kFloat32, {3}, {1, 2, 3})},
      {Attribute::Int("ignore_index", 4)});
  ASSERT_EQ(out.size(), 1u);
  ExpectNear({1.0 / 3, 1.0 / 3 - 1, 1.0 / 3, 0, 0, 0}, out[0], 1e-6, 1e-7, "SCE ignore exact");
}

TEST(SoftmaxCrossEntropyLossGrad, Float16AndBFloat16MatchFloat32) {
  const Tensor scores = RandomTensor({4, 5}, 221, -2.0, 2.0);
  const Tensor labels = Make(DType::kInt64, {4}, {0, 4, 2, 2});
  ExpectLowPrecisionMatchesBoth("SoftmaxCrossEntropyLossGrad",
                                {Make(DType::kFloat32, {}, {0.75}), scores, labels,
                                 RandomTensor({5}, 222, 0.5, 1.5)},
                                {0, 1, 3}, {});
}

// ---- ReluGrad ------------------------------------------------------------------

TEST(ReluGrad, MatchesFiniteDifferences) {
  std::vector<double> xv = Random(60, 231);
  for (double& v : xv) v = static_cast<float>(v + (v >= 0 ? 0.01 : -0.01));  // |x| > 2h
  const Tensor x = Make(DType::kFloat32, {3, 4, 5}, xv);
  const Forward relu = OnnxForward("Relu", {}, 17);
  const Tensor y = Convert(relu({Convert(x, DType::kFloat64)}), DType::kFloat32);
  const Tensor dy = RandomTensor({3, 4, 5}, 232);
  const std::vector<Tensor> out = RunOp("ReluGrad", {dy, y}, {});
  ASSERT_EQ(out.size(), 1u);
  ExpectMatchesFiniteDifference(out[0], relu, {x}, 0, Values(dy), "ReluGrad dX");
}

TEST(ReluGrad, Float16AndBFloat16MatchFloat32) {
  ExpectLowPrecisionMatchesBoth("ReluGrad", {RandomTensor({7, 3}, 241), RandomTensor({7, 3}, 242)},
                                {0, 1}, {});
}

// The 16-bit path decides Y > 0 on the bit patterns: zeros of both signs,
// subnormals, infinities and NaNs of both signs give what the float32
// comparison of the widened Y gives (dY, or +0's pattern).
TEST(ReluGrad, SixteenBitSpecialValues) {
  struct Kind {
    DType dtype;
    std::vector<uint16_t> y;
  };
  const std::vector<Kind> kinds = {
      {DType::kFloat16,
       {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x3c00, 0xbc00, 0x7bff, 0x7c00, 0xfc00, 0x7c01,
        0x7e00, 0xfe00, 0x7fff}},
      {DType::kBFloat16,
       {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x3f80, 0xbf80, 0x7f7f, 0x7f80, 0xff80, 0x7f81,
        0x7fc0, 0xffc0, 0x7fff}},
  };
  for (const Kind& kind : kinds) {
    SCOPED_TRACE(DTypeName(kind.dtype));
    const int64_t n = static_cast<int64_t>(kind.y.size());
    Tensor y(kind.dtype, {n}), dy(kind.dtype, {n});
    for (int64_t i = 0; i < n; ++i) {
      y.data<uint16_t>()[i] = kind.y[i];
      dy.data<uint16_t>()[i] = static_cast<uint16_t>(0x3c00 + 0x111 * i);  // any non-zero bits
    }
    const std::vector<Tensor> out = RunOp("ReluGrad", {dy, y}, {});
    ASSERT_EQ(out.size(), 1u);
    for (int64_t i = 0; i < n; ++i) {
      const float widened = kind.dtype == DType::kFloat16 ? HalfBitsToFloat(kind.y[i])
                                                          : BFloat16BitsToFloat(kind.y[i]);
      const uint16_t want = widened > 0.0f ? dy.data<uint16_t>()[i] : 0;
      EXPECT_EQ(out[0].data<uint16_t>()[i], want) << "Y bits 0x" << std::hex << kind.y[i];
    }
  }
}

// ---- ReduceToShapeOf -----------------------------------------------------------

void CheckReduceToShapeOf(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& y_dims,
                          unsigned seed) {
  const Tensor x = RandomTensor(x_dims, seed);
  const Tensor shape = Tensor::Int64s(y_dims);
  const Forward expand = OnnxForward("Expand", {}, 13, 1, {1});
  const Tensor dy = RandomTensor(y_dims, seed + 1);
  const std::vector<Tensor> out = RunOp("ReduceToShapeOf", {dy, x}, {});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), x_dims);
  ExpectMatchesFiniteDifference(out[0], expand, {x, shape}, 0, Values(dy), "ReduceToShapeOf");
}

TEST(ReduceToShapeOf, MatchesFiniteDifferences) {
  CheckReduceToShapeOf({3, 1, 4}, {2, 3, 5, 4}, 251);
  CheckReduceToShapeOf({4}, {3, 2, 4}, 252);
  CheckReduceToShapeOf({1, 3, 1, 1}, {2, 3, 4, 5}, 253);
  CheckReduceToShapeOf({2, 3}, {2, 3}, 254);
  CheckReduceToShapeOf({}, {3, 2}, 255);
  CheckReduceToShapeOf({2, 1}, {2, 6}, 256);
}

TEST(ReduceToShapeOf, Float16AndBFloat16MatchFloat32) {
  ExpectLowPrecisionMatchesBoth("ReduceToShapeOf",
                                {RandomTensor({4, 3, 5}, 261), RandomTensor({3, 1}, 262)}, {0},
                                {});
}


// The kernel's summation order, exactly: per output element, a float64 sum
// over the outer summed axes of float32 partial sums (from +0, in order)
// along the innermost summed axis. Shapes cover a kept innermost axis wider
// than one column block (outer kept and outer summed axes around it), a
// summed innermost axis longer than one conversion block, and no summing
// at all (dY + 0: -0 becomes +0); in float32, float16 and bfloat16, the
// 16-bit ones on the fused AVX-512 row sums (where the CPU has them) and on
// the blocked path.
TEST(ReduceToShapeOf, SumsInTheDocumentedOrderBitExactly) {
  std::mt19937 rng(291);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const bool fused : {true, false}) {
    if (fused && !cpu::HasSimd16()) {
      std::cout << "no AVX-512 here: the fused row sums are not tested\n";
      continue;
    }
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << (fused ? " fused" : " blocked"));
      const cpu::ScopedFusedSimd16ForTesting scoped_fused(fused);
      auto random = [&](const std::vector<int64_t>& dims) {
        int64_t n = 1;
        for (int64_t d : dims) n *= d;
        std::vector<double> v(static_cast<size_t>(n));
        for (double& e : v) e = normal(rng);
        return Make(dtype, dims, v);
      };
      auto rounded = [&](float v) {  // what a store of v in dtype reads back as
        return Values(Make(dtype, {1}, {static_cast<double>(v)}))[0];
      };
      {
        // dY [2, 5, 7, 300] -> X [5, 1, 300]: summed 2 (outer) and 7 (inner).
        const Tensor dy = random({2, 5, 7, 300});
        const std::vector<double> d = Values(dy);
        const std::vector<Tensor> out = RunOp("ReduceToShapeOf", {dy, random({5, 1, 300})}, {});
        ASSERT_EQ(out.size(), 1u);
        const std::vector<double> got = Values(out[0]);
        for (int64_t k = 0; k < 5; ++k) {
          for (int64_t c = 0; c < 300; ++c) {
            double total = 0;
            for (int64_t r = 0; r < 2; ++r) {
              float partial = 0;
              for (int64_t i = 0; i < 7; ++i) {
                partial += static_cast<float>(d[((r * 5 + k) * 7 + i) * 300 + c]);
              }
              total += partial;
            }
            ASSERT_EQ(got[k * 300 + c], rounded(static_cast<float>(total))) << k << "," << c;
          }
        }
      }
      {
        // dY [2, 3, 600] -> X [3, 1]: summed 2 (outer) and 600 (innermost).
        const Tensor dy = random({2, 3, 600});
        const std::vector<double> d = Values(dy);
        const std::vector<Tensor> out = RunOp("ReduceToShapeOf", {dy, random({3, 1})}, {});
        ASSERT_EQ(out.size(), 1u);
        const std::vector<double> got = Values(out[0]);
        for (int64_t k = 0; k < 3; ++k) {
          double total = 0;
          for (int64_t r = 0; r < 2; ++r) {
            float partial = 0;
            for (int64_t i = 0; i < 600; ++i) partial += static_cast<float>(d[(r * 3 + k) * 600 + i]);
            total += partial;
          }
          ASSERT_EQ(got[k], rounded(static_cast<float>(total))) << k;
        }
      }
      {
        // dY [3, 50, 70] -> X [70] (a bias gradient): 150 rows summed, in
        // column blocks as wide as the thread count allows (the first case
        // has whole 64-column passes of the fused sums).
        const Tensor dy = random({3, 50, 70});
        const std::vector<double> d = Values(dy);
        const std::vector<Tensor> out = RunOp("ReduceToShapeOf", {dy, random({70})}, {});
        ASSERT_EQ(out.size(), 1u);
        const std::vector<double> got = Values(out[0]);
        for (int64_t c = 0; c < 70; ++c) {
          float partial = 0;
          for (int64_t i = 0; i < 150; ++i) partial += static_cast<float>(d[i * 70 + c]);
          ASSERT_EQ(got[c], rounded(partial)) << c;
        }
      }
      {
        // Same shapes: dY + 0.
        const Tensor dy = Make(dtype, {1, 3}, {-0.0, 2.5, -1.25});
        const std::vector<Tensor> out = RunOp("ReduceToShapeOf", {dy, random({1, 3})}, {});
        ASSERT_EQ(out.size(), 1u);
        const std::vector<double> got = Values(out[0]);
        EXPECT_EQ(got, (std::vector<double>{0.0, 2.5, -1.25}));
        EXPECT_FALSE(std::signbit(got[0]));
      }
    }
  }
}

// ---- GatherGrad ----------------------------------------------------------------

TEST(GatherGrad, MatchesFiniteDifferencesWithNegativeAndRepeatedIndices) {
  for (int64_t axis : {0, 1, -1}) {
    SCOPED_TRACE(::testing::Message() << "axis " << axis);
    const Tensor data = RandomTensor({3, 4, 2}, 271);
    const int64_t axis_dim = data.dims()[axis < 0 ? axis + 3 : axis];
    const Tensor indices =
        Make(DType::kInt64, {3, 2}, {0, -1, static_cast<double>(axis_dim - 1), 0, 1, 1});
    const std::vector<Attribute> attrs = {Attribute::Int("axis", axis)};
    const Forward gather = OnnxForward("Gather", attrs, 13);
    const Tensor y = gather({Convert(data, DType::kFloat64), indices});
    const Tensor dy = RandomTensor(y.dims(), 272);
    const std::vector<Tensor> out = RunOp("GatherGrad", {dy, indices, data}, attrs);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dims(), data.dims());
    ExpectMatchesFiniteDifference(out[0], gather, {data, indices}, 0, Values(dy), "GatherGrad");
  }
}

TEST(GatherGrad, Float16AndBFloat16MatchFloat32) {
  ExpectLowPrecisionMatchesBoth(
      "GatherGrad",
      {RandomTensor({5, 3}, 281), Make(DType::kInt32, {5}, {1, 1, 0, -1, 3}),
       RandomTensor({4, 3}, 282)},
      {0, 2}, {});
}

// ---- errors ----------------------------------------------------------------------

void ExpectErrorMentions(const absl::Status& status, const std::vector<std::string>& parts) {
  ASSERT_FALSE(status.ok());
  for (const std::string& part : parts) {
    EXPECT_NE(std::string(status.message()).find(part), std::string::npos)
        << "'" << status.message() << "' does not mention '" << part << "'";
  }
}

TEST(GradientOpErrors, NameTheNodeAndInput) {
  // Inference: ranks and dtypes.
  ExpectErrorMentions(RunStatus("ConvGrad", {RandomTensor({2, 3}, 1), RandomTensor({2, 3}, 2),
                                             RandomTensor({3, 3, 1}, 3)},
                                {}),
                      {"ConvGrad node 'node'", "input 1 (X)", "rank >= 3"});
  ExpectErrorMentions(RunStatus("MaxPoolGrad",
                                {Make(DType::kInt32, {1, 1, 2, 2}, {1, 2, 3, 4}),
                                 RandomTensor({1, 1, 3, 3}, 4)},
                                {Attribute::Ints("kernel_shape", {2, 2})}),
                      {"MaxPoolGrad node 'node'", "input 0 (dY)", "int32"});
  ExpectErrorMentions(RunStatus("SoftmaxCrossEntropyLossGrad",
                                {Make(DType::kFloat32, {}, {1}), RandomTensor({2, 3}, 5),
                                 RandomTensor({2}, 6)},
                                {}),
                      {"SoftmaxCrossEntropyLossGrad node 'node'", "input 2 (labels)", "int64"});
  ExpectErrorMentions(RunStatus("BatchNormalizationGrad",
                                {RandomTensor({2, 3, 2}, 7), RandomTensor({2, 3, 2}, 8),
                                 RandomTensor({4}, 9)},
                                {}),
                      {"BatchNormalizationGrad node 'node'", "input 2 (scale)"});
  // The forward's batch mean, where given, must be float32 [C].
  ExpectErrorMentions(RunStatus("BatchNormalizationGrad",
                                {RandomTensor({2, 3, 2}, 7), RandomTensor({2, 3, 2}, 8),
                                 RandomTensor({3}, 9), RandomTensor({2}, 10)},
                                {}),
                      {"BatchNormalizationGrad node 'node'", "input 3 (mean)", "[3]"});
  ExpectErrorMentions(RunStatus("BatchNormalizationGrad",
                                {RandomTensor({2, 3, 2}, 7), RandomTensor({2, 3, 2}, 8),
                                 RandomTensor({3}, 9), Convert(RandomTensor({3}, 10),
                                                               DType::kFloat16)},
                                {}),
                      {"BatchNormalizationGrad node 'node'", "input 3 (mean)", "float32"});
  // A fused Relu's output, where given, has X's dtype and shape.
  ExpectErrorMentions(RunStatus("BatchNormalizationGrad",
                                {RandomTensor({2, 3, 2}, 7), RandomTensor({2, 3, 2}, 8),
                                 RandomTensor({3}, 9), Tensor(), RandomTensor({2, 3, 3}, 10)},
                                {}),
                      {"BatchNormalizationGrad node 'node'", "input 4 (relu_output)", "X"});
  ExpectErrorMentions(RunStatus("BatchNormalizationGrad",
                                {RandomTensor({2, 3, 2}, 7), RandomTensor({2, 3, 2}, 8),
                                 RandomTensor({3}, 9), Tensor(),
                                 Convert(RandomTensor({2, 3, 2}, 10), DType::kBFloat16)},
                                {}),
                      {"BatchNormalizationGrad node 'node'", "input 4 (relu_output)", "bfloat16"});
  ExpectErrorMentions(
      RunStatus("ReduceToShapeOf", {RandomTensor({2, 3}, 10), RandomTensor({4}, 11)}, {}),
      {"ReduceToShapeOf node 'node'", "input 1 (X)", "does not broadcast"});
  ExpectErrorMentions(
      RunStatus("SoftmaxGrad", {RandomTensor({2, 3}, 12), RandomTensor({2, 3}, 13)},
                {Attribute::Int("axis", 2)}),
      {"SoftmaxGrad node 'node'", "axis"});
  // Kernel: shapes only known at run time, and data-dependent checks.
  ExpectErrorMentions(RunStatus("ConvGrad", {RandomTensor({1, 2, 3, 3}, 14),
                                             RandomTensor({1, 1, 4, 4}, 15),
                                             RandomTensor({2, 1, 3, 3}, 16)},
                                {}),
                      {"ConvGrad node 'node'", "input 0 (dY)", "[1,2,2,2]"});
  ExpectErrorMentions(RunStatus("SoftmaxCrossEntropyLossGrad",
                                {Make(DType::kFloat32, {}, {1}), RandomTensor({2, 3}, 17),
                                 Make(DType::kInt64, {2}, {0, 7})},
                                {}),
                      {"SoftmaxCrossEntropyLossGrad node 'node'", "label 7", "out of range"});
  ExpectErrorMentions(RunStatus("GatherGrad",
                                {RandomTensor({2}, 18), Make(DType::kInt64, {2}, {0, 5}),
                                 RandomTensor({3}, 19)},
                                {}),
                      {"GatherGrad node 'node'", "input 1 (indices)", "index 5"});
  ExpectErrorMentions(RunStatus("AveragePoolGrad",
                                {RandomTensor({1, 1, 2, 2}, 20), RandomTensor({1, 1, 5, 5}, 21)},
                                {Attribute::Ints("kernel_shape", {3, 3})}),
                      {"AveragePoolGrad node 'node'", "input 0 (dY)"});
}

}  // namespace
}  // namespace castor
