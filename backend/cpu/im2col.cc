// im2col helpers for the CPU Conv and pooling kernels (see im2col.h).
#include "backend/cpu/im2col.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/grid_conv.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define CASTOR_IM2COL_X86 1
#include <immintrin.h>
#endif

namespace castor::cpu {
namespace {
#if defined(CASTOR_IM2COL_X86)
#pragma GCC push_options
#pragma GCC target("avx512f")
// FillPaddedPlaneVector's loop. Lane j of a row's vector at column j0 reads
// src_line[j0 + j - left] where that lies in [0, in_w): masked-off lanes
// are neither read nor faulted on, and store zeros.
void FillPaddedPlaneAvx512(const float* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, float* dst) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < rows; ++i, dst += cols) {
    const int64_t ih = i - top;
    const bool inside = ih >= 0 && ih < in_h;
    const uintptr_t line = inside ? reinterpret_cast<uintptr_t>(src + ih * src_stride) : 0;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const __mmask16 store = static_cast<__mmask16>(
          cols - j0 >= 16 ? 0xFFFFu : (1u << (cols - j0)) - 1u);
      __mmask16 load = 0;
      if (inside) {  // lanes with 0 <= j0 + j - left < in_w
        const __m512i column = _mm512_add_epi32(lanes, _mm512_set1_epi32(int(j0 - left)));
        load = _mm512_cmpge_epi32_mask(column, _mm512_setzero_si512()) &
               _mm512_cmplt_epi32_mask(column, _mm512_set1_epi32(int(in_w))) & store;
      }
      // (The address is formed only for lanes inside the line: j0 - left may
      // be negative, so offset the line pointer by integers, not before it.)
      const float* from = reinterpret_cast<const float*>(
          line + static_cast<uintptr_t>((j0 - left) * int64_t{sizeof(float)}));
      const __m512 v = _mm512_maskz_loadu_ps(load, from);
      _mm512_mask_storeu_ps(dst + j0, store, v);
    }
  }
  _mm256_zeroupper();
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
// Lanes [lo, hi) of 32, both clamped to [0, 32].
__mmask32 LaneRun(int64_t lo, int64_t hi) {
  lo = std::clamp<int64_t>(lo, 0, 32);
  hi = std::clamp<int64_t>(hi, lo, 32);
  const uint64_t below_hi = hi == 32 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return static_cast<__mmask32>(below_hi & ~((uint64_t{1} << lo) - 1));
}

// FillPaddedPlaneAvx512 for 16-bit elements, 32 lanes at a time: the lanes
// inside the line are one contiguous run [lo, hi) of each vector, so the
// masks come from integer arithmetic.
void FillPaddedPlane16Avx512(const uint16_t* src, int64_t in_h, int64_t in_w,
                             int64_t src_stride, int64_t top, int64_t left, int64_t rows,
                             int64_t cols, uint16_t* dst) {
  for (int64_t i = 0; i < rows; ++i, dst += cols) {
    const int64_t ih = i - top;
    const bool inside = ih >= 0 && ih < in_h;
    const uintptr_t line = inside ? reinterpret_cast<uintptr_t>(src + ih * src_stride) : 0;
    for (int64_t j0 = 0; j0 < cols; j0 += 32) {
      const __mmask32 store = LaneRun(0, cols - j0);
      const __mmask32 load = inside ? LaneRun(left - j0, in_w + left - j0) & store : 0;
      const uint16_t* from = reinterpret_cast<const uint16_t*>(
          line + static_cast<uintptr_t>((j0 - left) * int64_t{sizeof(uint16_t)}));
      _mm512_mask_storeu_epi16(dst + j0, store, _mm512_maskz_loadu_epi16(load, from));
    }
  }
  _mm256_zeroupper();
}

