// Dataset reader and batch iterator tests. The IDX, .npy and .npz files are
// written here in C++ (gzip and raw deflate through zlib, zip archives by
// hand, including NumPy's ZIP64 layout), so nothing external is needed.
// Checks values, [0, 1] scaling, shapes, the --data forms, the errors
// (truncated, bad magic, count mismatch, corrupt zip), the real
// Fashion-MNIST when /usr/share/datasets/fashion-mnist exists, an .npz
// written by NumPy itself when /usr/bin/python3 has numpy, and the batch
// iterator's shuffling, coverage and exact resume.
#include "training/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <tuple>

#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "tools/train_command.h"
#include "training/npy.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ----- file builders ------------------------------------------------------------

// A fresh directory for this process's files, removed at exit.
fs::path TempDir() {
  struct Scratch {
    fs::path path =
        fs::temp_directory_path() / ("castor_dataset_test_" + std::to_string(getpid()));
    Scratch() {
      fs::remove_all(path);
      fs::create_directories(path);
    }
    ~Scratch() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  return scratch.path;
}

std::string WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path.string();
}

void AppendBigEndian32(std::string& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}
// `bytes` little-endian bytes of `value` (zeros past its eighth byte).
void AppendLittle(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(i < 8 ? value >> (8 * i) : 0));
}

std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                     const std::vector<uint8_t>& data) {
  std::string out;
  AppendBigEndian32(out, magic);
  for (uint32_t d : dims) AppendBigEndian32(out, d);
  out.append(data.begin(), data.end());
  return out;
}

// zlib deflate: window_bits 16 + 15 writes gzip, -15 raw deflate (zip).
std::string Deflate(const std::string& bytes, int window_bits) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY),
            Z_OK);
  std::string out(deflateBound(&stream, bytes.size()) + 32, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}
std::string Gzip(const std::string& bytes) { return Deflate(bytes, 16 + MAX_WBITS); }

struct ZipEntry {
  std::string name;
  std::string data;
  bool deflate = false;
};

// A zip archive. numpy_zip64 writes what np.savez does (force_zip64: local
// headers carry 0xffffffff sizes and a ZIP64 extra field); full_zip64 also
// saturates the central directory and end record and adds the ZIP64 end
// record and locator, as an archive over 4 GiB has.
std::string ZipBytes(const std::vector<ZipEntry>& entries, bool numpy_zip64 = false,
                     bool full_zip64 = false) {
  std::string out;
  std::string directory;
  for (const ZipEntry& entry : entries) {
    const std::string stored = entry.deflate ? Deflate(entry.data, -MAX_WBITS) : entry.data;
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(entry.data.data()),
              static_cast<uInt>(entry.data.size())));
    const uint16_t method = entry.deflate ? 8 : 0;
    const uint64_t offset = out.size();
    // local header
    AppendLittle(out, 0x04034b50, 4);
    AppendLittle(out, 45, 2);
    AppendLittle(out, 0, 2);  // flags
    AppendLittle(out, method, 2);
    AppendLittle(out, 0, 4);  // time, date
    AppendLittle(out, crc, 4);
    const bool local64 = numpy_zip64 || full_zip64;
    AppendLittle(out, local64 ? 0xffffffffu : stored.size(), 4);
    AppendLittle(out, local64 ? 0xffffffffu : entry.data.size(), 4);
    AppendLittle(out, entry.name.size(), 2);
    AppendLittle(out, local64 ? 20 : 0, 2);
    out += entry.name;
    if (local64) {
      AppendLittle(out, 0x0001, 2);
      AppendLittle(out, 16, 2);
      AppendLittle(out, entry.data.size(), 8);
      AppendLittle(out, stored.size(), 8);
    }
    out += stored;
    // central directory entry
    AppendLittle(directory, 0x02014b50, 4);
    AppendLittle(directory, 45, 2);
    AppendLittle(directory, 45, 2);
    AppendLittle(directory, 0, 2);
    AppendLittle(directory, method, 2);
    AppendLittle(directory, 0, 4);
    AppendLittle(directory, crc, 4);
    AppendLittle(directory, full_zip64 ? 0xffffffffu : stored.size(), 4);
    AppendLittle(directory, full_zip64 ? 0xffffffffu : entry.data.size(), 4);
    AppendLittle(directory, entry.name.size(), 2);
    AppendLittle(directory, full_zip64 ? 28 : 0, 2);
    AppendLittle(directory, 0, 2 + 2 + 2 + 4);  // comment length, disk, attributes
    AppendLittle(directory, full_zip64 ? 0xffffffffu : offset, 4);
    directory += entry.name;
    if (full_zip64) {
      AppendLittle(directory, 0x0001, 2);
      AppendLittle(directory, 24, 2);
      AppendLittle(directory, entry.data.size(), 8);
      AppendLittle(directory, stored.size(), 8);
      AppendLittle(directory, offset, 8);
    }
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  if (full_zip64) {
    const uint64_t end64 = out.size();
    AppendLittle(out, 0x06064b50, 4);
    AppendLittle(out, 44, 8);
    AppendLittle(out, 45, 2);
    AppendLittle(out, 45, 2);
    AppendLittle(out, 0, 4 + 4);
    AppendLittle(out, entries.size(), 8);
    AppendLittle(out, entries.size(), 8);
    AppendLittle(out, directory.size(), 8);
    AppendLittle(out, directory_offset, 8);
    AppendLittle(out, 0x07064b50, 4);
    AppendLittle(out, 0, 4);
    AppendLittle(out, end64, 8);
    AppendLittle(out, 1, 4);
  }
  AppendLittle(out, 0x06054b50, 4);
  AppendLittle(out, 0, 2 + 2);
  AppendLittle(out, full_zip64 ? 0xffff : entries.size(), 2);
  AppendLittle(out, full_zip64 ? 0xffff : entries.size(), 2);
  AppendLittle(out, full_zip64 ? 0xffffffffu : directory.size(), 4);
  AppendLittle(out, full_zip64 ? 0xffffffffu : directory_offset, 4);
  AppendLittle(out, 0, 2);
  return out;
}

template <typename T>
std::string Npy(DType dtype, std::vector<int64_t> dims, const std::vector<T>& values) {
  return *training::SerializeNpy(Tensor::FromVector(dtype, std::move(dims), values));
}

std::vector<uint8_t> Ramp(size_t count, int step = 37) {
  std::vector<uint8_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<uint8_t>(i * step);
  return values;
}

std::vector<float> Floats(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.num_elements());
}
// Every image of `dataset` as a batch sees it: float32, pixels scaled.
std::vector<float> BatchFloats(const training::Dataset& dataset) {
  std::vector<int64_t> rows(static_cast<size_t>(dataset.size()));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  const training::Batch batch = training::GatherBatch(dataset, rows);
  EXPECT_EQ(batch.images.dtype(), DType::kFloat32);
  return Floats(batch.images);
}
std::vector<int64_t> Int64s(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.num_elements());
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// ----- IDX ------------------------------------------------------------------------

TEST(IdxTest, ReadsPlainAndGzipImagesAsPixels) {
  const std::vector<uint8_t> pixels = Ramp(3 * 2 * 4);
  const std::string bytes = IdxBytes(0x803, {3, 2, 4}, pixels);
  for (const auto& [name, contents] : {std::pair{"plain-images", bytes},
                                       std::pair{"gz-images.gz", Gzip(bytes)},
                                       std::pair{"gz-without-suffix", Gzip(bytes)}}) {
    const std::string path = WriteFile(TempDir() / "idx" / name, contents);
    absl::StatusOr<Tensor> images = training::ReadIdxImages(path);
    ASSERT_TRUE(images.ok()) << images.status();
    EXPECT_EQ(images->dtype(), DType::kUInt8);  // a quarter of float32's memory
    EXPECT_THAT(images->dims(), ElementsAre(3, 1, 2, 4));
    for (size_t i = 0; i < pixels.size(); ++i) {
      EXPECT_EQ(images->data<uint8_t>()[i], pixels[i]) << name << " element " << i;
    }
  }
}

