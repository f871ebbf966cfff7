// OpenBLAS kernel choice (see blas_core.h).
#include "backend/cpu/blas_core.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_features.h"

extern "C" char* openblas_get_corename(void);

namespace castor::cpu {
namespace {

// The core OpenBLAS 0.3.x (x86-64, DYNAMIC_ARCH) uses for a CPU it does not
// know.
constexpr char kGenericCore[] = "Prescott";

}  // namespace

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

std::string BestBlasCoreForThisCpu() {
#if defined(__x86_64__) || defined(__i386__)
  // Each feature counts only where the OS saves its registers (XCR0), as in
  // OpenBLAS's own detection.
  const CpuFeatures& f = HostCpuFeatures();
  if (f.avx512f && f.avx512cd && f.avx512bw && f.avx512dq && f.avx512vl) return "SkylakeX";
  if (f.avx2 && f.fma) return "Haswell";
  if (f.avx) return "Sandybridge";
#endif
  return "";  // not x86, or no AVX: nothing better than what OpenBLAS chose
}

void RestartWithBestBlasCore(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice stands
  if (BlasCoreName() != kGenericCore) return;               // OpenBLAS knew this CPU
  const std::string best = BestBlasCoreForThisCpu();
  if (best.empty()) return;
  // Started through the dynamic loader (ld-linux.so ./castor ...): the
  // loader is /proc/self/exe and would take argv[1] for the program.
  char exe[4096];
  const ssize_t length = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (length <= 0) return;
  exe[length] = '\0';
  const char* slash = std::strrchr(exe, '/');
  if (std::strncmp(slash != nullptr ? slash + 1 : exe, "ld-", 3) == 0) return;
  // OPENBLAS_CORETYPE is now set, so the restarted program does not restart
  // again, whatever OpenBLAS makes of it.
  if (setenv("OPENBLAS_CORETYPE", best.c_str(), /*overwrite=*/1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on with the generic kernels
}

std::string DescribeBlasCore() {
  const std::string core = BlasCoreName();
  std::string line = absl::StrCat("OpenBLAS ", core, " kernels");
  const std::string best = BestBlasCoreForThisCpu();
  if (core == kGenericCore && !best.empty()) {
    const char* chosen = std::getenv("OPENBLAS_CORETYPE");
    if (chosen != nullptr) {
      absl::StrAppend(&line, " (generic, with OPENBLAS_CORETYPE=", chosen,
                      "; this CPU can run ", best, ")");
    } else {
      absl::StrAppend(&line, " (generic; this CPU can run ", best, ": set OPENBLAS_CORETYPE=",
                      best, ")");
    }
  }
  return line;
}

}  // namespace castor::cpu
