// A small fork-join thread pool for ParallelFor (see parallel.h).
#include "backend/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace castor::cpu {
namespace {

class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive main's statics
    return *pool;
  }

  int threads() const { return threads_; }
  static bool in_parallel() { return in_parallel_; }
  void SetThreads(int n) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    threads_ = std::max(1, n);
    while (static_cast<int>(workers_.size()) < threads_ - 1) {
      workers_.emplace_back([this, id = static_cast<int>(workers_.size())] { Work(id); });
      workers_.back().detach();
    }
  }

  void Run(int64_t begin, int64_t end, int64_t grain,
           const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t n = end - begin;
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    int chunks = static_cast<int>(std::min<int64_t>(threads_, (n + grain - 1) / grain));
    if (chunks <= 1 || in_parallel_) {
      fn(begin, end);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      begin_ = begin;
      end_ = end;
      chunks_ = chunks;
      next_chunk_ = 1;  // chunk 0 runs on the caller
      pending_.store(chunks - 1, std::memory_order_relaxed);
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    in_parallel_ = true;
    RunChunk(0);
    in_parallel_ = false;
    SpinUntil([this] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    fn_ = nullptr;
  }

 private:
  Pool() { SetThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))); }

  // Before sleeping on a condition variable, a worker waiting for work and
  // the caller waiting for its workers spin for up to kSpinTime: a training
  // step runs a few hundred parallel regions with serial work between them,
  // and waking a sleeping thread takes 15-60 us here. At 20 us (the first
  // version's budget) a quarter of the transformer's regions found their
  // worker asleep and started it ~45 us late; at 0.5 ms almost none do
  // (its mixed_bfloat16 step went from 42 to 32 ms on 2 vCPUs).
  static constexpr std::chrono::microseconds kSpinTime{500};
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  // Relaxes until done() or kSpinTime has passed, reading the clock once per
  // 64 pauses.
  template <typename Done>
  static void SpinUntil(const Done& done) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (done()) return;
        Relax();
      }
      if (std::chrono::steady_clock::now() >= deadline) return;
    }
  }

  void RunChunk(int chunk) {
    const int64_t n = end_ - begin_;
    int64_t lo = begin_ + n * chunk / chunks_;
    int64_t hi = begin_ + n * (chunk + 1) / chunks_;
    (*fn_)(lo, hi);
  }

  // A worker takes chunks of the newest region until none is left, then
  // spins (and then sleeps) until the next one is published. `seen` becomes
  // the region's generation once the worker finds no chunk left in it,
  // whether or not it ran one, so every worker spins between regions (a
  // worker that found the chunks taken used to sleep on the condition
  // variable at once).
  void Work(int) {
    uint64_t seen = 0;
    in_parallel_ = true;
    for (;;) {
      SpinUntil([&] { return published_.load(std::memory_order_acquire) != seen; });
      int chunk = -1;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        if (next_chunk_ < chunks_) chunk = next_chunk_++;
        if (next_chunk_ >= chunks_) seen = generation_;
      }
      if (chunk < 0) continue;
      RunChunk(chunk);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // Under the lock: the caller checks pending_ and waits under it.
        std::lock_guard<std::mutex> lock(mutex_);
        done_cv_.notify_one();
      }
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel region at a time
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t begin_ = 0, end_ = 0;
  int chunks_ = 0;
  int next_chunk_ = 0;
  std::atomic<int> pending_{0};
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without the lock
  static thread_local bool in_parallel_;
};

thread_local bool Pool::in_parallel_ = false;

}  // namespace

int NumThreads() { return Pool::Get().threads(); }
void SetNumThreads(int threads) { Pool::Get().SetThreads(threads); }

void ParallelFor(int64_t begin, int64_t end, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn) {
  Pool::Get().Run(begin, end, grain, fn);
}

bool InsideParallelFor() { return Pool::in_parallel(); }

}  // namespace castor::cpu
