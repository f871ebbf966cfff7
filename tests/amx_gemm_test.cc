// The AMX bfloat16 GEMM of backend/cpu/amx_gemm.h against float64 sums of
// the same bfloat16 values: every transpose combination, sizes that leave
// partial tiles in M, N and K, K cut into packed panels, row strides
// wider than the rows, alpha and beta (beta == 0 must not read C), GEMMs
// large enough to split across threads and GEMMs run inside a ParallelFor,
// k == 0; the bfloat16-output variant against the float32 one rounded; and
// gemm.h's GemmFloat32Accumulate taking it for bfloat16 only.
// On a CPU or OS without AMX tiles each test says so and skips.
#include "backend/cpu/amx_gemm.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

#define SKIP_WITHOUT_AMX()                                                                \
  if (!AmxBf16Supported()) {                                                              \
    GTEST_SKIP() << "no AMX-TILE/AMX-BF16 here (CPU flags or the OS's tile-data grant): " \
                    "the bfloat16 GEMM stays on the widened sgemm path";                  \
  }

// Sets AMX on or off for the scope, with the AVX512-BF16 kernel off (CPUs
// with AMX have it too, and gemm.h would take it when AMX is off): "off"
// here means the widened sgemm path.
class ScopedAmx {
 public:
  explicit ScopedAmx(bool enabled)
      : before_(SetAmxForTesting(enabled)),
        avx512bf16_before_(SetAvx512Bf16ForTesting(KernelSwitch::kOff)) {}
  ~ScopedAmx() {
    SetAmxForTesting(before_);
    SetAvx512Bf16ForTesting(avx512bf16_before_);
  }

 private:
  bool before_;
  KernelSwitch avx512bf16_before_;
};

// Random bfloat16 bit patterns in [-1, 1] (normal numbers or zero).
std::vector<uint16_t> RandomBFloat16(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    x = static_cast<uint16_t>(bits >> 16);  // truncation: still in [-1, 1]
  }
  return v;
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

// Runs `gemm` on random operands of case `c` (row strides 3 wider than
// stored rows) and checks every element of C against float64 sums.
template <typename Gemm>
void CheckAgainstFloat64(const Case& c, Gemm gemm) {
  SCOPED_TRACE(Describe(c));
  std::mt19937 rng(static_cast<unsigned>(c.m * 131 + c.n * 17 + c.k));
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = c.n + 3;
  const std::vector<uint16_t> a = RandomBFloat16(a_rows * lda, rng);
  const std::vector<uint16_t> b = RandomBFloat16(b_rows * ldb, rng);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> c_in(static_cast<size_t>(c.m * ldc));
  for (float& x : c_in) {
    // beta == 0: C must not be read, so NaN there must not reach the result.
    x = c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  }
  std::vector<float> out = c_in;
  gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta,
       out.data(), ldc);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = out[i * ldc + j];
      if (j >= c.n) {  // past the row: untouched
        ASSERT_TRUE(std::isnan(got) ? std::isnan(c_in[i * ldc + j]) : got == c_in[i * ldc + j])
            << "C(" << i << ", " << j << ") past the row was written";
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double x = BFloat16BitsToFloat(c.trans_a ? a[kk * lda + i] : a[i * lda + kk]);
        const double y = BFloat16BitsToFloat(c.trans_b ? b[j * ldb + kk] : b[kk * ldb + j]);
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      double want = c.alpha * sum;
      magnitude = std::fabs(c.alpha) * magnitude;
      if (c.beta != 0.0f) {
        want += static_cast<double>(c.beta) * c_in[i * ldc + j];
        magnitude += std::fabs(c.beta * c_in[i * ldc + j]);
      }
      // float32 sums in the tiles' order (per K panel): a few ulps of the
      // magnitude.
      ASSERT_NEAR(got, want, 1e-6 * magnitude + 1e-30) << "C(" << i << ", " << j << ")";
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const int64_t sizes[][3] = {
      {1, 1, 1},      {17, 33, 45},  // partial tiles everywhere
      {5, 70, 3},     {64, 64, 16},  // K under one tile
      {31, 47, 300},                 // K over many tiles, the last partial
      {33, 17, 513},
      {128, 512, 64},                // enough multiply-adds to split across threads
  };
  for (const auto& s : sizes) {
    for (int t = 0; t < 4; ++t) {
      const float beta = t < 2 ? 0.0f : 0.25f;
      cases.push_back(Case{s[0], s[1], s[2], (t & 1) != 0, (t & 2) != 0, 1.5f, beta});
    }
  }
  return cases;
}

TEST(AmxGemm, MatchesFloat64SumsForEveryTransposeAndPartialTile) {
  SKIP_WITHOUT_AMX();
  for (const Case& c : Cases()) {
    CheckAgainstFloat64(c, AmxGemmBf16);
    if (HasFatalFailure()) return;
  }
}

