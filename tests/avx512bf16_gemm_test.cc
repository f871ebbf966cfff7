// The AVX512-BF16 bfloat16 GEMM of backend/cpu/avx512bf16_gemm.h against
// two independent references: a scalar model of VDPBF16PS (per k pair the
// odd product, then the even one, each fused into the float32 accumulator
// with one round-to-nearest-even; subnormal inputs as zero, underflowing
// sums flushed), which it must match bit for bit, and the widened sgemm
// path (GemmFloat32Accumulate with the native kernels off), which it must
// match to float32 rounding of the sum's magnitude. Every transpose
// combination, sizes that leave partial panels in M, N and K (1 x 1, k = 1,
// odd K), row strides wider than the rows, alpha and beta (beta == 0 must
// not read C), large K and K cut into packed panels, subnormal, Inf, NaN
// and -0 inputs, GEMMs split across threads (the same bits for any thread
// count) and run inside a ParallelFor, the bfloat16-output variant, the
// dispatch in gemm.h and CASTOR_AVX512BF16=off in `castor --version`.
// On a CPU without AVX512-BF16 each test says so and skips.
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/grid_conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "graph/half.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace castor::cpu {
namespace {

#define SKIP_WITHOUT_AVX512BF16()                                                        \
  if (!Avx512Bf16Supported()) {                                                          \
    GTEST_SKIP() << "no AVX512-BF16 here (CPU flags or the OS's ZMM state): the "         \
                    "bfloat16 GEMM stays on the widened sgemm path (or AMX)";             \
  }

// AMX off and VDPBF16PS forced on or off for the scope.
using ScopedKernels = ScopedAvx512Bf16OnlyForTesting;

// Restores the thread count a test changed.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : before_(NumThreads()) { SetNumThreads(threads); }
  ~ScopedThreads() { SetNumThreads(before_); }

 private:
  int before_;
};

uint16_t Bits(float f) { return FloatToBFloat16Bits(f); }
float Value(uint16_t bits) { return BFloat16BitsToFloat(bits); }

// Subnormals (inputs) and underflowing results count as zero, sign kept.
float FlushSubnormal(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

// VDPBF16PS on one lane, from Intel's pseudocode (and measured on Zen 4):
// the odd product first, each fused into the accumulator and rounded once.
float DotPairStep(float acc, uint16_t a_even, uint16_t a_odd, uint16_t b_even, uint16_t b_odd) {
  acc = FlushSubnormal(std::fma(FlushSubnormal(Value(a_odd)), FlushSubnormal(Value(b_odd)),
                                FlushSubnormal(acc)));
  return FlushSubnormal(
      std::fma(FlushSubnormal(Value(a_even)), FlushSubnormal(Value(b_even)), acc));
}

struct Case {
  int64_t m, n, k;
  bool trans_a, trans_b;
  float alpha, beta;
};

std::string Describe(const Case& c) {
  return "m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
         (c.trans_a ? " A^T" : "") + (c.trans_b ? " B^T" : "") + " alpha " +
         std::to_string(c.alpha) + " beta " + std::to_string(c.beta);
}

// Operands of a case as stored, with row strides 3 wider than the rows
// (the padding holds NaN: it must never be read), and C.
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<uint16_t> a, b;
  std::vector<float> c;
  uint16_t A(const Case& s, int64_t i, int64_t kk) const {
    return s.trans_a ? a[kk * lda + i] : a[i * lda + kk];
  }
  uint16_t B(const Case& s, int64_t kk, int64_t j) const {
    return s.trans_b ? b[j * ldb + kk] : b[kk * ldb + j];
  }
};

