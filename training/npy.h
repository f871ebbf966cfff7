// NumPy .npy files for the CLI's tensor inputs and outputs, and one loader
// for tensor files of either kind (.npy, or an ONNX TensorProto .pb).
//
// Reads format versions 1.0, 2.0 and 3.0, little-endian, C order, with
// dtypes <f4 <f8 <f2 <i8 <i4 <i2 |i1 <u8 <u4 <u2 |u1 |b1 ('=' and '|' byte
// orders are accepted where they mean the same). Writes version 1.0 (2.0
// when the header needs it).
//
// bfloat16: NumPy has no bfloat16, so a bfloat16 tensor is written as
// float32 ('<f4'). Every bfloat16 value is exactly representable in
// float32, so nothing is lost but the dtype tag.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/tensor.h"

namespace castor::training {

// Parses the bytes of a .npy file; `source` names it in errors (bad magic,
// unsupported version or dtype, Fortran order, big-endian, truncated data).
absl::StatusOr<Tensor> ParseNpy(std::string_view bytes, const std::string& source);
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// The .npy bytes of `tensor` (bfloat16 as float32; strings are an error).
absl::StatusOr<std::string> SerializeNpy(const Tensor& tensor);
// Writes atomically (temporary file, fsync, rename).
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

// A .npy file or an ONNX TensorProto (.pb), chosen by extension; any other
// extension is an error naming the file.
absl::StatusOr<Tensor> LoadTensorFile(const std::string& path);

}  // namespace castor::training
