// CPU-tier checks of the CUDA probe's contract, which must hold on every
// machine: compiled matches the build, a usable probe describes a device,
// an unusable one says why (no crash, no exception without a GPU), and a
// machine without an NVIDIA driver never maps the CUDA backend's module or
// its libraries.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"

namespace castor {
namespace {

TEST(CudaProbeContract, MatchesBuildAndExplainsItself) {
  const CudaProbe probe = ProbeCuda();
#if defined(CASTOR_HAVE_CUDA)
  EXPECT_TRUE(probe.compiled);
#else
  EXPECT_FALSE(probe.compiled);
#endif
  if (probe.usable) {
    EXPECT_GE(probe.device_count, 1);
    EXPECT_FALSE(probe.device_name.empty());
  } else {
    EXPECT_FALSE(probe.reason.empty());
    EXPECT_EQ(probe.device_count, 0);
  }
  const std::string text = DescribeCudaProbe(probe);
  EXPECT_NE(text.find("CUDA backend"), std::string::npos) << text;
  if (!probe.usable) {
    EXPECT_NE(text.find(probe.compiled ? probe.reason : "not compiled"), std::string::npos) << text;
  }
}

TEST(CudaProbeContract, RepeatedProbesAgree) {
  const CudaProbe a = ProbeCuda();
  const CudaProbe b = ProbeCuda();
  EXPECT_EQ(a.compiled, b.compiled);
  EXPECT_EQ(a.usable, b.usable);
  EXPECT_EQ(a.device_count, b.device_count);
}

// Whether this process has mapped a file whose path contains `name`.
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// Asking for CUDA on a machine without a driver costs nothing: the probe,
// a refused backend and a CPU backend's memory statistics leave the module
// (and cuBLAS, cuBLASLt, cuDNN) unloaded.
TEST(CudaModule, StaysUnloadedWithoutADriver) {
  const CudaProbe probe = ProbeCuda();
  if (probe.usable || Mapped("libcuda.so")) {
    GTEST_SKIP() << "this machine has an NVIDIA driver: the module loads when a device is found";
  }
  ASSERT_FALSE(Mapped("libcastor_cuda.so")) << "the probe loaded the module";
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend();
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().message(), probe.reason);
  CpuBackend cpu;
  absl::StatusOr<DeviceMemoryStats> stats = CudaMemoryStats(cpu);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("backend 'cpu' is not a CUDA backend"),
            absl::string_view::npos)
      << stats.status();
  for (const char* library : {"libcastor_cuda.so", "libcudart", "libcublas", "libcudnn"}) {
    EXPECT_FALSE(Mapped(library)) << library;
  }
}

}  // namespace
}  // namespace castor