TEST(IdxTest, BatchesScalePixelsToTheUnitRange) {
  const std::vector<uint8_t> pixels = Ramp(2 * 1 * 256);
  const std::string path =
      WriteFile(TempDir() / "idx" / "extremes", IdxBytes(0x803, {2, 1, 256}, pixels));
  absl::StatusOr<Tensor> images = training::ReadIdxImages(path);
  ASSERT_TRUE(images.ok()) << images.status();
  absl::StatusOr<training::Dataset> dataset =
      training::MakeDataset("extremes", *std::move(images), Tensor(DType::kInt64, {2}));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const std::vector<float> scaled = BatchFloats(*dataset);
  ASSERT_EQ(scaled.size(), pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    EXPECT_EQ(scaled[i], static_cast<float>(pixels[i]) / 255.0f) << i;
  }
  EXPECT_EQ(*std::min_element(scaled.begin(), scaled.end()), 0.0f);
  EXPECT_EQ(*std::max_element(scaled.begin(), scaled.end()), 1.0f);
  // Images of another dtype are refused: batches read uint8 or float32.
  EXPECT_THAT(Message(training::MakeDataset("halves", Tensor(DType::kFloat16, {2, 1}),
                                  Tensor(DType::kInt64, {2}))
                          .status()),
              HasSubstr("halves: images must be uint8 pixels or float32"));
  // Rows in another order: each batch row is the dataset row it names.
  const training::Batch swapped = training::GatherBatch(*dataset, {1, 0});
  for (size_t i = 0; i < 256; ++i) {
    EXPECT_EQ(swapped.images.data<float>()[i], scaled[256 + i]) << i;
    EXPECT_EQ(swapped.images.data<float>()[256 + i], scaled[i]) << i;
  }
}

TEST(IdxTest, ReadsLabelsAsInt64) {
  const std::string bytes = IdxBytes(0x801, {5}, {9, 0, 3, 255, 7});
  for (const std::string& contents : {bytes, Gzip(bytes)}) {
    const std::string path = WriteFile(TempDir() / "idx" / "labels", contents);
    absl::StatusOr<Tensor> labels = training::ReadIdxLabels(path);
    ASSERT_TRUE(labels.ok()) << labels.status();
    EXPECT_EQ(labels->dtype(), DType::kInt64);
    EXPECT_THAT(Int64s(*labels), ElementsAre(9, 0, 3, 255, 7));
  }
}

TEST(IdxTest, BadMagicNamesFileExpectedAndFound) {
  const std::string labels = WriteFile(TempDir() / "idx" / "magic-labels",
                                       IdxBytes(0x801, {2}, {1, 2}));
  EXPECT_THAT(Message(training::ReadIdxImages(labels).status()),
              AllOf(HasSubstr(labels), HasSubstr("bad IDX magic 0x00000801 (a labels file)"),
                    HasSubstr("expected 0x00000803")));
  const std::string text = WriteFile(TempDir() / "idx" / "text", "hello world, not IDX");
  EXPECT_THAT(Message(training::ReadIdxLabels(text).status()),
              AllOf(HasSubstr(text), HasSubstr("not an IDX file"), HasSubstr("0x00000801")));
  const std::string floats = WriteFile(TempDir() / "idx" / "float-idx",
                                       IdxBytes(0xD03, {1, 1, 1}, {0, 0, 0, 0}));
  EXPECT_THAT(Message(training::ReadIdxImages(floats).status()), HasSubstr("element type is not uint8"));
}

TEST(IdxTest, TruncatedPlainFileSaysWhatWasExpected) {
  std::string bytes = IdxBytes(0x803, {4, 3, 3}, Ramp(36));
  bytes.resize(bytes.size() - 5);
  const std::string path = WriteFile(TempDir() / "idx" / "truncated", bytes);
  absl::Status status = training::ReadIdxImages(path).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(Message(status), AllOf(HasSubstr(path), HasSubstr("truncated"),
                                     HasSubstr("[4, 3, 3]"), HasSubstr("need 52 bytes"),
                                     HasSubstr("has 47")));
  // Over-long data is also a dims mismatch.
  const std::string longer = WriteFile(TempDir() / "idx" / "longer",
                                       IdxBytes(0x801, {2}, {1, 2, 3}));
  EXPECT_THAT(Message(training::ReadIdxLabels(longer).status()), AllOf(HasSubstr(longer),
                                                             HasSubstr("over-long")));
  const std::string header_only = WriteFile(TempDir() / "idx" / "header", std::string("\0\0\x08", 3));
  EXPECT_THAT(Message(training::ReadIdxLabels(header_only).status()),
              AllOf(HasSubstr("truncated IDX header"), HasSubstr("expected 8 bytes")));
}

TEST(IdxTest, TruncatedGzipSaysWhatWasExpected) {
  const std::string bytes = IdxBytes(0x803, {50, 10, 10}, Ramp(5000, 13));
  std::string gz = Gzip(bytes);
  gz.resize(gz.size() / 2);
  const std::string path = WriteFile(TempDir() / "idx" / "truncated.gz", gz);
  absl::Status status = training::ReadIdxImages(path).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(Message(status), AllOf(HasSubstr(path), HasSubstr("truncated IDX data"),
                                     HasSubstr("need 5000 data bytes"),
                                     HasSubstr("unexpected end of file")));
  // Whole data but a cut-off gzip trailer (CRC and size) is caught too.
  std::string no_trailer = Gzip(bytes);
  no_trailer.resize(no_trailer.size() - 8);
  const std::string trailer_path = WriteFile(TempDir() / "idx" / "no-trailer.gz", no_trailer);
  EXPECT_THAT(Message(training::ReadIdxImages(trailer_path).status()),
              AllOf(HasSubstr(trailer_path), HasSubstr("gzip stream")));
}

TEST(IdxTest, MissingFileIsNotFound) {
  absl::Status status = training::ReadIdxImages((TempDir() / "idx" / "absent").string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(status), HasSubstr("absent"));
}

// ----- .npz ----------------------------------------------------------------------------

TEST(NpzTest, ReadsStoredDeflatedAndZip64Members) {
  const std::string x = Npy<uint8_t>(DType::kUInt8, {2, 2, 3}, Ramp(12));
  const std::string y = Npy<int64_t>(DType::kInt64, {2}, {4, 1});
  for (bool deflate : {false, true}) {
    for (int zip64 : {0, 1, 2}) {
      const std::string path = WriteFile(
          TempDir() / "npz" / ("a" + std::to_string(deflate) + std::to_string(zip64) + ".npz"),
          ZipBytes({{"x.npy", x, deflate}, {"y.npy", y, deflate}}, zip64 == 1, zip64 == 2));
      auto arrays = training::ReadNpz(path);
      ASSERT_TRUE(arrays.ok()) << "deflate " << deflate << " zip64 " << zip64 << ": "
                               << arrays.status();
      ASSERT_EQ(arrays->size(), 2u);
      EXPECT_EQ(arrays->at("x"), Tensor::FromVector(DType::kUInt8, {2, 2, 3}, Ramp(12)));
      EXPECT_EQ(arrays->at("y"), Tensor::Int64s({4, 1}));
    }
  }
}

