// StridedCopy and ParallelMemcpy (see strided_copy.h).
#include "backend/cpu/strided_copy.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/parallel.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// Bytes one parallel chunk should move at least (below this threads cost
// more than they save).
constexpr int64_t kBytesPerChunk = 64 * 1024;

struct Axis {
  int64_t size;
  int64_t src_stride;
  int64_t dst_stride;
};

// Copies `count` elements of one inner row with element strides.
template <typename Word>
void CopyRow(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t count) {
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  for (int64_t i = 0; i < count; ++i) d[i * dst_stride] = s[i * src_stride];
}

// Copies one dense row of kBytes bytes.
template <size_t kBytes>
struct FixedRowCopy {
  void operator()(const char* src, char* dst) const { std::memcpy(dst, src, kBytes); }
};

void CopyRowBytes(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t count,
                  size_t element_size) {
  if (src_stride == 1 && dst_stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(count) * element_size);
    return;
  }
  switch (element_size) {
    case 1: CopyRow<uint8_t>(src, src_stride, dst, dst_stride, count); return;
    case 2: CopyRow<uint16_t>(src, src_stride, dst, dst_stride, count); return;
    case 4: CopyRow<uint32_t>(src, src_stride, dst, dst_stride, count); return;
    case 8: CopyRow<uint64_t>(src, src_stride, dst, dst_stride, count); return;
    default:
      for (int64_t i = 0; i < count; ++i) {
        std::memcpy(dst + i * dst_stride * static_cast<int64_t>(element_size),
                    src + i * src_stride * static_cast<int64_t>(element_size), element_size);
      }
  }
}

#if defined(__SSE2__)
// The 8 x 8 block of 16-bit elements at src (rows src_stride apart) to dst
// transposed (rows dst_stride apart): three rounds of interleaves.
void Transpose8x8Words(const uint16_t* src, int64_t src_stride, uint16_t* dst,
                       int64_t dst_stride) {
  __m128i a[8], b[8], c[8];
  for (int r = 0; r < 8; ++r) {
    a[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * src_stride));
  }
  for (int r = 0; r < 8; r += 2) {
    b[r] = _mm_unpacklo_epi16(a[r], a[r + 1]);
    b[r + 1] = _mm_unpackhi_epi16(a[r], a[r + 1]);
  }
  for (int q = 0; q < 8; q += 4) {  // rows q..q+3: pairs (b[q], b[q+2]) and (b[q+1], b[q+3])
    c[q] = _mm_unpacklo_epi32(b[q], b[q + 2]);
    c[q + 1] = _mm_unpackhi_epi32(b[q], b[q + 2]);
    c[q + 2] = _mm_unpacklo_epi32(b[q + 1], b[q + 3]);
    c[q + 3] = _mm_unpackhi_epi32(b[q + 1], b[q + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // columns 2k and 2k + 1 from rows 0-3 and 4-7
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * k) * dst_stride),
                     _mm_unpacklo_epi64(c[k], c[k + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * k + 1) * dst_stride),
                     _mm_unpackhi_epi64(c[k], c[k + 4]));
  }
}

// The same for 4 x 4 blocks of 32-bit elements.
void Transpose4x4Words(const uint32_t* src, int64_t src_stride, uint32_t* dst,
                       int64_t dst_stride) {
  __m128i a[4];
  for (int r = 0; r < 4; ++r) {
    a[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * src_stride));
  }
  const __m128i b0 = _mm_unpacklo_epi32(a[0], a[1]), b1 = _mm_unpackhi_epi32(a[0], a[1]);
  const __m128i b2 = _mm_unpacklo_epi32(a[2], a[3]), b3 = _mm_unpackhi_epi32(a[2], a[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi64(b0, b2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + dst_stride), _mm_unpackhi_epi64(b0, b2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * dst_stride), _mm_unpacklo_epi64(b1, b3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 3 * dst_stride), _mm_unpackhi_epi64(b1, b3));
}

