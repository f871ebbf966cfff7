// CPU kernels of the matmul and conv families (backend/cpu/matmul.cc,
// conv.cc, gemm.cc, im2col.cc) against naive float64 references written
// here: triple-loop matmul, direct convolution, direct scatter for
// ConvTranspose. 16-bit runs must equal the float32 computation on the
// widened inputs rounded once (float32 accumulation). Also runs the ONNX
// conformance cases of MatMul, Gemm, Conv and ConvTranspose.
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/grid_conv.h"
#include "backend/run_node.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::ConformanceSummary;
using testing::Count;
using testing::Cpu;
using testing::ExpectNear;
using testing::Make;
using testing::Random;
using testing::RoundTo;
using testing::RunConformanceCasesOf;
using testing::RunOk;
using testing::SingleNode;
using testing::Unravel;
using testing::Values;

// ---- MatMul ------------------------------------------------------------------

// numpy.matmul in float64 over dims with broadcasting and 1-D operands.
std::vector<double> RefMatMul(const std::vector<double>& a, std::vector<int64_t> ad,
                              const std::vector<double>& b, std::vector<int64_t> bd,
                              std::vector<int64_t>* out_dims) {
  const bool av = ad.size() == 1, bv = bd.size() == 1;
  if (av) ad.insert(ad.begin(), 1);
  if (bv) bd.push_back(1);
  const int64_t m = ad[ad.size() - 2], k = ad.back(), n = bd.back();
  std::vector<int64_t> ab(ad.begin(), ad.end() - 2), bb(bd.begin(), bd.end() - 2);
  const size_t r = std::max(ab.size(), bb.size());
  ab.insert(ab.begin(), r - ab.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  std::vector<int64_t> batch(r);
  for (size_t i = 0; i < r; ++i) batch[i] = std::max(ab[i], bb[i]);
  *out_dims = batch;
  if (!av) out_dims->push_back(m);
  if (!bv) out_dims->push_back(n);
  const int64_t count = Count(batch);
  std::vector<double> out(static_cast<size_t>(count * m * n), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, ao = 0, bo = 0, as = 1, bs = 1;
    for (size_t d = r; d-- > 0;) {
      const int64_t idx = rest % batch[d];
      rest /= batch[d];
      ao += (ab[d] == 1 ? 0 : idx) * as;
      bo += (bb[d] == 1 ? 0 : idx) * bs;
      as *= ab[d];
      bs *= bb[d];
    }
    for (int64_t p = 0; p < m; ++p)
      for (int64_t q = 0; q < n; ++q) {
        double s = 0;
        for (int64_t t = 0; t < k; ++t) s += a[ao * m * k + p * k + t] * b[bo * k * n + t * n + q];
        out[i * m * n + p * n + q] = s;
      }
  }
  return out;
}

TEST(CpuMatMul, Float32ShapesAndBroadcasting) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 4}, {4, 5}},       {{4}, {4}},          {{4}, {2, 4, 3}},  {{2, 3, 4}, {4}},
      {{2, 1, 3, 4}, {3, 4, 5}}, {{5, 3, 4}, {4, 2}}, {{1, 3, 4}, {6, 4, 2}}, {{2, 64, 33}, {2, 33, 70}},
      {{2, 3, 0}, {0, 4}},    {{0, 3}, {3, 2}}};
  unsigned seed = 1;
  for (const auto& [ad, bd] : cases) {
    const auto a = Random(Count(ad), seed++), b = Random(Count(bd), seed++);
    std::vector<int64_t> dims;
    const auto expected = RefMatMul(a, ad, b, bd, &dims);
    auto out = RunOk("MatMul", {Make(DType::kFloat32, ad, a), Make(DType::kFloat32, bd, b)}, {});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dims(), dims);
    ExpectNear(expected, out[0], 1e-5, 1e-5, "MatMul f32");
    auto out64 = RunOk("MatMul", {Make(DType::kFloat64, ad, a), Make(DType::kFloat64, bd, b)}, {});
    ExpectNear(expected, out64[0], 1e-12, 1e-12, "MatMul f64");
  }
}

