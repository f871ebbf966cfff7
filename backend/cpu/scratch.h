// Per-thread scratch buffers for CPU kernels that grow without
// initialising their elements: each use writes what it reads. (A
// thread_local std::vector's resize zero-fills the grown part again every
// time a large call follows a smaller one: a large GEMM's product or packed
// operands were cleared on each such call.)
//
//   thread_local Scratch<float> product;
//   float* c = product.Get(m * n);   // at least m * n elements, contents unspecified
//
// PooledBuffer is for temporaries of which a kernel holds several at once
// (ConvGrad's widened X, dY and W and its float32 dX): each takes a block
// from its thread's pool and gives it back when destroyed. A thread keeps
// up to 8 blocks for its lifetime (the largest temporaries it has needed;
// ~6 MiB each for the ResNet's mixed_float16 convolutions), outside the
// executor's activation accounting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace castor::cpu {

template <typename T, size_t kAlign = alignof(T)>
class Scratch {
  static_assert(std::is_trivial_v<T>, "scratch elements are left uninitialised");

 public:
  // At least `n` elements, kAlign-byte aligned; the pointer stays valid
  // until a larger Get.
  T* Get(int64_t n) {
    if (n > capacity_) {
      storage_.reset(static_cast<T*>(
          ::operator new[](static_cast<size_t>(n) * sizeof(T), std::align_val_t{kAlign})));
      capacity_ = n;
    }
    return storage_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{kAlign}); }
  };
  std::unique_ptr<T, Free> storage_;
  int64_t capacity_ = 0;
};

// At least `n` uninitialised elements, from a pool kept per thread: the
// smallest pooled block that is large enough, else the largest one grown
// (or a new one). Freshly allocated megabytes are zero pages that fault on
// first touch, and a std::vector zero-fills them too: per call, that was
// a fifth of the ResNet's mixed_float16 step. Blocks return to the pool of
// the thread that destroys the buffer (the kernel's, in practice).
template <typename T>
class PooledBuffer {
  static_assert(std::is_trivial_v<T>, "pooled elements are left uninitialised");

 public:
  explicit PooledBuffer(int64_t n) {
    std::vector<Block>& pool = Pool();
    auto fit = pool.end(), largest = pool.end();
    for (auto it = pool.begin(); it != pool.end(); ++it) {
      if (it->capacity >= n && (fit == pool.end() || it->capacity < fit->capacity)) fit = it;
      if (largest == pool.end() || it->capacity > largest->capacity) largest = it;
    }
    const auto chosen = fit != pool.end() ? fit : largest;
    if (chosen != pool.end()) {
      block_ = std::move(*chosen);
      pool.erase(chosen);
    }
    if (block_.capacity < n) {
      block_.data.reset(new T[static_cast<size_t>(n)]);
      block_.capacity = n;
    }
  }
  // Back to the pool; when it is full, the smallest block is freed (this
  // one, or a pooled one that is smaller).
  ~PooledBuffer() {
    std::vector<Block>& pool = Pool();
    if (pool.size() < kMaxPooled) {
      pool.push_back(std::move(block_));
      return;
    }
    auto smallest = pool.begin();
    for (auto it = pool.begin(); it != pool.end(); ++it) {
      if (it->capacity < smallest->capacity) smallest = it;
    }
    if (smallest->capacity < block_.capacity) *smallest = std::move(block_);
  }
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;

  T* data() const { return block_.data.get(); }

  // Blocks waiting in this thread's pool (for tests).
  static size_t PooledBlocks() { return Pool().size(); }

 private:
  static constexpr size_t kMaxPooled = 8;
  struct Block {
    std::unique_ptr<T[]> data;
    int64_t capacity = 0;
  };
  static std::vector<Block>& Pool() {
    thread_local std::vector<Block> pool;
    return pool;
  }
  Block block_;
};

}  // namespace castor::cpu
