// Dataset readers and the batch iterator (see dataset.h): IDX files streamed
// through zlib's gz* reader (gzip or plain) into uint8 pixels, a
// small zip reader for .npz archives (stored and deflated members, ZIP64),
// the `--data` forms, and per-epoch shuffling.
#include "training/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "backend/cpu/cpu_backend.h"
#include "graph/half.h"
#include "graph/status.h"
#include "training/npy.h"

namespace castor::training {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8, 3 dims
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8, 1 dim
// More elements than this in one IDX file is a corrupt header, not data.
constexpr uint64_t kMaxIdxElements = uint64_t{1} << 36;
// Deflate turns one compressed byte into at most 1032 bytes (258-byte
// matches coded in 2 bits); a stream of N bytes inflates to no more than
// this many per byte, plus a little for the headers.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint64_t kDeflateSlackBytes = 1024;

std::string Hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

std::string DimsText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Whether `bytes` more fit the memory budget (CASTOR_MEMORY_LIMIT, else
// MemAvailable; none when neither is known): checked before a reader
// allocates what a file declares. `what` names the file and the array.
absl::Status CheckMemoryBudget(const std::string& what, uint64_t bytes) {
  const int64_t limit = DefaultCpuMemoryLimit().value_or(0);
  if (limit <= 0 || bytes <= static_cast<uint64_t>(limit)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " needs ", bytes, " bytes, more than the memory budget of ", limit,
      " bytes (MemAvailable, or CASTOR_MEMORY_LIMIT)"));
}

// NotFound when `path` does not exist, InvalidArgument when it is not a
// regular file: a FIFO or a device is never opened (it would block or
// never end).
absl::Status RequireRegularFile(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  return absl::OkStatus();
}

// uint8 pixel -> float32 in [0, 1], exactly v / 255.0f.
const float* PixelScaleTable() {
  static const auto* table = [] {
    auto* values = new float[256];
    for (int v = 0; v < 256; ++v) values[v] = static_cast<float>(v) / 255.0f;
    return values;
  }();
  return table;
}

// A file read through zlib's gz* interface: gzip-compressed files are
// inflated, anything else is read as it is.
class GzInput {
 public:
  explicit GzInput(std::string path) : path_(std::move(path)) {}
  ~GzInput() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzInput(const GzInput&) = delete;
  GzInput& operator=(const GzInput&) = delete;

  absl::Status Open() {
    CASTOR_RETURN_IF_ERROR(RequireRegularFile(path_));
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": cannot open file"));
    gzbuffer(file_, 1 << 20);
    return absl::OkStatus();
  }
  bool compressed() const { return gzdirect(file_) == 0; }

  // Reads up to `size` bytes: fewer at the end of the data, or when the gzip
  // stream is corrupt or cut off; then error() says so.
  size_t Read(void* destination, size_t size) {
    size_t done = 0;
    auto* out = static_cast<uint8_t*>(destination);
    while (done < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
      const int got = gzread(file_, out + done, chunk);
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }
  // "" or the zlib error of the last short read ("unexpected end of file").
  std::string error() {
    int errnum = Z_OK;
    const char* message = gzerror(file_, &errnum);
    if (errnum == Z_OK) return "";
    std::string text = message != nullptr ? message : "unknown error";
    if (absl::StartsWith(text, path_ + ": ")) text.erase(0, path_.size() + 2);  // zlib adds it
    return absl::StrCat("gzip stream: ", text);
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t BigEndian32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// Reads an IDX header with `expected_magic` and passes the uint8 data, in
// chunks, to `consume(chunk, count, offset)` writing into the tensor that
// `make_tensor(dims)` returns.
template <typename MakeTensor, typename Consume>
absl::StatusOr<Tensor> ReadIdx(const std::string& path, uint32_t expected_magic,
                               const char* expected_what, uint64_t tensor_element_bytes,
                               MakeTensor make_tensor, Consume consume) {
  GzInput input(path);
  CASTOR_RETURN_IF_ERROR(input.Open());
  const size_t rank = expected_magic & 0xff;
  uint8_t header[4 + 4 * 4];
  const size_t header_size = 4 + 4 * rank;
  const size_t header_read = input.Read(header, header_size);
  // "; gzip stream: unexpected end of file" when zlib reported a problem.
  auto zlib_note = [&input] {
    const std::string error = input.error();
    return error.empty() ? error : absl::StrCat("; ", error);
  };
  if (header_read >= 4 && BigEndian32(header) != expected_magic) {
    const uint32_t found = BigEndian32(header);
    std::string hint;
    if (found == kIdxImagesMagic || found == kIdxLabelsMagic) {
      hint = found == kIdxImagesMagic ? " (an images file)" : " (a labels file)";
    } else if ((found >> 16) != 0) {
      hint = " (not an IDX file)";
    } else if (((found >> 8) & 0xff) != 0x08) {
      hint = " (element type is not uint8)";
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad IDX magic ", Hex32(found), hint,
                                                   "; expected ", Hex32(expected_magic), " (",
                                                   expected_what, ")"));
  }
  if (header_read < header_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated IDX header: expected ", header_size, " bytes (",
                     expected_what, "), found ", header_read, zlib_note()));
  }
  std::vector<int64_t> dims;
  uint64_t elements = 1;
  for (size_t i = 0; i < rank; ++i) {
    dims.push_back(BigEndian32(header + 4 + 4 * i));
    elements *= static_cast<uint64_t>(dims.back());
    if (elements > kMaxIdxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": IDX dims ", DimsText(dims), "... are implausibly large"));
    }
  }
  std::error_code error;
  const uintmax_t file_size = fs::file_size(path, error);
  if (!input.compressed()) {
    if (!error && file_size != header_size + elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", file_size < header_size + elements ? "truncated" : "over-long",
          " IDX file: dims ", DimsText(dims), " need ", header_size + elements,
          " bytes, the file has ", file_size));
    }
  } else if (!error && header_size + elements > file_size * kMaxDeflateRatio + kDeflateSlackBytes) {
    // Checked before allocating: a 29-byte file claiming 2^32-1 labels.
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated IDX file: dims ", DimsText(dims), " need ", header_size + elements,
        " bytes, more than its ", file_size, " gzip-compressed bytes can hold (deflate inflates "
        "at most ", kMaxDeflateRatio, "x)"));
  }
  CASTOR_RETURN_IF_ERROR(CheckMemoryBudget(absl::StrCat(path, ": IDX dims ", DimsText(dims)),
                                           elements * tensor_element_bytes));
  Tensor tensor = make_tensor(dims);
  std::vector<uint8_t> chunk(std::min<uint64_t>(elements, 1 << 20));
  uint64_t offset = 0;
  while (offset < elements) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk.size(), elements - offset));
    const size_t got = input.Read(chunk.data(), want);
    consume(tensor, chunk.data(), got, offset);
    offset += got;
    if (got < want) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": truncated IDX data: dims ", DimsText(dims), " need ", elements,
          " data bytes, found ", offset, zlib_note()));
    }
  }
  uint8_t extra;
  const size_t extra_read = input.Read(&extra, 1);
  if (!input.error().empty()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt IDX file: ", input.error()));
  }
  if (extra_read != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": over-long IDX file: dims ", DimsText(dims), " need ", elements,
                     " data bytes, the file has more"));
  }
  return tensor;
}

