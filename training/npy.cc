// .npy reading and writing (see npy.h): the header dictionary, the dtype
// descriptors, and the size checks that catch truncated files.
#include "training/npy.h"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/status.h"

namespace castor::training {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct Descr {
  const char* code;  // without the byte-order character
  DType dtype;
};
constexpr Descr kDescrs[] = {
    {"f4", DType::kFloat32}, {"f8", DType::kFloat64}, {"f2", DType::kFloat16},
    {"i8", DType::kInt64},   {"i4", DType::kInt32},   {"i2", DType::kInt16},
    {"i1", DType::kInt8},    {"u8", DType::kUInt64},  {"u4", DType::kUInt32},
    {"u2", DType::kUInt16},  {"u1", DType::kUInt8},   {"b1", DType::kBool},
};

absl::Status Malformed(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid .npy file: ", what));
}

absl::StatusOr<DType> DTypeFromDescr(const std::string& descr, const std::string& source) {
  if (descr.size() == 3) {
    const char order = descr[0];
    const std::string code = descr.substr(1);
    if (order == '>' && code[1] != '1') {
      return absl::UnimplementedError(
          absl::StrCat(source, ": big-endian dtype '", descr, "' is not supported"));
    }
    for (const Descr& d : kDescrs) {
      if (code == d.code && (order == '<' || order == '|' || order == '=' || order == '>')) {
        return d.dtype;
      }
    }
  }
  return absl::UnimplementedError(
      absl::StrCat(source, ": unsupported dtype '", descr,
                   "' (supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 <u8 <u4 <u2 |u1 |b1)"));
}

std::string DescrOf(DType dtype) {
  for (const Descr& d : kDescrs) {
    if (d.dtype == dtype) return absl::StrCat(DTypeSize(dtype) == 1 ? "|" : "<", d.code);
  }
  return "";
}

// The text after `'key':` in the header dict, or "" when absent.
std::string ValueOf(const std::string& header, const std::string& key) {
  for (const char* quote : {"'", "\""}) {
    const std::string pattern = absl::StrCat(quote, key, quote);
    size_t at = header.find(pattern);
    if (at == std::string::npos) continue;
    at = header.find(':', at + pattern.size());
    if (at == std::string::npos) return "";
    ++at;
    while (at < header.size() && std::isspace(static_cast<unsigned char>(header[at]))) ++at;
    return header.substr(at);
  }
  return "";
}

absl::StatusOr<std::string> ParseDescr(const std::string& header, const std::string& source) {
  const std::string value = ValueOf(header, "descr");
  if (value.empty() || (value[0] != '\'' && value[0] != '"')) {
    return Malformed(source, "header has no 'descr' string (structured dtypes are not supported)");
  }
  const size_t end = value.find(value[0], 1);
  if (end == std::string::npos) return Malformed(source, "unterminated 'descr' string");
  return value.substr(1, end - 1);
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& header,
                                                const std::string& source) {
  const std::string value = ValueOf(header, "shape");
  const size_t end = value.find(')');
  if (value.empty() || value[0] != '(' || end == std::string::npos) {
    return Malformed(source, "header has no 'shape' tuple");
  }
  std::vector<int64_t> dims;
  std::stringstream items(value.substr(1, end - 1));
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t first = item.find_first_not_of(" \t");
    if (first == std::string::npos) continue;  // the trailing comma of "(3,)"
    const std::string digits = item.substr(first, item.find_last_not_of(" \tL") - first + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      return Malformed(source, absl::StrCat("bad dimension '", item, "' in shape"));
    }
    int64_t dim = 0;
    if (!absl::SimpleAtoi(digits, &dim)) {  // more than int64 holds
      return Malformed(source, absl::StrCat("dimension ", digits, " in shape is too large"));
    }
    dims.push_back(dim);
  }
  return dims;
}

