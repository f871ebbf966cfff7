// backend/cpu/scratch.h: Scratch keeps its storage while requests fit and
// grows past them; PooledBuffer hands a returned block to the next buffer
// on the same thread (the smallest one that fits, else the largest one,
// grown), gives buffers alive at once distinct blocks, frees the smallest
// block when the pool is full, and keeps each thread's pool to itself. Each test runs on a fresh thread, so it starts
// with an empty pool.
#include "backend/cpu/scratch.h"

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

// Runs `body` on a new thread (an empty pool) and waits for it.
template <typename Body>
void OnFreshThread(Body body) {
  std::thread thread(body);
  thread.join();
}

TEST(Scratch, KeepsItsStorageWhileRequestsFitAndGrowsPastThem) {
  Scratch<float, 64> scratch;
  float* first = scratch.Get(100);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  first[99] = 1.0f;
  EXPECT_EQ(scratch.Get(50), first);
  EXPECT_EQ(scratch.Get(100), first);
  float* grown = scratch.Get(1000);
  grown[999] = 2.0f;
  EXPECT_EQ(scratch.Get(1000), grown);
}

TEST(PooledBuffer, AReturnedBlockServesTheNextBufferOnTheThread) {
  OnFreshThread([] {
    float* first = nullptr;
    {
      PooledBuffer<float> buffer(1000);
      first = buffer.data();
      first[999] = 1.0f;
      EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 0u);
    }
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 1u);
    PooledBuffer<float> smaller(10);
    EXPECT_EQ(smaller.data(), first);
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 0u);
  });
}

TEST(PooledBuffer, BuffersAliveAtOnceGetDistinctBlocks) {
  OnFreshThread([] {
    PooledBuffer<float> a(100);
    PooledBuffer<float> b(100);
    EXPECT_NE(a.data(), b.data());
    for (int i = 0; i < 100; ++i) a.data()[i] = 1.0f;
    for (int i = 0; i < 100; ++i) b.data()[i] = 2.0f;
    for (int i = 0; i < 100; ++i) ASSERT_EQ(a.data()[i], 1.0f) << i;
  });
}

TEST(PooledBuffer, TakesTheSmallestBlockThatFits) {
  OnFreshThread([] {
    float* small = nullptr;
    float* large = nullptr;
    {
      PooledBuffer<float> a(100);
      PooledBuffer<float> b(10000);
      small = a.data();
      large = b.data();
    }
    ASSERT_EQ(PooledBuffer<float>::PooledBlocks(), 2u);
    PooledBuffer<float> fits_small(50);
    EXPECT_EQ(fits_small.data(), small);
    PooledBuffer<float> needs_large(5000);
    EXPECT_EQ(needs_large.data(), large);
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 0u);
  });
}

TEST(PooledBuffer, GrowsTheLargestBlockWhenNoneFits) {
  OnFreshThread([] {
    { PooledBuffer<float> small(10); }
    float* grown = nullptr;
    {
      PooledBuffer<float> big(100000);
      EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 0u);  // the small block, taken to grow
      grown = big.data();
      grown[99999] = 1.0f;  // the whole request is usable
    }
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 1u);
    // The grown block now serves a request of its size.
    PooledBuffer<float> again(100000);
    EXPECT_EQ(again.data(), grown);
  });
}

TEST(PooledBuffer, AFullPoolFreesItsSmallestBlock) {
  OnFreshThread([] {
    float* largest = nullptr;
    {
      std::vector<std::unique_ptr<PooledBuffer<float>>> held;
      for (int i = 1; i <= 9; ++i) held.push_back(std::make_unique<PooledBuffer<float>>(i * 100));
      largest = held.back()->data();
      // Returned smallest first: the 9th (largest) replaces the 100-element block.
      for (std::unique_ptr<PooledBuffer<float>>& buffer : held) buffer.reset();
    }
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 8u);
    PooledBuffer<float> big(900);
    EXPECT_EQ(big.data(), largest);
    // No block of 100 is left: 200 is the smallest that fits.
    PooledBuffer<float> small(50);
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 6u);
  });
}

TEST(PooledBuffer, EachThreadKeepsItsOwnPool) {
  OnFreshThread([] {
    float* pooled = nullptr;
    {
      PooledBuffer<float> buffer(100);
      pooled = buffer.data();
    }
    // Another thread starts with an empty pool: it cannot get this
    // thread's block (still allocated, so no new block can be at its address).
    OnFreshThread([&] {
      EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 0u);
      PooledBuffer<float> other(100);
      EXPECT_NE(other.data(), pooled);
    });
    EXPECT_EQ(PooledBuffer<float>::PooledBlocks(), 1u);
    PooledBuffer<float> again(100);
    EXPECT_EQ(again.data(), pooled);
  });
}

}  // namespace
}  // namespace castor::cpu
