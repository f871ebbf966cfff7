// The direct grid-convolution products of backend/cpu/grid_conv.h, on every
// instruction set this CPU supports (AVX-512, AVX2+FMA, portable), against
// float64 sums: row counts that do and do not fill a register block, depths
// that do and do not fill a column block, run counts that leave every
// remainder of a block of runs, line widths with and without a partial
// vector (the filter gradient reads a partial vector after whole ones as an
// overlapping whole vector, and on a line shorter than a vector under a
// mask: the shapes have both for each instruction set), several images in
// one filter-gradient product, and non-finite values at the grid positions
// the products must not read. The bfloat16 products (VDPBF16PS, where the
// CPU has AVX512-BF16) the same way, against float64 sums of the bfloat16
// values: pair depths with an odd last row, and lines of 32-position
// vectors, overlapped and masked tails, or (lines of at most 24 positions,
// most shapes here) packed end to end. Also FillGrid's vector plane copy
// (float32 and 16-bit) and SpreadRows (im2col.h) against the expected
// values.
#include "backend/cpu/grid_conv.h"

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/im2col.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

// Restores the instruction set the kernels ran before the test picked one.
class ScopedGridIsa {
 public:
  explicit ScopedGridIsa(GridIsa isa) : before_(SetGridIsaForTesting(isa)) {}
  ~ScopedGridIsa() { SetGridIsaForTesting(before_); }

 private:
  GridIsa before_;
};

std::vector<GridIsa> SupportedIsas() {
  std::vector<GridIsa> isas;
  for (GridIsa isa : {GridIsa::kPortable, GridIsa::kAvx2, GridIsa::kAvx512}) {
    if (GridIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

// A padded image of `depth` rows laid out like a conv's grid: row k starts
// at b_rows[k] and line l of it at + l * stride; the positions past `width`
// in each line hold NaN and Inf, which the products must never read.
struct Gathered {
  std::vector<float> data;
  std::vector<int64_t> rows;
  GridLines lines;
};

Gathered MakeGathered(int64_t depth, int64_t count, int64_t width, int64_t extra,
                      std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Gathered g;
  g.lines = GridLines{count, width, width + extra, width};
  const int64_t plane = count * g.lines.gathered_stride;
  // Rows are whole planes here, in reverse order, so the offsets matter.
  // kGridReadSlack NaNs after the last row: the forward product may load
  // them but must drop them.
  g.data.assign(static_cast<size_t>(depth * plane + kGridReadSlack),
                std::numeric_limits<float>::quiet_NaN());
  for (int64_t k = 0; k < depth; ++k) g.rows.push_back((depth - 1 - k) * plane);
  for (int64_t p = 0; p < depth * plane; ++p) {
    const int64_t j = p % g.lines.gathered_stride;
    g.data[p] = j < width ? dist(rng)
                          : (j % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                        : std::numeric_limits<float>::infinity());
  }
  return g;
}

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

struct Shape {
  int64_t rows, depth, count, width, extra;
};
const Shape kShapes[] = {
    {16, 144, 28, 28, 2},  // a 16-channel 3x3 conv on 28x28
    {32, 288, 14, 14, 2},  // a 32-channel one on 14x14
    {5, 9, 7, 3, 2},       // rows and depth leave remainders; lines narrower than a vector
    {3, 7, 2, 37, 4},      // two full vectors and a partial one per line
    {1, 1, 1, 1, 0},
    // 9, 10 and 11 runs of one vector or less: with AVX-512's blocks of 6
    // runs the last block holds 3, 4 and 5 (AVX2's blocks of 3: 0, 1, 2).
    {4, 10, 9, 16, 2},
    {6, 5, 10, 8, 1},
    {2, 3, 11, 5, 3},
    // Depth 8: AVX-512's column blocks of 6 leave 2 (the other shapes leave
    // 0, 1, 3, 4 and 5).
    {3, 8, 4, 20, 1},
};

std::string Describe(GridIsa isa, const Shape& s) {
  return std::string(GridIsaName(isa)) + " rows " + std::to_string(s.rows) + " depth " +
         std::to_string(s.depth) + " lines " + std::to_string(s.count) + "x" +
         std::to_string(s.width);
}

TEST(GridConv, ForwardMatchesFloat64SumsOnEveryInstructionSet) {
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    ASSERT_EQ(ActiveGridIsa(), isa);
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(Describe(isa, s));
      std::mt19937 rng(7);
      const Gathered b = MakeGathered(s.depth, s.count, s.width, s.extra, rng);
      const int64_t lda = s.depth + 3;
      const std::vector<float> a = Random(s.rows * lda, rng);
      const std::vector<float> init = Random(s.rows, rng);
      const int64_t ld_out = s.count * s.width + 5;
      // Sentinels between rows must survive: only visited positions are written.
      std::vector<float> out(static_cast<size_t>(s.rows * ld_out), -7.0f);
      GridConvForward(s.rows, s.depth, a.data(), lda, b.data.data(), b.rows.data(), b.lines,
                      init.data(), out.data(), ld_out);
      for (int64_t m = 0; m < s.rows; ++m) {
        for (int64_t q = 0; q < ld_out; ++q) {
          const float got = out[m * ld_out + q];
          if (q >= s.count * s.width) {
            ASSERT_EQ(got, -7.0f) << "row " << m << " position " << q << " was written";
            continue;
          }
          const int64_t l = q / s.width, j = q % s.width;
          double want = init[m];
          double magnitude = std::fabs(init[m]);
          for (int64_t k = 0; k < s.depth; ++k) {
            const double term = static_cast<double>(a[m * lda + k]) *
                                b.data[b.rows[k] + l * b.lines.gathered_stride + j];
            want += term;
            magnitude += std::fabs(term);
          }
          ASSERT_NEAR(got, want, 4e-7 * magnitude + 1e-7) << "row " << m << " position " << q;
        }
      }
    }
  }
}

TEST(GridConv, ForwardWithoutInitStartsFromZero) {
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    SCOPED_TRACE(GridIsaName(isa));
    std::mt19937 rng(3);
    const Gathered b = MakeGathered(2, 1, 5, 1, rng);
    const std::vector<float> a = {2.0f, -1.0f};
    std::vector<float> out(5, 99.0f);
    GridConvForward(1, 2, a.data(), 2, b.data.data(), b.rows.data(), b.lines, nullptr,
                    out.data(), 5);
    for (int64_t j = 0; j < 5; ++j) {
      const float want = 2.0f * b.data[b.rows[0] + j] - b.data[b.rows[1] + j];
      EXPECT_FLOAT_EQ(out[j], want) << "position " << j;
    }
  }
}