// With a small packing limit K is cut into panels (each packed, multiplied
// and added to C in turn): the same sums, beta applied once.
TEST(AmxGemm, KInSeveralPanelsGivesTheSameSums) {
  SKIP_WITHOUT_AMX();
  const int64_t before = SetAmxPanelElementsForTesting(6 * 512);  // 6 tiles per panel
  for (const Case& c : {Case{31, 47, 300, false, false, 1.5f, 0.25f},   // (2 + 3) tiles: 1 K tile
                        Case{17, 20, 200, true, true, -1.0f, 0.0f},     // (2 + 2) tiles: 1 K tile
                        Case{5, 9, 513, false, true, 1.0f, 2.0f}}) {    // (1 + 1) tiles: 3 K tiles
    CheckAgainstFloat64(c, AmxGemmBf16);
    if (HasFatalFailure()) break;
  }
  SetAmxPanelElementsForTesting(before);
}

// GemmFloat32Accumulate takes AMX for bfloat16 exactly when it is available:
// told apart by a subnormal input, which AMX counts as zero and the widened
// sgemm keeps; and its results are right.
TEST(AmxGemm, GemmFloat32AccumulateRunsBFloat16OnAmxWhenAvailable) {
  SKIP_WITHOUT_AMX();
  {
    const ScopedAmx amx(true);
    if (!AmxBf16Available()) {
      GTEST_SKIP() << "CASTOR_AMX=off in the environment: GemmFloat32Accumulate never takes AMX";
    }
  }
  const std::vector<uint16_t> subnormal(32, 0x0040), one(32, 0x3f80);  // 2^-127, 1
  for (const bool enabled : {true, false}) {
    const ScopedAmx amx(enabled);
    float c = -1.0f;
    GemmFloat32Accumulate(DType::kBFloat16, false, false, 1, 1, 32, 1.0f, subnormal.data(), 32,
                          one.data(), 1, 0.0f, &c, 1);
    EXPECT_EQ(c, enabled ? 0.0f : std::ldexp(1.0f, -122)) << "AMX " << enabled;
  }
  const ScopedAmx amx(true);
  ASSERT_TRUE(AmxBf16Available());
  auto gemm = [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) {
    GemmFloat32Accumulate(DType::kBFloat16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  };
  CheckAgainstFloat64(Case{31, 47, 300, false, true, 1.0f, 0.0f}, gemm);
  CheckAgainstFloat64(Case{128, 512, 64, true, false, -0.5f, 2.0f}, gemm);
}

// Away from subnormals the two paths differ in summation order only. A K of
// 2 with one zero product per row makes the sums exact on both, so they
// must agree bit for bit.
TEST(AmxGemm, AgreesWithTheWidenedPathWhereBothAreExact) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(5);
  const int64_t m = 20, n = 36, k = 2;
  std::vector<uint16_t> a = RandomBFloat16(m * k, rng);
  const std::vector<uint16_t> b = RandomBFloat16(k * n, rng);
  for (int64_t i = 0; i < m; ++i) a[i * k + 1] = 0;  // the second product of each pair is 0
  std::vector<float> on(static_cast<size_t>(m * n)), off(static_cast<size_t>(m * n));
  {
    const ScopedAmx amx(true);
    GemmFloat32Accumulate(DType::kBFloat16, false, false, m, n, k, 1.0f, a.data(), k, b.data(),
                          n, 0.0f, on.data(), n);
  }
  {
    const ScopedAmx amx(false);
    ASSERT_FALSE(AmxBf16Available());
    GemmFloat32Accumulate(DType::kBFloat16, false, false, m, n, k, 1.0f, a.data(), k, b.data(),
                          n, 0.0f, off.data(), n);
  }
  EXPECT_EQ(on, off);
}

// float16 never takes AMX: the same bits with it on and off, and the right
// values (read as bfloat16, float16's 1 would be 2^-7).
TEST(AmxGemm, Float16StaysOnTheWidenedPath) {
  SKIP_WITHOUT_AMX();
  const int64_t m = 3, n = 17, k = 40;
  const std::vector<uint16_t> a(m * k, 0x3c00), b(k * n, 0x4000);  // float16 1 and 2
  std::vector<float> on(m * n), off(m * n);
  {
    const ScopedAmx amx(true);
    GemmFloat32Accumulate(DType::kFloat16, false, false, m, n, k, 1.0f, a.data(), k, b.data(),
                          n, 0.0f, on.data(), n);
  }
  {
    const ScopedAmx amx(false);
    GemmFloat32Accumulate(DType::kFloat16, false, false, m, n, k, 1.0f, a.data(), k, b.data(),
                          n, 0.0f, off.data(), n);
  }
  EXPECT_EQ(on, off);
  EXPECT_EQ(on, std::vector<float>(m * n, 2.0f * k));
}

// TDPBF16PS treats subnormal inputs as zero (amx_gemm.h's numerics note):
// the smallest normal bfloat16 halved, times 1, gives 0 on AMX.
TEST(AmxGemm, SubnormalInputsCountAsZero) {
  SKIP_WITHOUT_AMX();
  const uint16_t subnormal = 0x0040;  // 2^-127: half the smallest normal
  const uint16_t one = 0x3f80;
  const std::vector<uint16_t> a(32, subnormal), b(32, one);
  float c = -1.0f;
  AmxGemmBf16(false, false, 1, 1, 32, 1.0f, a.data(), 32, b.data(), 1, 0.0f, &c, 1);
  EXPECT_EQ(c, 0.0f);
}