// A transpose inside the copy: the inner axis (dst stride 1) is strided in
// src, and the outer axis just before it, `across`, is contiguous in src.
// Each [across x inner] plane (one per index of the remaining outer axes)
// is copied in square blocks of kTile x kTile elements that are transposed
// in registers: every load and store moves kTile contiguous elements, where
// the row-by-row copy gathered one element per strided load. Edges that do
// not fill a block are copied element by element.
template <typename Word, int kTile>
void CopyTransposedPlanes(const std::vector<Axis>& planes, const Axis& across, const Axis& inner,
                          const Word* src, Word* dst) {
  int64_t plane_count = 1;
  for (const Axis& a : planes) plane_count *= a.size;
  const int64_t bands = (across.size + kTile - 1) / kTile;  // kTile rows of `across` each
  const int64_t grain = std::max<int64_t>(1, kBytesPerChunk / (kTile * inner.size * sizeof(Word)));
  ParallelFor(0, plane_count * bands, grain, [&planes, across, inner, src, dst,
                                              bands](int64_t lo, int64_t hi) {
    const std::vector<Axis> outer = planes;  // this thread's copy (see StridedCopy)
    for (int64_t task = lo; task < hi; ++task) {
      int64_t plane = task / bands;
      const int64_t a0 = task % bands * kTile;
      int64_t src_offset = a0 * across.src_stride, dst_offset = a0 * across.dst_stride;
      for (int64_t k = static_cast<int64_t>(outer.size()) - 1; k >= 0; --k) {
        const int64_t index = plane % outer[k].size;
        plane /= outer[k].size;
        src_offset += index * outer[k].src_stride;
        dst_offset += index * outer[k].dst_stride;
      }
      const Word* s = src + src_offset;
      Word* d = dst + dst_offset;
      const int64_t rows = std::min<int64_t>(kTile, across.size - a0);
      int64_t c0 = 0;
      if (rows == kTile) {
        for (; c0 + kTile <= inner.size; c0 += kTile) {
          if constexpr (kTile == 8) {
            Transpose8x8Words(s + c0 * inner.src_stride, inner.src_stride, d + c0,
                              across.dst_stride);
          } else {
            Transpose4x4Words(s + c0 * inner.src_stride, inner.src_stride, d + c0,
                              across.dst_stride);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = c0; c < inner.size; ++c) {
          d[r * across.dst_stride + c] = s[c * inner.src_stride + r];
        }
      }
    }
  });
}
#endif  // __SSE2__

}  // namespace

void ParallelMemcpy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (static_cast<int64_t>(bytes) < 4 * kBytesPerChunk) {
    std::memcpy(dst, src, bytes);
    return;
  }
  ParallelFor(0, static_cast<int64_t>(bytes), kBytesPerChunk, [&](int64_t lo, int64_t hi) {
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo,
                static_cast<size_t>(hi - lo));
  });
}

void StridedCopy(const std::vector<int64_t>& dims, size_t element_size, const void* src,
                 const std::vector<int64_t>& src_strides, void* dst,
                 const std::vector<int64_t>& dst_strides) {
  // Drop size-1 axes, then merge each axis into the next inner one when both
  // views are contiguous across them.
  std::vector<Axis> axes;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) return;
    if (dims[i] != 1) axes.push_back({dims[i], src_strides[i], dst_strides[i]});
  }
  std::vector<Axis> merged;
  for (const Axis& a : axes) {
    if (!merged.empty()) {
      Axis& outer = merged.back();
      // `outer` precedes `a`; they merge when outer's stride spans a.
      if (outer.src_stride == a.size * a.src_stride && outer.dst_stride == a.size * a.dst_stride) {
        outer = {outer.size * a.size, a.src_stride, a.dst_stride};
        continue;
      }
    }
    merged.push_back(a);
  }
  const char* src_bytes = static_cast<const char*>(src);
  char* dst_bytes = static_cast<char*>(dst);
  if (merged.empty()) {
    std::memcpy(dst_bytes, src_bytes, element_size);
    return;
  }
  const Axis inner = merged.back();
  merged.pop_back();
  int64_t rows = 1;
  for (const Axis& a : merged) rows *= a.size;
  const int64_t element_bytes = static_cast<int64_t>(element_size);
  if (rows == 1 && inner.src_stride == 1 && inner.dst_stride == 1) {
    ParallelMemcpy(dst_bytes, src_bytes, static_cast<size_t>(inner.size * element_bytes));
    return;
  }
#if defined(__SSE2__)
  // A transpose of the two innermost axes (see CopyTransposedPlanes).
  if (!merged.empty() && inner.dst_stride == 1 && inner.src_stride != 1 &&
      merged.back().src_stride == 1 && (element_size == 2 || element_size == 4)) {
    const Axis across = merged.back();
    merged.pop_back();
    if (element_size == 2) {
      CopyTransposedPlanes<uint16_t, 8>(merged, across, inner,
                                        reinterpret_cast<const uint16_t*>(src_bytes),
                                        reinterpret_cast<uint16_t*>(dst_bytes));
    } else {
      CopyTransposedPlanes<uint32_t, 4>(merged, across, inner,
                                        reinterpret_cast<const uint32_t*>(src_bytes),
                                        reinterpret_cast<uint32_t*>(dst_bytes));
    }
    return;
  }