// Depth 0 (a stride phase of ConvGrad's dX that no tap reaches): the
// visited positions become init, or zeros without it.
TEST(GridConv, ForwardOfDepthZeroWritesInitOrZeros) {
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    SCOPED_TRACE(GridIsaName(isa));
    const std::vector<float> b(40, std::numeric_limits<float>::quiet_NaN());
    const GridLines lines{2, 3, 5, 4};  // positions 0-2 and 4-6 of each row
    const std::vector<float> init = {1.5f, -2.0f};
    for (const bool with_init : {true, false}) {
      std::vector<float> out(16, 9.0f);
      GridConvForward(2, 0, nullptr, 0, b.data(), nullptr, lines,
                      with_init ? init.data() : nullptr, out.data(), 8);
      for (int64_t m = 0; m < 2; ++m) {
        for (int64_t q = 0; q < 8; ++q) {
          const bool visited = q % 4 < 3;
          const float want = !visited ? 9.0f : (with_init ? init[m] : 0.0f);
          EXPECT_EQ(out[m * 8 + q], want) << "row " << m << " position " << q;
        }
      }
    }
  }
}

// One image per product, and three in one (GridImages): their sums add up.
TEST(GridConv, FilterGradAccumulatesFloat64SumsOnEveryInstructionSet) {
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    for (const Shape& s : kShapes) {
      for (const int64_t images : {1, 3}) {
        SCOPED_TRACE(Describe(isa, s) + " images " + std::to_string(images));
        std::mt19937 rng(11);
        // Each image's grid as MakeGathered lays it out, one after another.
        std::vector<Gathered> grids;
        std::vector<float> b;
        for (int64_t i = 0; i < images; ++i) {
          grids.push_back(MakeGathered(s.depth, s.count, s.width, s.extra, rng));
          b.insert(b.end(), grids.back().data.begin(), grids.back().data.end());
        }
        GridLines lines = grids[0].lines;
        const std::vector<int64_t>& rows = grids[0].rows;
        const int64_t b_image_stride = static_cast<int64_t>(grids[0].data.size());
        // dY with its own line stride and NaN past each line: never read.
        lines.dense_stride = s.width + 1;
        const int64_t ld_dy = s.count * lines.dense_stride + 2;
        const int64_t dy_image_stride = s.rows * ld_dy;
        std::vector<float> dy = Random(images * dy_image_stride, rng);
        for (int64_t r = 0; r < images * s.rows; ++r) {
          for (int64_t q = 0; q < ld_dy; ++q) {
            if (q >= s.count * lines.dense_stride || q % lines.dense_stride >= s.width) {
              dy[r * ld_dy + q] = std::numeric_limits<float>::quiet_NaN();
            }
          }
        }
        const int64_t ld_dw = s.depth + 2;
        const std::vector<float> dw_before = Random(s.rows * ld_dw, rng);
        std::vector<float> dw = dw_before;
        GridConvFilterGrad(s.rows, s.depth, dy.data(), ld_dy, b.data(), rows.data(), lines,
                           GridImages{images, b_image_stride, dy_image_stride}, dw.data(), ld_dw);
        for (int64_t m = 0; m < s.rows; ++m) {
          for (int64_t k = 0; k < ld_dw; ++k) {
            const float got = dw[m * ld_dw + k];
            if (k >= s.depth) {
              ASSERT_EQ(got, dw_before[m * ld_dw + k]) << "dW row " << m << " column " << k;
              continue;
            }
            double want = dw_before[m * ld_dw + k];
            double magnitude = std::fabs(want);
            for (int64_t i = 0; i < images; ++i) {
              for (int64_t l = 0; l < s.count; ++l) {
                for (int64_t j = 0; j < s.width; ++j) {
                  const double term = static_cast<double>(dy[i * dy_image_stride + m * ld_dy +
                                                             l * lines.dense_stride + j]) *
                                      b[i * b_image_stride + rows[k] +
                                        l * lines.gathered_stride + j];
                  want += term;
                  magnitude += std::fabs(term);
                }
              }
            }
            ASSERT_NEAR(got, want, 4e-7 * magnitude + 1e-7) << "dW row " << m << " column " << k;
          }
        }
      }
    }
  }
}

