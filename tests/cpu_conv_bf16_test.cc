// The CPU backend's native bfloat16 Conv and ConvGrad (backend/cpu/conv.cc,
// conv_grad.cc: 2-D convs on the grid's bfloat16 products where the CPU has
// AVX512-BF16, two channels per VDPBF16PS word; the others on the native
// bfloat16 GEMM, columns unrolled in bfloat16, AVX512-BF16 or AMX products;
// float32 sums either way) against the widened path (16-bit widened to
// float32, sgemm or float32 grid products), which stays the fallback and
// the reference, on odd sizes and tails (odd channel counts, so a channel
// pairs with zeros; K and output widths that are no multiple of 2 or 16),
// groups, strides, pads, dilations, 1-D and 3-D, pointwise, and Inf/NaN
// inputs; and both against float64 references of the same bfloat16
// inputs. castor's com.castor Conv (the training graph's form) runs the
// same kernel. ConvTranspose's columns run on the native bfloat16 GEMM
// too. Skips the native comparisons where the CPU has neither
// AVX512-BF16 nor AMX.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "graph/gradient_builder.h"
#include "gtest/gtest.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::Count;
using testing::Make;
using testing::Random;
using testing::RunOk;
using testing::Values;

struct ConvCase {
  std::vector<int64_t> x_dims, w_dims;
  int64_t group = 1;
  std::vector<int64_t> strides, dilations, pads;
  bool bias = true;
};

std::vector<Attribute> Attrs(const ConvCase& c) {
  std::vector<Attribute> attrs = {Attribute::Int("group", c.group)};
  if (!c.strides.empty()) attrs.push_back(Attribute::Ints("strides", c.strides));
  if (!c.dilations.empty()) attrs.push_back(Attribute::Ints("dilations", c.dilations));
  if (!c.pads.empty()) attrs.push_back(Attribute::Ints("pads", c.pads));
  return attrs;
}

const std::vector<ConvCase>& Cases() {
  static const std::vector<ConvCase> cases = {
      // Odd channels, odd K (3 * 3 * 3 = 27), odd output width.
      {{2, 3, 9, 7}, {5, 3, 3, 3}, 1, {}, {}, {1, 1, 1, 1}},
      // Grouped, strided, dilated, uneven pads.
      {{3, 6, 11, 10}, {9, 2, 3, 2}, 3, {2, 1}, {1, 2}, {1, 0, 2, 1}},
      // Stride 2 on both axes, odd input width (ConvGrad's dX phases
      // spread along the rows).
      {{2, 6, 9, 11}, {5, 6, 3, 3}, 1, {2, 2}, {}, {1, 1, 1, 1}},
      // Depthwise.
      {{2, 5, 8, 9}, {5, 1, 3, 3}, 5, {}, {}, {1, 1, 1, 1}, false},
      // Pointwise (X itself is the column matrix), and strided 1x1.
      {{2, 7, 5, 6}, {11, 7, 1, 1}, 1, {}, {}, {}},
      {{2, 7, 9, 6}, {4, 7, 1, 1}, 1, {2, 2}, {}, {}},
      // 1-D and 3-D.
      {{3, 3, 23}, {4, 3, 5}, 1, {2}, {2}, {3, 1}},
      {{2, 3, 5, 6, 7}, {4, 3, 3, 2, 3}, 1, {1, 2, 1}, {}, {1, 0, 1, 1, 1, 0}},
      // One image (tasks one at a time, the GEMM split across threads),
      // the sample CNN's first layer, and a wider one.
      {{1, 3, 17, 19}, {7, 3, 3, 3}, 1, {}, {}, {1, 1, 1, 1}},
      {{4, 1, 28, 28}, {32, 1, 3, 3}, 1, {}, {}, {}},
      {{2, 33, 14, 13}, {17, 33, 3, 3}, 1, {}, {}, {1, 1, 1, 1}},
      // Few output positions per image (the images' columns side by side
      // in one GEMM): 1x1 images under a padded 3x3 kernel, grouped and
      // strided down to 2x2, and more images than one GEMM takes.
      {{3, 6, 1, 1}, {5, 6, 3, 3}, 1, {}, {}, {1, 1, 1, 1}},
      {{2, 4, 3, 4}, {6, 2, 3, 3}, 2, {2, 2}, {}, {1, 1, 1, 1}},
      {{300, 5, 2, 2}, {3, 5, 3, 3}, 1, {}, {}, {1, 1, 1, 1}},
  };
  return cases;
}

bool NativeAvailable() { return cpu::Avx512Bf16Supported() || cpu::AmxBf16Available(); }

