// The CPU backend's memory budget and thread-count check (issue #30: a
// model whose activations exceed the memory is refused with an error
// naming the node and value, not ended by the kernel's OOM killer once the
// pages are touched): allocations past the budget fail, freed bytes return
// to it, CASTOR_MEMORY_LIMIT sets the default, and the executor's error for
// an output too large names the node, the output, its dtype and shape.
#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/executor.h"
#include "gmock/gmock.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

TEST(CpuBackendMemory, AllocationsPastTheBudgetFailAndFreedBytesReturn) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1, .memory_limit_bytes = 1 << 20});
  EXPECT_EQ(backend.memory_limit_bytes(), 1 << 20);
  absl::StatusOr<void*> first = backend.Allocate(600 << 10);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(backend.bytes_in_use(), 600 << 10);
  absl::StatusOr<void*> second = backend.Allocate(500 << 10);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(),
              HasSubstr("cpu: 512000 bytes (0.5 MiB) more would pass the memory budget of "
                        "1.0 MiB (0.6 MiB in use"));
  backend.Free(*first);
  EXPECT_EQ(backend.bytes_in_use(), 0);
  second = backend.Allocate(500 << 10);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(backend.bytes_in_use(), 500 << 10);  // a multiple of 64: not rounded up
  backend.Free(*second);
  // One request larger than the whole budget, and one whose rounding would
  // overflow size_t arithmetic.
  EXPECT_FALSE(backend.Allocate(size_t{1} << 40).ok());
  EXPECT_FALSE(backend.Allocate(~size_t{0} - 10).ok());
  EXPECT_EQ(backend.bytes_in_use(), 0);
}

TEST(CpuBackendMemory, TheDefaultBudgetComesFromTheEnvironment) {
  ASSERT_EQ(setenv("CASTOR_MEMORY_LIMIT", "3M", 1), 0);
  EXPECT_EQ(DefaultCpuMemoryLimit().value_or(-1), 3 << 20);
  EXPECT_EQ(CpuBackend(CpuBackendOptions{.num_threads = 1}).memory_limit_bytes(), 3 << 20);
  ASSERT_EQ(setenv("CASTOR_MEMORY_LIMIT", "2g", 1), 0);
  EXPECT_EQ(DefaultCpuMemoryLimit().value_or(-1), int64_t{2} << 30);
  for (const char* bad : {"abc", "-5M", "0", "99999999999T", "1.5G"}) {
    ASSERT_EQ(setenv("CASTOR_MEMORY_LIMIT", bad, 1), 0);
    absl::StatusOr<int64_t> limit = DefaultCpuMemoryLimit();
    ASSERT_FALSE(limit.ok()) << bad;
    EXPECT_THAT(limit.status().message(), HasSubstr(std::string("CASTOR_MEMORY_LIMIT='") + bad));
  }
  ASSERT_EQ(unsetenv("CASTOR_MEMORY_LIMIT"), 0);
  absl::StatusOr<int64_t> available = DefaultCpuMemoryLimit();  // MemAvailable
  ASSERT_TRUE(available.ok());
  EXPECT_GT(*available, 0);
}

// x[1] -> Expand to [rows, 4096] float32: 16 KiB per row.
TEST(CpuBackendMemory, AnOutputPastTheBudgetNamesTheNodeAndValue) {
  Model model;
  model.opset_imports = {{"", 17}};
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{1});
  Value* shape = *g.AddInput("shape", DType::kInt64, Shape{2});
  Node* expand = *g.AddNode("Expand", {x, shape}, {"wide"}, "expand");
  g.AddOutput(expand->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  CpuBackend backend(CpuBackendOptions{.num_threads = 1, .memory_limit_bytes = 1 << 20});
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(model, backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  Tensor one(DType::kFloat32, {1});
  one.data<float>()[0] = 2.0f;
  Tensor dims(DType::kInt64, {2});
  dims.data<int64_t>()[1] = 4096;
  dims.data<int64_t>()[0] = 32;  // 512 KiB: fits
  absl::StatusOr<std::vector<Tensor>> fits = (*executor)->Run({{"x", one}, {"shape", dims}});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ((*fits)[0].data<float>()[32 * 4096 - 1], 2.0f);
  dims.data<int64_t>()[0] = 1 << 20;  // 16 GiB
  absl::StatusOr<std::vector<Tensor>> too_big = (*executor)->Run({{"x", one}, {"shape", dims}});
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(),
              HasSubstr("Expand node 'expand': output 'wide' float32 [1048576,4096]: cpu: "
                        "17179869184 bytes (16.0 GiB) more would pass the memory budget"));
  // A shape whose byte size does not fit int64 at all.
  dims.data<int64_t>()[0] = int64_t{1} << 61;
  absl::StatusOr<std::vector<Tensor>> overflow = (*executor)->Run({{"x", one}, {"shape", dims}});
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(overflow.status().message(), HasSubstr("is too large to address"));
}

TEST(CpuBackendThreads, TheThreadsFlagIsChecked) {
  EXPECT_TRUE(CheckCpuThreadsFlag(0).ok());
  EXPECT_TRUE(CheckCpuThreadsFlag(kMaxCpuThreads).ok());
  for (int64_t bad : {int64_t{-1}, kMaxCpuThreads + 1, int64_t{100000}}) {
    absl::Status s = CheckCpuThreadsFlag(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--threads " + std::to_string(bad) + ": expected 0"));
  }
}

}  // namespace
}  // namespace castor
