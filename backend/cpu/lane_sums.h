// Float64 sums over long runs of values, in independent lanes.
//
// A plain `for (i) sum += term(i)` in float64 waits on the previous add at
// every element (and without reassociation the compiler may not split it).
// LaneSums keeps kLanes (by default kSumLanes) partial sums per quantity:
// within each Add, lane l takes terms l, l + kLanes, ... and the leftover
// terms go to lanes 0, 1, ...; Total() adds the lanes pairwise. The adds then pipeline and
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

// Lanes for long sums of one to three quantities over memory-resident data
// (float64 BatchNorm statistics, the unscale pass's sum of squares,
// ConvGrad's dB; float32 and 16-bit BatchNorm use RunLaneSums): four AVX-512
// registers of float64 per quantity, so four adds are in flight (with 8
// lanes such a sum ran at a third of the speed the cache delivers values).
inline constexpr int kWideSumLanes = 32;

// The total of `lanes` lane sums (a power of two), added pairwise: adjacent
// pairs, then adjacent pairs of those, and so on. For 8 lanes:
// ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)). LaneSums::Total's
// order; vector loops that keep the lanes in registers use it too.
template <int kLanes = kSumLanes>
inline double AddLanesPairwise(const double* v) {
  static_assert(kLanes >= 1 && (kLanes & (kLanes - 1)) == 0, "a power of two");
  if constexpr (kLanes == 1) {
    return v[0];
  } else {
    return AddLanesPairwise<kLanes / 2>(v) + AddLanesPairwise<kLanes / 2>(v + kLanes / 2);
  }
}

// kLanes partial sums per quantity. Each lane's adds wait on its previous
// one: with the default 8 (one AVX-512 register per quantity) a single
// quantity runs at one vector add per add latency; long sums use
// kWideSumLanes.
template <int kCount, int kLanes = kSumLanes>
class LaneSums {
 public:
  // Adds terms(i) for i in [0, n); terms returns std::array<double, kCount>.
  template <typename Terms>
  void Add(int64_t n, Terms&& terms) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
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
  double Total(int q) const { return AddLanesPairwise<kLanes>(lanes_[q]); }

 private:
  double lanes_[kCount][kLanes] = {};
};

// Sums over runs of float32 values (a BatchNormalization channel's image
// rows): each run is summed in float32 in kRunSumLanes independent lanes
// (lane l takes terms l, l + kRunSumLanes, ...; the tail's go to lanes
// 0, 1, ...), then each lane's run sum is added to the lane's float64
// total. float32 rounding then spans at most n / kRunSumLanes terms of a
// run, and the vector loop does no conversions; Total() adds the float64
// lanes pairwise. Same order for every ISA (vector_clones.h).
inline constexpr int kRunSumLanes = 32;

template <int kCount>
class RunLaneSums {
 public:
  // Adds terms(i) for i in [0, n); terms returns std::array<float, kCount>.
  // (Always inlined: the calling vector clone's ISA vectorises it.)
  template <typename Terms>
  [[gnu::always_inline]] inline void AddRun(int64_t n, Terms&& terms) {
    float run[kCount][kRunSumLanes] = {};
    int64_t i = 0;
    for (; i + kRunSumLanes <= n; i += kRunSumLanes) {
      for (int l = 0; l < kRunSumLanes; ++l) {
        const std::array<float, kCount> t = terms(i + l);
        for (int q = 0; q < kCount; ++q) run[q][l] += t[q];
      }
    }
    for (int l = 0; i < n; ++i, ++l) {
      const std::array<float, kCount> t = terms(i);
      for (int q = 0; q < kCount; ++q) run[q][l] += t[q];
    }
    AddRunLanes(run);
  }

  // Adds one run already summed into kRunSumLanes float32 lanes per
  // quantity, in AddRun's order (for vector loops that keep the lanes in
  // registers: lane l has taken terms l, l + kRunSumLanes, ..., then the
  // tail's term l).
  [[gnu::always_inline]] inline void AddRunLanes(const float (&run)[kCount][kRunSumLanes]) {
    for (int q = 0; q < kCount; ++q) {
      for (int l = 0; l < kRunSumLanes; ++l) totals_[q][l] += run[q][l];
    }
  }

  // Quantity q summed over every run added so far.
  double Total(int q) const { return AddLanesPairwise<kRunSumLanes>(totals_[q]); }

 private:
  double totals_[kCount][kRunSumLanes] = {};
};

}  // namespace castor::cpu
