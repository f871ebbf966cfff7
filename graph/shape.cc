// Dim and Shape printing and static-size queries.
#include "graph/shape.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castor {

Dim Dim::Symbol(std::string symbol) {
  Dim dim;
  dim.symbol_ = std::move(symbol);
  return dim;
}

std::string Dim::ToString() const {
  if (is_static()) return absl::StrCat(value_);
  if (is_symbolic()) return symbol_;
  return "?";
}

Shape Shape::FromDims(const std::vector<int64_t>& dims) {
  std::vector<Dim> result;
  result.reserve(dims.size());
  for (int64_t d : dims) result.emplace_back(d);
  return Shape(std::move(result));
}

bool Shape::is_static() const {
  if (!rank_known_) return false;
  for (const Dim& d : dims_) {
    if (!d.is_static()) return false;
  }
  return true;
}

std::optional<std::vector<int64_t>> Shape::StaticDims() const {
  if (!is_static()) return std::nullopt;
  std::vector<int64_t> result;
  result.reserve(dims_.size());
  for (const Dim& d : dims_) result.push_back(d.value());
  return result;
}

std::optional<int64_t> Shape::NumElements() const {
  if (!is_static()) return std::nullopt;
  int64_t n = 1;
  for (const Dim& d : dims_) n *= d.value();
  return n;
}

bool Shape::ProvablyEquals(const Shape& other) const {
  if (!rank_known_ || !other.rank_known_ || dims_.size() != other.dims_.size()) return false;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].is_unknown() || dims_[i] != other.dims_[i]) return false;
  }
  return true;
}

std::string Shape::ToString() const {
  if (!rank_known_) return "?";
  return absl::StrCat("[", absl::StrJoin(dims_, ",", [](std::string* out, const Dim& d) {
                        out->append(d.ToString());
                      }),
                      "]");
}

}  // namespace castor
