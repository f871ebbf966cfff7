// CPU kernels: conv family (ops of graph/ops/conv.cc).
//
// Conv: N-d (1-D, 2-D, 3-D, ...) with groups, strides, dilations, pads,
// auto_pad and optional bias, per (image, group); the images run in
// parallel. 2-D convs in float32 and 16-bit read the image copied onto
// im2col.h's padded grid directly with grid_conv.h's products (where a
// vector kernel runs); the others unroll columns into cache-sized tiles of
// reused per-thread scratch for a GEMM (pointwise convs skip the unrolling;
// see RunConv).
// ConvTranspose: GEMM W^T * X per (image, group), then col2im scatter-adds
// the columns into the output (output_shape, output_padding, pads, auto_pad:
// common::TransposeWindowGeometry); bfloat16 X and W
// multiply as stored on the native bfloat16 GEMM where there is one.
// 16-bit inputs are widened to float32 for the GEMM (Conv: X once per
// (image, group) into per-thread scratch, W and B once per call, with
// float_io.h's vector conversions); each output is rounded once on store.
// A 2-D bfloat16 Conv on a CPU with AVX512-BF16 reads the grid in
// bfloat16, two channels side by side per position, with grid_conv.h's
// bfloat16 products (VDPBF16PS, float32 sums: RunConvBFloat16OnGrid;
// narrow images that keep their width over unpadded rows instead). Other
// bfloat16 Convs where gemm.h has a native bfloat16 kernel (AMX,
// AVX512-BF16) unroll their columns in bfloat16 and multiply them as
// stored, summing in float32 (RunConvBFloat16Native), where that pays
// (NativeConvPays: pointwise convs, and shapes without the padded grid's
// direct products); the widened path is the fallback (CASTOR_AVX512BF16=off,
// CASTOR_AMX=off, or VDPBF16PS slower than float32: avx512bf16_gemm.h).
// Images with few output positions (im2col.h's FewOutputPositions: the 1x1
// and 2x2 maps of a ResNet's last stages at 32x32) put several images'
// columns side by side in one GEMM, float32 and bfloat16
// (RunConvOnImageColumns), where a product per image would spend most of
// its lanes or columns on nothing.
// float64 runs in float64 (dgemm).
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/grid_conv.h"
#include "backend/cpu/im2col.h"
#include "backend/cpu/parallel.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kConvDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                        DType::kFloat64};

// Row-major GEMM in the accumulation type (float32 or float64).
template <typename Acc>
void GemmAcc(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Acc* a,
             int64_t lda, const Acc* b, int64_t ldb, Acc* c, int64_t ldc) {
  if constexpr (std::is_same_v<Acc, double>) {
    Dgemm(trans_a, trans_b, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
  } else {
    Sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  }
}

template <typename T, typename Acc>
void StoreAcc(T* dst, Acc v) {
  if constexpr (std::is_same_v<T, double>) {
    *dst = static_cast<double>(v);
  } else {
    StoreF(dst, static_cast<float>(v));
  }
}

// What Conv and ConvTranspose read and write: X and Y in storage type T, W
// as Acc (a view when T is Acc, else a widened copy), and the bias [M] as
// Acc (zeros when absent).
template <typename T, typename Acc>
class ConvOperands {
 public:
  ConvOperands(const KernelContext& ctx, TensorView* y, int64_t out_channels)
      : x(ctx.input(0).as<T>()), y(y->as<T>()) {
    const TensorView& w_view = ctx.input(1);
    if constexpr (std::is_same_v<T, Acc>) {
      w = w_view.as<Acc>();
    } else {
      w_widened_ = Widen(w_view.as<T>(), w_view.num_elements());
      w = w_widened_.data();
    }
    bias = ctx.has_input(2) ? Widen(ctx.input(2).as<T>(), out_channels)
                            : std::vector<Acc>(static_cast<size_t>(out_channels), Acc(0));
  }
  ConvOperands(const ConvOperands&) = delete;
  ConvOperands& operator=(const ConvOperands&) = delete;

  const T* x;
  T* y;
  const Acc* w = nullptr;
  std::vector<Acc> bias;

 private:
  static std::vector<Acc> Widen(const T* src, int64_t n) {
    std::vector<Acc> out(static_cast<size_t>(n));
    if constexpr (kIsFloat16Storage<T>) {
      ToFloat32(src, out.data(), n);  // the vector conversions (float_io.h)
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = WidenTo<Acc>(src[i]);
    }
    return out;
  }
  std::vector<Acc> w_widened_;
};

// How a conv's (image, group) tasks share the threads: with at least as
// many tasks as threads (or where the caller says so) the tasks run in
// parallel, each one's loops on its own thread; otherwise one task after
// another, each loop split across the threads.
class ConvTasks {
 public:
  ConvTasks(int64_t tasks, bool parallel) : tasks_(tasks), parallel_(parallel) {}
  explicit ConvTasks(int64_t tasks) : ConvTasks(tasks, tasks >= NumThreads()) {}
  bool parallel() const { return parallel_; }
  // fn(lo, hi) over [0, n) inside a task: on this thread when the tasks
  // run in parallel, else split across the threads.
  void Split(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const {
    if (parallel_) {
      fn(0, n);
    } else {
      ParallelFor(0, n, 1, fn);
    }
  }
  // task(t) for every task t.
  void Run(const std::function<void(int64_t)>& task) const {
    if (parallel_) {
      ParallelFor(0, tasks_, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) task(t);
      });
    } else {
      for (int64_t t = 0; t < tasks_; ++t) task(t);
    }
  }

 private:
  int64_t tasks_;
  bool parallel_;
};

