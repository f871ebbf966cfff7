// CPU kernels: misc family (ops of graph/ops/misc.cc): Cast, Constant,
// ConstantOfShape, Dropout, Identity and Range.
//
// Cast converts between every pair of fixed-size dtypes castor carries
// (float32/64, float16, bfloat16, signed and unsigned 8-64 bit ints, bool):
// float targets round to nearest even, once (a float64 source goes through
// a round-to-odd float32, so float64 -> float16/bfloat16 rounds like a
// direct conversion); float -> int truncates toward zero (NaN -> 0,
// out-of-range values saturate to int64 then wrap to narrower ints, ONNX
// leaves them undefined); anything -> bool is `!= 0`; bool -> x is 0 or 1.
//
// Dropout is the identity with an all-true mask in inference (opset < 12,
// training_mode absent/false, or ratio 0): nothing is drawn. In training it
// keeps an element with probability 1 - ratio and scales it by
// 1/(1-ratio), the mask following numpy's legacy RandomState as ONNX's
// reference draws (a model run as it is, the ONNX conformance cases): an
// MT19937 seeded with the `seed` attribute (default 0), 53-bit doubles, the
// same mask every call. castor's training graphs (passes/training_graph.h)
// run every drawing Dropout as com.castor DropoutTraining instead, whose
// input 2 is the RNG state int64 [seed, counter] fed each step: its keep
// decision is backend/common/philox.h's, a function of (run seed, node,
// counter, element index), the CUDA kernel's bits too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/op_geometry.h"
#include "backend/common/philox.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/strided_copy.h"
#include "backend/cpu/vector_clones.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

// ---- Cast ----------------------------------------------------------------------

// Storage of a bool element (one byte, any nonzero value reads as true).
struct BoolByte {
  uint8_t value;
};

template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                          std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Calls fn(TypeTag<T>{}) for the storage type T of any fixed-size dtype.
template <typename Fn>
bool DispatchAny(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(TypeTag<float>{}); return true;
    case DType::kFloat64: fn(TypeTag<double>{}); return true;
    case DType::kFloat16: fn(TypeTag<Half>{}); return true;
    case DType::kBFloat16: fn(TypeTag<BFloat16>{}); return true;
    case DType::kInt8: fn(TypeTag<int8_t>{}); return true;
    case DType::kInt16: fn(TypeTag<int16_t>{}); return true;
    case DType::kInt32: fn(TypeTag<int32_t>{}); return true;
    case DType::kInt64: fn(TypeTag<int64_t>{}); return true;
    case DType::kUInt8: fn(TypeTag<uint8_t>{}); return true;
    case DType::kUInt16: fn(TypeTag<uint16_t>{}); return true;
    case DType::kUInt32: fn(TypeTag<uint32_t>{}); return true;
    case DType::kUInt64: fn(TypeTag<uint64_t>{}); return true;
    case DType::kBool: fn(TypeTag<BoolByte>{}); return true;
    default: return false;
  }
}

// `d` rounded to float32 with round-to-odd (truncate, then set the last bit
// when inexact), so a second rounding to a narrower format is exact RNE.
float RoundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || std::isinf(d) || static_cast<double>(f) == d) return f;
  if (std::isinf(f)) f = std::copysign(std::numeric_limits<float>::max(), static_cast<float>(d));
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t bits = FloatBits(f) | 1u;
  return BitsToFloat(bits);
}

// An integer rounded to float32 with round-to-odd (see RoundToOddFloat).
template <typename Int>
float IntegerToFloatRoundToOdd(Int v) {
  const bool negative = v < 0;
  uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  if (magnitude < (uint64_t{1} << 24)) {
    const float f = static_cast<float>(magnitude);
    return negative ? -f : f;
  }
  int bits = 64;
  while (!(magnitude >> (bits - 1))) --bits;
  const int shift = bits - 24;
  uint64_t kept = magnitude >> shift;
  if (magnitude & ((uint64_t{1} << shift) - 1)) kept |= 1;
  const float f = std::ldexp(static_cast<float>(kept), shift);
  return negative ? -f : f;
}

