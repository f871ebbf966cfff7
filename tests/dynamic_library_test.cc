// Tests for opening libraries at run time (backend/dynamic_library.h) and
// for the CUDA backend's NCCL loading through it, which needs no GPU: a
// missing library and one without the expected functions are refused with
// what needed them and the loader's own words ("data-parallel training on
// cuda needs NCCL (libnccl.so.2): ..."), and this machine's NCCL, when it
// has one, loads and names its version. The NCCL cases skip, saying so, in
// builds without the CUDA backend (Bazel).
#include "backend/dynamic_library.h"

#include <string>

#include "absl/strings/match.h"
#include "backend/cuda_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

using ::testing::StartsWith;

constexpr char kNcclNeededFor[] = "data-parallel training on cuda needs NCCL";

TEST(DynamicLibraryTest, AMissingLibraryNamesWhatNeededItAndTheLoadersError) {
  absl::StatusOr<DynamicLibrary> library =
      DynamicLibrary::Open("libcastor_no_such_library.so.2", kNcclNeededFor);
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(library.status().message()),
              StartsWith("data-parallel training on cuda needs NCCL "
                         "(libcastor_no_such_library.so.2): libcastor_no_such_library.so.2: "
                         "cannot open shared object file"));
}

TEST(DynamicLibraryTest, ResolvesFunctionsAndNamesAMissingOne) {
  absl::StatusOr<DynamicLibrary> libm = DynamicLibrary::Open("libm.so.6", "a test needs libm");
  ASSERT_TRUE(libm.ok()) << libm.status();
  EXPECT_EQ(libm->file(), "libm.so.6");
  double (*cosine)(double) = nullptr;
  ASSERT_TRUE(libm->Resolve("cos", &cosine).ok());
  ASSERT_NE(cosine, nullptr);
  EXPECT_EQ(cosine(0.0), 1.0);
  int (*all_reduce)() = nullptr;
  const absl::Status missing = libm->Resolve("ncclAllReduce", &all_reduce);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.message()),
              StartsWith("a test needs libm (libm.so.6): the library has no ncclAllReduce"));
  EXPECT_EQ(all_reduce, nullptr);
}

// The CUDA backend's NCCL, opened as a data-parallel run on CUDA opens it
// (the module loads without a GPU).
#define SKIP_WITHOUT_THE_CUDA_BACKEND()                                                   \
  if (!CudaBackendCompiled()) {                                                           \
    GTEST_SKIP() << "castor was built without the CUDA backend (no NCCL loading to test)"; \
  }

TEST(CudaCollectivesLibraryTest, AMissingNcclIsRefusedWithTheLoadersError) {
  SKIP_WITHOUT_THE_CUDA_BACKEND();
  absl::StatusOr<std::string> loaded = LoadCudaCollectivesLibrary("libcastor_no_such_nccl.so.2");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()),
              StartsWith("data-parallel training on cuda needs NCCL (libcastor_no_such_nccl.so.2): "
                         "libcastor_no_such_nccl.so.2: cannot open shared object file"));
}

TEST(CudaCollectivesLibraryTest, ALibraryThatIsNotNcclIsRefusedNamingTheFunction) {
  SKIP_WITHOUT_THE_CUDA_BACKEND();
  absl::StatusOr<std::string> loaded = LoadCudaCollectivesLibrary("libm.so.6");
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()),
              StartsWith("data-parallel training on cuda needs NCCL (libm.so.6): the library has "
                         "no ncclGetVersion"));
}

TEST(CudaCollectivesLibraryTest, ThisMachinesNcclLoadsAndNamesItsVersion) {
  SKIP_WITHOUT_THE_CUDA_BACKEND();
  EXPECT_STREQ(kNcclLibraryFile, "libnccl.so.2");
  absl::StatusOr<std::string> loaded = LoadCudaCollectivesLibrary();
  if (!loaded.ok() &&
      absl::StrContains(loaded.status().message(), "cannot open shared object file")) {
    GTEST_SKIP() << "no NCCL on this machine: " << loaded.status().message();
  }
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(*loaded, StartsWith("NCCL 2."));
  // Loaded once: the same answer again.
  absl::StatusOr<std::string> again = LoadCudaCollectivesLibrary(kNcclLibraryFile);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *loaded);
}

}  // namespace
}  // namespace castor