// ----- zip (.npz) -----------------------------------------------------------

uint16_t Little16(const uint8_t* bytes) { return bytes[0] | (uint16_t{bytes[1]} << 8); }
uint32_t Little32(const uint8_t* bytes) {
  return uint32_t{bytes[0]} | (uint32_t{bytes[1]} << 8) | (uint32_t{bytes[2]} << 16) |
         (uint32_t{bytes[3]} << 24);
}
uint64_t Little64(const uint8_t* bytes) {
  return uint64_t{Little32(bytes)} | (uint64_t{Little32(bytes + 4)} << 32);
}

constexpr uint32_t kZipLocalHeader = 0x04034b50;
constexpr uint32_t kZipCentralHeader = 0x02014b50;
constexpr uint32_t kZipEnd = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  CASTOR_RETURN_IF_ERROR(RequireRegularFile(path));
  std::error_code error;
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  std::string bytes(fs::file_size(path, error), '\0');
  const size_t read = std::fread(bytes.data(), 1, bytes.size(), file);
  std::fclose(file);
  if (read != bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, ": read ", read, " of ", bytes.size(), " bytes"));
  }
  return bytes;
}

struct ZipMember {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t local_header_offset = 0;
};

absl::Status BadZip(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid .npz (zip) file: ", what));
}

// The central directory of the zip archive `bytes`.
absl::StatusOr<std::vector<ZipMember>> ReadZipDirectory(std::string_view bytes,
                                                        const std::string& path) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  if (size < 22) return BadZip(path, absl::StrCat("only ", size, " bytes"));
  // The end record is the last 22 bytes plus a comment of up to 65535 bytes.
  size_t end = std::string::npos;
  for (size_t at = size - 22;; --at) {
    if (Little32(data + at) == kZipEnd && at + 22 + Little16(data + at + 20) <= size) {
      end = at;
      break;
    }
    if (at == 0 || size - at > 22 + 65535) break;
  }
  if (end == std::string::npos) return BadZip(path, "no end-of-central-directory record");
  uint64_t count = Little16(data + end + 10);
  uint64_t directory_size = Little32(data + end + 12);
  uint64_t directory_offset = Little32(data + end + 16);
  if (end >= 20 && Little32(data + end - 20) == kZip64Locator) {
    // The ZIP64 end record (56 bytes before its variable part) lies before
    // its locator; a file shorter than that has none.
    const uint64_t locator = end - 20;
    const uint64_t end64 = Little64(data + locator + 8);
    if (end64 > locator || locator - end64 < 56 || Little32(data + end64) != kZip64End) {
      return BadZip(path, "bad ZIP64 end-of-central-directory record");
    }
    count = Little64(data + end64 + 32);
    directory_size = Little64(data + end64 + 40);
    directory_offset = Little64(data + end64 + 48);
  }
  if (directory_offset > size || directory_size > size - directory_offset) {
    return BadZip(path, absl::StrCat("central directory (offset ", directory_offset, ", ",
                                     directory_size, " bytes) lies outside the file (", size,
                                     " bytes): truncated?"));
  }
  std::vector<ZipMember> members;
  size_t at = directory_offset;
  const size_t directory_end = directory_offset + directory_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > directory_end || Little32(data + at) != kZipCentralHeader) {
      return BadZip(path, absl::StrCat("bad central directory entry ", i));
    }
    ZipMember member;
    member.flags = Little16(data + at + 8);
    member.method = Little16(data + at + 10);
    member.crc = Little32(data + at + 16);
    member.compressed_size = Little32(data + at + 20);
    member.size = Little32(data + at + 24);
    const size_t name_length = Little16(data + at + 28);
    const size_t extra_length = Little16(data + at + 30);
    const size_t comment_length = Little16(data + at + 32);
    member.local_header_offset = Little32(data + at + 42);
    if (at + 46 + name_length + extra_length + comment_length > directory_end) {
      return BadZip(path, absl::StrCat("central directory entry ", i, " overruns the directory"));
    }
    member.name.assign(bytes.substr(at + 46, name_length));
    // ZIP64 extra field: the 64-bit values of the fields saturated above.
    const uint8_t* extra = data + at + 46 + name_length;
    for (size_t e = 0; e + 4 <= extra_length;) {
      const uint16_t id = Little16(extra + e);
      const size_t length = Little16(extra + e + 2);
      if (e + 4 + length > extra_length) break;
      if (id == 0x0001) {
        const uint8_t* field = extra + e + 4;
        const uint8_t* field_end = field + length;
        for (uint64_t* value : {&member.size, &member.compressed_size,
                                &member.local_header_offset}) {
          if (*value == 0xffffffffu && field + 8 <= field_end) {
            *value = Little64(field);
            field += 8;
          }
        }
      }
      e += 4 + length;
    }
    members.push_back(std::move(member));
    at += 46 + name_length + extra_length + comment_length;
  }
  // Members may not share bytes: each one's local header (30 bytes at
  // least) and compressed data end before the next one starts. Overlapping
  // members inflate the same deflate stream again and again (a zip bomb
  // whose output grows with the square of the file's size), which the
  // per-member 1032x bound cannot see; np.savez never writes them.
  std::vector<const ZipMember*> by_offset;
  for (const ZipMember& member : members) by_offset.push_back(&member);
  std::sort(by_offset.begin(), by_offset.end(), [](const ZipMember* a, const ZipMember* b) {
    return a->local_header_offset < b->local_header_offset;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipMember& before = *by_offset[i - 1];
    const ZipMember& next = *by_offset[i];
    const uint64_t gap = next.local_header_offset - before.local_header_offset;
    if (gap < 30 || gap - 30 < before.compressed_size) {
      return BadZip(path, absl::StrCat("members '", before.name, "' and '", next.name,
                                       "' overlap (local headers at ",
                                       before.local_header_offset, " and ",
                                       next.local_header_offset, ", the first holds ",
                                       before.compressed_size, " compressed bytes)"));
    }
  }
  return members;
}

