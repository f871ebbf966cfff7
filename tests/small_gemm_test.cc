// The small 16-bit GEMM of backend/cpu/small_gemm.h against two references:
// a scalar model of its numerics (per element, fused multiply-adds in order
// of k from zero, alpha applied once, one rounding to the 16-bit type),
// which it must match bit for bit, and gemm.h's widened sgemm path, which
// it must match to float32 rounding of the sum's magnitude. bfloat16 and
// float16; every width up to kSmallGemmMaxN (tails of 1-15 lanes, one to
// four vectors), row counts that leave every partial row block, k from 1
// to kSmallGemmMaxK, row strides wider than the rows (the gaps must stay
// untouched), alpha, and subnormal, Inf, NaN and -0 inputs; the MatMul
// kernel's batched products take it. On a CPU without AVX-512 each test
// says so and skips.
#include "backend/cpu/small_gemm.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/simd16.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

// AMX off and VDPBF16PS forced on or off for the scope.
using ScopedKernels = ScopedAvx512Bf16OnlyForTesting;

#define SKIP_WITHOUT_SIMD16()                                                      \
  if (!HasSimd16()) {                                                              \
    GTEST_SKIP() << "no AVX-512 F/BW/VL with F16C here: MatMul keeps gemm.h's path"; \
  }

float Widen(DType dtype, uint16_t bits) {
  return dtype == DType::kBFloat16 ? BFloat16BitsToFloat(bits) : HalfBitsToFloat(bits);
}
uint16_t Round(DType dtype, float value) {
  return dtype == DType::kBFloat16 ? FloatToBFloat16Bits(value) : FloatToHalfBits(value);
}

// One GEMM's operands as 16-bit bits with row strides, C prefilled with a
// marker so that writes past n show.
struct Problem {
  DType dtype = DType::kBFloat16;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f;
  std::vector<uint16_t> a, b, c;
};

constexpr uint16_t kMarker = 0x7e55;  // a NaN in both types, written nowhere by the kernel

Problem MakeProblem(DType dtype, int64_t m, int64_t n, int64_t k, int64_t pad, std::mt19937& rng) {
  Problem p;
  p.dtype = dtype;
  p.m = m, p.n = n, p.k = k;
  p.lda = k + pad, p.ldb = n + pad, p.ldc = n + pad;
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  p.a.resize(static_cast<size_t>(m * p.lda));
  p.b.resize(static_cast<size_t>(k * p.ldb));
  p.c.assign(static_cast<size_t>(m * p.ldc), kMarker);
  for (uint16_t& v : p.a) v = Round(dtype, dist(rng));
  for (uint16_t& v : p.b) v = Round(dtype, dist(rng));
  return p;
}

// The scalar model: fused multiply-adds in order of k, alpha once, one rounding.
std::vector<uint16_t> Model(const Problem& p) {
  std::vector<uint16_t> c = p.c;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < p.k; ++kk) {
        acc = std::fma(Widen(p.dtype, p.a[i * p.lda + kk]), Widen(p.dtype, p.b[kk * p.ldb + j]),
                       acc);
      }
      c[i * p.ldc + j] = Round(p.dtype, p.alpha == 1.0f ? acc : acc * p.alpha);
    }
  }
  return c;
}

std::vector<uint16_t> RunSmall(const Problem& p) {
  const ScopedKernels widened(false);  // where SmallGemmApplies to bfloat16
  std::vector<uint16_t> c = p.c;
  SmallGemmRounded(p.dtype, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb,
                   c.data(), p.ldc);
  return c;
}

// Bit-for-bit equality with the model; NaNs compared as bits too.
void ExpectModelBits(const Problem& p, const std::string& what) {
  const std::vector<uint16_t> got = RunSmall(p), want = Model(p);
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && ++mismatches <= 3) {
      ADD_FAILURE() << what << ": element " << i << " (row " << i / p.ldc << ", column "
                    << i % p.ldc << ") is 0x" << std::hex << got[i] << ", the model gives 0x"
                    << want[i] << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

TEST(SmallGemm, AppliesOnlyWithinItsLimits) {
  SKIP_WITHOUT_SIMD16();
  // bfloat16 only where gemm.h would widen it.
  const ScopedKernels widened(false);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    EXPECT_TRUE(SmallGemmApplies(dtype, 28, 28, 16));
    EXPECT_TRUE(SmallGemmApplies(dtype, 1, kSmallGemmMaxN, kSmallGemmMaxK));
    EXPECT_FALSE(SmallGemmApplies(dtype, 1, kSmallGemmMaxN + 1, 8));
    EXPECT_FALSE(SmallGemmApplies(dtype, 1, 8, kSmallGemmMaxK + 1));
    EXPECT_FALSE(SmallGemmApplies(dtype, 0, 8, 8));
    EXPECT_FALSE(SmallGemmApplies(dtype, 8, 8, 0));
    EXPECT_FALSE(SmallGemmApplies(dtype, 4096, 64, 64));  // past the single-thread size
  }
  EXPECT_FALSE(SmallGemmApplies(DType::kFloat32, 28, 28, 16));
  if (Avx512Bf16Supported()) {
    const ScopedKernels native(true);
    EXPECT_FALSE(SmallGemmApplies(DType::kBFloat16, 28, 28, 16));
    EXPECT_TRUE(SmallGemmApplies(DType::kFloat16, 28, 28, 16));
  }
}

