// CheckPolicyFit and the machine's facts it reads (see policy_fit.h).
#include "backend/policy_fit.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cuda_probe.h"

namespace castor {
namespace {

// What every emulated 16-bit dtype costs and saves.
std::string EmulatedEffect(const char* dtype) {
  return absl::StrCat("castor emulates ", dtype,
                      " arithmetic (each value widened to float32 and rounded back): steps run "
                      "slower than float32, activation memory is still saved");
}

bool Avx512Bf16Used(const CpuPrecisionFeatures& cpu) {
  return cpu.avx512_bf16 && !cpu.avx512_bf16_switched_off;
}

bool AmxUsed(const CpuPrecisionFeatures& cpu) { return cpu.amx_bf16 && !cpu.amx_switched_off; }

// True when castor's bfloat16 GEMM kernels run on this CPU and outrun its
// float32 ones.
bool CpuBf16Native(const CpuPrecisionFeatures& cpu) {
  return AmxUsed(cpu) || (Avx512Bf16Used(cpu) && cpu::Avx512Bf16RatePays(cpu.avx512_bf16_rate));
}

// Why bfloat16 cannot pay on this CPU: no such instructions, VDPBF16PS too
// slow, or castor's kernels for them switched off. (The switched-off case
// names the variables, not the instructions: `castor --version` under
// CASTOR_AVX512BF16=off names AVX512-BF16 nowhere, as
// avx512bf16_gemm_test checks.)
std::string CpuBf16Fact(const CpuPrecisionFeatures& cpu) {
  if (!cpu.amx_bf16 && !cpu.avx512_bf16) return "this CPU has neither AVX512-BF16 nor AMX";
  if (Avx512Bf16Used(cpu)) {
    return absl::StrFormat(
        "this CPU's AVX512-BF16 dot products run at %.2fx the rate of its float32 FMAs "
        "(measured)%s",
        cpu.avx512_bf16_rate,
        !cpu.amx_bf16 ? " and it has no AMX" : ", and castor's AMX kernels are switched off "
                                               "(CASTOR_AMX=off in the environment)");
  }
  std::string off;
  if (cpu.amx_bf16) off = "CASTOR_AMX=off";
  if (cpu.avx512_bf16) absl::StrAppend(&off, off.empty() ? "" : " and ", "CASTOR_AVX512BF16=off");
  return absl::StrCat("this CPU has bfloat16 instructions but castor's kernels for them are "
                      "switched off (",
                      off, " in the environment)");
}

// What bfloat16 costs where VDPBF16PS runs but float32 outruns it.
constexpr char kSlowBf16Effect[] =
    "castor widens bfloat16 GEMMs and convolutions to float32, which this CPU multiplies faster "
    "(CASTOR_AVX512BF16=on takes VDPBF16PS anyway): steps run no faster than float32, "
    "activation memory is still saved";

std::optional<PolicyFitWarning> CheckCpu(DType compute_dtype, const CpuPrecisionFeatures& cpu) {
  PolicyFitWarning w;
  if (compute_dtype == DType::kFloat16) {
    w.hardware_fact = cpu.avx512_fp16
                          ? "this CPU has AVX512-FP16 but castor's CPU backend has no float16 "
                            "kernels that use it yet"
                          : "this CPU has no AVX512-FP16 (native float16 arithmetic)";
    w.effect = EmulatedEffect("float16");
    w.better_policy = CpuBf16Native(cpu) ? "mixed_bfloat16" : "float32";
    return w;
  }
  if (CpuBf16Native(cpu)) return std::nullopt;
  w.hardware_fact = CpuBf16Fact(cpu);
  w.effect = Avx512Bf16Used(cpu) ? kSlowBf16Effect : EmulatedEffect("bfloat16");
  w.better_policy = "float32";
  return w;
}

// "NVIDIA T4 (compute capability 7.5)".
std::string GpuName(const GpuPrecisionFeatures& gpu) {
  return absl::StrCat(gpu.name.empty() ? "this GPU" : gpu.name, " (compute capability ",
                      gpu.compute_capability_major, ".", gpu.compute_capability_minor, ")");
}

std::optional<PolicyFitWarning> CheckGpu(DType compute_dtype, const GpuPrecisionFeatures& gpu) {
  const int capability = gpu.compute_capability_major * 10 + gpu.compute_capability_minor;
  const bool float16 = compute_dtype == DType::kFloat16;
  const int needed = float16 ? 70 : 80;
  if (capability >= needed) return std::nullopt;
  PolicyFitWarning w;
  w.hardware_fact = absl::StrCat(GpuName(gpu), " is below compute capability ",
                                 float16 ? "7.0" : "8.0", " and has no ",
                                 float16 ? "float16" : "bfloat16", " tensor cores");
  w.effect = EmulatedEffect(float16 ? "float16" : "bfloat16");
  w.better_policy = !float16 && capability >= 70 ? "mixed_float16" : "float32";
  return w;
}

// Why the better policy is better here.
std::string BetterBecause(const PolicyFitWarning& w, const std::string& policy_name,
                          PolicyFitBackend backend, const CpuPrecisionFeatures& cpu) {
  if (w.better_policy == "mixed_bfloat16") {
    return absl::StrCat("castor's bfloat16 GEMMs run on this CPU's ",
                        AmxUsed(cpu) ? "AMX" : "AVX512-BF16", ", and it saves the same memory");
  }
  if (w.better_policy == "mixed_float16") {
    return "this GPU has float16 tensor cores, and it saves the same memory";
  }
  const bool faster_float32 = backend == PolicyFitBackend::kCpu && Avx512Bf16Used(cpu);
  return absl::StrCat(faster_float32 ? "this CPU multiplies float32 faster than bfloat16"
                                     : absl::StrCat("no 16-bit float is native on this ",
                                                    backend == PolicyFitBackend::kCpu ? "CPU"
                                                                                      : "GPU"),
                      "; keep ", policy_name, " only for the memory it saves");
}

}  // namespace

std::optional<PolicyFitWarning> CheckPolicyFit(const std::string& policy_name,
                                               DType compute_dtype, PolicyFitBackend backend,
                                               const CpuPrecisionFeatures& cpu,
                                               const GpuPrecisionFeatures& gpu) {
  if (compute_dtype != DType::kFloat16 && compute_dtype != DType::kBFloat16) return std::nullopt;
  std::optional<PolicyFitWarning> w = backend == PolicyFitBackend::kCpu
                                          ? CheckCpu(compute_dtype, cpu)
                                          : CheckGpu(compute_dtype, gpu);
  if (!w.has_value()) return std::nullopt;
  w->message = absl::StrCat("policy ", policy_name, " cannot pay on this ",
                            backend == PolicyFitBackend::kCpu ? "CPU" : "GPU", ": ",
                            w->hardware_fact, ", so ", w->effect, ". Better here: ",
                            w->better_policy, " (",
                            BetterBecause(*w, policy_name, backend, cpu), ")");
  return w;
}

CpuPrecisionFeatures DetectCpuPrecisionFeatures() {
  CpuPrecisionFeatures cpu;
  cpu.avx512_fp16 = cpu::HostCpuFeatures().avx512_fp16;
  cpu.avx512_bf16 = cpu::Avx512Bf16Supported();
  cpu.amx_bf16 = cpu::AmxBf16Supported();
  cpu.avx512_bf16_switched_off =
      cpu.avx512_bf16 && cpu::Avx512Bf16Switch() == cpu::KernelSwitch::kOff;
  if (cpu.avx512_bf16 && !cpu.avx512_bf16_switched_off) {
    cpu.avx512_bf16_rate = cpu::Avx512Bf16RateOverFloat32();
  }
  cpu.amx_switched_off = cpu.amx_bf16 && !cpu::AmxBf16Available();
  return cpu;
}

namespace {

// Device 0's facts, or nullopt when no GPU is usable.
std::optional<GpuPrecisionFeatures> DetectGpu() {
  const CudaProbe probe = ProbeCuda();
  if (!probe.usable) return std::nullopt;
  return GpuPrecisionFeatures{probe.device_name, probe.compute_capability_major,
                              probe.compute_capability_minor};
}

// Why a policy that pays does (CheckPolicyFit said it does).
std::string PaysBecause(DType compute_dtype, PolicyFitBackend backend,
                        const CpuPrecisionFeatures& cpu) {
  const char* dtype = compute_dtype == DType::kFloat16 ? "float16" : "bfloat16";
  if (backend == PolicyFitBackend::kCuda) return absl::StrCat(dtype, " tensor cores");
  return absl::StrCat("castor's bfloat16 GEMMs run on its ", AmxUsed(cpu) ? "AMX" : "AVX512-BF16");
}

}  // namespace

std::string PolicyFitWarningForThisMachine(const std::string& policy_name, DType compute_dtype,
                                           PolicyFitBackend backend) {
  if (compute_dtype != DType::kFloat16 && compute_dtype != DType::kBFloat16) return "";
  GpuPrecisionFeatures gpu;
  if (backend == PolicyFitBackend::kCuda) {
    std::optional<GpuPrecisionFeatures> found = DetectGpu();
    if (!found.has_value()) return "";
    gpu = *found;
  }
  std::optional<PolicyFitWarning> w =
      CheckPolicyFit(policy_name, compute_dtype, backend, DetectCpuPrecisionFeatures(), gpu);
  return w.has_value() ? w->message : "";
}

std::string DescribePolicyFit(const CpuPrecisionFeatures& cpu,
                              const std::optional<GpuPrecisionFeatures>& gpu) {
  std::string text;
  for (PolicyFitBackend backend : {PolicyFitBackend::kCpu, PolicyFitBackend::kCuda}) {
    if (backend == PolicyFitBackend::kCuda && !gpu.has_value()) continue;
    const char* where = backend == PolicyFitBackend::kCpu ? "CPU" : "GPU";
    for (const auto& [name, dtype] : {std::pair<const char*, DType>{"mixed_float16",
                                                                     DType::kFloat16},
                                      {"mixed_bfloat16", DType::kBFloat16}}) {
      std::optional<PolicyFitWarning> w =
          CheckPolicyFit(name, dtype, backend, cpu, gpu.value_or(GpuPrecisionFeatures{}));
      absl::StrAppend(&text, "policy fit: ",
                      w.has_value() ? w->message
                                    : absl::StrCat("policy ", name, " pays on this ", where, " (",
                                                   PaysBecause(dtype, backend, cpu), ")"),
                      "\n");
    }
  }
  // CreateCudaBackend refuses devices older than 8.0 (cuda_backend.h).
  if (gpu.has_value() && gpu->compute_capability_major < 8) {
    absl::StrAppend(&text, "policy fit: castor's CUDA backend needs compute capability 8.0; ",
                    GpuName(*gpu), " is older, so castor trains on the CPU here\n");
  }
  return text;
}

std::string DescribePolicyFitForThisMachine() {
  return DescribePolicyFit(DetectCpuPrecisionFeatures(), DetectGpu());
}

}  // namespace castor