// The uncompressed bytes of `member`, CRC-checked. `bytes_held`: what the
// members read before it hold (they are kept; the budget counts them).
absl::StatusOr<std::string> ExtractZipMember(std::string_view bytes, const ZipMember& member,
                                             const std::string& path, uint64_t bytes_held) {
  const std::string source = absl::StrCat(path, ":", member.name);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t offset = member.local_header_offset;
  if (offset > bytes.size() || bytes.size() - offset < 30 ||
      Little32(data + offset) != kZipLocalHeader) {
    return BadZip(source, "bad local file header (truncated file?)");
  }
  if (member.flags & 1) return BadZip(source, "encrypted members are not supported");
  const size_t data_offset = offset + 30 + Little16(data + offset + 26) + Little16(data + offset + 28);
  if (data_offset > bytes.size() || member.compressed_size > bytes.size() - data_offset) {
    return BadZip(source, absl::StrCat("truncated: member needs ", member.compressed_size,
                                       " compressed bytes at offset ", data_offset,
                                       ", the file has ", bytes.size()));
  }
  // The declared size is checked against the member's bytes and the memory
  // budget before anything is allocated (a zip64 record may declare 2^63).
  if (member.method != 0 && member.method != 8) {
    return absl::UnimplementedError(absl::StrCat(
        source, ": zip compression method ", member.method,
        " is not supported (expected 0 stored or 8 deflate, as np.savez/np.savez_compressed write)"));
  }
  if (member.method == 0 && member.compressed_size != member.size) {
    return BadZip(source, absl::StrCat("stored member sizes differ (", member.compressed_size,
                                       " vs ", member.size, ")"));
  }
  if (member.method == 8 &&
      member.size / kMaxDeflateRatio > member.compressed_size + kDeflateSlackBytes) {
    return BadZip(source, absl::StrCat("the member declares ", member.size,
                                       " uncompressed bytes, more than its ",
                                       member.compressed_size,
                                       " deflated bytes can hold (deflate inflates at most ",
                                       kMaxDeflateRatio, "x)"));
  }
  CASTOR_RETURN_IF_ERROR(CheckMemoryBudget(
      bytes_held == 0 ? source : absl::StrCat(source, " with the members before it"),
      member.size > std::numeric_limits<uint64_t>::max() - bytes_held
          ? std::numeric_limits<uint64_t>::max()
          : bytes_held + member.size));
  std::string out(member.size, '\0');
  const auto* in = data + data_offset;
  if (member.method == 0) {
    if (!out.empty()) std::memcpy(out.data(), in, out.size());
  } else {
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {
      return absl::InternalError(absl::StrCat(source, ": inflateInit2 failed"));
    }
    uint64_t in_left = member.compressed_size;
    uint64_t out_left = member.size;
    stream.next_in = const_cast<Bytef*>(in);
    stream.next_out = reinterpret_cast<Bytef*>(out.data());
    int result = Z_OK;
    constexpr uint64_t kChunk = uint64_t{1} << 30;
    while (result == Z_OK) {
      if (stream.avail_in == 0) {
        stream.avail_in = static_cast<uInt>(std::min(in_left, kChunk));
        in_left -= stream.avail_in;
      }
      if (stream.avail_out == 0) {
        stream.avail_out = static_cast<uInt>(std::min(out_left, kChunk));
        out_left -= stream.avail_out;
      }
      result = inflate(&stream, Z_NO_FLUSH);
      if (result == Z_BUF_ERROR && (stream.avail_in != 0 || in_left != 0) &&
          (stream.avail_out != 0 || out_left != 0)) {
        result = Z_OK;  // progress is still possible
      }
    }
    const uint64_t produced = stream.total_out;
    const std::string zlib_message = stream.msg != nullptr ? stream.msg : "";
    inflateEnd(&stream);
    if (result != Z_STREAM_END) {
      return absl::DataLossError(absl::StrCat(
          source, ": corrupt deflate data (zlib: ", zlib_message,
          result == Z_BUF_ERROR ? "stream ends early or is longer than the recorded size" : "",
          ")"));
    }
    if (produced != member.size) {
      return absl::DataLossError(absl::StrCat(source, ": inflated to ", produced,
                                              " bytes, the directory records ", member.size));
    }
  }
  uint32_t crc = 0;
  for (size_t done = 0; done < out.size();) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(out.size() - done, 1u << 30));
    crc = static_cast<uint32_t>(
        crc32(crc, reinterpret_cast<const Bytef*>(out.data() + done), chunk));
    done += chunk;
  }
  if (crc != member.crc) {
    return absl::DataLossError(absl::StrCat(source, ": CRC-32 mismatch (data is corrupt): expected ",
                                            Hex32(member.crc), ", computed ", Hex32(crc)));
  }
  return out;
}

// ----- array conversion -------------------------------------------------------

template <typename T>
void WidenToFloat(const Tensor& from, Tensor& to) {
  const T* in = from.data<T>();
  float* out = to.data<float>();
  for (int64_t i = 0; i < from.num_elements(); ++i) out[i] = static_cast<float>(in[i]);
}

template <typename T>
void WidenToInt64(const Tensor& from, Tensor& to) {
  const T* in = from.data<T>();
  int64_t* out = to.data<int64_t>();
  for (int64_t i = 0; i < from.num_elements(); ++i) out[i] = static_cast<int64_t>(in[i]);
}
template <typename From, typename To>
void WidenInteger(const Tensor& from, Tensor& to) {
  const From* in = from.data<From>();
  To* out = to.data<To>();
  for (int64_t i = 0; i < from.num_elements(); ++i) out[i] = static_cast<To>(in[i]);
}

bool IsIntegerDType(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

// Whether every value of integer dtype `from` is one of `to` (int32 or int64).
bool IntegerFits(DType from, DType to) {
  if (from == to) return true;
  switch (from) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kUInt16:
      return true;
    case DType::kInt32:
    case DType::kUInt32:
      return to == DType::kInt64;
    default:
      return false;
  }
}

// `array` (an integer dtype IntegerFits into `to`) as `to`.
template <typename To>
Tensor WidenIntegers(const Tensor& array, DType to) {
  Tensor out(to, array.dims());
  switch (array.dtype()) {
    case DType::kInt8: WidenInteger<int8_t, To>(array, out); break;
    case DType::kUInt8: WidenInteger<uint8_t, To>(array, out); break;
    case DType::kInt16: WidenInteger<int16_t, To>(array, out); break;
    case DType::kUInt16: WidenInteger<uint16_t, To>(array, out); break;
    case DType::kInt32: WidenInteger<int32_t, To>(array, out); break;
    case DType::kUInt32: WidenInteger<uint32_t, To>(array, out); break;
    case DType::kInt64: WidenInteger<int64_t, To>(array, out); break;
    default: break;
  }
  return out;
}