// ---- Conv ------------------------------------------------------------------

// Column-scratch budget (elements) of one tile when tiles run one at a time
// with the GEMM split across threads (gemm.h).
constexpr int64_t kLargeTileColumnElements = int64_t{4} << 20;


// Y = Conv(X, W) + B per (image, group) task. 2-D ("padded grid"): X is
// copied once onto im2col.h's PaddedGrid (zero-padded, split into phase
// planes when strided), where each column row (c, kh, kw) is one contiguous
// slice; in float32 and 16-bit, where a vector kernel runs
// (UseGridProducts), grid_conv.h's GridConvForward computes Y_g from it
// directly (16-bit: into a float32 scratch narrowed once). Otherwise, in
// tiles of output lines (an
// output line: the positions along the last spatial axis): the columns are
// unrolled into a per-thread scratch, W_g [mg, kg] times them goes straight
// into Y (16-bit: into a float32 scratch) and the bias is added. Three ways
// to get the columns:
// - pointwise (1x1 kernel, stride 1, no pads; float32/float64): X [cg, p]
//   is the column matrix itself;
// - padded grid (float64, or no vector kernel): copies of the padded
//   image's slices on the Wp-wide grid; the Wp - OW extra columns per line
//   are dropped when storing;
// - otherwise im2col.h's Im2Col.
// With at least as many tasks as threads, the tasks run in parallel with
// cache-sized tiles and single-threaded GEMMs; otherwise one after another
// with larger tiles, the unrolling split across threads and each GEMM
// split across threads by Sgemm.
template <typename T, typename Acc>
void RunConv(const KernelContext& ctx, const common::WindowGeometry& g, int64_t batch,
             int64_t channels, int64_t out_channels, int64_t group, TensorView* y) {
  const ConvOperands<T, Acc> ops(ctx, y, out_channels);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  const int64_t kg = cg * g.kernel_size();
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const int nd = g.num_spatial;
  const int64_t line = g.output[nd - 1];
  const int64_t lines = p / line;
  const bool pointwise = std::is_same_v<T, Acc> && g.pointwise();
  const bool grid = !pointwise && PaddedGrid::Applies(g);
  const std::optional<PaddedGrid> padded_grid =
      grid ? std::optional<PaddedGrid>(g) : std::nullopt;
  const int64_t grid_cols = grid ? padded_grid->cols : line;
  std::vector<int64_t> grid_row_offsets;  // column row k: padded + grid_row_offsets[k]
  for (int64_t row = 0; grid && row < kg; ++row) {
    grid_row_offsets.push_back(padded_grid->RowOffset(row));
  }
  const bool grid_products = grid && UseGridProducts();
  const ConvTasks tasks(batch * group);
  const int64_t budget = tasks.parallel() ? kTileColumnElements : kLargeTileColumnElements;
  int64_t tile_lines =
      std::clamp<int64_t>(budget / std::max<int64_t>(1, kg * grid_cols), 1, lines);
  const int64_t tiles = (lines + tile_lines - 1) / tile_lines;
  tile_lines = (lines + tiles - 1) / tiles;  // even tiles

  // Runs fn(lo, hi) over [0, n): split across threads when the tasks run
  // one at a time, else on this thread.
  // 16-bit X is widened once per task and Y narrowed a row at a time, with
  // the vector conversions (float_io.h): the unrolling copies float32, not
  // a scalar conversion per unrolled copy.
  using Src = std::conditional_t<kIsFloat16Storage<T>, float, T>;
  auto run_image = [&](int64_t task) {
    const int64_t n = task / group, gi = task % group;
    const T* xg = ops.x + (n * channels + gi * cg) * in_size;
    T* yg = ops.y + (n * out_channels + gi * mg) * p;
    // (Scratch is named through pointers below: nested ParallelFor bodies
    // run on other threads, whose thread_local buffers are others.)
    thread_local std::vector<Acc> padded_scratch, col_scratch, product_scratch;
    const Src* xs = nullptr;
    if constexpr (kIsFloat16Storage<T>) {
      thread_local std::vector<float> widened_scratch;
      widened_scratch.resize(static_cast<size_t>(cg * in_size));
      float* widened = widened_scratch.data();
      tasks.Split(cg, [&](int64_t lo, int64_t hi) {
        ToFloat32(xg + lo * in_size, widened + lo * in_size, (hi - lo) * in_size);
      });
      xs = widened;
    } else {
      xs = xg;
    }
    Acc* padded = nullptr;
    if (grid) {
      const int64_t padded_size = padded_grid->buffer_size(cg) + kGridReadSlack;
      padded_scratch.resize(static_cast<size_t>(padded_size));
      padded = padded_scratch.data();
      tasks.Split(cg, [&](int64_t lo, int64_t hi) {
        FillGrid<Src, Acc>(xs, lo, hi, *padded_grid, padded);
      });
      std::fill(padded + cg * padded_grid->channel_size(), padded + padded_size, Acc(0));
    }
    if constexpr (std::is_same_v<Acc, float>) {
      if (grid && grid_products) {
        // Y_g = W_g * columns + B straight from the padded image (grid_conv.h),
        // into Y (16-bit: a float32 scratch narrowed once).
        float* out = nullptr;
        if constexpr (std::is_same_v<T, float>) {
          out = yg;
        } else {
          product_scratch.resize(static_cast<size_t>(mg * p));
          out = product_scratch.data();
        }
        tasks.Split(lines, [&](int64_t lo, int64_t hi) {
          GridConvForward(mg, kg, ops.w + gi * mg * kg, kg, padded + lo * grid_cols,
                          grid_row_offsets.data(), GridLines{hi - lo, line, grid_cols, line},
                          ops.bias.data() + gi * mg, out + lo * line, p);
        });
        if constexpr (kIsFloat16Storage<T>) {
          tasks.Split(mg, [&](int64_t lo, int64_t hi) {
            FromFloat32(out + lo * p, yg + lo * p, (hi - lo) * p);
          });
        }
        return;
      }
    }
    for (int64_t l0 = 0; l0 < lines; l0 += tile_lines) {
      const int64_t l1 = std::min(lines, l0 + tile_lines);
      const int64_t q0 = l0 * line;
      const int64_t cols = (l1 - l0) * grid_cols;  // GEMM columns
      const Acc* b = nullptr;
      int64_t ldb = cols;
      if constexpr (std::is_same_v<T, Acc>) {
        if (pointwise) {
          b = xg + q0;
          ldb = in_size;
        }
      }
      if (b == nullptr) {
        col_scratch.resize(static_cast<size_t>(kg * cols));
        Acc* col = col_scratch.data();
        if (grid) {
          tasks.Split(kg, [&](int64_t lo, int64_t hi) {
            for (int64_t row = lo; row < hi; ++row) {
              const Acc* src = padded + padded_grid->RowOffset(row) + l0 * grid_cols;
              std::copy(src, src + cols, col + row * cols);
            }
          });
        } else {
          tasks.Split(kg, [&](int64_t lo, int64_t hi) {
            Im2Col<Src, Acc>(xs, g, lo, hi, l0, l1, col, cols);
          });
        }
        b = col;
      }
      Acc* c = nullptr;
      int64_t ldc = cols;
      if constexpr (std::is_same_v<T, Acc>) {
        if (!grid) {
          c = yg + q0;
          ldc = p;
        }
      }
      if (c == nullptr) {
        product_scratch.resize(static_cast<size_t>(mg * cols));
        c = product_scratch.data();
      }
      GemmAcc<Acc>(false, false, mg, cols, kg, ops.w + gi * mg * kg, kg, b, ldb, c, ldc);
      // Bias and store (dropping the grid's extra columns).
      [[maybe_unused]] float* row = nullptr;  // 16-bit: one output row in float32
      if constexpr (kIsFloat16Storage<T>) {
        thread_local std::vector<float> row_scratch;
        row_scratch.resize(static_cast<size_t>((l1 - l0) * line));
        row = row_scratch.data();
      }
      for (int64_t m = 0; m < mg; ++m) {
        const Acc bias = ops.bias[gi * mg + m];
        if constexpr (kIsFloat16Storage<T>) {
          for (int64_t l = l0; l < l1; ++l) {
            const float* src = c + m * ldc + (l - l0) * grid_cols;
            float* dst = row + (l - l0) * line;
            for (int64_t i = 0; i < line; ++i) dst[i] = src[i] + bias;
          }
          FromFloat32(row, yg + m * p + l0 * line, (l1 - l0) * line);
        } else {
          for (int64_t l = l0; l < l1; ++l) {
            const Acc* src = c + m * ldc + (l - l0) * grid_cols;
            T* dst = yg + m * p + l * line;
            for (int64_t i = 0; i < line; ++i) StoreAcc(&dst[i], src[i] + bias);
          }
        }
      }
    }
  };
  tasks.Run(run_image);
}

