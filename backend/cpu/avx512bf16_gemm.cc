// AVX512-BF16 bfloat16 GEMM (see avx512bf16_gemm.h). Packed layouts, in
// 32-bit words (one k pair of bfloat16: k even in the low half), with
// P = ceil(kc / 2) k pairs per K panel, MB = ceil(m / 16), NB = ceil(n / 16):
//   A: [MB][P][16 rows]     (zeros past m and k)
//   B: [NB][P][16 columns]  (zeros past n and k)
// so one k pair of a B panel is one ZMM load and each A word one
// broadcast. An A stored [m, k] with k even is not packed: its rows hold
// the k pairs as words already, and each is broadcast from there (AWords). C is computed in blocks of 16 x 16 (16 accumulator registers,
// enough to cover VDPBF16PS's latency; the 16 broadcasts per k pair are
// loads, which have ports to spare beside one VDPBF16PS per cycle),
// block b = column panel (b / MB), row panel (b % MB): consecutive blocks
// share their B panel, and each thread takes a contiguous range of blocks.
// Each block sums all of the panel's K in registers, so the order of sums
// is the same for any thread count. Only when the packed copies would pass
// kPackElements (32 MiB) is K cut into panels, each packed and multiplied
// in turn and added to C (alpha applied per panel). Packed buffers are
// 64-byte aligned.
#include "backend/cpu/avx512bf16_gemm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/pair_transpose.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd16.h"

// GCC 10 and newer or clang (the AVX512-BF16 intrinsics and target name),
// on x86-64.
#if defined(__x86_64__) && defined(CASTOR_SIMD16_X86) && \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 10))
#define CASTOR_AVX512BF16_BUILD 1
#include <immintrin.h>
#endif