// `values`: a source of bfloat16 bit patterns (random ones by default).
template <typename Values>
Operands MakeOperands(const Case& s, std::mt19937& rng, Values values) {
  Operands o;
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  o.lda = a_cols + 3;
  o.ldb = b_cols + 3;
  o.ldc = s.n + 3;
  o.a.assign(static_cast<size_t>(std::max<int64_t>(1, a_rows * o.lda)), 0x7fc1);
  o.b.assign(static_cast<size_t>(std::max<int64_t>(1, b_rows * o.ldb)), 0x7fc1);
  for (int64_t r = 0; r < a_rows; ++r) {
    for (int64_t q = 0; q < a_cols; ++q) o.a[r * o.lda + q] = values(rng);
  }
  for (int64_t r = 0; r < b_rows; ++r) {
    for (int64_t q = 0; q < b_cols; ++q) o.b[r * o.ldb + q] = values(rng);
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  o.c.resize(static_cast<size_t>(s.m * o.ldc));
  for (float& x : o.c) {
    // beta == 0: C must not be read, so NaN there must not reach the result.
    x = s.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  }
  return o;
}

// A random bfloat16 in [-1, 1] (a normal number or zero).
uint16_t RandomValue(std::mt19937& rng) {
  static std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  float f = dist(rng);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);  // truncation: still in [-1, 1]
}

// The scalar model of the kernel: C(i, j) summed over k pairs in order,
// alpha (and beta, then 1 for later panels) applied per K panel of
// `panel` values, without FMA contraction (the build has none).
std::vector<float> Modelled(const Case& s, const Operands& o, int64_t panel) {
  std::vector<float> c = o.c;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      float& out = c[i * o.ldc + j];
      if (s.k == 0) {
        out = s.beta == 0.0f ? 0.0f : s.beta * out;
        continue;
      }
      for (int64_t k0 = 0; k0 < s.k; k0 += panel) {
        const int64_t k1 = std::min(s.k, k0 + panel);
        float acc = 0.0f;
        for (int64_t kk = k0; kk < k1; kk += 2) {
          const bool odd = kk + 1 < k1;
          acc = DotPairStep(acc, o.A(s, i, kk), odd ? o.A(s, i, kk + 1) : 0, o.B(s, kk, j),
                            odd ? o.B(s, kk + 1, j) : 0);
        }
        const float beta = k0 == 0 ? s.beta : 1.0f;
        out = beta == 0.0f ? s.alpha * acc : s.alpha * acc + beta * out;
      }
    }
  }
  return c;
}

// Same bits (NaN: any NaN), C's padding included.
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want, int64_t ldc,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t e = 0; e < got.size(); ++e) {
    if (std::isnan(want[e])) {
      ASSERT_TRUE(std::isnan(got[e])) << what << " C(" << e / ldc << ", " << e % ldc << ") = "
                                      << got[e] << ", want NaN";
      continue;
    }
    uint32_t g, w;
    std::memcpy(&g, &got[e], 4);
    std::memcpy(&w, &want[e], 4);
    ASSERT_EQ(g, w) << what << " C(" << e / ldc << ", " << e % ldc << ") = " << got[e]
                    << ", want " << want[e];
  }
}

void RunKernel(const Case& s, Operands& o) {
  Avx512Bf16Gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha, o.a.data(), o.lda, o.b.data(),
                 o.ldb, s.beta, o.c.data(), o.ldc);
}

// The widened sgemm path (the reference), with the native kernels off.
std::vector<float> Widened(const Case& s, const Operands& o) {
  const ScopedKernels kernels(false);
  std::vector<float> c = o.c;
  GemmFloat32Accumulate(DType::kBFloat16, s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha,
                        o.a.data(), o.lda, o.b.data(), o.ldb, s.beta, c.data(), o.ldc);
  return c;
}

