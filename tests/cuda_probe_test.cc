// CUDA-tier smoke test of the backend wiring: on a GPU machine the probe
// must find a usable device of compute capability 8.0 or newer (castor's
// floor). Without a GPU (or in a build without CUDA) it skips, saying why.
#include <gtest/gtest.h>

#include "backend/cuda_probe.h"

namespace castor {
namespace {

TEST(CudaProbe, FindsAUsableDevice) {
  const CudaProbe probe = ProbeCuda();
  if (!probe.compiled) GTEST_SKIP() << "castor was built without the CUDA backend";
  if (!probe.usable) GTEST_SKIP() << "no usable GPU: " << probe.reason;
  EXPECT_GE(probe.device_count, 1);
  EXPECT_FALSE(probe.device_name.empty());
  EXPECT_GE(probe.compute_capability_major * 10 + probe.compute_capability_minor, 80)
      << probe.device_name;
  EXPECT_GT(probe.runtime_version, 0);
  EXPECT_GT(probe.driver_version, 0);
}

}  // namespace
}  // namespace castor