// float -> integer: truncation toward zero; NaN -> 0; out of range
// saturates to int64 (uint64 for uint64) and then wraps to narrower types.
template <typename Int>
Int FloatToInteger(double d) {
  if (std::isnan(d)) return 0;
  const double t = std::trunc(d);
  constexpr double kTwo63 = 9223372036854775808.0;
  if constexpr (std::is_same_v<Int, uint64_t>) {
    if (t >= 2 * kTwo63) return std::numeric_limits<uint64_t>::max();
    if (t >= 0) return static_cast<uint64_t>(t);
  }
  int64_t i;
  if (t >= kTwo63) {
    i = std::numeric_limits<int64_t>::max();
  } else if (t < -kTwo63) {
    i = std::numeric_limits<int64_t>::min();
  } else {
    i = static_cast<int64_t>(t);
  }
  return static_cast<Int>(i);
}

template <typename Dst>
Dst FromFloat32(float f) {
  if constexpr (std::is_same_v<Dst, float>) {
    return f;
  } else if constexpr (std::is_same_v<Dst, double>) {
    return f;
  } else if constexpr (std::is_same_v<Dst, Half>) {
    return Half{FloatToHalfBits(f)};
  } else if constexpr (std::is_same_v<Dst, BFloat16>) {
    return BFloat16{FloatToBFloat16Bits(f)};
  } else {
    return FloatToInteger<Dst>(f);
  }
}

template <typename Dst>
Dst FromFloat64(double d) {
  if constexpr (std::is_same_v<Dst, float>) {
    return static_cast<float>(d);
  } else if constexpr (std::is_same_v<Dst, double>) {
    return d;
  } else if constexpr (std::is_same_v<Dst, Half> || std::is_same_v<Dst, BFloat16>) {
    return FromFloat32<Dst>(RoundToOddFloat(d));
  } else {
    return FloatToInteger<Dst>(d);
  }
}

template <typename Dst, typename Int>
Dst FromInteger(Int v) {
  if constexpr (std::is_same_v<Dst, float> || std::is_same_v<Dst, double>) {
    return static_cast<Dst>(v);
  } else if constexpr (std::is_same_v<Dst, Half>) {
    // Exact below 2^24; above, float16 overflows to infinity either way.
    return Half{FloatToHalfBits(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<Dst, BFloat16>) {
    return BFloat16{FloatToBFloat16Bits(IntegerToFloatRoundToOdd(v))};
  } else {
    return static_cast<Dst>(v);
  }
}

template <typename Src>
bool IsNonZero(Src v) {
  if constexpr (std::is_same_v<Src, double>) {
    return v != 0.0;
  } else if constexpr (kIsFloat<Src>) {
    return LoadF(v) != 0.0f;  // NaN is nonzero
  } else if constexpr (std::is_same_v<Src, BoolByte>) {
    return v.value != 0;
  } else {
    return v != 0;
  }
}

template <typename Dst, typename Src>
Dst CastElement(Src v) {
  if constexpr (std::is_same_v<Dst, BoolByte>) {
    return BoolByte{static_cast<uint8_t>(IsNonZero(v) ? 1 : 0)};
  } else if constexpr (std::is_same_v<Src, BoolByte>) {
    return FromInteger<Dst>(static_cast<uint8_t>(v.value != 0 ? 1 : 0));
  } else if constexpr (std::is_same_v<Src, double>) {
    return FromFloat64<Dst>(v);
  } else if constexpr (kIsFloat<Src>) {
    return FromFloat32<Dst>(LoadF(v));  // float16/bfloat16 widen exactly
  } else {
    return FromInteger<Dst>(v);
  }
}

// Converts `count` elements of dtype `from` at `src` to dtype `to` at `dst`.
// Returns false for a dtype without fixed-size storage.
bool ConvertElements(DType from, const void* src, DType to, void* dst, int64_t count) {
  bool handled = false;
  DispatchAny(from, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    handled = DispatchAny(to, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      const Src* s = static_cast<const Src*>(src);
      Dst* d = static_cast<Dst*>(dst);
      if constexpr (std::is_same_v<Src, Dst> && !std::is_same_v<Src, BoolByte>) {
        ParallelMemcpy(d, s, static_cast<size_t>(count) * sizeof(Src));
      } else if constexpr (std::is_same_v<Src, float> && kIsFloat16Storage<Dst>) {
        // Bulk (vectorized) conversions: the same bits as CastElement.
        ParallelFromFloat32(to, s, d, count);
      } else if constexpr (kIsFloat16Storage<Src> && std::is_same_v<Dst, float>) {
        ParallelToFloat32(from, s, d, count);
      } else if constexpr (kIsFloat16Storage<Src> && kIsFloat16Storage<Dst>) {
        // float16 <-> bfloat16: widen exactly, round once.
        ParallelFor(0, count, 16384, [&](int64_t lo, int64_t hi) {
          float widened[kFloatConvertBlock];
          for (int64_t i = lo; i < hi; i += kFloatConvertBlock) {
            const int64_t m = std::min(kFloatConvertBlock, hi - i);
            // The dtype-tagged forms: clang 14 instantiates this lambda even
            // where the branch is discarded (no typed overload for, say, int8).
            cpu::ToFloat32(from, s + i, widened, m);
            cpu::FromFloat32(to, widened, d + i, m);
          }
        });
      } else {
        ParallelFor(0, count, 16384, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) d[i] = CastElement<Dst>(s[i]);
        });
      }
    });
  });
  return handled;
}