// Whether bfloat16 GEMMs run on a native kernel (AMX or AVX512-BF16;
// gemm.h), so a bfloat16 Conv unrolls its columns in bfloat16 and
// multiplies them as stored instead of widening them to float32. Off
// (CASTOR_AVX512BF16=off, CASTOR_AMX=off, no such CPU, or VDPBF16PS slower
// than float32): the widened paths above.
bool NativeBFloat16Gemm() { return AmxBf16Available() || Avx512Bf16Available(); }

// Whether the native path beats the widened one for this shape: a 2-D conv
// whose padded grid the vector products read directly (grid_conv.h) skips
// the unrolling, which the native GEMM needs (columns, then their packing);
// measured on a Zen 4 EPYC with AVX512-BF16 (bench/README.md), it is as
// fast or faster for 3x3 kernels, so only pointwise convs (no unrolling)
// and the shapes without grid products take the native GEMM forward. The
// gradients (conv_grad.cc) take it whatever the shape.
bool NativeConvPays(const common::WindowGeometry& g) {
  return g.pointwise() || !(PaddedGrid::Applies(g) && UseGridProducts());
}

// Y = Conv(X, W) + B in bfloat16 on the native bfloat16 GEMM: per (image,
// group) task and tile of output lines, the columns are unrolled from X in
// bfloat16 (im2col.h's Im2Col copies the bits; a pointwise Conv reads X
// itself), W_g [mg, kg] times them is summed in float32
// (GemmFloat32Accumulate) into a float32 scratch, and the bias is added
// before the one rounding to bfloat16 on store. Tasks and tiles as RunConv.
void RunConvBFloat16Native(const KernelContext& ctx, const common::WindowGeometry& g,
                           int64_t batch, int64_t channels, int64_t out_channels, int64_t group,
                           TensorView* y) {
  const BFloat16* x = ctx.input(0).as<BFloat16>();
  const BFloat16* w = ctx.input(1).as<BFloat16>();
  BFloat16* out = y->as<BFloat16>();
  std::vector<float> bias(static_cast<size_t>(out_channels), 0.0f);
  if (ctx.has_input(2)) ToFloat32(ctx.input(2).as<BFloat16>(), bias.data(), out_channels);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  const int64_t kg = cg * g.kernel_size();
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const int nd = g.num_spatial;
  const int64_t line = g.output[nd - 1];
  const int64_t lines = p / line;
  const bool pointwise = g.pointwise();
  const ConvTasks tasks(batch * group);
  const int64_t budget = tasks.parallel() ? kTileColumnElements : kLargeTileColumnElements;
  int64_t tile_lines = std::clamp<int64_t>(budget / std::max<int64_t>(1, kg * line), 1, lines);
  const int64_t tiles = (lines + tile_lines - 1) / tile_lines;
  tile_lines = (lines + tiles - 1) / tiles;
  auto run_image = [&](int64_t task) {
    const int64_t n = task / group, gi = task % group;
    const BFloat16* xg = x + (n * channels + gi * cg) * in_size;
    BFloat16* yg = out + (n * out_channels + gi * mg) * p;
    thread_local std::vector<BFloat16> col_scratch;
    thread_local std::vector<float> product_scratch;
    for (int64_t l0 = 0; l0 < lines; l0 += tile_lines) {
      const int64_t l1 = std::min(lines, l0 + tile_lines);
      const int64_t q0 = l0 * line;
      const int64_t cols = (l1 - l0) * line;
      const BFloat16* b = xg + q0;
      int64_t ldb = in_size;
      if (!pointwise) {
        col_scratch.resize(static_cast<size_t>(kg * cols));
        BFloat16* col = col_scratch.data();
        tasks.Split(kg, [&](int64_t lo, int64_t hi) {
          Im2Col<BFloat16, BFloat16>(xg, g, lo, hi, l0, l1, col, cols);
        });
        b = col;
        ldb = cols;
      }
      product_scratch.resize(static_cast<size_t>(mg * cols));
      float* c = product_scratch.data();
      GemmFloat32Accumulate(DType::kBFloat16, false, false, mg, cols, kg, 1.0f, w + gi * mg * kg,
                            kg, b, ldb, 0.0f, c, cols);
      tasks.Split(mg, [&](int64_t lo, int64_t hi) {
        for (int64_t m = lo; m < hi; ++m) {
          float* row = c + m * cols;
          const float add = bias[gi * mg + m];
          for (int64_t i = 0; i < cols; ++i) row[i] += add;
          FromFloat32(row, yg + m * p + q0, cols);
        }
      });
    }
  };
  tasks.Run(run_image);
}