// The VDPBF16PS products on for the test where the CPU has them: castor
// leaves them off where VDPBF16PS is slower than float32
// (avx512bf16_gemm.h), and they are tested there all the same.
#define FORCE_BFLOAT16_PRODUCTS_OR_SKIP()                                     \
  const ScopedAvx512Bf16OnlyForTesting bfloat16_products_on(true);             \
  if (!UseGridBFloat16Products()) {                                            \
    GTEST_SKIP() << "no AVX512-BF16 (with the AVX-512 grid kernels) on this CPU"; \
  }

// The bfloat16 bits nearest each float, and the floats they stand for.
std::vector<uint16_t> BFloat16BitsOf(const std::vector<float>& v) {
  std::vector<uint16_t> bits;
  for (float x : v) bits.push_back(FloatToBFloat16Bits(x));
  return bits;
}
float Rounded(float x) { return BFloat16BitsToFloat(FloatToBFloat16Bits(x)); }

// GridConvForwardBFloat16Pairs against float64 sums of the rounded
// operands (float32 output), and its bfloat16 output against the float32
// one rounded to nearest even.
TEST(GridConvBFloat16, ForwardPairsMatchFloat64Sums) {
  FORCE_BFLOAT16_PRODUCTS_OR_SKIP();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(Describe(GridIsa::kAvx512, s));
    std::mt19937 rng(7);
    // Gathered rows (NaN and Inf past each line) paired two by two: pair
    // row k holds rows 2k and 2k + 1 (zeros for a missing odd row).
    const Gathered g = MakeGathered(s.depth, s.count, s.width, s.extra, rng);
    const int64_t pairs = (s.depth + 1) / 2;
    const int64_t plane = s.count * g.lines.gathered_stride;
    const std::vector<uint16_t> g_bits = BFloat16BitsOf(g.data);
    std::vector<uint32_t> b(static_cast<size_t>(pairs * plane + kGridReadSlack), 0);
    std::vector<int64_t> b_rows;
    for (int64_t k = 0; k < pairs; ++k) {
      b_rows.push_back(k * plane);
      for (int64_t q = 0; q < plane; ++q) {
        const uint16_t first = g_bits[g.rows[2 * k] + q];
        const uint16_t second = 2 * k + 1 < s.depth ? g_bits[g.rows[2 * k + 1] + q] : 0;
        b[k * plane + q] = BFloat16Pair(first, second);
      }
    }
    const int64_t lda = pairs + 3;
    const std::vector<float> a_values = Random(s.rows * 2 * lda, rng);
    std::vector<uint32_t> a(static_cast<size_t>(s.rows * lda));
    for (int64_t m = 0; m < s.rows; ++m) {
      for (int64_t k = 0; k < lda; ++k) {
        const float first = a_values[(m * lda + k) * 2];
        const float second = 2 * k + 1 < s.depth ? a_values[(m * lda + k) * 2 + 1] : 0.0f;
        a[m * lda + k] = BFloat16Pair(FloatToBFloat16Bits(first), FloatToBFloat16Bits(second));
      }
    }
    const std::vector<float> init = Random(s.rows, rng);
    const int64_t ld_out = s.count * s.width + 5;
    std::vector<float> out(static_cast<size_t>(s.rows * ld_out), -7.0f);
    GridConvForwardBFloat16Pairs(s.rows, pairs, a.data(), lda, b.data(), b_rows.data(), g.lines,
                                 init.data(), out.data(), ld_out);
    for (int64_t m = 0; m < s.rows; ++m) {
      for (int64_t q = 0; q < ld_out; ++q) {
        const float got = out[m * ld_out + q];
        if (q >= s.count * s.width) {
          ASSERT_EQ(got, -7.0f) << "row " << m << " position " << q << " was written";
          continue;
        }
        const int64_t l = q / s.width, j = q % s.width;
        double want = init[m];
        double magnitude = std::fabs(init[m]);
        for (int64_t k = 0; k < s.depth; ++k) {
          const double term =
              static_cast<double>(Rounded(a_values[(m * lda + k / 2) * 2 + k % 2])) *
              Rounded(g.data[g.rows[k] + l * g.lines.gathered_stride + j]);
          want += term;
          magnitude += std::fabs(term);
        }
        ASSERT_NEAR(got, want, 4e-7 * magnitude + 1e-7) << "row " << m << " position " << q;
      }
    }
    // The bfloat16 output: each float32 sum above rounded to nearest even
    // (the bits FromFloat32 gives it), nothing else written.
    std::vector<BFloat16> out16(static_cast<size_t>(s.rows * ld_out), BFloat16{0x1234});
    GridConvForwardBFloat16Pairs(s.rows, pairs, a.data(), lda, b.data(), b_rows.data(), g.lines,
                                 init.data(), out16.data(), ld_out);
    for (int64_t m = 0; m < s.rows; ++m) {
      for (int64_t q = 0; q < ld_out; ++q) {
        const uint16_t want = q < s.count * s.width ? FloatToBFloat16Bits(out[m * ld_out + q])
                                                    : uint16_t{0x1234};
        ASSERT_EQ(out16[m * ld_out + q].bits, want) << "bfloat16 row " << m << " position " << q;
      }
    }
  }
}

