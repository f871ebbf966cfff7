// bfloat16 GEMM on AVX512-BF16 (VDPBF16PS, the bfloat16 dot-product
// instruction of Intel Cooper Lake / Sapphire Rapids and AMD Zen 4), for
// the CPU backend's 16-bit MatMul/Gemm/Conv under mixed_bfloat16 where the
// CPU has no AMX (gemm.h's GemmFloat32Accumulate takes it after AMX).
//
// op(A) is packed into panels of 16 rows and op(B) into panels of 16
// columns, both in the pair-interleaved layout VDPBF16PS reads (k and k + 1
// of one row or column side by side in one 32-bit word, zero-padded to an
// even K and to whole panels); a 16 x 16 block of C is 16 ZMM registers of
// float32 accumulators fed over all of K by one VDPBF16PS per register per
// k pair (A's word broadcast, B's 16 words loaded). alpha and beta are
// applied when a block is written back (alpha once per K panel: only when
// the packed copies would pass 32 MiB is K cut into panels).
//
// Numerics (Intel's SDM for VDPBF16PS, and measured on an AMD EPYC Zen 4
// by avx512bf16_gemm_test): products of two bfloat16 are exact in float32;
// each k pair adds its odd product, then its even one, to the float32
// accumulator, each addition fused (the exact product) and rounded to
// nearest even whatever MXCSR says; subnormal inputs (bfloat16 operands and
// the accumulator) count as zero and sums that underflow are flushed to
// zero, where the widened sgemm path keeps subnormals (so a subnormal times
// an infinity is NaN here, Inf there). Results agree with the sgemm path to
// float32 rounding of the sum's magnitude, not bit for bit (another order
// of sums); every C element is summed over K in one fixed order, so the
// bits do not depend on the number of threads or on run-to-run timing.
// Inf and NaN propagate as in float32 (Inf * 0 is NaN; a signalling NaN
// comes out quiet); -0 products sum to +0 as in sgemm.
//
// Runs only where the CPU has AVX512-BF16 with AVX-512 F/BW/VL and AVX2
// (and F16C: simd16.h's HasSimd16) and the OS saves the ZMM state (XCR0),
// in builds with GCC 10+ or clang on x86-64; the code carries
// function-level target attributes, so the binary still runs on AVX2-only
// CPUs. Elsewhere, where the instruction runs too slowly to pay
// (Avx512Bf16Pays) or with CASTOR_AVX512BF16=off in the environment,
// Avx512Bf16Available() is false and callers keep the sgemm path;
// CASTOR_AVX512BF16=on takes the kernel wherever it is supported.
#pragma once

#include <cstdint>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/gemm.h"

namespace castor::cpu {

// True when castor uses VDPBF16PS for bfloat16 GEMMs (where AMX does not
// take them first) and for grid_conv.h's bfloat16 products:
// Avx512Bf16Supported() and Avx512Bf16Switch() is kOn, or kAuto and
// Avx512Bf16Pays().
bool Avx512Bf16Available();

// True when the hardware, OS and build allow it (checked once), whatever
// the environment or a test chose.
bool Avx512Bf16Supported();

// VDPBF16PS's multiply-adds per second over those of a 512-bit float32 FMA
// (VFMADD231PS) on this core, measured once on first use (the fastest of
// several runs of each, 16 independent accumulators: under a millisecond
// in all); 0 where AVX512-BF16 is not supported. CPUID says whether the
// instruction exists, not how fast it runs: about 2 on AMD Zen 4 (one
// 32-product VDPBF16PS per cycle, one 16-lane FMA), 0.5 on the Intel Xeon
// of bench/README.md (family 6 model 207: one VDPBF16PS every other cycle
// beside two FMAs a cycle), where OpenBLAS's float32 sgemm on widened
// operands outruns any VDPBF16PS kernel.
double Avx512Bf16RateOverFloat32();

// The rate from which the VDPBF16PS kernels beat widening to float32 with
// margin: at a rate of 1 they match sgemm's peak and lose the packing.
inline constexpr double kAvx512Bf16MinRate = 1.25;
inline bool Avx512Bf16RatePays(double rate) { return rate >= kAvx512Bf16MinRate; }

// Avx512Bf16RatePays(Avx512Bf16RateOverFloat32()).
bool Avx512Bf16Pays();

// CASTOR_AVX512BF16 (gemm.h's GemmKernelSwitchInEnvironment, read once),
// unless a test overrode it.
KernelSwitch Avx512Bf16Switch();

// For tests: from now on, Avx512Bf16Switch() answers `override` (kOn,
// kOff), or the environment again (kAuto). Returns the previous override.
KernelSwitch SetAvx512Bf16ForTesting(KernelSwitch override);

// For tests: for the scope, AMX off and this kernel forced on or off, so
// that gemm.h's bfloat16 GEMMs take VDPBF16PS (where supported) or the
// widened sgemm path.
class ScopedAvx512Bf16OnlyForTesting {
 public:
  explicit ScopedAvx512Bf16OnlyForTesting(bool avx512bf16)
      : avx512bf16_(SetAvx512Bf16ForTesting(avx512bf16 ? KernelSwitch::kOn : KernelSwitch::kOff)),
        amx_(SetAmxForTesting(false)) {}
  ~ScopedAvx512Bf16OnlyForTesting() {
    SetAvx512Bf16ForTesting(avx512bf16_);
    SetAmxForTesting(amx_);
  }
  ScopedAvx512Bf16OnlyForTesting(const ScopedAvx512Bf16OnlyForTesting&) = delete;
  ScopedAvx512Bf16OnlyForTesting& operator=(const ScopedAvx512Bf16OnlyForTesting&) = delete;

 private:
  KernelSwitch avx512bf16_;
  bool amx_;
};

// For tests: pack at most `elements` bfloat16 of A and B per K panel (K is
// cut into panels of whole k pairs, at least one each); <= 0 restores the
// default (32 MiB). Returns the previous limit.
int64_t SetAvx512Bf16PanelElementsForTesting(int64_t elements);

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C with A
// and B bfloat16 bit patterns (row strides lda, ldb as stored), C float32
// (C is not read when beta == 0; k <= 0 gives beta * C). Requires
// Avx512Bf16Supported() (aborts otherwise). Splits the work across threads
// (serial inside a ParallelFor).
void Avx512Bf16Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                    float* c, int64_t ldc);

// C = alpha * op(A) * op(B) as Avx512Bf16Gemm with beta = 0, but C is
// bfloat16 (bit patterns, row stride ldc): each 16 x 16 block is rounded
// from its float32 accumulators as it is finished, so C never exists in
// float32. The same bits as Avx512Bf16Gemm followed by
// FloatToBFloat16Bits.
void Avx512Bf16GemmRounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
                           int64_t ldb, uint16_t* c, int64_t ldc);

}  // namespace castor::cpu