absl::Status RunCast(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  const int64_t code = ctx.GetInt("to", 0);
  absl::StatusOr<DType> to = DTypeFromOnnx(static_cast<int32_t>(code));
  if (!to.ok()) return ctx.Error(std::string(to.status().message()));
  if (DTypeSize(*to) == 0 || DTypeSize(in.dtype) == 0) {
    return ctx.Unimplemented(absl::StrCat("cast ", DTypeName(in.dtype), " -> ", DTypeName(*to),
                                          ": only fixed-size dtypes"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, *to, in.dims));
  if (!ConvertElements(in.dtype, in.data, *to, out->data, in.num_elements())) {
    return ctx.Unimplemented(absl::StrCat("cast ", DTypeName(in.dtype), " -> ", DTypeName(*to)));
  }
  return absl::OkStatus();
}

// ---- Constant / ConstantOfShape / Identity -------------------------------------

absl::Status WriteTensor(KernelContext& ctx, const Tensor& value) {
  if (DTypeSize(value.dtype()) == 0) {
    return ctx.Unimplemented(
        absl::StrCat("a ", DTypeName(value.dtype()), " constant (only fixed-size dtypes)"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, value.dtype(), value.dims()));
  if (value.byte_size() > 0) std::memcpy(out->data, value.raw(), value.byte_size());
  return absl::OkStatus();
}

absl::Status RunConstant(KernelContext& ctx) {
  const Node& node = ctx.node();
  if (const Attribute* a = node.attribute("value")) return WriteTensor(ctx, a->t);
  if (const Attribute* a = node.attribute("value_float"))
    return WriteTensor(ctx, Tensor::Scalar(a->f));
  if (const Attribute* a = node.attribute("value_floats")) {
    return WriteTensor(
        ctx,
        Tensor::FromVector(DType::kFloat32, {static_cast<int64_t>(a->floats.size())}, a->floats));
  }
  if (const Attribute* a = node.attribute("value_int")) {
    return WriteTensor(ctx, Tensor::FromVector(DType::kInt64, {}, std::vector<int64_t>{a->i}));
  }
  if (const Attribute* a = node.attribute("value_ints"))
    return WriteTensor(ctx, Tensor::Int64s(a->ints));
  return ctx.Unimplemented(
      "needs one of the attributes value, value_float(s), value_int(s) (string and sparse "
      "constants are not supported by the CPU backend)");
}

absl::Status RunConstantOfShape(KernelContext& ctx) {
  const std::vector<int64_t> dims = ReadInts(ctx.input(0));
  CASTOR_ASSIGN_OR_RETURN(const Tensor fill, common::ConstantOfShapeFill(ctx, dims));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, fill.dtype(), dims));
  const size_t element_size = DTypeSize(fill.dtype());
  char* dst = static_cast<char*>(out->data);
  const uint8_t* value = fill.raw();
  ParallelFor(0, out->num_elements(), 65536, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) std::memcpy(dst + i * element_size, value, element_size);
  });
  return absl::OkStatus();
}

