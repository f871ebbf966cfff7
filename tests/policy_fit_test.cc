// Whether a policy can pay on the hardware (backend/policy_fit.h):
// CheckPolicyFit for every combination of compute dtype, backend, CPU
// feature set and GPU compute capability (facts passed in, not read from
// this machine), and end to end with the built castor: `castor train`
// warns once on stderr and repeats it in the summary where the policy
// cannot pay (mixed_float16 on any CPU; mixed_bfloat16 where castor's
// bfloat16 GEMMs cannot run natively, e.g. switched off), says nothing
// where it pays or under float32; `castor --version` gives each mixed
// policy's verdict; `castor convert` never warns.
#include "backend/policy_fit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/avx512bf16_gemm.h"
#include "tests/cli_test_util.h"
#include "training/npy.h"

namespace castor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Occurrences of `needle` in `text`.
int Count(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// VDPBF16PS's measured rate over the float32 FMA's on an AMD Zen 4 and on
// the Intel Xeon (family 6 model 207) of bench/README.md.
constexpr double kZen4Rate = 2.0;
constexpr double kXeonRate = 0.5;

// The six CPU facts from the bits of `mask` (bit 5: VDPBF16PS at the Xeon's
// rate instead of Zen 4's).
constexpr int kCpuMasks = 64;
CpuPrecisionFeatures CpuFromMask(int mask) {
  CpuPrecisionFeatures cpu;
  cpu.avx512_fp16 = mask & 1;
  cpu.avx512_bf16 = mask & 2;
  cpu.amx_bf16 = mask & 4;
  cpu.avx512_bf16_switched_off = mask & 8;
  cpu.amx_switched_off = mask & 16;
  cpu.avx512_bf16_rate = cpu.avx512_bf16 ? (mask & 32 ? kXeonRate : kZen4Rate) : 0.0;
  return cpu;
}

std::string Describe(const CpuPrecisionFeatures& cpu) {
  return absl::StrCat("fp16 ", cpu.avx512_fp16, " avx512bf16 ", cpu.avx512_bf16, " amx ",
                      cpu.amx_bf16, " avx512bf16 off ", cpu.avx512_bf16_switched_off,
                      " amx off ", cpu.amx_switched_off, " rate ", cpu.avx512_bf16_rate);
}

std::optional<PolicyFitWarning> OnCpu(DType dtype, const CpuPrecisionFeatures& cpu) {
  const char* name = dtype == DType::kFloat16 ? "mixed_float16" : "mixed_bfloat16";
  return CheckPolicyFit(name, dtype, PolicyFitBackend::kCpu, cpu, GpuPrecisionFeatures{});
}

std::optional<PolicyFitWarning> OnGpu(DType dtype, int major, int minor) {
  const char* name = dtype == DType::kFloat16 ? "mixed_float16" : "mixed_bfloat16";
  return CheckPolicyFit(name, dtype, PolicyFitBackend::kCuda, CpuPrecisionFeatures{},
                        GpuPrecisionFeatures{"NVIDIA Test", major, minor});
}

// What every warning says: the policy, the hardware fact, the effect and
// the better choice.
void ExpectCompleteMessage(const PolicyFitWarning& w, const std::string& policy,
                           const std::string& where, const std::string& what) {
  EXPECT_THAT(w.message, HasSubstr(absl::StrCat("policy ", policy, " cannot pay on this ", where,
                                                ": ")))
      << what;
  EXPECT_THAT(w.message, HasSubstr(w.hardware_fact)) << what;
  EXPECT_THAT(w.message, HasSubstr("steps run ")) << what;
  EXPECT_THAT(w.message, HasSubstr(" than float32")) << what;
  EXPECT_THAT(w.message, HasSubstr("memory is still saved")) << what;
  EXPECT_THAT(w.message, HasSubstr(absl::StrCat("Better here: ", w.better_policy, " ("))) << what;
  EXPECT_NE(w.better_policy, policy) << what;
}

TEST(PolicyFit, Float32NeverWarns) {
  for (int mask = 0; mask < kCpuMasks; ++mask) {
    EXPECT_FALSE(CheckPolicyFit("float32", DType::kFloat32, PolicyFitBackend::kCpu,
                                CpuFromMask(mask), {})
                     .has_value());
  }
  for (int major = 0; major <= 10; ++major) {
    EXPECT_FALSE(CheckPolicyFit("float32", DType::kFloat32, PolicyFitBackend::kCuda, {},
                                {"old", major, 0})
                     .has_value());
  }
  // A custom policy computing in float64 has nothing to say either.
  EXPECT_FALSE(
      CheckPolicyFit("wide", DType::kFloat64, PolicyFitBackend::kCpu, {}, {}).has_value());
}

// The CPU of the measurements (AMD EPYC Zen 4: AVX512-BF16, no
// AVX512-FP16, no AMX): mixed_bfloat16 pays; mixed_float16 does not, and
// mixed_bfloat16 is the better choice.
TEST(PolicyFit, Zen4Cpu) {
  CpuPrecisionFeatures zen4;
  zen4.avx512_bf16 = true;
  zen4.avx512_bf16_rate = kZen4Rate;
  EXPECT_FALSE(OnCpu(DType::kBFloat16, zen4).has_value());
  std::optional<PolicyFitWarning> w = OnCpu(DType::kFloat16, zen4);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->hardware_fact, "this CPU has no AVX512-FP16 (native float16 arithmetic)");
  EXPECT_EQ(w->better_policy, "mixed_bfloat16");
  EXPECT_EQ(w->message,
            "policy mixed_float16 cannot pay on this CPU: this CPU has no AVX512-FP16 (native "
            "float16 arithmetic), so castor emulates float16 arithmetic (each value widened to "
            "float32 and rounded back): steps run slower than float32, activation memory is "
            "still saved. Better here: mixed_bfloat16 (castor's bfloat16 GEMMs run on this "
            "CPU's AVX512-BF16, and it saves the same memory)");
}