namespace castor::cpu {
namespace {

// Packed bfloat16 per K panel, A and B together (32 MiB; tests lower it).
constexpr int64_t kPackElements = int64_t{1} << 24;
std::atomic<int64_t> pack_elements{kPackElements};

// SetAvx512Bf16ForTesting's override (kAuto: none, the environment's switch).
std::atomic<KernelSwitch> avx512bf16_override{KernelSwitch::kAuto};

#if defined(CASTOR_AVX512BF16_BUILD)

#define CASTOR_AVX512BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")))

constexpr int64_t kRows = 16;    // rows of op(A) per packed panel and C block
constexpr int64_t kCols = 16;    // columns of op(B) per packed panel and C block
constexpr int64_t kLanes = 16;   // float32 lanes of a ZMM register
constexpr int kColVectors = static_cast<int>(kCols / kLanes);

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Below this many multiply-adds a GEMM runs on the calling thread: handing
// work to another thread costs more than it saves.
constexpr int64_t kParallelMultiplyAdds = int64_t{1} << 20;
// Below this many packed words a B that is packed alone (A read in place)
// is packed on the calling thread.
constexpr int64_t kParallelPackWords = int64_t{1} << 16;

// fn(0, count) on this thread, or split across threads when `split` (a
// template, so the small GEMMs of a batched MatMul build no std::function).
template <typename Fn>
void Run(bool split, int64_t count, Fn&& fn) {
  if (split) {
    ParallelFor(0, count, 1, fn);
  } else {
    fn(0, count);
  }
}

// AVX512-BF16 with AVX-512 F/BW/VL, AVX2 and F16C (HasSimd16: simd16.h's
// write-back and masks), each with its registers saved by the OS.
bool DetectAvx512Bf16() { return HasSimd16() && HostCpuFeatures().avx512_bf16; }

// Avx512Bf16RateOverFloat32's probe: seconds for `rounds` rounds of one
// VDPBF16PS (`dot_products`) or one 512-bit FMA into each of kProbeChains
// independent accumulators, enough chains to hide either instruction's
// latency. The sums go to `probe_sink` so that the compiler keeps the work.
constexpr int kProbeChains = 16;
volatile float probe_sink = 0.0f;

CASTOR_AVX512BF16_TARGET __attribute__((target("fma"), noinline)) double TimeChains(
    bool dot_products, int64_t rounds) {
  __m512 acc[kProbeChains];
  for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh one16 = (__m512bh)_mm512_set1_epi16(0x3f80);  // bfloat16 1.0
  const __m512 one = _mm512_set1_ps(1.0f), tiny = _mm512_set1_ps(1e-9f);
  const auto start = std::chrono::steady_clock::now();
  if (dot_products) {
    for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
      for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], one16, one16);
    }
  } else {
    for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
      for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_fmadd_ps(one, tiny, acc[i]);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __m512 sum = acc[0];
  for (int i = 1; i < kProbeChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  probe_sink = _mm512_cvtss_f32(sum);  // every lane holds the same sum
  _mm256_zeroupper();
  return seconds;
}

// Multiply-adds per second of VDPBF16PS (32 per instruction) over those of
// the FMA (16): 2 * fma time / dot time for the same instruction count.
// Each is the fastest of kProbeRuns runs, interleaved, after one warm-up
// each (the vector unit's wake-up, and a preempted run, only slow a run
// down); 8192 rounds take ~25 us of FMAs and ~100 us of VDPBF16PS at the
// slowest rate measured.
double MeasureRateOverFloat32() {
  constexpr int64_t kRounds = 8192;
  constexpr int kProbeRuns = 7;
  TimeChains(false, kRounds);
  TimeChains(true, kRounds);
  double fma = 1e30, dot = 1e30;
  for (int run = 0; run < kProbeRuns; ++run) {
    fma = std::min(fma, TimeChains(false, kRounds));
    dot = std::min(dot, TimeChains(true, kRounds));
  }
  return dot > 0.0 ? 2.0 * fma / dot : 0.0;
}

// Where a block of C goes: float32 (alpha * product + beta * C) or, when
// c16 is set, bfloat16 (alpha * product rounded once; beta is 0).
struct COut {
  float* c = nullptr;
  uint16_t* c16 = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// Packs `items` (<= width) rows or columns of op(X) over k values into
// [ceil(k / 2) pairs][width] words (zeros past items and k), for the
// layout where k runs down the stored rows: element (kk, item) at
// src[kk * ld + item] (op(B) of a B stored [k, n]; op(A) of an A stored
// [k, m]). Each word interleaves two stored rows.
CASTOR_AVX512BF16_TARGET void PackAlongRows(const uint16_t* src, int64_t ld, int64_t items,
                                            int64_t k, int64_t width, uint32_t* dst) {
  const int64_t pairs = CeilDiv(k, 2);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* even = src + 2 * p * ld;
    const bool has_odd = 2 * p + 1 < k;
    uint32_t* out = dst + p * width;
    for (int64_t c = 0; c < width; c += kLanes) {
      const __mmask16 lanes = TailMask(items - c);
      const __m512i low = _mm512_maskz_cvtepu16_epi32(
          lanes, _mm256_maskz_loadu_epi16(lanes, even + c));
      __m512i word = low;
      if (has_odd) {
        const __m512i high = _mm512_maskz_cvtepu16_epi32(
            lanes, _mm256_maskz_loadu_epi16(lanes, even + ld + c));
        word = _mm512_or_si512(low, _mm512_maskz_slli_epi32(lanes, high, 16));
      }
      _mm512_mask_storeu_epi32(out + c, TailMask(width - c), word);
    }
  }
  _mm256_zeroupper();  // the caller is SSE code (see float_io.cc's kZeroUpperNote)
}

// The same for the layout where k runs along each stored row: element
// (kk, item) at src[item * ld + kk] (op(A) of an A stored [m, k]; op(B) of
// a B stored [n, k]). A k pair is one (unaligned) 32-bit word of a stored
// row: 16 items x 16 pairs at a time are a 16 x 16 transpose of words
// (pair_transpose.h); partial ones are gathered across the items, and an
// odd K's last pair is read element by element (its word would reach past
// the row).
CASTOR_AVX512BF16_TARGET void PackAlongColumns(const uint16_t* src, int64_t ld, int64_t items,
                                               int64_t k, int64_t width, uint32_t* dst) {
  const int64_t whole_pairs = k / 2, pairs = CeilDiv(k, 2);
  // Gather offsets item * ld (in bfloat16 units) must fit int32.
  const bool gather = (kLanes - 1) * ld < (int64_t{1} << 30);
  for (int64_t c = 0; c < width; c += kLanes) {
    const __mmask16 lanes = TailMask(items - c), store = TailMask(width - c);
    const uint16_t* base = src + c * ld;
    int64_t p = 0;
    if (c + kLanes <= items && c + kLanes <= width) {
      for (; p + 16 <= whole_pairs; p += 16) {
        TransposeWords16x16(base + 2 * p, ld, reinterpret_cast<uint16_t*>(dst + p * width + c),
                            2 * width);
      }
    }
    if (gather) {
      const __m512i offsets = _mm512_mullo_epi32(
          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
          _mm512_set1_epi32(static_cast<int>(ld)));
      for (; p < whole_pairs; ++p) {
        const __m512i word = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), lanes, offsets,
                                                         base + 2 * p, 2);
        _mm512_mask_storeu_epi32(dst + p * width + c, store, word);
      }
    }
    for (; p < pairs; ++p) {
      uint32_t* out = dst + p * width + c;
      for (int64_t i = 0; i < std::min(width - c, kLanes); ++i) {
        uint32_t word = 0;
        if (c + i < items) {
          const uint16_t* x = base + i * ld + 2 * p;
          word = x[0];
          if (2 * p + 1 < k) word |= static_cast<uint32_t>(x[1]) << 16;
        }
        out[i] = word;
      }
    }
  }
  _mm256_zeroupper();  // see PackAlongRows
}

