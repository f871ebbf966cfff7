// DType names, sizes and ONNX code mapping.
#include "graph/dtype.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace castor {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;       // castor's spelling
  const char* onnx_name;  // TensorProto.DataType enumerator
  size_t size;
};

constexpr std::array<DTypeInfo, 14> kDTypes = {{
    {DType::kFloat32, "float32", "FLOAT", 4},
    {DType::kUInt8, "uint8", "UINT8", 1},
    {DType::kInt8, "int8", "INT8", 1},
    {DType::kUInt16, "uint16", "UINT16", 2},
    {DType::kInt16, "int16", "INT16", 2},
    {DType::kInt32, "int32", "INT32", 4},
    {DType::kInt64, "int64", "INT64", 8},
    {DType::kString, "string", "STRING", 0},
    {DType::kBool, "bool", "BOOL", 1},
    {DType::kFloat16, "float16", "FLOAT16", 2},
    {DType::kFloat64, "float64", "DOUBLE", 8},
    {DType::kUInt32, "uint32", "UINT32", 4},
    {DType::kUInt64, "uint64", "UINT64", 8},
    {DType::kBFloat16, "bfloat16", "BFLOAT16", 2},
}};

const DTypeInfo* Find(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

// ONNX types castor does not carry, for error messages.
const char* UncarriedOnnxName(int32_t code) {
  switch (code) {
    case 14: return "COMPLEX64";
    case 15: return "COMPLEX128";
    case 17: return "FLOAT8E4M3FN";
    case 18: return "FLOAT8E4M3FNUZ";
    case 19: return "FLOAT8E5M2";
    case 20: return "FLOAT8E5M2FNUZ";
    case 21: return "UINT4";
    case 22: return "INT4";
    case 23: return "FLOAT4E2M1";
    default: return "";
  }
}

}  // namespace

const char* DTypeName(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info ? info->name : "undefined";
}

absl::StatusOr<DType> DTypeFromName(const std::string& name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name || name == info.onnx_name ||
        absl::AsciiStrToUpper(name) == info.onnx_name) {
      return info.dtype;
    }
  }
  if (name == "float" || name == "fp32") return DType::kFloat32;
  if (name == "half" || name == "fp16") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "double") return DType::kFloat64;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "' (expected float32, float16, bfloat16, float64, int8, "
                   "int16, int32, int64, uint8, uint16, uint32, uint64, bool or string)"));
}

absl::StatusOr<DType> DTypeFromOnnx(int32_t onnx_code) {
  if (const DTypeInfo* info = Find(static_cast<DType>(onnx_code))) return info->dtype;
  std::string name = UncarriedOnnxName(onnx_code);
  if (onnx_code == 0) name = "UNDEFINED";
  return absl::UnimplementedError(absl::StrCat(
      "ONNX element type ", name.empty() ? "" : absl::StrCat(name, " "), "(code ",
      onnx_code, ") is not supported by castor"));
}

size_t DTypeSize(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info ? info->size : 0;
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16 || dtype == DType::kFloat64;
}

bool IsLowPrecisionFloat(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

bool IsSignedInteger(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kInt16 || dtype == DType::kInt32 ||
         dtype == DType::kInt64;
}

bool IsInteger(DType dtype) {
  return IsSignedInteger(dtype) || dtype == DType::kUInt8 || dtype == DType::kUInt16 ||
         dtype == DType::kUInt32 || dtype == DType::kUInt64;
}

}  // namespace castor
