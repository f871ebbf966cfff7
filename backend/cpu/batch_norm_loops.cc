// BatchNormalization's training loops (see batch_norm_loops.h).
#include "backend/cpu/batch_norm_loops.h"

#include <algorithm>
#include <type_traits>

#include "backend/common/elementwise_math.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/vector_clones.h"

namespace castor::cpu {
namespace {

// ---- one run (the vector clones) --------------------------------------------
//
// TX and TD, the run's storage, are float or BFloat16 (float16 reaches
// them widened: RunReader); LoadF/StoreF (float_io.h) widen and round a
// bfloat16 in the vector loop. An output run has X's storage.

template <typename TX>
CASTOR_VECTOR_CLONES void AddRunSum(const TX* x, int64_t n, RunLaneSums<1>& sums) {
  sums.AddRun(n, [&](int64_t i) { return std::array<float, 1>{LoadF(x[i])}; });
}

template <typename TX>
CASTOR_VECTOR_CLONES void AddRunSquaredDeviations(const TX* x, int64_t n, float mean,
                                                  RunLaneSums<1>& sums) {
  sums.AddRun(n, [&](int64_t i) {
    const float d = LoadF(x[i]) - mean;
    return std::array<float, 1>{d * d};
  });
}

// dY[i] as the BatchNormalization's gradient takes it: with a Relu fused
// after it (kRelu), ReluGrad's: dY where the Relu's output is positive,
// else +0 (-0, +0, negatives and NaN pass nothing). A select on values
// both loaded, so the loops stay vector loops.
template <bool kRelu, typename TX, typename TD>
inline float GradientAt(const TD* dy, const TX* relu_output, int64_t i) {
  const float d = LoadF(dy[i]);
  if constexpr (kRelu) {
    return LoadF(relu_output[i]) > 0.0f ? d : 0.0f;
  } else {
    return d;
  }
}

template <bool kRelu, typename TX, typename TD>
CASTOR_VECTOR_CLONES void AddRunGradientSums(const TX* x, const TD* dy, const TX* relu_output,
                                             int64_t n, float mean, RunLaneSums<3>& sums) {
  sums.AddRun(n, [&](int64_t i) {
    const float centred = LoadF(x[i]) - mean;
    const float d = GradientAt<kRelu>(dy, relu_output, i);
    return std::array<float, 3>{centred * centred, d, d * centred};
  });
}

template <typename TX>
CASTOR_VECTOR_CLONES void ScaleShiftRun(const TX* x, TX* y, int64_t n, float a, float b) {
  for (int64_t i = 0; i < n; ++i) StoreF(&y[i], LoadF(x[i]) * a + b);
}

// The same with Relu applied before the rounding (math::ReluOp: NaN stays,
// -0 becomes +0), which gives the bits of Relu on the rounded value.
template <typename TX>
CASTOR_VECTOR_CLONES void ScaleShiftReluRun(const TX* x, TX* y, int64_t n, float a, float b) {
  const math::ReluOp relu;
  for (int64_t i = 0; i < n; ++i) StoreF(&y[i], relu(LoadF(x[i]) * a + b));
}

template <bool kRelu, typename TX, typename TD>
CASTOR_VECTOR_CLONES void InputGradientRun(const TX* x, const TD* dy, const TX* relu_output,
                                           TX* dx, int64_t n, InputGradientTerms t) {
  for (int64_t i = 0; i < n; ++i) {
    const float x_hat = (LoadF(x[i]) - t.mean) * t.inv_std;
    const float d = GradientAt<kRelu>(dy, relu_output, i);
    StoreF(&dx[i], t.a * (d - t.mean_dy - x_hat * t.mean_dy_xhat));
  }
}

CASTOR_VECTOR_CLONES double RowSumClone(const float* x, int64_t n) {
  LaneSums<1, kWideSumLanes> sum;
  sum.Add(n, [&](int64_t i) { return std::array<double, 1>{x[i]}; });
  return sum.Total(0);
}

// ---- a channel, run by run ---------------------------------------------------

// Calls fn(TypeTag<T>{}) for the storage the loops read a run in.
template <typename Fn>
void WithRunStorage(bool bfloat16, Fn&& fn) {
  if (bfloat16) {
    fn(TypeTag<BFloat16>{});
  } else {
    fn(TypeTag<float>{});
  }
}

// Calls fn(std::bool_constant<relu>{}).
template <typename Fn>
void WithRelu(bool relu, Fn&& fn) {
  if (relu) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// RunReader::PrefetchAhead: how many runs ahead, and at most how many
// bytes of the run (a longer run's stream is the hardware's to follow once
// started).
constexpr int64_t kRunsAhead = 2;
constexpr int64_t kPrefetchBytes = 4096;

// Run n of a channel as the loops read it: float32 and bfloat16 as stored,
// float16 widened into `buffer` (this thread's, `inner` floats).
class RunReader {
 public:
  RunReader(const ChannelRuns& channel, Scratch<float>& buffer)
      : channel_(channel),
        bytes_(DTypeSize(channel.dtype)),
        buffer_(channel.dtype == DType::kFloat16 ? buffer.Get(channel.inner) : nullptr) {}

  bool bfloat16() const { return channel_.dtype == DType::kBFloat16; }
  const void* Run(int64_t n) const {
    const char* src = Source(n);
    if (buffer_ == nullptr) return src;
    ToFloat32(channel_.dtype, src, buffer_, channel_.inner);
    return buffer_;
  }
  // Asks for run n + kRunsAhead's first cache lines (if there is such a
  // run): a channel's runs are short (a 14x14 bfloat16 plane is six lines)
  // and a whole image apart, so the hardware prefetchers, which follow
  // streams within a page, start each one cold. (BatchNormalization's
  // first pass over X and dY, measured on a Zen 4 EPYC: 6% faster.)
  void PrefetchAhead(int64_t n) const {
    if (n + kRunsAhead >= channel_.batch) return;
    const char* src = Source(n + kRunsAhead);
    const int64_t bytes =
        std::min(kPrefetchBytes, channel_.inner * static_cast<int64_t>(bytes_));
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(src + at);
  }

 private:
  const char* Source(int64_t n) const {
    return static_cast<const char*>(channel_.first) + n * channel_.stride * bytes_;
  }
  const ChannelRuns& channel_;
  size_t bytes_;
  float* buffer_;
};

// Run n of an output channel in X's run storage: float32 and bfloat16
// written in place; float16 computed in `buffer` and rounded once by Store.
class RunWriter {
 public:
  RunWriter(const ChannelRuns& layout, ChannelOut out, Scratch<float>& buffer)
      : layout_(layout),
        out_(out),
        bytes_(DTypeSize(out.dtype)),
        buffer_(out.dtype == DType::kFloat16 ? buffer.Get(layout.inner) : nullptr) {}

  void* Run(int64_t n) const { return buffer_ != nullptr ? buffer_ : Address(n); }
  void Store(int64_t n) const {
    if (buffer_ != nullptr) FromFloat32(out_.dtype, buffer_, Address(n), layout_.inner);
  }

 private:
  void* Address(int64_t n) const {
    return static_cast<char*>(out_.first) + n * layout_.stride * bytes_;
  }
  const ChannelRuns& layout_;
  ChannelOut out_;
  size_t bytes_;
  float* buffer_;
};

// This thread's run buffers (float16 only): X's, dY's, the fused Relu's
// output's and the output's.
struct RunBuffers {
  Scratch<float> x, dy, relu_output, out;
};
RunBuffers& ThreadRunBuffers() {
  thread_local RunBuffers buffers;
  return buffers;
}

}  // namespace

double ChannelSum(const ChannelRuns& x) {
  const RunReader reader(x, ThreadRunBuffers().x);
  RunLaneSums<1> sums;
  WithRunStorage(reader.bfloat16(), [&](auto tx) {
    using TX = typename decltype(tx)::type;
    for (int64_t n = 0; n < x.batch; ++n) {
      reader.PrefetchAhead(n);
      AddRunSum(static_cast<const TX*>(reader.Run(n)), x.inner, sums);
    }
  });
  return sums.Total(0);
}

double ChannelSquaredDeviations(const ChannelRuns& x, double mean) {
  const RunReader reader(x, ThreadRunBuffers().x);
  RunLaneSums<1> sums;
  const float m = static_cast<float>(mean);
  WithRunStorage(reader.bfloat16(), [&](auto tx) {
    using TX = typename decltype(tx)::type;
    for (int64_t n = 0; n < x.batch; ++n) {
      AddRunSquaredDeviations(static_cast<const TX*>(reader.Run(n)), x.inner, m, sums);
    }
  });
  return sums.Total(0);
}

std::array<double, 3> ChannelGradientSums(const ChannelRuns& x, const ChannelRuns& dy,
                                          const ChannelRuns& relu_output, double mean) {
  RunBuffers& buffers = ThreadRunBuffers();
  const RunReader x_reader(x, buffers.x), dy_reader(dy, buffers.dy);
  // Without a fused Relu, X's runs stand in for its output's (never read).
  const bool relu = relu_output.first != nullptr;
  const RunReader relu_reader(relu ? relu_output : x, buffers.relu_output);
  RunLaneSums<3> sums;
  const float m = static_cast<float>(mean);
  WithRunStorage(x_reader.bfloat16(), [&](auto tx) {
    WithRunStorage(dy_reader.bfloat16(), [&](auto td) {
      WithRelu(relu, [&](auto fused) {
        using TX = typename decltype(tx)::type;
        using TD = typename decltype(td)::type;
        constexpr bool kRelu = decltype(fused)::value;
        for (int64_t n = 0; n < x.batch; ++n) {
          x_reader.PrefetchAhead(n);
          dy_reader.PrefetchAhead(n);
          if constexpr (kRelu) relu_reader.PrefetchAhead(n);
          AddRunGradientSums<kRelu>(
              static_cast<const TX*>(x_reader.Run(n)), static_cast<const TD*>(dy_reader.Run(n)),
              kRelu ? static_cast<const TX*>(relu_reader.Run(n)) : nullptr, x.inner, m, sums);
        }
      });
    });
  });
  return {sums.Total(0), sums.Total(1), sums.Total(2)};
}

void ChannelScaleShift(const ChannelRuns& x, float a, float b, ChannelOut y, bool relu) {
  RunBuffers& buffers = ThreadRunBuffers();
  const RunReader reader(x, buffers.x);
  const RunWriter writer(x, y, buffers.out);
  WithRunStorage(reader.bfloat16(), [&](auto tx) {
    using TX = typename decltype(tx)::type;
    const auto run = relu ? ScaleShiftReluRun<TX> : ScaleShiftRun<TX>;
    for (int64_t n = 0; n < x.batch; ++n) {
      run(static_cast<const TX*>(reader.Run(n)), static_cast<TX*>(writer.Run(n)), x.inner, a, b);
      writer.Store(n);
    }
  });
}

void ChannelInputGradient(const ChannelRuns& x, const ChannelRuns& dy,
                          const ChannelRuns& relu_output, const InputGradientTerms& terms,
                          ChannelOut dx) {
  RunBuffers& buffers = ThreadRunBuffers();
  const RunReader x_reader(x, buffers.x), dy_reader(dy, buffers.dy);
  const bool relu = relu_output.first != nullptr;  // as ChannelGradientSums
  const RunReader relu_reader(relu ? relu_output : x, buffers.relu_output);
  const RunWriter writer(x, dx, buffers.out);
  WithRunStorage(x_reader.bfloat16(), [&](auto tx) {
    WithRunStorage(dy_reader.bfloat16(), [&](auto td) {
      WithRelu(relu, [&](auto fused) {
        using TX = typename decltype(tx)::type;
        using TD = typename decltype(td)::type;
        constexpr bool kRelu = decltype(fused)::value;
        for (int64_t n = 0; n < x.batch; ++n) {
          InputGradientRun<kRelu>(
              static_cast<const TX*>(x_reader.Run(n)), static_cast<const TD*>(dy_reader.Run(n)),
              kRelu ? static_cast<const TX*>(relu_reader.Run(n)) : nullptr,
              static_cast<TX*>(writer.Run(n)), x.inner, terms);
          writer.Store(n);
        }
      });
    });
  });
}

double RowSum(const float* x, int64_t n) { return RowSumClone(x, n); }

}  // namespace castor::cpu