// Where ProductBlocks reads op(A)'s k pairs: the packed row panels, or, for
// an A stored [m, k] (not transposed) with k even in one panel, A itself:
// row i's pair p is the 32-bit word at rows + i * lda + 2p, so A is not
// copied at all (a transformer's [tokens, 64] activations were packed, one
// 16 x 16 word transpose at a time, for more time than their product took).
struct AWords {
  const uint32_t* packed = nullptr;
  const uint16_t* rows = nullptr;
  int64_t lda = 0;
};

// C blocks [lo, hi) of the grid (block b: column panel b / mb, row panel
// b % mb), each summed over the panel's `pairs` k pairs and written to `to`.
// kAInPlace: A's words come from AWords::rows (the rows past m of the last
// panel read row m - 1, and their sums are not stored).
template <bool kAInPlace>
CASTOR_AVX512BF16_TARGET void ProductBlocks(int64_t lo, int64_t hi, int64_t mb, int64_t pairs,
                                            const AWords& a_words, const uint32_t* b_pack,
                                            int64_t m, int64_t n, const COut& to) {
  const __m512 alpha = _mm512_set1_ps(to.alpha), beta = _mm512_set1_ps(to.beta);
  for (int64_t block = lo; block < hi; ++block) {
    const int64_t jb = block / mb, ib = block % mb;
    const int64_t i0 = ib * kRows, j0 = jb * kCols;
    const int64_t rows = std::min(kRows, m - i0), cols = std::min(kCols, n - j0);
    const uint32_t* a = nullptr;
    const uint16_t* a_row[kRows];
    if constexpr (kAInPlace) {
      for (int64_t r = 0; r < kRows; ++r) {
        a_row[r] = a_words.rows + (i0 + std::min(r, rows - 1)) * a_words.lda;
      }
    } else {
      a = a_words.packed + ib * pairs * kRows;
    }
    const uint32_t* b = b_pack + jb * pairs * kCols;
    __m512 acc[kRows][kColVectors];
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      for (int h = 0; h < kColVectors; ++h) acc[r][h] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh columns[kColVectors];
      for (int h = 0; h < kColVectors; ++h) {
        columns[h] = (__m512bh)_mm512_load_si512(b + p * kCols + h * kLanes);
      }
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        int32_t pair;
        if constexpr (kAInPlace) {
          std::memcpy(&pair, a_row[r] + 2 * p, sizeof(pair));
        } else {
          pair = static_cast<int32_t>(a[p * kRows + r]);
        }
        const __m512bh word = (__m512bh)_mm512_set1_epi32(pair);
        for (int h = 0; h < kColVectors; ++h) {
          acc[r][h] = _mm512_dpbf16_ps(acc[r][h], word, columns[h]);
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) break;
      for (int h = 0; h < kColVectors; ++h) {
        const __mmask16 lanes = TailMask(cols - h * kLanes);
        const __m512 product = _mm512_mul_ps(alpha, acc[r][h]);
        if (to.c16 != nullptr) {
          StoreRounded(reinterpret_cast<BFloat16*>(to.c16 + (i0 + r) * to.ldc + j0 + h * kLanes),
                       lanes, product);
          continue;
        }
        float* c_row = to.c + (i0 + r) * to.ldc + j0 + h * kLanes;
        if (to.beta == 0.0f) {
          _mm512_mask_storeu_ps(c_row, lanes, product);
        } else {
          const __m512 old = _mm512_maskz_loadu_ps(lanes, c_row);
          _mm512_mask_storeu_ps(c_row, lanes, _mm512_add_ps(product, _mm512_mul_ps(beta, old)));
        }
      }
    }
  }
  _mm256_zeroupper();  // the caller is SSE code (see float_io.cc's kZeroUpperNote)
}

