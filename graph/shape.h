// Tensor shapes whose dimensions may be static (28), symbolic ("N",
// "batch") or unknown, and whose rank itself may be unknown. Mirrors ONNX's
// TensorShapeProto (dim_value / dim_param / neither).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace castor {

class Dim {
 public:
  Dim() = default;  // unknown
  Dim(int64_t value) : value_(value) {}  // NOLINT: a number is a static dim
  static Dim Symbol(std::string symbol);
  static Dim Unknown() { return Dim(); }

  bool is_static() const { return value_ >= 0; }
  bool is_symbolic() const { return value_ < 0 && !symbol_.empty(); }
  bool is_unknown() const { return value_ < 0 && symbol_.empty(); }
  int64_t value() const { return value_; }  // -1 unless static
  const std::string& symbol() const { return symbol_; }

  // "28", "N" or "?".
  std::string ToString() const;
  bool operator==(const Dim& other) const {
    return value_ == other.value_ && symbol_ == other.symbol_;
  }
  bool operator!=(const Dim& other) const { return !(*this == other); }

 private:
  int64_t value_ = -1;
  std::string symbol_;
};

class Shape {
 public:
  Shape() = default;  // unknown rank
  explicit Shape(std::vector<Dim> dims) : dims_(std::move(dims)), rank_known_(true) {}
  Shape(std::initializer_list<Dim> dims) : dims_(dims), rank_known_(true) {}
  static Shape Unknown() { return Shape(); }
  static Shape Scalar() { return Shape(std::vector<Dim>{}); }
  static Shape FromDims(const std::vector<int64_t>& dims);

  bool rank_known() const { return rank_known_; }
  int rank() const { return static_cast<int>(dims_.size()); }  // 0 if unknown
  const Dim& operator[](int i) const { return dims_[i]; }
  Dim& operator[](int i) { return dims_[i]; }
  const std::vector<Dim>& dims() const { return dims_; }

  // True when the rank and every dimension are known numbers.
  bool is_static() const;
  // Static dims as numbers; nullopt unless is_static().
  std::optional<std::vector<int64_t>> StaticDims() const;
  // Product of the dims; nullopt unless is_static().
  std::optional<int64_t> NumElements() const;

  // True when both ranks are known and each pair of dims is the same
  // number or the same symbol: the shapes are equal whatever the inputs
  // (an unknown dim proves nothing, though operator== calls two alike).
  bool ProvablyEquals(const Shape& other) const;

  // "[N,1,28,28]", "[]" for a scalar, "?" for unknown rank.
  std::string ToString() const;
  // Structural equality (unknown dims and ranks compare equal to each other).
  bool operator==(const Shape& other) const {
    return rank_known_ == other.rank_known_ && dims_ == other.dims_;
  }
  bool operator!=(const Shape& other) const { return !(*this == other); }

 private:
  std::vector<Dim> dims_;
  bool rank_known_ = false;
};

}  // namespace castor