TEST(CpuMatMul, Integers) {
  const std::vector<int64_t> ad = {2, 3, 5}, bd = {5, 4};
  const auto a = Random(Count(ad), 7, true), b = Random(Count(bd), 8, true);
  std::vector<int64_t> dims;
  const auto expected = RefMatMul(a, ad, b, bd, &dims);
  for (DType dt : {DType::kInt32, DType::kInt64}) {
    auto out = RunOk("MatMul", {Make(dt, ad, a), Make(dt, bd, b)}, {});
    ASSERT_EQ(out[0].dtype(), dt);
    ExpectNear(expected, out[0], 0, 0, "MatMul int");
  }
  // Gemm on int32 with transB and a row-vector C.
  const auto ga = Random(12, 9, true), gb = Random(20, 10, true), gc = Random(5, 11, true);
  std::vector<double> ge(15);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) {
      double acc = gc[j];
      for (int t = 0; t < 4; ++t) acc += ga[i * 4 + t] * gb[j * 4 + t];
      ge[i * 5 + j] = acc;
    }
  auto gout = RunOk("Gemm",
                    {Make(DType::kInt32, {3, 4}, ga), Make(DType::kInt32, {5, 4}, gb),
                     Make(DType::kInt32, {5}, gc)},
                    {Attribute::Int("transB", 1)});
  ASSERT_EQ(gout[0].dtype(), DType::kInt32);
  ExpectNear(ge, gout[0], 0, 0, "Gemm int32");
}

// 16-bit MatMul of A [ad] and B [bd] == float32 product of the widened
// inputs, rounded once: integers (exact float32 sums) bit for bit, reals
// (seeds from `seed`) against the float64 product of the 16-bit inputs
// rounded once (float32 accumulation error is far below a 16-bit ulp).
void ExpectSixteenBitMatMul(DType dt, const std::vector<int64_t>& ad,
                            const std::vector<int64_t>& bd, unsigned seed,
                            const std::string& what) {
  const auto a = Random(Count(ad), seed, true), b = Random(Count(bd), seed + 1, true);
  std::vector<int64_t> dims;
  const auto expected = RoundTo(dt, RefMatMul(a, ad, b, bd, &dims));
  auto out = RunOk("MatMul", {Make(dt, ad, a), Make(dt, bd, b)}, {});
  ASSERT_EQ(out[0].dtype(), dt);
  ExpectNear(expected, out[0], 0, 0, what + " 16-bit integers");
  const auto ra = RoundTo(dt, Random(Count(ad), seed + 2));
  const auto rb = RoundTo(dt, Random(Count(bd), seed + 3));
  const auto ref = RefMatMul(ra, ad, rb, bd, &dims);
  auto out2 = RunOk("MatMul", {Make(dt, ad, ra), Make(dt, bd, rb)}, {});
  ExpectNear(ref, out2[0], dt == DType::kFloat16 ? 1e-3 : 8e-3, 1e-3, what + " 16-bit reals");
}

TEST(CpuMatMul, SixteenBitEqualsFloat32RoundedOnce) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    ExpectSixteenBitMatMul(dt, {3, 7, 20}, {20, 9}, 11, "MatMul");
  }
}

// Attention's batched per-head products ([2, 4, 28, 16] x [2, 4, 16, 28],
// and a broadcast B), which small_gemm.h takes on AVX-512: the same checks.
TEST(CpuMatMul, BatchedSixteenBitProductsEqualFloat32RoundedOnce) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    ExpectSixteenBitMatMul(dt, {2, 4, 28, 16}, {2, 4, 16, 28}, 21, "batched MatMul");
    ExpectSixteenBitMatMul(dt, {2, 4, 28, 28}, {2, 4, 28, 16}, 21, "batched MatMul");
    ExpectSixteenBitMatMul(dt, {3, 5, 33}, {1, 33, 47}, 21, "batched MatMul");
  }
}

// K = 4096 ones: float16 accumulation would stop at 2048; float32 gives 4096.
TEST(CpuMatMul, Float16AccumulatesInFloat32) {
  const int64_t k = 4096;
  std::vector<double> ones(k, 1.0);
  auto out = RunOk("MatMul", {Make(DType::kFloat16, {1, k}, ones), Make(DType::kFloat16, {k, 2},
                                                                          std::vector<double>(2 * k, 1.0))},
                   {});
  ASSERT_EQ(out[0].dtype(), DType::kFloat16);
  EXPECT_EQ(out[0].GetDouble(0), 4096.0);
  EXPECT_EQ(out[0].GetDouble(1), 4096.0);
}