// A 2-D conv's geometry at unit strides (pads: top, left, bottom, right).
common::WindowGeometry UnitStrideGeometry(int64_t in_h, int64_t in_w, int64_t k_h, int64_t k_w,
                                          int64_t dilation_w, const int64_t (&pads)[4]) {
  common::WindowGeometry g;
  g.num_spatial = 2;
  g.input = {in_h, in_w};
  g.kernel = {k_h, k_w};
  g.strides = {1, 1};
  g.dilations = {1, dilation_w};
  g.pad_begin = {pads[0], pads[1]};
  g.pad_end = {pads[2], pads[3]};
  g.output = {in_h + pads[0] + pads[2] - (k_h - 1),
              in_w + pads[1] + pads[3] - (k_w - 1) * dilation_w};
  return g;
}

// GridConvForwardBFloat16PairRows over im2col.h's PairRowGrid (laid out
// as conv.cc's forward lays it) gives the padded grid's products to the
// bit: narrow images, kernels of 1-5 columns, a dilated one, uneven pads
// (all the left pad, none, more on the right), odd channel counts, X with
// subnormals, Inf and NaN, and outputs of up to two vectors' rows; a part
// of the positions writes only those.
TEST(GridConvBFloat16, PairRowsGiveThePaddedGridsBits) {
  FORCE_BFLOAT16_PRODUCTS_OR_SKIP();
  struct RowCase {
    int64_t channels, out_channels, in_h, in_w, k_h, k_w, dilation_w;
    int64_t pads[4];
  };
  const RowCase cases[] = {
      {5, 6, 7, 7, 3, 3, 1, {1, 1, 1, 1}},   {16, 9, 4, 4, 5, 5, 1, {2, 2, 2, 2}},
      {3, 4, 6, 5, 2, 3, 2, {0, 1, 1, 3}},   {4, 5, 9, 3, 3, 3, 1, {1, 2, 1, 0}},
      {7, 33, 5, 11, 1, 3, 1, {0, 0, 0, 2}}, {2, 1, 3, 2, 3, 1, 1, {2, 0, 0, 0}},
  };
  for (const RowCase& c : cases) {
    const common::WindowGeometry g =
        UnitStrideGeometry(c.in_h, c.in_w, c.k_h, c.k_w, c.dilation_w, c.pads);
    SCOPED_TRACE(::testing::Message() << c.channels << "x" << c.in_h << "x" << c.in_w << " kernel "
                                      << c.k_h << "x" << c.k_w << " dilation " << c.dilation_w);
    ASSERT_TRUE(RowProductsPay(g));
    std::mt19937 rng(static_cast<unsigned>(c.channels * 131 + c.in_w));
    std::vector<float> x = Random(c.channels * c.in_h * c.in_w, rng);
    x[1] = 3e-39f;  // a bfloat16 subnormal
    x[x.size() / 2] = std::numeric_limits<float>::infinity();
    x[x.size() - 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<BFloat16> x16;
    for (float v : x) x16.push_back(BFloat16{FloatToBFloat16Bits(v)});
    const int64_t pairs = (c.channels + 1) / 2, kernel_size = c.k_h * c.k_w;
    const int64_t depth = pairs * kernel_size;
    std::vector<uint32_t> a(static_cast<size_t>(c.out_channels * depth));
    for (uint32_t& v : a) {
      const std::vector<float> two = Random(2, rng);
      v = BFloat16Pair(FloatToBFloat16Bits(two[0]), FloatToBFloat16Bits(two[1]));
    }
    const std::vector<float> init = Random(c.out_channels, rng);
    const int64_t p = g.output_size();
    // The padded grid's products.
    const PaddedGrid padded_grid(g);
    std::vector<uint32_t> padded(
        static_cast<size_t>(padded_grid.buffer_size(pairs) + kGridReadSlack), 0);
    FillPairGrid(x16.data(), c.channels, 0, pairs, padded_grid, padded.data());
    std::vector<int64_t> padded_rows;
    for (int64_t k = 0; k < depth; ++k) padded_rows.push_back(padded_grid.RowOffset(k));
    std::vector<BFloat16> want(static_cast<size_t>(c.out_channels * p));
    GridConvForwardBFloat16Pairs(c.out_channels, depth, a.data(), depth, padded.data(),
                                 padded_rows.data(), GridLines{g.output[0], g.output[1],
                                                               padded_grid.cols, g.output[1]},
                                 init.data(), want.data(), p);
    // The same over unpadded rows.
    std::vector<int64_t> line_offsets, column_shifts;
    for (int64_t kh = 0; kh < c.k_h; ++kh) line_offsets.push_back(kh);
    for (int64_t kw = 0; kw < c.k_w; ++kw) column_shifts.push_back(kw * c.dilation_w - c.pads[1]);
    const PairRowGrid row_grid(pairs, c.in_h + c.pads[0] + c.pads[2], c.in_w, c.pads[0],
                               line_offsets, column_shifts);
    // NaN wherever the planes and slack are not written.
    std::vector<uint32_t> buffer(static_cast<size_t>(row_grid.buffer_size()), 0x7fc07fc0u);
    uint32_t* planes = row_grid.Planes(buffer.data());
    row_grid.Fill(x16.data(), c.channels, c.in_h, c.in_h * c.in_w, 0, pairs, planes);
    std::vector<BFloat16> got(static_cast<size_t>(c.out_channels * p), BFloat16{0x1234});
    GridConvForwardBFloat16PairRows(c.out_channels, depth, a.data(), depth, planes,
                                    row_grid.pair_rows(), row_grid.Positions(0, p), init.data(),
                                    got.data(), p);
    for (int64_t i = 0; i < c.out_channels * p; ++i) {
      ASSERT_EQ(got[i].bits, want[i].bits) << "output " << i / p << " position " << i % p;
    }
    // Positions [begin, end) only, from an odd start.
    const int64_t begin = std::min<int64_t>(3, p - 1), end = std::max(begin + 1, p - 5);
    std::vector<BFloat16> part(static_cast<size_t>(c.out_channels * p), BFloat16{0x1234});
    GridConvForwardBFloat16PairRows(c.out_channels, depth, a.data(), depth, planes,
                                    row_grid.pair_rows(), row_grid.Positions(begin, end),
                                    init.data(), part.data(), p);
    for (int64_t i = 0; i < c.out_channels * p; ++i) {
      const int64_t q = i % p;
      const uint16_t expected = q >= begin && q < end ? want[i].bits : uint16_t{0x1234};
      ASSERT_EQ(part[i].bits, expected) << "part: output " << i / p << " position " << q;
    }
  }
}

// Where the products over unpadded rows pay: narrow images that keep their
// width at unit strides, not 14x14 or 28x28, nor strided or narrowing convs.
TEST(GridConvBFloat16, PairRowsPayOnNarrowImagesOnly) {
  const int64_t same[4] = {1, 1, 1, 1};
  const int64_t none[4] = {0, 0, 0, 0};
  EXPECT_TRUE(RowProductsPay(UnitStrideGeometry(7, 7, 3, 3, 1, same)));
  EXPECT_TRUE(RowProductsPay(UnitStrideGeometry(10, 10, 3, 3, 1, same)));
  EXPECT_FALSE(RowProductsPay(UnitStrideGeometry(14, 14, 3, 3, 1, same)));
  EXPECT_FALSE(RowProductsPay(UnitStrideGeometry(28, 28, 3, 3, 1, same)));
  EXPECT_FALSE(RowProductsPay(UnitStrideGeometry(7, 7, 3, 3, 1, none)));  // 5 wide
  common::WindowGeometry strided = UnitStrideGeometry(7, 7, 3, 3, 1, same);
  strided.strides = {2, 2};
  strided.output = {4, 4};
  EXPECT_FALSE(RowProductsPay(strided));
  EXPECT_FALSE(RowProductsPay(UnitStrideGeometry(4, 20, 1, 17, 1, {0, 8, 0, 8})));
}

TEST(GridConvBFloat16, FilterGradAccumulatesFloat64Sums) {
  FORCE_BFLOAT16_PRODUCTS_OR_SKIP();
  // kShapes, and lines around one 32-position vector: exactly one, one and
  // a masked few (overlapped tail), two and a bit.
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({5, 7, 3, 32, 1});
  shapes.push_back({4, 6, 2, 35, 3});
  shapes.push_back({2, 13, 2, 70, 2});
  for (const Shape& s : shapes) {
    for (const int64_t images : {1, 3}) {
      SCOPED_TRACE(Describe(GridIsa::kAvx512, s) + " images " + std::to_string(images));
      std::mt19937 rng(11);
      std::vector<float> b;
      std::vector<int64_t> rows;
      GridLines lines;
      int64_t b_image_stride = 0;
      for (int64_t i = 0; i < images; ++i) {
        const Gathered g = MakeGathered(s.depth, s.count, s.width, s.extra, rng);
        b.insert(b.end(), g.data.begin(), g.data.end());
        rows = g.rows;
        lines = g.lines;
        b_image_stride = static_cast<int64_t>(g.data.size());
      }
      lines.dense_stride = s.width + 1;
      const int64_t ld_dy = s.count * lines.dense_stride + 2;
      const int64_t dy_image_stride = s.rows * ld_dy;
      std::vector<float> dy = Random(images * dy_image_stride, rng);
      for (int64_t r = 0; r < images * s.rows; ++r) {
        for (int64_t q = 0; q < ld_dy; ++q) {
          if (q >= s.count * lines.dense_stride || q % lines.dense_stride >= s.width) {
            dy[r * ld_dy + q] = std::numeric_limits<float>::quiet_NaN();
          }
        }
      }
      const std::vector<uint16_t> b_bits = BFloat16BitsOf(b), dy_bits = BFloat16BitsOf(dy);
      const int64_t ld_dw = s.depth + 2;
      const std::vector<float> dw_before = Random(s.rows * ld_dw, rng);
      std::vector<float> dw = dw_before;
      GridConvFilterGradBFloat16(s.rows, s.depth, dy_bits.data(), ld_dy, b_bits.data(),
                                 rows.data(), lines,
                                 GridImages{images, b_image_stride, dy_image_stride}, dw.data(),
                                 ld_dw);
      for (int64_t m = 0; m < s.rows; ++m) {
        for (int64_t k = 0; k < ld_dw; ++k) {
          const float got = dw[m * ld_dw + k];
          if (k >= s.depth) {
            ASSERT_EQ(got, dw_before[m * ld_dw + k]) << "dW row " << m << " column " << k;
            continue;
          }
          double want = dw_before[m * ld_dw + k];
          double magnitude = std::fabs(want);
          for (int64_t i = 0; i < images; ++i) {
            for (int64_t l = 0; l < s.count; ++l) {
              for (int64_t j = 0; j < s.width; ++j) {
                const double term =
                    static_cast<double>(Rounded(
                        dy[i * dy_image_stride + m * ld_dy + l * lines.dense_stride + j])) *
                    Rounded(b[i * b_image_stride + rows[k] + l * lines.gathered_stride + j]);
                want += term;
                magnitude += std::fabs(term);
              }
            }
          }
          ASSERT_NEAR(got, want, 4e-7 * magnitude + 1e-7) << "dW row " << m << " column " << k;
        }
      }
    }
  }
}

// SpreadRows (im2col.h) writes dst[l * dst_stride + j * step] = src[l * n + j]
// for l < lines, j < n and nothing else: every length up to two vectors'
// worth (32 + 3 for 16-bit elements), steps 1-3, one to three rows with a
// gap between them, each instruction set (AVX-512 runs step 2 in masked
// stores), float32 and 16-bit elements, sentinels around and between.
template <typename T>
void CheckSpreadRows(int64_t max_n) {
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    for (int64_t step = 1; step <= 3; ++step) {
      for (int64_t n = 0; n <= max_n; ++n) {
        for (int64_t lines = 1; lines <= 3; ++lines) {
          SCOPED_TRACE(std::string(GridIsaName(isa)) + " step " + std::to_string(step) + " n " +
                       std::to_string(n) + " lines " + std::to_string(lines) + " element bytes " +
                       std::to_string(sizeof(T)));
          std::vector<T> src(static_cast<size_t>(n * lines));
          for (size_t j = 0; j < src.size(); ++j) src[j] = static_cast<T>(j + 1);
          const int64_t margin = 40;
          const int64_t dst_stride = n * step + 5;
          const T sentinel = static_cast<T>(999);
          std::vector<T> dst(static_cast<size_t>(lines * dst_stride + 2 * margin), sentinel);
          SpreadRows(src.data(), n, lines, step, dst.data() + margin, dst_stride);
          for (int64_t q = 0; q < static_cast<int64_t>(dst.size()); ++q) {
            const int64_t at = q - margin;
            const int64_t line = at >= 0 ? at / dst_stride : -1;
            const int64_t in_line = at - line * dst_stride;
            const bool written = line >= 0 && line < lines && in_line < n * step &&
                                 in_line % step == 0;
            ASSERT_EQ(dst[q], written ? src[line * n + in_line / step] : sentinel)
                << "position " << at;
          }
        }
      }
    }
  }
}

