// The CPU feature probe every vector kernel is picked by
// (backend/cpu/cpu_features.h) against the kernel's own account of this
// machine: each feature must equal the flag Linux lists in /proc/cpuinfo,
// which Linux, like the probe, clears where the OS does not save the
// registers. Skips (saying why) off x86 Linux or where /proc/cpuinfo has
// no flags line.
#include "backend/cpu/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace castor::cpu {
namespace {

// The words of /proc/cpuinfo's first "flags" line; empty when none.
std::set<std::string> LinuxCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    std::set<std::string> flags;
    for (std::string word; words >> word;) flags.insert(word);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, MatchTheFlagsLinuxReports) {
#if !defined(__linux__) || !(defined(__x86_64__) || defined(__i386__))
  GTEST_SKIP() << "needs x86 Linux (/proc/cpuinfo flags)";
#endif
  const std::set<std::string> flags = LinuxCpuFlags();
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no flags line";
  ASSERT_TRUE(flags.count("sse2")) << "not the x86 flags line";
  const CpuFeatures& f = HostCpuFeatures();
  const struct {
    const char* flag;
    bool detected;
  } expected[] = {
      {"avx", f.avx},
      {"avx2", f.avx2},
      {"fma", f.fma},
      {"f16c", f.f16c},
      {"avx512f", f.avx512f},
      {"avx512cd", f.avx512cd},
      {"avx512bw", f.avx512bw},
      {"avx512dq", f.avx512dq},
      {"avx512vl", f.avx512vl},
      {"avx512_bf16", f.avx512_bf16},
      {"avx512_fp16", f.avx512_fp16},
      {"amx_tile", f.amx_tile},
      {"amx_bf16", f.amx_bf16},
  };
  for (const auto& e : expected) {
    EXPECT_EQ(e.detected, flags.count(e.flag) == 1) << e.flag;
  }
}

TEST(CpuFeatures, ImpliedFeaturesAreConsistent) {
  const CpuFeatures& f = HostCpuFeatures();
  // Each extension needs the base its registers and encodings come from.
  if (f.avx2 || f.fma || f.f16c) {
    EXPECT_TRUE(f.avx);
  }
  for (bool ext : {f.avx512cd, f.avx512bw, f.avx512dq, f.avx512vl}) {
    if (ext) {
      EXPECT_TRUE(f.avx512f);
    }
  }
  if (f.avx512_bf16 || f.avx512_fp16) {
    EXPECT_TRUE(f.avx512bw && f.avx512vl);
  }
  // Detected once: the same object every call.
  EXPECT_EQ(&f, &HostCpuFeatures());
}

}  // namespace
}  // namespace castor::cpu