// ---- Gemm ---------------------------------------------------------------------

TEST(CpuGemm, AttributesAndBiasBroadcast) {
  const int64_t m = 5, k = 7, n = 6;
  struct Case {
    bool ta, tb;
    float alpha, beta;
    std::vector<int64_t> c_dims;  // {-1}: no C
  };
  const std::vector<Case> cases = {{false, false, 1, 1, {m, n}}, {true, false, 0.5f, 2, {n}},
                                   {false, true, 1, 1, {m, 1}},   {true, true, -1.5f, 0.25f, {1}},
                                   {false, false, 1, 1, {}},      {false, true, 2, 1, {-1}},
                                   {true, false, 1, 0, {m, n}},   {false, false, 1, 1, {1, n}}};
  unsigned seed = 100;
  for (const Case& c : cases) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const std::vector<int64_t> ad = c.ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
      const std::vector<int64_t> bd = c.tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
      const bool has_c = c.c_dims != std::vector<int64_t>{-1};
      const bool exact = dt == DType::kFloat16 || dt == DType::kBFloat16;
      const auto a = Random(Count(ad), seed++, exact), b = Random(Count(bd), seed++, exact);
      const auto cv = has_c ? Random(Count(c.c_dims), seed++, exact) : std::vector<double>{};
      std::vector<double> expected(m * n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t t = 0; t < k; ++t)
            s += (c.ta ? a[t * m + i] : a[i * k + t]) * (c.tb ? b[j * k + t] : b[t * n + j]);
          double cval = 0;
          if (has_c) {
            const auto& cd = c.c_dims;
            const int64_t rows = cd.size() == 2 ? cd[0] : 1, cols = cd.empty() ? 1 : cd.back();
            cval = cv[(rows == 1 ? 0 : i * cols) + (cols == 1 ? 0 : j)];
          }
          expected[i * n + j] = c.alpha * s + c.beta * cval;
        }
      std::vector<Tensor> inputs = {Make(dt, ad, a), Make(dt, bd, b)};
      if (has_c) inputs.push_back(Make(dt, c.c_dims, cv));
      auto out = RunOk("Gemm", inputs,
                       {Attribute::Int("transA", c.ta), Attribute::Int("transB", c.tb),
                        Attribute::Float("alpha", c.alpha), Attribute::Float("beta", c.beta)});
      ASSERT_EQ(out.size(), 1u);
      ASSERT_EQ(out[0].dims(), (std::vector<int64_t>{m, n}));
      if (exact) {
        ExpectNear(RoundTo(dt, expected), out[0], 0, 0, "Gemm 16-bit");
      } else {
        ExpectNear(expected, out[0], 1e-5, 1e-5, "Gemm");
      }
    }
  }
}

// ---- Conv -------------------------------------------------------------------

struct ConvSpec {
  std::vector<int64_t> x_dims, w_dims;
  int64_t group = 1;
  std::vector<int64_t> strides, dilations, pads;
  std::string auto_pad = "NOTSET";
  bool bias = false;
};