TEST(NpzTest, CorruptArchivesNameFileAndMember) {
  const std::string x = Npy<float>(DType::kFloat32, {4}, {1, 2, 3, 4});
  std::string zip = ZipBytes({{"x.npy", x, false}});
  zip[30 + 5 + x.size() - 1] ^= 0x40;  // flip a bit of the stored data
  const std::string crc_path = WriteFile(TempDir() / "npz" / "crc.npz", zip);
  EXPECT_THAT(Message(training::ReadNpz(crc_path).status()),
              AllOf(HasSubstr(crc_path + ":x.npy"), HasSubstr("CRC-32 mismatch")));

  std::string truncated = ZipBytes({{"x.npy", x, true}});
  truncated.resize(truncated.size() / 2);
  const std::string truncated_path = WriteFile(TempDir() / "npz" / "truncated.npz", truncated);
  EXPECT_THAT(Message(training::ReadNpz(truncated_path).status()),
              AllOf(HasSubstr(truncated_path), HasSubstr("end-of-central-directory")));

  std::string deflated = ZipBytes({{"x.npy", x, true}});
  deflated[30 + 5 + 2] ^= 0xff;  // damage the deflate stream
  const std::string deflate_path = WriteFile(TempDir() / "npz" / "deflate.npz", deflated);
  EXPECT_THAT(Message(training::ReadNpz(deflate_path).status()), HasSubstr(deflate_path + ":x.npy"));

  std::string method = ZipBytes({{"x.npy", x, false}});
  method[8] = 12;  // bzip2 in the local header ...
  method[method.size() - 22 - (46 + 5) + 10] = 12;  // ... and the central directory
  const std::string method_path = WriteFile(TempDir() / "npz" / "method.npz", method);
  EXPECT_THAT(Message(training::ReadNpz(method_path).status()),
              AllOf(HasSubstr("compression method 12"), HasSubstr("8 deflate")));

  const std::string not_npy = WriteFile(TempDir() / "npz" / "notnpy.npz",
                                        ZipBytes({{"x.npy", "plain text", false}}));
  EXPECT_THAT(Message(training::ReadNpz(not_npy).status()),
              AllOf(HasSubstr(not_npy + ":x.npy"), HasSubstr("bad magic")));
}

// Directory entries that share one member's bytes (the overlapping-member
// zip bomb: N entries inflate one stream N times) are refused before any
// member is inflated, whatever each entry's own size says.
TEST(NpzTest, OverlappingMembersAreRefused) {
  const std::string x = Npy<float>(DType::kFloat32, {4}, {1, 2, 3, 4});
  std::string zip = ZipBytes({{"a.npy", x, true}, {"b.npy", x, true}});
  const std::string plain_path = WriteFile(TempDir() / "npz" / "two.npz", zip);
  ASSERT_TRUE(training::ReadNpz(plain_path).ok());  // the archive as written reads

  // Point b.npy's central directory entry at a.npy's local header.
  const size_t directory_size = 2 * (46 + 5);
  const size_t second_entry = zip.size() - 22 - directory_size + 46 + 5;
  ASSERT_EQ(zip.substr(second_entry, 4), std::string("PK\x01\x02", 4));
  zip.replace(second_entry + 42, 4, std::string(4, '\0'));
  const std::string overlap_path = WriteFile(TempDir() / "npz" / "overlap.npz", zip);
  EXPECT_THAT(Message(training::ReadNpz(overlap_path).status()),
              AllOf(HasSubstr(overlap_path), HasSubstr("members 'a.npy' and 'b.npy' overlap"),
                    HasSubstr("local headers at 0 and 0")));
}

// ----- conversions and --data forms ------------------------------------------

TEST(ConvertTest, ImageAndLabelDTypes) {
  absl::StatusOr<Tensor> from_double =
      training::ImagesFromArray(Tensor::FromVector<double>(DType::kFloat64, {2, 2}, {0.5, -1, 2, 3}), "d");
  ASSERT_TRUE(from_double.ok());
  EXPECT_THAT(Floats(*from_double), ElementsAre(0.5f, -1.0f, 2.0f, 3.0f));
  EXPECT_THAT(from_double->dims(), ElementsAre(2, 2));  // [N, F] stays as it is
  absl::StatusOr<Tensor> from_float =
      training::ImagesFromArray(Tensor::FromVector<float>(DType::kFloat32, {1, 1, 2}, {7.5f, 300}), "f");
  ASSERT_TRUE(from_float.ok());
  EXPECT_THAT(Floats(*from_float), ElementsAre(7.5f, 300.0f));  // floats are not rescaled
  EXPECT_THAT(from_float->dims(), ElementsAre(1, 1, 1, 2));
  absl::StatusOr<Tensor> nhwc = training::ImagesFromArray(Tensor(DType::kUInt8, {2, 4, 4, 3}), "c");
  ASSERT_TRUE(nhwc.ok());
  EXPECT_THAT(nhwc->dims(), ElementsAre(2, 4, 4, 3));
  // Integer arrays other than uint8 (token ids) stay as they are, no channel
  // axis added; FitDatasetToInput matches them to the model input.
  absl::StatusOr<Tensor> ids = training::ImagesFromArray(
      Tensor::FromVector<int32_t>(DType::kInt32, {2, 1, 2}, {5, -1, 7, 9}), "ids.npy");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->dtype(), DType::kInt32);
  EXPECT_THAT(ids->dims(), ElementsAre(2, 1, 2));
  EXPECT_THAT(Message(training::ImagesFromArray(Tensor(DType::kBool, {2, 2}), "bools.npy").status()),
              AllOf(HasSubstr("bools.npy"), HasSubstr("uint8"), HasSubstr("bool")));

  absl::StatusOr<Tensor> labels =
      training::LabelsFromArray(Tensor::FromVector<int32_t>(DType::kInt32, {3, 1}, {2, -1, 7}), "l");
  ASSERT_TRUE(labels.ok());
  EXPECT_THAT(labels->dims(), ElementsAre(3));
  EXPECT_THAT(Int64s(*labels), ElementsAre(2, -1, 7));
  // Float arrays are targets (mse, bce): float32 of their own shape, [N, 1] kept.
  absl::StatusOr<Tensor> targets = training::LabelsFromArray(
      Tensor::FromVector<double>(DType::kFloat64, {3, 1}, {0.25, 1, 0}), "fl.npy");
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_EQ(*targets, Tensor::FromVector<float>(DType::kFloat32, {3, 1}, {0.25f, 1, 0}));
  EXPECT_THAT(Message(training::LabelsFromArray(Tensor(DType::kBool, {3}), "b.npy").status()),
              AllOf(HasSubstr("b.npy"), HasSubstr("integer class indices or float targets"),
                    HasSubstr("bool")));
  // Per-position labels [N, T] (next-token labels) stay [N, T], as int64.
  absl::StatusOr<Tensor> per_token = training::LabelsFromArray(
      Tensor::FromVector<uint8_t>(DType::kUInt8, {3, 2}, {1, 2, 3, 4, 5, 6}), "2d.npy");
  ASSERT_TRUE(per_token.ok()) << per_token.status();
  EXPECT_EQ(per_token->dtype(), DType::kInt64);
  EXPECT_THAT(per_token->dims(), ElementsAre(3, 2));
  EXPECT_THAT(Int64s(*per_token), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(Message(training::LabelsFromArray(Tensor(DType::kInt64, {}), "0d.npy").status()),
              AllOf(HasSubstr("0d.npy"), HasSubstr("scalar")));
}

