// Float64 sums over long runs of values, in independent lanes.
//
// A plain `for (i) sum += term(i)` in float64 waits on the previous add at
// every element (and without reassociation the compiler may not split it).
// LaneSums keeps kSumLanes partial sums per quantity: within each Add, lane
// l takes terms l, l + kSumLanes, ... and the leftover terms go to lanes
// 0, 1, ...; Total() adds the lanes pairwise. The adds then pipeline and
// vectorise. Accumulation stays float64 over the same terms, but in another
// order than the plain loop, so totals may differ from it in the last bits;
// for a given sequence of Add calls they are always the same.
//
//   LaneSums<2> sums;  // sum(x) and sum(x * x) in one pass
//   sums.Add(n, [&](int64_t i) { const double v = x[i]; return std::array{v, v * v}; });
//   double total = sums.Total(0), squares = sums.Total(1);
#pragma once

#include <array>
#include <cstdint>

namespace castor::cpu {

inline constexpr int kSumLanes = 8;

// The total of kSumLanes lane sums, added pairwise (LaneSums::Total's
// order; vector loops that keep the lanes in a register use it too).
inline double AddLanesPairwise(const double* v) {
  static_assert(kSumLanes == 8, "the lanes are added pairwise in three rounds");
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

template <int kCount>
class LaneSums {
 public:
  // Adds terms(i) for i in [0, n); terms returns std::array<double, kCount>.
  template <typename Terms>
  void Add(int64_t n, Terms&& terms) {
    int64_t i = 0;
    for (; i + kSumLanes <= n; i += kSumLanes) {
      for (int l = 0; l < kSumLanes; ++l) {
        const std::array<double, kCount> t = terms(i + l);
        for (int q = 0; q < kCount; ++q) lanes_[q][l] += t[q];
      }
    }
    for (int l = 0; i < n; ++i, ++l) {
      const std::array<double, kCount> t = terms(i);
      for (int q = 0; q < kCount; ++q) lanes_[q][l] += t[q];
    }
  }

  // Quantity q summed over every term added so far.
  double Total(int q) const { return AddLanesPairwise(lanes_[q]); }

 private:
  double lanes_[kCount][kSumLanes] = {};
};

}  // namespace castor::cpu
