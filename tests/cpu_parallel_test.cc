// The thread pool behind backend/cpu/parallel.h's ParallelFor: every index
// runs exactly once, across thousands of back-to-back calls (workers still
// spinning from the previous call) and calls after the workers went to
// sleep, with more threads than chunks and more chunks than cores.
#include "backend/cpu/parallel.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

// Restores the pool's thread count after a test changed it.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : before_(NumThreads()) { SetNumThreads(threads); }
  ~ScopedThreads() { SetNumThreads(before_); }

 private:
  int before_;
};

// Runs ParallelFor over [0, n) and checks that each index ran exactly once.
void ExpectEachIndexOnce(int64_t n, int64_t grain, int call) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  ParallelFor(0, n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n << " in call " << call;
  }
}

TEST(ParallelFor, EveryIndexRunsOnceAcrossBackToBackCalls) {
  for (int threads : {2, 3, 5}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    const ScopedThreads scoped(threads);
    for (int call = 0; call < 3000; ++call) {
      ExpectEachIndexOnce(1 + call % 37, 1 + call % 3, call);
    }
  }
}

TEST(ParallelFor, EveryIndexRunsOnceAfterTheWorkersSlept) {
  const ScopedThreads scoped(3);
  for (int call = 0; call < 20; ++call) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin
    ExpectEachIndexOnce(64, 1, call);
  }
}

TEST(ParallelFor, ChunksRunOnSeveralThreadsAndNestedCallsInline) {
  const ScopedThreads scoped(2);
  std::atomic<int> nested_inline{0};
  std::vector<std::thread::id> ids(2);
  ParallelFor(0, 2, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      ids[i] = std::this_thread::get_id();
      // A nested call runs on this thread, as one chunk.
      ParallelFor(0, 8, 1, [&](int64_t a, int64_t b) {
        if (a == 0 && b == 8) nested_inline.fetch_add(1);
      });
    }
  });
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(nested_inline.load(), 2);
}

}  // namespace
}  // namespace castor::cpu