// FillPaddedPlane16Avx512 for a pair of planes at once, written
// interleaved: dst position q holds first's element in its low half and
// second's (zeros without `second`) in its high half. Each 32 columns of a
// row are the two planes' padded vectors, interleaved by two permutes.
void FillPaddedPairPlaneAvx512(const uint16_t* first, const uint16_t* second, int64_t in_h,
                               int64_t in_w, int64_t src_stride, int64_t top, int64_t left,
                               int64_t rows, int64_t cols, uint32_t* dst) {
  // Output lane 2i takes the first operand's lane i (of the half), lane
  // 2i + 1 the second's (index bit 5 picks the second operand).
  alignas(64) uint16_t low_index[32], high_index[32];
  for (int i = 0; i < 16; ++i) {
    low_index[2 * i] = static_cast<uint16_t>(i);
    low_index[2 * i + 1] = static_cast<uint16_t>(32 + i);
    high_index[2 * i] = static_cast<uint16_t>(16 + i);
    high_index[2 * i + 1] = static_cast<uint16_t>(48 + i);
  }
  const __m512i low = _mm512_load_si512(low_index);
  const __m512i high = _mm512_load_si512(high_index);
  for (int64_t i = 0; i < rows; ++i, dst += cols) {
    const int64_t ih = i - top;
    const bool inside = ih >= 0 && ih < in_h;
    const int64_t line_offset = inside ? ih * src_stride : 0;
    const uintptr_t first_line = inside ? reinterpret_cast<uintptr_t>(first + line_offset) : 0;
    const uintptr_t second_line =
        inside && second != nullptr ? reinterpret_cast<uintptr_t>(second + line_offset) : 0;
    for (int64_t j0 = 0; j0 < cols; j0 += 32) {
      const __mmask32 store = LaneRun(0, cols - j0);
      const __mmask32 load = inside ? LaneRun(left - j0, in_w + left - j0) & store : 0;
      const uintptr_t shift = static_cast<uintptr_t>((j0 - left) * int64_t{sizeof(uint16_t)});
      const __m512i a =
          _mm512_maskz_loadu_epi16(load, reinterpret_cast<const uint16_t*>(first_line + shift));
      const __m512i b = _mm512_maskz_loadu_epi16(
          second_line != 0 ? load : 0, reinterpret_cast<const uint16_t*>(second_line + shift));
      _mm512_mask_storeu_epi32(dst + j0, static_cast<__mmask16>(store),
                               _mm512_permutex2var_epi16(a, low, b));
      _mm512_mask_storeu_epi32(dst + j0 + 16, static_cast<__mmask16>(store >> 16),
                               _mm512_permutex2var_epi16(a, high, b));
    }
  }
  _mm256_zeroupper();
}
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")

// SpreadRows with step 2: 8 floats at a time are duplicated into lane
// pairs by a permute and stored under an even-lane mask, so the odd
// positions (the other column phase's) keep their values. (A masked
// expand-load did the same at a fraction of the speed on Zen 4.)
void SpreadRowsStep2Avx512(const float* src, int64_t n, int64_t lines, float* dst,
                           int64_t dst_stride) {
  constexpr __mmask16 kEven = 0x5555;
  const __m512i pairs = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const int64_t tail = n % 8;
  const __mmask16 tail_load = static_cast<__mmask16>((1u << tail) - 1u);
  const __mmask16 tail_store =
      tail == 0 ? 0 : static_cast<__mmask16>(kEven & ((1u << (2 * tail - 1)) - 1u));
  for (int64_t l = 0; l < lines; ++l, src += n, dst += dst_stride) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m512 v = _mm512_maskz_loadu_ps(0xff, src + j);
      _mm512_mask_storeu_ps(dst + 2 * j, kEven, _mm512_maskz_permutexvar_ps(kEven, pairs, v));
    }
    if (tail != 0) {
      const __m512 v = _mm512_maskz_loadu_ps(tail_load, src + j);
      _mm512_mask_storeu_ps(dst + 2 * j, tail_store,
                            _mm512_maskz_permutexvar_ps(tail_store, pairs, v));
    }
  }
  _mm256_zeroupper();
}
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")

// SpreadRowsStep2Avx512 for 16-bit elements: 16 at a time into the even
// lanes of 32.
void SpreadRows16Step2Avx512(const uint16_t* src, int64_t n, int64_t lines, uint16_t* dst,
                             int64_t dst_stride) {
  constexpr __mmask32 kEven = 0x55555555u;
  const __m512i pairs =
      _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6, 5,
                       5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const int64_t tail = n % 16;
  const __mmask32 tail_load = static_cast<__mmask32>((1u << tail) - 1u);
  const __mmask32 tail_store =
      tail == 0 ? 0 : static_cast<__mmask32>(kEven & ((1u << (2 * tail - 1)) - 1u));
  for (int64_t l = 0; l < lines; ++l, src += n, dst += dst_stride) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m512i v = _mm512_maskz_loadu_epi16(0xffffu, src + j);
      _mm512_mask_storeu_epi16(dst + 2 * j, kEven, _mm512_permutexvar_epi16(pairs, v));
    }
    if (tail != 0) {
      const __m512i v = _mm512_maskz_loadu_epi16(tail_load, src + j);
      _mm512_mask_storeu_epi16(dst + 2 * j, tail_store, _mm512_permutexvar_epi16(pairs, v));
    }
  }
  _mm256_zeroupper();
}