TEST(GridConv, SpreadRowsWritesOnlyItsPositionsOnEveryInstructionSet) {
  CheckSpreadRows<float>(17);
  CheckSpreadRows<uint16_t>(35);
}

// GatherEveryOther (im2col.h) writes dst[l * dst_stride + j] =
// src[l * src_stride + 2 j] for j < n on every instruction set, nothing
// else: lengths up to two vectors and a tail, one to three rows, sentinels
// around. Each row's source ends at its last element read (the vector
// loads are masked there: the sanitizer build would catch a read past it).
TEST(GridConv, GatherEveryOtherReadsEveryOtherElementOnEveryInstructionSet) {
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    for (int64_t n = 0; n <= 35; ++n) {
      for (int64_t lines = 1; lines <= 3; ++lines) {
        SCOPED_TRACE(std::string(GridIsaName(isa)) + " n " + std::to_string(n) + " lines " +
                     std::to_string(lines));
        const int64_t src_stride = 2 * n + 3;
        std::vector<uint16_t> src(static_cast<size_t>((lines - 1) * src_stride + 2 * n));
        for (size_t q = 0; q < src.size(); ++q) src[q] = static_cast<uint16_t>(q + 1);
        const int64_t margin = 20, dst_stride = n + 4;
        std::vector<uint16_t> dst(static_cast<size_t>(lines * dst_stride + 2 * margin), 999);
        GatherEveryOther(src.data(), src_stride, n, lines, dst.data() + margin, dst_stride);
        for (int64_t q = 0; q < static_cast<int64_t>(dst.size()); ++q) {
          const int64_t at = q - margin;
          const int64_t line = at >= 0 ? at / dst_stride : -1;
          const int64_t j = at - line * dst_stride;
          const bool written = line >= 0 && line < lines && j < n;
          ASSERT_EQ(dst[q], written ? src[line * src_stride + 2 * j] : 999) << "position " << at;
        }
      }
    }
  }
}