// Direct convolution in float64; fills out_dims.
std::vector<double> RefConv(const ConvSpec& s, const std::vector<double>& x,
                            const std::vector<double>& w, const std::vector<double>& bias,
                            std::vector<int64_t>* out_dims) {
  const size_t nd = s.x_dims.size() - 2;
  std::vector<int64_t> in(s.x_dims.begin() + 2, s.x_dims.end()), ker(s.w_dims.begin() + 2, s.w_dims.end());
  std::vector<int64_t> st = s.strides.empty() ? std::vector<int64_t>(nd, 1) : s.strides;
  std::vector<int64_t> dl = s.dilations.empty() ? std::vector<int64_t>(nd, 1) : s.dilations;
  std::vector<int64_t> pads = s.pads.empty() ? std::vector<int64_t>(2 * nd, 0) : s.pads;
  std::vector<int64_t> out(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t win = (ker[d] - 1) * dl[d] + 1;
    if (s.auto_pad == "SAME_UPPER" || s.auto_pad == "SAME_LOWER") {
      const int64_t o = (in[d] + st[d] - 1) / st[d];
      const int64_t total = std::max<int64_t>(0, (o - 1) * st[d] + win - in[d]);
      pads[d] = s.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pads[d + nd] = total - pads[d];
    } else if (s.auto_pad == "VALID") {
      pads[d] = pads[d + nd] = 0;
    }
    out[d] = (in[d] + pads[d] + pads[d + nd] - win) / st[d] + 1;
  }
  const int64_t n = s.x_dims[0], c = s.x_dims[1], m = s.w_dims[0];
  const int64_t cg = c / s.group, mg = m / s.group;
  *out_dims = {n, m};
  out_dims->insert(out_dims->end(), out.begin(), out.end());
  const int64_t osz = Count(out), isz = Count(in), ksz = Count(ker);
  std::vector<double> y(static_cast<size_t>(n * m * osz));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t q = 0; q < osz; ++q) {
        const auto o = Unravel(q, out);
        const int64_t g = oc / mg;
        double sum = bias.empty() ? 0.0 : bias[oc];
        for (int64_t ic = 0; ic < cg; ++ic)
          for (int64_t kq = 0; kq < ksz; ++kq) {
            const auto kk = Unravel(kq, ker);
            int64_t off = 0;
            bool inside = true;
            for (size_t d = 0; d < nd; ++d) {
              const int64_t i = o[d] * st[d] - pads[d] + kk[d] * dl[d];
              if (i < 0 || i >= in[d]) inside = false;
              off = off * in[d] + i;
            }
            if (!inside) continue;
            sum += x[(b * c + g * cg + ic) * isz + off] * w[(oc * cg + ic) * ksz + kq];
          }
        y[(b * m + oc) * osz + q] = sum;
      }
  return y;
}

std::vector<Attribute> ConvAttrs(const ConvSpec& s) {
  std::vector<Attribute> attrs = {Attribute::Int("group", s.group)};
  if (!s.strides.empty()) attrs.push_back(Attribute::Ints("strides", s.strides));
  if (!s.dilations.empty()) attrs.push_back(Attribute::Ints("dilations", s.dilations));
  if (!s.pads.empty()) attrs.push_back(Attribute::Ints("pads", s.pads));
  if (s.auto_pad != "NOTSET") attrs.push_back(Attribute::String("auto_pad", s.auto_pad));
  return attrs;
}

void CheckConv(const ConvSpec& s, DType dt, unsigned seed) {
  const bool exact = dt == DType::kFloat16 || dt == DType::kBFloat16;
  const auto x = Random(Count(s.x_dims), seed, exact);
  const auto w = Random(Count(s.w_dims), seed + 1, exact);
  const auto b = s.bias ? Random(s.w_dims[0], seed + 2, exact) : std::vector<double>{};
  std::vector<int64_t> dims;
  const auto expected = RefConv(s, x, w, b, &dims);
  std::vector<Tensor> inputs = {Make(dt, s.x_dims, x), Make(dt, s.w_dims, w)};
  if (s.bias) inputs.push_back(Make(dt, {s.w_dims[0]}, b));
  auto out = RunOk("Conv", inputs, ConvAttrs(s), 22);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dims(), dims);
  if (exact) {
    ExpectNear(RoundTo(dt, expected), out[0], 0, 0, "Conv 16-bit");
  } else {
    ExpectNear(expected, out[0], 1e-5, 1e-5, "Conv");
  }
}

