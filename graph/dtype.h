// Element types castor carries. The enumerator values are ONNX's
// TensorProto.DataType codes, so conversion to and from ONNX is a cast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace castor {

enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kBFloat16 = 16,
};

// "float32", "float16", "bfloat16", "int64", ... ("undefined" for kUndefined).
const char* DTypeName(DType dtype);

// Inverse of DTypeName; also accepts ONNX spellings ("FLOAT", "FLOAT16",
// "BFLOAT16", "INT64", "DOUBLE", ...). Error names the unknown spelling.
absl::StatusOr<DType> DTypeFromName(const std::string& name);

// An ONNX TensorProto.DataType code castor can carry, or an error naming the
// ONNX type (e.g. FLOAT8E4M3FN, COMPLEX64) that it cannot.
absl::StatusOr<DType> DTypeFromOnnx(int32_t onnx_code);
inline int32_t DTypeToOnnx(DType dtype) { return static_cast<int32_t>(dtype); }

// Bytes per element; 0 for kString and kUndefined (not fixed-size).
size_t DTypeSize(DType dtype);

bool IsFloatingPoint(DType dtype);  // float16, bfloat16, float32, float64
bool IsLowPrecisionFloat(DType dtype);  // float16, bfloat16
bool IsInteger(DType dtype);  // signed or unsigned integers (not bool)
bool IsSignedInteger(DType dtype);

}  // namespace castor