// ----- data forms -----------------------------------------------------------

// The first of `names` that exists in `dir`, or "".
std::string FindFile(const fs::path& dir, const std::vector<std::string>& names) {
  std::error_code error;
  for (const std::string& name : names) {
    if (fs::is_regular_file(dir / name, error)) return (dir / name).string();
  }
  return "";
}

// The accepted spellings of an IDX file "train-images-idx3-ubyte": with or
// without .gz, and with '.' before "idx" as the uncompressed MNIST files have.
std::vector<std::string> IdxNames(const std::string& prefix, const std::string& kind) {
  std::vector<std::string> names;
  for (const char* separator : {"-", "."}) {
    const std::string base = absl::StrCat(prefix, separator, kind, "-ubyte");
    names.push_back(base + ".gz");
    names.push_back(base);
  }
  return names;
}

absl::StatusOr<Dataset> LoadIdxPair(const std::string& name, const std::string& images_path,
                                    const std::string& labels_path) {
  CASTOR_ASSIGN_OR_RETURN(Tensor images, ReadIdxImages(images_path));
  CASTOR_ASSIGN_OR_RETURN(Tensor labels, ReadIdxLabels(labels_path));
  absl::StatusOr<Dataset> dataset = MakeDataset(name, std::move(images), std::move(labels));
  if (!dataset.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dataset.status().message(), " (", images_path,
                                                   ", ", labels_path, ")"));
  }
  return dataset;
}

// The pair of arrays in `arrays` under the first matching (images, labels)
// key pair, or nullopt-like empty names.
std::pair<std::string, std::string> FindArrayPair(
    const std::map<std::string, Tensor>& arrays,
    const std::vector<std::pair<std::string, std::string>>& candidates) {
  for (const auto& [images, labels] : candidates) {
    if (arrays.count(images) && arrays.count(labels)) return {images, labels};
  }
  return {"", ""};
}

std::string KeysText(const std::map<std::string, Tensor>& arrays) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : arrays) keys.push_back(key);
  return keys.empty() ? "none" : absl::StrJoin(keys, ", ");
}

absl::StatusOr<Dataset> DatasetFromArrays(std::map<std::string, Tensor>& arrays,
                                          const std::string& path, const std::string& images_key,
                                          const std::string& labels_key, const std::string& name) {
  const std::string images_source = absl::StrCat(path, ":", images_key);
  const std::string labels_source = absl::StrCat(path, ":", labels_key);
  CASTOR_ASSIGN_OR_RETURN(Tensor images,
                          ImagesFromArray(std::move(arrays[images_key]), images_source));
  CASTOR_ASSIGN_OR_RETURN(Tensor labels,
                          LabelsFromArray(std::move(arrays[labels_key]), labels_source));
  absl::StatusOr<Dataset> dataset = MakeDataset(name, std::move(images), std::move(labels));
  if (!dataset.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dataset.status().message(), " (", images_source, ", ", labels_source, ")"));
  }
  dataset->images_source = images_source;
  dataset->labels_source = labels_source;
  return dataset;
}

// One split from an .npz in a data directory: x/y, images/labels, or
// x_<split>/y_<split>.
absl::StatusOr<Dataset> LoadNpzSplit(const std::string& path, const std::string& split,
                                     const std::string& name) {
  CASTOR_ASSIGN_OR_RETURN(auto arrays, ReadNpz(path));
  const auto [images_key, labels_key] = FindArrayPair(
      arrays, {{"x", "y"}, {"images", "labels"}, {"x_" + split, "y_" + split}});
  if (images_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": expected arrays x and y (or images and labels, or x_", split, " and y_", split,
        "); the file has ", KeysText(arrays)));
  }
  return DatasetFromArrays(arrays, path, images_key, labels_key, name);
}

// `array` (the .npz member `source`) as the model input `input` takes it
// (LoadNpzByInputNames).
absl::StatusOr<Tensor> FitArrayToInput(Tensor array, const std::string& source,
                                       const ModelInputSpec& input) {
  std::vector<std::string> want = {"N"};
  for (size_t axis = 1; axis < input.dims.size(); ++axis) {
    want.push_back(input.dims[axis] >= 0 ? absl::StrCat(input.dims[axis]) : "?");
  }
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", DTypeName(array.dtype()), " ", DimsText(array.dims()),
        " does not fit the model input '", input.name, "' (", DTypeName(input.dtype), " [",
        absl::StrJoin(want, ", "), "]): ", why));
  };
  if (array.dims().size() != input.dims.size() || array.dims().empty()) {
    return refuse(absl::StrCat("expected rank ", input.dims.size(), ", samples on axis 0"));
  }
  for (size_t axis = 1; axis < input.dims.size(); ++axis) {
    if (input.dims[axis] >= 0 && input.dims[axis] != array.dims()[axis]) {
      return refuse(absl::StrCat("axis ", axis, " must be ", input.dims[axis]));
    }
  }
  const DType have = array.dtype();
  if (IsFloatingPoint(input.dtype)) {
    if (input.dtype != DType::kFloat32) {
      return refuse("castor train feeds float32 batches; this floating-point input is not float32");
    }
    if (have == DType::kFloat32 || have == DType::kUInt8) return array;  // uint8: pixels
    Tensor widened(DType::kFloat32, array.dims());
    switch (have) {
      case DType::kFloat64: WidenToFloat<double>(array, widened); return widened;
      case DType::kFloat16:
      case DType::kBFloat16: {
        const uint16_t* in = array.data<uint16_t>();
        float* out = widened.data<float>();
        for (int64_t i = 0; i < array.num_elements(); ++i) {
          out[i] = have == DType::kFloat16 ? HalfBitsToFloat(in[i]) : BFloat16BitsToFloat(in[i]);
        }
        return widened;
      }
      default:
        return refuse("a floating-point input takes floating-point arrays or uint8 pixels "
                      "(scaled to [0, 1])");
    }
  }
  if (input.dtype == DType::kInt64 || input.dtype == DType::kInt32) {
    if (!IsIntegerDType(have)) {
      return refuse(absl::StrCat("an integer input takes integer arrays (", DTypeName(input.dtype),
                                 " or narrower)"));
    }
    if (!IntegerFits(have, input.dtype)) {
      return refuse(absl::StrCat("not every ", DTypeName(have), " value is a ",
                                 DTypeName(input.dtype), "; store it as ", DTypeName(input.dtype),
                                 " or narrower"));
    }
    if (have == input.dtype) return array;
    return input.dtype == DType::kInt64 ? WidenIntegers<int64_t>(array, DType::kInt64)
                                        : WidenIntegers<int32_t>(array, DType::kInt32);
  }
  if (input.dtype == DType::kBool) {
    if (have == DType::kBool) return array;
    return refuse("a bool input takes a bool array");
  }
  return refuse("castor train feeds float32, int32, int64 and bool inputs");
}