// An AVX2-only CPU: neither mixed policy pays; float32 is better.
TEST(PolicyFit, Avx2OnlyCpu) {
  const CpuPrecisionFeatures avx2;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::optional<PolicyFitWarning> w = OnCpu(dtype, avx2);
    ASSERT_TRUE(w.has_value()) << DTypeName(dtype);
    EXPECT_EQ(w->better_policy, "float32");
  }
  EXPECT_EQ(OnCpu(DType::kBFloat16, avx2)->hardware_fact,
            "this CPU has neither AVX512-BF16 nor AMX");
  EXPECT_THAT(OnCpu(DType::kBFloat16, avx2)->message,
              HasSubstr("castor emulates bfloat16 arithmetic"));
  EXPECT_THAT(OnCpu(DType::kBFloat16, avx2)->message,
              HasSubstr("keep mixed_bfloat16 only for the memory it saves"));
}

// Sapphire Rapids: AVX512-FP16, AVX512-BF16 (at the Xeon's rate) and AMX.
// castor has no float16 kernels for AVX512-FP16, so mixed_float16 still
// cannot pay, and the message says why; mixed_bfloat16 runs on AMX.
TEST(PolicyFit, SapphireRapidsCpu) {
  CpuPrecisionFeatures spr;
  spr.avx512_fp16 = spr.avx512_bf16 = spr.amx_bf16 = true;
  spr.avx512_bf16_rate = kXeonRate;
  EXPECT_FALSE(OnCpu(DType::kBFloat16, spr).has_value());
  std::optional<PolicyFitWarning> w = OnCpu(DType::kFloat16, spr);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->hardware_fact,
            "this CPU has AVX512-FP16 but castor's CPU backend has no float16 kernels that use "
            "it yet");
  EXPECT_EQ(w->better_policy, "mixed_bfloat16");
  EXPECT_THAT(w->message, HasSubstr("bfloat16 GEMMs run on this CPU's AMX"));
  // With AMX switched off, what is left is VDPBF16PS at half the float32
  // rate: bfloat16 cannot pay, and float32 is the better choice.
  spr.amx_switched_off = true;
  w = OnCpu(DType::kBFloat16, spr);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->hardware_fact,
            "this CPU's AVX512-BF16 dot products run at 0.50x the rate of its float32 FMAs "
            "(measured), and castor's AMX kernels are switched off (CASTOR_AMX=off in the "
            "environment)");
  EXPECT_EQ(w->better_policy, "float32");
  EXPECT_EQ(OnCpu(DType::kFloat16, spr)->better_policy, "float32");
  // Where VDPBF16PS ran at Zen 4's rate, it would take the GEMMs.
  spr.avx512_bf16_rate = kZen4Rate;
  EXPECT_FALSE(OnCpu(DType::kBFloat16, spr).has_value());
  EXPECT_THAT(OnCpu(DType::kFloat16, spr)->message,
              HasSubstr("bfloat16 GEMMs run on this CPU's AVX512-BF16"));
  // With both switched off, bfloat16 is emulated too, and the switches are named.
  spr.avx512_bf16_switched_off = true;
  w = OnCpu(DType::kBFloat16, spr);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->hardware_fact,
            "this CPU has bfloat16 instructions but castor's kernels for them are switched off "
            "(CASTOR_AMX=off and CASTOR_AVX512BF16=off in the environment)");
  EXPECT_EQ(w->better_policy, "float32");
  EXPECT_EQ(OnCpu(DType::kFloat16, spr)->better_policy, "float32");
}