// Token ids: an int64 x_train stays int64 and feeds an int64 input as it
// is; int32 ids widen to an int64 input; [N, T] labels are gathered row by
// row with the ids; a dtype the input cannot take is an error naming the
// array, the input and both dtypes.
TEST(ConvertTest, TokenIdsStayIntegerAndFitTheModelInput) {
  const fs::path dir = TempDir() / "tokens";
  const std::string npz = WriteFile(
      dir / "tokens.npz",
      ZipBytes({{"x_train.npy", Npy<int64_t>(DType::kInt64, {3, 2}, {10, 11, 20, 21, 30, 31}), true},
                {"y_train.npy", Npy<int64_t>(DType::kInt64, {3, 2}, {11, 12, 21, 22, 31, 32}), true},
                {"x_test.npy", Npy<int32_t>(DType::kInt32, {1, 2}, {40, 41}), false},
                {"y_test.npy", Npy<int64_t>(DType::kInt64, {1, 2}, {41, 42}), false}}));
  absl::StatusOr<training::DataSplits> splits = training::LoadData(npz);
  ASSERT_TRUE(splits.ok()) << splits.status();
  training::Dataset& train = splits->train;
  EXPECT_EQ(train.images.dtype(), DType::kInt64);
  EXPECT_THAT(train.images.dims(), ElementsAre(3, 2));
  EXPECT_THAT(train.labels.dims(), ElementsAre(3, 2));
  EXPECT_EQ(train.images_source, npz + ":x_train");
  EXPECT_EQ(train.labels_source, npz + ":y_train");
  ASSERT_TRUE(training::FitDatasetToInput(train, "input_ids", DType::kInt64).ok());
  EXPECT_EQ(train.images.dtype(), DType::kInt64);
  const training::Batch batch = training::GatherBatch(train, {2, 0});
  EXPECT_EQ(batch.images.dtype(), DType::kInt64);
  EXPECT_THAT(batch.images.dims(), ElementsAre(2, 2));
  EXPECT_THAT(Int64s(batch.images), ElementsAre(30, 31, 10, 11));
  EXPECT_EQ(batch.labels.dtype(), DType::kInt64);
  EXPECT_THAT(batch.labels.dims(), ElementsAre(2, 2));
  EXPECT_THAT(Int64s(batch.labels), ElementsAre(31, 32, 11, 12));

  // int32 ids widen to an int64 input, values kept.
  training::Dataset& test = splits->test;
  EXPECT_EQ(test.images.dtype(), DType::kInt32);
  ASSERT_TRUE(training::FitDatasetToInput(test, "input_ids", DType::kInt64).ok());
  EXPECT_EQ(test.images.dtype(), DType::kInt64);
  EXPECT_THAT(Int64s(training::GatherBatch(test, {0}).images), ElementsAre(40, 41));

  // Dtypes that do not fit: named with the array, the input, both dtypes.
  EXPECT_THAT(Message(training::FitDatasetToInput(train, "input", DType::kFloat32)),
              AllOf(HasSubstr(npz + ":x_train: int64 data cannot feed the model input "
                              "'input' (float32)"),
                    HasSubstr("uint8")));
  EXPECT_THAT(Message(training::FitDatasetToInput(train, "input_ids", DType::kInt32)),
              HasSubstr(npz + ":x_train: int64 data cannot feed the model input "
                              "'input_ids' (int32): not every int64 value is a int32"));
  absl::StatusOr<Tensor> floats = training::ImagesFromArray(
      Tensor::FromVector<double>(DType::kFloat64, {1, 2}, {1, 2}), "f.npy");
  ASSERT_TRUE(floats.ok());
  absl::StatusOr<training::Dataset> float_data =
      training::MakeDataset("f", *std::move(floats), Tensor(DType::kInt64, {1}));
  ASSERT_TRUE(float_data.ok()) << float_data.status();
  EXPECT_THAT(Message(training::FitDatasetToInput(*float_data, "input_ids", DType::kInt64)),
              AllOf(HasSubstr("f: float32 data cannot feed the model input 'input_ids' "
                              "(int64)"),
                    HasSubstr("integer ids")));
  // Images for a float input are as they always were.
  EXPECT_TRUE(training::FitDatasetToInput(*float_data, "input", DType::kFloat32).ok());
  EXPECT_EQ(float_data->images.dtype(), DType::kFloat32);
}

// Writes the four IDX files of a tiny MNIST-like directory.
fs::path MakeIdxDir(const std::string& name, bool gzip, uint32_t train_labels = 6) {
  const fs::path dir = TempDir() / name;
  auto write = [&](const std::string& file, const std::string& bytes) {
    WriteFile(dir / (gzip ? file + ".gz" : file), gzip ? Gzip(bytes) : bytes);
  };
  write("train-images-idx3-ubyte", IdxBytes(0x803, {6, 2, 2}, Ramp(24)));
  std::vector<uint8_t> labels = {0, 1, 2, 3, 4, 5};
  labels.resize(train_labels);
  write("train-labels-idx1-ubyte", IdxBytes(0x801, {train_labels}, labels));
  write("t10k-images-idx3-ubyte", IdxBytes(0x803, {2, 2, 2}, Ramp(8, 11)));
  write("t10k-labels-idx1-ubyte", IdxBytes(0x801, {2}, {9, 8}));
  return dir;
}

TEST(LoadDataTest, IdxDirectoryGzipAndPlain) {
  for (bool gzip : {true, false}) {
    const fs::path dir = MakeIdxDir(gzip ? "idxdir-gz" : "idxdir-plain", gzip);
    absl::StatusOr<training::DataSplits> splits = training::LoadData(dir.string());
    ASSERT_TRUE(splits.ok()) << splits.status();
    EXPECT_THAT(splits->train.images.dims(), ElementsAre(6, 1, 2, 2));
    EXPECT_THAT(splits->train.sample_dims(), ElementsAre(1, 2, 2));
    EXPECT_THAT(Int64s(splits->train.labels), ElementsAre(0, 1, 2, 3, 4, 5));
    EXPECT_EQ(BatchFloats(splits->train)[23], static_cast<uint8_t>(23 * 37) / 255.0f);
    ASSERT_TRUE(splits->has_test());
    EXPECT_EQ(splits->test.size(), 2);
    EXPECT_THAT(Int64s(splits->test.labels), ElementsAre(9, 8));
    EXPECT_THAT(splits->train.name, HasSubstr("train"));
  }
}

TEST(LoadDataTest, CountMismatchNamesBothFiles) {
  const fs::path dir = MakeIdxDir("idxdir-mismatch", true, 5);
  absl::Status status = training::LoadData(dir.string()).status();
  EXPECT_THAT(Message(status), AllOf(HasSubstr("label count 5 != image count 6"),
                                     HasSubstr("train-images-idx3-ubyte.gz"),
                                     HasSubstr("train-labels-idx1-ubyte.gz")));
}

TEST(LoadDataTest, NpyFileLists) {
  const fs::path dir = TempDir() / "lists";
  const std::string x = WriteFile(dir / "x.npy", Npy<uint8_t>(DType::kUInt8, {3, 2, 2}, Ramp(12)));
  const std::string y = WriteFile(dir / "y.npy", Npy<int32_t>(DType::kInt32, {3}, {1, 0, 1}));
  absl::StatusOr<training::DataSplits> one = training::LoadData(x + "," + y);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->has_test());
  EXPECT_THAT(one->train.images.dims(), ElementsAre(3, 1, 2, 2));
  EXPECT_EQ(BatchFloats(one->train)[5], static_cast<uint8_t>(5 * 37) / 255.0f);
  EXPECT_THAT(Int64s(one->train.labels), ElementsAre(1, 0, 1));

  // Four files, mixing .npy and a gzip IDX file.
  const std::string idx_images = WriteFile(dir / "test-images.gz",
                                           Gzip(IdxBytes(0x803, {2, 2, 2}, Ramp(8))));
  const std::string idx_labels = WriteFile(dir / "test-labels", IdxBytes(0x801, {2}, {3, 4}));
  absl::StatusOr<training::DataSplits> two = training::LoadData(x + "," + y + "," + idx_images + "," + idx_labels);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(two->has_test());
  EXPECT_THAT(Int64s(two->test.labels), ElementsAre(3, 4));

  const std::string short_y = WriteFile(dir / "short.npy", Npy<int64_t>(DType::kInt64, {2}, {1, 0}));
  EXPECT_THAT(Message(training::LoadData(x + "," + short_y).status()),
              AllOf(HasSubstr("label count 2 != image count 3"), HasSubstr("short.npy")));
  EXPECT_THAT(Message(training::LoadData(x + "," + y + "," + x).status()),
              AllOf(HasSubstr("IMAGES,LABELS"), HasSubstr("got 3 files")));
}