// Every width to 64 and row counts that leave each partial row block, with
// strides wider than the rows: the model's bits, and nothing written past n.
TEST(SmallGemm, MatchesTheModelBitForBitAtEveryWidth) {
  SKIP_WITHOUT_SIMD16();
  std::mt19937 rng(7);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n = 1; n <= kSmallGemmMaxN; ++n) {
      for (int64_t m : {1, 2, 3, 5, 7, 9, 13, 28}) {
        const int64_t k = 1 + (n * 7 + m) % 40;
        const Problem p = MakeProblem(dtype, m, n, k, n % 3, rng);
        ExpectModelBits(p, absl::StrCat(DTypeName(dtype), " ", m, "x", n, "x", k));
      }
    }
  }
}

TEST(SmallGemm, LongKAlphaAndAttentionShapes) {
  SKIP_WITHOUT_SIMD16();
  std::mt19937 rng(11);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {28, 28, 16}, {28, 16, 28}, {16, 28, 28}, {4, 64, kSmallGemmMaxK}, {3, 17, 255}}) {
      Problem p = MakeProblem(dtype, m, n, k, 0, rng);
      ExpectModelBits(p, absl::StrCat(DTypeName(dtype), " ", m, "x", n, "x", k));
      p.alpha = 0.125f;
      ExpectModelBits(p, absl::StrCat(DTypeName(dtype), " alpha 0.125 ", m, "x", n, "x", k));
    }
  }
}

// Subnormal, Inf, NaN and -0 operands: kept and propagated as float32
// arithmetic does (the model's fma), nothing flushed.
TEST(SmallGemm, SpecialValuesAsInFloat32) {
  SKIP_WITHOUT_SIMD16();
  std::mt19937 rng(3);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const bool bf16 = dtype == DType::kBFloat16;
    const uint16_t inf = bf16 ? 0x7f80 : 0x7c00, nan = bf16 ? 0x7fc1 : 0x7e01;
    const uint16_t subnormal = 0x0003, minus_zero = 0x8000;  // subnormal in both types
    Problem p = MakeProblem(dtype, 9, 37, 12, 1, rng);
    p.a[0 * p.lda + 0] = inf;            // row 0: Inf times each b[0][j]
    p.a[1 * p.lda + 3] = nan;            // row 1: NaN
    p.a[2 * p.lda + 5] = subnormal;      // row 2: a subnormal term
    p.b[4 * p.ldb + 7] = minus_zero;     // column 7: a -0 term
    for (int64_t kk = 0; kk < p.k; ++kk) p.a[3 * p.lda + kk] = subnormal;  // row 3: all tiny
    p.b[0 * p.ldb + 30] = 0;             // column 30 meets row 0's Inf with a zero: NaN
    ExpectModelBits(p, absl::StrCat(DTypeName(dtype), " special values"));
    const std::vector<uint16_t> got = RunSmall(p);
    // Row 3 sums subnormal products: not flushed to zero everywhere.
    bool row3_nonzero = false;
    for (int64_t j = 0; j < p.n; ++j) row3_nonzero |= (got[3 * p.ldc + j] & 0x7fff) != 0;
    if (!bf16) {
      EXPECT_TRUE(row3_nonzero) << "float16 subnormal products flushed";
    }
    EXPECT_TRUE(std::isnan(Widen(dtype, got[0 * p.ldc + 30])));
    EXPECT_TRUE(std::isinf(Widen(dtype, got[0 * p.ldc + 1])) ||
                std::isnan(Widen(dtype, got[0 * p.ldc + 1])));
    EXPECT_TRUE(std::isnan(Widen(dtype, got[1 * p.ldc + 0])));
  }
}

// Against gemm.h's widened sgemm path: the same sums in another order.
TEST(SmallGemm, AgreesWithTheWidenedPath) {
  SKIP_WITHOUT_SIMD16();
  std::mt19937 rng(5);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const Problem p = MakeProblem(dtype, 28, 28, 64, 0, rng);
    const std::vector<uint16_t> got = RunSmall(p);
    std::vector<float> a(p.a.size()), b(p.b.size()), c(static_cast<size_t>(p.m * p.n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = Widen(dtype, p.a[i]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = Widen(dtype, p.b[i]);
    Sgemm(false, false, p.m, p.n, p.k, 1.0f, a.data(), p.lda, b.data(), p.ldb, 0.0f, c.data(),
          p.n);
    int64_t differ = 0;
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        // |a| and |b| <= 2 over 64 terms: float32 sums within 64 * 4 * 2^-23 of each other,
        // then one 16-bit rounding each.
        const float want = c[i * p.n + j], mine = Widen(dtype, got[i * p.ldc + j]);
        const float ulp16 = dtype == DType::kBFloat16 ? 1.0f / 128 : 1.0f / 1024;
        EXPECT_NEAR(mine, want, std::abs(want) * ulp16 + 1e-3f) << i << "," << j;
        differ += Round(dtype, want) != got[i * p.ldc + j];
      }
    }
    EXPECT_LT(differ, p.m * p.n / 10) << DTypeName(dtype);  // rounding flips are rare
  }
}

}  // namespace
}  // namespace castor::cpu
