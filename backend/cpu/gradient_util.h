// Helpers the CPU kernels of castor's gradient ops (domain com.castor,
// graph/ops/gradient_ops.cc) share; the kernels live with their op family
// (conv_grad.cc, pool_grad.cc, normalization_grad.cc, softmax.cc,
// losses.cc, elementwise.cc, reduce.cc, data_movement.cc), as backend/cuda/
// keeps them. Float32In / Float32Out widen 16-bit inputs exactly and round
// each output once on store; gradient ops register for every float dtype.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/cpu/float_io.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/scratch.h"
#include "backend/kernel.h"
#include "graph/gradient_builder.h"

namespace castor::cpu {

// Elements per ParallelFor chunk of the gradient kernels' elementwise work.
inline constexpr int64_t kElementGrain = int64_t{1} << 14;

// Registers gradient op `op` (domain com.castor) for float32, float16 and
// bfloat16. `in_place_ok`: the kernel may write output 0 over input 0 (dY:
// each element of dX written after the element of dY it reads; executor.h).
inline void RegisterGradientKernel(KernelTable& table, const char* op, KernelFn fn,
                                   bool in_place_ok = false) {
  table.Register({kCastorDomain, op,
                  FloatDTypesIn({DType::kFloat32, DType::kFloat16, DType::kBFloat16}), fn,
                  in_place_ok});
}

// A float tensor read as float32: the tensor itself when float32, else a
// widened copy (exact for 16-bit).
class Float32In {
 public:
  explicit Float32In(const TensorView& t) {
    if (t.dtype == DType::kFloat32) {
      data_ = t.as<float>();
      return;
    }
    const int64_t n = t.num_elements();
    copy_.emplace(n);
    float* dst = copy_->data();
    ParallelFor(0, n, kElementGrain, [&](int64_t lo, int64_t hi) {
      ToFloat32(t.dtype, static_cast<const char*>(t.data) + lo * DTypeSize(t.dtype), dst + lo,
                hi - lo);
    });
    data_ = dst;
  }
  Float32In(const Float32In&) = delete;
  Float32In& operator=(const Float32In&) = delete;
  const float* data() const { return data_; }

 private:
  const float* data_ = nullptr;
  std::optional<PooledBuffer<float>> copy_;
};

// An output computed in float32: written in place when float32, else in a
// buffer that Finish() rounds into the output once. Zero-initialised unless
// the kernel writes every element (`overwritten`).
class Float32Out {
 public:
  explicit Float32Out(TensorView* t, bool overwritten = false) : view_(t) {
    const int64_t n = t->num_elements();
    if (t->dtype == DType::kFloat32) {
      data_ = t->as<float>();
    } else {
      buffer_.emplace(n);  // not initialised
      data_ = buffer_->data();
    }
    if (!overwritten) std::fill(data_, data_ + n, 0.0f);
  }
  Float32Out(const Float32Out&) = delete;
  Float32Out& operator=(const Float32Out&) = delete;
  float* data() const { return data_; }
  void Finish() const {
    if (view_->dtype == DType::kFloat32) return;
    ParallelFromFloat32(view_->dtype, data_, view_->data, view_->num_elements());
  }

 private:
  TensorView* view_;
  float* data_ = nullptr;
  std::optional<PooledBuffer<float>> buffer_;
};

// Whether the gradient op's output `i` is computed: only when something
// reads it (KernelContext::output_read).
inline bool WantsOutput(const KernelContext& ctx, int i) {
  return i < ctx.num_outputs() && ctx.output_read(i);
}

// Splits [0, count) into at most NumThreads() contiguous slices.
inline int64_t SliceCount(int64_t count) { return std::clamp<int64_t>(NumThreads(), 1, count); }
inline int64_t SliceBegin(int64_t slice, int64_t slices, int64_t count) {
  return slice * count / slices;
}
// run_slice(slice) for each of `slices` slices on the thread pool (one
// slice runs on the calling thread, its loops free to split further).
template <typename Fn>
void ForEachSlice(int64_t slices, const Fn& run_slice) {
  ParallelFor(0, slices, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t slice = lo; slice < hi; ++slice) run_slice(slice);
  });
}

// Element i of an int32 or int64 tensor (labels, indices) as int64.
inline int64_t IntAt(const TensorView& t, int64_t i) {
  return t.dtype == DType::kInt32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i];
}

}  // namespace castor::cpu
