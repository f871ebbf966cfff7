// GEMM through OpenBLAS for every float dtype, and bfloat16 on AMX tiles or
// AVX512-BF16 dot products where the CPU has them (see gemm.h).
#include "backend/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/str_format.h"
#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/blas_core.h"
#include "backend/cpu/grid_conv.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"

namespace castor::cpu {
namespace {

// OpenBLAS's interface runs GEMMs with m*n*k at or below
// SMP_THRESHOLD_MIN (65536) * GEMM_MULTITHREAD_THRESHOLD (4) on one thread;
// Sgemm splits only larger ones.
constexpr double kSingleThreadedGemmWork = 65536.0 * 4.0;

// Largest float32 scratch (elements) for one pair of widened 16-bit panels.
constexpr int64_t kPanelScratchElements = int64_t{8} << 20;  // 32 MiB

// Widens `rows` rows of `cols` elements (source row stride `src_ld`) to a
// dense float32 block with row stride `cols`.
void WidenRows(DType dtype, const void* src, int64_t src_ld, int64_t rows, int64_t cols,
               float* dst) {
  const size_t elem = DTypeSize(dtype);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  ParallelFor(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      ToFloat32(dtype, static_cast<const char*>(src) + static_cast<size_t>(r * src_ld) * elem,
                dst + r * cols, cols);
    }
  });
}

}  // namespace

bool IsSmallGemm(int64_t m, int64_t n, int64_t k) {
  return static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <=
         kSingleThreadedGemmWork;
}

namespace {

// OpenBLAS's row-major GEMM for float and double.
void BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(1, lda)), b,
              static_cast<blasint>(std::max<int64_t>(1, ldb)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, ldc)));
}
void BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
              int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(1, lda)), b,
              static_cast<blasint>(std::max<int64_t>(1, ldb)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, ldc)));
}

// Blocks along a split axis are whole multiples of this many rows or
// columns (OpenBLAS's micro-tiles), except the last.
constexpr int64_t kSplitAlign = 16;

// C = alpha * op(A) * op(B) + beta * C on castor's threads: a GEMM above
// OpenBLAS's own threading threshold is split along the larger of M and N
// into one block per thread, each a single-threaded OpenBLAS call on its
// rows or columns of C. OpenBLAS itself is set to one thread on the first
// call (see gemm.h).
// Inside another ParallelFor, where the other threads are busy, it is one
// call.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    ScaleC(m, n, beta, c, ldc);
    return;
  }
  static std::once_flag single_threaded_blas;
  std::call_once(single_threaded_blas, [] { openblas_set_num_threads(1); });
  const bool split_n = n >= m;
  const int64_t extent = split_n ? n : m;
  // Blocks of whole units of kSplitAlign, spread evenly (none empty).
  const int64_t units = (extent + kSplitAlign - 1) / kSplitAlign;
  const int64_t blocks = std::min<int64_t>(
      (IsSmallGemm(m, n, k) || InsideParallelFor()) ? 1 : NumThreads(), units);
  if (blocks <= 1) {
    BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  auto boundary = [&](int64_t block) {
    return std::min(extent, units * block / blocks * kSplitAlign);
  };
  ParallelFor(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t block = lo; block < hi; ++block) {
      const int64_t begin = boundary(block), size = boundary(block + 1) - begin;
      if (size <= 0) continue;
      if (split_n) {  // columns [begin, begin + size) of op(B) and C
        BlasGemm(trans_a, trans_b, m, size, k, alpha, a, lda, trans_b ? b + begin * ldb : b + begin,
                 ldb, beta, c + begin, ldc);
      } else {  // rows [begin, begin + size) of op(A) and C
        BlasGemm(trans_a, trans_b, size, n, k, alpha, trans_a ? a + begin : a + begin * lda, lda,
                 b, ldb, beta, c + begin * ldc, ldc);
      }
    }
  });
}

}  // namespace

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void Dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
           int64_t ldc) {
  Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void GemmFloat32Accumulate(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const void* a, int64_t lda, const void* b,
                           int64_t ldb, float beta, float* c, int64_t ldc) {
  if (dtype == DType::kFloat32) {
    Sgemm(trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda,
          static_cast<const float*>(b), ldb, beta, c, ldc);
    return;
  }
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    ScaleC(m, n, beta, c, ldc);
    return;
  }
  if (dtype == DType::kBFloat16 && AmxBf16Available()) {
    AmxGemmBf16(trans_a, trans_b, m, n, k, alpha, static_cast<const uint16_t*>(a), lda,
                static_cast<const uint16_t*>(b), ldb, beta, c, ldc);
    return;
  }
  if (dtype == DType::kBFloat16 && Avx512Bf16Available()) {
    Avx512Bf16Gemm(trans_a, trans_b, m, n, k, alpha, static_cast<const uint16_t*>(a), lda,
                   static_cast<const uint16_t*>(b), ldb, beta, c, ldc);
    return;
  }
  // One panel covers all of K unless the widened operands would be large;
  // then K is split and each panel's product is added to C in float32.
  const int64_t panel =
      std::clamp<int64_t>(kPanelScratchElements / (m + n), std::min<int64_t>(k, 256), k);
  thread_local Scratch<float> a_scratch, b_scratch;
  float* a_panel = a_scratch.Get(m * panel);
  float* b_panel = b_scratch.Get(n * panel);
  const size_t elem = DTypeSize(dtype);
  const char* a_bytes = static_cast<const char*>(a);
  const char* b_bytes = static_cast<const char*>(b);
  for (int64_t k0 = 0; k0 < k; k0 += panel) {
    const int64_t kb = std::min(panel, k - k0);
    // op(A)[:, k0:k0+kb]: stored [m, k] -> [m, kb]; stored [k, m] -> [kb, m].
    if (!trans_a) {
      WidenRows(dtype, a_bytes + static_cast<size_t>(k0) * elem, lda, m, kb, a_panel);
    } else {
      WidenRows(dtype, a_bytes + static_cast<size_t>(k0 * lda) * elem, lda, kb, m,
                a_panel);
    }
    // op(B)[k0:k0+kb, :]: stored [k, n] -> [kb, n]; stored [n, k] -> [n, kb].
    if (!trans_b) {
      WidenRows(dtype, b_bytes + static_cast<size_t>(k0 * ldb) * elem, ldb, kb, n,
                b_panel);
    } else {
      WidenRows(dtype, b_bytes + static_cast<size_t>(k0) * elem, ldb, n, kb, b_panel);
    }
    Sgemm(trans_a, trans_b, m, n, kb, alpha, a_panel, trans_a ? m : kb, b_panel,
          trans_b ? kb : n, k0 == 0 ? beta : 1.0f, c, ldc);
  }
}