#endif
  const int64_t row_bytes = std::max<int64_t>(1, inner.size * element_bytes);
  const int64_t grain = std::max<int64_t>(1, kBytesPerChunk / row_bytes);
  // Each chunk copies the outer axes before its loop. Read through the
  // caller's `merged` instead, the worker shared a cache line with the
  // caller's odometer (the next heap block), which the caller rewrites every
  // row: two threads ran the transformer's attention-head transposes 2-4x
  // slower than one.
  ParallelFor(0, rows, grain, [&merged, inner, element_bytes, element_size, src_bytes,
                               dst_bytes](int64_t lo, int64_t hi) {
    const std::vector<Axis> outer = merged;
    const int outer_rank = static_cast<int>(outer.size());
    std::vector<int64_t> index(outer.size(), 0);
    // Odometer over the outer axes, starting at row `lo`.
    int64_t src_offset = 0, dst_offset = 0;
    for (int64_t k = outer_rank - 1, rest = lo; k >= 0; --k) {
      index[k] = rest % outer[k].size;
      rest /= outer[k].size;
      src_offset += index[k] * outer[k].src_stride;
      dst_offset += index[k] * outer[k].dst_stride;
    }
    auto each_row = [&](auto copy_row) {
      for (int64_t row = lo; row < hi; ++row) {
        copy_row(src_bytes + src_offset * element_bytes, dst_bytes + dst_offset * element_bytes);
        for (int k = outer_rank - 1; k >= 0; --k) {
          src_offset += outer[k].src_stride;
          dst_offset += outer[k].dst_stride;
          if (++index[k] < outer[k].size) break;
          src_offset -= outer[k].size * outer[k].src_stride;
          dst_offset -= outer[k].size * outer[k].dst_stride;
          index[k] = 0;
        }
      }
    };
    // Short dense rows (an attention head's 16 bfloat16 values, moved when
    // heads are split or merged) are copied with a fixed size, a few vector
    // moves, instead of a memcpy call each.
    const bool dense = inner.src_stride == 1 && inner.dst_stride == 1;
    switch (dense ? inner.size * element_bytes : 0) {
      case 16: each_row(FixedRowCopy<16>{}); return;
      case 32: each_row(FixedRowCopy<32>{}); return;
      case 64: each_row(FixedRowCopy<64>{}); return;
      default:
        each_row([&](const char* src_row, char* dst_row) {
          CopyRowBytes(src_row, inner.src_stride, dst_row, inner.dst_stride, inner.size,
                       element_size);
        });
    }
  });
}

}  // namespace castor::cpu

namespace castor::cpu {

std::vector<int64_t> ReadInts(const TensorView& view) {
  const int64_t n = view.num_elements();
  std::vector<int64_t> values(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (view.dtype) {
      case DType::kInt64: values[i] = view.as<int64_t>()[i]; break;
      case DType::kInt32: values[i] = view.as<int32_t>()[i]; break;
      case DType::kInt16: values[i] = view.as<int16_t>()[i]; break;
      case DType::kInt8: values[i] = view.as<int8_t>()[i]; break;
      case DType::kUInt8: values[i] = view.as<uint8_t>()[i]; break;
      case DType::kUInt16: values[i] = view.as<uint16_t>()[i]; break;
      case DType::kUInt32: values[i] = view.as<uint32_t>()[i]; break;
      case DType::kUInt64: values[i] = static_cast<int64_t>(view.as<uint64_t>()[i]); break;
      default: values[i] = 0; break;
    }
  }
  return values;
}

common::IntInputReader HostIntInputs(const KernelContext& ctx) {
  return [&ctx](int index) -> absl::StatusOr<std::vector<int64_t>> {
    return ReadInts(ctx.input(index));
  };
}

absl::Status NoStringTensors(const Node& node) {
  auto check = [](const Value* v) -> absl::Status {
    if (v != nullptr && v->dtype() == DType::kString) {
      return absl::UnimplementedError(
          absl::StrCat("'", v->name(),
                       "' is a string tensor; CPU kernels move fixed-size "
                       "elements only"));
    }
    return absl::OkStatus();
  };
  for (const Value* v : node.inputs()) {
    if (absl::Status s = check(v); !s.ok()) return s;
  }
  for (const Value* v : node.outputs()) {
    if (absl::Status s = check(v); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CopyInputToOutput(KernelContext& ctx, std::vector<int64_t> dims) {
  const TensorView& input = ctx.input(0);
  absl::StatusOr<TensorView*> output = ctx.Output(0, input.dtype, std::move(dims));
  if (!output.ok()) return output.status();
  if ((*output)->num_elements() != input.num_elements()) {
    return ctx.Error(absl::StrCat("internal: output ", common::DimsToString((*output)->dims),
                                  " and input ", common::DimsToString(input.dims),
                                  " differ in element count"));
  }
  ParallelMemcpy((*output)->data, input.data, input.byte_size());
  return absl::OkStatus();
}

absl::Status CopyByPlan(KernelContext& ctx, const common::CopyPlan& plan) {
  const TensorView& input = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, input.dtype, plan.out_dims));
  StridedCopy(plan.copy_dims, DTypeSize(input.dtype), input.data, plan.src_strides, out->data,
              common::ContiguousStrides(plan.copy_dims));
  return absl::OkStatus();
}

}  // namespace castor::cpu