// Runs `fn` with the native bfloat16 GEMM kernels on (as the CPU allows)
// or off (the widened sgemm path), restoring the switches after.
template <typename Fn>
auto WithNative(bool native, Fn&& fn) {
  const cpu::KernelSwitch avx_before =
      cpu::SetAvx512Bf16ForTesting(native ? cpu::KernelSwitch::kOn : cpu::KernelSwitch::kOff);
  const bool amx_before = cpu::SetAmxForTesting(native);
  auto result = fn();
  cpu::SetAvx512Bf16ForTesting(avx_before);
  cpu::SetAmxForTesting(amx_before);
  return result;
}

// Expects a and b (bfloat16 results of the same float32-accumulated sums,
// in another order) within `ulps` bfloat16 ulps of each other, plus an
// absolute allowance for cancellation (`atol`); Inf/NaN must match.
void ExpectCloseBfloat16(const Tensor& a, const Tensor& b, int ulps, double atol,
                         const std::string& what) {
  ASSERT_EQ(a.dims(), b.dims()) << what;
  const std::vector<double> va = Values(a), vb = Values(b);
  int reported = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i]) || std::isinf(va[i]) || std::isinf(vb[i])) {
      const bool same = (std::isnan(va[i]) && std::isnan(vb[i])) || va[i] == vb[i];
      EXPECT_TRUE(same) << what << " [" << i << "]: " << va[i] << " vs " << vb[i];
      continue;
    }
    const double scale = std::max(std::fabs(va[i]), std::fabs(vb[i]));
    const double tolerance = ulps * scale * std::ldexp(1.0, -7) + atol;
    if (std::fabs(va[i] - vb[i]) > tolerance && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: " << va[i] << " vs " << vb[i];
    }
  }
}

TEST(CpuConvBfloat16, NativeMatchesWidenedAndFloat64) {
  if (!NativeAvailable()) GTEST_SKIP() << "no AVX512-BF16 or AMX on this CPU";
  unsigned seed = 500;
  for (const ConvCase& c : Cases()) {
    SCOPED_TRACE(::testing::Message() << "X rank " << c.x_dims.size() << " C " << c.x_dims[1]
                                      << " group " << c.group);
    std::vector<Tensor> inputs = {Make(DType::kBFloat16, c.x_dims, Random(Count(c.x_dims), seed)),
                                  Make(DType::kBFloat16, c.w_dims, Random(Count(c.w_dims), seed + 1))};
    if (c.bias) {
      inputs.push_back(Make(DType::kBFloat16, {c.w_dims[0]}, Random(c.w_dims[0], seed + 2)));
    }
    seed += 3;
    const Tensor native =
        WithNative(true, [&] { return RunOk("Conv", inputs, Attrs(c), 22)[0]; });
    const Tensor widened =
        WithNative(false, [&] { return RunOk("Conv", inputs, Attrs(c), 22)[0]; });
    // float64 of the same bfloat16 inputs (the float32 run is within
    // float32 rounding of it), then rounded once as both paths round.
    std::vector<Tensor> wide;
    for (const Tensor& t : inputs) wide.push_back(Make(DType::kFloat64, t.dims(), Values(t)));
    const Tensor reference = RunOk("Conv", wide, Attrs(c), 22)[0];
    // Both sum the same bfloat16 products in float32 and round once: at
    // most one bfloat16 ulp apart where no cancellation happened.
    ExpectCloseBfloat16(native, widened, 1, 1e-5, "native vs widened");
    ExpectCloseBfloat16(native, Make(DType::kBFloat16, reference.dims(), Values(reference)), 1,
                        1e-5, "native vs float64");
    // castor's training form runs the same kernel: the same bits.
    const Tensor castor_form = WithNative(
        true, [&] { return RunOk("Conv", inputs, Attrs(c), 1, 1, kCastorDomain)[0]; });
    EXPECT_EQ(testing::Bits(castor_form), testing::Bits(native));
  }
}

TEST(CpuConvBfloat16, NativePropagatesInfAndNaNAsWidened) {
  if (!NativeAvailable()) GTEST_SKIP() << "no AVX512-BF16 or AMX on this CPU";
  const ConvCase c{{1, 3, 6, 5}, {2, 3, 3, 3}, 1, {}, {}, {1, 1, 1, 1}};
  std::vector<double> x = Random(Count(c.x_dims), 91);
  x[7] = std::numeric_limits<double>::infinity();
  x[40] = std::numeric_limits<double>::quiet_NaN();
  x[61] = -std::numeric_limits<double>::infinity();
  const std::vector<Tensor> inputs = {Make(DType::kBFloat16, c.x_dims, x),
                                      Make(DType::kBFloat16, c.w_dims, Random(Count(c.w_dims), 92)),
                                      Make(DType::kBFloat16, {2}, Random(2, 93))};
  const Tensor native = WithNative(true, [&] { return RunOk("Conv", inputs, Attrs(c), 22)[0]; });
  const Tensor widened = WithNative(false, [&] { return RunOk("Conv", inputs, Attrs(c), 22)[0]; });
  int non_finite = 0;
  for (double v : Values(native)) non_finite += !std::isfinite(v);
  EXPECT_GT(non_finite, 10);
  ExpectCloseBfloat16(native, widened, 1, 1e-5, "native vs widened with Inf/NaN");
}