// Splits the file into its header dictionary and its data.
absl::Status SplitHeader(std::string_view bytes, const std::string& source, std::string* header,
                         std::string_view* data) {
  if (bytes.size() < kMagicSize + 4 ||
      bytes.substr(0, kMagicSize) != std::string_view(kMagic, kMagicSize)) {
    return Malformed(source, "bad magic (expected \\x93NUMPY)");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  const size_t length_bytes = major == 1 ? 2 : (major == 2 || major == 3) ? 4 : 0;
  if (length_bytes == 0) {
    return absl::UnimplementedError(absl::StrCat(source, ": unsupported .npy format version ",
                                                 major, ".", static_cast<uint8_t>(bytes[7])));
  }
  size_t header_length = 0;
  if (bytes.size() < 8 + length_bytes) return Malformed(source, "truncated header");
  for (size_t i = 0; i < length_bytes; ++i) {
    header_length |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
  }
  const size_t data_offset = 8 + length_bytes + header_length;
  if (bytes.size() < data_offset) {
    return Malformed(source,
                     absl::StrCat("truncated header (", header_length, " bytes announced)"));
  }
  *header = std::string(bytes.substr(8 + length_bytes, header_length));
  *data = bytes.substr(data_offset);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

absl::StatusOr<Tensor> ParseNpy(std::string_view bytes, const std::string& source) {
  std::string header;
  std::string_view data;
  CASTOR_RETURN_IF_ERROR(SplitHeader(bytes, source, &header, &data));
  CASTOR_ASSIGN_OR_RETURN(std::string descr, ParseDescr(header, source));
  CASTOR_ASSIGN_OR_RETURN(DType dtype, DTypeFromDescr(descr, source));
  if (absl::StartsWith(ValueOf(header, "fortran_order"), "True")) {
    return absl::UnimplementedError(absl::StrCat(
        source, ": Fortran-order arrays are not supported (save with np.ascontiguousarray)"));
  }
  if (!absl::StartsWith(ValueOf(header, "fortran_order"), "False")) {
    return Malformed(source, "header has no 'fortran_order' True/False");
  }
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ParseShape(header, source));
  // The data the shape declares must be the data the file holds, checked
  // before anything is allocated: a 128-byte header-only file declaring
  // (2^62, 1, 28, 28) must not overflow to 0 bytes, nor allocate.
  uint64_t needed = DTypeSize(dtype);
  bool overflows = false;
  for (int64_t d : dims) {
    if (d != 0 && needed > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      overflows = true;
    }
    needed *= static_cast<uint64_t>(d);
  }
  if (overflows || data.size() != needed) {
    return Malformed(source,
                     absl::StrCat(overflows || data.size() < needed ? "truncated: " : "", "shape (",
                                  absl::StrJoin(dims, ","), ") of ", DTypeName(dtype), " needs ",
                                  overflows ? std::string("more than 2^64") : absl::StrCat(needed),
                                  " data bytes, the file has ", data.size()));
  }
  Tensor tensor(dtype, dims);
  if (tensor.byte_size() > 0) std::memcpy(tensor.raw(), data.data(), tensor.byte_size());
  return tensor;
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return ParseNpy(bytes, path);
}

absl::StatusOr<std::string> SerializeNpy(const Tensor& tensor) {
  if (tensor.dtype() == DType::kBFloat16) {
    Tensor widened(DType::kFloat32, tensor.dims());
    for (int64_t i = 0; i < tensor.num_elements(); ++i) {
      widened.data<float>()[i] = BFloat16BitsToFloat(tensor.data<uint16_t>()[i]);
    }
    return SerializeNpy(widened);
  }
  const std::string descr = DescrOf(tensor.dtype());
  if (descr.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("cannot write a ", DTypeName(tensor.dtype()), " tensor as .npy"));
  }
  std::string shape;
  for (int64_t d : tensor.dims()) absl::StrAppend(&shape, d, ", ");
  if (tensor.dims().size() > 1)
    shape.resize(shape.size() - 2);  // "(3,)" keeps its comma
  else if (!shape.empty())
    shape.pop_back();
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad with spaces so the data starts at a multiple of 64; end with '\n'.
  const bool v2 = header.size() + 1 + 10 > 65535;
  const size_t prefix = kMagicSize + 2 + (v2 ? 4 : 2);
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicSize);
  out.push_back(v2 ? 2 : 1);
  out.push_back(0);
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i)
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  out += header;
  out.append(reinterpret_cast<const char*>(tensor.raw()), tensor.byte_size());
  return out;
}

absl::Status WriteNpy(const std::string& path, const Tensor& tensor) {
  absl::StatusOr<std::string> bytes = SerializeNpy(tensor);
  if (!bytes.ok())
    return absl::Status(bytes.status().code(), absl::StrCat(path, ": ", bytes.status().message()));
  return WriteFileAtomically(path, *bytes);
}

absl::StatusOr<Tensor> LoadTensorFile(const std::string& path) {
  if (absl::EndsWith(path, ".npy")) return ReadNpy(path);
  if (absl::EndsWith(path, ".pb")) return LoadTensorProtoFile(path);
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown tensor file type (expected .npy, or .pb for an ONNX TensorProto)"));
}

}  // namespace castor::training