const std::vector<ConvSpec>& ConvSpecs() {
  static const std::vector<ConvSpec> specs = {
      // 2-D basics, padded / strided / dilated / grouped, bias.
      {{2, 3, 7, 6}, {4, 3, 3, 3}, 1, {}, {}, {}, "NOTSET", true},
      {{2, 4, 9, 8}, {6, 2, 3, 2}, 2, {2, 1}, {1, 2}, {1, 0, 2, 1}, "NOTSET", true},
      {{1, 6, 10, 10}, {6, 1, 3, 3}, 6, {1, 1}, {2, 2}, {2, 2, 2, 2}, "NOTSET", false},  // depthwise
      {{2, 3, 8, 7}, {5, 3, 3, 3}, 1, {2, 2}, {}, {}, "SAME_UPPER", true},
      {{2, 3, 8, 7}, {5, 3, 2, 4}, 1, {3, 2}, {}, {}, "SAME_LOWER", false},
      {{2, 3, 8, 7}, {5, 3, 3, 3}, 1, {2, 2}, {}, {}, "VALID", true},
      // 1-D and 3-D.
      {{3, 2, 17}, {4, 2, 5}, 1, {2}, {2}, {3, 1}, "NOTSET", true},
      {{2, 4, 5, 6, 7}, {6, 2, 3, 2, 3}, 2, {1, 2, 1}, {1, 1, 2}, {1, 0, 1, 1, 1, 0}, "NOTSET", true},
      // Larger per-image GEMMs and the sample CNN shape.
      {{3, 8, 20, 20}, {16, 8, 3, 3}, 1, {}, {}, {1, 1, 1, 1}, "NOTSET", true},
      {{4, 1, 28, 28}, {32, 1, 3, 3}, 1, {}, {}, {}, "NOTSET", true},
      // Pointwise (1x1, stride 1, no pads: X is the column matrix), also
      // grouped; a 1x1 with stride 2 (one phase plane of four read) and one
      // with pads take the padded grid.
      {{3, 8, 5, 6}, {4, 8, 1, 1}, 1, {}, {}, {}, "NOTSET", true},
      {{2, 6, 4, 5}, {6, 3, 1, 1}, 2, {}, {}, {}, "NOTSET", true},
      {{2, 6, 7, 5}, {4, 6, 1, 1}, 1, {2, 2}, {}, {}, "NOTSET", false},
      {{2, 3, 4, 5}, {4, 3, 1, 1}, 1, {}, {}, {1, 0, 0, 1}, "NOTSET", true},
      // 2-D stride 1 (one plane per channel on the padded grid): grouped,
      // dilated, uneven pads.
      {{2, 4, 9, 8}, {6, 2, 3, 2}, 2, {1, 1}, {1, 2}, {1, 0, 2, 1}, "NOTSET", true},
      // Few output positions per image (the images' columns side by side in
      // one GEMM): a 3x3 conv on 1x1 images, a grouped strided one down to
      // 2x2, a pointwise one on 2x3, and more images than one GEMM takes.
      {{3, 6, 1, 1}, {4, 6, 3, 3}, 1, {}, {}, {1, 1, 1, 1}, "NOTSET", true},
      {{2, 4, 3, 4}, {6, 2, 3, 3}, 2, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", false},
      {{3, 5, 2, 3}, {7, 5, 1, 1}, 1, {}, {}, {}, "NOTSET", true},
      {{300, 3, 1, 2}, {2, 3, 3, 3}, 1, {}, {}, {1, 1, 1, 1}, "NOTSET", true},
      // One image, one group: tasks run one at a time, the work split across
      // threads (unit and strided grids).
      {{1, 3, 12, 11}, {5, 3, 3, 3}, 1, {}, {}, {1, 1, 1, 1}, "NOTSET", true},
      {{1, 3, 12, 11}, {5, 3, 3, 3}, 1, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", true},
      // Larger images (unit and strided grids).
      {{2, 8, 48, 48}, {4, 8, 3, 3}, 1, {}, {}, {1, 1, 1, 1}, "NOTSET", true},
      {{2, 8, 100, 100}, {4, 8, 3, 3}, 1, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", true},
  };
  return specs;
}

// On every instruction set of grid_conv.h's products (the portable one
// means the column path for 2-D convs: UseGridProducts).
TEST(CpuConv, MatchesDirectConvolution) {
  for (cpu::GridIsa isa : {cpu::GridIsa::kPortable, cpu::GridIsa::kAvx2, cpu::GridIsa::kAvx512}) {
    if (!cpu::GridIsaSupported(isa)) continue;
    const cpu::GridIsa isa_before = cpu::SetGridIsaForTesting(isa);
    SCOPED_TRACE(cpu::GridIsaName(isa));
    unsigned seed = 200;
    for (const ConvSpec& s : ConvSpecs()) {
      SCOPED_TRACE(::testing::Message() << "X rank " << s.x_dims.size() << " group " << s.group
                                        << " auto_pad " << s.auto_pad);
      CheckConv(s, DType::kFloat32, seed);
      CheckConv(s, DType::kFloat64, seed);
      seed += 3;
    }
    cpu::SetGridIsaForTesting(isa_before);
  }
}

// A padded 3x3 kernel on 1x1 images reads X only at its centre: the other
// taps are dropped from the few-position columns while W is finite there,
// and kept when an Inf sits at one (Inf times the padding's zero is NaN, as
// float64's per-image GEMM gives).
TEST(CpuConv, FewPositionsKeepTheDeadTapsOfNonFiniteWeights) {
  const std::vector<Attribute> attrs = {Attribute::Ints("pads", {1, 1, 1, 1})};
  std::vector<double> x = Random(5 * 3, 61), w = Random(2 * 3 * 9, 62);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dt));
    for (bool inf_at_dead_tap : {false, true}) {
      std::vector<double> wv = w;
      if (inf_at_dead_tap) wv[9 + 0] = std::numeric_limits<double>::infinity();  // (0, 1, tap 0)
      const Tensor xt = Make(dt, {5, 3, 1, 1}, x), wt = Make(dt, {2, 3, 3, 3}, wv);
      const std::vector<double> got = Values(RunOk("Conv", {xt, wt}, attrs, 22)[0]);
      const std::vector<double> xs = Values(xt), ws = Values(wt);
      ASSERT_EQ(got.size(), 10u);
      for (int64_t n = 0; n < 5; ++n) {
        for (int64_t m = 0; m < 2; ++m) {
          double want = 0;  // the centre taps alone
          for (int64_t c = 0; c < 3; ++c) want += xs[n * 3 + c] * ws[(m * 3 + c) * 9 + 4];
          if (inf_at_dead_tap && m == 0) {
            EXPECT_TRUE(std::isnan(got[n * 2 + m])) << n << "," << m;
          } else {
            EXPECT_NEAR(got[n * 2 + m], want, 0.02 * (1 + std::fabs(want))) << n << "," << m;
          }
        }
      }
    }
  }
}

