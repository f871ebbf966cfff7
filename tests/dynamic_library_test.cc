// Tests for opening libraries at run time (backend/dynamic_library.h): a
// missing library and a missing function are refused with what needed them
// and the loader's own words ("data-parallel training on cuda needs NCCL
// (libnccl.so.2): ..."), and the functions found are the library's.
#include "backend/dynamic_library.h"

#include <string>

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

}  // namespace
}  // namespace castor
