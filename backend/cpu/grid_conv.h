// Direct convolution products on a "grid": a zero-padded copy of one image
// (im2col.h's PaddedGrid; for ConvGrad's dX, dY with a zero border) in
// which column row k of the conv's column matrix is the contiguous slice
// b + b_rows[k] + [positions]. The forward product W * columns (Conv's Y,
// ConvGrad's dX per stride phase) and the filter gradient dY * columns^T
// (ConvGrad's dW) read those slices in place, so nothing is unrolled and no
// GEMM operand is packed: register-blocked kernels broadcast one operand
// and load the other's rows with vector loads.
//
// Both products visit `lines` of `width` positions each; a line's positions
// are consecutive in the gathered operand (the grid) and in the dense one
// (Y, dY or dX). Only those positions are written, and only their values
// reach a result: the grid's positions past each line (the next line's
// values, Inf or NaN among them) cannot leak in. The forward product loads
// whole vectors, so it reads (and drops) up to kGridReadSlack - 1 floats
// past a line: the grid must extend that far past its last row.
//
// The kernels come for AVX-512, AVX2+FMA and a portable scalar loop, picked
// once at run time (the build has no -march flags; the vector code is
// compiled with per-function target options, GCC only). They accumulate in
// float32 in their own order, so results agree with a GEMM's to float32
// rounding, not bit for bit; every instruction set gives the same bits run
// after run.
#pragma once

#include <cstdint>

#include "backend/cpu/float_io.h"

