// The x86 instruction sets castor's CPU kernels choose between at run time.
// The build has no -march flags: every vector loop (float_io, simd16, the
// grid convolution, the bfloat16 GEMMs, OpenBLAS's core choice) is picked
// by these facts, read once from CPUID and XGETBV. A feature is reported
// only when the OS also saves the registers it uses (XCR0), so a kernel
// may run wherever its flag is true. All false off x86.
#pragma once

namespace castor::cpu {

struct CpuFeatures {
  bool avx = false;   // AVX with the YMM state saved
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;  // VCVTPH2PS / VCVTPS2PH
  // AVX-512, each with the opmask and ZMM state saved.
  bool avx512f = false;
  bool avx512cd = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;  // VDPBF16PS, VCVTNE2PS2BF16 (leaf 7.1 EAX bit 5)
  bool avx512_fp16 = false;  // float16 arithmetic (leaf 7.0 EDX bit 23)
  // AMX with the tile state enabled in XCR0. Linux still grants the tile
  // data per process on request (amx_gemm.cc asks).
  bool amx_tile = false;
  bool amx_bf16 = false;
};

// This machine's features, detected on the first call.
const CpuFeatures& HostCpuFeatures();

}  // namespace castor::cpu