// GatherEveryOther: 16 elements at a time, the even 16-bit halves of 16
// 32-bit words narrowed out (VPMOVDW).
void GatherEveryOtherAvx512(const uint16_t* src, int64_t src_stride, int64_t n, int64_t lines,
                            uint16_t* dst, int64_t dst_stride) {
  for (int64_t l = 0; l < lines; ++l, src += src_stride, dst += dst_stride) {
    for (int64_t j = 0; j < n; j += 16) {
      const int64_t count = std::min<int64_t>(16, n - j);
      const __mmask32 load = static_cast<__mmask32>((uint64_t{1} << (2 * count - 1)) - 1);
      const __m512i words = _mm512_maskz_loadu_epi16(load, src + 2 * j);
      _mm512_mask_cvtepi32_storeu_epi16(dst + j, static_cast<__mmask16>((1u << count) - 1u),
                                        words);
    }
  }
  _mm256_zeroupper();
}
#pragma GCC pop_options
#endif  // CASTOR_IM2COL_X86

}  // namespace

bool FillPaddedPlaneVector(const float* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, float* dst) {
#if defined(CASTOR_IM2COL_X86)
  constexpr int64_t kLimit = int64_t{1} << 30;  // lane columns are int32
  if (ActiveGridIsa() == GridIsa::kAvx512 && in_w < kLimit && left < kLimit && cols < kLimit) {
    FillPaddedPlaneAvx512(src, in_h, in_w, src_stride, top, left, rows, cols, dst);
    return true;
  }
#endif
  (void)src, (void)in_h, (void)in_w, (void)src_stride, (void)top, (void)left, (void)rows;
  (void)cols, (void)dst;
  return false;
}

bool FillPaddedPlaneVector(const uint16_t* src, int64_t in_h, int64_t in_w, int64_t src_stride,
                           int64_t top, int64_t left, int64_t rows, int64_t cols, uint16_t* dst) {
#if defined(CASTOR_IM2COL_X86)
  if (ActiveGridIsa() == GridIsa::kAvx512 && HostCpuFeatures().avx512bw) {
    FillPaddedPlane16Avx512(src, in_h, in_w, src_stride, top, left, rows, cols, dst);
    return true;
  }
#endif
  (void)src, (void)in_h, (void)in_w, (void)src_stride, (void)top, (void)left, (void)rows;
  (void)cols, (void)dst;
  return false;
}

void FillPaddedPairPlane(const BFloat16* first, const BFloat16* second, int64_t in_h,
                         int64_t in_w, int64_t src_stride, int64_t top, int64_t left,
                         int64_t rows, int64_t cols, uint32_t* dst) {
#if defined(CASTOR_IM2COL_X86)
  if (ActiveGridIsa() == GridIsa::kAvx512 && HostCpuFeatures().avx512bw) {
    FillPaddedPairPlaneAvx512(&first->bits, second != nullptr ? &second->bits : nullptr, in_h,
                              in_w, src_stride, top, left, rows, cols, dst);
    return;
  }
#endif
  for (int64_t i = 0; i < rows; ++i, dst += cols) {
    const int64_t ih = i - top;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t iw = j - left;
      const bool inside = ih >= 0 && ih < in_h && iw >= 0 && iw < in_w;
      const int64_t at = ih * src_stride + iw;
      dst[j] = inside ? BFloat16Pair(first[at].bits, second != nullptr ? second[at].bits : 0) : 0;
    }
  }
}

int64_t ImagesPerColumnGemm(const common::WindowGeometry& g, int64_t rows, int64_t batch,
                            int64_t threads) {
  const int64_t p = std::max<int64_t>(1, g.output_size());
  int64_t images = std::min<int64_t>(
      (256 + p - 1) / p, 2 * kTileColumnElements / std::max<int64_t>(1, rows * p));
  images = std::clamp<int64_t>(images, 1, std::max<int64_t>(1, batch));
  threads = std::max<int64_t>(1, threads);
  const int64_t groups = ((batch + images - 1) / images + threads - 1) / threads * threads;
  return std::max<int64_t>(1, (batch + groups - 1) / groups);
}

