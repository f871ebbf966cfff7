// Small 16-bit GEMMs in AVX-512 registers (see small_gemm.h).
#include "backend/cpu/small_gemm.h"

#include <cstdio>
#include <cstdlib>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd16.h"

namespace castor::cpu {
namespace {

#if defined(CASTOR_SIMD16_X86)

constexpr int64_t kLanes = 16;  // float32 lanes of a ZMM register

// Rows of C summed together: at least eight independent accumulator chains
// (an FMA's latency times its two ports) in at most 12 registers, and each
// B vector loaded once per k for all of them.
constexpr int RowsPerBlock(int vectors) { return vectors == 1 ? 8 : vectors == 2 ? 4 : 3; }

// Rows [i0, i0 + kRows) of C: kRows x kVectors accumulators over all of k,
// reading the widened op(B) panel `bw` ([k][kVectors * 16], zero past n)
// and broadcasting each row's A values widened.
template <typename T, int kRows, int kVectors>
CASTOR_SIMD16_TARGET __attribute__((target("fma"))) void RowBlock(
    int64_t i0, int64_t n, int64_t k, float alpha, const T* a, int64_t lda, const float* bw,
    T* c, int64_t ldc) {
  __m512 acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  // The rows' A values widened first, so that each is one broadcast load.
  alignas(64) float aw[kRows][kSmallGemmMaxK];
  for (int r = 0; r < kRows; ++r) {
    const T* row = a + (i0 + r) * lda;
    for (int64_t kk = 0; kk < k; kk += kLanes) {
      const __mmask16 lanes = TailMask(k - kk);
      _mm512_mask_storeu_ps(aw[r] + kk, lanes, LoadWidened(row + kk, lanes));
    }
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    __m512 b[kVectors];
    for (int v = 0; v < kVectors; ++v) b[v] = _mm512_load_ps(bw + (kk * kVectors + v) * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const __m512 av = _mm512_set1_ps(aw[r][kk]);
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int r = 0; r < kRows; ++r) {
    T* out = c + (i0 + r) * ldc;
    for (int v = 0; v < kVectors; ++v) {
      const __m512 value = alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(acc[r][v], scale);
      StoreRounded(out + v * kLanes, TailMask(n - v * kLanes), value);
    }
  }
}

template <typename T, int kVectors>
CASTOR_SIMD16_TARGET void RowBlocks(int64_t m, int64_t n, int64_t k, float alpha, const T* a,
                                    int64_t lda, const float* bw, T* c, int64_t ldc) {
  constexpr int kRows = RowsPerBlock(kVectors);
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) {
    RowBlock<T, kRows, kVectors>(i, n, k, alpha, a, lda, bw, c, ldc);
  }
  // The last rows in halving blocks (a lone row waits on its chains' latency).
  if constexpr (kRows > 4) {
    if (i + 4 <= m) {
      RowBlock<T, 4, kVectors>(i, n, k, alpha, a, lda, bw, c, ldc);
      i += 4;
    }
  }
  if (i + 2 <= m) {
    RowBlock<T, 2, kVectors>(i, n, k, alpha, a, lda, bw, c, ldc);
    i += 2;
  }
  if (i < m) RowBlock<T, 1, kVectors>(i, n, k, alpha, a, lda, bw, c, ldc);
}

template <typename T>
CASTOR_SIMD16_TARGET void Run(int64_t m, int64_t n, int64_t k, float alpha, const T* a,
                              int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  const int vectors = static_cast<int>((n + kLanes - 1) / kLanes);
  // op(B) widened: row kk in [kk][vectors * 16], zeros past n.
  thread_local Scratch<float, 64> panel_scratch;
  float* bw = panel_scratch.Get(kSmallGemmMaxK * kSmallGemmMaxN);
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int v = 0; v < vectors; ++v) {
      _mm512_store_ps(bw + (kk * vectors + v) * kLanes,
                      LoadWidened(b + kk * ldb + v * kLanes, TailMask(n - v * kLanes)));
    }
  }
  switch (vectors) {
    case 1: RowBlocks<T, 1>(m, n, k, alpha, a, lda, bw, c, ldc); break;
    case 2: RowBlocks<T, 2>(m, n, k, alpha, a, lda, bw, c, ldc); break;
    case 3: RowBlocks<T, 3>(m, n, k, alpha, a, lda, bw, c, ldc); break;
    default: RowBlocks<T, 4>(m, n, k, alpha, a, lda, bw, c, ldc); break;
  }
  _mm256_zeroupper();  // the caller is SSE code (see float_io.cc's kZeroUpperNote)
}

#endif  // CASTOR_SIMD16_X86

}  // namespace

bool SmallGemmApplies(DType dtype, int64_t m, int64_t n, int64_t k) {
#if defined(CASTOR_SIMD16_X86)
  const bool widened = dtype == DType::kFloat16 ||
                       (dtype == DType::kBFloat16 && !AmxBf16Available() && !Avx512Bf16Available());
  return widened && m > 0 && n > 0 && k > 0 && n <= kSmallGemmMaxN && k <= kSmallGemmMaxK &&
         IsSmallGemm(m, n, k) && HasSimd16();
#else
  (void)dtype, (void)m, (void)n, (void)k;
  return false;
#endif
}

void SmallGemmRounded(DType dtype, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                      int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc) {
  if (!SmallGemmApplies(dtype, m, n, k)) {
    std::fprintf(stderr, "castor: SmallGemmRounded called for a GEMM it does not take\n");
    std::abort();
  }
#if defined(CASTOR_SIMD16_X86)
  if (dtype == DType::kBFloat16) {
    Run(m, n, k, alpha, static_cast<const BFloat16*>(a), lda, static_cast<const BFloat16*>(b),
        ldb, static_cast<BFloat16*>(c), ldc);
  } else {
    Run(m, n, k, alpha, static_cast<const Half*>(a), lda, static_cast<const Half*>(b), ldb,
        static_cast<Half*>(c), ldc);
  }
#else
  (void)lda, (void)ldb, (void)alpha, (void)a, (void)b, (void)c, (void)ldc;
#endif
}

}  // namespace castor::cpu