// FillGrid of strided geometries on the 16-bit grid (stride 2 along a row:
// GatherEveryOther per phase plane; other strides: the scalar copy) gives
// every used phase plane exactly: plane (a, b) row i column j holds input
// (i * s0 + a - top, j * s1 + b - left), zeros outside the image. Both
// pads odd and even, odd widths, a pointwise stride-2 projection, dilation.
TEST(GridConv, FillGridWritesStridedPhasePlanesOnEveryInstructionSet) {
  struct Case {
    int64_t in_h, in_w, kernel, stride_h, stride_w, dilation, pad_top, pad_left;
  };
  const Case cases[] = {{28, 28, 3, 2, 2, 1, 1, 1}, {28, 28, 1, 2, 2, 1, 0, 0},
                        {7, 9, 3, 2, 2, 1, 1, 0},   {9, 40, 3, 1, 2, 1, 0, 2},
                        {11, 11, 3, 2, 2, 2, 2, 2}, {10, 13, 3, 3, 3, 1, 1, 1}};
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(GridIsaName(isa)) + " input " + std::to_string(c.in_h) + "x" +
                   std::to_string(c.in_w) + " kernel " + std::to_string(c.kernel) + " strides " +
                   std::to_string(c.stride_h) + "," + std::to_string(c.stride_w));
      common::WindowGeometry g;
      g.num_spatial = 2;
      g.input = {c.in_h, c.in_w};
      g.kernel = {c.kernel, c.kernel};
      g.strides = {c.stride_h, c.stride_w};
      g.dilations = {c.dilation, c.dilation};
      g.pad_begin = {c.pad_top, c.pad_left};
      g.pad_end = {c.pad_top, c.pad_left};
      const int64_t span = (c.kernel - 1) * c.dilation + 1;
      g.output = {(c.in_h + 2 * c.pad_top - span) / c.stride_h + 1,
                  (c.in_w + 2 * c.pad_left - span) / c.stride_w + 1};
      const PaddedGrid grid(g);
      constexpr int64_t kChannels = 3;
      std::vector<BFloat16> x(static_cast<size_t>(kChannels * c.in_h * c.in_w));
      for (size_t q = 0; q < x.size(); ++q) x[q].bits = static_cast<uint16_t>(q + 1);
      std::vector<BFloat16> padded(static_cast<size_t>(grid.buffer_size(kChannels)),
                                   BFloat16{0x7fc1});
      FillGrid<BFloat16, BFloat16>(x.data(), 0, kChannels, grid, padded.data());
      for (int64_t ch = 0; ch < kChannels; ++ch) {
        for (int64_t a = 0; a < c.stride_h; ++a) {
          for (int64_t b = 0; b < c.stride_w; ++b) {
            if (!grid.PhaseUsed(a, b)) continue;
            const BFloat16* plane = padded.data() + ch * grid.channel_size() +
                                    (a * c.stride_w + b) * grid.plane();
            for (int64_t i = 0; i < grid.rows; ++i) {
              for (int64_t j = 0; j < grid.cols; ++j) {
                const int64_t ih = i * c.stride_h + a - c.pad_top;
                const int64_t iw = j * c.stride_w + b - c.pad_left;
                const bool inside = ih >= 0 && ih < c.in_h && iw >= 0 && iw < c.in_w;
                ASSERT_EQ(plane[i * grid.cols + j].bits,
                          inside ? x[(ch * c.in_h + ih) * c.in_w + iw].bits : 0)
                    << "channel " << ch << " phase " << a << "," << b << " row " << i
                    << " column " << j;
              }
            }
          }
        }
      }
    }
  }
}

