// AMX bfloat16 GEMM (see amx_gemm.h). Packed layouts, with MB = ceil(m /
// 16), NB = ceil(n / 16) and KB = ceil(k / 32) tiles:
//   A: [MB][KB] tiles of [16 rows][32 k]                  (zeros past m, k)
//   B: [NB][KB] tiles of [16 k pairs][16 columns][2 k]    (zeros past k, n)
// so each tile is 1 KiB of consecutive rows of 64 bytes. C is computed in
// blocks of up to 2 x 2 tiles (32 x 32): accumulator tiles 0-3, A tiles
// 4-5, B tiles 6-7, accumulating over all of K in the tiles. Only when the
// packed copies would pass kPackElements (32 MiB) is K cut into panels,
// each packed and multiplied in turn and added to C (alpha applied per
// panel). Packed buffers are 64-byte aligned.
#include "backend/cpu/amx_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/pair_transpose.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd16.h"

// GCC 11 and newer (AMX intrinsics and target names), on x86-64 Linux (the
// tile-state request).
#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define CASTOR_AMX_BUILD 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace castor::cpu {
namespace {

// Packed bfloat16 per K panel, A and B together (32 MiB; tests lower it).
constexpr int64_t kPackElements = int64_t{1} << 24;
std::atomic<int64_t> pack_elements{kPackElements};

std::atomic<bool> amx_allowed{true};  // SetAmxForTesting

#if defined(CASTOR_AMX_BUILD)

constexpr int64_t kTileRows = 16;     // rows of an A or C tile; k pairs of a B tile
constexpr int64_t kTileK = 32;        // bfloat16 per A tile row (64 bytes)
constexpr int64_t kTileElements = kTileRows * kTileK;  // 512 bfloat16 = 1 KiB
constexpr int64_t kBlockTiles = 2;    // C blocks of up to 2 x 2 tiles
constexpr int64_t kBlock = kBlockTiles * kTileRows;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Below this many multiply-adds a GEMM runs on the calling thread: handing
// work to another thread costs more than the tiles save.
constexpr int64_t kParallelMultiplyAdds = int64_t{1} << 20;

// fn(0, count) on this thread, or split across threads when `split`.
void Run(bool split, int64_t count, const std::function<void(int64_t, int64_t)>& fn) {
  if (split) {
    ParallelFor(0, count, 1, fn);
  } else {
    fn(0, count);
  }
}

// AMX-TILE and AMX-BF16 with the tile state enabled in XCR0, the AVX2 and
// AVX-512 (F, BW, VL: simd16.h) the packing and the bfloat16 write-back
// use, and the tile data granted to this process by Linux.
bool DetectAmx() {
  const CpuFeatures& cpu = HostCpuFeatures();
  if (!cpu.avx2 || !HasSimd16() || !cpu.amx_bf16 || !cpu.amx_tile) return false;
  // Linux hands out the (8 KiB) tile data state per process on request.
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,f16c")

// The palette-1 configuration: all eight tiles 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = kTileRows;
    }
  }
};

