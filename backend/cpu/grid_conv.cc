// Direct grid-convolution products (see grid_conv.h): for the forward
// product the visited lines are cut into runs of at most one vector of
// positions (the filter gradient walks the lines itself), and
// grid_conv_forward.inc and grid_conv_filter_grad.inc are compiled once per
// instruction set (AVX-512, AVX2+FMA, portable scalar; bfloat16 on
// AVX512-BF16) with `#pragma GCC target`; the best one the CPU supports is
// picked once. The bfloat16 products over unpadded rows (ForwardRowsEntry)
// cut the positions into vectors across line ends and mask their loads.
#include "backend/cpu/grid_conv.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/cpu_features.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define CASTOR_GRID_CONV_X86 1
#include <immintrin.h>
#endif

namespace castor::cpu {
namespace {

// Up to one vector of consecutive positions of one line: at `gathered` in
// the grid and `dense` in the dense operand.
struct Run {
  int64_t gathered = 0;
  int64_t dense = 0;
  int count = 0;
};

// Each line cut into runs of at most `width` positions.
const std::vector<Run>& RunsOf(const GridLines& lines, int width) {
  thread_local std::vector<Run> runs;
  runs.clear();
  for (int64_t l = 0; l < lines.count; ++l) {
    for (int64_t j = 0; j < lines.width; j += width) {
      runs.push_back(Run{l * lines.gathered_stride + j, l * lines.dense_stride + j,
                         static_cast<int>(std::min<int64_t>(width, lines.width - j))});
    }
  }
  return runs;
}

namespace portable {

struct Vec {
  static constexpr int kWidth = 1;
  using Elem = float;
  using Reg = float;
  using Acc = Reg;
  using Data = Reg;
  using Mask = bool;
  static Mask MaskOf(int count) { return count > 0; }
  static Mask LastLanes(int count) { return count > 0; }
  static Reg Broadcast(float v) { return v; }
  static Reg BroadcastElem(const float* p) { return *p; }
  static Reg Zero() { return 0.0f; }
  static Reg Load(const float* p, Mask m) { return m ? *p : 0.0f; }
  static Reg Keep(Reg v, Mask m) { return m ? v : 0.0f; }
  static Reg LoadFull(const float* p) { return *p; }
  static void Store(float* p, Reg v, Mask m) {
    if (m) *p = v;
  }
  static Reg Fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static float Sum(Reg v) { return v; }
  static void AddSums4(float* dst, Reg a, Reg b, Reg c, Reg d) {
    dst[0] += a;
    dst[1] += b;
    dst[2] += c;
    dst[3] += d;
  }
};
constexpr int kForwardRows = 4, kForwardRuns = 4;
constexpr int kGradRows = 4, kGradCols = 4;

#include "backend/cpu/grid_conv_filter_grad.inc"
#include "backend/cpu/grid_conv_forward.inc"

}  // namespace portable

#if defined(CASTOR_GRID_CONV_X86)

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {

struct Vec {
  static constexpr int kWidth = 8;
  using Elem = float;
  using Reg = __m256;
  using Acc = Reg;
  using Data = Reg;
  using Mask = __m256i;
  static Mask MaskOf(int count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Mask LastLanes(int count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0));
  }
  static Reg Broadcast(float v) { return _mm256_set1_ps(v); }
  static Reg BroadcastElem(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg Zero() { return _mm256_setzero_ps(); }
  static Reg Load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static Reg Keep(Reg v, Mask m) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }
  static Reg LoadFull(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Reg v, Mask m) { _mm256_maskstore_ps(p, m, v); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // dst[0..3] += the lane sums of a, b, c, d.
  static void AddSums4(float* dst, Reg a, Reg b, Reg c, Reg d) {
    const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
    _mm_storeu_ps(dst, _mm_add_ps(_mm_loadu_ps(dst), sums));
  }
};
// 16 ymm registers: 12 accumulators, 3 loads, 1 broadcast.
constexpr int kForwardRows = 4, kForwardRuns = 3;
// 12 accumulators, 3 + 1 loads (2 x 4, with 8 accumulators, made a ResNet
// step 5% slower on an AMD EPYC, likely too few chains to hide the FMA
// latency).
constexpr int kGradRows = 4, kGradCols = 3;

#include "backend/cpu/grid_conv_filter_grad.inc"
#include "backend/cpu/grid_conv_forward.inc"

// Entry points: the upper register halves are cleared before returning to
// SSE code (see float_io.cc's note on vzeroupper).
void ForwardEntry(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* b,
                  const int64_t* b_rows, const Run* runs, int64_t num_runs, const float* init,
                  float* out, int64_t ld_out) {
  Forward(rows, depth, a, lda, b, b_rows, runs, num_runs, init, out, ld_out);
  _mm256_zeroupper();
}
void FilterGradEntry(int64_t rows, int64_t depth, const float* dy, int64_t ld_dy, const float* b,
                     const int64_t* b_rows, const GridLines& lines, const GridImages& images,
                     float* dw, int64_t ld_dw) {
  FilterGrad(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
  _mm256_zeroupper();
}

}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,fma")
namespace avx512 {

struct Vec {
  static constexpr int kWidth = 16;
  using Elem = float;
  using Reg = __m512;
  using Acc = Reg;
  using Data = Reg;
  using Mask = __mmask16;
  static Mask MaskOf(int count) { return static_cast<Mask>((1u << count) - 1u); }
  static Mask LastLanes(int count) { return static_cast<Mask>(~((1u << (16 - count)) - 1u)); }
  static Reg Broadcast(float v) { return _mm512_set1_ps(v); }
  static Reg BroadcastElem(const float* p) { return _mm512_set1_ps(*p); }
  static Reg Zero() { return _mm512_setzero_ps(); }
  static Reg Load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static Reg Keep(Reg v, Mask m) { return _mm512_maskz_mov_ps(m, v); }
  static Reg LoadFull(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Reg v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  // dst[0..3] += the lane sums of a, b, c, d. Through memory and AVX2
  // adds: GCC 12's 512-bit extracts (and _mm512_reduce_add_ps) trip
  // -Wuninitialized inside its own header.
  static void AddSums4(float* dst, Reg a, Reg b, Reg c, Reg d) {
    alignas(64) float lanes[4][16];
    _mm512_store_ps(lanes[0], a);
    _mm512_store_ps(lanes[1], b);
    _mm512_store_ps(lanes[2], c);
    _mm512_store_ps(lanes[3], d);
    __m256 half[4];
    for (int i = 0; i < 4; ++i) {
      half[i] = _mm256_add_ps(_mm256_load_ps(lanes[i]), _mm256_load_ps(lanes[i] + 8));
    }
    avx2::Vec::AddSums4(dst, half[0], half[1], half[2], half[3]);
  }
  static float Sum(Reg v) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    return avx2::Vec::Sum(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)));
  }
};
// 32 zmm registers: 24 accumulators, 6 loads, 1 broadcast.
constexpr int kForwardRows = 4, kForwardRuns = 6;
// 24 accumulators, 6 + 1 loads.
constexpr int kGradRows = 4, kGradCols = 6;

#include "backend/cpu/grid_conv_filter_grad.inc"
#include "backend/cpu/grid_conv_forward.inc"

void ForwardEntry(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* b,
                  const int64_t* b_rows, const Run* runs, int64_t num_runs, const float* init,
                  float* out, int64_t ld_out) {
  Forward(rows, depth, a, lda, b, b_rows, runs, num_runs, init, out, ld_out);
  _mm256_zeroupper();
}
void FilterGradEntry(int64_t rows, int64_t depth, const float* dy, int64_t ld_dy, const float* b,
                     const int64_t* b_rows, const GridLines& lines, const GridImages& images,
                     float* dw, int64_t ld_dw) {
  FilterGrad(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
  _mm256_zeroupper();
}

}  // namespace avx512
#pragma GCC pop_options

// bfloat16 on VDPBF16PS (AVX512-BF16): each instruction adds, per float32
// lane, the products of a pair of bfloat16 from each operand. The forward
// product pairs the depth (two channels side by side in one 32-bit word:
// the pair grid and pair weights of GridConvForwardBFloat16Pairs), so its
// blocks are the float32 ones with pairs for floats; the filter gradient
// sums over positions, so it pairs neighbouring positions as stored: 32 per
// register, line by line, or over the lines packed end to end where that
// saves vectors (FilterGradEntry). (AVX512-BF16 comes with AVX-512 VL
// here: Avx512Bf16Available's condition.)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")
namespace avx512bf16_pairs {

struct Vec {
  static constexpr int kWidth = 16;
  using Elem = uint32_t;
  using Acc = __m512;
  using Data = __m512bh;
  using Mask = __mmask16;
  static Mask MaskOf(int count) { return avx512::Vec::MaskOf(count); }
  static Acc Broadcast(float v) { return _mm512_set1_ps(v); }
  static Acc Zero() { return _mm512_setzero_ps(); }
  static Data BroadcastElem(const uint32_t* p) {
    return (__m512bh)_mm512_set1_epi32(static_cast<int>(*p));
  }
  static Data LoadFull(const uint32_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Acc Fma(Data a, Data b, Acc c) { return _mm512_dpbf16_ps(c, a, b); }
  static void Store(float* p, Acc v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
  // Rounded to bfloat16 by VCVTNEPS2BF16: nearest even, NaN made quiet,
  // as FromFloat32 rounds, except that it flushes float32 subnormals to
  // zero. The sums hold none: VDPBF16PS flushes its accumulator's and its
  // result's (only a product of depth 0 stores init as it came).
  static void Store(uint16_t* p, Acc v, Mask m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
  }
};
constexpr int kForwardRows = 4, kForwardRuns = 6;

#include "backend/cpu/grid_conv_forward.inc"

// GridConvForwardBFloat16PairRows' block: output rows [m0, m0 + MR) at NR
// vectors of positions from q0, vector j's lanes loaded under
// masks[shift_index[k] * kForwardRuns + j] at depth step k and stored under
// store_masks[j]. (Shift-major masks: a step's are at fixed offsets from
// one address, which keeps the loop's scalar registers off the stack.)
template <int MR, int NR>
void RowBlock(int64_t m0, int64_t depth, const uint32_t* a, int64_t lda, const uint32_t* b,
              const int64_t* b_rows, const uint8_t* shift_index, const __mmask16* masks,
              const __mmask16* store_masks, int64_t q0, const float* init, uint16_t* out,
              int64_t ld_out) {
  __m512 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    const __m512 start = init != nullptr ? _mm512_set1_ps(init[m0 + i]) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = start;
  }
  const uint32_t* a_block = a + m0 * lda;
  for (int64_t k = 0; k < depth; ++k) {
    const uint32_t* b_row = b + b_rows[k] + q0;
    const __mmask16* step_masks = masks + shift_index[k] * kForwardRuns;
    __m512bh bv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      bv[j] = (__m512bh)_mm512_maskz_loadu_epi32(step_masks[j], b_row + 16 * j);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = Vec::BroadcastElem(a_block + i * lda + k);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      Vec::Store(out + (m0 + i) * ld_out + q0 + 16 * j, acc[i][j], store_masks[j]);
    }
  }
}

template <int NR>
void RowRuns(int64_t rows, int64_t depth, const uint32_t* a, int64_t lda, const uint32_t* b,
             const int64_t* b_rows, const uint8_t* shift_index, const __mmask16* masks,
             const __mmask16* store_masks, int64_t q0, const float* init, uint16_t* out,
             int64_t ld_out) {
  int64_t m = 0;
  for (; m + kForwardRows <= rows; m += kForwardRows) {
    RowBlock<kForwardRows, NR>(m, depth, a, lda, b, b_rows, shift_index, masks, store_masks, q0,
                               init, out, ld_out);
  }
  for (; m < rows; ++m) {
    RowBlock<1, NR>(m, depth, a, lda, b, b_rows, shift_index, masks, store_masks, q0, init, out,
                    ld_out);
  }
}

// The positions in groups of up to kForwardRuns vectors; each group's
// masks are made once for all its output rows.
void ForwardRowsEntry(int64_t rows, int64_t depth, const uint32_t* a, int64_t lda,
                      const uint32_t* b, const int64_t* b_rows, const RowPositions& p,
                      const float* init, uint16_t* out, int64_t ld_out) {
  __mmask16 masks[kForwardRuns * kMaxRowShifts];
  __mmask16 store_masks[kForwardRuns];
  for (int64_t q0 = p.begin; q0 < p.end; q0 += 16 * kForwardRuns) {
    const int nr = static_cast<int>(std::min<int64_t>(kForwardRuns, (p.end - q0 + 15) / 16));
    for (int j = 0; j < nr; ++j) {
      __mmask16 in_range = 0;
      int64_t column[16];
      for (int lane = 0; lane < 16; ++lane) {
        const int64_t q = q0 + 16 * j + lane;
        if (q < p.end) in_range |= static_cast<__mmask16>(1u << lane);
        column[lane] = q % p.width;
      }
      store_masks[j] = in_range;
      for (int s = 0; s < p.num_shifts; ++s) {
        __mmask16 mask = 0;
        for (int lane = 0; lane < 16; ++lane) {
          const int64_t c = column[lane] + p.shifts[s];
          if (c >= 0 && c < p.width) mask |= static_cast<__mmask16>(1u << lane);
        }
        masks[s * kForwardRuns + j] = mask & in_range;
      }
    }
    switch (nr) {
#define CASTOR_ROW_RUNS(n)                                                                       \
  case n:                                                                                        \
    RowRuns<n>(rows, depth, a, lda, b, b_rows, p.shift_index, masks, store_masks, q0, init, out, \
               ld_out);                                                                          \
    break;
      CASTOR_ROW_RUNS(1)
      CASTOR_ROW_RUNS(2)
      CASTOR_ROW_RUNS(3)
      CASTOR_ROW_RUNS(4)
      CASTOR_ROW_RUNS(5)
      CASTOR_ROW_RUNS(6)
#undef CASTOR_ROW_RUNS
    }
  }
  _mm256_zeroupper();
}
static_assert(kForwardRuns == 6, "ForwardRowsEntry's switch covers 1..kForwardRuns vectors");

template <typename Out>
void ForwardEntry(int64_t rows, int64_t depth, const uint32_t* a, int64_t lda, const uint32_t* b,
                  const int64_t* b_rows, const Run* runs, int64_t num_runs, const float* init,
                  Out* out, int64_t ld_out) {
  Forward(rows, depth, a, lda, b, b_rows, runs, num_runs, init, out, ld_out);
  _mm256_zeroupper();
}

}  // namespace avx512bf16_pairs

namespace avx512bf16 {

// Line by line (grid_conv_filter_grad.inc): each line in whole 32-position
// vectors, its tail overlapped or masked.
namespace by_line {
struct Vec {
  static constexpr int kWidth = 32;
  using Elem = uint16_t;
  using Acc = __m512;
  using Data = __m512bh;
  using Mask = __mmask32;
  static Mask MaskOf(int count) {
    return count >= 32 ? ~Mask{0} : static_cast<Mask>((uint32_t{1} << count) - 1u);
  }
  static Mask LastLanes(int count) { return static_cast<Mask>(~MaskOf(32 - count)); }
  static Acc Zero() { return _mm512_setzero_ps(); }
  static Data Load(const uint16_t* p, Mask m) { return (__m512bh)_mm512_maskz_loadu_epi16(m, p); }
  static Data Keep(Data v, Mask m) { return (__m512bh)_mm512_maskz_mov_epi16(m, (__m512i)v); }
  static Data LoadFull(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Acc Fma(Data a, Data b, Acc c) { return _mm512_dpbf16_ps(c, a, b); }
  static float Sum(Acc v) { return avx512::Vec::Sum(v); }
  static void AddSums4(float* dst, Acc a, Acc b, Acc c, Acc d) {
    avx512::Vec::AddSums4(dst, a, b, c, d);
  }
};
constexpr int kGradRows = 4, kGradCols = 6;

#include "backend/cpu/grid_conv_filter_grad.inc"

}  // namespace by_line

// The filter gradient on bfloat16, over "packed" positions: a product's
// lines laid end to end at the grid's line stride, so two 14-wide lines of
// a 16-column grid share one 32-position vector instead of each taking
// most of one. dY is copied into that layout (zeros between its lines and
// past the last: FilterGradEntry); the grid is read as it is, each vector
// under its mask of positions that lie on a line (PackedMasks), so whatever the
// grid holds between lines (the next columns, Inf or NaN among them) reads
// as zeros and nothing past the last line is touched.
constexpr int kWidth = 32;
constexpr int kGradRows = 4, kGradCols = 6;

// Positions a packed image spans (its last line ends at `width`), and the
// vectors that cover them.
int64_t PackedSpan(const GridLines& lines) {
  return (lines.count - 1) * lines.gathered_stride + lines.width;
}
int64_t PackedVectors(const GridLines& lines) { return (PackedSpan(lines) + kWidth - 1) / kWidth; }

// Lane t of vector v is position 32 v + t: on a line when it lies before
// the span's end and within the first `width` of its line.
std::vector<__mmask32> PackedMasks(const GridLines& lines) {
  std::vector<__mmask32> masks(static_cast<size_t>(PackedVectors(lines)), 0);
  const int64_t span = PackedSpan(lines);
  for (int64_t q = 0; q < span; ++q) {
    if (q % lines.gathered_stride < lines.width) masks[q / kWidth] |= __mmask32{1} << (q % kWidth);
  }
  return masks;
}

// dW rows [m0, m0 + MR) x columns [k0, k0 + KR), over `images` images of
// `vectors` packed vectors each: dY packed at dy + image * dy_image + m *
// ld_dy, the grid at b + b_rows[k] + image * b_image.
template <int MR, int KR>
void PackedBlock(int64_t m0, int64_t k0, const uint16_t* dy, int64_t ld_dy, int64_t dy_image,
                 const uint16_t* b, const int64_t* b_rows, int64_t b_image, int64_t images,
                 int64_t vectors, const __mmask32* masks, float* dw, int64_t ld_dw) {
  __m512 acc[MR][KR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < KR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t image = 0; image < images; ++image) {
    const uint16_t* b_line[KR];
    const uint16_t* dy_line[MR];
#pragma GCC unroll 16
    for (int j = 0; j < KR; ++j) b_line[j] = b + b_rows[k0 + j] + image * b_image;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) dy_line[i] = dy + (m0 + i) * ld_dy + image * dy_image;
    for (int64_t v = 0; v < vectors; ++v) {
      const __mmask32 mask = masks[v];
      __m512bh bv[KR];
#pragma GCC unroll 16
      for (int j = 0; j < KR; ++j) {
        bv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, b_line[j] + v * kWidth);
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512bh av = (__m512bh)_mm512_loadu_si512(dy_line[i] + v * kWidth);
#pragma GCC unroll 16
        for (int j = 0; j < KR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* dw_row = dw + (m0 + i) * ld_dw + k0;
    int j = 0;
#pragma GCC unroll 16
    for (; j + 4 <= KR; j += 4) {
      avx512::Vec::AddSums4(dw_row + j, acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
    }
#pragma GCC unroll 16
    for (; j < KR; ++j) dw_row[j] += avx512::Vec::Sum(acc[i][j]);
  }
}

// Every row at KR columns from k0, then the columns left over one by one.
template <int KR>
void PackedColumns(int64_t rows, int64_t k0, const uint16_t* dy, int64_t ld_dy, int64_t dy_image,
                   const uint16_t* b, const int64_t* b_rows, int64_t b_image, int64_t images,
                   int64_t vectors, const __mmask32* masks, float* dw, int64_t ld_dw) {
  int64_t m = 0;
  for (; m + kGradRows <= rows; m += kGradRows) {
    PackedBlock<kGradRows, KR>(m, k0, dy, ld_dy, dy_image, b, b_rows, b_image, images, vectors,
                               masks, dw, ld_dw);
  }
  for (; m < rows; ++m) {
    PackedBlock<1, KR>(m, k0, dy, ld_dy, dy_image, b, b_rows, b_image, images, vectors, masks, dw,
                       ld_dw);
  }
}

void FilterGradEntry(int64_t rows, int64_t depth, const uint16_t* dy, int64_t ld_dy,
                     const uint16_t* b, const int64_t* b_rows, const GridLines& lines,
                     const GridImages& images, float* dw, int64_t ld_dw) {
  // Packed lines pay where they save a quarter of the vectors (lines of at
  // most 24 positions): on a Zen 4 EPYC the masked grid loads and dY's copy
  // made a 28-wide product (27 packed vectors against 28) 15% slower, while
  // 14-wide lines (7 against 14) ran 1.5 times as fast.
  const int64_t by_line_vectors = lines.count * ((lines.width + kWidth - 1) / kWidth);
  if (4 * PackedVectors(lines) > 3 * by_line_vectors) {
    by_line::FilterGrad(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
    _mm256_zeroupper();
    return;
  }
  // dY packed: per image, each row's lines at the grid's line stride,
  // zeros between and after them (whole vectors per row).
  const int64_t vectors = PackedVectors(lines);
  const int64_t packed_ld = vectors * kWidth;
  const int64_t packed_image = rows * packed_ld;
  thread_local std::vector<uint16_t> packed;
  packed.assign(static_cast<size_t>(images.count * packed_image), 0);
  for (int64_t i = 0; i < images.count; ++i) {
    for (int64_t m = 0; m < rows; ++m) {
      const uint16_t* src = dy + i * images.dense_stride + m * ld_dy;
      uint16_t* dst = packed.data() + i * packed_image + m * packed_ld;
      for (int64_t l = 0; l < lines.count; ++l) {  // (a call per line cost more than the copy)
        const uint16_t* from = src + l * lines.dense_stride;
        uint16_t* to = dst + l * lines.gathered_stride;
        for (int64_t j = 0; j < lines.width; j += kWidth) {
          const __mmask32 lanes = static_cast<__mmask32>(
              lines.width - j >= kWidth ? ~0u : (1u << (lines.width - j)) - 1u);
          _mm512_mask_storeu_epi16(to + j, lanes, _mm512_maskz_loadu_epi16(lanes, from + j));
        }
      }
    }
  }
  const std::vector<__mmask32> masks = PackedMasks(lines);
  int64_t k = 0;
  for (; k + kGradCols <= depth; k += kGradCols) {
    PackedColumns<kGradCols>(rows, k, packed.data(), packed_ld, packed_image, b, b_rows,
                             images.gathered_stride, images.count, vectors, masks.data(), dw,
                             ld_dw);
  }
  for (; k < depth; ++k) {
    PackedColumns<1>(rows, k, packed.data(), packed_ld, packed_image, b, b_rows,
                     images.gathered_stride, images.count, vectors, masks.data(), dw, ld_dw);
  }
  _mm256_zeroupper();
}

}  // namespace avx512bf16
#pragma GCC pop_options

#endif  // CASTOR_GRID_CONV_X86

GridIsa BestGridIsa() {
  static const GridIsa best = [] {
#if defined(CASTOR_GRID_CONV_X86)
    const CpuFeatures& cpu = HostCpuFeatures();
    if (cpu.avx512f) return GridIsa::kAvx512;
    if (cpu.avx2 && cpu.fma) return GridIsa::kAvx2;
#endif
    return GridIsa::kPortable;
  }();
  return best;
}

// The instruction set a test picked, or -1 for the best one.
std::atomic<int> forced_isa{-1};

}  // namespace

const char* GridIsaName(GridIsa isa) {
  switch (isa) {
    case GridIsa::kPortable:
      return "portable";
    case GridIsa::kAvx2:
      return "avx2";
    case GridIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool GridIsaSupported(GridIsa isa) {
  return static_cast<int>(isa) <= static_cast<int>(BestGridIsa());
}

GridIsa ActiveGridIsa() {
  const int forced = forced_isa.load(std::memory_order_relaxed);
  return forced < 0 ? BestGridIsa() : static_cast<GridIsa>(forced);
}

bool UseGridProducts() { return ActiveGridIsa() != GridIsa::kPortable; }

GridIsa SetGridIsaForTesting(GridIsa isa) {
  const GridIsa before = ActiveGridIsa();
  forced_isa.store(GridIsaSupported(isa) ? static_cast<int>(isa) : -1,
                   std::memory_order_relaxed);
  return before;
}

void GridConvForward(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* b,
                     const int64_t* b_rows, const GridLines& lines, const float* init, float* out,
                     int64_t ld_out) {
  if (rows <= 0 || lines.count <= 0 || lines.width <= 0) return;
  switch (ActiveGridIsa()) {
#if defined(CASTOR_GRID_CONV_X86)
    case GridIsa::kAvx512: {
      const std::vector<Run>& runs = RunsOf(lines, avx512::Vec::kWidth);
      avx512::ForwardEntry(rows, depth, a, lda, b, b_rows, runs.data(),
                           static_cast<int64_t>(runs.size()), init, out, ld_out);
      return;
    }
    case GridIsa::kAvx2: {
      const std::vector<Run>& runs = RunsOf(lines, avx2::Vec::kWidth);
      avx2::ForwardEntry(rows, depth, a, lda, b, b_rows, runs.data(),
                         static_cast<int64_t>(runs.size()), init, out, ld_out);
      return;
    }
#endif
    default: {
      const std::vector<Run>& runs = RunsOf(lines, portable::Vec::kWidth);
      portable::Forward(rows, depth, a, lda, b, b_rows, runs.data(),
                        static_cast<int64_t>(runs.size()), init, out, ld_out);
      return;
    }
  }
}

void GridConvFilterGrad(int64_t rows, int64_t depth, const float* dy, int64_t ld_dy,
                        const float* b, const int64_t* b_rows, const GridLines& lines,
                        const GridImages& images, float* dw, int64_t ld_dw) {
  if (rows <= 0 || depth <= 0 || lines.count <= 0 || lines.width <= 0 || images.count <= 0) {
    return;
  }
  switch (ActiveGridIsa()) {
#if defined(CASTOR_GRID_CONV_X86)
    case GridIsa::kAvx512:
      avx512::FilterGradEntry(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
      return;
    case GridIsa::kAvx2:
      avx2::FilterGradEntry(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
      return;
#endif
    default:
      portable::FilterGrad(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
      return;
  }
}

bool UseGridBFloat16Products() {
#if defined(CASTOR_GRID_CONV_X86)
  return ActiveGridIsa() == GridIsa::kAvx512 && Avx512Bf16Available();
#else
  return false;
#endif
}

namespace {

template <typename Out>
void ForwardBFloat16Pairs(int64_t rows, int64_t pair_depth, const uint32_t* a, int64_t lda,
                          const uint32_t* b, const int64_t* b_rows, const GridLines& lines,
                          const float* init, Out* out, int64_t ld_out) {
  if (rows <= 0 || lines.count <= 0 || lines.width <= 0) return;
#if defined(CASTOR_GRID_CONV_X86)
  if (UseGridBFloat16Products()) {
    const std::vector<Run>& runs = RunsOf(lines, avx512bf16_pairs::Vec::kWidth);
    avx512bf16_pairs::ForwardEntry(rows, pair_depth, a, lda, b, b_rows, runs.data(),
                                   static_cast<int64_t>(runs.size()), init, out, ld_out);
    return;
  }
#endif
  std::abort();  // callers check UseGridBFloat16Products() first
}

}  // namespace

void GridConvForwardBFloat16Pairs(int64_t rows, int64_t pair_depth, const uint32_t* a,
                                  int64_t lda, const uint32_t* b, const int64_t* b_rows,
                                  const GridLines& lines, const float* init, float* out,
                                  int64_t ld_out) {
  ForwardBFloat16Pairs(rows, pair_depth, a, lda, b, b_rows, lines, init, out, ld_out);
}

void GridConvForwardBFloat16Pairs(int64_t rows, int64_t pair_depth, const uint32_t* a,
                                  int64_t lda, const uint32_t* b, const int64_t* b_rows,
                                  const GridLines& lines, const float* init, BFloat16* out,
                                  int64_t ld_out) {
  ForwardBFloat16Pairs(rows, pair_depth, a, lda, b, b_rows, lines, init, &out->bits, ld_out);
}

void GridConvForwardBFloat16PairRows(int64_t rows, int64_t pair_depth, const uint32_t* a,
                                     int64_t lda, const uint32_t* b, const int64_t* b_rows,
                                     const RowPositions& positions, const float* init,
                                     BFloat16* out, int64_t ld_out) {
  if (rows <= 0 || positions.end <= positions.begin) return;
#if defined(CASTOR_GRID_CONV_X86)
  if (UseGridBFloat16Products()) {
    avx512bf16_pairs::ForwardRowsEntry(rows, pair_depth, a, lda, b, b_rows, positions, init,
                                       &out->bits, ld_out);
    return;
  }
#endif
  std::abort();  // callers check UseGridBFloat16Products() first
}

void GridConvFilterGradBFloat16(int64_t rows, int64_t depth, const uint16_t* dy, int64_t ld_dy,
                                const uint16_t* b, const int64_t* b_rows, const GridLines& lines,
                                const GridImages& images, float* dw, int64_t ld_dw) {
  if (rows <= 0 || depth <= 0 || lines.count <= 0 || lines.width <= 0 || images.count <= 0) {
    return;
  }
#if defined(CASTOR_GRID_CONV_X86)
  if (UseGridBFloat16Products()) {
    avx512bf16::FilterGradEntry(rows, depth, dy, ld_dy, b, b_rows, lines, images, dw, ld_dw);
    return;
  }
#endif
  std::abort();  // callers check UseGridBFloat16Products() first
}

}  // namespace castor::cpu