void GemmRoundedToDType(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const void* a, int64_t lda, const void* b,
                        int64_t ldb, void* c, int64_t ldc) {
  if (dtype == DType::kFloat32) {
    Sgemm(trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda,
          static_cast<const float*>(b), ldb, 0.0f, static_cast<float*>(c), ldc);
    return;
  }
  if (m <= 0 || n <= 0) return;
  if (dtype == DType::kBFloat16 && AmxBf16Available()) {
    AmxGemmBf16Rounded(trans_a, trans_b, m, n, k, alpha, static_cast<const uint16_t*>(a), lda,
                       static_cast<const uint16_t*>(b), ldb, static_cast<uint16_t*>(c), ldc);
    return;
  }
  if (dtype == DType::kBFloat16 && Avx512Bf16Available()) {
    Avx512Bf16GemmRounded(trans_a, trans_b, m, n, k, alpha, static_cast<const uint16_t*>(a),
                          lda, static_cast<const uint16_t*>(b), ldb, static_cast<uint16_t*>(c),
                          ldc);
    return;
  }
  thread_local Scratch<float> product_scratch;
  float* product = product_scratch.Get(m * n);
  GemmFloat32Accumulate(dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 0.0f,
                        product, n);
  const size_t elem = DTypeSize(dtype);
  if (ldc == n) {
    ParallelFromFloat32(dtype, product, c, m * n);
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    FromFloat32(dtype, product + i * n, static_cast<char*>(c) + i * ldc * elem, n);
  }
}

std::string DescribeGemm() {
  std::string line = DescribeBlasCore();
  const bool convolutions = UseGridBFloat16Products();
  if (AmxBf16Available()) {
    line += "; AMX for bfloat16 GEMMs";
    if (convolutions) line += "; AVX512-BF16 for bfloat16 convolutions";
  } else if (Avx512Bf16Available()) {
    line += "; AVX512-BF16 for bfloat16 GEMMs";
    if (convolutions) line += " and convolutions";
  }
  if (Avx512Bf16Supported() && Avx512Bf16Switch() != KernelSwitch::kOff && !Avx512Bf16Pays()) {
    // Named whether the kernels run (CASTOR_AVX512BF16=on) or not.
    line += absl::StrFormat(
        "; AVX512-BF16 %s: its dot products run at %.2fx the float32 FMA rate here",
        Avx512Bf16Available() ? "used (CASTOR_AVX512BF16=on)" : "not used",
        Avx512Bf16RateOverFloat32());
  }
  return line;
}

KernelSwitch GemmKernelSwitchInEnvironment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return KernelSwitch::kAuto;
  std::string v = value;
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "off" || v == "0" || v == "no" || v == "false") return KernelSwitch::kOff;
  if (v == "on" || v == "1" || v == "yes" || v == "true") return KernelSwitch::kOn;
  if (!(v.empty() || v == "auto")) {
    std::fprintf(stderr, "castor: warning: %s=%s is not on, off or auto; ignored\n", name, value);
  }
  return KernelSwitch::kAuto;
}

}  // namespace castor::cpu