// The Xeon of bench/README.md (family 6 model 207 in a VM that hides AMX):
// AVX512-FP16 and AVX512-BF16, VDPBF16PS at half the float32 FMA rate, so
// OpenBLAS's float32 outruns any bfloat16 kernel and neither mixed policy
// pays. In full, as `castor --version` says it.
TEST(PolicyFit, XeonWithSlowBFloat16DotProducts) {
  CpuPrecisionFeatures xeon;
  xeon.avx512_fp16 = xeon.avx512_bf16 = true;
  xeon.avx512_bf16_rate = 0.49;
  std::optional<PolicyFitWarning> w = OnCpu(DType::kBFloat16, xeon);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->message,
            "policy mixed_bfloat16 cannot pay on this CPU: this CPU's AVX512-BF16 dot products "
            "run at 0.49x the rate of its float32 FMAs (measured) and it has no AMX, so castor "
            "widens bfloat16 GEMMs and convolutions to float32, which this CPU multiplies "
            "faster (CASTOR_AVX512BF16=on takes VDPBF16PS anyway): steps run no faster than "
            "float32, activation memory is still saved. Better here: float32 (this CPU "
            "multiplies float32 faster than bfloat16; keep mixed_bfloat16 only for the memory "
            "it saves)");
  w = OnCpu(DType::kFloat16, xeon);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->better_policy, "float32");
  EXPECT_THAT(w->message, HasSubstr("(this CPU multiplies float32 faster than bfloat16; keep "
                                    "mixed_float16 only for the memory it saves)"));
  // The threshold: from 1.25x the kernels pay.
  xeon.avx512_bf16_rate = 1.24;
  EXPECT_TRUE(OnCpu(DType::kBFloat16, xeon).has_value());
  xeon.avx512_bf16_rate = 1.25;
  EXPECT_FALSE(OnCpu(DType::kBFloat16, xeon).has_value());
}

TEST(PolicyFit, SwitchedOffKernelIsNamed) {
  CpuPrecisionFeatures zen4_off;
  zen4_off.avx512_bf16 = zen4_off.avx512_bf16_switched_off = true;
  std::optional<PolicyFitWarning> w = OnCpu(DType::kBFloat16, zen4_off);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->hardware_fact,
            "this CPU has bfloat16 instructions but castor's kernels for them are switched off "
            "(CASTOR_AVX512BF16=off in the environment)");
  CpuPrecisionFeatures amx_off;
  amx_off.amx_bf16 = amx_off.amx_switched_off = true;
  EXPECT_EQ(OnCpu(DType::kBFloat16, amx_off)->hardware_fact,
            "this CPU has bfloat16 instructions but castor's kernels for them are switched off "
            "(CASTOR_AMX=off in the environment)");
  // A switch for a feature the CPU lacks changes nothing.
  CpuPrecisionFeatures amx_only;
  amx_only.amx_bf16 = true;
  amx_only.avx512_bf16_switched_off = true;
  EXPECT_FALSE(OnCpu(DType::kBFloat16, amx_only).has_value());
}