// Each ParallelFor chunk runs its own GEMM on its own thread (serially
// there): per-thread tile configuration and scratch.
TEST(AmxGemm, GemmsInsideAParallelForAreEachCorrect) {
  SKIP_WITHOUT_AMX();
  constexpr int64_t kGemms = 8, m = 40, n = 24, k = 70;
  std::mt19937 rng(9);
  std::vector<std::vector<uint16_t>> as, bs;
  for (int64_t g = 0; g < kGemms; ++g) {
    as.push_back(RandomBFloat16(m * k, rng));
    bs.push_back(RandomBFloat16(k * n, rng));
  }
  std::vector<std::vector<float>> outs(kGemms, std::vector<float>(m * n));
  ParallelFor(0, kGemms, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      AmxGemmBf16(false, false, m, n, k, 1.0f, as[g].data(), k, bs[g].data(), n, 0.0f,
                  outs[g].data(), n);
    }
  });
  for (int64_t g = 0; g < kGemms; ++g) {
    std::vector<float> alone(m * n);
    AmxGemmBf16(false, false, m, n, k, 1.0f, as[g].data(), k, bs[g].data(), n, 0.0f,
                alone.data(), n);
    EXPECT_EQ(outs[g], alone) << "GEMM " << g;  // same order of sums: same bits
  }
}

// AmxGemmBf16Rounded writes bfloat16 C block by block: the same bits as
// AmxGemmBf16 (beta 0) followed by FloatToBFloat16Bits, for every case of
// the float64 test, with C's row stride wider than its rows (the elements
// past each row untouched), with K cut into panels (the float32 fallback)
// and with an empty K (C = 0).
TEST(AmxGemm, RoundedOutputIsTheFloat32ResultRoundedOnce) {
  SKIP_WITHOUT_AMX();
  auto check = [](const Case& c) {
    SCOPED_TRACE(Describe(c));
    std::mt19937 rng(static_cast<unsigned>(c.m * 7 + c.n * 3 + c.k));
    const int64_t a_cols = c.trans_a ? c.m : c.k, b_cols = c.trans_b ? c.k : c.n;
    const int64_t a_rows = c.trans_a ? c.k : c.m, b_rows = c.trans_b ? c.n : c.k;
    const std::vector<uint16_t> a = RandomBFloat16(std::max<int64_t>(1, a_rows * a_cols), rng);
    const std::vector<uint16_t> b = RandomBFloat16(std::max<int64_t>(1, b_rows * b_cols), rng);
    std::vector<float> wide(static_cast<size_t>(c.m * c.n));
    AmxGemmBf16(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), a_cols, b.data(), b_cols,
                0.0f, wide.data(), c.n);
    const int64_t ldc = c.n + 5;
    std::vector<uint16_t> rounded(static_cast<size_t>(c.m * ldc), 0xabcd);
    AmxGemmBf16Rounded(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), a_cols, b.data(),
                       b_cols, rounded.data(), ldc);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const uint16_t want = j < c.n ? FloatToBFloat16Bits(wide[i * c.n + j]) : 0xabcd;
        ASSERT_EQ(rounded[i * ldc + j], want) << "C(" << i << ", " << j << ")";
      }
    }
  };
  for (const Case& c : Cases()) {
    check(c);
    if (HasFatalFailure()) return;
  }
  check(Case{3, 5, 0, false, false, 1.0f, 0.0f});
  const int64_t before = SetAmxPanelElementsForTesting(6 * 512);
  // 6 K panels of 3 tiles: the float32 fallback
  check(Case{5, 9, 513, false, true, -1.25f, 0.0f});
  SetAmxPanelElementsForTesting(before);
}

// An empty K: C = beta * C, C not read when beta == 0.
TEST(AmxGemm, EmptyKScalesC) {
  SKIP_WITHOUT_AMX();
  std::vector<float> c = {1.0f, -2.0f, 3.0f, 4.0f};
  AmxGemmBf16(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
  std::vector<float> nan(4, std::numeric_limits<float>::quiet_NaN());
  AmxGemmBf16(true, true, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, nan.data(), 2);
  EXPECT_EQ(nan, std::vector<float>(4, 0.0f));
}

TEST(AmxGemm, TestsCanTurnItOff) {
  {
    const ScopedAmx amx(false);
    EXPECT_FALSE(AmxBf16Available());
  }
  std::string env = std::getenv("CASTOR_AMX") != nullptr ? std::getenv("CASTOR_AMX") : "";
  for (char& ch : env) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool env_off = env == "off" || env == "0" || env == "no" || env == "false";
  EXPECT_EQ(AmxBf16Available(), AmxBf16Supported() && !env_off);
  std::cout << "AMX bfloat16 GEMM: " << (AmxBf16Supported() ? "supported" : "not supported")
            << (env_off ? ", off (CASTOR_AMX)" : "") << "\n";
}

}  // namespace
}  // namespace castor::cpu
