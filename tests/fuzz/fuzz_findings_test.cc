// Regression tests for what the fuzz targets found (tests/fuzz/README.md):
// one test per finding, asserting the clear error that replaced the crash.
// The inputs themselves are also in corpus/<target>/ and replayed by ctest.
#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <filesystem>
#include <fstream>
#include <map>
#include <iterator>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "training/dataset.h"

// The largest single operator new since the last reset: the findings were
// allocations sized by a file's claim, so each test asserts the refusal
// came before any such allocation. Not under AddressSanitizer, whose
// runtime owns operator new (there the messages are checked, and the fuzz
// replays' allocation limits catch a regression).
#if defined(__SANITIZE_ADDRESS__)
#define CASTOR_TRACKS_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CASTOR_TRACKS_ALLOCATIONS 0
#endif
#endif
#ifndef CASTOR_TRACKS_ALLOCATIONS
#define CASTOR_TRACKS_ALLOCATIONS 1
#endif

std::atomic<size_t> g_largest_allocation{0};

#if CASTOR_TRACKS_ALLOCATIONS
// A replaced operator new/delete pair on malloc/free is what the standard
// allows; GCC's -Wmismatched-new-delete flags every inlined delete anyway.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(size_t size) {
  size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace castor::training {
namespace {

constexpr size_t kSmall = size_t{64} << 20;  // far below any claim below

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string BigEndianIdx(uint32_t magic, const std::vector<uint32_t>& dims,
                         const std::string& payload) {
  std::string bytes;
  auto put = [&bytes](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return bytes + payload;
}

std::string WriteGzip(const std::string& name, const std::string& bytes) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  gzFile file = gzopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr);
  EXPECT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  EXPECT_EQ(gzclose(file), Z_OK);
  return path;
}

// fuzz_idx, corpus/idx/seed-labels_claim_2p32.idx.gz (issue #30): a 40-byte
// gzip label file claiming 2^32-1 labels made the reader allocate 32 GiB of
// int64 labels up front, and abort on std::bad_alloc.
TEST(FuzzFindings, GzipIdxClaimingMoreThanDeflateCanHoldIsRefusedBeforeAllocating) {
  const std::string path =
      WriteGzip("claims.idx1.gz", BigEndianIdx(0x801, {0xFFFFFFFFu}, std::string(16, '\0')));
  g_largest_allocation = 0;
  absl::StatusOr<Tensor> labels = ReadIdxLabels(path);
  if (CASTOR_TRACKS_ALLOCATIONS) {
    EXPECT_LT(g_largest_allocation.load(), kSmall);
  }
  ASSERT_FALSE(labels.ok());
  EXPECT_EQ(labels.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(labels.status().message(),
              AllOf(HasSubstr(path), HasSubstr("[4294967295]"),
                    HasSubstr("gzip-compressed bytes can hold")));

  // The same for images: [N, H, W] whose product deflate cannot reach.
  const std::string images_path = WriteGzip(
      "claims.idx3.gz", BigEndianIdx(0x803, {60000, 280, 280}, std::string(64, '\0')));
  absl::StatusOr<Tensor> images = ReadIdxImages(images_path);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(images.status().message(), HasSubstr("gzip-compressed bytes can hold"));
}

// The bound refuses nothing real: a highly compressible gzip label file
// (100000 zero labels, about 1000:1) still reads, every label 0.
TEST(FuzzFindings, GzipIdxAtHighCompressionStillReads) {
  const std::string path =
      WriteGzip("zeros.idx1.gz", BigEndianIdx(0x801, {100000}, std::string(100000, '\0')));
  ASSERT_LT(std::filesystem::file_size(path), 1000u);
  absl::StatusOr<Tensor> labels = ReadIdxLabels(path);
  ASSERT_TRUE(labels.ok()) << labels.status();
  ASSERT_EQ(labels->dims(), (std::vector<int64_t>{100000}));
  for (int64_t i = 0; i < 100000; ++i) ASSERT_EQ(labels->data<int64_t>()[i], 0);
}

std::string ReadCorpusFile(const std::string& relative) {
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) + "/tests/fuzz/corpus/" + relative,
                   std::ios::binary);
  EXPECT_TRUE(in) << relative;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// fuzz_npz (replay mutant 1097 of seed 1), corpus/npz/
// regression-stored_member_declares_4GB.npz: a 1 KiB .npz whose central
// directory gives a stored member 4009754816 bytes (192 stored) made
// ReadNpz allocate and zero 3.7 GiB before comparing the two sizes.
TEST(FuzzFindings, NpzStoredMemberDeclaringGigabytesIsRefusedBeforeAllocating) {
  const std::string path =
      WriteFile("stored.npz", ReadCorpusFile("npz/regression-stored_member_declares_4GB.npz"));
  g_largest_allocation = 0;
  absl::StatusOr<std::map<std::string, Tensor>> arrays = ReadNpz(path);
  if (CASTOR_TRACKS_ALLOCATIONS) {
    EXPECT_LT(g_largest_allocation.load(), kSmall);
  }
  ASSERT_FALSE(arrays.ok());
  EXPECT_EQ(arrays.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(arrays.status().message(),
              AllOf(HasSubstr(path + ":x_train.npy"),
                    HasSubstr("stored member sizes differ (192 vs 4009754816)")));
}

// The deflated twin (issue #30: members declaring far more than their
// compressed bytes): the first member of a deflated .npz with its recorded
// size edited to 0xFFFFFFF0 is refused by the 1032:1 bound of deflate.
TEST(FuzzFindings, NpzDeflatedMemberDeclaringMoreThanDeflateCanHoldIsRefused) {
  std::string bytes = ReadCorpusFile("npz/seed-keras_deflated.npz");
  const size_t central = bytes.find(std::string("PK\x01\x02", 4));
  ASSERT_NE(central, std::string::npos);
  for (int i = 0; i < 4; ++i) bytes[central + 24 + i] = static_cast<char>(i == 0 ? 0xF0 : 0xFF);
  const std::string path = WriteFile("deflated.npz", bytes);
  g_largest_allocation = 0;
  absl::StatusOr<std::map<std::string, Tensor>> arrays = ReadNpz(path);
  if (CASTOR_TRACKS_ALLOCATIONS) {
    EXPECT_LT(g_largest_allocation.load(), kSmall);
  }
  ASSERT_FALSE(arrays.ok());
  EXPECT_EQ(arrays.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(arrays.status().message(),
              AllOf(HasSubstr(path), HasSubstr("the member declares 4294967280 uncompressed bytes"),
                    HasSubstr("deflated bytes can hold")));
  // Unedited, the same file reads.
  absl::StatusOr<std::map<std::string, Tensor>> intact =
      ReadNpz(WriteFile("intact.npz", ReadCorpusFile("npz/seed-keras_deflated.npz")));
  ASSERT_TRUE(intact.ok()) << intact.status();
  EXPECT_EQ(intact->at("x_train").dims(), (std::vector<int64_t>{4, 4, 4}));
}

// fuzz_npz (libFuzzer, 2026-12-06), corpus/npz/
// regression-zip64_locator_in_a_48_byte_file.npz: a 48-byte file with a
// ZIP64 locator ahead of its end record. The reader checked the ZIP64 end
// record's offset against size - 56, which wrapped around for a file under
// 56 bytes, and read far outside the file (SEGV).
TEST(FuzzFindings, Zip64LocatorInAFileTooShortForItsRecordIsRefused) {
  const std::string bytes = ReadCorpusFile("npz/regression-zip64_locator_in_a_48_byte_file.npz");
  ASSERT_EQ(bytes.size(), 48u);
  const std::string path = WriteFile("short_zip64.npz", bytes);
  absl::StatusOr<std::map<std::string, Tensor>> arrays = ReadNpz(path);
  ASSERT_FALSE(arrays.ok());
  EXPECT_EQ(arrays.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(arrays.status().message(),
              AllOf(HasSubstr(path), HasSubstr("bad ZIP64 end-of-central-directory record")));
}

}  // namespace
}  // namespace castor::training
