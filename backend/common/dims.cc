// Small helpers over tensor dims that both backends use (see dims.h).
#include "backend/common/dims.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castor::common {

std::string DimsToString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

absl::StatusOr<std::vector<int64_t>> BroadcastDims(
    const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const std::vector<int64_t>& s = shapes[k];
    const size_t pad = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[pad + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o == 1) {
        o = s[i];
        continue;
      }
      std::vector<std::string> all;
      for (const auto& t : shapes) all.push_back(DimsToString(t));
      return absl::InvalidArgumentError(absl::StrCat(
          "shapes ", absl::StrJoin(all, ", "), " do not broadcast: input ", k, " has ", s[i],
          " at output axis ", pad + i, " where another input has ", o));
    }
  }
  return out;
}

bool BroadcastsTo(const std::vector<int64_t>& dims, const std::vector<int64_t>& to) {
  if (dims.size() > to.size()) return false;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[dims.size() - 1 - i];
    if (d != 1 && d != to[to.size() - 1 - i]) return false;
  }
  return true;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * dims[i + 1];
  }
  return strides;
}

int64_t DimsProduct(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p *= dims[i];
  return p;
}

}  // namespace castor::common