TEST(CpuConv, SixteenBitEqualsFloat32RoundedOnce) {
  unsigned seed = 300;
  for (const ConvSpec& s : ConvSpecs()) {
    CheckConv(s, DType::kFloat16, seed);
    CheckConv(s, DType::kBFloat16, seed);
    seed += 3;
  }
}

// ---- ConvTranspose --------------------------------------------------------------

struct ConvTSpec {
  std::vector<int64_t> x_dims, w_dims;
  int64_t group = 1;
  std::vector<int64_t> strides, dilations, pads, output_padding, output_shape;
  std::string auto_pad = "NOTSET";
  bool bias = false;
};

// Direct scatter: every input element adds x * w into the output positions
// its kernel touches, on a full (unpadded) canvas that is then cropped.
std::vector<double> RefConvTranspose(const ConvTSpec& s, const std::vector<double>& x,
                                     const std::vector<double>& w, const std::vector<double>& bias,
                                     std::vector<int64_t>* out_dims) {
  const size_t nd = s.x_dims.size() - 2;
  std::vector<int64_t> in(s.x_dims.begin() + 2, s.x_dims.end()), ker(s.w_dims.begin() + 2, s.w_dims.end());
  auto or_fill = [&](const std::vector<int64_t>& v, size_t n, int64_t f) {
    return v.empty() ? std::vector<int64_t>(n, f) : v;
  };
  const auto st = or_fill(s.strides, nd, 1), dl = or_fill(s.dilations, nd, 1);
  const auto op = or_fill(s.output_padding, nd, 0);
  auto pads = or_fill(s.pads, 2 * nd, 0);
  std::vector<int64_t> out(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t full = st[d] * (in[d] - 1) + op[d] + (ker[d] - 1) * dl[d] + 1;
    if (!s.output_shape.empty() || s.auto_pad != "NOTSET") {
      const int64_t target = !s.output_shape.empty() ? s.output_shape[d] : in[d] * st[d];
      const int64_t total = full - target;
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor
      if (s.auto_pad == "SAME_UPPER") {
        pads[d] = half;
        pads[d + nd] = total - half;
      } else {
        pads[d + nd] = half;
        pads[d] = total - half;
      }
      out[d] = target;
    } else {
      out[d] = full - pads[d] - pads[d + nd];
    }
  }
  const int64_t n = s.x_dims[0], c = s.x_dims[1], mg = s.w_dims[1], m = mg * s.group;
  const int64_t cg = c / s.group;
  *out_dims = {n, m};
  out_dims->insert(out_dims->end(), out.begin(), out.end());
  const int64_t osz = Count(out), isz = Count(in), ksz = Count(ker);
  std::vector<double> y(static_cast<size_t>(n * m * osz));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t q = 0; q < osz; ++q) y[(b * m + oc) * osz + q] = bias.empty() ? 0 : bias[oc];
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t iq = 0; iq < isz; ++iq) {
        const auto i = Unravel(iq, in);
        const int64_t g = ic / cg;
        for (int64_t om = 0; om < mg; ++om)
          for (int64_t kq = 0; kq < ksz; ++kq) {
            const auto kk = Unravel(kq, ker);
            int64_t off = 0;
            bool inside = true;
            for (size_t d = 0; d < nd; ++d) {
              const int64_t o = i[d] * st[d] + kk[d] * dl[d] - pads[d];
              if (o < 0 || o >= out[d]) inside = false;
              off = off * out[d] + o;
            }
            if (!inside) continue;
            y[(b * m + g * mg + om) * osz + off] +=
                x[(b * c + ic) * isz + iq] * w[(ic * mg + om) * ksz + kq];
          }
      }
  return y;
}