// Within float32 rounding of the sum's magnitude of the widened path: each
// side's float32 sum of k products is within k units of roundoff of the
// exact one (and beta * C adds one more rounding). Inf and NaN where the
// widened path has them, except that a subnormal times an infinity is NaN
// here (the subnormal counts as zero) and Inf there.
void ExpectNearWidened(const Case& s, const Operands& o, const std::vector<float>& got) {
  const std::vector<float> want = Widened(s, o);
  const double unit = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t e = i * o.ldc + j;
      bool subnormal_times_inf = false;
      for (int64_t kk = 0; kk < s.k; ++kk) {
        const float x = Value(o.A(s, i, kk)), y = Value(o.B(s, kk, j));
        subnormal_times_inf |= (std::fpclassify(x) == FP_SUBNORMAL && std::isinf(y)) ||
                               (std::isinf(x) && std::fpclassify(y) == FP_SUBNORMAL);
      }
      if (subnormal_times_inf && std::isnan(got[e])) continue;
      if (!std::isfinite(want[e]) || !std::isfinite(got[e])) {
        ASSERT_TRUE(std::isnan(got[e]) ? std::isnan(want[e]) : got[e] == want[e])
            << "C(" << i << ", " << j << ") = " << got[e] << ", widened " << want[e];
        continue;
      }
      double magnitude = 0.0;
      for (int64_t kk = 0; kk < s.k; ++kk) {
        magnitude += std::fabs(static_cast<double>(Value(o.A(s, i, kk))) * Value(o.B(s, kk, j)));
      }
      magnitude *= std::fabs(s.alpha);
      if (s.beta != 0.0f) magnitude += std::fabs(s.beta * o.c[e]);
      ASSERT_NEAR(got[e], want[e], 2.0 * (s.k + 2) * unit * magnitude + 1e-36)
          << "C(" << i << ", " << j << ")";
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const int64_t sizes[][3] = {
      {1, 1, 1},    {1, 1, 2},     {3, 5, 1},      // one k pair, half empty
      {17, 33, 45},                                // partial panels everywhere, odd K
      {16, 16, 64}, {17, 15, 63},  {7, 65, 7},     // whole panels, and one past / short
      {5, 70, 3},   {31, 47, 300}, {33, 17, 513},  // K over many pairs
      {128, 512, 64},                              // enough multiply-adds to split
      {45, 28, 16},  {300, 64, 64}, {1030, 64, 28}, // A read in place (even K), row tails
  };
  for (const auto& size : sizes) {
    for (int t = 0; t < 4; ++t) {
      const float beta = t < 2 ? 0.0f : 0.25f;
      cases.push_back(Case{size[0], size[1], size[2], (t & 1) != 0, (t & 2) != 0,
                           t == 3 ? -1.5f : 1.5f, beta});
    }
  }
  return cases;
}

TEST(Avx512Bf16Gemm, MatchesTheInstructionModelBitForBit) {
  SKIP_WITHOUT_AVX512BF16();
  for (const Case& s : Cases()) {
    SCOPED_TRACE(Describe(s));
    std::mt19937 rng(static_cast<unsigned>(s.m * 131 + s.n * 17 + s.k));
    Operands o = MakeOperands(s, rng, RandomValue);
    const std::vector<float> want = Modelled(s, o, s.k);
    RunKernel(s, o);
    ExpectSameBits(o.c, want, o.ldc, "kernel");
    if (HasFatalFailure()) return;
  }
}

TEST(Avx512Bf16Gemm, AgreesWithTheWidenedSgemmPath) {
  SKIP_WITHOUT_AVX512BF16();
  std::vector<Case> cases = Cases();
  cases.push_back(Case{3, 20, 4099, false, true, 1.0f, 0.0f});  // large, odd K
  cases.push_back(Case{40, 9, 2048, true, false, 0.5f, -2.0f});
  for (const Case& s : cases) {
    SCOPED_TRACE(Describe(s));
    std::mt19937 rng(static_cast<unsigned>(s.m * 7 + s.n * 3 + s.k));
    Operands o = MakeOperands(s, rng, RandomValue);
    const Operands before = o;
    RunKernel(s, o);
    ExpectNearWidened(s, before, o.c);
    if (HasFatalFailure()) return;
  }
}

