// The CPU backend's GEMM entry (backend/cpu/gemm.h) on the GEMM shapes of
// the sample models' training steps at batch 128 and a few square-ish
// MLP/transformer sizes: float32 (OpenBLAS sgemm on castor's threads),
// bfloat16 widened to float32 for that sgemm, bfloat16 on AMX tiles
// (backend/cpu/amx_gemm.h) and bfloat16 on AVX512-BF16 dot products
// (backend/cpu/avx512bf16_gemm.h), each where this CPU has it. Prints the
// median wall time and GFLOP/s (2 m n k / time) of each and the time ratios
// widened / native and float32 / native (> 1 where the native bfloat16
// kernel is faster; native = AMX where present, else AVX512-BF16), all
// measured in the same run:
//
//   gemm_bench [--threads N] [--seconds S] [--fastest]
//
// Like castor, it restarts itself with OPENBLAS_CORETYPE set where
// OpenBLAS fell back to its generic kernels (blas_core.h), so the float32
// column is the sgemm castor runs.
//
// (S: the minimum time each variant of each shape runs; default 0.3.
// --fastest reports the fastest call instead of the median: on a machine
// shared with other busy processes, the time of a call that ran alone.)
// Without a native kernel its columns say "-" and the table still compares
// float32 and widened bfloat16. The "bf16 registers" column is
// small_gemm.h's kernel (with C in bfloat16, which the others leave in
// float32) on the shapes it takes: no transposes, n <= 64, k <= 256.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/blas_core.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/small_gemm.h"
#include "graph/dtype.h"
#include "graph/half.h"

namespace castor::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

// From the sample models (models/generate.py) at batch 128: Linear layers
// are Gemm with transB (forward), and their gradients dX = dY W and dW =
// dY^T X.
const Shape kShapes[] = {
    {"mlp fc1 forward", 128, 512, 784, false, true},
    {"mlp fc1 dW", 512, 784, 128, true, false},
    {"mlp fc2 dX", 128, 512, 512, false, false},
    {"cnn fc1 forward", 128, 128, 5408, false, true},
    {"cnn fc1 dW", 128, 5408, 128, true, false},
    {"transformer ffn forward", 3584, 128, 64, false, true},
    {"transformer ffn dW", 128, 64, 3584, true, false},
    {"transformer attention", 28, 28, 16, false, true},
    {"attention Q K^T (MatMul)", 28, 28, 16, false, false},
    {"attention softmax V (MatMul)", 28, 16, 28, false, false},
    {"square 512", 512, 512, 512, false, false},
    {"bert-base ffn-like", 2048, 768, 768, false, true},
    {"bert-base ffn-like dW", 768, 768, 2048, true, false},
};

bool report_fastest = false;  // --fastest

