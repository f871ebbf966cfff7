// CPU-tier checks of the CUDA probe's contract, which must hold on every
// machine: compiled matches the build, a usable probe describes a device,
// an unusable one says why (no crash, no exception without a GPU).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace castor