absl::Status RunIdentity(KernelContext& ctx) { return CopyInputToOutput(ctx, ctx.input(0).dims); }

// ---- Dropout -------------------------------------------------------------------

// Writes the all-true mask (bool, or 1 in the data dtype before opset 10).
absl::Status WriteKeepAllMask(KernelContext& ctx, const TensorView& data) {
  if (!ctx.has_output(1)) return absl::OkStatus();
  const DType mask_dtype = ctx.opset() < 10 ? data.dtype : DType::kBool;
  CASTOR_ASSIGN_OR_RETURN(TensorView * mask, ctx.Output(1, mask_dtype, data.dims));
  const BoolByte one{1};
  if (!ConvertElements(DType::kBool, &one, mask_dtype, mask->data, 1)) {
    return ctx.Error(absl::StrCat("mask dtype ", DTypeName(mask_dtype)));
  }
  const size_t element_size = DTypeSize(mask_dtype);
  char* m = static_cast<char*>(mask->data);
  for (int64_t i = 1; i < mask->num_elements(); ++i) {
    std::memcpy(m + i * element_size, m, element_size);
  }
  return absl::OkStatus();
}

// A Dropout node outside castor's training graphs (no RNG state input: an
// ONNX model run as it is, the ONNX conformance cases): numpy's legacy
// RandomState scheme, MT19937 seeded with the `seed` attribute (default 0)
// and 53-bit doubles, keep when u >= ratio; the same mask every call.
absl::Status DropoutLikeNumpy(KernelContext& ctx, const TensorView& data, TensorView& out,
                              uint8_t* mask, float ratio, float scale) {
  std::mt19937 rng(static_cast<uint32_t>(ctx.GetInt("seed", 0)));
  const double threshold = ratio;
  const int64_t n = data.num_elements();
  bool handled = DispatchFloat(data.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data.as<T>();
    T* y = out.as<T>();
    for (int64_t i = 0; i < n; ++i) {
      // A uniform double in [0, 1) from 53 random bits (genrand_res53).
      const uint32_t a = rng() >> 5, b = rng() >> 6;
      const double u = (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
      const bool keep = u >= threshold;
      if (mask != nullptr) mask[i] = keep ? 1 : 0;
      if constexpr (std::is_same_v<T, double>) {
        y[i] = keep ? x[i] * static_cast<double>(scale) : 0.0;
      } else {
        StoreF(&y[i], keep ? LoadF(x[i]) * scale : 0.0f);
      }
    }
  });
  if (!handled) return ctx.Error(absl::StrCat("data is ", DTypeName(data.dtype)));
  return absl::OkStatus();
}

// Reads the scalar ratio of input `index` (a float type).
absl::StatusOr<float> ReadRatio(KernelContext& ctx, int index) {
  const TensorView& r = ctx.input(index);
  if (r.num_elements() != 1) {
    return ctx.Error(absl::StrCat("input ", index, " (ratio) must hold one value"));
  }
  float ratio = 0.5f;
  if (!DispatchFloat(r.dtype,
                     [&](auto tag) { ratio = LoadF(*r.as<typename decltype(tag)::type>()); })) {
    return ctx.Error(absl::StrCat("input ", index, " (ratio) is ", DTypeName(r.dtype),
                                  "; expected a float type"));
  }
  return ratio;
}

