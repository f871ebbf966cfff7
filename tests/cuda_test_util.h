// Test helpers for the CUDA kernels: the test binary's CUDA backend (or the
// reason there is none, for GTEST_SKIP), and the one check every CUDA kernel
// test makes: run a node on the CPU backend (the reference) and on CUDA from
// the same host inputs and compare every output within the tolerance of the
// output's dtype.
//
//   TEST(CudaElementwise, AddBroadcasts) {
//     CASTOR_REQUIRE_CUDA();
//     for (DType dtype : CudaFloatTypes()) {
//       SingleNode node("Add", {RandomTensor(dtype, {2, 3}, 1), RandomTensor(dtype, {3}, 2)},
//                       {}, 17);
//       ExpectCudaMatchesCpu(node, "Add broadcast");
//     }
//   }
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"
#include "tests/kernel_test_util.h"

namespace castor::testing {

// The test binary's CUDA backend, created on first use and never destroyed;
// nullptr (with the reason in `why`) when castor was built without CUDA or
// no usable GPU is present.
inline Backend* CudaOrNull(std::string* why = nullptr) {
  static std::string* reason = new std::string;
  static Backend* backend = []() -> Backend* {
    absl::StatusOr<std::unique_ptr<Backend>> created = CreateCudaBackend();
    if (!created.ok()) {
      *reason = std::string(created.status().message());
      return nullptr;
    }
    return created->release();
  }();
  if (why != nullptr) *why = *reason;
  return backend;
}

// Skips the test (reported as skipped, with the reason) without a GPU.
#define CASTOR_REQUIRE_CUDA()                                                  \
  do {                                                                         \
    std::string castor_no_cuda_reason_;                                        \
    if (::castor::testing::CudaOrNull(&castor_no_cuda_reason_) == nullptr) {   \
      GTEST_SKIP() << "no CUDA backend: " << castor_no_cuda_reason_;           \
    }                                                                          \
  } while (0)

inline Backend& Gpu() { return *CudaOrNull(); }

inline const std::vector<DType>& CudaFloatTypes() {
  static const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  return dtypes;
}

// |cuda - cpu| <= atol + rtol * |cpu| per element.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

// Per output dtype: float32 allows reassociated sums (different reduction
// order, fused multiply-add); float16/bfloat16 allow one rounding of the
// output in each direction plus float32 accumulation differences. Integer
// and bool outputs must be equal.
inline Tolerance DefaultTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {1e-4, 1e-5};
    case DType::kFloat16: return {2e-3, 2e-3};   // 2 ulp of float16 near 1
    case DType::kBFloat16: return {1.6e-2, 1.6e-2};  // 2 ulp of bfloat16 near 1
    default: return {0, 0};
  }
}

// `n` elements of `dtype` uniform in [lo, hi) (deterministic for a seed),
// rounded once to the dtype.
inline Tensor RandomTensor(DType dtype, const std::vector<int64_t>& dims, unsigned seed,
                           double lo = -1.0, double hi = 1.0) {
  std::vector<double> values = Random(Count(dims), seed);
  for (double& v : values) v = lo + (v + 1.0) / 2.0 * (hi - lo);
  return Make(dtype, dims, values);
}

// Runs `node` on the CPU backend and on the CUDA backend and expects both to
// succeed with the same outputs (dtype, dims, values within `tolerance`, or
// the default of each output's dtype). `what` names the case in failures.
inline void ExpectCudaMatchesCpu(SingleNode& node, const std::string& what,
                                 std::optional<Tolerance> tolerance = std::nullopt) {
  ASSERT_TRUE(node.status().ok()) << what << ": " << node.status();
  absl::StatusOr<std::vector<Tensor>> cpu = node.Run(Cpu());
  ASSERT_TRUE(cpu.ok()) << what << " on the CPU backend: " << cpu.status();
  absl::StatusOr<std::vector<Tensor>> gpu = node.Run(Gpu());
  ASSERT_TRUE(gpu.ok()) << what << " on CUDA: " << gpu.status();
  ASSERT_EQ(gpu->size(), cpu->size()) << what;
  for (size_t i = 0; i < cpu->size(); ++i) {
    const Tensor& expected = (*cpu)[i];
    const Tolerance t = tolerance.value_or(DefaultTolerance(expected.dtype()));
    absl::Status same = CompareTensors((*gpu)[i], expected, t.rtol, t.atol);
    EXPECT_TRUE(same.ok()) << what << ", output " << i << " (" << DTypeName(expected.dtype())
                           << "): " << same.message();
  }
}

// Same, expecting both backends to refuse the node, each with an error
// whose message contains `needle`.
inline void ExpectBothRefuse(SingleNode& node, const std::string& needle,
                             const std::string& what) {
  ASSERT_TRUE(node.status().ok()) << what << ": " << node.status();
  for (Backend* backend : {static_cast<Backend*>(&Cpu()), &Gpu()}) {
    absl::StatusOr<std::vector<Tensor>> result = node.Run(*backend);
    ASSERT_FALSE(result.ok()) << what << " on " << backend->name() << " succeeded";
    EXPECT_NE(std::string(result.status().message()).find(needle), std::string::npos)
        << what << " on " << backend->name() << ": " << result.status();
  }
}

}  // namespace castor::testing
