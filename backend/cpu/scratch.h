// Per-thread scratch buffers for CPU kernels that grow without
// initialising their elements: each use writes what it reads. (A
// thread_local std::vector's resize zero-fills the grown part again every
// time a large call follows a smaller one: a large GEMM's product or packed
// operands were cleared on each such call.)
//
//   thread_local Scratch<float> product;
//   float* c = product.Get(m * n);   // at least m * n elements, contents unspecified
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

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

}  // namespace castor::cpu