// Subnormal, Inf, NaN and -0 inputs among ordinary ones: the instruction
// model's bits (subnormal inputs as zero), and the widened path's Inf and
// NaN positions; the finite results near the widened ones.
TEST(Avx512Bf16Gemm, SpecialValuesFollowTheInstructionAndTheWidenedPath) {
  SKIP_WITHOUT_AVX512BF16();
  const uint16_t specials[] = {
      0x0040, 0x8001, 0x007f,  // subnormals (2^-127, -2^-133, the largest)
      0x7f80, 0xff80,          // +-Inf
      0x7fc0, 0xffc1,          // NaN
      0x8000, 0x0000,          // -0, +0
      0x0080,                  // the smallest normal
  };
  auto values = [&](std::mt19937& rng) -> uint16_t {
    const uint32_t pick = rng() % 64;  // about one in six special
    return pick < 10 ? specials[pick] : RandomValue(rng);
  };
  for (const Case& s : {Case{9, 33, 17, false, false, 1.0f, 0.0f},
                        Case{16, 40, 64, true, true, 2.0f, 0.5f},
                        Case{5, 7, 3, false, true, 1.0f, 1.0f}}) {
    SCOPED_TRACE(Describe(s));
    std::mt19937 rng(static_cast<unsigned>(s.m + s.n + s.k));
    Operands o = MakeOperands(s, rng, values);
    const Operands before = o;
    const std::vector<float> want = Modelled(s, o, s.k);
    RunKernel(s, o);
    ExpectSameBits(o.c, want, o.ldc, "kernel");
    if (HasFatalFailure()) return;
    ExpectNearWidened(s, before, o.c);
    if (HasFatalFailure()) return;
  }
  // Infinite products give Inf, and Inf * 0 NaN, where the widened path
  // does (checked above); spelled out for one element each.
  const std::vector<uint16_t> inf_one = {0x7f80, Bits(1.0f)}, zero_one = {0x0000, Bits(1.0f)};
  const std::vector<uint16_t> twos = {Bits(2.0f), Bits(2.0f)};
  float c = 0.0f;
  Avx512Bf16Gemm(false, false, 1, 1, 2, 1.0f, inf_one.data(), 2, twos.data(), 1, 0.0f, &c, 1);
  EXPECT_EQ(c, std::numeric_limits<float>::infinity());
  Avx512Bf16Gemm(false, false, 1, 1, 2, 1.0f, inf_one.data(), 2, zero_one.data(), 1, 0.0f, &c,
                 1);
  EXPECT_TRUE(std::isnan(c));
}

// What the numerics note in avx512bf16_gemm.h says, one element each:
// subnormal inputs count as zero (the widened path keeps them), sums that
// underflow are flushed, and the two products of a k pair are added one
// after the other (odd first), each rounded.
TEST(Avx512Bf16Gemm, SubnormalsAreFlushedAndPairsAddedOneAtATime) {
  SKIP_WITHOUT_AVX512BF16();
  auto one_element = [](std::vector<uint16_t> a, std::vector<uint16_t> b) {
    float c = -1.0f;
    Avx512Bf16Gemm(false, false, 1, 1, static_cast<int64_t>(a.size()), 1.0f, a.data(),
                   static_cast<int64_t>(a.size()), b.data(), 1, 0.0f, &c, 1);
    return c;
  };
  const uint16_t one = Bits(1.0f);
  EXPECT_EQ(one_element({0x0040}, {one}), 0.0f);  // 2^-127 * 1
  // 2^-70 * 2^-70 = 2^-140: a normal product below float32's normal range.
  EXPECT_EQ(one_element({Bits(std::ldexp(1.0f, -70))}, {Bits(std::ldexp(1.0f, -70))}), 0.0f);
  // 1 + 2^-24 + 2^-24: each addition a tie that rounds back to 1 (one
  // rounding of the pair's sum would give 1 + 2^-23).
  const uint16_t tiny = Bits(std::ldexp(1.0f, -24));
  EXPECT_EQ(one_element({one, tiny, tiny}, {one, one, one}), 1.0f);
  // 2^24, then a pair of 1 (even) and -2^24 (odd): the even product first
  // would be lost in the tie (2^24 + 1) and give 0; the odd one first
  // gives 0 + 1.
  const uint16_t big = Bits(std::ldexp(1.0f, 24));
  EXPECT_EQ(one_element({big, 0, one, Bits(-std::ldexp(1.0f, 24))}, {one, one, one, one}),
            1.0f);
  // -0 products sum to +0 (the accumulator starts at +0), as in sgemm.
  const float zero = one_element({0x8000, 0x8000}, {one, one});
  EXPECT_EQ(zero, 0.0f);
  EXPECT_FALSE(std::signbit(zero));
}