// Every one of the 64 CPU feature sets: mixed_float16 never pays on a CPU;
// mixed_bfloat16 pays exactly where a bfloat16 kernel runs and outruns
// float32 (AMX, or AVX512-BF16 at Zen 4's rate; not switched off);
// mixed_float16's better choice is
// mixed_bfloat16 exactly where that one pays, else float32; the GPU facts
// do not matter.
TEST(PolicyFit, EveryCpuFeatureSet) {
  for (int mask = 0; mask < kCpuMasks; ++mask) {
    const CpuPrecisionFeatures cpu = CpuFromMask(mask);
    const std::string what = Describe(cpu);
    const bool bf16_kernel =
        (cpu.amx_bf16 && !cpu.amx_switched_off) ||
        (cpu.avx512_bf16 && !cpu.avx512_bf16_switched_off && cpu.avx512_bf16_rate > 1.0);
    std::optional<PolicyFitWarning> f16 = OnCpu(DType::kFloat16, cpu);
    std::optional<PolicyFitWarning> bf16 = OnCpu(DType::kBFloat16, cpu);
    ASSERT_TRUE(f16.has_value()) << what;
    ExpectCompleteMessage(*f16, "mixed_float16", "CPU", what);
    EXPECT_THAT(f16->hardware_fact, HasSubstr("AVX512-FP16")) << what;
    EXPECT_EQ(f16->better_policy, bf16_kernel ? "mixed_bfloat16" : "float32") << what;
    EXPECT_EQ(bf16.has_value(), !bf16_kernel) << what;
    if (bf16.has_value()) {
      ExpectCompleteMessage(*bf16, "mixed_bfloat16", "CPU", what);
      EXPECT_EQ(bf16->better_policy, "float32") << what;
    }
    for (int major : {5, 7, 9}) {
      std::optional<PolicyFitWarning> with_gpu = CheckPolicyFit(
          "mixed_bfloat16", DType::kBFloat16, PolicyFitBackend::kCpu, cpu, {"G", major, 0});
      EXPECT_EQ(with_gpu.has_value(), bf16.has_value()) << what << " gpu " << major;
    }
  }
}

// GPUs: float16 pays from compute capability 7.0, bfloat16 from 8.0;
// bfloat16 below 8.0 points to mixed_float16 where that pays. The CPU's
// facts do not matter.
TEST(PolicyFit, EveryGpuComputeCapability) {
  const std::vector<std::pair<int, int>> capabilities = {
      {3, 5}, {5, 0}, {5, 2}, {6, 0}, {6, 1}, {7, 0}, {7, 2}, {7, 5},
      {8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}};
  for (const auto& [major, minor] : capabilities) {
    const std::string what = absl::StrCat("compute capability ", major, ".", minor);
    const bool f16_pays = major >= 7, bf16_pays = major >= 8;
    std::optional<PolicyFitWarning> f16 = OnGpu(DType::kFloat16, major, minor);
    std::optional<PolicyFitWarning> bf16 = OnGpu(DType::kBFloat16, major, minor);
    EXPECT_EQ(f16.has_value(), !f16_pays) << what;
    EXPECT_EQ(bf16.has_value(), !bf16_pays) << what;
    if (f16.has_value()) {
      ExpectCompleteMessage(*f16, "mixed_float16", "GPU", what);
      EXPECT_EQ(f16->hardware_fact,
                absl::StrCat("NVIDIA Test (", what,
                             ") is below compute capability 7.0 and has no float16 tensor cores"));
      EXPECT_EQ(f16->better_policy, "float32") << what;
    }
    if (bf16.has_value()) {
      ExpectCompleteMessage(*bf16, "mixed_bfloat16", "GPU", what);
      EXPECT_EQ(bf16->hardware_fact,
                absl::StrCat("NVIDIA Test (", what,
                             ") is below compute capability 8.0 and has no bfloat16 tensor "
                             "cores"));
      EXPECT_EQ(bf16->better_policy, f16_pays ? "mixed_float16" : "float32") << what;
    }
    for (int mask : {0, 31}) {
      EXPECT_EQ(CheckPolicyFit("mixed_float16", DType::kFloat16, PolicyFitBackend::kCuda,
                               CpuFromMask(mask), {"NVIDIA Test", major, minor})
                    .has_value(),
                !f16_pays)
          << what;
    }
  }
  // A T4 (7.5) under mixed_bfloat16, in full.
  EXPECT_EQ(CheckPolicyFit("mixed_bfloat16", DType::kBFloat16, PolicyFitBackend::kCuda, {},
                           {"Tesla T4", 7, 5})
                ->message,
            "policy mixed_bfloat16 cannot pay on this GPU: Tesla T4 (compute capability 7.5) is "
            "below compute capability 8.0 and has no bfloat16 tensor cores, so castor emulates "
            "bfloat16 arithmetic (each value widened to float32 and rounded back): steps run "
            "slower than float32, activation memory is still saved. Better here: mixed_float16 "
            "(this GPU has float16 tensor cores, and it saves the same memory)");
  // An unnamed GPU is "this GPU".
  std::optional<PolicyFitWarning> unnamed =
      CheckPolicyFit("p", DType::kFloat16, PolicyFitBackend::kCuda, {}, {"", 6, 1});
  ASSERT_TRUE(unnamed.has_value());
  EXPECT_THAT(unnamed->message,
              HasSubstr("this GPU (compute capability 6.1) is below"));
}

