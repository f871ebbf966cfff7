// .npy tests: round trip of every dtype (bfloat16 comes back as float32),
// header layout, malformed files (each error names the file and the
// problem), a file written by NumPy itself (skipped without /usr/bin/python3
// and numpy), and LoadTensorFile's choice by extension.
#include "training/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "graph/half.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path TempDir() {
  fs::path dir = fs::temp_directory_path() / ("castor_npy_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

Tensor Filled(DType dtype, std::vector<int64_t> dims) {
  Tensor t(dtype, std::move(dims));
  for (size_t i = 0; i < t.byte_size(); ++i) t.raw()[i] = static_cast<uint8_t>(i * 7 + 1);
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < t.byte_size(); ++i) t.raw()[i] = i % 3 == 0;
  }
  return t;
}

TEST(NpyTest, RoundTripsEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt64,
                      DType::kInt32, DType::kInt16, DType::kInt8, DType::kUInt8, DType::kUInt16,
                      DType::kUInt32, DType::kUInt64, DType::kBool}) {
    for (std::vector<int64_t> dims : {std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{5},
                                      std::vector<int64_t>{}, std::vector<int64_t>{0, 3}}) {
      Tensor t = Filled(dtype, dims);
      absl::StatusOr<std::string> bytes = training::SerializeNpy(t);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_EQ((bytes->size() - t.byte_size()) % 64, 0u) << "data must start 64-aligned";
      absl::StatusOr<Tensor> back = training::ParseNpy(*bytes, "mem.npy");
      ASSERT_TRUE(back.ok()) << DTypeName(dtype) << ": " << back.status();
      EXPECT_EQ(*back, t) << DTypeName(dtype);
    }
  }
}

TEST(NpyTest, HeaderIsWhatNumpyWrites) {
  absl::StatusOr<std::string> bytes = training::SerializeNpy(Filled(DType::kFloat32, {3}));
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_THAT(*bytes, HasSubstr("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"));
  bytes = training::SerializeNpy(Filled(DType::kBool, {2, 2}));
  EXPECT_THAT(*bytes, HasSubstr("'descr': '|b1'"));
  EXPECT_THAT(*bytes, HasSubstr("'shape': (2, 2)"));
}

TEST(NpyTest, BFloat16IsWrittenAsExactFloat32) {
  Tensor t(DType::kBFloat16, {3});
  const float values[] = {1.5f, -2.75f, 1e20f};
  for (int i = 0; i < 3; ++i) t.data<uint16_t>()[i] = FloatToBFloat16Bits(values[i]);
  absl::StatusOr<Tensor> back = training::ParseNpy(*training::SerializeNpy(t), "bf16.npy");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype(), DType::kFloat32);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(back->data<float>()[i], BFloat16BitsToFloat(t.data<uint16_t>()[i]));
  }
}

TEST(NpyTest, MalformedFilesNameFileAndProblem) {
  std::string good = *training::SerializeNpy(Filled(DType::kFloat32, {2, 2}));
  auto error = [](const std::string& bytes) {
    return std::string(training::ParseNpy(bytes, "bad.npy").status().message());
  };
  EXPECT_THAT(error("PK\x03\x04 not numpy"),
              HasSubstr("bad.npy: not a valid .npy file: bad magic"));
  EXPECT_THAT(error(good.substr(0, good.size() - 3)),
              HasSubstr("bad.npy: not a valid .npy file: truncated: shape (2,2) of float32 "
                        "needs 16 data bytes, the file has 13"));
  EXPECT_THAT(error(good.substr(0, 20)), HasSubstr("truncated header"));
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_THAT(error(fortran), HasSubstr("bad.npy: Fortran-order arrays are not supported"));
  std::string complex = good;
  complex.replace(complex.find("<f4"), 3, "<c8");
  EXPECT_THAT(error(complex), HasSubstr("bad.npy: unsupported dtype '<c8'"));
  std::string big = good;
  big.replace(big.find("<f4"), 3, ">f4");
  EXPECT_THAT(error(big), HasSubstr("big-endian dtype '>f4' is not supported"));
  std::string version = good;
  version[6] = 9;
  EXPECT_THAT(error(version), HasSubstr("unsupported .npy format version 9"));
  EXPECT_THAT(std::string(training::ReadNpy("/nonexistent/x.npy").status().message()),
              HasSubstr("/nonexistent/x.npy: cannot open file"));
}