// Y = Conv(X, W) + B where the images have few output positions
// (im2col.h's FewOutputPositions), X, W and B stored as T (float32 or
// bfloat16): per group of images and conv group, the images' columns side
// by side [cg * taps, images * p] (FewPositionColumns, in T; the taps that
// read only padding left out while W is finite there), W_g's entries at
// those taps times them summed in float32 by one GemmFloat32Accumulate
// (bfloat16 on the native kernels where the CPU has them), the bias added
// before the one rounding on store. The groups of images run in parallel.
template <typename T>
void RunConvOnImageColumns(const KernelContext& ctx, const common::WindowGeometry& g,
                           int64_t batch, int64_t channels, int64_t out_channels, int64_t group,
                           TensorView* y) {
  constexpr DType kDType = std::is_same_v<T, float> ? DType::kFloat32 : DType::kBFloat16;
  const T* x = ctx.input(0).as<T>();
  const T* w = ctx.input(1).as<T>();
  T* out = y->as<T>();
  std::vector<float> bias(static_cast<size_t>(out_channels), 0.0f);
  if (ctx.has_input(2)) ToFloat32(kDType, ctx.input(2).as<T>(), bias.data(), out_channels);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  std::optional<FewPositionColumns> columns;
  columns.emplace(g, true);
  if (!columns->DroppedTapsFinite(w, out_channels * cg)) columns.emplace(g, false);
  const int64_t kg = cg * static_cast<int64_t>(columns->taps().size());
  std::vector<T> w_kept(static_cast<size_t>(out_channels * kg));
  columns->KeptTaps(w, out_channels * cg, w_kept.data());
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const int64_t images = ImagesPerColumnGemm(g, kg, batch, NumThreads());
  const int64_t chunks = (batch + images - 1) / images;
  ParallelFor(0, chunks * group, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<T> col;
    thread_local std::vector<float> product;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t n0 = task / group * images, gi = task % group;
      const int64_t count = std::min(images, batch - n0);
      const int64_t cols = count * p;
      col.resize(static_cast<size_t>(kg * cols));
      for (int64_t i = 0; i < count; ++i) {
        columns->Gather(x + ((n0 + i) * channels + gi * cg) * in_size, cg, col.data() + i * p,
                        cols);
      }
      product.resize(static_cast<size_t>(mg * cols));
      GemmFloat32Accumulate(kDType, false, false, mg, cols, kg, 1.0f,
                            w_kept.data() + gi * mg * kg, kg, col.data(), cols, 0.0f,
                            product.data(), cols);
      for (int64_t m = 0; m < mg; ++m) {
        float* row = product.data() + m * cols;
        const float add = bias[gi * mg + m];
        for (int64_t i = 0; i < cols; ++i) row[i] += add;
        for (int64_t i = 0; i < count; ++i) {
          FromFloat32(kDType, row + i * p, out + ((n0 + i) * out_channels + gi * mg + m) * p, p);
        }
      }
    }
  });
}