TEST(LoadDataTest, NpzFileKerasAndPlainKeys) {
  const fs::path dir = TempDir() / "npzforms";
  const std::string keras = WriteFile(
      dir / "keras.npz",
      ZipBytes({{"x_train.npy", Npy<uint8_t>(DType::kUInt8, {2, 2, 2}, Ramp(8)), true},
                {"y_train.npy", Npy<uint8_t>(DType::kUInt8, {2}, {5, 6}), true},
                {"x_test.npy", Npy<float>(DType::kFloat32, {1, 1, 2, 2}, {.1f, .2f, .3f, .4f}), true},
                {"y_test.npy", Npy<int64_t>(DType::kInt64, {1}, {2}), true}},
               /*numpy_zip64=*/true));
  absl::StatusOr<training::DataSplits> splits = training::LoadData(keras);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_THAT(splits->train.images.dims(), ElementsAre(2, 1, 2, 2));
  EXPECT_THAT(Int64s(splits->train.labels), ElementsAre(5, 6));
  ASSERT_TRUE(splits->has_test());
  EXPECT_EQ(splits->test.images.dtype(), DType::kFloat32);  // float arrays stay float32
  EXPECT_THAT(BatchFloats(splits->test), ElementsAre(.1f, .2f, .3f, .4f));

  const std::string plain = WriteFile(
      dir / "plain.npz", ZipBytes({{"images.npy", Npy<float>(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6})},
                                   {"labels.npy", Npy<int64_t>(DType::kInt64, {2}, {0, 1})}}));
  splits = training::LoadData(plain);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_FALSE(splits->has_test());
  EXPECT_THAT(splits->train.images.dims(), ElementsAre(2, 3));

  const std::string odd = WriteFile(
      dir / "odd.npz", ZipBytes({{"features.npy", Npy<float>(DType::kFloat32, {1}, {1})}}));
  EXPECT_THAT(Message(training::LoadData(odd).status()),
              AllOf(HasSubstr(odd), HasSubstr("x_train"), HasSubstr("has features")));
}

TEST(LoadDataTest, NpzDirectory) {
  const fs::path dir = TempDir() / "npzdir";
  WriteFile(dir / "train.npz",
            ZipBytes({{"x.npy", Npy<uint8_t>(DType::kUInt8, {3, 1, 2}, Ramp(6)), true},
                      {"y.npy", Npy<int64_t>(DType::kInt64, {3}, {2, 1, 0}), true}}));
  WriteFile(dir / "test.npz",
            ZipBytes({{"x_test.npy", Npy<uint8_t>(DType::kUInt8, {1, 1, 2}, {0, 255}), false},
                      {"y_test.npy", Npy<int64_t>(DType::kInt64, {1}, {1}), false}}));
  absl::StatusOr<training::DataSplits> splits = training::LoadData(dir.string());
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_THAT(splits->train.images.dims(), ElementsAre(3, 1, 1, 2));
  EXPECT_THAT(Int64s(splits->train.labels), ElementsAre(2, 1, 0));
  EXPECT_THAT(BatchFloats(splits->test), ElementsAre(0.0f, 1.0f));
}

TEST(LoadDataTest, UnknownFormsListWhatIsAccepted) {
  const std::string message = Message(training::LoadData("cifar-100").status());
  EXPECT_THAT(message, AllOf(HasSubstr("--data cifar-100"), HasSubstr("fashion-mnist"),
                             HasSubstr("mnist"), HasSubstr("directory"), HasSubstr(".npz"),
                             HasSubstr("IMAGES,LABELS")));
  const std::string single = WriteFile(TempDir() / "single.npy",
                                       Npy<float>(DType::kFloat32, {1}, {1}));
  EXPECT_THAT(Message(training::LoadData(single).status()), HasSubstr("must be an .npz"));
  const fs::path empty = TempDir() / "emptydir";
  fs::create_directories(empty);
  EXPECT_THAT(Message(training::LoadData(empty.string()).status()),
              AllOf(HasSubstr(empty.string()), HasSubstr("train-images-idx3-ubyte[.gz]"),
                    HasSubstr("train.npz")));
}

TEST(LoadDataTest, RealFashionMnist) {
  if (!fs::is_directory(training::kFashionMnistDir)) {
    GTEST_SKIP() << training::kFashionMnistDir << " is absent (Debian package dataset-fashion-mnist)";
  }
  // No timing assertion: a loaded CI machine would make it flaky (the load
  // time is printed, about 1 s here).
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<training::DataSplits> splits = training::LoadData("fashion-mnist");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(splits.ok()) << splits.status();
  std::cout << "Fashion-MNIST loaded in " << seconds << " s\n";
  EXPECT_EQ(splits->train.name, "fashion-mnist train");
  EXPECT_THAT(splits->train.images.dims(), ElementsAre(60000, 1, 28, 28));
  EXPECT_THAT(splits->test.images.dims(), ElementsAre(10000, 1, 28, 28));
  const std::vector<int64_t> train_labels = Int64s(splits->train.labels);
  const std::vector<int64_t> test_labels = Int64s(splits->test.labels);
  EXPECT_THAT(std::vector<int64_t>(train_labels.begin(), train_labels.begin() + 10),
              ElementsAre(9, 0, 0, 3, 0, 2, 7, 2, 5, 5));
  EXPECT_THAT(std::vector<int64_t>(test_labels.begin(), test_labels.begin() + 5),
              ElementsAre(9, 2, 1, 1, 6));
  std::vector<int> counts(10);
  for (int64_t label : train_labels) {
    ASSERT_TRUE(label >= 0 && label < 10) << label;
    ++counts[label];
  }
  EXPECT_THAT(counts, ::testing::Each(6000));
  ASSERT_EQ(splits->train.images.dtype(), DType::kUInt8);
  const uint8_t* pixels = splits->train.images.data<uint8_t>();
  const int64_t count = splits->train.images.num_elements();
  EXPECT_EQ(*std::min_element(pixels, pixels + count), 0);
  EXPECT_EQ(*std::max_element(pixels, pixels + count), 255);
}

TEST(LoadDataTest, NpzWrittenByNumpy) {
  if (!fs::exists("/usr/bin/python3") ||
      std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy is not available";
  }
  const fs::path dir = TempDir() / "numpy";
  fs::create_directories(dir);
  const std::string script =
      "import numpy as np; x = (np.arange(2*3*4) * 7 % 256).astype(np.uint8).reshape(2, 3, 4); "
      "y = np.array([3, 1], dtype=np.int64); "
      "np.savez_compressed('" + (dir / "c.npz").string() + "', x_train=x, y_train=y, x_test=x[:1], "
      "y_test=y[:1]); np.savez('" + (dir / "s.npz").string() + "', x=x.astype(np.float32), y=y)";
  ASSERT_EQ(std::system(("/usr/bin/python3 -c \"" + script + "\"").c_str()), 0);
  absl::StatusOr<training::DataSplits> compressed = training::LoadData((dir / "c.npz").string());
  ASSERT_TRUE(compressed.ok()) << compressed.status();
  EXPECT_THAT(compressed->train.images.dims(), ElementsAre(2, 1, 3, 4));
  EXPECT_EQ(BatchFloats(compressed->train)[5], (5 * 7) / 255.0f);
  EXPECT_THAT(Int64s(compressed->train.labels), ElementsAre(3, 1));
  EXPECT_EQ(compressed->test.size(), 1);
  absl::StatusOr<training::DataSplits> stored = training::LoadData((dir / "s.npz").string());
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->train.images.data<float>()[5], 35.0f);
}

// ----- batches ---------------------------------------------------------------------

// N samples whose image i is filled with i and whose label is 100 + i.
training::Dataset Numbered(int64_t count) {
  Tensor images(DType::kFloat32, {count, 1, 2});
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < count; ++i) {
    images.data<float>()[2 * i] = static_cast<float>(i);
    images.data<float>()[2 * i + 1] = static_cast<float>(i);
    labels.push_back(100 + i);
  }
  return *training::MakeDataset("numbered", std::move(images), Tensor::Int64s(labels));
}