// The MT x NT tiles of C at A tile row `a` and B tile column `b` (each KB
// tiles, one per K step), stored to out [32][32] float32.
template <int MT, int NT>
void BlockProduct(const uint16_t* a, const uint16_t* b, int64_t a_next, int64_t b_next,
                  int64_t kb_count, float* out) {
  _tile_zero(0);
  if constexpr (NT == 2) _tile_zero(1);
  if constexpr (MT == 2) _tile_zero(2);
  if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    const int64_t at = kb * kTileElements;
    _tile_loadd(4, a + at, 64);
    if constexpr (MT == 2) _tile_loadd(5, a + a_next + at, 64);
    _tile_loadd(6, b + at, 64);
    if constexpr (NT == 2) _tile_loadd(7, b + b_next + at, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  constexpr int64_t kRowBytes = kBlock * sizeof(float);
  _tile_stored(0, out, kRowBytes);
  if constexpr (NT == 2) _tile_stored(1, out + kTileRows, kRowBytes);
  if constexpr (MT == 2) _tile_stored(2, out + kTileRows * kBlock, kRowBytes);
  if constexpr (MT == 2 && NT == 2) {
    _tile_stored(3, out + kTileRows * kBlock + kTileRows, kRowBytes);
  }
}

// Where ProductBlocks writes C: float32 (alpha * product + beta * C) or,
// when c16 is set, bfloat16 (alpha * product rounded once; beta is 0).
struct COut {
  float* c = nullptr;
  uint16_t* c16 = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// C blocks [lo, hi) of a grid of nb2 blocks per block row.
void ProductBlocks(int64_t lo, int64_t hi, int64_t nb2, int64_t mb, int64_t nb, int64_t kb,
                   const uint16_t* a_pack, const uint16_t* b_pack, int64_t m, int64_t n,
                   const COut& to) {
  static const TileConfig config;
  _tile_loadconfig(&config);
  alignas(64) float out[kBlock * kBlock];
  const int64_t tile_stride = kb * kTileElements;  // one tile row of A, column of B
  const float alpha = to.alpha, beta = to.beta;
  for (int64_t block = lo; block < hi; ++block) {
    const int64_t ib = block / nb2 * kBlockTiles, jb = block % nb2 * kBlockTiles;
    const int mt = static_cast<int>(std::min(kBlockTiles, mb - ib));
    const int nt = static_cast<int>(std::min(kBlockTiles, nb - jb));
    const uint16_t* a = a_pack + ib * tile_stride;
    const uint16_t* b = b_pack + jb * tile_stride;
    if (mt == 2 && nt == 2) {
      BlockProduct<2, 2>(a, b, tile_stride, tile_stride, kb, out);
    } else if (mt == 2) {
      BlockProduct<2, 1>(a, b, tile_stride, tile_stride, kb, out);
    } else if (nt == 2) {
      BlockProduct<1, 2>(a, b, tile_stride, tile_stride, kb, out);
    } else {
      BlockProduct<1, 1>(a, b, tile_stride, tile_stride, kb, out);
    }
    const int64_t i0 = ib * kTileRows, j0 = jb * kTileRows;
    const int64_t rows = std::min<int64_t>(m - i0, mt * kTileRows);
    const int64_t cols = std::min<int64_t>(n - j0, nt * kTileRows);
    if (to.c16 != nullptr) {
      const __m512 scale = _mm512_set1_ps(alpha);
      BFloat16* c16 = reinterpret_cast<BFloat16*>(to.c16);
      for (int64_t i = 0; i < rows; ++i) {
        BFloat16* c_row = c16 + (i0 + i) * to.ldc + j0;
        const float* o = out + i * kBlock;
        for (int64_t j = 0; j < cols; j += 16) {
          const __mmask16 lanes = TailMask(cols - j);
          StoreRounded(c_row + j, lanes, _mm512_mul_ps(scale, _mm512_load_ps(o + j)));
        }
      }
      continue;
    }
    for (int64_t i = 0; i < rows; ++i) {
      float* c_row = to.c + (i0 + i) * to.ldc + j0;
      const float* o = out + i * kBlock;
      if (beta == 0.0f) {
        for (int64_t j = 0; j < cols; ++j) c_row[j] = alpha * o[j];
      } else {
        for (int64_t j = 0; j < cols; ++j) c_row[j] = alpha * o[j] + beta * c_row[j];
      }
    }
  }
  _tile_release();
  _mm256_zeroupper();  // the write-back loops may use AVX-512 (see InterleaveRows)
}

#pragma GCC pop_options

// Rows kk and kk + 1 of op(B) (not transposed), 16 columns each, into one
// 64-byte row of a B tile: (r0[0], r1[0], r0[1], r1[1], ...).
__attribute__((target("avx2"))) void InterleaveRows(const uint16_t* r0, const uint16_t* r1,
                                                    uint16_t* dst) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
  const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1));
  const __m256i lo = _mm256_unpacklo_epi16(x, y);  // columns 0-3 | 8-11
  const __m256i hi = _mm256_unpackhi_epi16(x, y);  // columns 4-7 | 12-15
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16),
                      _mm256_permute2x128_si256(lo, hi, 0x31));
  _mm256_zeroupper();  // the caller is SSE code (see float_io.cc's kZeroUpperNote)
}