TEST(CpuConvTranspose, MatchesDirectScatter) {
  const std::vector<ConvTSpec> specs = {
      {{1, 2, 3, 3}, {2, 3, 3, 3}, 1, {}, {}, {}, {}, {}, "NOTSET", false},
      {{2, 4, 4, 5}, {4, 2, 3, 2}, 2, {2, 3}, {1, 2}, {1, 0, 0, 2}, {1, 1}, {}, "NOTSET", true},
      {{1, 3, 3, 3}, {3, 2, 3, 3}, 1, {3, 2}, {}, {}, {}, {10, 8}, "NOTSET", false},
      {{1, 3, 3, 3}, {3, 2, 3, 3}, 1, {3, 2}, {}, {}, {1, 1}, {}, "NOTSET", true},
      {{2, 2, 4, 3}, {2, 3, 3, 3}, 1, {2, 2}, {}, {}, {}, {}, "SAME_UPPER", true},
      {{2, 2, 4, 3}, {2, 3, 2, 3}, 1, {2, 2}, {}, {}, {}, {}, "SAME_LOWER", false},
      {{2, 3, 7}, {3, 2, 4}, 1, {3}, {2}, {1, 2}, {2}, {}, "NOTSET", true},
      {{1, 2, 3, 4, 3}, {2, 2, 2, 3, 2}, 2, {2, 1, 2}, {1, 2, 1}, {0, 1, 0, 1, 0, 1}, {}, {}, "NOTSET", true},
      {{2, 16, 9, 9}, {16, 16, 3, 3}, 1, {2, 2}, {}, {1, 1, 1, 1}, {1, 1}, {}, "NOTSET", true},
  };
  unsigned seed = 400;
  for (const ConvTSpec& s : specs) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16}) {
      const bool exact = dt == DType::kFloat16;
      const auto x = Random(Count(s.x_dims), seed, exact), w = Random(Count(s.w_dims), seed + 1, exact);
      const auto b = s.bias ? Random(s.w_dims[1] * s.group, seed + 2, exact) : std::vector<double>{};
      std::vector<int64_t> dims;
      const auto expected = RefConvTranspose(s, x, w, b, &dims);
      std::vector<Tensor> inputs = {Make(dt, s.x_dims, x), Make(dt, s.w_dims, w)};
      if (s.bias) inputs.push_back(Make(dt, {s.w_dims[1] * s.group}, b));
      std::vector<Attribute> attrs = {Attribute::Int("group", s.group)};
      if (!s.strides.empty()) attrs.push_back(Attribute::Ints("strides", s.strides));
      if (!s.dilations.empty()) attrs.push_back(Attribute::Ints("dilations", s.dilations));
      if (!s.pads.empty()) attrs.push_back(Attribute::Ints("pads", s.pads));
      if (!s.output_padding.empty()) attrs.push_back(Attribute::Ints("output_padding", s.output_padding));
      if (!s.output_shape.empty()) attrs.push_back(Attribute::Ints("output_shape", s.output_shape));
      if (s.auto_pad != "NOTSET") attrs.push_back(Attribute::String("auto_pad", s.auto_pad));
      auto out = RunOk("ConvTranspose", inputs, attrs, 17);
      ASSERT_EQ(out.size(), 1u);
      ASSERT_EQ(out[0].dims(), dims);
      if (exact) {
        ExpectNear(RoundTo(dt, expected), out[0], 0, 0, "ConvTranspose 16-bit");
      } else {
        ExpectNear(expected, out[0], 1e-5, 1e-5, "ConvTranspose");
      }
    }
    seed += 3;
  }
}