// A shape declaring more than the file holds is refused before anything is
// allocated: a header-only file declaring (2^62, 1, 28, 28) float32 (its
// byte count wraps to 0 in 64 bits: it used to be accepted and crash the
// GEMM), one of 2^40 elements (would allocate 4 TiB), and a dimension of 20
// digits (std::stoll threw). A FIFO is not read.
TEST(NpyTest, DeclaredShapeIsCheckedBeforeAllocating) {
  const std::string good = *training::SerializeNpy(Filled(DType::kFloat32, {2, 2}));
  auto with_shape = [&](const std::string& shape) {
    std::string bytes = good.substr(0, good.size() - 16);  // the header alone
    const size_t at = bytes.find("(2, 2)");
    bytes.replace(at, 6, shape + std::string(6 - std::min<size_t>(6, shape.size()), ' '));
    // Keep the header length field right: pad or trim the dictionary.
    const size_t header_length = bytes.size() - 10;
    bytes[8] = static_cast<char>(header_length & 0xff);
    bytes[9] = static_cast<char>(header_length >> 8);
    return std::string(training::ParseNpy(bytes, "x.npy").status().message());
  };
  EXPECT_THAT(with_shape("(4611686018427387904, 1, 28, 28)"),
              HasSubstr("x.npy: not a valid .npy file: truncated: shape "
                        "(4611686018427387904,1,28,28) of float32 needs more than 2^64 data "
                        "bytes, the file has 0"));
  EXPECT_THAT(with_shape("(1099511627776,)"),
              HasSubstr("needs 4398046511104 data bytes, the file has 0"));
  EXPECT_THAT(with_shape("(99999999999999999999,)"),
              HasSubstr("dimension 99999999999999999999 in shape is too large"));
  const std::string fifo =
      (std::filesystem::temp_directory_path() / ("castor_npy_fifo_" + std::to_string(getpid())))
          .string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(std::string(training::ReadNpy(fifo).status().message()),
              HasSubstr(fifo + ": not a regular file"));
  std::filesystem::remove(fifo);
}

TEST(NpyTest, ReadsAFileWrittenByNumpy) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3 to run numpy";
  const fs::path dir = TempDir();
  const std::string script =
      "import numpy as np, sys; d = sys.argv[1]; "
      "np.save(d + '/f.npy', np.arange(12, dtype=np.float32).reshape(3, 4) / 4); "
      "np.save(d + '/i.npy', np.array([-1, 2**40], dtype=np.int64)); "
      "np.save(d + '/b.npy', np.array([[True, False]])); "
      "np.save(d + '/h.npy', np.array(0.5, dtype=np.float16))";
  const std::string command =
      "/usr/bin/python3 -c \"" + script + "\" " + dir.string() + " 2>/dev/null";
  if (std::system(command.c_str()) != 0)
    GTEST_SKIP() << "numpy is not importable by /usr/bin/python3";
  absl::StatusOr<Tensor> f = training::ReadNpy((dir / "f.npy").string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->dims(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(f->data<float>()[11], 2.75f);
  absl::StatusOr<Tensor> i = training::ReadNpy((dir / "i.npy").string());
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(i->data<int64_t>()[1], int64_t{1} << 40);
  absl::StatusOr<Tensor> b = training::ReadNpy((dir / "b.npy").string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype(), DType::kBool);
  EXPECT_EQ(b->dims(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b->raw()[0], 1);
  absl::StatusOr<Tensor> h = training::ReadNpy((dir / "h.npy").string());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->dims().empty());
  EXPECT_EQ(HalfBitsToFloat(h->data<uint16_t>()[0]), 0.5f);

  // And numpy reads what castor writes.
  ASSERT_TRUE(training::WriteNpy((dir / "c.npy").string(), Filled(DType::kInt32, {2, 3})).ok());
  const std::string check =
      "/usr/bin/python3 -c \"import numpy as np, sys; a = np.load(sys.argv[1]); "
      "sys.exit(0 if a.shape == (2, 3) and a.dtype == np.int32 else 1)\" " +
      (dir / "c.npy").string();
  EXPECT_EQ(std::system(check.c_str()), 0);
  fs::remove_all(dir);
}

TEST(NpyTest, LoadTensorFileChoosesByExtension) {
  const fs::path dir = TempDir();
  Tensor t = Filled(DType::kInt64, {4});
  ASSERT_TRUE(training::WriteNpy((dir / "t.npy").string(), t).ok());
  absl::StatusOr<Tensor> back = training::LoadTensorFile((dir / "t.npy").string());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, t);
  EXPECT_THAT(std::string(training::LoadTensorFile((dir / "t.txt").string()).status().message()),
              HasSubstr("t.txt: unknown tensor file type (expected .npy, or .pb"));
  absl::StatusOr<Tensor> pb = training::LoadTensorFile(std::string(CASTOR_SHARED_DIR) +
                                             "/conformance/onnx-node/test_relu/test_data_set_0/"
                                             "input_0.pb");
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_EQ(pb->dims(), (std::vector<int64_t>{3, 4, 5}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace castor::tools