// One split of the named form: every input's array (`suffix` appended to
// its name) and the labels, of one length.
absl::StatusOr<Dataset> NamedSplit(std::map<std::string, Tensor>& arrays, const std::string& path,
                                   const std::vector<ModelInputSpec>& inputs,
                                   const std::string& suffix, const std::string& split_name,
                                   bool labels_required) {
  Dataset dataset;
  dataset.name = absl::StrCat(path, " ", split_name);
  const std::string labels_key = absl::StrCat(kNamedLabelsArray, suffix);
  auto source = [&](const std::string& key) { return absl::StrCat(path, ":", key); };
  int64_t count = -1;  // the split's length, from the labels or the first input
  std::string count_source;
  if (labels_required) {
    if (!arrays.count(labels_key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": no array '", labels_key, "' (the ", split_name,
          " labels: class indices [N], per-position labels [N, ...] or float targets); the "
          "file has ",
          KeysText(arrays)));
    }
    CASTOR_ASSIGN_OR_RETURN(dataset.labels,
                            LabelsFromArray(std::move(arrays[labels_key]), source(labels_key)));
    dataset.labels_source = source(labels_key);
    count = dataset.labels.dims()[0];
    count_source = source(labels_key);
  }
  bool first = true;
  for (const ModelInputSpec& input : inputs) {
    const std::string key = input.name + suffix;
    if (!arrays.count(key)) {
      if (!input.required) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": the model input '", input.name, "' has no array '", key, "' (", split_name,
          " split); the file has ", KeysText(arrays)));
    }
    CASTOR_ASSIGN_OR_RETURN(Tensor fitted,
                            FitArrayToInput(std::move(arrays[key]), source(key), input));
    if (count < 0) {
      count = fitted.dims()[0];
      count_source = source(key);
    }
    if (fitted.dims()[0] != count) {
      return absl::InvalidArgumentError(absl::StrCat(
          source(key), " has ", fitted.dims()[0], " samples but ", count_source, " has ",
          count, "; every array of a split must have the same length (axis 0)"));
    }
    if (first) {
      dataset.images = std::move(fitted);
      dataset.images_source = source(key);
      dataset.images_input = input.name;
      first = false;
    } else {
      dataset.extra_inputs.emplace_back(input.name, std::move(fitted));
    }
  }
  return dataset;
}

constexpr char kAcceptedForms[] =
    "expected one of: fashion-mnist (" "/usr/share/datasets/fashion-mnist" "), mnist ("
    "/usr/share/datasets/mnist" "), a directory holding the IDX files train-images-idx3-ubyte, "
    "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally "
    ".gz) or train.npz [+ test.npz], an .npz file (x_train, y_train [, x_test, y_test] or x, y), "
    "IMAGES,LABELS, or TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS (.npy or IDX files)";

}  // namespace

std::vector<int64_t> Dataset::sample_dims() const {
  if (images.dims().empty()) return {};
  return std::vector<int64_t>(images.dims().begin() + 1, images.dims().end());
}

absl::StatusOr<Tensor> ReadIdxImages(const std::string& path) {
  return ReadIdx(
      path, kIdxImagesMagic, "uint8 images [N, H, W]", sizeof(uint8_t),
      [](const std::vector<int64_t>& dims) {
        return Tensor(DType::kUInt8, {dims[0], 1, dims[1], dims[2]});
      },
      [](Tensor& tensor, const uint8_t* chunk, size_t count, uint64_t offset) {
        std::memcpy(tensor.data<uint8_t>() + offset, chunk, count);
      });
}

absl::StatusOr<Tensor> ReadIdxLabels(const std::string& path) {
  return ReadIdx(
      path, kIdxLabelsMagic, "uint8 labels [N]", sizeof(int64_t),
      [](const std::vector<int64_t>& dims) { return Tensor(DType::kInt64, {dims[0]}); },
      [](Tensor& tensor, const uint8_t* chunk, size_t count, uint64_t offset) {
        int64_t* out = tensor.data<int64_t>() + offset;
        for (size_t i = 0; i < count; ++i) out[i] = chunk[i];
      });
}

absl::StatusOr<std::map<std::string, Tensor>> ReadNpz(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  CASTOR_ASSIGN_OR_RETURN(std::vector<ZipMember> members, ReadZipDirectory(bytes, path));
  std::map<std::string, Tensor> arrays;
  uint64_t bytes_held = 0;  // by the members read so far: every array is kept
  for (const ZipMember& member : members) {
    if (absl::EndsWith(member.name, "/")) continue;  // a directory entry
    CASTOR_ASSIGN_OR_RETURN(std::string contents,
                            ExtractZipMember(bytes, member, path, bytes_held));
    bytes_held += contents.size();
    CASTOR_ASSIGN_OR_RETURN(Tensor array, ParseNpy(contents, absl::StrCat(path, ":", member.name)));
    std::string key = member.name;
    if (absl::EndsWith(key, ".npy")) key.resize(key.size() - 4);
    arrays[key] = std::move(array);
  }
  return arrays;
}

absl::StatusOr<Tensor> ImagesFromArray(Tensor array, const std::string& source) {
  if (array.dims().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": images must have a leading sample axis [N, ...]; got a scalar"));
  }
  // Integer arrays (token ids) stay as they are: FitDatasetToInput matches
  // them to the model input.
  if (IsIntegerDType(array.dtype()) && array.dtype() != DType::kUInt8) return array;
  std::vector<int64_t> dims = array.dims();
  if (dims.size() == 3) dims.insert(dims.begin() + 1, 1);  // [N, H, W] -> [N, 1, H, W]
  const DType stored = array.dtype() == DType::kUInt8 ? DType::kUInt8 : DType::kFloat32;
  Tensor images(stored, dims);
  switch (array.dtype()) {
    case DType::kFloat32:
    case DType::kUInt8:  // pixels, scaled per batch (GatherBatch)
      if (array.byte_size() > 0) std::memcpy(images.raw(), array.raw(), array.byte_size());
      break;
    case DType::kFloat64:
      WidenToFloat<double>(array, images);
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = array.dtype() == DType::kFloat16;
      const uint16_t* in = array.data<uint16_t>();
      float* out = images.data<float>();
      for (int64_t i = 0; i < array.num_elements(); ++i) {
        out[i] = half ? HalfBitsToFloat(in[i]) : BFloat16BitsToFloat(in[i]);
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": images must be uint8 (scaled to [0, 1]) or floating point, "
                       "or integer ids for an integer model input; got ",
                       DTypeName(array.dtype())));
  }
  return images;
}