// With a small packing limit K is cut into panels (each packed, multiplied
// and added to C in turn): the model's bits with alpha per panel, beta once.
TEST(Avx512Bf16Gemm, KInSeveralPanels) {
  SKIP_WITHOUT_AVX512BF16();
  const int64_t limit = 640;
  const int64_t before = SetAvx512Bf16PanelElementsForTesting(limit);
  for (const Case& s : {Case{31, 47, 300, false, false, 1.5f, 0.25f},
                        Case{17, 20, 201, true, true, -1.0f, 0.0f},
                        Case{5, 9, 513, false, true, 1.0f, 2.0f}}) {
    SCOPED_TRACE(Describe(s));
    // PanelK in avx512bf16_gemm.cc: whole pairs of (padded m + padded n).
    const int64_t padded = (s.m + 15) / 16 * 16 + (s.n + 15) / 16 * 16;
    const int64_t panel = 2 * std::max<int64_t>(1, limit / (2 * padded));
    ASSERT_LT(panel, s.k);
    std::mt19937 rng(static_cast<unsigned>(s.k));
    Operands o = MakeOperands(s, rng, RandomValue);
    const std::vector<float> want = Modelled(s, o, panel);
    RunKernel(s, o);
    ExpectSameBits(o.c, want, o.ldc, "kernel");
    if (HasFatalFailure()) break;
  }
  SetAvx512Bf16PanelElementsForTesting(before);
}

// Every C element is summed in one fixed order: the same bits on 1, 2, 3
// and 5 threads, and for GEMMs each run inside a ParallelFor chunk.
TEST(Avx512Bf16Gemm, SameBitsForAnyThreadCount) {
  SKIP_WITHOUT_AVX512BF16();
  const Case s{200, 300, 96, false, true, 1.0f, 0.0f};
  std::mt19937 rng(3);
  const Operands o = MakeOperands(s, rng, RandomValue);
  std::vector<float> first;
  for (const int threads : {1, 2, 3, 5}) {
    const ScopedThreads scoped(threads);
    Operands run = o;
    RunKernel(s, run);
    if (first.empty()) {
      first = run.c;
      continue;
    }
    ExpectSameBits(run.c, first, o.ldc, std::to_string(threads) + " threads");
  }
  constexpr int kGemms = 6;
  std::vector<Operands> runs(kGemms, o);
  ParallelFor(0, kGemms, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) RunKernel(s, runs[g]);
  });
  for (int g = 0; g < kGemms; ++g) ExpectSameBits(runs[g].c, first, o.ldc, "in a ParallelFor");
}

// Avx512Bf16GemmRounded writes bfloat16 C block by block: the same bits as
// Avx512Bf16Gemm (beta 0) followed by FloatToBFloat16Bits, with C's row
// stride wider than its rows (the elements past each row untouched), with
// K cut into panels (the float32 fallback) and with an empty K (C = 0).
TEST(Avx512Bf16Gemm, RoundedOutputIsTheFloat32ResultRoundedOnce) {
  SKIP_WITHOUT_AVX512BF16();
  auto check = [](Case s) {
    s.beta = 0.0f;
    SCOPED_TRACE(Describe(s));
    std::mt19937 rng(static_cast<unsigned>(s.m * 5 + s.n * 3 + s.k));
    Operands o = MakeOperands(s, rng, RandomValue);
    std::vector<float> wide(static_cast<size_t>(s.m * s.n));
    Avx512Bf16Gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha, o.a.data(), o.lda, o.b.data(),
                   o.ldb, 0.0f, wide.data(), s.n);
    const int64_t ldc = s.n + 5;
    std::vector<uint16_t> rounded(static_cast<size_t>(s.m * ldc), 0xabcd);
    Avx512Bf16GemmRounded(s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha, o.a.data(), o.lda,
                          o.b.data(), o.ldb, rounded.data(), ldc);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const uint16_t want = j < s.n ? FloatToBFloat16Bits(wide[i * s.n + j]) : 0xabcd;
        ASSERT_EQ(rounded[i * ldc + j], want) << "C(" << i << ", " << j << ")";
      }
    }
  };
  for (const Case& s : Cases()) {
    check(s);
    if (HasFatalFailure()) return;
  }
  check(Case{3, 5, 0, false, false, 1.0f, 0.0f});
  const int64_t before = SetAvx512Bf16PanelElementsForTesting(640);
  check(Case{5, 9, 513, false, true, -1.25f, 0.0f});  // K panels: the float32 fallback
  SetAvx512Bf16PanelElementsForTesting(before);
}

