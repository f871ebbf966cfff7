// Whether a mixed-precision policy can pay on the hardware it runs on, as
// the Keras mixed-precision guide's compatibility check says: a 16-bit
// compute dtype that the hardware (or castor's kernels for it) cannot
// compute natively is emulated, each value widened to float32 and rounded
// back, so steps run slower than float32; only activation memory is saved.
//
// CheckPolicyFit is the one decision, a pure function of the policy's
// compute dtype, the backend and the hardware facts passed in (tests feed
// it every combination); DetectCpuPrecisionFeatures and this file's
// ...ForThisMachine helpers read the facts of the machine (the CPU's CPUID
// flags through the CPU backend's GEMM kernels' own detection, the GPU's
// compute capability through ProbeCuda). `castor train` prints the warning
// once and repeats it in its summary; `castor --version` lists the verdict
// for each mixed policy on this machine.
//
// The rules:
//   float16, CPU:  never pays. castor's CPU backend has no native float16
//                  arithmetic: without AVX512-FP16 the CPU has none, and
//                  with it castor has no kernels that use it yet.
//   bfloat16, CPU: pays where castor's bfloat16 GEMM kernels run and
//                  outrun float32: AMX (AMX-BF16 tiles), or AVX512-BF16
//                  (VDPBF16PS) where its measured multiply-add rate is at
//                  least 1.25x the float32 FMA's (avx512bf16_gemm.h; 0.5x
//                  on some Intel Xeons, whose float32 then wins), unless the
//                  environment switched them off (CASTOR_AMX=off,
//                  CASTOR_AVX512BF16=off).
//   float16, CUDA: pays from compute capability 7.0 (float16 tensor cores).
//   bfloat16, CUDA: pays from compute capability 8.0 (bfloat16 tensor
//                  cores).
//   any other compute dtype (float32): nothing to say.
// The better choice named: on a CPU, mixed_bfloat16 where it pays, else
// float32; on a GPU, mixed_float16 for bfloat16 below 8.0 where float16
// pays, else float32.
#pragma once

#include <optional>
#include <string>

#include "graph/dtype.h"

namespace castor {

// The backend a policy runs on.
enum class PolicyFitBackend { kCpu, kCuda };

// What the CPU offers for 16-bit arithmetic, as CPUID and the OS report it
// (and whether castor's kernel for a feature was switched off).
struct CpuPrecisionFeatures {
  bool avx512_fp16 = false;  // AVX512-FP16: native float16 arithmetic (Sapphire Rapids+)
  bool avx512_bf16 = false;  // AVX512-BF16: VDPBF16PS bfloat16 dot products
  bool amx_bf16 = false;     // AMX-TILE + AMX-BF16 tiles, granted by the OS
  // VDPBF16PS's multiply-adds per second over the float32 FMA's, as
  // measured on this core (avx512bf16_gemm.h); read where avx512_bf16.
  double avx512_bf16_rate = 0.0;
  bool avx512_bf16_switched_off = false;  // CASTOR_AVX512BF16=off (or a test) turned it off
  bool amx_switched_off = false;          // CASTOR_AMX=off (or a test) turned it off
};

// The GPU a CUDA policy runs on (device 0).
struct GpuPrecisionFeatures {
  std::string name;  // e.g. "NVIDIA H200"; "" for "this GPU"
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

// A policy that cannot pay, in parts, and the whole sentence.
struct PolicyFitWarning {
  std::string hardware_fact;  // "this CPU has no AVX512-FP16"
  std::string effect;         // "float16 arithmetic is emulated ...; memory is still saved"
  std::string better_policy;  // "mixed_bfloat16" or "float32" (or "mixed_float16" on a GPU)
  // "policy mixed_float16 cannot pay on this CPU: <fact>, so <effect>.
  // Better here: <better_policy> (<why>)".
  std::string message;
};

// The warning when policy `policy_name` (its compute dtype `compute_dtype`)
// cannot pay on `backend` with these hardware facts (`gpu` is read for
// kCuda only, `cpu` for kCpu only); nullopt where it pays or where the
// compute dtype is float32 (or anything but float16 and bfloat16).
std::optional<PolicyFitWarning> CheckPolicyFit(const std::string& policy_name,
                                               DType compute_dtype, PolicyFitBackend backend,
                                               const CpuPrecisionFeatures& cpu,
                                               const GpuPrecisionFeatures& gpu);

// This CPU's features (CPUID and XCR0, checked once; VDPBF16PS's rate,
// measured once; the switches as the CPU backend's GEMM kernels read them
// now).
CpuPrecisionFeatures DetectCpuPrecisionFeatures();

// CheckPolicyFit's message for this machine: the CPU's features for kCpu,
// device 0's compute capability (ProbeCuda) for kCuda; "" where the policy
// pays (or, for kCuda, no GPU is usable).
std::string PolicyFitWarningForThisMachine(const std::string& policy_name, DType compute_dtype,
                                           PolicyFitBackend backend);

// The lines `castor --version` prints, one per mixed policy (mixed_float16,
// mixed_bfloat16) and backend: the CPU, and the GPU when `gpu` is given
// (a usable one): "policy fit: policy mixed_bfloat16 pays on this CPU
// (castor's bfloat16 GEMMs run on its AVX512-BF16)" or "policy fit: " and
// the warning; and for a GPU older than compute capability 8.0, a line
// saying castor's CUDA backend cannot use it.
std::string DescribePolicyFit(const CpuPrecisionFeatures& cpu,
                              const std::optional<GpuPrecisionFeatures>& gpu);

// DescribePolicyFit for this machine's CPU and device 0 (when usable).
std::string DescribePolicyFitForThisMachine();

}  // namespace castor