absl::StatusOr<Tensor> LabelsFromArray(Tensor array, const std::string& source) {
  std::vector<int64_t> dims = array.dims();
  if (dims.size() == 2 && dims[1] == 1) dims.pop_back();  // [N, 1] -> [N]
  if (dims.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": labels must be class indices of shape [N] (or [N, 1]), or per-position "
                "labels [N, d1, ...]; got a scalar"));
  }
  Tensor labels(DType::kInt64, dims);
  switch (array.dtype()) {
    case DType::kInt64:
      if (array.byte_size() > 0) std::memcpy(labels.raw(), array.raw(), array.byte_size());
      break;
    case DType::kUInt8: WidenToInt64<uint8_t>(array, labels); break;
    case DType::kInt8: WidenToInt64<int8_t>(array, labels); break;
    case DType::kUInt16: WidenToInt64<uint16_t>(array, labels); break;
    case DType::kInt16: WidenToInt64<int16_t>(array, labels); break;
    case DType::kUInt32: WidenToInt64<uint32_t>(array, labels); break;
    case DType::kInt32: WidenToInt64<int32_t>(array, labels); break;
    case DType::kUInt64: WidenToInt64<uint64_t>(array, labels); break;
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16: {
      // Float targets (mse, bce), as they are: no [N, 1] squeeze.
      Tensor targets(DType::kFloat32, array.dims());
      for (int64_t i = 0; i < array.num_elements(); ++i) {
        targets.data<float>()[i] = static_cast<float>(array.GetDouble(i));
      }
      return targets;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": labels must be integer class indices or float targets; got ",
          DTypeName(array.dtype())));
  }
  return labels;
}

absl::StatusOr<Dataset> MakeDataset(std::string name, Tensor images, Tensor labels) {
  if (images.dims().empty() || labels.dims().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": images must be [N, ...] and labels [N, ...]; got images ",
                     DimsText(images.dims()), ", labels ", DimsText(labels.dims())));
  }
  if (images.dims()[0] != labels.dims()[0]) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": label count ", labels.dims()[0],
                                                   " != image count ", images.dims()[0]));
  }
  if (images.dtype() != DType::kFloat32 && !IsIntegerDType(images.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": images must be uint8 pixels or float32 (ImagesFromArray converts others), or "
              "integer ids; got ",
        DTypeName(images.dtype())));
  }
  Dataset dataset;
  dataset.name = std::move(name);
  dataset.images = std::move(images);
  dataset.labels = std::move(labels);
  return dataset;
}

absl::Status FitDatasetToInput(Dataset& dataset, const std::string& input, DType input_dtype) {
  const DType have = dataset.images.dtype();
  const std::string& source = dataset.images_source.empty() ? dataset.name : dataset.images_source;
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", DTypeName(have), " data cannot feed the model input '",
                     input, "' (", DTypeName(input_dtype), "): ", why));
  };
  if (IsFloatingPoint(input_dtype)) {
    if (have == DType::kUInt8 || have == DType::kFloat32) return absl::OkStatus();
    return refuse(
        "inputs of a floating-point model input must be uint8 (scaled to [0, 1]) or floating "
        "point");
  }
  if (input_dtype == DType::kInt64 || input_dtype == DType::kInt32) {
    if (!IsIntegerDType(have)) {
      return refuse(absl::StrCat("an integer input takes integer ids (",
                                 DTypeName(input_dtype), " or narrower)"));
    }
    if (!IntegerFits(have, input_dtype)) {
      return refuse(absl::StrCat("not every ", DTypeName(have), " value is a ",
                                 DTypeName(input_dtype), "; store the ids as ",
                                 DTypeName(input_dtype), " or narrower"));
    }
    if (have != input_dtype) {
      dataset.images = input_dtype == DType::kInt64
                           ? WidenIntegers<int64_t>(dataset.images, DType::kInt64)
                           : WidenIntegers<int32_t>(dataset.images, DType::kInt32);
    }
    return absl::OkStatus();
  }
  return refuse("castor train feeds floating-point inputs (float32 batches) and int32/int64 "
                "ids only");
}

absl::StatusOr<Tensor> ReadArrayFile(const std::string& path, bool as_labels) {
  CASTOR_RETURN_IF_ERROR(RequireRegularFile(path));
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  char magic[6] = {};
  const size_t got = std::fread(magic, 1, sizeof(magic), file);
  std::fclose(file);
  if (got == sizeof(magic) && std::memcmp(magic, "\x93NUMPY", 6) == 0) {
    CASTOR_ASSIGN_OR_RETURN(Tensor array, ReadNpy(path));
    return as_labels ? LabelsFromArray(std::move(array), path)
                     : ImagesFromArray(std::move(array), path);
  }
  if (got >= 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": an .npz archive cannot be one file of an IMAGES,LABELS list; pass it alone"));
  }
  return as_labels ? ReadIdxLabels(path) : ReadIdxImages(path);
}

absl::StatusOr<DataSplits> LoadDataDirectory(const std::string& dir) {
  const fs::path root(dir);
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  DataSplits splits;
  const std::string train_images = FindFile(root, IdxNames("train", "images-idx3"));
  const std::string train_labels = FindFile(root, IdxNames("train", "labels-idx1"));
  if (!train_images.empty() || !train_labels.empty()) {
    if (train_images.empty() || train_labels.empty()) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": has ", train_images.empty() ? train_labels : train_images, " but no ",
          train_images.empty() ? "train-images-idx3-ubyte[.gz]" : "train-labels-idx1-ubyte[.gz]"));
    }
    const std::string test_images = FindFile(root, IdxNames("t10k", "images-idx3"));
    const std::string test_labels = FindFile(root, IdxNames("t10k", "labels-idx1"));
    if (test_images.empty() != test_labels.empty()) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": has ", test_images.empty() ? test_labels : test_images, " but no ",
          test_images.empty() ? "t10k-images-idx3-ubyte[.gz]" : "t10k-labels-idx1-ubyte[.gz]"));
    }
    // Inflating dominates the time: read the test split on a second thread.
    std::future<absl::StatusOr<Dataset>> test;
    if (!test_images.empty()) {
      test = std::async(std::launch::async, LoadIdxPair, absl::StrCat(dir, " test"), test_images,
                        test_labels);
    }
    absl::StatusOr<Dataset> train = LoadIdxPair(absl::StrCat(dir, " train"), train_images,
                                                train_labels);
    if (test.valid()) {
      absl::StatusOr<Dataset> loaded_test = test.get();
      CASTOR_RETURN_IF_ERROR(train.status());
      CASTOR_ASSIGN_OR_RETURN(splits.test, std::move(loaded_test));
    }
    CASTOR_ASSIGN_OR_RETURN(splits.train, std::move(train));
    return splits;
  }
  const std::string train_npz = FindFile(root, {"train.npz"});
  if (!train_npz.empty()) {
    CASTOR_ASSIGN_OR_RETURN(splits.train, LoadNpzSplit(train_npz, "train", train_npz));
    const std::string test_npz = FindFile(root, {"test.npz"});
    if (!test_npz.empty()) {
      CASTOR_ASSIGN_OR_RETURN(splits.test, LoadNpzSplit(test_npz, "test", test_npz));
    }
    return splits;
  }
  return absl::NotFoundError(absl::StrCat(
      dir, ": no training data: expected train-images-idx3-ubyte[.gz] and "
           "train-labels-idx1-ubyte[.gz] (and t10k-images-idx3-ubyte[.gz], "
           "t10k-labels-idx1-ubyte[.gz] for the test split), or train.npz [+ test.npz]"));
}