// FillGrid of unit-stride geometries (AVX-512: one masked pass per plane
// row; elsewhere the scalar copy) gives the zero-padded planes exactly, and
// leaves the slack past the last plane alone: pads on one side only, pads
// wider than the image, rows wider than two vectors.
TEST(GridConv, FillGridWritesTheZeroPaddedPlanesOnEveryInstructionSet) {
  struct Case {
    int64_t in_h, in_w, kernel, pad_top, pad_left, pad_bottom, pad_right;
  };
  const Case cases[] = {{28, 28, 3, 1, 1, 1, 1}, {14, 14, 3, 1, 1, 1, 1}, {5, 3, 3, 2, 0, 0, 2},
                        {4, 4, 3, 5, 6, 7, 3},   {3, 37, 5, 1, 17, 2, 0}, {1, 1, 1, 0, 0, 0, 0}};
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(GridIsaName(isa)) + " input " + std::to_string(c.in_h) + "x" +
                   std::to_string(c.in_w) + " pads " + std::to_string(c.pad_top) + "," +
                   std::to_string(c.pad_left) + "," + std::to_string(c.pad_bottom) + "," +
                   std::to_string(c.pad_right));
      common::WindowGeometry g;
      g.num_spatial = 2;
      g.input = {c.in_h, c.in_w};
      g.kernel = {c.kernel, c.kernel};
      g.strides = {1, 1};
      g.dilations = {1, 1};
      g.pad_begin = {c.pad_top, c.pad_left};
      g.pad_end = {c.pad_bottom, c.pad_right};
      g.output = {c.in_h + c.pad_top + c.pad_bottom - c.kernel + 1,
                  c.in_w + c.pad_left + c.pad_right - c.kernel + 1};
      const PaddedGrid grid(g);
      constexpr int64_t kChannels = 3;
      std::mt19937 rng(3);
      const std::vector<float> x = Random(kChannels * c.in_h * c.in_w, rng);
      // NaN where FillGrid must write, a sentinel in the slack it must not.
      std::vector<float> padded(static_cast<size_t>(grid.buffer_size(kChannels)),
                                std::numeric_limits<float>::quiet_NaN());
      const int64_t planes = kChannels * grid.plane();
      for (int64_t i = planes; i < grid.buffer_size(kChannels); ++i) padded[i] = -7.0f;
      FillGrid<float, float>(x.data(), 0, kChannels, grid, padded.data());
      // The same image in bfloat16 on a bfloat16 grid (the 16-bit vector
      // fill): the bits copied, zeros around, the slack untouched.
      std::vector<BFloat16> x16;
      for (float v : x) x16.push_back(BFloat16{FloatToBFloat16Bits(v)});
      std::vector<BFloat16> padded16(static_cast<size_t>(grid.buffer_size(kChannels)),
                                     BFloat16{0x7fc1});
      for (int64_t i = planes; i < grid.buffer_size(kChannels); ++i) padded16[i].bits = 0x1234;
      FillGrid<BFloat16, BFloat16>(x16.data(), 0, kChannels, grid, padded16.data());
      for (int64_t ch = 0; ch < kChannels; ++ch) {
        for (int64_t i = 0; i < grid.rows; ++i) {
          for (int64_t j = 0; j < grid.cols; ++j) {
            const int64_t ih = i - c.pad_top, iw = j - c.pad_left;
            const bool inside = ih >= 0 && ih < c.in_h && iw >= 0 && iw < c.in_w;
            const int64_t at = (ch * c.in_h + ih) * c.in_w + iw;
            const float want = inside ? x[at] : 0.0f;
            ASSERT_EQ(padded[ch * grid.plane() + i * grid.cols + j], want)
                << "channel " << ch << " row " << i << " column " << j;
            ASSERT_EQ(padded16[ch * grid.plane() + i * grid.cols + j].bits,
                      inside ? x16[at].bits : 0)
                << "bfloat16 channel " << ch << " row " << i << " column " << j;
          }
        }
      }
      for (int64_t i = planes; i < grid.buffer_size(kChannels); ++i) {
        ASSERT_EQ(padded16[i].bits, 0x1234) << "bfloat16 slack " << i - planes << " was written";
      }
      for (int64_t i = planes; i < grid.buffer_size(kChannels); ++i) {
        ASSERT_EQ(padded[i], -7.0f) << "slack position " << i - planes << " was written";
      }
    }
  }
}