#endif  // CASTOR_AVX512BF16_BUILD

}  // namespace

bool Avx512Bf16Supported() {
#if defined(CASTOR_AVX512BF16_BUILD)
  static const bool supported = DetectAvx512Bf16();
  return supported;
#else
  return false;
#endif
}

double Avx512Bf16RateOverFloat32() {
#if defined(CASTOR_AVX512BF16_BUILD)
  static const double rate = Avx512Bf16Supported() ? MeasureRateOverFloat32() : 0.0;
  return rate;
#else
  return 0.0;
#endif
}

bool Avx512Bf16Pays() { return Avx512Bf16RatePays(Avx512Bf16RateOverFloat32()); }

KernelSwitch Avx512Bf16Switch() {
  static const KernelSwitch environment = GemmKernelSwitchInEnvironment("CASTOR_AVX512BF16");
  const KernelSwitch override = avx512bf16_override.load(std::memory_order_relaxed);
  return override != KernelSwitch::kAuto ? override : environment;
}

bool Avx512Bf16Available() {
  switch (Avx512Bf16Switch()) {
    case KernelSwitch::kOff:
      return false;
    case KernelSwitch::kOn:
      return Avx512Bf16Supported();
    case KernelSwitch::kAuto:
      break;
  }
  return Avx512Bf16Supported() && Avx512Bf16Pays();
}

KernelSwitch SetAvx512Bf16ForTesting(KernelSwitch override) {
  return avx512bf16_override.exchange(override, std::memory_order_relaxed);
}

int64_t SetAvx512Bf16PanelElementsForTesting(int64_t elements) {
  return pack_elements.exchange(elements > 0 ? elements : kPackElements,
                                std::memory_order_relaxed);
}