absl::Status RunDropout(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  float ratio = 0.5f;
  bool training = false;
  if (ctx.opset() < 12) {
    ratio = ctx.GetFloat("ratio", 0.5f);
  } else {
    if (ctx.has_input(1)) {
      CASTOR_ASSIGN_OR_RETURN(ratio, ReadRatio(ctx, 1));
    }
    if (ctx.has_input(2)) {
      const TensorView& t = ctx.input(2);
      if (t.num_elements() != 1) return ctx.Error("input 2 (training_mode) must hold one value");
      training = *t.as<uint8_t>() != 0;
    }
  }
  if (!training || ratio == 0.0f) {
    CASTOR_RETURN_IF_ERROR(CopyInputToOutput(ctx, data.dims));
    return WriteKeepAllMask(ctx, data);
  }
  if (!(ratio > 0.0f && ratio < 1.0f)) {
    return ctx.Error(absl::StrCat("ratio ", ratio, " is outside [0, 1)"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, data.dims));
  uint8_t* mask = nullptr;
  if (ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * m, ctx.Output(1, DType::kBool, data.dims));
    mask = m->as<uint8_t>();
  }
  return DropoutLikeNumpy(ctx, data, *out, mask, ratio, 1.0f / (1.0f - ratio));
}

// The random words of `count` consecutive groups of four elements from
// `first_group` on (philox.h's DropoutGroupWords), into words[4 * count]:
// one Philox block per four elements, the groups side by side in vector
// lanes where the CPU has them.
CASTOR_VECTOR_CLONES void DropoutWordsOfGroups(uint64_t key, uint64_t call, uint64_t first_group,
                                               int64_t count, uint32_t* __restrict words) {
  for (int64_t j = 0; j < count; ++j) {
    const common::PhiloxWords block =
        common::DropoutGroupWords(key, call, first_group + static_cast<uint64_t>(j));
    for (int k = 0; k < 4; ++k) words[4 * j + k] = block.v[k];
  }
}

// com.castor DropoutTraining(data, ratio?, rng): always draws, the keep
// decision philox.h's for (rng[0] = run seed, the node's name, rng[1] =
// counter, element). Ratio 0 keeps every element (threshold 0, scale 1).
absl::Status RunDropoutTraining(KernelContext& ctx) {
  const TensorView& data = ctx.input(0);
  float ratio = 0.5f;
  if (ctx.has_input(1)) {
    CASTOR_ASSIGN_OR_RETURN(ratio, ReadRatio(ctx, 1));
  }
  if (!(ratio >= 0.0f && ratio < 1.0f)) {
    return ctx.Error(absl::StrCat("ratio ", ratio, " is outside [0, 1)"));
  }
  if (!ctx.has_input(2)) return ctx.Error("input 2 (RNG state) is missing");
  const TensorView& rng = ctx.input(2);
  if (rng.dtype != DType::kInt64 || rng.num_elements() != 2) {
    return ctx.Error("input 2 (RNG state) must be int64 [seed, counter]");
  }
  const int64_t n = data.num_elements();
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, data.dtype, data.dims));
  uint8_t* mask = nullptr;
  if (ctx.has_output(1)) {
    CASTOR_ASSIGN_OR_RETURN(TensorView * m, ctx.Output(1, DType::kBool, data.dims));
    mask = m->as<uint8_t>();
  }
  const float scale = 1.0f / (1.0f - ratio);
  const uint64_t run_seed = static_cast<uint64_t>(rng.as<int64_t>()[0]);
  const uint64_t call = static_cast<uint64_t>(rng.as<int64_t>()[1]);
  const uint64_t key = common::DropoutKey(run_seed, common::DropoutNodeStream(ctx.node().name()));
  const uint32_t threshold = common::DropoutThreshold(ratio);
  bool handled = DispatchFloat(data.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data.as<T>();
    T* y = out->as<T>();
    // Groups of four elements share a Philox block; blocks of kGroups
    // groups are drawn at once.
    constexpr int64_t kGroups = 64;
    ParallelFor(0, (n + 3) / 4, 4096, [&](int64_t group_lo, int64_t group_hi) {
      uint32_t words[4 * kGroups];
      for (int64_t g = group_lo; g < group_hi; g += kGroups) {
        const int64_t count = std::min(kGroups, group_hi - g);
        DropoutWordsOfGroups(key, call, static_cast<uint64_t>(g), count, words);
        const int64_t first = 4 * g, last = std::min(n, 4 * (g + count));
        for (int64_t i = first; i < last; ++i) {
          const bool keep = words[i - first] >= threshold;
          if (mask != nullptr) mask[i] = keep ? 1 : 0;
          if constexpr (std::is_same_v<T, double>) {
            y[i] = keep ? x[i] * static_cast<double>(scale) : 0.0;
          } else {
            StoreF(&y[i], keep ? LoadF(x[i]) * scale : 0.0f);
          }
        }
      }
    });
  });
  if (!handled) return ctx.Error(absl::StrCat("data is ", DTypeName(data.dtype)));
  return absl::OkStatus();
}