// W_g's entries of a 2-D bfloat16 Conv in channel pairs, for
// GridConvForwardBFloat16Pairs: pairs[((gi * mg + m) * channel pairs + k) *
// kernel_size + tap] holds W[gi * mg + m][2k][tap] and W[..][2k + 1][tap]
// (zeros past the group's channels).
std::vector<uint32_t> PairedWeights(const BFloat16* w, int64_t out_channels, int64_t cg,
                                    int64_t kernel_size) {
  const int64_t pairs = (cg + 1) / 2;
  std::vector<uint32_t> paired(static_cast<size_t>(out_channels * pairs * kernel_size));
  for (int64_t m = 0; m < out_channels; ++m) {
    for (int64_t k = 0; k < pairs; ++k) {
      for (int64_t tap = 0; tap < kernel_size; ++tap) {
        const uint16_t first = w[(m * cg + 2 * k) * kernel_size + tap].bits;
        const uint16_t second =
            2 * k + 1 < cg ? w[(m * cg + 2 * k + 1) * kernel_size + tap].bits : uint16_t{0};
        paired[(m * pairs + k) * kernel_size + tap] = BFloat16Pair(first, second);
      }
    }
  }
  return paired;
}

// Y = Conv(X, W) + B for a 2-D bfloat16 Conv on VDPBF16PS straight from the
// padded grid (grid_conv.h's bfloat16 products, where
// UseGridBFloat16Products): per (image, group) task, X_g is copied in
// channel pairs onto the pair grid (im2col.h's FillPairGrid), W in pairs
// once per call; W_g times the grid's column rows plus the bias is summed
// in float32 and rounded once to bfloat16 as the products store Y. A
// narrow conv that keeps its width at unit strides (im2col.h's
// RowProductsPay) leaves the grid's padding columns out and takes the
// products over unpadded rows (im2col.h's PairRowGrid): the same sums in
// fewer vectors.
// Tasks and their split across threads as RunConv.
void RunConvBFloat16OnGrid(const KernelContext& ctx, const common::WindowGeometry& g,
                           int64_t batch, int64_t channels, int64_t out_channels, int64_t group,
                           TensorView* y) {
  const BFloat16* x = ctx.input(0).as<BFloat16>();
  BFloat16* out = y->as<BFloat16>();
  std::vector<float> bias(static_cast<size_t>(out_channels), 0.0f);
  if (ctx.has_input(2)) ToFloat32(ctx.input(2).as<BFloat16>(), bias.data(), out_channels);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  const int64_t kernel_size = g.kernel_size();
  const int64_t pairs = (cg + 1) / 2;
  const int64_t pair_depth = pairs * kernel_size;
  const std::vector<uint32_t> w =
      PairedWeights(ctx.input(1).as<BFloat16>(), out_channels, cg, kernel_size);
  const int64_t p = g.output_size();
  const int64_t in_size = g.input_size();
  const ConvTasks tasks(batch * group);
  if (RowProductsPay(g)) {
    std::vector<int64_t> line_offsets, column_shifts;
    for (int64_t kh = 0; kh < g.kernel[0]; ++kh) line_offsets.push_back(kh * g.dilations[0]);
    for (int64_t kw = 0; kw < g.kernel[1]; ++kw) {
      column_shifts.push_back(kw * g.dilations[1] - g.pad_begin[1]);
    }
    const PairRowGrid grid(pairs, g.input[0] + g.pad_begin[0] + g.pad_end[0], g.input[1],
                           g.pad_begin[0], line_offsets, column_shifts);
    auto run_image = [&](int64_t task) {
      const int64_t n = task / group, gi = task % group;
      const BFloat16* xg = x + (n * channels + gi * cg) * in_size;
      BFloat16* yg = out + (n * out_channels + gi * mg) * p;
      thread_local std::vector<uint32_t> buffer;
      buffer.resize(static_cast<size_t>(grid.buffer_size()));
      uint32_t* planes = grid.Planes(buffer.data());
      tasks.Split(pairs, [&](int64_t lo, int64_t hi) {
        grid.Fill(xg, cg, g.input[0], in_size, lo, hi, planes);
      });
      tasks.Split((p + 15) / 16, [&](int64_t lo, int64_t hi) {
        GridConvForwardBFloat16PairRows(mg, pair_depth, w.data() + gi * mg * pair_depth,
                                        pair_depth, planes, grid.pair_rows(),
                                        grid.Positions(lo * 16, std::min(p, hi * 16)),
                                        bias.data() + gi * mg, yg, p);
      });
    };
    tasks.Run(run_image);
    return;
  }
  const PaddedGrid grid(g);
  std::vector<int64_t> pair_rows;  // pair row k: the pair grid + pair_rows[k]
  for (int64_t row = 0; row < pair_depth; ++row) pair_rows.push_back(grid.RowOffset(row));
  const int64_t line = g.output[1];
  const int64_t lines = p / line;
  auto run_image = [&](int64_t task) {
    const int64_t n = task / group, gi = task % group;
    const BFloat16* xg = x + (n * channels + gi * cg) * in_size;
    BFloat16* yg = out + (n * out_channels + gi * mg) * p;
    thread_local std::vector<uint32_t> pair_grid;
    const int64_t grid_size = grid.buffer_size(pairs) + kGridReadSlack;
    pair_grid.resize(static_cast<size_t>(grid_size));
    uint32_t* padded = pair_grid.data();
    tasks.Split(pairs, [&](int64_t lo, int64_t hi) {
      FillPairGrid(xg, cg, lo, hi, grid, padded);
    });
    std::fill(padded + pairs * grid.channel_size(), padded + grid_size, 0u);
    tasks.Split(lines, [&](int64_t lo, int64_t hi) {
      GridConvForwardBFloat16Pairs(mg, pair_depth, w.data() + gi * mg * pair_depth, pair_depth,
                                   padded + lo * grid.cols, pair_rows.data(),
                                   GridLines{hi - lo, line, grid.cols, line},
                                   bias.data() + gi * mg, yg + lo * line, p);
    });
  };
  tasks.Run(run_image);
}