#if defined(CASTOR_AVX512BF16_BUILD)
namespace {

// k values per packed panel: all of K unless the packed copies would pass
// the limit (then panels of whole k pairs, at least one).
int64_t PanelK(int64_t m, int64_t n, int64_t k) {
  const int64_t padded = CeilDiv(m, kRows) * kRows + CeilDiv(n, kCols) * kCols;
  const int64_t pairs = std::clamp<int64_t>(pack_elements.load(std::memory_order_relaxed) /
                                                (2 * padded), 1, CeilDiv(k, 2));
  return std::min(k, 2 * pairs);
}

// The GEMM behind both entry points (m, n, k > 0). A bfloat16 C
// (`to.c16`) is rounded block by block, so all of K must fit one panel.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
          int64_t lda, const uint16_t* b, int64_t ldb, COut to) {
  if (!Avx512Bf16Supported()) {
    std::fprintf(stderr, "castor: Avx512Bf16Gemm called where AVX512-BF16 cannot run\n");
    std::abort();
  }
  const int64_t panel = PanelK(m, n, k);
  if (to.c16 != nullptr && panel < k) {
    std::fprintf(stderr, "castor: Avx512Bf16Gemm: a bfloat16 C needs all of K in one panel\n");
    std::abort();
  }
  const int64_t mb = CeilDiv(m, kRows), nb = CeilDiv(n, kCols);
  const int64_t blocks = mb * nb;
  const bool split = m * n * k >= kParallelMultiplyAdds;
  const int64_t panel_pairs = CeilDiv(panel, 2);
  // An A stored [m, k] with k even, in one panel, is read in place (AWords).
  const bool a_in_place = !trans_a && k % 2 == 0 && panel == k;
  // The calling thread's scratch, kept for the next call (named through
  // pointers: ParallelFor bodies on other threads see their own
  // thread_local buffers). 64-byte aligned: a B pair row is one cache line
  // per 16 columns.
  thread_local Scratch<uint32_t, 64> a_scratch, b_scratch;
  uint32_t* a_pack = a_in_place ? nullptr : a_scratch.Get(mb * panel_pairs * kRows);
  uint32_t* b_pack = b_scratch.Get(nb * panel_pairs * kCols);
  for (int64_t k0 = 0; k0 < k; k0 += panel) {
    const int64_t kc = std::min(panel, k - k0), pairs = CeilDiv(kc, 2);
    // op(A)[:, k0:k0+kc] (row panels [0, mb), unless A is read in place)
    // and op(B)[k0:k0+kc, :] (column panels first_b + [0, nb)) in one
    // pass; later panels add to C. B alone is packed on this thread unless
    // it is large: the threads would wait for each other longer.
    const int64_t first_b = a_in_place ? 0 : mb;
    const bool split_packing =
        split && (!a_in_place || nb * pairs * kCols >= kParallelPackWords);
    Run(split_packing, first_b + nb, [&](int64_t lo, int64_t hi) {
      for (int64_t panel_index = lo; panel_index < hi; ++panel_index) {
        if (panel_index < first_b) {
          const int64_t i0 = panel_index * kRows, items = std::min(kRows, m - i0);
          uint32_t* dst = a_pack + panel_index * pairs * kRows;
          if (trans_a) {  // op(A)(i, kk) = a[kk * lda + i]
            PackAlongRows(a + k0 * lda + i0, lda, items, kc, kRows, dst);
          } else {
            PackAlongColumns(a + i0 * lda + k0, lda, items, kc, kRows, dst);
          }
        } else {
          const int64_t j0 = (panel_index - first_b) * kCols, items = std::min(kCols, n - j0);
          uint32_t* dst = b_pack + (panel_index - first_b) * pairs * kCols;
          if (trans_b) {  // op(B)(kk, j) = b[j * ldb + kk]
            PackAlongColumns(b + j0 * ldb + k0, ldb, items, kc, kCols, dst);
          } else {
            PackAlongRows(b + k0 * ldb + j0, ldb, items, kc, kCols, dst);
          }
        }
      }
    });
    COut panel_to = to;
    if (k0 > 0) panel_to.beta = 1.0f;
    AWords a_words;
    a_words.packed = a_pack;
    a_words.rows = a;
    a_words.lda = lda;
    Run(split, blocks, [&](int64_t lo, int64_t hi) {
      if (a_in_place) {
        ProductBlocks<true>(lo, hi, mb, pairs, a_words, b_pack, m, n, panel_to);
      } else {
        ProductBlocks<false>(lo, hi, mb, pairs, a_words, b_pack, m, n, panel_to);
      }
    });
  }
}

}  // namespace
#endif  // CASTOR_AVX512BF16_BUILD

void Avx512Bf16Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                    float* c, int64_t ldc) {
#if defined(CASTOR_AVX512BF16_BUILD)
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    ScaleC(m, n, beta, c, ldc);
    return;
  }
  COut to;
  to.c = c;
  to.ldc = ldc;
  to.alpha = alpha;
  to.beta = beta;
  Gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, to);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  std::fprintf(stderr, "castor: Avx512Bf16Gemm called in a build without AVX512-BF16\n");
  std::abort();  // Avx512Bf16Available() is false here: no caller gets this far
#endif
}

void Avx512Bf16GemmRounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
                           int64_t ldb, uint16_t* c, int64_t ldc) {
#if defined(CASTOR_AVX512BF16_BUILD)
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || PanelK(m, n, k) < k) {
    // An empty K (C = 0), or K in several panels, whose sums meet in
    // float32: compute C in float32 and round it once.
    thread_local Scratch<float> product_scratch;
    float* product = product_scratch.Get(m * n);
    Avx512Bf16Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 0.0f, product, n);
    ParallelFor(0, m, std::max<int64_t>(1, kParallelConvertGrain / n), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        FromFloat32(product + i * n, reinterpret_cast<BFloat16*>(c + i * ldc), n);
      }
    });
    return;
  }
  COut to;
  to.c16 = c;
  to.ldc = ldc;
  to.alpha = alpha;
  Gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, to);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)c, (void)ldc;
  std::fprintf(stderr, "castor: Avx512Bf16GemmRounded called in a build without AVX512-BF16\n");
  std::abort();  // Avx512Bf16Available() is false here: no caller gets this far
#endif
}

}  // namespace castor::cpu