namespace castor::cpu {

// The positions a product visits: line l (< count) covers positions
// [0, width) at l * gathered_stride in the gathered operand (the grid) and
// at l * dense_stride in the dense one.
struct GridLines {
  int64_t count = 0;
  int64_t width = 0;
  int64_t gathered_stride = 0;
  int64_t dense_stride = 0;
};

// Several images in one filter-gradient product: image i visits the lines
// of GridLines with its first line at i * gathered_stride in the gathered
// operand and at i * dense_stride in the dense one (dY). One call then
// adds each dW entry's lanes once for all of them.
struct GridImages {
  int64_t count = 1;
  int64_t gathered_stride = 0;
  int64_t dense_stride = 0;
};

// Floats past the last visited position of every gathered row that
// GridConvForward may read (callers allocate and zero them).
inline constexpr int64_t kGridReadSlack = 16;

// Forward product, for m < rows and each visited position (l, j):
//   out[m * ld_out + l * dense_stride + j] =
//       init[m] + sum_{k < depth} a[m * lda + k] * b[b_rows[k] + l * gathered_stride + j]
// `init` may be null (zeros).
void GridConvForward(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* b,
                     const int64_t* b_rows, const GridLines& lines, const float* init, float* out,
                     int64_t ld_out);

// Filter-gradient product, for m < rows and k < depth, over the images i
// and their visited positions (l, j):
//   dw[m * ld_dw + k] += sum_{(i, l, j)} dy[m * ld_dy + i * images.dense_stride +
//                                           l * lines.dense_stride + j] *
//                        b[b_rows[k] + i * images.gathered_stride +
//                          l * lines.gathered_stride + j]
void GridConvFilterGrad(int64_t rows, int64_t depth, const float* dy, int64_t ld_dy,
                        const float* b, const int64_t* b_rows, const GridLines& lines,
                        const GridImages& images, float* dw, int64_t ld_dw);

// The instruction sets the kernels come in. The best one the CPU supports
// runs unless a test picked another.
enum class GridIsa { kPortable, kAvx2, kAvx512 };
const char* GridIsaName(GridIsa isa);
bool GridIsaSupported(GridIsa isa);
GridIsa ActiveGridIsa();
// True when a vector kernel runs. The kernels (conv.cc, conv_grad.cc)
// take the grid products only then: the portable scalar loop is slower than
// OpenBLAS's GEMM on the column path (im2col), which they take otherwise.
bool UseGridProducts();
// For tests: run `isa` from now on, process-wide (an unsupported one: the
// best supported); returns the one that ran before.
GridIsa SetGridIsaForTesting(GridIsa isa);

// ---- bfloat16 products (VDPBF16PS) -------------------------------------------
//
// The same products on bfloat16 operands, summed in float32, where the CPU
// has AVX512-BF16 and the AVX-512 kernels run (UseGridBFloat16Products:
// grid_conv.h's AVX-512 set is active and avx512bf16_gemm.h's
// Avx512Bf16Available(), so CASTOR_AVX512BF16=off, or VDPBF16PS slower
// than float32, turns them off with the bfloat16 GEMM). Callers check it
// first; elsewhere they widen to float32 and take the products above,
// which stay the reference.
//
// Numerics are VDPBF16PS's (avx512bf16_gemm.h): the products are exact,
// each lane adds a pair's two products to its float32 sum in turn, rounded
// to nearest even; bfloat16 subnormals (operands and sums) count as zero.
// Results agree with the float32 products of the widened operands to
// float32 rounding of the sum's magnitude, not bit for bit.
bool UseGridBFloat16Products();

// A pair of bfloat16 in one 32-bit word: `first` in the low half.
inline uint32_t BFloat16Pair(uint16_t first, uint16_t second) {
  return uint32_t{first} | (uint32_t{second} << 16);
}

// GridConvForward with the depth taken two at a time: depth pair k of row
// m is a[m * lda + k] = BFloat16Pair(A[m][2k], A[m][2k + 1]), and column
// pair row k is the grid of pairs b + b_rows[k] (each position holding the
// pair of column rows 2k and 2k + 1 there; a missing odd row is zeros on
// both sides). So for the conv's pair grid (two channels side by side per
// position) b_rows[k] addresses channel pair k's slice as the float32 grid
// addresses one channel's. Reads as GridConvForward (kGridReadSlack pairs
// past the last visited position); init is float32, out float32 or
// bfloat16 (each float32 sum rounded once on store to nearest even: the
// bits FromFloat32 gives the float32 out, since the sums are never
// subnormal; with depth 0, init's subnormals store as zeros).
void GridConvForwardBFloat16Pairs(int64_t rows, int64_t pair_depth, const uint32_t* a,
                                  int64_t lda, const uint32_t* b, const int64_t* b_rows,
                                  const GridLines& lines, const float* init, float* out,
                                  int64_t ld_out);
void GridConvForwardBFloat16Pairs(int64_t rows, int64_t pair_depth, const uint32_t* a,
                                  int64_t lda, const uint32_t* b, const int64_t* b_rows,
                                  const GridLines& lines, const float* init, BFloat16* out,
                                  int64_t ld_out);

// ---- bfloat16 pair products over unpadded rows ------------------------------
//
// The products above give every line its own vectors, so the lanes past a
// line's end are spent on the grid's padding columns: a 28-wide line takes
// 32 lanes, a 14-wide one 16, a 7-wide one 16. Where a product's output
// lines are exactly as wide as the rows it reads (unit strides, and pads
// left + right = (kernel width - 1) * dilation: a conv that keeps its
// width), the grid leaves the horizontal padding out: its planes hold the
// input's rows as they are (the zero rows above and below stay), and the
// products visit the dense output positions q = line * width + column,
// 16 at a time across line ends (a 28x28 image: 49 vectors; 14x14: 13;
// 7x7: 4). Depth step k reads b + b_rows[k] + q where the tap's column
// lands inside the row, column + shifts[shift_index[k]] in [0, width),
// and zeros elsewhere, the values a padded grid holds there: each sum is
// the padded grid's product's to the bit (the same depth order, the same
// zeros). Masked loads read nothing outside those lanes (nor past the last
// position), but the buffer must hold every address a step forms: b +
// b_rows[k] + q for each visited q, and up to 15 past the last.
// (im2col.h's RowProductsPay says where the products apply and pay.)

// The positions such a product visits: q in [begin, end) of an output
// whose lines are `width` positions, with the column shift of each depth
// step (shift_index[k] < num_shifts, at most kMaxRowShifts: one shift per
// kernel column).
struct RowPositions {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t width = 0;
  const uint8_t* shift_index = nullptr;
  const int64_t* shifts = nullptr;
  int num_shifts = 0;
};
inline constexpr int kMaxRowShifts = 16;

// GridConvForwardBFloat16Pairs over unpadded rows: for m < rows and q in
// [positions.begin, positions.end),
//   out[m * ld_out + q] = init[m] + sum_k a[m * lda + k] . b[b_rows[k] + q]
// (bfloat16 out, rounded once; `init` may be null), where the sum skips
// the steps whose column shift takes q's column outside the row.
void GridConvForwardBFloat16PairRows(int64_t rows, int64_t pair_depth, const uint32_t* a,
                                     int64_t lda, const uint32_t* b, const int64_t* b_rows,
                                     const RowPositions& positions, const float* init,
                                     BFloat16* out, int64_t ld_out);

// GridConvFilterGrad on bfloat16 dY and grid (bit patterns), dW float32
// (accumulated into, as there). Reads only the visited positions.
void GridConvFilterGradBFloat16(int64_t rows, int64_t depth, const uint16_t* dy, int64_t ld_dy,
                                const uint16_t* b, const int64_t* b_rows, const GridLines& lines,
                                const GridImages& images, float* dw, int64_t ld_dw);

}  // namespace castor::cpu
