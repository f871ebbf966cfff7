// HostCpuFeatures (see cpu_features.h): CPUID leaves 1 and 7 (subleaves 0
// and 1) masked by the register state XGETBV(0) says the OS saves. Written
// with <cpuid.h> rather than __builtin_cpu_supports, which older compilers
// (clang 14) lack for some names (f16c) and which knows nothing of
// AVX512-BF16/FP16 or AMX in GCC 12.
#include "backend/cpu/cpu_features.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define CASTOR_CPU_FEATURES_X86 1
#include <cpuid.h>
#endif

namespace castor::cpu {
namespace {

#if defined(CASTOR_CPU_FEATURES_X86)
bool Bit(unsigned word, int bit) { return ((word >> bit) & 1u) != 0; }

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return f;
  const bool osxsave = Bit(ecx, 27);
  if (!osxsave) return f;  // no XGETBV: the OS saves nothing past SSE
  const bool cpu_fma = Bit(ecx, 12), cpu_avx = Bit(ecx, 28), cpu_f16c = Bit(ecx, 29);
  unsigned xcr0 = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
  constexpr unsigned kYmmState = 0x6;         // SSE, AVX
  constexpr unsigned kZmmState = 0xe0;        // opmask, ZMM_Hi256, Hi16_ZMM
  constexpr unsigned kTileState = 0x60000u;   // XTILECFG, XTILEDATA
  const bool os_ymm = (xcr0 & kYmmState) == kYmmState;
  const bool os_zmm = os_ymm && (xcr0 & kZmmState) == kZmmState;
  const bool os_tiles = (xcr0 & kTileState) == kTileState;
  f.avx = cpu_avx && os_ymm;
  f.fma = f.avx && cpu_fma;
  f.f16c = f.avx && cpu_f16c;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return f;
  const unsigned max_subleaf = eax;
  f.avx2 = f.avx && Bit(ebx, 5);
  f.avx512f = os_zmm && Bit(ebx, 16);
  f.avx512dq = f.avx512f && Bit(ebx, 17);
  f.avx512cd = f.avx512f && Bit(ebx, 28);
  f.avx512bw = f.avx512f && Bit(ebx, 30);
  f.avx512vl = f.avx512f && Bit(ebx, 31);
  f.avx512_fp16 = f.avx512bw && f.avx512vl && Bit(edx, 23);
  f.amx_bf16 = os_tiles && Bit(edx, 22);
  f.amx_tile = os_tiles && Bit(edx, 24);
  if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0) {
    f.avx512_bf16 = f.avx512bw && f.avx512vl && Bit(eax, 5);
  }
  return f;
}
#else
CpuFeatures Detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace castor::cpu