absl::Status ConvKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t group = ctx.GetInt("group", 1);
  if (absl::Status s = common::CheckConv(ctx, group); !s.ok()) return s;
  const int64_t batch = x.dims[0], channels = x.dims[1], out_channels = w.dims[0];
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  absl::StatusOr<common::WindowGeometry> g =
      common::ForwardWindowGeometry(ctx, spatial, kernel, false);
  if (!g.ok()) return g.status();
  std::vector<int64_t> out_dims = {batch, out_channels};
  out_dims.insert(out_dims.end(), g->output.begin(), g->output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  if ((*y)->num_elements() == 0) return absl::OkStatus();
  if (FewOutputPositions(*g) &&
      (x.dtype == DType::kFloat32 || x.dtype == DType::kBFloat16)) {
    if (x.dtype == DType::kFloat32) {
      RunConvOnImageColumns<float>(ctx, *g, batch, channels, out_channels, group, *y);
    } else {
      RunConvOnImageColumns<BFloat16>(ctx, *g, batch, channels, out_channels, group, *y);
    }
    return absl::OkStatus();
  }
  if (x.dtype == DType::kBFloat16 && PaddedGrid::Applies(*g) && UseGridBFloat16Products() &&
      !g->pointwise()) {
    RunConvBFloat16OnGrid(ctx, *g, batch, channels, out_channels, group, *y);
    return absl::OkStatus();
  }
  if (x.dtype == DType::kBFloat16 && NativeBFloat16Gemm() && NativeConvPays(*g)) {
    RunConvBFloat16Native(ctx, *g, batch, channels, out_channels, group, *y);
    return absl::OkStatus();
  }
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    RunConv<T, Acc>(ctx, *g, batch, channels, out_channels, group, *y);
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

// ---- ConvTranspose ---------------------------------------------------------


// Scatter-adds col [mg * kernel_size, input_size] into out [mg, output_size]
// for output channels [m_lo, m_hi): im2col's transpose, with the roles of
// the input and output axes swapped (the window index runs over the input).
template <typename Acc>
void Col2Im(const Acc* col, const common::WindowGeometry& g, Acc* out, int64_t m_lo, int64_t m_hi) {
  const int nd = g.num_spatial;
  const int64_t ksize = g.kernel_size();
  const int64_t in_size = g.input_size();
  const int64_t out_size = g.output_size();
  const int64_t in_last = g.input[nd - 1];
  const int64_t outer_count = in_size / std::max<int64_t>(in_last, 1);
  const int64_t s = g.strides[nd - 1];
  std::vector<int64_t> kidx(nd), iidx(nd);
  for (int64_t row = m_lo * ksize; row < m_hi * ksize; ++row) {
    const int64_t m = DecodeKernelRow(g, row, kidx.data());
    const Acc* src = col + row * in_size;
    Acc* dst_plane = out + m * out_size;
    const LastAxisSpan span = LastAxisSpanOf(g, kidx[nd - 1], in_last, g.output[nd - 1]);
    UnravelOuter(g.input, 0, iidx.data());
    for (int64_t outer = 0; outer < outer_count; ++outer, src += in_last) {
      const int64_t offset = OuterOffset(g, iidx.data(), kidx.data(), g.output);
      NextOuter(g.input, iidx.data());
      if (offset < 0) continue;
      Acc* dst = dst_plane + offset + span.shift;
      for (int64_t i = span.lo; i < span.hi; ++i) dst[i * s] += src[i];
    }
  }
}

template <typename T, typename Acc>
void RunConvTranspose(const KernelContext& ctx, const common::WindowGeometry& g, int64_t batch,
                      int64_t channels, int64_t out_channels, int64_t group, TensorView* y) {
  const ConvOperands<T, Acc> ops(ctx, y, out_channels);
  const int64_t cg = channels / group;
  const int64_t mg = out_channels / group;
  const int64_t rows = mg * g.kernel_size();
  const int64_t in_size = g.input_size();
  const int64_t out_size = g.output_size();
  const ConvTasks tasks(batch * group, IsSmallGemm(rows, in_size, cg));
  // bfloat16 X and W multiply as stored where gemm.h has a native bfloat16
  // kernel (AMX, AVX512-BF16), summing in float32.
  const BFloat16* w_stored = nullptr;
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (NativeBFloat16Gemm()) w_stored = ctx.input(1).as<BFloat16>();
  }
  auto task = [&](int64_t t) {
    const int64_t n = t / group, gi = t % group;
    thread_local std::vector<Acc> x_widened, col, acc;
    const T* xg = ops.x + (n * channels + gi * cg) * in_size;
    col.resize(static_cast<size_t>(rows * in_size));
    // col [mg*k, in] = W_g^T X_g, W_g stored [cg, mg*k].
    bool multiplied = false;
    if constexpr (std::is_same_v<T, BFloat16>) {
      if (w_stored != nullptr) {
        GemmFloat32Accumulate(DType::kBFloat16, true, false, rows, in_size, cg, 1.0f,
                              w_stored + gi * cg * rows, rows, xg, in_size, 0.0f, col.data(),
                              in_size);
        multiplied = true;
      }
    }
    if (!multiplied) {
      const Acc* xa;
      if constexpr (std::is_same_v<T, Acc>) {
        xa = xg;
      } else {
        x_widened.resize(static_cast<size_t>(cg * in_size));
        for (int64_t i = 0; i < cg * in_size; ++i) x_widened[i] = WidenTo<Acc>(xg[i]);
        xa = x_widened.data();
      }
      GemmAcc<Acc>(true, false, rows, in_size, cg, ops.w + gi * cg * rows, rows, xa, in_size,
                   col.data(), in_size);
    }
    acc.resize(static_cast<size_t>(mg * out_size));
    for (int64_t m = 0; m < mg; ++m) {
      std::fill(acc.begin() + m * out_size, acc.begin() + (m + 1) * out_size,
                ops.bias[gi * mg + m]);
    }
    T* yg = ops.y + (n * out_channels + gi * mg) * out_size;
    auto scatter = [&](int64_t lo, int64_t hi) {
      Col2Im<Acc>(col.data(), g, acc.data(), lo, hi);
      for (int64_t i = lo * out_size; i < hi * out_size; ++i) StoreAcc(&yg[i], acc[i]);
    };
    if (tasks.parallel()) {
      scatter(0, mg);
    } else {
      // thread_local buffers belong to this (calling) thread; workers only
      // touch disjoint channel ranges of them.
      Acc* col_data = col.data();
      Acc* acc_data = acc.data();
      ParallelFor(0, mg, 1, [&](int64_t lo, int64_t hi) {
        Col2Im<Acc>(col_data, g, acc_data, lo, hi);
        for (int64_t i = lo * out_size; i < hi * out_size; ++i) StoreAcc(&yg[i], acc_data[i]);
      });
    }
  };
  tasks.Run(task);
}