// FillPaddedPairPlane (im2col.h) on every instruction set (AVX-512: masked
// loads and two permutes per 32 columns; elsewhere the scalar loop):
// position (i, j) holds both planes' bits at (i - top, j - left) inside
// them, zeros around, a missing second plane as zero high halves, rows
// read `src_stride` apart, nothing written past the plane: rows of 1 to 70
// columns, pads on one side, pads wider than the planes, NaN and
// subnormal bits copied as they are.
TEST(GridConv, FillPaddedPairPlaneInterleavesTheZeroPaddedPlanesOnEveryInstructionSet) {
  struct Case {
    int64_t in_h, in_w, src_stride, top, left, rows, cols;
  };
  const Case cases[] = {{28, 28, 28, 1, 1, 30, 30}, {14, 14, 14, 2, 2, 18, 18},
                        {5, 3, 4, 2, 0, 7, 5},      {4, 4, 4, 5, 6, 9, 13},
                        {3, 37, 40, 1, 17, 6, 70},  {1, 1, 1, 0, 0, 1, 1},
                        {6, 40, 40, 0, 0, 6, 33}};
  for (GridIsa isa : SupportedIsas()) {
    const ScopedGridIsa scoped(isa);
    for (const Case& c : cases) {
      for (bool with_second : {true, false}) {
        SCOPED_TRACE(std::string(GridIsaName(isa)) + " planes " + std::to_string(c.in_h) + "x" +
                     std::to_string(c.in_w) + " into " + std::to_string(c.rows) + "x" +
                     std::to_string(c.cols) + (with_second ? "" : ", no second plane"));
        const int64_t plane = c.in_h * c.src_stride;
        std::vector<BFloat16> planes(static_cast<size_t>(2 * plane));
        for (int64_t q = 0; q < 2 * plane; ++q) {
          planes[q].bits = static_cast<uint16_t>(q * 2654435761u >> 7);
        }
        planes[0].bits = 0x7fc1;  // NaN
        planes[plane].bits = 0x0001;  // subnormal
        const BFloat16* first = planes.data();
        const BFloat16* second = with_second ? planes.data() + plane : nullptr;
        const int64_t size = c.rows * c.cols;
        std::vector<uint32_t> out(static_cast<size_t>(size + 40), 0xdeadbeefu);
        FillPaddedPairPlane(first, second, c.in_h, c.in_w, c.src_stride, c.top, c.left, c.rows,
                            c.cols, out.data());
        for (int64_t i = 0; i < c.rows; ++i) {
          for (int64_t j = 0; j < c.cols; ++j) {
            const int64_t ih = i - c.top, iw = j - c.left;
            uint32_t want = 0;
            if (ih >= 0 && ih < c.in_h && iw >= 0 && iw < c.in_w) {
              const int64_t at = ih * c.src_stride + iw;
              want = uint32_t{first[at].bits} |
                     (second != nullptr ? uint32_t{second[at].bits} << 16 : 0u);
            }
            ASSERT_EQ(out[i * c.cols + j], want) << "row " << i << " column " << j;
          }
        }
        for (int64_t q = size; q < size + 40; ++q) {
          ASSERT_EQ(out[q], 0xdeadbeefu) << "position " << q << " past the plane was written";
        }
      }
    }
  }
}

TEST(GridConv, InstructionSetsAreOrderedAndNamed) {
  EXPECT_TRUE(GridIsaSupported(GridIsa::kPortable));
  EXPECT_STREQ(GridIsaName(GridIsa::kAvx512), "avx512");
  EXPECT_STREQ(GridIsaName(GridIsa::kAvx2), "avx2");
  EXPECT_STREQ(GridIsaName(GridIsa::kPortable), "portable");
  std::cout << "grid conv instruction set: " << GridIsaName(ActiveGridIsa()) << "\n";
}

}  // namespace
}  // namespace castor::cpu