// bfloat16 subnormals count as zero in the native products (VDPBF16PS,
// AMX), where the widened path keeps them: X of subnormals alone gives the
// bias exactly there, and the bias plus products below 1e-30 widened.
TEST(CpuConvBfloat16, NativeCountsSubnormalsAsZero) {
  if (!NativeAvailable()) GTEST_SKIP() << "no AVX512-BF16 or AMX on this CPU";
  const ConvCase c{{2, 4, 7, 9}, {3, 4, 3, 3}, 1, {}, {}, {1, 1, 1, 1}};
  std::vector<double> x = Random(Count(c.x_dims), 95);
  for (double& v : x) v *= 1e-39;  // bfloat16 subnormals (below 1.2e-38)
  const std::vector<Tensor> inputs = {Make(DType::kBFloat16, c.x_dims, x),
                                      Make(DType::kBFloat16, c.w_dims, Random(Count(c.w_dims), 96)),
                                      Make(DType::kBFloat16, {3}, {0.5, -0.25, 2.0})};
  int subnormal = 0;
  for (double v : Values(inputs[0])) subnormal += v != 0.0 && std::fabs(v) < 1.2e-38;
  ASSERT_GT(subnormal, 200);
  const Tensor native = WithNative(true, [&] { return RunOk("Conv", inputs, Attrs(c), 22)[0]; });
  const Tensor widened = WithNative(false, [&] { return RunOk("Conv", inputs, Attrs(c), 22)[0]; });
  const std::vector<double> got = Values(native), wide = Values(widened);
  const double bias[] = {0.5, -0.25, 2.0};
  const int64_t positions = 7 * 9;
  for (size_t i = 0; i < got.size(); ++i) {
    const double b = bias[(i / positions) % 3];
    ASSERT_EQ(got[i], b) << i;
    ASSERT_NEAR(wide[i], b, 1e-30) << i;
  }
}

// dY with Inf and NaN: the native gradients are non-finite exactly where
// the widened ones are (Inf times a pad's zero is NaN in both).
TEST(CpuConvBfloat16, GradientsPropagateInfAndNaNAsWidened) {
  if (!NativeAvailable()) GTEST_SKIP() << "no AVX512-BF16 or AMX on this CPU";
  const ConvCase c{{2, 3, 9, 8}, {5, 3, 3, 3}, 1, {}, {}, {1, 1, 1, 1}};
  const Tensor x = Make(DType::kBFloat16, c.x_dims, Random(Count(c.x_dims), 97));
  const Tensor w = Make(DType::kBFloat16, c.w_dims, Random(Count(c.w_dims), 98));
  std::vector<double> dy_values = Random(2 * 5 * 9 * 8, 99);
  dy_values[11] = std::numeric_limits<double>::infinity();
  dy_values[200] = std::numeric_limits<double>::quiet_NaN();
  dy_values[500] = -std::numeric_limits<double>::infinity();
  const Tensor dy = Make(DType::kBFloat16, {2, 5, 9, 8}, dy_values);
  auto run = [&] { return RunOk("ConvGrad", {dy, x, w}, Attrs(c), 1, 3, kCastorDomain); };
  const std::vector<Tensor> native = WithNative(true, run);
  const std::vector<Tensor> widened = WithNative(false, run);
  const char* names[] = {"dX", "dW", "dB"};
  for (int i = 0; i < 3; ++i) {
    int non_finite = 0;
    for (double v : Values(native[i])) non_finite += !std::isfinite(v);
    EXPECT_GT(non_finite, 0) << names[i];
    ExpectCloseBfloat16(native[i], widened[i], 1, 1e-3, names[i]);
  }
}

