// Tensor: a host-resident, densely packed, row-major array with a dtype and
// static dims. Initializers, Constant values and attribute tensors are
// Tensors. 16-bit floats are stored as their 16-bit patterns (uint16_t);
// bool as one byte per element; strings in a separate vector.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/shape.h"

namespace castor {

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled tensor.
  Tensor(DType dtype, std::vector<int64_t> dims);

  // Copies `values` (element type must match `dtype`'s storage type, one
  // value per element; a mismatch is a programming error and aborts).
  template <typename T>
  static Tensor FromVector(DType dtype, std::vector<int64_t> dims, const std::vector<T>& values) {
    Tensor t(dtype, std::move(dims));
    if (sizeof(T) != DTypeSize(dtype) || static_cast<int64_t>(values.size()) != t.num_elements_) {
      FromVectorMismatch(t, values.size(), sizeof(T));
    }
    std::memcpy(t.bytes_.data(), values.data(), t.bytes_.size());
    return t;
  }
  static Tensor Scalar(float value);
  static Tensor Int64s(const std::vector<int64_t>& values);  // 1-D int64

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  Shape shape() const { return Shape::FromDims(dims_); }
  int64_t num_elements() const { return num_elements_; }
  size_t byte_size() const { return bytes_.size(); }

  uint8_t* raw() { return bytes_.data(); }
  const uint8_t* raw() const { return bytes_.data(); }
  template <typename T>
  T* data() { return reinterpret_cast<T*>(bytes_.data()); }
  template <typename T>
  const T* data() const { return reinterpret_cast<const T*>(bytes_.data()); }

  // Elements of a kString tensor (num_elements() of them).
  std::vector<std::string>& strings() { return strings_; }
  const std::vector<std::string>& strings() const { return strings_; }

  // Element `i` converted to double / int64 (any numeric dtype). For small
  // tensors read at graph-build time (shapes, axes, scalars), not kernels.
  double GetDouble(int64_t i) const;
  int64_t GetInt64(int64_t i) const;
  std::vector<int64_t> ToInt64Vector() const;

  // Same dtype, dims and bytes (NaN patterns compare by bits).
  bool operator==(const Tensor& other) const;
  bool operator!=(const Tensor& other) const { return !(*this == other); }

 private:
  // Prints what FromVector was given versus what `t` needs, then aborts.
  [[noreturn]] static void FromVectorMismatch(const Tensor& t, size_t value_count,
                                              size_t value_size);

  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> dims_;
  int64_t num_elements_ = 0;
  std::vector<uint8_t> bytes_;
  std::vector<std::string> strings_;
};

}  // namespace castor