// Tile rows [first, first + count) of op(A) [m, k] into [MB][kb] tiles of
// [16][32] (see the file note), zero-padded.
void PackA(bool trans_a, int64_t count, int64_t first, int64_t m, int64_t k, const uint16_t* a,
           int64_t lda, int64_t kb, uint16_t* pack) {
  for (int64_t ib = first; ib < first + count; ++ib) {
    const int64_t i0 = ib * kTileRows, rows = std::min(kTileRows, m - i0);
    for (int64_t t = 0; t < kb; ++t) {
      uint16_t* tile = pack + (ib * kb + t) * kTileElements;
      const int64_t k0 = t * kTileK, ks = std::max<int64_t>(0, std::min(kTileK, k - k0));
      const bool full = rows == kTileRows && ks == kTileK;
      if (!full) std::memset(tile, 0, kTileElements * sizeof(uint16_t));
      if (!trans_a) {  // rows of A are rows of op(A)
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(tile + r * kTileK, a + (i0 + r) * lda + k0,
                      static_cast<size_t>(ks) * sizeof(uint16_t));
        }
      } else {  // op(A)(i, kk) = a[kk * lda + i]
        if (full) {
          // Rows kk, kk + 1 of A interleaved give 16 k pairs x 16 columns i;
          // the tile is their transpose (tile row i: the pairs of column i).
          alignas(64) uint16_t pairs[kTileElements];
          for (int64_t p = 0; p < kTileRows; ++p) {
            const uint16_t* r0 = a + (k0 + 2 * p) * lda + i0;
            InterleaveRows(r0, r0 + lda, pairs + p * kTileK);
          }
          TransposeWords16x16(pairs, kTileK, tile, kTileK);
          continue;
        }
        for (int64_t kk = 0; kk < ks; ++kk) {
          const uint16_t* src = a + (k0 + kk) * lda + i0;
          for (int64_t r = 0; r < rows; ++r) tile[r * kTileK + kk] = src[r];
        }
      }
    }
  }
}

// Tile columns [first, first + count) of op(B) [k, n] into [NB][kb] tiles
// of [16 k pairs][16 columns][2] (see the file note), zero-padded.
void PackB(bool trans_b, int64_t count, int64_t first, int64_t n, int64_t k, const uint16_t* b,
           int64_t ldb, int64_t kb, uint16_t* pack) {
  for (int64_t jb = first; jb < first + count; ++jb) {
    const int64_t j0 = jb * kTileRows, cols = std::min(kTileRows, n - j0);
    for (int64_t t = 0; t < kb; ++t) {
      uint16_t* tile = pack + (jb * kb + t) * kTileElements;
      const int64_t k0 = t * kTileK, ks = std::max<int64_t>(0, std::min(kTileK, k - k0));
      const bool full = cols == kTileRows && ks == kTileK;
      if (!full) std::memset(tile, 0, kTileElements * sizeof(uint16_t));
      if (!trans_b) {  // op(B)(kk, j) = b[kk * ldb + j]: interleave row pairs
        for (int64_t kk = 0; kk < ks; kk += 2) {
          const uint16_t* r0 = b + (k0 + kk) * ldb + j0;
          uint16_t* dst = tile + kk / 2 * kTileK;
          if (full) {
            InterleaveRows(r0, r0 + ldb, dst);
            continue;
          }
          for (int64_t c = 0; c < cols; ++c) dst[2 * c] = r0[c];
          if (kk + 1 < ks) {
            for (int64_t c = 0; c < cols; ++c) dst[2 * c + 1] = r0[ldb + c];
          }
        }
      } else {  // op(B)(kk, j) = b[j * ldb + kk]: k pairs adjacent in both
        if (full) {
          TransposeWords16x16(b + j0 * ldb + k0, ldb, tile, kTileK);
          continue;
        }
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t* src = b + (j0 + c) * ldb + k0;
          int64_t kk = 0;
          for (; kk + 2 <= ks; kk += 2) {
            std::memcpy(tile + kk / 2 * kTileK + 2 * c, src + kk, 2 * sizeof(uint16_t));
          }
          if (kk < ks) tile[kk / 2 * kTileK + 2 * c] = src[kk];
        }
      }
    }
  }
}

#endif  // CASTOR_AMX_BUILD

}  // namespace

bool AmxBf16Supported() {
#if defined(CASTOR_AMX_BUILD)
  static const bool supported = DetectAmx();
  return supported;
#else
  return false;
#endif
}

bool AmxBf16Available() {
  // Checked before asking Linux for tiles.
  static const bool off = GemmKernelSwitchInEnvironment("CASTOR_AMX") == KernelSwitch::kOff;
  return !off && amx_allowed.load(std::memory_order_relaxed) && AmxBf16Supported();
}

bool SetAmxForTesting(bool enabled) {
  return amx_allowed.exchange(enabled, std::memory_order_relaxed);
}

int64_t SetAmxPanelElementsForTesting(int64_t elements) {
  return pack_elements.exchange(elements > 0 ? elements : kPackElements,
                                std::memory_order_relaxed);
}