FewPositionColumns::FewPositionColumns(const common::WindowGeometry& g, bool drop_dead_taps)
    : positions_(g.output_size()), in_size_(g.input_size()), kernel_size_(g.kernel_size()) {
  const int nd = g.num_spatial;
  std::vector<int64_t> kidx(nd), oidx(nd);
  for (int64_t tap = 0; tap < g.kernel_size(); ++tap) {
    for (int64_t rest = tap, d = nd - 1; d >= 0; --d) {
      kidx[d] = rest % g.kernel[d];
      rest /= g.kernel[d];
    }
    std::vector<int64_t> reads(static_cast<size_t>(positions_), -1);
    bool live = false;
    for (int64_t q = 0; q < positions_; ++q) {
      int64_t offset = 0;
      for (int64_t rest = q, d = nd - 1; d >= 0; --d) {
        oidx[d] = rest % g.output[d];
        rest /= g.output[d];
      }
      for (int d = 0; d < nd && offset >= 0; ++d) {
        const int64_t i = oidx[d] * g.strides[d] - g.pad_begin[d] + kidx[d] * g.dilations[d];
        offset = i >= 0 && i < g.input[d] ? offset * g.input[d] + i : -1;
      }
      reads[q] = offset;
      live |= offset >= 0;
    }
    if (!live && drop_dead_taps) continue;
    taps_.push_back(tap);
    reads_.insert(reads_.end(), reads.begin(), reads.end());
  }
}

void FewPositionColumns::ScatterAdd(const float* col, int64_t col_ld, int64_t channels,
                                    float* x) const {
  const int64_t taps = static_cast<int64_t>(taps_.size());
  for (int64_t c = 0; c < channels; ++c) {
    float* plane = x + c * in_size_;
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t* at = reads_.data() + t * positions_;
      const float* src = col + (c * taps + t) * col_ld;
      for (int64_t q = 0; q < positions_; ++q) {
        if (at[q] >= 0) plane[at[q]] += src[q];
      }
    }
  }
}

void FewPositionColumns::AddKeptTaps(const float* kept, int64_t rows, float* dw) const {
  const int64_t taps = static_cast<int64_t>(taps_.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < taps; ++t) dw[r * kernel_size_ + taps_[t]] += kept[r * taps + t];
  }
}

bool RowProductsPay(const common::WindowGeometry& g) {
  if (g.num_spatial != 2 || g.strides[0] != 1 || g.strides[1] != 1 ||
      g.output[1] != g.input[1] || g.output[0] <= 0 || g.kernel[1] > kMaxRowShifts) {
    return false;
  }
  const int64_t row_vectors = (g.output[0] * g.output[1] + 15) / 16;
  const int64_t padded_vectors = g.output[0] * ((g.output[1] + 15) / 16);
  return 5 * row_vectors <= 4 * padded_vectors;
}

PairRowGrid::PairRowGrid(int64_t planes, int64_t rows, int64_t width, int64_t top,
                         const std::vector<int64_t>& line_offsets,
                         const std::vector<int64_t>& column_shifts)
    : planes_(planes), rows_(rows), width_(width), top_(top), plane_(rows * width),
      shifts_(column_shifts) {
  int64_t lowest = 0, highest = 0;  // offsets from a position's own address
  for (int64_t k = 0; k < planes; ++k) {
    for (const int64_t line : line_offsets) {
      for (size_t s = 0; s < column_shifts.size(); ++s) {
        const int64_t offset = line * width + column_shifts[s];
        pair_rows_.push_back(k * plane_ + offset);
        shift_index_.push_back(static_cast<uint8_t>(s));
        lowest = std::min(lowest, offset);
        highest = std::max(highest, offset);
      }
    }
  }
  // A product's positions are those of the planes' lines below the lowest
  // line offset; its last vector reaches 15 past the last.
  lead_ = -lowest;
  trail_ = std::max<int64_t>(0, highest) + 16;
}

uint32_t* PairRowGrid::Planes(uint32_t* buffer) const {
  uint32_t* planes = buffer + lead_;
  std::fill(buffer, planes, 0u);
  std::fill(planes + planes_ * plane_, planes + planes_ * plane_ + trail_, 0u);
  return planes;
}

void PairRowGrid::Fill(const BFloat16* source, int64_t channels, int64_t lines,
                       int64_t channel_stride, int64_t plane_lo, int64_t plane_hi,
                       uint32_t* planes) const {
  for (int64_t k = plane_lo; k < plane_hi; ++k) {
    const BFloat16* first = source + 2 * k * channel_stride;
    FillPaddedPairPlane(first, 2 * k + 1 < channels ? first + channel_stride : nullptr, lines,
                        width_, width_, top_, 0, rows_, width_, planes + k * plane_);
  }
}

RowPositions PairRowGrid::Positions(int64_t begin, int64_t end) const {
  return RowPositions{begin, end, width_, shift_index_.data(), shifts_.data(),
                      static_cast<int>(shifts_.size())};
}