std::vector<std::vector<int64_t>> Take(training::BatchIterator& iterator, int batches) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < batches; ++i) out.push_back(iterator.Next().indices);
  return out;
}

TEST(BatchIteratorTest, EachEpochCoversEveryIndexOnceWithMatchingRows) {
  const training::Dataset data = Numbered(10);
  auto iterator = training::BatchIterator::Create(data, {.batch_size = 3, .shuffle = true, .seed = 7});
  ASSERT_TRUE(iterator.ok()) << iterator.status();
  EXPECT_EQ(iterator->batches_per_epoch(), 4);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int64_t> seen;
    std::vector<int64_t> sizes;
    while (iterator->epoch() == epoch) {
      training::Batch batch = iterator->Next();
      EXPECT_EQ(batch.epoch, epoch);
      sizes.push_back(batch.labels.num_elements());
      EXPECT_EQ(batch.images.dims()[0], batch.labels.num_elements());
      EXPECT_THAT(batch.images.dims(), ::testing::ElementsAre(batch.labels.num_elements(), 1, 2));
      for (size_t i = 0; i < batch.indices.size(); ++i) {
        const int64_t row = batch.indices[i];
        seen.insert(row);
        EXPECT_EQ(batch.images.data<float>()[2 * i + 1], static_cast<float>(row));
        EXPECT_EQ(batch.labels.data<int64_t>()[i], 100 + row);
      }
    }
    EXPECT_THAT(sizes, ElementsAre(3, 3, 3, 1)) << "the last partial batch is kept";
    EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  }
}

TEST(BatchIteratorTest, ShuffleIsReproduciblePerSeedAndDiffersPerEpoch) {
  const training::BatchOptions seven{.batch_size = 100, .shuffle = true, .seed = 7};
  const training::BatchOptions eight{.batch_size = 100, .shuffle = true, .seed = 8};
  EXPECT_EQ(training::BatchIterator::EpochOrder(100, seven, 0), training::BatchIterator::EpochOrder(100, seven, 0));
  EXPECT_NE(training::BatchIterator::EpochOrder(100, seven, 0), training::BatchIterator::EpochOrder(100, seven, 1));
  EXPECT_NE(training::BatchIterator::EpochOrder(100, seven, 0), training::BatchIterator::EpochOrder(100, eight, 0));
  // The same data in a fresh iterator gives the same batches.
  const training::Dataset data = Numbered(100);
  auto a = training::BatchIterator::Create(data, {.batch_size = 16, .shuffle = true, .seed = 3});
  auto b = training::BatchIterator::Create(data, {.batch_size = 16, .shuffle = true, .seed = 3});
  EXPECT_EQ(Take(*a, 20), Take(*b, 20));
  // Pinned: seed 0, epoch 0 of 8 samples (mt19937_64 + unbiased Fisher-Yates
  // is the same on every platform; a change here breaks checkpoint resume).
  std::vector<int64_t> pinned = training::BatchIterator::EpochOrder(8, {.shuffle = true, .seed = 0}, 0);
  std::vector<int64_t> sorted = pinned;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_THAT(sorted, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_NE(pinned, sorted);
  EXPECT_EQ(pinned, training::BatchIterator::EpochOrder(8, {.shuffle = true, .seed = 0}, 0));
}

TEST(BatchIteratorTest, ResumeFromEpochAndPositionGivesIdenticalBatches) {
  const training::Dataset data = Numbered(23);
  for (bool drop_last : {false, true}) {
    const training::BatchOptions options{.batch_size = 5, .shuffle = true, .seed = 42, .drop_last = drop_last};
    auto original = training::BatchIterator::Create(data, options);
    ASSERT_TRUE(original.ok());
    Take(*original, 7);  // into the second epoch
    EXPECT_EQ(original->epoch(), 1);
    auto resumed = training::BatchIterator::Create(data, options, original->epoch(), original->position());
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    for (int i = 0; i < 12; ++i) {
      training::Batch expected = original->Next();
      training::Batch got = resumed->Next();
      EXPECT_EQ(got.indices, expected.indices) << "batch " << i;
      EXPECT_EQ(got.images, expected.images);
      EXPECT_EQ(got.labels, expected.labels);
      EXPECT_EQ(got.epoch, expected.epoch);
      EXPECT_EQ(got.position, expected.position);
    }
  }
}

TEST(BatchIteratorTest, InOrderAndDropLast) {
  const training::Dataset data = Numbered(7);
  auto in_order = training::BatchIterator::Create(data, {.batch_size = 3, .shuffle = false});
  ASSERT_TRUE(in_order.ok());
  EXPECT_THAT(Take(*in_order, 4),
              ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4, 5), ElementsAre(6),
                          ElementsAre(0, 1, 2)));
  EXPECT_EQ(in_order->epoch(), 1);
  EXPECT_EQ(in_order->position(), 3);

  auto dropping =
      training::BatchIterator::Create(data, {.batch_size = 3, .shuffle = false, .drop_last = true});
  ASSERT_TRUE(dropping.ok());
  EXPECT_EQ(dropping->batches_per_epoch(), 2);
  EXPECT_THAT(Take(*dropping, 3),
              ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4, 5), ElementsAre(0, 1, 2)));
  // Resuming at the end of an epoch starts the next one.
  auto at_end = training::BatchIterator::Create(data, {.batch_size = 3, .shuffle = false}, 2, 7);
  ASSERT_TRUE(at_end.ok());
  EXPECT_EQ(at_end->epoch(), 3);
  EXPECT_EQ(at_end->position(), 0);
}

TEST(BatchIteratorTest, RejectsBadSettings) {
  const training::Dataset data = Numbered(4);
  EXPECT_THAT(Message(training::BatchIterator::Create(data, {.batch_size = 0}).status()),
              AllOf(HasSubstr("numbered"), HasSubstr("batch size must be positive")));
  EXPECT_THAT(Message(training::BatchIterator::Create(data, {.batch_size = 5, .drop_last = true}).status()),
              HasSubstr("leaves no batch"));
  EXPECT_THAT(Message(training::BatchIterator::Create(data, {.batch_size = 2}, 0, 5).status()),
              HasSubstr("cannot resume at epoch 0, position 5"));
  EXPECT_FALSE(training::BatchIterator::Create(training::Dataset{}, {.batch_size = 2}).ok());
}


// ----- .npz keyed by the model's input names ------------------------------------------

// input_ids int64 [N, 4], attention_mask int64 [N, 4] (an initializer-backed
// input `scale` too, which needs no array).
std::vector<training::ModelInputSpec> TokenInputs() {
  return {{"input_ids", DType::kInt64, {-1, 4}, true},
          {"attention_mask", DType::kInt64, {-1, 4}, true},
          {"scale", DType::kFloat32, {}, false}};
}

std::vector<int64_t> Ids(int64_t n, int64_t vocabulary) {
  std::vector<int64_t> ids(static_cast<size_t>(n * 4));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % vocabulary);
  return ids;
}

std::string NamedNpz(const std::string& file, std::vector<ZipEntry> entries) {
  return WriteFile(TempDir() / "named" / file, ZipBytes(entries));
}