// ---- Range ---------------------------------------------------------------------

absl::Status RunRange(KernelContext& ctx) {
  const TensorView& start = ctx.input(0);
  const TensorView& limit = ctx.input(1);
  const TensorView& delta = ctx.input(2);
  for (const TensorView* t : {&start, &limit, &delta}) {
    if (t->num_elements() != 1) return ctx.Error("start, limit and delta must hold one value");
    if (t->dtype != start.dtype) return ctx.Error("start, limit and delta must share a dtype");
  }
  absl::Status status = absl::OkStatus();
  const DType dtype = start.dtype;
  auto fill = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = *start.as<T>(), l = *limit.as<T>(), d = *delta.as<T>();
    if (d == 0) {
      status = ctx.Error("delta is 0");
      return;
    }
    int64_t count;
    if constexpr (std::is_floating_point_v<T>) {
      count = static_cast<int64_t>(std::max(std::ceil((static_cast<double>(l) - s) / d), 0.0));
    } else {
      const int64_t span = static_cast<int64_t>(l) - static_cast<int64_t>(s);
      const int64_t step = d;
      count =
          (span > 0) != (step > 0) || span == 0 ? 0 : (span + step + (step > 0 ? -1 : 1)) / step;
    }
    absl::StatusOr<TensorView*> out = ctx.Output(0, dtype, {count});
    if (!out.ok()) {
      status = out.status();
      return;
    }
    T* y = (*out)->as<T>();
    for (int64_t i = 0; i < count; ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        y[i] = static_cast<T>(static_cast<double>(s) + static_cast<double>(i) * d);
      } else {
        y[i] = static_cast<T>(static_cast<int64_t>(s) + i * static_cast<int64_t>(d));
      }
    }
  };
  switch (dtype) {
    case DType::kFloat32: fill(TypeTag<float>{}); break;
    case DType::kFloat64: fill(TypeTag<double>{}); break;
    case DType::kInt16: fill(TypeTag<int16_t>{}); break;
    case DType::kInt32: fill(TypeTag<int32_t>{}); break;
    case DType::kInt64: fill(TypeTag<int64_t>{}); break;
    default:
      return ctx.Error(absl::StrCat("inputs are ", DTypeName(dtype),
                                    "; Range takes float32, float64, int16, int32 or int64"));
  }
  return status;
}

}  // namespace

void RegisterMiscKernels(KernelTable& table) {
  table.Register(KernelDef{"", "Cast", NoStringTensors, RunCast, false});
  table.Register(KernelDef{"", "Constant", NoStringTensors, RunConstant, false});
  table.Register(KernelDef{"", "ConstantOfShape", NoStringTensors, RunConstantOfShape, false});
  table.Register(KernelDef{"", "Identity", NoStringTensors, RunIdentity, /*in_place_ok=*/true});
  table.Register(KernelDef{"", "Dropout", NoStringTensors, RunDropout, /*in_place_ok=*/true});
  table.Register(KernelDef{kCastorDomain, "DropoutTraining", NoStringTensors, RunDropoutTraining,
                           /*in_place_ok=*/true});
  table.Register(KernelDef{"", "Range", NoStringTensors, RunRange, false});
}

}  // namespace castor::cpu