TEST(CpuConv, ErrorsNameTheProblem) {
  // Channel mismatch between X and W (bypassing inference with unknown shapes
  // is not possible here, so use group to make it inconsistent at run time).
  SingleNode node("Conv", {Make(DType::kFloat32, {1, 3, 5, 5}, Random(75, 1)),
                           Make(DType::kFloat32, {2, 3, 3, 3}, Random(54, 2))},
                  {Attribute::Int("group", 3)}, 17);
  absl::StatusOr<std::vector<Tensor>> out = node.Run(Cpu());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(std::string(out.status().message()).find("Conv"), std::string::npos)
      << out.status();
}

// ---- Conformance cases -------------------------------------------------------

TEST(CpuMatMulConvConformance, AllCasesPass) {
  const ConformanceSummary summary =
      RunConformanceCasesOf(Cpu(), {"MatMul", "Gemm", "Conv", "ConvTranspose"});
  if (summary.ran() == 0) GTEST_SKIP() << "no conformance data under " << CASTOR_SHARED_DIR;
  for (const std::string& failure : summary.failures) ADD_FAILURE() << failure;
  std::printf("conformance (MatMul/Gemm/Conv/ConvTranspose): %d of %d pass\n", summary.passed,
              summary.ran());
  EXPECT_GE(summary.ran(), 25);
}

// Timing (not a pass/fail check): the sample CNN's first conv, batch 128,
// calling the kernel directly (no host copies or output allocation).
TEST(CpuConvTiming, SampleCnnFirstLayer) {
  const std::vector<int64_t> xd = {128, 1, 28, 28}, wd = {32, 1, 3, 3};
  std::vector<Tensor> inputs = {Make(DType::kFloat32, xd, Random(Count(xd), 5)),
                                Make(DType::kFloat32, wd, Random(Count(wd), 6)),
                                Make(DType::kFloat32, {32}, Random(32, 7))};
  SingleNode node("Conv", inputs, {}, 17);
  ASSERT_TRUE(node.status().ok());
  std::vector<TensorView> views;
  for (Tensor& t : inputs) views.push_back({t.raw(), t.dtype(), t.dims()});
  std::vector<const TensorView*> ptrs;
  for (const TensorView& v : views) ptrs.push_back(&v);
  absl::StatusOr<const KernelDef*> kernel = Cpu().kernels().Find(node.node());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  testing::HostOutputAllocator allocator;
  auto run_once = [&] {
    KernelContext ctx(node.node(), 17, Cpu(), ptrs, allocator);
    return (*kernel)->run(ctx);
  };
  ASSERT_TRUE(run_once().ok());
  const int reps = 50;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) ASSERT_TRUE(run_once().ok());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / reps;
  std::printf("Conv [128,1,28,28] * [32,1,3,3] + bias, float32 kernel: %.3f ms (%d threads)\n", ms,
              Cpu().num_threads());
}

}  // namespace
}  // namespace castor