TEST(NamedNpzTest, FeedsEveryInputByNameInItsDtype) {
  std::vector<int32_t> mask(32, 1);
  mask[3] = 0;
  const std::string path = NamedNpz(
      "ok.npz", {{"input_ids.npy", Npy<int64_t>(DType::kInt64, {8, 4}, Ids(8, 10))},
                 {"attention_mask.npy", Npy<int32_t>(DType::kInt32, {8, 4}, mask)},
                 {"labels.npy", Npy<int64_t>(DType::kInt64, {8}, {0, 1, 2, 0, 1, 2, 0, 1})},
                 {"input_ids_test.npy", Npy<int64_t>(DType::kInt64, {2, 4}, Ids(2, 10))},
                 {"attention_mask_test.npy", Npy<int32_t>(DType::kInt32, {2, 4},
                                                          std::vector<int32_t>(8, 1))},
                 {"labels_test.npy", Npy<int64_t>(DType::kInt64, {2}, {2, 1})}});
  auto splits = training::LoadNpzByInputNames(path, TokenInputs());
  ASSERT_TRUE(splits.ok()) << splits.status();
  ASSERT_TRUE(splits->has_value());
  const training::DataSplits& data = **splits;
  EXPECT_EQ(data.train.size(), 8);
  EXPECT_EQ(data.test.size(), 2);
  EXPECT_EQ(data.train.images_input, "input_ids");
  EXPECT_EQ(data.train.images.dtype(), DType::kInt64);
  ASSERT_EQ(data.train.extra_inputs.size(), 1u);
  EXPECT_EQ(data.train.extra_inputs[0].first, "attention_mask");
  // int32 widens to the int64 input.
  EXPECT_EQ(data.train.extra_inputs[0].second.dtype(), DType::kInt64);
  const training::Batch batch = training::GatherBatch(data.train, {0, 5});
  EXPECT_EQ(Int64s(batch.images), (std::vector<int64_t>{3, 0, 7, 4, 3, 0, 7, 4}));
  ASSERT_EQ(batch.extra_inputs.size(), 1u);
  EXPECT_EQ(Int64s(batch.extra_inputs[0].second), (std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 1}));
  const auto feeds = training::BatchFeeds(batch, "input_ids");
  ASSERT_EQ(feeds.size(), 2u);
  EXPECT_EQ(feeds[1].first, "attention_mask");
  EXPECT_EQ(Int64s(batch.labels), (std::vector<int64_t>{0, 2}));
}

TEST(NamedNpzTest, OtherFormsAreNotTaken) {
  const std::string keras = NamedNpz(
      "keras.npz", {{"x_train.npy", Npy<int64_t>(DType::kInt64, {2, 4}, Ids(2, 10))},
                    {"y_train.npy", Npy<int64_t>(DType::kInt64, {2}, {0, 1})},
                    {"input_ids.npy", Npy<int64_t>(DType::kInt64, {2, 4}, Ids(2, 10))}});
  auto splits = training::LoadNpzByInputNames(keras, TokenInputs());
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_FALSE(splits->has_value());
  const std::string unnamed = NamedNpz(
      "unnamed.npz", {{"tokens.npy", Npy<int64_t>(DType::kInt64, {2, 4}, Ids(2, 10))}});
  splits = training::LoadNpzByInputNames(unnamed, TokenInputs());
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_FALSE(splits->has_value());
}

TEST(NamedNpzTest, ErrorsNameTheArrayTheInputAndWhatWasExpected) {
  const std::string ids = Npy<int64_t>(DType::kInt64, {8, 4}, Ids(8, 10));
  const std::string mask = Npy<int64_t>(DType::kInt64, {8, 4}, std::vector<int64_t>(32, 1));
  const std::string labels = Npy<int64_t>(DType::kInt64, {8}, {0, 1, 2, 0, 1, 2, 0, 1});
  struct Case {
    std::string file;
    std::vector<ZipEntry> entries;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing.npz",
       {{"input_ids.npy", ids}, {"labels.npy", labels}},
       "missing.npz: the model input 'attention_mask' has no array 'attention_mask' (train "
       "split); the file has input_ids, labels"},
      {"float_ids.npz",
       {{"input_ids.npy", Npy<float>(DType::kFloat32, {8, 4}, std::vector<float>(32, 1.0f))},
        {"attention_mask.npy", mask},
        {"labels.npy", labels}},
       "float_ids.npz:input_ids: float32 [8, 4] does not fit the model input 'input_ids' (int64 "
       "[N, 4]): an integer input takes integer arrays (int64 or narrower)"},
      {"uint64_ids.npz",
       {{"input_ids.npy", Npy<uint64_t>(DType::kUInt64, {8, 4}, std::vector<uint64_t>(32, 1))},
        {"attention_mask.npy", mask},
        {"labels.npy", labels}},
       "not every uint64 value is a int64"},
      {"shape.npz",
       {{"input_ids.npy", Npy<int64_t>(DType::kInt64, {8, 5}, Ids(10, 10))},
        {"attention_mask.npy", mask},
        {"labels.npy", labels}},
       "shape.npz:input_ids: int64 [8, 5] does not fit the model input 'input_ids' (int64 [N, "
       "4]): axis 1 must be 4"},
      {"rank.npz",
       {{"input_ids.npy", Npy<int64_t>(DType::kInt64, {32}, Ids(8, 10))},
        {"attention_mask.npy", mask},
        {"labels.npy", labels}},
       "expected rank 2, samples on axis 0"},
      {"lengths.npz",
       {{"input_ids.npy", ids},
        {"attention_mask.npy", Npy<int64_t>(DType::kInt64, {7, 4}, std::vector<int64_t>(28, 1))},
        {"labels.npy", labels}},
       "lengths.npz:attention_mask has 7 samples but " },
      {"no_labels.npz",
       {{"input_ids.npy", ids}, {"attention_mask.npy", mask}},
       "no_labels.npz: no array 'labels' (the train labels"},
      {"stray.npz",
       {{"input_ids.npy", ids}, {"attention_mask.npy", mask}, {"labels.npy", labels},
        {"token_type_ids.npy", mask}},
       "stray.npz: array 'token_type_ids' is neither a model input nor the labels; keyed by "
       "input names, the arrays are input_ids, input_ids_test, attention_mask, "
       "attention_mask_test, scale, scale_test, labels, labels_test"},
      {"half_test.npz",
       {{"input_ids.npy", ids}, {"attention_mask.npy", mask}, {"labels.npy", labels},
        {"input_ids_test.npy", ids}, {"labels_test.npy", labels}},
       "the model input 'attention_mask' has no array 'attention_mask_test' (test split)"},
  };
  for (const Case& c : cases) {
    auto splits = training::LoadNpzByInputNames(NamedNpz(c.file, c.entries), TokenInputs());
    ASSERT_FALSE(splits.ok()) << c.file;
    EXPECT_EQ(splits.status().code(), absl::StatusCode::kInvalidArgument) << c.file;
    EXPECT_THAT(Message(splits.status()), HasSubstr(c.message)) << c.file;
  }
}

// A two-input token classifier: E[input_ids] [N, 4, 3] times the mask
// (Cast to float, Unsqueeze), summed over the tokens: logits [N, 3].
void WriteMaskedTokenModel(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 17});
  Graph& g = *model.graph;
  Value* ids = *g.AddInput("input_ids", DType::kInt64, Shape{Dim::Symbol("N"), Dim(4)});
  Value* mask = *g.AddInput("attention_mask", DType::kInt64, Shape{Dim::Symbol("N"), Dim(4)});
  std::vector<float> table(30);
  for (int i = 0; i < 30; ++i) table[i] = 0.1f * static_cast<float>((i * 7) % 11) - 0.5f;
  Value* embedding =
      *g.AddInitializer("E", Tensor::FromVector<float>(DType::kFloat32, {10, 3}, table));
  Node* gather = *g.AddNode("Gather", {embedding, ids}, {"embedded"}, "embed");
  gather->SetAttribute(Attribute::Int("axis", 0));
  Node* cast = *g.AddNode("Cast", {mask}, {"mask_float"}, "cast");
  cast->SetAttribute(Attribute::Int("to", 1));
  Value* axes = *g.AddInitializer("axes", Tensor::Int64s({2}));
  Node* unsqueeze = *g.AddNode("Unsqueeze", {cast->output(0), axes}, {"mask3"}, "unsqueeze");
  Node* mul = *g.AddNode("Mul", {gather->output(0), unsqueeze->output(0)}, {"masked"}, "mul");
  Value* token_axis = *g.AddInitializer("token_axis", Tensor::Int64s({1}));
  Node* sum = *g.AddNode("ReduceSum", {mul->output(0), token_axis}, {"logits"}, "sum");
  sum->SetAttribute(Attribute::Int("keepdims", 0));
  g.AddOutput(sum->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  ASSERT_TRUE(SaveModel(model, path).ok());
}