absl::StatusOr<DataSplits> LoadNpzFile(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(auto arrays, ReadNpz(path));
  DataSplits splits;
  if (arrays.count("x_train") && arrays.count("y_train")) {
    CASTOR_ASSIGN_OR_RETURN(splits.train, DatasetFromArrays(arrays, path, "x_train", "y_train",
                                                            absl::StrCat(path, " train")));
    if (arrays.count("x_test") && arrays.count("y_test")) {
      CASTOR_ASSIGN_OR_RETURN(splits.test, DatasetFromArrays(arrays, path, "x_test", "y_test",
                                                             absl::StrCat(path, " test")));
    }
    return splits;
  }
  const auto [images_key, labels_key] = FindArrayPair(arrays, {{"x", "y"}, {"images", "labels"}});
  if (images_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected arrays x_train and y_train (optionally x_test, y_test), "
                           "or x and y, or images and labels; the file has ",
                     KeysText(arrays)));
  }
  CASTOR_ASSIGN_OR_RETURN(splits.train,
                          DatasetFromArrays(arrays, path, images_key, labels_key, path));
  return splits;
}

absl::StatusOr<std::optional<DataSplits>> LoadNpzByInputNames(
    const std::string& path, const std::vector<ModelInputSpec>& inputs, bool labels_required) {
  CASTOR_ASSIGN_OR_RETURN(auto arrays, ReadNpz(path));
  // The arrays the named form takes: every input's, the labels, and their
  // _test twins.
  std::vector<std::string> expected;
  for (const ModelInputSpec& input : inputs) {
    expected.push_back(input.name);
    expected.push_back(input.name + kTestSuffix);
  }
  if (labels_required) {
    expected.push_back(kNamedLabelsArray);
    expected.push_back(absl::StrCat(kNamedLabelsArray, kTestSuffix));
  }
  auto is_expected = [&](const std::string& key) {
    return std::find(expected.begin(), expected.end(), key) != expected.end();
  };
  bool named = false, all_expected = true;
  for (const ModelInputSpec& input : inputs) named |= arrays.count(input.name) > 0;
  for (const auto& [key, array] : arrays) all_expected &= is_expected(key);
  // A file whose arrays are all the named form's is read as such (a model
  // whose inputs are x and y, say); otherwise the Keras-style forms
  // (x_train/y_train, x/y, images/labels) come first.
  const bool other_form = (arrays.count("x_train") && arrays.count("y_train")) ||
                          !FindArrayPair(arrays, {{"x", "y"}, {"images", "labels"}}).first.empty();
  // Without labels (the model's own loss) the other forms cannot apply.
  if (!named || (other_form && !all_expected && labels_required)) {
    return std::optional<DataSplits>();
  }
  bool has_test = false;
  for (const auto& [key, array] : arrays) {
    if (!is_expected(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": array '", key, "' is neither a model input nor the labels; keyed by input "
          "names, the arrays are ", absl::StrJoin(expected, ", "),
          labels_required ? "" : " (the model computes its own loss: no labels)"));
    }
    has_test |= absl::EndsWith(key, kTestSuffix) &&
                is_expected(key.substr(0, key.size() - std::strlen(kTestSuffix)));
  }
  DataSplits splits;
  CASTOR_ASSIGN_OR_RETURN(splits.train,
                          NamedSplit(arrays, path, inputs, "", "train", labels_required));
  if (has_test) {
    CASTOR_ASSIGN_OR_RETURN(
        splits.test, NamedSplit(arrays, path, inputs, kTestSuffix, "test", labels_required));
  }
  return std::optional<DataSplits>(std::move(splits));
}

absl::StatusOr<DataSplits> LoadData(const std::string& spec) {
  if (spec == "fashion-mnist" || spec == "mnist") {
    const std::string dir = spec == "mnist" ? kMnistDir : kFashionMnistDir;
    std::error_code error;
    if (!fs::is_directory(dir, error)) {
      return absl::NotFoundError(absl::StrCat(
          "--data ", spec, ": ", dir, " does not exist",
          spec == "fashion-mnist" ? " (install Debian's dataset-fashion-mnist package)" : "",
          "; or pass a directory holding the IDX files"));
    }
    CASTOR_ASSIGN_OR_RETURN(DataSplits splits, LoadDataDirectory(dir));
    splits.train.name = absl::StrCat(spec, " train");
    if (splits.has_test()) splits.test.name = absl::StrCat(spec, " test");
    return splits;
  }
  if (absl::StrContains(spec, ',')) {
    const std::vector<std::string> files = absl::StrSplit(spec, ',');
    if (files.size() != 2 && files.size() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data ", spec, ": a file list must be IMAGES,LABELS or TRAIN_IMAGES,TRAIN_LABELS,",
          "TEST_IMAGES,TEST_LABELS; got ", files.size(), " files"));
    }
    DataSplits splits;
    for (size_t split = 0; split * 2 < files.size(); ++split) {
      const std::string& images_path = files[split * 2];
      const std::string& labels_path = files[split * 2 + 1];
      CASTOR_ASSIGN_OR_RETURN(Tensor images, ReadArrayFile(images_path, /*as_labels=*/false));
      CASTOR_ASSIGN_OR_RETURN(Tensor labels, ReadArrayFile(labels_path, /*as_labels=*/true));
      const std::string name = absl::StrCat(images_path, ",", labels_path);
      CASTOR_ASSIGN_OR_RETURN(Dataset dataset,
                              MakeDataset(name, std::move(images), std::move(labels)));
      dataset.images_source = images_path;
      dataset.labels_source = labels_path;
      (split == 0 ? splits.train : splits.test) = std::move(dataset);
    }
    return splits;
  }
  std::error_code error;
  if (fs::is_directory(spec, error)) return LoadDataDirectory(spec);
  if (fs::is_regular_file(spec, error)) {
    if (absl::EndsWith(spec, ".npz")) return LoadNpzFile(spec);
    return absl::InvalidArgumentError(
        absl::StrCat("--data ", spec, ": a single file must be an .npz archive; ", kAcceptedForms));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--data ", spec, ": unknown dataset name, and no such file or directory; ",
                   kAcceptedForms));
}