void FillPairGrid(const BFloat16* x, int64_t channels, int64_t pair_lo, int64_t pair_hi,
                  const PaddedGrid& grid, uint32_t* pairs) {
  const common::WindowGeometry& g = *grid.geometry;
  const int64_t in_size = g.input[0] * g.input[1];
  const int64_t channel_size = grid.channel_size();
  if (g.strides[0] == 1 && g.strides[1] == 1) {  // one plane per pair, filled in one pass
    for (int64_t k = pair_lo; k < pair_hi; ++k) {
      const BFloat16* first = x + 2 * k * in_size;
      FillPaddedPairPlane(first, 2 * k + 1 < channels ? first + in_size : nullptr, g.input[0],
                          g.input[1], g.input[1], g.pad_begin[0], g.pad_begin[1], grid.rows,
                          grid.cols, pairs + k * channel_size);
    }
    return;
  }
  // The pair's two channels on the bfloat16 grid, then side by side.
  thread_local std::vector<BFloat16> planes;
  planes.resize(static_cast<size_t>(2 * channel_size));
  const BFloat16* first = planes.data();
  const BFloat16* second = planes.data() + channel_size;
  for (int64_t k = pair_lo; k < pair_hi; ++k) {
    const int64_t count = std::min<int64_t>(2, channels - 2 * k);
    FillGrid<BFloat16, BFloat16>(x + 2 * k * in_size, 0, count, grid, planes.data());
    uint32_t* dst = pairs + k * channel_size;
    for (int64_t a = 0; a < g.strides[0]; ++a) {
      for (int64_t b = 0; b < g.strides[1]; ++b) {
        if (!grid.PhaseUsed(a, b)) continue;
        const int64_t at = (a * g.strides[1] + b) * grid.plane();
        for (int64_t q = at; q < at + grid.plane(); ++q) {
          dst[q] = uint32_t{first[q].bits} | (count == 2 ? uint32_t{second[q].bits} << 16 : 0u);
        }
      }
    }
  }
}

void SpreadRows(const float* src, int64_t n, int64_t lines, int64_t step, float* dst,
                int64_t dst_stride) {
#if defined(CASTOR_IM2COL_X86)
  if (step == 2 && ActiveGridIsa() == GridIsa::kAvx512) {
    SpreadRowsStep2Avx512(src, n, lines, dst, dst_stride);
    return;
  }
#endif
  for (int64_t l = 0; l < lines; ++l, src += n, dst += dst_stride) {
    for (int64_t j = 0; j < n; ++j) dst[j * step] = src[j];
  }
}

void GatherEveryOther(const uint16_t* src, int64_t src_stride, int64_t n, int64_t lines,
                      uint16_t* dst, int64_t dst_stride) {
#if defined(CASTOR_IM2COL_X86)
  if (ActiveGridIsa() == GridIsa::kAvx512 && HostCpuFeatures().avx512bw) {
    GatherEveryOtherAvx512(src, src_stride, n, lines, dst, dst_stride);
    return;
  }
#endif
  for (int64_t l = 0; l < lines; ++l, src += src_stride, dst += dst_stride) {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[2 * j];
  }
}

void SpreadRows(const uint16_t* src, int64_t n, int64_t lines, int64_t step, uint16_t* dst,
                int64_t dst_stride) {
#if defined(CASTOR_IM2COL_X86)
  if (step == 2 && ActiveGridIsa() == GridIsa::kAvx512 && HostCpuFeatures().avx512bw) {
    SpreadRows16Step2Avx512(src, n, lines, dst, dst_stride);
    return;
  }
#endif
  for (int64_t l = 0; l < lines; ++l, src += n, dst += dst_stride) {
    for (int64_t j = 0; j < n; ++j) dst[j * step] = src[j];
  }
}

std::vector<AxisWindows> BuildAxisWindows(const common::WindowGeometry& g) {
  std::vector<AxisWindows> axes(g.num_spatial);
  for (int d = 0; d < g.num_spatial; ++d) {
    AxisWindows& a = axes[d];
    a.begin.push_back(0);
    for (int64_t o = 0; o < g.output[d]; ++o) {
      const int64_t start = o * g.strides[d] - g.pad_begin[d];
      int64_t padded = 0;
      for (int64_t k = 0; k < g.kernel[d]; ++k) {
        const int64_t i = start + k * g.dilations[d];
        if (i >= 0 && i < g.input[d]) a.idx.push_back(i);
        if (i >= -g.pad_begin[d] && i < g.input[d] + g.pad_end[d]) ++padded;
      }
      a.begin.push_back(static_cast<int64_t>(a.idx.size()));
      a.padded_count.push_back(padded);
    }
  }
  return axes;
}

}  // namespace castor::cpu
