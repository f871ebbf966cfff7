// Tensor storage and element access for graph-build-time reads.
#include "graph/tensor.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_join.h"
#include "graph/half.h"

namespace castor {

Tensor::Tensor(DType dtype, std::vector<int64_t> dims)
    : dtype_(dtype), dims_(std::move(dims)) {
  num_elements_ = 1;
  for (int64_t d : dims_) num_elements_ *= d;
  if (dtype_ == DType::kString) {
    strings_.resize(num_elements_);
  } else {
    bytes_.assign(static_cast<size_t>(num_elements_) * DTypeSize(dtype_), 0);
  }
}

void Tensor::FromVectorMismatch(const Tensor& t, size_t value_count, size_t value_size) {
  std::fprintf(stderr,
               "Tensor::FromVector: %zu values of %zu-byte type for a %s tensor of dims [%s] "
               "(%lld elements of %zu bytes)\n",
               value_count, value_size, DTypeName(t.dtype_), absl::StrJoin(t.dims_, ",").c_str(),
               static_cast<long long>(t.num_elements_), DTypeSize(t.dtype_));
  std::abort();
}

Tensor Tensor::Scalar(float value) {
  return FromVector<float>(DType::kFloat32, {}, {value});
}

Tensor Tensor::Int64s(const std::vector<int64_t>& values) {
  return FromVector<int64_t>(DType::kInt64, {static_cast<int64_t>(values.size())}, values);
}

double Tensor::GetDouble(int64_t i) const {
  switch (dtype_) {
    case DType::kFloat32: return data<float>()[i];
    case DType::kFloat64: return data<double>()[i];
    case DType::kFloat16: return HalfBitsToFloat(data<uint16_t>()[i]);
    case DType::kBFloat16: return BFloat16BitsToFloat(data<uint16_t>()[i]);
    case DType::kInt8: return data<int8_t>()[i];
    case DType::kInt16: return data<int16_t>()[i];
    case DType::kInt32: return data<int32_t>()[i];
    case DType::kInt64: return static_cast<double>(data<int64_t>()[i]);
    case DType::kUInt8: return data<uint8_t>()[i];
    case DType::kUInt16: return data<uint16_t>()[i];
    case DType::kUInt32: return data<uint32_t>()[i];
    case DType::kUInt64: return static_cast<double>(data<uint64_t>()[i]);
    case DType::kBool: return data<uint8_t>()[i] != 0 ? 1.0 : 0.0;
    default: return 0.0;
  }
}

int64_t Tensor::GetInt64(int64_t i) const {
  switch (dtype_) {
    case DType::kInt64: return data<int64_t>()[i];
    case DType::kInt32: return data<int32_t>()[i];
    case DType::kUInt64: return static_cast<int64_t>(data<uint64_t>()[i]);
    default: return static_cast<int64_t>(GetDouble(i));
  }
}

std::vector<int64_t> Tensor::ToInt64Vector() const {
  std::vector<int64_t> result(num_elements_);
  for (int64_t i = 0; i < num_elements_; ++i) result[i] = GetInt64(i);
  return result;
}

bool Tensor::operator==(const Tensor& other) const {
  return dtype_ == other.dtype_ && dims_ == other.dims_ && bytes_ == other.bytes_ &&
         strings_ == other.strings_;
}

}  // namespace castor