#if defined(CASTOR_AMX_BUILD)
namespace {

// K tiles per packed panel: all of K unless the packed copies would pass
// the limit (then panels of whole tiles, at least one: for m + n above
// ~500k the scratch exceeds it).
int64_t PanelTiles(int64_t m, int64_t n, int64_t k) {
  const int64_t mb = CeilDiv(m, kTileRows), nb = CeilDiv(n, kTileRows);
  return std::clamp<int64_t>(
      pack_elements.load(std::memory_order_relaxed) / ((mb + nb) * kTileElements), 1,
      CeilDiv(k, kTileK));
}

// The GEMM behind both entry points (m, n, k > 0). A bfloat16 C
// (`to.c16`) is rounded block by block, so all of K must fit one panel.
void AmxGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
             int64_t lda, const uint16_t* b, int64_t ldb, COut to) {
  if (!AmxBf16Supported()) {  // also what grants this process the tile state
    std::fprintf(stderr, "castor: AmxGemmBf16 called where AMX cannot run\n");
    std::abort();
  }
  if (to.c16 != nullptr && PanelTiles(m, n, k) * kTileK < k) {
    std::fprintf(stderr, "castor: AmxGemm: a bfloat16 C needs all of K in one panel\n");
    std::abort();
  }
  const int64_t mb = CeilDiv(m, kTileRows), nb = CeilDiv(n, kTileRows);
  const int64_t nb2 = CeilDiv(nb, kBlockTiles);
  const int64_t blocks = CeilDiv(mb, kBlockTiles) * nb2;
  const bool split = m * n * k >= kParallelMultiplyAdds;
  // Each panel is packed in one parallel pass and multiplied in another,
  // and a C block's accumulators stay in their tiles over the panel's K.
  const int64_t panel_tiles = PanelTiles(m, n, k);
  const int64_t panel = panel_tiles * kTileK;
  // The calling thread's scratch, kept for the next call (named through
  // pointers: ParallelFor bodies on other threads see their own
  // thread_local buffers).
  // (64-byte aligned: tile rows are 64 bytes, and an unaligned row load
  // would touch two cache lines.)
  thread_local Scratch<uint16_t, 64> a_scratch, b_scratch;
  uint16_t* a_pack = a_scratch.Get(mb * panel_tiles * kTileElements);
  uint16_t* b_pack = b_scratch.Get(nb * panel_tiles * kTileElements);
  for (int64_t k0 = 0; k0 < k; k0 += panel) {
    const int64_t kc = std::min(panel, k - k0);
    const int64_t kb = CeilDiv(kc, kTileK);
    // op(A)[:, k0:k0+kc] (tile rows [0, mb)) and op(B)[k0:k0+kc, :] (tile
    // columns mb + [0, nb)) in one pass; later panels add to C.
    Run(split, mb + nb, [&](int64_t lo, int64_t hi) {
      if (lo < mb) {
        PackA(trans_a, std::min(hi, mb) - lo, lo, m, kc, trans_a ? a + k0 * lda : a + k0, lda,
              kb, a_pack);
      }
      if (hi > mb) {
        PackB(trans_b, hi - std::max(lo, mb), std::max(lo, mb) - mb, n, kc,
              trans_b ? b + k0 : b + k0 * ldb, ldb, kb, b_pack);
      }
    });
    COut panel_to = to;
    if (k0 > 0) panel_to.beta = 1.0f;
    Run(split, blocks, [&](int64_t lo, int64_t hi) {
      ProductBlocks(lo, hi, nb2, mb, nb, kb, a_pack, b_pack, m, n, panel_to);
    });
  }
}

}  // namespace
#endif  // CASTOR_AMX_BUILD

void AmxGemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) {
#if defined(CASTOR_AMX_BUILD)
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
  AmxGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, to);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  std::fprintf(stderr, "castor: AmxGemmBf16 called in a build without AMX\n");
  std::abort();  // AmxBf16Available() is false here: no caller gets this far
#endif
}

void AmxGemmBf16Rounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
                        int64_t ldb, uint16_t* c, int64_t ldc) {
#if defined(CASTOR_AMX_BUILD)
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || PanelTiles(m, n, k) * kTileK < k) {
    // An empty K (C = 0), or K in several panels, whose sums meet in
    // float32: compute C in float32 and round it once.
    thread_local Scratch<float> product_scratch;
    float* product = product_scratch.Get(m * n);
    AmxGemmBf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 0.0f, product, n);
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
  AmxGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, to);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)c, (void)ldc;
  std::fprintf(stderr, "castor: AmxGemmBf16Rounded called in a build without AMX\n");
  std::abort();  // AmxBf16Available() is false here: no caller gets this far
#endif
}

}  // namespace castor::cpu