// ConvTranspose on the native bfloat16 GEMM (the columns W_g^T X_g from the
// stored bits) against the widened path and float64: torch's stride-2
// form with output_padding and a bias, grouped and dilated, 1-D, and
// castor's form (the training graph's) with the same bits.
TEST(CpuConvBfloat16, ConvTransposeNativeMatchesWidenedAndFloat64) {
  if (!NativeAvailable()) GTEST_SKIP() << "no AVX512-BF16 or AMX on this CPU";
  struct Case {
    std::vector<int64_t> x_dims, w_dims;
    std::vector<Attribute> attrs;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{2, 5, 6, 7},
       {5, 3, 3, 3},
       {Attribute::Ints("strides", {2, 2}), Attribute::Ints("pads", {1, 1, 1, 1}),
        Attribute::Ints("output_padding", {1, 1})},
       true},
      {{3, 6, 5, 4},
       {6, 2, 2, 3},
       {Attribute::Int("group", 3), Attribute::Ints("dilations", {2, 1}),
        Attribute::Ints("strides", {1, 2})},
       false},
      {{2, 3, 19}, {3, 4, 5}, {Attribute::Ints("strides", {3}), Attribute::Ints("pads", {2, 1})},
       true},
  };
  unsigned seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "X rank " << c.x_dims.size() << " C " << c.x_dims[1]);
    const int64_t group = c.attrs.front().name == "group" ? c.attrs.front().i : 1;
    std::vector<Tensor> inputs = {Make(DType::kBFloat16, c.x_dims, Random(Count(c.x_dims), seed)),
                                  Make(DType::kBFloat16, c.w_dims, Random(Count(c.w_dims), seed + 1))};
    if (c.bias) {
      const int64_t m = c.w_dims[1] * group;
      inputs.push_back(Make(DType::kBFloat16, {m}, Random(m, seed + 2)));
    }
    seed += 3;
    const Tensor native =
        WithNative(true, [&] { return RunOk("ConvTranspose", inputs, c.attrs, 22)[0]; });
    const Tensor widened =
        WithNative(false, [&] { return RunOk("ConvTranspose", inputs, c.attrs, 22)[0]; });
    std::vector<Tensor> wide;
    for (const Tensor& t : inputs) wide.push_back(Make(DType::kFloat64, t.dims(), Values(t)));
    const Tensor reference = RunOk("ConvTranspose", wide, c.attrs, 22)[0];
    // The columns are float32 sums of bfloat16 products on both paths, the
    // scatter adds them in the same order: a bfloat16 ulp apart at most.
    ExpectCloseBfloat16(native, widened, 1, 1e-5, "native vs widened");
    ExpectCloseBfloat16(native, Make(DType::kBFloat16, reference.dims(), Values(reference)), 1,
                        1e-5, "native vs float64");
    const Tensor castor_form = WithNative(
        true, [&] { return RunOk("ConvTranspose", inputs, c.attrs, 1, 1, kCastorDomain)[0]; });
    EXPECT_EQ(testing::Bits(castor_form), testing::Bits(native));
  }
}

TEST(CpuConvBfloat16, GradientsNativeMatchWidened) {
  if (!NativeAvailable()) GTEST_SKIP() << "no AVX512-BF16 or AMX on this CPU";
  unsigned seed = 700;
  for (const ConvCase& c : Cases()) {
    SCOPED_TRACE(::testing::Message() << "X rank " << c.x_dims.size() << " C " << c.x_dims[1]
                                      << " group " << c.group);
    const Tensor x = Make(DType::kBFloat16, c.x_dims, Random(Count(c.x_dims), seed));
    const Tensor w = Make(DType::kBFloat16, c.w_dims, Random(Count(c.w_dims), seed + 1));
    const Tensor y = RunOk("Conv", {x, w}, Attrs(c), 22)[0];
    const Tensor dy = Make(DType::kBFloat16, y.dims(), Random(Count(y.dims()), seed + 2));
    seed += 3;
    auto run = [&] {
      // Every dX element written (the strided 1x1 case has stride phases
      // without a tap) shows through NaN left where dX is likely allocated.
      testing::PoisonFreedMemory(DType::kBFloat16, c.x_dims);
      return RunOk("ConvGrad", {dy, x, w}, Attrs(c), 1, 3, kCastorDomain);
    };
    const std::vector<Tensor> native = WithNative(true, run);
    const std::vector<Tensor> widened = WithNative(false, run);
    ASSERT_EQ(native.size(), 3u);
    // dX sums at most mg * kernel products, dW batch * positions, dB
    // batch * positions terms: the atol covers cancellation to near zero.
    const char* names[] = {"dX", "dW", "dB"};
    for (int i = 0; i < 3; ++i) {
      ExpectCloseBfloat16(native[i], widened[i], 1, 1e-3, names[i]);
    }
    // dB is dY's row sums on both paths.
    EXPECT_EQ(testing::Bits(native[2]), testing::Bits(widened[2]));
  }
}

}  // namespace
}  // namespace castor
