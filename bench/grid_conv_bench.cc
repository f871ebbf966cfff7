// The bfloat16 pair products of a 3x3 conv with pads 1 (backend/cpu/grid_conv.h)
// on one image, one thread: on the padded grid (GridConvForwardBFloat16Pairs,
// each output line in its own vectors) against unpadded rows
// (GridConvForwardBFloat16PairRows, vectors across line ends under masks),
// at the widths where each pays. Counters (rates, so Google Benchmark
// prints them "/s"): GMAC, the conv's multiply-adds per second in
// billions (the lanes spent on padding do not count), and peak, the share
// of VDPBF16PS's peak a core reaches, from peak_gmacs (default 117: one
// 512-bit VDPBF16PS a cycle at 3.66 GHz, measured on the Zen 4 EPYC of
// bench/README.md; pass --peak_gmacs=N for another CPU). Skips without
// AVX512-BF16.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/grid_conv.h"
#include "backend/cpu/im2col.h"

namespace castor::cpu {
namespace {

double peak_gmacs = 117.0;

common::WindowGeometry SameGeometry(int64_t size) {
  common::WindowGeometry g;
  g.num_spatial = 2;
  g.input = {size, size};
  g.kernel = {3, 3};
  g.strides = {1, 1};
  g.dilations = {1, 1};
  g.pad_begin = {1, 1};
  g.pad_end = {1, 1};
  g.output = {size, size};
  return g;
}

// Args: channels (in = out), image size, 1 for unpadded rows.
void BM_PairProducts(benchmark::State& state) {
  if (!UseGridBFloat16Products()) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  const int64_t channels = state.range(0), size = state.range(1);
  const bool rows = state.range(2) != 0;
  const common::WindowGeometry g = SameGeometry(size);
  const int64_t pairs = (channels + 1) / 2, depth = pairs * 9, p = size * size;
  const std::vector<BFloat16> x(static_cast<size_t>(channels * p), BFloat16{0x3f80});
  const std::vector<uint32_t> a(static_cast<size_t>(channels * depth), 0x3c003c00u);
  const std::vector<float> init(static_cast<size_t>(channels), 0.0f);
  std::vector<BFloat16> out(static_cast<size_t>(channels * p));
  const PaddedGrid padded_grid(g);
  std::vector<uint32_t> padded(
      static_cast<size_t>(padded_grid.buffer_size(pairs) + kGridReadSlack), 0);
  FillPairGrid(x.data(), channels, 0, pairs, padded_grid, padded.data());
  std::vector<int64_t> padded_rows;
  for (int64_t k = 0; k < depth; ++k) padded_rows.push_back(padded_grid.RowOffset(k));
  const PairRowGrid row_grid(pairs, size + 2, size, 1, {0, 1, 2}, {-1, 0, 1});
  std::vector<uint32_t> buffer(static_cast<size_t>(row_grid.buffer_size()));
  uint32_t* planes = row_grid.Planes(buffer.data());
  row_grid.Fill(x.data(), channels, size, p, 0, pairs, planes);
  for (auto _ : state) {
    if (rows) {
      GridConvForwardBFloat16PairRows(channels, depth, a.data(), depth, planes,
                                      row_grid.pair_rows(), row_grid.Positions(0, p),
                                      init.data(), out.data(), p);
    } else {
      GridConvForwardBFloat16Pairs(channels, depth, a.data(), depth, padded.data(),
                                   padded_rows.data(),
                                   GridLines{size, size, padded_grid.cols, size}, init.data(),
                                   out.data(), p);
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double macs = static_cast<double>(channels) * channels * 9 * p;
  state.counters["GMAC"] =
      benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak"] = benchmark::Counter(macs * 1e-9 / peak_gmacs,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(rows ? "unpadded rows" : "padded grid");
}
BENCHMARK(BM_PairProducts)
    ->ArgNames({"channels", "size", "rows"})
    ->Args({16, 28, 0})
    ->Args({16, 28, 1})
    ->Args({32, 14, 0})
    ->Args({32, 14, 1})
    ->Args({64, 10, 0})
    ->Args({64, 10, 1})
    ->Args({64, 7, 0})
    ->Args({64, 7, 1})
    ->Args({128, 4, 0})
    ->Args({128, 4, 1});

}  // namespace
}  // namespace castor::cpu

int main(int argc, char** argv) {
  const std::string flag = "--peak_gmacs=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(flag, 0) == 0) {
      castor::cpu::peak_gmacs = std::atof(arg.c_str() + flag.size());
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