// A custom policy's name is the one the warning gives.
TEST(PolicyFit, NamesACustomPolicy) {
  std::optional<PolicyFitWarning> w =
      CheckPolicyFit("my_half_policy", DType::kFloat16, PolicyFitBackend::kCpu, {}, {});
  ASSERT_TRUE(w.has_value());
  EXPECT_THAT(w->message, HasSubstr("policy my_half_policy cannot pay on this CPU"));
  EXPECT_THAT(w->message, HasSubstr("keep my_half_policy only for the memory it saves"));
}

// The --version lines, for machines this one is not.
TEST(PolicyFit, DescribesEachMixedPolicyOnEachBackend) {
  CpuPrecisionFeatures zen4;
  zen4.avx512_bf16 = true;
  zen4.avx512_bf16_rate = kZen4Rate;
  const std::string cpu_only = DescribePolicyFit(zen4, std::nullopt);
  EXPECT_EQ(cpu_only,
            "policy fit: " + OnCpu(DType::kFloat16, zen4)->message +
                "\npolicy fit: policy mixed_bfloat16 pays on this CPU (castor's bfloat16 GEMMs "
                "run on its AVX512-BF16)\n");

  CpuPrecisionFeatures spr;
  spr.avx512_fp16 = spr.avx512_bf16 = spr.amx_bf16 = true;
  const std::string h200 = DescribePolicyFit(spr, GpuPrecisionFeatures{"NVIDIA H200", 9, 0});
  EXPECT_THAT(h200, HasSubstr("policy fit: policy mixed_bfloat16 pays on this CPU (castor's "
                              "bfloat16 GEMMs run on its AMX)\n"));
  EXPECT_THAT(h200, HasSubstr("policy fit: policy mixed_float16 pays on this GPU (float16 tensor "
                              "cores)\n"));
  EXPECT_THAT(h200, HasSubstr("policy fit: policy mixed_bfloat16 pays on this GPU (bfloat16 "
                              "tensor cores)\n"));
  EXPECT_EQ(Count(h200, "policy fit: "), 4);
  EXPECT_EQ(Count(h200, "cannot pay"), 1);  // mixed_float16 on the CPU

  // A T4: its verdicts, and that castor's CUDA backend cannot use it.
  const std::string t4 = DescribePolicyFit({}, GpuPrecisionFeatures{"Tesla T4", 7, 5});
  EXPECT_THAT(t4, HasSubstr("policy fit: policy mixed_float16 pays on this GPU"));
  EXPECT_THAT(t4, HasSubstr("policy fit: policy mixed_bfloat16 cannot pay on this GPU: Tesla T4"));
  EXPECT_THAT(t4, HasSubstr("policy fit: castor's CUDA backend needs compute capability 8.0; "
                            "Tesla T4 (compute capability 7.5) is older, so castor trains on "
                            "the CPU here\n"));
  EXPECT_EQ(Count(t4, "cannot pay on this CPU"), 2);  // an AVX2-only CPU
  EXPECT_THAT(h200, Not(HasSubstr("needs compute capability")));
}

// ---- end to end, with the built castor on this machine -----------------------