TEST(NamedNpzTest, CastorTrainFeedsSeveralInputsAndChecksLabels) {
  const std::string model = (TempDir() / "named" / "masked_tokens.onnx").string();
  WriteMaskedTokenModel(model);
  std::vector<int64_t> mask(32, 1);
  for (int i = 0; i < 8; ++i) mask[i * 4 + 3] = 0;  // the last token of each sample is padding
  const std::string ids = Npy<int64_t>(DType::kInt64, {8, 4}, Ids(8, 10));
  const std::string masks = Npy<int64_t>(DType::kInt64, {8, 4}, mask);
  const std::string data = NamedNpz(
      "train_tokens.npz",
      {{"input_ids.npy", ids}, {"attention_mask.npy", masks},
       {"labels.npy", Npy<int64_t>(DType::kInt64, {8}, {0, 1, 2, 0, 1, 2, 0, 1})},
       {"input_ids_test.npy", ids}, {"attention_mask_test.npy", masks},
       {"labels_test.npy", Npy<int64_t>(DType::kInt64, {8}, {2, 1, 0, 2, 1, 0, 2, 1})}});
  auto train = [&](const std::string& data_path, std::vector<std::string> extra) {
    std::vector<std::string> args = {model, "--data", data_path, "--batch", "4",
                                     "--policy", "float32", "--optimizer", "sgd", "--lr", "0.1"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    const int code = RunTrain(args, out, err);
    return std::make_tuple(code, out.str(), err.str());
  };
  const auto [code, out, err] = train(data, {"--epochs", "2"});
  ASSERT_EQ(code, 0) << err;
  EXPECT_THAT(out, HasSubstr("(8 train / 8 test)"));
  EXPECT_THAT(out, HasSubstr("eval  epoch 1 step 4: test loss "));
  EXPECT_THAT(out, HasSubstr("  parameters      1 tensors (30 elements) train"));

  const std::string bad_label = NamedNpz(
      "bad_label.npz", {{"input_ids.npy", ids}, {"attention_mask.npy", masks},
                        {"labels.npy", Npy<int64_t>(DType::kInt64, {8}, {0, 1, 5, 0, 1, 2, 0, 1})}});
  const auto [bad_code, bad_out, bad_err] = train(bad_label, {"--max-steps", "1"});
  EXPECT_EQ(bad_code, 2);
  EXPECT_THAT(bad_err, HasSubstr("bad_label.npz:labels: label 5 of sample 2 is out of range "
                                 "[0, 3): the output 'logits' [N,3] has 3 classes"));
  const std::string missing = NamedNpz(
      "missing_mask.npz", {{"input_ids.npy", ids},
                           {"labels.npy", Npy<int64_t>(DType::kInt64, {8}, std::vector<int64_t>(8, 1))}});
  const auto [missing_code, missing_out, missing_err] = train(missing, {"--max-steps", "1"});
  EXPECT_EQ(missing_code, 2);
  EXPECT_THAT(missing_err, HasSubstr("the model input 'attention_mask' has no array "
                                     "'attention_mask'"));
}


// A model that computes its own loss: pred = x [N, 3] @ W [3, 2] (W zero),
// loss = mean((pred - y)^2), outputs (loss, pred). Both inputs from data.
void WriteOwnLossModel(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 17});
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim::Symbol("N"), Dim(3)});
  Value* y = *g.AddInput("y", DType::kFloat32, Shape{Dim::Symbol("N"), Dim(2)});
  Value* w = *g.AddInitializer("W", Tensor(DType::kFloat32, {3, 2}));
  Node* pred = *g.AddNode("MatMul", {x, w}, {"pred"}, "matmul");
  Node* diff = *g.AddNode("Sub", {pred->output(0), y}, {"diff"}, "sub");
  Node* square = *g.AddNode("Mul", {diff->output(0), diff->output(0)}, {"square"}, "mul");
  Node* mean = *g.AddNode("ReduceMean", {square->output(0)}, {"loss"}, "mean");
  mean->SetAttribute(Attribute::Int("keepdims", 0));
  g.AddOutput(mean->output(0));
  g.AddOutput(pred->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  ASSERT_TRUE(SaveModel(model, path).ok());
}

TEST(NamedNpzTest, CastorTrainWithTheModelsOwnLoss) {
  const std::string model = (TempDir() / "named" / "own_loss.onnx").string();
  WriteOwnLossModel(model);
  const std::vector<float> y = {1, -2, 0.5f, 3, -1, 2, 4, 0.25f};
  const std::string data = NamedNpz(
      "own_loss.npz",
      {{"x.npy", Npy<float>(DType::kFloat32, {4, 3}, {1, 2, 3, -1, 0, 1, 2, -2, 1, 0, 1, -1})},
       {"y.npy", Npy<float>(DType::kFloat32, {4, 2}, y)}});
  const std::string metrics = (TempDir() / "named" / "own_loss.jsonl").string();
  auto train = [&](const std::string& data_path, std::vector<std::string> extra) {
    std::vector<std::string> args = {model, "--data", data_path, "--batch", "4", "--loss",
                                     "output", "--policy", "float32", "--optimizer", "sgd",
                                     "--lr", "0.05", "--no-shuffle"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    const int code = RunTrain(args, out, err);
    return std::make_tuple(code, out.str(), err.str());
  };
  const auto [code, out, err] = train(data, {"--max-steps", "3", "--metrics", metrics,
                                             "--epochs", "3"});
  ASSERT_EQ(code, 0) << err;
  // W starts at zero: the first loss is mean(y^2).
  double expected = 0;
  for (float v : y) expected += static_cast<double>(v) * v / y.size();
  std::ifstream in(metrics);
  std::string line;
  std::vector<double> losses;
  while (std::getline(in, line)) {
    absl::StatusOr<Json> json = Json::Parse(line);
    ASSERT_TRUE(json.ok()) << line;
    if (json->Find("step") != nullptr && json->Find("loss") != nullptr) {
      losses.push_back(json->Find("loss")->as_number());
    }
  }
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_NEAR(losses[0], expected, 1e-6 * expected);
  EXPECT_LT(losses[2], losses[1]);
  EXPECT_LT(losses[1], losses[0]);

  // The output must be a scalar; the data holds no labels.
  const auto [pred_code, pred_out, pred_err] = train(data, {"--output", "pred", "--max-steps", "1"});
  EXPECT_EQ(pred_code, 2);
  EXPECT_THAT(pred_err, HasSubstr("--loss output: output 'pred' has shape [N,2]; the model's own "
                                  "loss must be a float scalar"));
  const std::string with_labels = NamedNpz(
      "own_loss_labels.npz",
      {{"x.npy", Npy<float>(DType::kFloat32, {4, 3}, std::vector<float>(12, 1.0f))},
       {"y.npy", Npy<float>(DType::kFloat32, {4, 2}, y)},
       {"labels.npy", Npy<int64_t>(DType::kInt64, {4}, {0, 1, 0, 1})}});
  const auto [labels_code, labels_out, labels_err] = train(with_labels, {"--max-steps", "1"});
  EXPECT_EQ(labels_code, 2);
  EXPECT_THAT(labels_err, HasSubstr("array 'labels' is neither a model input nor the labels"));
  EXPECT_THAT(labels_err, HasSubstr("(the model computes its own loss: no labels)"));
}

}  // namespace
}  // namespace castor::tools