// An empty K: C = beta * C, C not read when beta == 0; an empty M or N
// writes nothing.
TEST(Avx512Bf16Gemm, EmptyShapes) {
  SKIP_WITHOUT_AVX512BF16();
  std::vector<float> c = {1.0f, -2.0f, 3.0f, 4.0f};
  Avx512Bf16Gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
  std::vector<float> nan(4, std::numeric_limits<float>::quiet_NaN());
  Avx512Bf16Gemm(true, true, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, nan.data(), 2);
  EXPECT_EQ(nan, std::vector<float>(4, 0.0f));
  Avx512Bf16Gemm(false, false, 0, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, c.data(), 2);
  Avx512Bf16Gemm(false, false, 2, 0, 3, 1.0f, nullptr, 3, nullptr, 0, 0.0f, c.data(), 0);
  EXPECT_EQ(c, (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
}

// gemm.h's GemmFloat32Accumulate and GemmRoundedToDType take the kernel
// for bfloat16 exactly when it is available (and AMX is not): told apart
// by a subnormal input, which VDPBF16PS counts as zero and the widened
// sgemm keeps. float16 never takes it.
TEST(Avx512Bf16Gemm, GemmEntriesTakeItForBFloat16Only) {
  SKIP_WITHOUT_AVX512BF16();
  const std::vector<uint16_t> subnormal(32, 0x0040), one(32, Bits(1.0f));  // 2^-127, 1
  for (const bool enabled : {true, false}) {
    const ScopedKernels kernels(enabled);
    float c = -1.0f;
    GemmFloat32Accumulate(DType::kBFloat16, false, false, 1, 1, 32, 1.0f, subnormal.data(), 32,
                          one.data(), 1, 0.0f, &c, 1);
    EXPECT_EQ(c, enabled ? 0.0f : std::ldexp(1.0f, -122)) << "AVX512-BF16 " << enabled;
    uint16_t c16 = 0xffff;
    GemmRoundedToDType(DType::kBFloat16, false, false, 1, 1, 32, 1.0f, subnormal.data(), 32,
                       one.data(), 1, &c16, 1);
    EXPECT_EQ(c16, enabled ? 0 : Bits(std::ldexp(1.0f, -122))) << "AVX512-BF16 " << enabled;
  }
  const int64_t m = 3, n = 17, k = 40;
  const std::vector<uint16_t> a(m * k, 0x3c00), b(k * n, 0x4000);  // float16 1 and 2
  std::vector<float> on(m * n), off(m * n);
  {
    const ScopedKernels kernels(true);
    GemmFloat32Accumulate(DType::kFloat16, false, false, m, n, k, 1.0f, a.data(), k, b.data(),
                          n, 0.0f, on.data(), n);
  }
  {
    const ScopedKernels kernels(false);
    GemmFloat32Accumulate(DType::kFloat16, false, false, m, n, k, 1.0f, a.data(), k, b.data(),
                          n, 0.0f, off.data(), n);
  }
  EXPECT_EQ(on, off);
  EXPECT_EQ(on, std::vector<float>(m * n, 2.0f * k));
}

// `castor --version` (and the training summary, through DescribeGemm) names
// the kernel where it runs and AMX does not; CASTOR_AVX512BF16=off turns
// it off.
class Avx512Bf16VersionTest : public tools::CliTempDirTest {
 protected:
  Avx512Bf16VersionTest() : CliTempDirTest("avx512bf16") {}
};

TEST_F(Avx512Bf16VersionTest, VersionNamesTheKernelAndTheSwitchTurnsItOff) {
  const bool expected = Avx512Bf16Available() && !AmxBf16Available();
  EXPECT_EQ(DescribeGemm().find("; AVX512-BF16 for bfloat16 GEMMs") != std::string::npos,
            expected);
  const tools::Program version = tools::RunCastor(dir_, "--version");
  ASSERT_EQ(version.exit_code, 0) << version.err;
  // (CASTOR_AVX512BF16 and CASTOR_AMX, if set, reach the binary too.)
  // (and its 2-D convolutions, grid_conv.h, on this CPU's AVX-512)
  const std::string line = UseGridBFloat16Products() ? "; AVX512-BF16 for bfloat16 GEMMs and "
                                                       "convolutions\n"
                                                     : "; AVX512-BF16 for bfloat16 GEMMs\n";
  EXPECT_EQ(version.out.find(line) != std::string::npos, expected) << version.out;
  const tools::Program off =
      tools::RunCastor(dir_, "--version", "env CASTOR_AVX512BF16=off " CASTOR_BINARY);
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_EQ(off.out.find("AVX512-BF16"), std::string::npos) << off.out;
  if (AmxBf16Available()) return;  // DescribeGemm does not ask about AVX512-BF16 then
  const tools::Program bad =
      tools::RunCastor(dir_, "--version", "env CASTOR_AVX512BF16=maybe " CASTOR_BINARY);
  EXPECT_NE(bad.err.find("CASTOR_AVX512BF16=maybe is not on, off or auto; ignored"),
            std::string::npos)
      << bad.err;
  {
    const ScopedKernels kernels(false);
    EXPECT_FALSE(Avx512Bf16Available());
  }
  std::cout << "AVX512-BF16 bfloat16 GEMM: "
            << (Avx512Bf16Supported() ? "supported" : "not supported") << "; " << DescribeGemm()
            << "\n";
}

// The kernel runs where VDPBF16PS outruns float32: its measured rate
// decides unless the switch does. The rate is a real measurement on this
// core (2 on Zen 4, 0.5 on the Xeon of bench/README.md; far from the
// 1.25 threshold either way); CASTOR_AVX512BF16=on runs the kernel
// anyway, and `castor --version` names a slow one.
TEST_F(Avx512Bf16VersionTest, TheMeasuredRateDecidesUnlessTheSwitchDoes) {
  const double rate = Avx512Bf16RateOverFloat32();
  EXPECT_EQ(Avx512Bf16RateOverFloat32(), rate);  // measured once
  if (!Avx512Bf16Supported()) {
    EXPECT_EQ(rate, 0.0);
    EXPECT_FALSE(Avx512Bf16Pays());
    EXPECT_FALSE(Avx512Bf16Available());
    return;
  }
  std::cout << "VDPBF16PS multiply-adds per second over the float32 FMA's: " << rate << "\n";
  EXPECT_GT(rate, 0.1);
  EXPECT_LT(rate, 8.0);
  EXPECT_EQ(Avx512Bf16Pays(), rate >= 1.25);
  const KernelSwitch before = SetAvx512Bf16ForTesting(KernelSwitch::kAuto);
  if (Avx512Bf16Switch() == KernelSwitch::kAuto) {  // CASTOR_AVX512BF16 unset here
    EXPECT_EQ(Avx512Bf16Available(), Avx512Bf16Pays());
  }
  SetAvx512Bf16ForTesting(KernelSwitch::kOn);
  EXPECT_TRUE(Avx512Bf16Available());
  SetAvx512Bf16ForTesting(KernelSwitch::kOff);
  EXPECT_FALSE(Avx512Bf16Available());
  SetAvx512Bf16ForTesting(before);
  if (AmxBf16Available()) return;  // DescribeGemm names AMX's GEMMs then

  const tools::Program on =
      tools::RunCastor(dir_, "--version", "env CASTOR_AVX512BF16=on " CASTOR_BINARY);
  ASSERT_EQ(on.exit_code, 0) << on.err;
  EXPECT_NE(on.out.find("; AVX512-BF16 for bfloat16 GEMMs"), std::string::npos) << on.out;
  const tools::Program automatic =
      tools::RunCastor(dir_, "--version", "env CASTOR_AVX512BF16=auto " CASTOR_BINARY);
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  EXPECT_TRUE(automatic.err.empty()) << automatic.err;
  EXPECT_EQ(automatic.out.find("; AVX512-BF16 for bfloat16 GEMMs") != std::string::npos,
            Avx512Bf16Pays())
      << automatic.out;
  if (Avx512Bf16Pays()) return;
  EXPECT_NE(automatic.out.find("; AVX512-BF16 not used: its dot products run at "),
            std::string::npos)
      << automatic.out;
  EXPECT_NE(on.out.find("; AVX512-BF16 used (CASTOR_AVX512BF16=on): its dot products run at "),
            std::string::npos)
      << on.out;
  EXPECT_NE(automatic.out.find("policy mixed_bfloat16 cannot pay on this CPU: this CPU's "
                               "AVX512-BF16 dot products run at "),
            std::string::npos)
      << automatic.out;
}

}  // namespace
}  // namespace castor::cpu