// Median (or with --fastest the least) seconds per call of fn, run for at
// least `seconds` (and 5 calls).
template <typename Fn>
double MedianSeconds(double seconds, Fn fn) {
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 5 ||
         std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (report_fastest) return *std::min_element(times.begin(), times.end());
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

int Main(int argc, char** argv) {
  double seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      cpu::SetNumThreads(std::max(1, std::atoi(argv[++i])));
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (arg == "--fastest") {
      report_fastest = true;
    } else {
      std::fprintf(stderr,
                   "usage: gemm_bench [--threads N] [--seconds S] [--fastest]\n"
                   "gemm_bench: error: unknown argument '%s'\n",
                   arg.c_str());
      return 2;
    }
  }
  const bool amx = cpu::AmxBf16Supported(), avx512bf16 = cpu::Avx512Bf16Supported();
  std::printf("GEMM: %s; %d threads; AMX bfloat16: %s; AVX512-BF16: %s",
              cpu::DescribeGemm().c_str(), cpu::NumThreads(), amx ? "yes" : "no",
              avx512bf16 ? "yes" : "no");
  if (avx512bf16) {
    std::printf(" (VDPBF16PS at %.2fx the float32 FMA's multiply-add rate)",
                cpu::Avx512Bf16RateOverFloat32());
  }
  std::printf("; %s time per call\n\n", report_fastest ? "fastest" : "median");
  std::printf("| shape | m x n x k | float32 us (GFLOP/s) | bf16 widened us (GFLOP/s) | "
              "bf16 AMX us (GFLOP/s) | bf16 AVX512-BF16 us (GFLOP/s) | bf16 registers us "
              "(GFLOP/s) | widened / native | float32 / native |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : kShapes) {
    const int64_t a_size = s.m * s.k, b_size = s.k * s.n;
    std::vector<float> a32(a_size), b32(b_size), c(s.m * s.n);
    std::vector<uint16_t> a16(a_size), b16(b_size);
    for (int64_t i = 0; i < a_size; ++i) a16[i] = FloatToBFloat16Bits(a32[i] = dist(rng));
    for (int64_t i = 0; i < b_size; ++i) b16[i] = FloatToBFloat16Bits(b32[i] = dist(rng));
    const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    auto run = [&](DType dtype, const void* a, const void* b) {
      cpu::GemmFloat32Accumulate(dtype, s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, lda, b,
                                 ldb, 0.0f, c.data(), s.n);
    };
    // bfloat16 with only the chosen native kernel (or none) allowed.
    auto bf16 = [&](bool use_amx, bool use_avx512bf16) {
      cpu::SetAmxForTesting(use_amx);
      cpu::SetAvx512Bf16ForTesting(use_avx512bf16 ? cpu::KernelSwitch::kOn
                                                  : cpu::KernelSwitch::kOff);
      const double t =
          MedianSeconds(seconds, [&] { run(DType::kBFloat16, a16.data(), b16.data()); });
      cpu::SetAmxForTesting(true);
      cpu::SetAvx512Bf16ForTesting(cpu::KernelSwitch::kAuto);
      return t;
    };
    const double f32 =
        MedianSeconds(seconds, [&] { run(DType::kFloat32, a32.data(), b32.data()); });
    const double widened = bf16(false, false);
    const double tiles = amx ? bf16(true, false) : 0.0;
    const double dots = avx512bf16 ? bf16(false, true) : 0.0;
    const double native = amx ? tiles : dots;
    // small_gemm.h's kernel takes bfloat16 only where gemm.h would widen it.
    double registers = 0.0;
    cpu::SetAmxForTesting(false);
    cpu::SetAvx512Bf16ForTesting(cpu::KernelSwitch::kOff);
    if (!s.trans_a && !s.trans_b && cpu::SmallGemmApplies(DType::kBFloat16, s.m, s.n, s.k)) {
      std::vector<uint16_t> c16(static_cast<size_t>(s.m * s.n));
      registers = MedianSeconds(seconds, [&] {
        cpu::SmallGemmRounded(DType::kBFloat16, s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(),
                              ldb, c16.data(), s.n);
      });
    }
    cpu::SetAmxForTesting(true);
    cpu::SetAvx512Bf16ForTesting(cpu::KernelSwitch::kAuto);
    const double flop = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) *
                        static_cast<double>(s.k);
    auto cell = [&](double t) {
      char text[64];
      if (t <= 0.0) return std::string("-");
      std::snprintf(text, sizeof(text), "%.1f (%.0f)", t * 1e6, flop / t * 1e-9);
      return std::string(text);
    };
    auto ratio = [&](double t) {
      char text[32];
      if (native <= 0.0) return std::string("-");
      std::snprintf(text, sizeof(text), "%.2f", t / native);
      return std::string(text);
    };
    const std::string dims = std::to_string(s.m) + " x " + std::to_string(s.n) + " x " +
                             std::to_string(s.k) + (s.trans_a ? " (A^T)" : "") +
                             (s.trans_b ? " (B^T)" : "");
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.name, dims.c_str(),
                cell(f32).c_str(), cell(widened).c_str(), cell(tiles).c_str(),
                cell(dots).c_str(), cell(registers).c_str(), ratio(widened).c_str(),
                ratio(f32).c_str());
  }
  std::printf("\nratios are times divided by the native bfloat16 kernel's time (AMX where "
              "present, else AVX512-BF16): > 1 where it is faster\n");
  return 0;
}

}  // namespace
}  // namespace castor::bench

int main(int argc, char** argv) {
  castor::cpu::RestartWithBestBlasCore(argv);  // OpenBLAS's kernels as castor runs them
  return castor::bench::Main(argc, argv);
}