class PolicyFitCliTest : public tools::CliTempDirTest {
 protected:
  PolicyFitCliTest() : CliTempDirTest("policy_fit") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    std::mt19937 rng(5);
    tools::WriteImageSplit(dir_, "train", 32, 1, rng);
    tools::WriteImageSplit(dir_, "test", 16, 1, rng);
  }

  // `castor train` on the sample MLP, 2 epochs of 2 steps (so evaluation
  // and a checkpoint come in between), on the CPU, with `env` (VAR=value
  // words) in its environment.
  tools::Program Train(const std::string& policy, const std::string& env = "") {
    const std::string data = absl::StrCat((dir_ / "train_x.npy").string(), ",",
                                          (dir_ / "train_y.npy").string(), ",",
                                          (dir_ / "test_x.npy").string(), ",",
                                          (dir_ / "test_y.npy").string());
    return tools::RunCastor(
        dir_,
        absl::StrCat("train ", CASTOR_SOURCE_DIR, "/models/mlp_opset17.onnx --backend cpu --data ",
                     data, " --batch 16 --epochs 2 --policy ", policy, " --checkpoint-dir ",
                     (dir_ / "ckpt").string()),
        env.empty() ? std::string(CASTOR_BINARY) : absl::StrCat("env ", env, " ", CASTOR_BINARY));
  }
};

// This machine's CPU: whether castor's bfloat16 GEMMs run natively on it
// and outrun float32 (VDPBF16PS's rate as this process measured it; far
// from the threshold on the CPUs seen, 0.5 or 2).
bool CpuComputesBFloat16() {
  const CpuPrecisionFeatures cpu = DetectCpuPrecisionFeatures();
  return (cpu.amx_bf16 && !cpu.amx_switched_off) ||
         (cpu.avx512_bf16 && !cpu.avx512_bf16_switched_off &&
          cpu::Avx512Bf16RatePays(cpu.avx512_bf16_rate));
}

TEST_F(PolicyFitCliTest, TrainWarnsOnceAboutMixedFloat16OnTheCpu) {
  const tools::Program p = Train("mixed_float16");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::string warning =
      "castor train: warning: policy mixed_float16 cannot pay on this CPU: this CPU has ";
  EXPECT_EQ(Count(p.err, warning), 1) << p.err;
  EXPECT_EQ(Count(p.err, "cannot pay"), 1) << p.err;
  EXPECT_THAT(p.err, HasSubstr("AVX512-FP16"));
  EXPECT_THAT(p.err, HasSubstr("steps run slower than float32, activation memory is still saved"));
  EXPECT_THAT(p.err, HasSubstr(CpuComputesBFloat16() ? "Better here: mixed_bfloat16"
                                                     : "Better here: float32"));
  // The summary repeats it, once; stdout has it nowhere else.
  EXPECT_EQ(Count(p.out, "  policy fit      policy mixed_float16 cannot pay on this CPU: "), 1)
      << p.out;
  EXPECT_EQ(Count(p.out, "cannot pay"), 1) << p.out;
  // The summary's sentence is the warning's.
  const size_t at = p.err.find("policy mixed_float16 cannot pay");
  const std::string sentence = p.err.substr(at, p.err.find('\n', at) - at);
  EXPECT_THAT(p.out, HasSubstr("  policy fit      " + sentence + "\n"));
}

TEST_F(PolicyFitCliTest, TrainUnderMixedBFloat16WarnsOnlyWhereItCannotPay) {
  const tools::Program p = Train("mixed_bfloat16");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  if (CpuComputesBFloat16()) {
    // This machine (AVX512-BF16 or AMX): it pays, not a word.
    EXPECT_THAT(p.err, Not(HasSubstr("cannot pay")));
    EXPECT_THAT(p.out, Not(HasSubstr("cannot pay")));
    EXPECT_THAT(p.out, Not(HasSubstr("policy fit")));
  } else {
    // No bfloat16 instructions, or VDPBF16PS slower than float32.
    const std::string fact = DetectCpuPrecisionFeatures().avx512_bf16
                                 ? "this CPU's AVX512-BF16 dot products run at "
                                 : "this CPU has neither AVX512-BF16 nor AMX";
    EXPECT_EQ(Count(p.err, "castor train: warning: policy mixed_bfloat16 cannot pay on this "
                           "CPU: " + fact),
              1)
        << p.err;
    EXPECT_EQ(Count(p.out, "  policy fit      policy mixed_bfloat16 cannot pay"), 1);
  }
}

