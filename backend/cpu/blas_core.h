// Which OpenBLAS kernels castor's float32 GEMMs run on, and a restart that
// picks better ones when OpenBLAS did not recognise the CPU.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: when the library loads, it
// chooses a kernel set ("core") from the CPU's family and model. A CPU newer
// than the library (OpenBLAS 0.3.21 does not know Intel family 6 model 207,
// Emerald Rapids, for one) gets the generic SSE3 "Prescott" kernels even
// when it has AVX-512, and its GEMMs run 1.5-2x slower. OpenBLAS reads the
// OPENBLAS_CORETYPE environment variable only while it loads, so the only
// way to change the choice is to set it and start the program again:
//
//   int main(int argc, char** argv) {
//     castor::cpu::RestartWithBestBlasCore(argv);  // first thing; may not return
//     ...
//   }
#pragma once

#include <string>

namespace castor::cpu {

// The kernel set OpenBLAS is running, e.g. "SkylakeX", "Haswell", "Prescott".
std::string BlasCoreName();

// The best OpenBLAS kernel set this CPU (and the OS) supports, from the CPU's
// feature flags rather than its model: "SkylakeX" with AVX-512
// F/CD/BW/DQ/VL, "Haswell" with AVX2 and FMA, "Sandybridge" with AVX; ""
// for a CPU without AVX, where the generic kernels are right.
std::string BestBlasCoreForThisCpu();

// When OpenBLAS fell back to its generic Prescott kernels although this
// CPU can run a better set, and the user has not chosen one with
// OPENBLAS_CORETYPE: sets OPENBLAS_CORETYPE to BestBlasCoreForThisCpu() and
// re-executes the running program (/proc/self/exe) with the same `argv`
// and environment (so programs castor starts inherit OPENBLAS_CORETYPE).
// Call it first thing in main, before any other thread or open resource
// matters. Returns when no restart is needed, when the program was started
// through the dynamic loader (ld-linux.so PROGRAM ...), or when the exec
// failed; the program then runs on the generic kernels.
void RestartWithBestBlasCore(char** argv);

// One line for summaries and --version: "OpenBLAS SkylakeX kernels", plus
// a hint when the kernels are worse than this CPU allows.
std::string DescribeBlasCore();

}  // namespace castor::cpu
