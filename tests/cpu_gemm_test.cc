// backend/cpu/gemm.h: Sgemm and Dgemm against float64 reference products,
// for every transpose combination, with sizes that make Sgemm split the
// GEMM across threads along M or along N (blocks of 16 that do not divide
// the axis; five threads), sub-matrix leading dimensions, beta, k == 0, and
// a call from inside a ParallelFor body (one call, not split); and
// GemmRoundedToDType against GemmFloat32Accumulate rounded.
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

struct GemmCase {
  bool trans_a, trans_b;
  int64_t m, n, k;
};

std::vector<float> RandomFloats(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

// Stored operands with leading dimensions larger than their rows (a view of
// a wider matrix), C = alpha * op(A) op(B) + beta * C checked element by
// element against float64 with a bound of 1e-5 times the sum of |terms|.
template <typename T>
void CheckGemm(const GemmCase& c, T alpha, T beta, unsigned seed) {
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = c.n + 7;
  const std::vector<float> af = RandomFloats(a_rows * lda, seed);
  const std::vector<float> bf = RandomFloats(b_rows * ldb, seed + 1);
  const std::vector<float> cf = RandomFloats(c.m * ldc, seed + 2);
  const std::vector<T> a(af.begin(), af.end()), b(bf.begin(), bf.end());
  std::vector<T> out(cf.begin(), cf.end());
  if constexpr (std::is_same_v<T, float>) {
    Sgemm(c.trans_a, c.trans_b, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta,
          out.data(), ldc);
  } else {
    Dgemm(c.trans_a, c.trans_b, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta,
          out.data(), ldc);
  }
  int bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, scale = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double av = c.trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bv = c.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += av * bv;
        scale += std::abs(av * bv);
      }
      const double want = alpha * sum + beta * static_cast<double>(cf[i * ldc + j]);
      const double bound = 1e-5 * (std::abs(alpha) * scale + std::abs(beta) + 1);
      if (std::abs(out[i * ldc + j] - want) > bound && ++bad <= 3) {
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << out[i * ldc + j] << ", expected "
                      << want << " (trans_a " << c.trans_a << ", trans_b " << c.trans_b
                      << ", m " << c.m << ", n " << c.n << ", k " << c.k << ")";
      }
    }
    // Padding columns of C's rows are not written.
    for (int64_t j = c.n; j < ldc; ++j) {
      ASSERT_EQ(out[i * ldc + j], static_cast<T>(cf[i * ldc + j]));
    }
  }
  EXPECT_EQ(bad, 0);
}

// Five threads whatever the machine: blocks of 16 that do not divide M or N
// (37 -> 16 + 21; 150 -> 16 * 2 + 16 * 2 + 22 ...), also on one CPU.
class CpuGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = NumThreads();
    SetNumThreads(5);
  }
  void TearDown() override { SetNumThreads(threads_); }
  int threads_ = 1;
};

TEST_F(CpuGemm, LargeGemmsSplitAlongMOrNMatchFloat64) {
  ASSERT_FALSE(IsSmallGemm(150, 37, 70));  // large enough to be split
  ASSERT_FALSE(IsSmallGemm(37, 150, 70));
  unsigned seed = 1;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      CheckGemm<float>({trans_a, trans_b, 150, 37, 70}, 1.0f, 0.0f, seed += 3);   // along M
      CheckGemm<float>({trans_a, trans_b, 37, 150, 70}, 0.5f, 2.0f, seed += 3);   // along N
      CheckGemm<double>({trans_a, trans_b, 131, 129, 33}, -1.0, 1.0, seed += 3);  // float64
    }
  }
}

TEST_F(CpuGemm, SmallAndDegenerateGemms) {
  CheckGemm<float>({false, false, 3, 5, 4}, 1.0f, 0.0f, 100);
  CheckGemm<float>({true, true, 1, 17, 2}, 2.0f, 1.0f, 101);
  // k == 0: C = beta * C.
  CheckGemm<float>({false, false, 40, 70, 0}, 1.0f, 0.5f, 102);
  CheckGemm<float>({false, true, 40, 70, 0}, 1.0f, 0.0f, 103);
}

// GemmRoundedToDType: the float32 product of GemmFloat32Accumulate
// rounded once into a 16-bit C, also where C's rows are wider than n (the
// elements past each row untouched), for float16 (widened path) and
// bfloat16 (AMX where available, else widened), transposes included.
TEST_F(CpuGemm, RoundedToDTypeIsTheFloat32ProductRoundedOnce) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const GemmCase& c : {GemmCase{false, false, 37, 45, 70}, GemmCase{true, true, 5, 3, 2},
                              GemmCase{false, true, 64, 96, 128}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " m " << c.m << " n " << c.n
                                        << " k " << c.k);
      const int64_t a_cols = c.trans_a ? c.m : c.k, b_cols = c.trans_b ? c.k : c.n;
      const std::vector<float> af = RandomFloats((c.trans_a ? c.k : c.m) * a_cols, 300);
      const std::vector<float> bf = RandomFloats((c.trans_b ? c.n : c.k) * b_cols, 301);
      std::vector<uint16_t> a(af.size()), b(bf.size());
      for (size_t i = 0; i < af.size(); ++i) {
        a[i] = dtype == DType::kFloat16 ? FloatToHalfBits(af[i]) : FloatToBFloat16Bits(af[i]);
      }
      for (size_t i = 0; i < bf.size(); ++i) {
        b[i] = dtype == DType::kFloat16 ? FloatToHalfBits(bf[i]) : FloatToBFloat16Bits(bf[i]);
      }
      std::vector<float> wide(static_cast<size_t>(c.m * c.n));
      GemmFloat32Accumulate(dtype, c.trans_a, c.trans_b, c.m, c.n, c.k, 0.75f, a.data(), a_cols,
                            b.data(), b_cols, 0.0f, wide.data(), c.n);
      const int64_t ldc = c.n + 3;
      std::vector<uint16_t> rounded(static_cast<size_t>(c.m * ldc), 0xabcd);
      GemmRoundedToDType(dtype, c.trans_a, c.trans_b, c.m, c.n, c.k, 0.75f, a.data(), a_cols,
                         b.data(), b_cols, rounded.data(), ldc);
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          const float w = j < c.n ? wide[i * c.n + j] : 0.0f;
          const uint16_t want = j >= c.n ? 0xabcd
                                : dtype == DType::kFloat16 ? FloatToHalfBits(w)
                                                           : FloatToBFloat16Bits(w);
          ASSERT_EQ(rounded[i * ldc + j], want) << "C(" << i << ", " << j << ")";
        }
      }
    }
  }
}

TEST_F(CpuGemm, InsideAParallelForBodyIsOneCorrectCall) {
  std::vector<int> inside(2, -1);
  ParallelFor(0, 2, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      inside[t] = InsideParallelFor() ? 1 : 0;
      CheckGemm<float>({t == 1, t == 0, 150, 137, 40}, 1.0f, 0.0f, 200 + static_cast<unsigned>(t));
    }
  });
  EXPECT_EQ(inside, (std::vector<int>{1, 1}));  // the bodies ran split across threads
  EXPECT_FALSE(InsideParallelFor());
}

}  // namespace
}  // namespace castor::cpu