// With castor's bfloat16 kernels switched off, mixed_bfloat16 is emulated
// on any CPU, and the warning names the switch.
TEST_F(PolicyFitCliTest, TrainNamesASwitchedOffBFloat16Kernel) {
  const CpuPrecisionFeatures cpu = DetectCpuPrecisionFeatures();
  if (!cpu.avx512_bf16 && !cpu.amx_bf16) {
    GTEST_SKIP() << "this CPU has neither AVX512-BF16 nor AMX: nothing to switch off";
  }
  const tools::Program p = Train("mixed_bfloat16", "CASTOR_AMX=off CASTOR_AVX512BF16=off");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(Count(p.err, "castor train: warning: policy mixed_bfloat16 cannot pay on this CPU"),
            1)
      << p.err;
  EXPECT_THAT(p.err, HasSubstr("are switched off ("));
  EXPECT_THAT(p.err, HasSubstr("Better here: float32"));
  EXPECT_EQ(Count(p.out, "  policy fit      policy mixed_bfloat16 cannot pay"), 1);
}

TEST_F(PolicyFitCliTest, Float32TrainsWithoutAWord) {
  const tools::Program p = Train("float32");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.err, Not(HasSubstr("cannot pay")));
  EXPECT_THAT(p.out, Not(HasSubstr("policy fit")));
}

// A resumed run is a run: it says it once more (under the checkpoint's policy).
TEST_F(PolicyFitCliTest, ResumeWarnsOnceUnderTheCheckpointsPolicy) {
  ASSERT_EQ(Train("mixed_float16").exit_code, 0);
  const tools::Program p = tools::RunCastor(
      dir_, absl::StrCat("train --resume ", (dir_ / "ckpt").string(), " --epochs 3"));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(Count(p.err, "castor train: warning: policy mixed_float16 cannot pay on this CPU"),
            1)
      << p.err;
  EXPECT_EQ(Count(p.out, "  policy fit      policy mixed_float16 cannot pay"), 1);
}

TEST_F(PolicyFitCliTest, VersionGivesEachMixedPolicysVerdictForThisCpu) {
  const tools::Program p = tools::RunCastor(dir_, "--version");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(Count(p.out, "policy fit: policy mixed_float16 cannot pay on this CPU: "), 1)
      << p.out;
  if (CpuComputesBFloat16()) {
    EXPECT_EQ(Count(p.out, "policy fit: policy mixed_bfloat16 pays on this CPU (castor's "
                           "bfloat16 GEMMs run on its "),
              1)
        << p.out;
  } else {
    EXPECT_EQ(Count(p.out, "policy fit: policy mixed_bfloat16 cannot pay on this CPU: "), 1)
        << p.out;
  }
  EXPECT_THAT(p.out, Not(HasSubstr("policy float32")));
  EXPECT_TRUE(p.err.empty()) << p.err;
}

TEST_F(PolicyFitCliTest, VersionNamesSwitchedOffBFloat16Kernels) {
  const CpuPrecisionFeatures cpu = DetectCpuPrecisionFeatures();
  if (!cpu.avx512_bf16 && !cpu.amx_bf16) {
    GTEST_SKIP() << "this CPU has neither AVX512-BF16 nor AMX: nothing to switch off";
  }
  const tools::Program p =
      tools::RunCastor(dir_, "--version",
                       absl::StrCat("env CASTOR_AMX=off CASTOR_AVX512BF16=off ", CASTOR_BINARY));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.out, HasSubstr("policy fit: policy mixed_bfloat16 cannot pay on this CPU: this "
                               "CPU has "));
  EXPECT_THAT(p.out, HasSubstr("are switched off"));
  EXPECT_THAT(p.out, HasSubstr("Better here: float32"));
}

// Converting is not running: no verdict.
TEST_F(PolicyFitCliTest, ConvertDoesNotWarn) {
  for (const char* policy : {"mixed_float16", "mixed_bfloat16"}) {
    const tools::Program p = tools::RunCastor(
        dir_, absl::StrCat("convert ", CASTOR_SOURCE_DIR, "/models/mlp_opset17.onnx -o ",
                           (dir_ / "converted.onnx").string(), " --policy ", policy));
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_THAT(p.out + p.err, Not(HasSubstr("cannot pay"))) << policy;
    EXPECT_THAT(p.out + p.err, Not(HasSubstr("policy fit"))) << policy;
    std::filesystem::remove(dir_ / "converted.onnx");
  }
}

}  // namespace
}  // namespace castor