absl::Status ConvTransposeKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t group = ctx.GetInt("group", 1);
  CASTOR_RETURN_IF_ERROR(common::CheckConvTranspose(ctx, group));
  const int64_t out_channels = w.dims[1] * group;
  const int64_t batch = x.dims[0], channels = x.dims[1];
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  absl::StatusOr<common::WindowGeometry> g =
      common::TransposeWindowGeometry(ctx, spatial, kernel);
  if (!g.ok()) return g.status();
  std::vector<int64_t> out_dims = {batch, out_channels};
  out_dims.insert(out_dims.end(), g->output.begin(), g->output.end());
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dtype, out_dims);
  if (!y.ok()) return y.status();
  if ((*y)->num_elements() == 0) return absl::OkStatus();
  const bool ok = DispatchFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    RunConvTranspose<T, Acc>(ctx, *g, batch, channels, out_channels, group, *y);
  });
  if (!ok) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(x.dtype)));
  return absl::OkStatus();
}

}  // namespace

void RegisterConvKernels(KernelTable& table) {
  // castor's forms (com.castor, the training graph's bfloat16 Conv below
  // opset 22) run the same kernels.
  for (const char* domain : {"", kCastorDomain}) {
    table.Register({domain, "Conv", InputDTypeIn(0, kConvDTypes), ConvKernel});
    table.Register({domain, "ConvTranspose", InputDTypeIn(0, kConvDTypes), ConvTransposeKernel});
  }
}

}  // namespace castor::cpu