// ----- batches ----------------------------------------------------------------

std::vector<std::pair<std::string, Tensor>> BatchFeeds(const Batch& batch,
                                                       const std::string& input) {
  std::vector<std::pair<std::string, Tensor>> feeds = {{input, batch.images}};
  for (const auto& [name, tensor] : batch.extra_inputs) feeds.emplace_back(name, tensor);
  return feeds;
}

Batch GatherBatch(const Dataset& dataset, const std::vector<int64_t>& indices) {
  Batch batch;
  const int64_t count = static_cast<int64_t>(indices.size());
  std::vector<int64_t> image_dims = dataset.images.dims();
  image_dims[0] = count;
  const bool pixels = dataset.images.dtype() == DType::kUInt8;
  // Pixels become float32; float32 and integer inputs (token ids) are copied.
  batch.images = Tensor(pixels ? DType::kFloat32 : dataset.images.dtype(), image_dims);
  std::vector<int64_t> label_dims = dataset.labels.dims();
  if (!label_dims.empty()) {
    label_dims[0] = count;
    batch.labels = Tensor(dataset.labels.dtype(), label_dims);
  }
  const int64_t rows = std::max<int64_t>(dataset.size(), 1);
  const int64_t row_elements = dataset.images.num_elements() / rows;
  const size_t row_bytes = dataset.images.byte_size() / rows;
  const size_t label_bytes = dataset.labels.byte_size() / rows;
  const float* scale = PixelScaleTable();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = indices[i];
    if (pixels) {
      float* out = batch.images.data<float>() + i * row_elements;
      const uint8_t* in = dataset.images.data<uint8_t>() + row * row_elements;
      for (int64_t j = 0; j < row_elements; ++j) out[j] = scale[in[j]];
    } else {
      std::memcpy(batch.images.raw() + i * row_bytes, dataset.images.raw() + row * row_bytes,
                  row_bytes);
    }
    if (label_bytes > 0) {
      std::memcpy(batch.labels.raw() + i * label_bytes, dataset.labels.raw() + row * label_bytes,
                  label_bytes);
    }
  }
  for (const auto& [name, source] : dataset.extra_inputs) {
    // uint8 stays only for a floating-point input (pixels, scaled).
    const bool scaled = source.dtype() == DType::kUInt8;
    std::vector<int64_t> dims = source.dims();
    dims[0] = count;
    Tensor rows_out(scaled ? DType::kFloat32 : source.dtype(), dims);
    const int64_t elements = source.num_elements() / rows;
    const size_t bytes = source.byte_size() / rows;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = indices[i];
      if (scaled) {
        float* out = rows_out.data<float>() + i * elements;
        const uint8_t* in = source.data<uint8_t>() + row * elements;
        for (int64_t j = 0; j < elements; ++j) out[j] = scale[in[j]];
      } else {
        std::memcpy(rows_out.raw() + i * bytes, source.raw() + row * bytes, bytes);
      }
    }
    batch.extra_inputs.emplace_back(name, std::move(rows_out));
  }
  batch.indices = indices;
  return batch;
}

absl::StatusOr<BatchIterator> BatchIterator::Create(const Dataset& dataset, BatchOptions options,
                                                    int64_t epoch, int64_t position) {
  const int64_t size = dataset.size();
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(dataset.name, ": batch size must be positive; got ", options.batch_size));
  }
  if (size <= 0 || dataset.images.dims().empty() || dataset.images.dims()[0] != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(dataset.name, ": cannot batch: ", size, " labels for images ",
                     DimsText(dataset.images.dims())));
  }
  if (options.drop_last && size < options.batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        dataset.name, ": drop_last with batch size ", options.batch_size, " leaves no batch of ",
        size, " samples"));
  }
  if (epoch < 0 || position < 0 || position > size) {
    return absl::InvalidArgumentError(absl::StrCat(dataset.name, ": cannot resume at epoch ",
                                                   epoch, ", position ", position, " (", size,
                                                   " samples per epoch)"));
  }
  BatchIterator iterator(dataset, options);
  iterator.StartEpoch(epoch);
  iterator.position_ = position;
  iterator.RollOverIfDone();
  return iterator;
}

std::vector<int64_t> BatchIterator::EpochOrder(int64_t size, const BatchOptions& options,
                                               int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!options.shuffle) return order;
  std::mt19937_64 engine(options.seed + static_cast<uint64_t>(epoch));
  // Unbiased draw in [0, bound): reject the 2^64 mod bound lowest values.
  auto draw = [&engine](uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (true) {
      const uint64_t value = engine();
      if (value >= threshold) return value % bound;
    }
  };
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[draw(i)]);
  }
  return order;
}

void BatchIterator::StartEpoch(int64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  order_ = EpochOrder(dataset_->size(), options_, epoch);
}

void BatchIterator::RollOverIfDone() {
  const int64_t remaining = dataset_->size() - position_;
  if (remaining == 0 || (options_.drop_last && remaining < options_.batch_size)) {
    StartEpoch(epoch_ + 1);
  }
}

int64_t BatchIterator::batches_per_epoch() const {
  const int64_t size = dataset_->size();
  return options_.drop_last ? size / options_.batch_size
                            : (size + options_.batch_size - 1) / options_.batch_size;
}

Batch BatchIterator::Next() {
  const int64_t count = std::min(options_.batch_size, dataset_->size() - position_);
  std::vector<int64_t> indices(order_.begin() + position_, order_.begin() + position_ + count);
  Batch batch = GatherBatch(*dataset_, indices);
  batch.epoch = epoch_;
  batch.position = position_;
  position_ += count;
  RollOverIfDone();
  return batch;
}

std::vector<int64_t> RankShard(const std::vector<int64_t>& batch_indices,
                               const std::vector<int64_t>& epoch_order, int rank,
                               int world_size) {
  std::vector<int64_t> padded = batch_indices;
  for (size_t k = 0; padded.size() % static_cast<size_t>(world_size) != 0; ++k) {
    padded.push_back(epoch_order[k % epoch_order.size()]);
  }
  std::vector<int64_t> shard;
  const size_t stride = static_cast<size_t>(world_size);
  for (size_t k = static_cast<size_t>(rank); k < padded.size(); k += stride) {
    shard.push_back(padded[k]);
  }
  return shard;
}

}  // namespace castor::training
