// CUDA kernels: elementwise family (the CPU's backend/cpu/elementwise.cc,
// Cast from misc.cc and com.castor ReluGrad from elementwise.cc).
//
// Unary math/activations (Neg Abs Sign on floats, int32 and int64; Floor Ceil
// Round Relu LeakyRelu HardSigmoid HardSwish Elu Selu Celu Softplus Softsign
// ThresholdedRelu Mish Sigmoid Tanh Gelu Erf Exp Log Sqrt Reciprocal Clip, Sin
// Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh),
// PRelu (a slope broadcast to X), binary arithmetic with numpy broadcasting
// (Add Sub Mul Div on float32/float16/bfloat16/int32/int64, Pow with a float
// base and a float or int exponent), Mod, the comparisons Equal Less Greater
// LessOrEqual GreaterOrEqual and the logic And Or Xor Not (bool out),
// IsNaN/IsInf, Where (three-way broadcast), the variadic Sum/Max/Min, Cast
// and ReluGrad. The scalar arithmetic is backend/common/elementwise_math.h,
// the functors the CPU runs; this file loads, broadcasts
// (backend/cuda/broadcast.cuh) and stores. 16-bit floats compute in float32
// and round once on store; integers compute in their own type (wrapping).
// Every kernel is a grid-stride loop over output elements; each thread reads
// its inputs for an element before writing it, so output 0 may alias input 0
// (in_place_ok) where the output has input 0's dtype (then the executor's
// equal-bytes rule means equal shapes): the arithmetic, unary and variadic
// ops, as on the CPU. The comparisons, the binary logic and the predicates
// are not in place (see Equal's registration).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/elementwise_math.h"
#include "backend/common/op_geometry.h"
#include "backend/cuda/broadcast.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

// ---- storage and compute values --------------------------------------------------

template <typename T>
inline constexpr bool kIs16BitFloat =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// The type arithmetic on storage type T runs in: float for the 16-bit
// floats, T itself otherwise (float, int32, int64, bool).
template <typename T>
using Compute = std::conditional_t<kIs16BitFloat<T>, float, T>;

template <typename T>
__device__ __forceinline__ Compute<T> Load(T v) {
  if constexpr (kIs16BitFloat<T>) {
    return ToFloat(v);
  } else {
    return v;
  }
}

// Stores a compute value, rounding once for 16-bit floats.
template <typename T, typename V>
__device__ __forceinline__ void Store(T* p, V v) {
  if constexpr (kIs16BitFloat<T>) {
    *p = FromFloat<T>(static_cast<float>(v));
  } else {
    *p = static_cast<T>(v);
  }
}

// ---- host helpers ------------------------------------------------------------------

const std::vector<DType> kFloats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const std::vector<DType> kNumeric = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                     DType::kInt32, DType::kInt64};

std::vector<DType> Join(std::vector<DType> a, const std::vector<DType>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Calls f(TypeTag<T>{}) for the CUDA storage type of a float, int32 or int64
// dtype (and bool when kWithBool); other dtypes are the node's Unimplemented
// error.
template <bool kWithBool = false, typename F>
absl::Status DispatchNumeric(const KernelContext& ctx, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kInt32: return f(TypeTag<int32_t>{});
    case DType::kInt64: return f(TypeTag<int64_t>{});
    case DType::kBool:
      if constexpr (kWithBool) return f(TypeTag<bool>{});
      break;
    default: break;
  }
  return DispatchFloat(ctx, dtype, f);
}

// Launches `kernel` over `n` elements in a grid-stride loop on ctx's
// stream (nothing for n == 0) and checks the launch.
template <typename... Params, typename... Args>
absl::Status Launch(const KernelContext& ctx, int64_t n, void (*kernel)(Params...),
                    Args&&... args) {
  if (n <= 0) return absl::OkStatus();
  kernel<<<Blocks(n), kThreads, 0, Stream(ctx)>>>(std::forward<Args>(args)...);
  return CheckLaunch(ctx);
}

// Copies `bytes` between two device buffers on ctx's stream (nothing when
// they are the same buffer, as when the executor runs a node in place).
absl::Status CopyDevice(const KernelContext& ctx, void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return absl::OkStatus();
  CASTOR_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, Stream(ctx)));
  return absl::OkStatus();
}

using common::RequireSameDType;

// The broadcast output dims of inputs [first, first + count).
absl::StatusOr<std::vector<int64_t>> OutputDims(const KernelContext& ctx, int first, int count) {
  std::vector<std::vector<int64_t>> dims;
  for (int i = first; i < first + count; ++i) dims.push_back(ctx.input(i).dims);
  absl::StatusOr<std::vector<int64_t>> out = BroadcastDims(dims);
  if (!out.ok()) return NodeStatus(ctx, out.status());
  return out;
}

// The geometry of inputs `indices` broadcast to `out_dims`.
template <int kInputs>
absl::StatusOr<Broadcast<kInputs>> Geometry(const KernelContext& ctx,
                                            const std::vector<int>& indices,
                                            const std::vector<int64_t>& out_dims) {
  std::vector<std::vector<int64_t>> dims;
  for (int i : indices) dims.push_back(ctx.input(i).dims);
  absl::StatusOr<Broadcast<kInputs>> geometry = MakeBroadcast<kInputs>(dims, out_dims);
  if (!geometry.ok()) return NodeStatus(ctx, geometry.status());
  return geometry;
}

// ---- unary -------------------------------------------------------------------------

// y[i] = op(x[i]) in float32.
template <typename T, typename Op>
__global__ void UnaryKernel(const T* x, T* y, int64_t n, Op op) {
  CASTOR_GRID_STRIDE(i, n) { Store(&y[i], op(Load(x[i]))); }
}

template <typename Op>
absl::Status RunUnary(KernelContext& ctx, const Op& op) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  const int64_t n = x.num_elements();
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Launch(ctx, n, UnaryKernel<T, Op>, x.as<const T>(), y->as<T>(), n, op);
  });
}

template <typename Op>
absl::Status UnaryOpKernel(KernelContext& ctx) {
  return RunUnary(ctx, Op{});
}

// Unary ops that take int32 and int64 too (Neg, Abs, Sign), computed in the
// integer type itself.
template <typename Op>
absl::Status NumericUnaryOpKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, x.dims));
  const int64_t n = x.num_elements();
  return DispatchNumeric(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Launch(ctx, n, UnaryKernel<T, Op>, x.as<const T>(), y->as<T>(), n, Op{});
  });
}

absl::Status LeakyReluKernel(KernelContext& ctx) {
  return RunUnary(ctx, math::LeakyReluOp{ctx.GetFloat("alpha", 0.01f)});
}

// Not: bool in, bool out.
absl::Status NotKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  if (x.dtype != DType::kBool) {
    return ctx.Error(absl::StrCat("input 0 is ", DTypeName(x.dtype), "; expected bool"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, DType::kBool, x.dims));
  const int64_t n = x.num_elements();
  return Launch(ctx, n, UnaryKernel<bool, math::NotOp>, x.as<const bool>(), y->as<bool>(), n,
                math::NotOp{});
}

// out[i] = op(x[i]) as bool (IsNaN, IsInf), in float32.
template <typename T, typename Op>
__global__ void PredicateKernel(const T* x, bool* out, int64_t n, Op op) {
  CASTOR_GRID_STRIDE(i, n) { out[i] = op(Load(x[i])); }
}

template <typename Op>
absl::Status RunPredicate(KernelContext& ctx, const Op& op) {
  const TensorView& x = ctx.input(0);
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, DType::kBool, x.dims));
  const int64_t n = x.num_elements();
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Launch(ctx, n, PredicateKernel<T, Op>, x.as<const T>(), y->as<bool>(), n, op);
  });
}

absl::Status IsNanKernel(KernelContext& ctx) { return RunPredicate(ctx, math::IsNanOp{}); }

absl::Status IsInfKernel(KernelContext& ctx) {
  return RunPredicate(ctx, math::IsInfOp{ctx.GetInt("detect_negative", 1) != 0,
                                         ctx.GetInt("detect_positive", 1) != 0});
}

absl::Status EluKernel(KernelContext& ctx) {
  return RunUnary(ctx, math::EluOp{ctx.GetFloat("alpha", 1.0f)});
}

absl::Status SeluKernel(KernelContext& ctx) {
  const math::SeluOp defaults;
  return RunUnary(ctx, math::SeluOp{ctx.GetFloat("alpha", defaults.alpha),
                                    ctx.GetFloat("gamma", defaults.gamma)});
}

absl::Status CeluKernel(KernelContext& ctx) {
  return RunUnary(ctx, math::CeluOp{ctx.GetFloat("alpha", 1.0f)});
}

absl::Status ThresholdedReluKernel(KernelContext& ctx) {
  return RunUnary(ctx, math::ThresholdedReluOp{ctx.GetFloat("alpha", 1.0f)});
}

absl::Status HardSigmoidKernel(KernelContext& ctx) {
  return RunUnary(ctx,
                  math::HardSigmoidOp{ctx.GetFloat("alpha", 0.2f), ctx.GetFloat("beta", 0.5f)});
}

absl::Status GeluKernel(KernelContext& ctx) {
  const std::string approximate = ctx.GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return ctx.Error(absl::StrCat("attribute 'approximate' is \"", approximate,
                                  "\"; expected \"none\" or \"tanh\""));
  }
  return RunUnary(ctx, math::GeluOp{approximate == "tanh"});
}

// Clip's bounds: the device scalars of inputs 1/2 (opset 11+) when given,
// else `low` / `high` (the attributes before opset 11, or +-infinity).
template <typename T>
struct ClipBoundsOp {
  const T* low_input;
  const T* high_input;
  float low;
  float high;
  __device__ float operator()(float x) const {
    const float lo = low_input != nullptr ? Load(*low_input) : low;
    const float hi = high_input != nullptr ? Load(*high_input) : high;
    return math::ClipOp<float>{lo, hi}(x);
  }
};

absl::Status ClipKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const bool bounds_are_inputs = ctx.opset() >= 11;
  CASTOR_RETURN_IF_ERROR(common::CheckClipBounds(ctx));
  float low = -std::numeric_limits<float>::infinity();
  float high = std::numeric_limits<float>::infinity();
  if (!bounds_are_inputs) {
    if (ctx.node().has_attribute("min")) low = ctx.GetFloat("min", 0.0f);
    if (ctx.node().has_attribute("max")) high = ctx.GetFloat("max", 0.0f);
  }
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* low_input =
        bounds_are_inputs && ctx.has_input(1) ? ctx.input(1).as<const T>() : nullptr;
    const T* high_input =
        bounds_are_inputs && ctx.has_input(2) ? ctx.input(2).as<const T>() : nullptr;
    return RunUnary(ctx, ClipBoundsOp<T>{low_input, high_input, low, high});
  });
}

// ---- binary ------------------------------------------------------------------------

// out[i] = op(a, b) at each input's broadcast offset, computed in the
// inputs' compute types and stored once.
template <typename TA, typename TB, typename TO, typename Op>
__global__ void BinaryKernel(Broadcast<2> geometry, const TA* a, const TB* b, TO* out, int64_t n,
                             Op op) {
  CASTOR_GRID_STRIDE(i, n) {
    int64_t offsets[2];
    geometry.Offsets(i, offsets);
    Store(&out[i], op(Load(a[offsets[0]]), Load(b[offsets[1]])));
  }
}

template <typename TA, typename TB, typename TO, typename Op>
absl::Status RunBinary(KernelContext& ctx, const std::vector<int64_t>& out_dims, TO* out,
                       const Op& op) {
  CASTOR_ASSIGN_OR_RETURN(Broadcast<2> geometry, Geometry<2>(ctx, {0, 1}, out_dims));
  int64_t n = 1;
  for (int64_t d : out_dims) n *= d;
  return Launch(ctx, n, BinaryKernel<TA, TB, TO, Op>, geometry, ctx.input(0).as<const TA>(),
                ctx.input(1).as<const TB>(), out, n, op);
}

// Add, Sub, Mul, Div, Mod: float32/float16/bfloat16/int32/int64, output
// the inputs' dtype.
template <typename Op>
absl::Status RunArithmetic(KernelContext& ctx, const Op& op) {
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, 1));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, 2));
  const DType dtype = ctx.input(0).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, dtype, out_dims));
  return DispatchNumeric(ctx, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunBinary<T, T, T>(ctx, out_dims, out->as<T>(), op);
  });
}

template <typename Op>
absl::Status ArithmeticKernel(KernelContext& ctx) {
  return RunArithmetic(ctx, Op{});
}

absl::Status ModKernel(KernelContext& ctx) {
  const int64_t fmod = ctx.GetInt("fmod", 0);
  if (fmod != 0 && fmod != 1) {
    return ctx.Error(absl::StrCat("attribute 'fmod' is ", fmod, "; expected 0 or 1"));
  }
  return RunArithmetic(ctx, math::ModOp{fmod == 1});
}

// Equal, Less, Greater, LessOrEqual, GreaterOrEqual: float, int32, int64
// or bool in, bool out (floats by value: +0 == -0, NaN compares false).
template <typename Op>
absl::Status CompareKernel(KernelContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, 1));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, 2));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, DType::kBool, out_dims));
  return DispatchNumeric</*kWithBool=*/true>(ctx, ctx.input(0).dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunBinary<T, T, bool>(ctx, out_dims, out->as<bool>(), Op{});
  });
}

// And, Or, Xor: bool in, bool out.
template <typename Op>
absl::Status LogicKernel(KernelContext& ctx) {
  for (int i : {0, 1}) {
    if (ctx.input(i).dtype != DType::kBool) {
      return ctx.Error(absl::StrCat("input ", i, " is ", DTypeName(ctx.input(i).dtype),
                                    "; expected bool"));
    }
  }
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, 2));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, DType::kBool, out_dims));
  return RunBinary<bool, bool, bool>(ctx, out_dims, out->as<bool>(), Op{});
}

// PRelu: X and a slope that broadcasts to X's shape (float, int32, int64).
absl::Status PReluKernel(KernelContext& ctx) {
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, 1));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, 2));
  const TensorView& x = ctx.input(0);
  if (out_dims != x.dims) {
    return ctx.Error(absl::StrCat("slope ", DimsToString(ctx.input(1).dims),
                                  " must broadcast to X ", DimsToString(x.dims),
                                  " without growing it (unidirectional)"));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, x.dtype, x.dims));
  return DispatchNumeric(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return RunBinary<T, T, T>(ctx, out_dims, out->as<T>(), math::PReluOp{});
  });
}

// Pow: a float base and a float, int32 or int64 exponent; output the base's
// dtype (float32 math: pow(base, float(exponent))).
absl::Status PowKernel(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, 2));
  const DType dtype = ctx.input(0).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, dtype, out_dims));
  return DispatchFloat(ctx, dtype, [&](auto base_tag) {
    using TB = typename decltype(base_tag)::type;
    return DispatchNumeric(ctx, ctx.input(1).dtype, [&](auto exponent_tag) {
      using TE = typename decltype(exponent_tag)::type;
      return RunBinary<TB, TE, TB>(ctx, out_dims, out->as<TB>(), math::PowOp{});
    });
  });
}

// ---- variadic ----------------------------------------------------------------------

// Inputs one variadic pass reads.
inline constexpr int kVariadicInputs = 8;

template <typename T>
struct VariadicInputs {
  const T* data[kVariadicInputs];
  int count;
};

// One pass of Sum/Max/Min: acc = acc_in[i] (or input 0 when acc_in is null)
// combined with each input of the pass in order, in float32; then either
// kept in float32 for the next pass (acc_out) or rounded once into out.
// acc_in and acc_out may be the same buffer (element i is read, then
// written, by the same thread).
template <typename T, typename Op>
__global__ void VariadicKernel(Broadcast<kVariadicInputs> geometry, VariadicInputs<T> inputs,
                               const float* acc_in, float* acc_out, T* out, int64_t n, Op op) {
  CASTOR_GRID_STRIDE(i, n) {
    int64_t offsets[kVariadicInputs];
    geometry.Offsets(i, offsets);
    float acc = acc_in != nullptr ? acc_in[i] : Load(inputs.data[0][offsets[0]]);
#pragma unroll
    for (int k = 0; k < kVariadicInputs; ++k) {
      if (k < inputs.count && (k > 0 || acc_in != nullptr)) {
        acc = op(acc, Load(inputs.data[k][offsets[k]]));
      }
    }
    if (acc_out != nullptr) {
      acc_out[i] = acc;
    } else {
      Store(&out[i], acc);
    }
  }
}

// Sum, Max, Min of one or more broadcast float inputs, combined in input
// order in float32 and rounded once (the CPU's order and rounding). More
// than kVariadicInputs inputs run in passes through a float32 scratch
// accumulator.
template <typename Op>
absl::Status VariadicOpKernel(KernelContext& ctx) {
  const int n = ctx.num_inputs();
  if (n < 1) return ctx.Error("needs at least one input");
  for (int i = 0; i < n; ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
  }
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, n - 1));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, n));
  const DType dtype = ctx.input(0).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, dtype, out_dims));
  const int64_t count = out->num_elements();
  if (n == 1) return CopyDevice(ctx, out->data, ctx.input(0).data, out->byte_size());
  if (count == 0) return absl::OkStatus();
  float* acc = nullptr;
  if (n > kVariadicInputs) {
    CASTOR_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(static_cast<size_t>(count) * sizeof(float)));
    acc = static_cast<float*>(scratch);
  }
  return DispatchFloat(ctx, dtype, [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    for (int first = 0; first < n; first += kVariadicInputs) {
      const int last = std::min(n, first + kVariadicInputs);  // exclusive
      std::vector<int> indices;
      VariadicInputs<T> inputs = {};
      for (int i = first; i < last; ++i) {
        inputs.data[inputs.count++] = ctx.input(i).as<const T>();
        indices.push_back(i);
      }
      CASTOR_ASSIGN_OR_RETURN(Broadcast<kVariadicInputs> geometry,
                              Geometry<kVariadicInputs>(ctx, indices, out_dims));
      const float* acc_in = first == 0 ? nullptr : acc;
      float* acc_out = last == n ? nullptr : acc;
      CASTOR_RETURN_IF_ERROR(Launch(ctx, count, VariadicKernel<T, Op>, geometry, inputs, acc_in,
                                    acc_out, out->as<T>(), count, Op{}));
    }
    return absl::OkStatus();
  });
}

// ---- Where -------------------------------------------------------------------------

// out = condition ? x : y with three-way broadcasting; x and y are copied
// as raw elements of their size.
template <typename Raw>
__global__ void WhereKernel(Broadcast<3> geometry, const uint8_t* condition, const Raw* x,
                            const Raw* y, Raw* out, int64_t n) {
  CASTOR_GRID_STRIDE(i, n) {
    int64_t offsets[3];
    geometry.Offsets(i, offsets);
    out[i] = condition[offsets[0]] != 0 ? x[offsets[1]] : y[offsets[2]];
  }
}

absl::Status WhereOpKernel(KernelContext& ctx) {
  const TensorView& condition = ctx.input(0);
  if (condition.dtype != DType::kBool) {
    return ctx.Error(absl::StrCat("input 0 (condition) is ", DTypeName(condition.dtype),
                                  "; expected bool"));
  }
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 1, 2));
  CASTOR_ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, OutputDims(ctx, 0, 3));
  const DType dtype = ctx.input(1).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, dtype, out_dims));
  CASTOR_ASSIGN_OR_RETURN(Broadcast<3> geometry, Geometry<3>(ctx, {0, 1, 2}, out_dims));
  const int64_t n = out->num_elements();
  auto run = [&](auto tag) {
    using Raw = typename decltype(tag)::type;
    return Launch(ctx, n, WhereKernel<Raw>, geometry, condition.as<const uint8_t>(),
                  ctx.input(1).as<const Raw>(), ctx.input(2).as<const Raw>(), out->as<Raw>(), n);
  };
  switch (DTypeSize(dtype)) {
    case 1: return run(TypeTag<uint8_t>{});
    case 2: return run(TypeTag<uint16_t>{});
    case 4: return run(TypeTag<uint32_t>{});
    case 8: return run(TypeTag<uint64_t>{});
    default:
      return ctx.Unimplemented(absl::StrCat("input 1 has dtype ", DTypeName(dtype),
                                            ", which the CUDA kernel lacks"));
  }
}

// ---- ReluGrad ----------------------------------------------------------------------

// dX = dY where Y > 0, else +0.
template <typename T>
__global__ void ReluGradKernel(const T* dy, const T* y, T* dx, int64_t n) {
  CASTOR_GRID_STRIDE(i, n) { dx[i] = ToFloat(y[i]) > 0.0f ? dy[i] : FromFloat<T>(0.0f); }
}

absl::Status ReluGradOpKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& y = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "Y"));
  CASTOR_RETURN_IF_ERROR(common::RequireDims(ctx, 0, "dY", y.dims, "Y's shape"));
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, y.dtype, y.dims));
  const int64_t n = y.num_elements();
  return DispatchFloat(ctx, y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Launch(ctx, n, ReluGradKernel<T>, dy.as<const T>(), y.as<const T>(), dx->as<T>(), n);
  });
}

// ---- GeluGrad ----------------------------------------------------------------------

// dX = dY * Gelu'(X) in float32 (math::GeluGradOp), rounded once.
template <typename T>
__global__ void GeluGradKernel(const T* dy, const T* x, T* dx, int64_t n,
                               math::GeluGradOp op) {
  CASTOR_GRID_STRIDE(i, n) { Store(&dx[i], op(Load(dy[i]), Load(x[i]))); }
}

absl::Status GeluGradOpKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  CASTOR_RETURN_IF_ERROR(RequireSameDType(ctx, 0, "dY", 1, "X"));
  CASTOR_RETURN_IF_ERROR(common::RequireDims(ctx, 0, "dY", x.dims, "X's shape"));
  const std::string approximate = ctx.GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return ctx.Error(absl::StrCat("attribute 'approximate' is \"", approximate,
                                  "\"; expected \"none\" or \"tanh\""));
  }
  CASTOR_ASSIGN_OR_RETURN(TensorView * dx, ctx.Output(0, x.dtype, x.dims));
  const int64_t n = x.num_elements();
  return DispatchFloat(ctx, x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return Launch(ctx, n, GeluGradKernel<T>, dy.as<const T>(), x.as<const T>(), dx->as<T>(), n,
                  math::GeluGradOp{approximate == "tanh"});
  });
}

// ---- Cast --------------------------------------------------------------------------
// The CPU's semantics (backend/cpu/misc.cc): float targets round to nearest
// even once (float64 -> 16-bit through a round-to-odd float32, int ->
// bfloat16 through a round-to-odd float32); float -> int truncates toward
// zero, NaN -> 0, out-of-range values saturate to int64 and then wrap to
// narrower ints; x -> bool is `x != 0` (NaN is true); bool -> x is 0 or 1.

// Storage of a bool element (one byte; any nonzero value reads as true).
struct BoolByte {
  uint8_t value;
};

// The dtypes the CUDA Cast converts between.
const std::vector<DType> kCastTypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                       DType::kBFloat16, DType::kInt8,    DType::kUInt8,
                                       DType::kInt32,   DType::kInt64,   DType::kBool};

// Returns f(TypeTag<T>{}) for the storage type T of a dtype in kCastTypes,
// `otherwise` for other dtypes.
template <typename F>
absl::Status DispatchCastType(DType dtype, const absl::Status& otherwise, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat64: return f(TypeTag<double>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    case DType::kInt8: return f(TypeTag<int8_t>{});
    case DType::kUInt8: return f(TypeTag<uint8_t>{});
    case DType::kInt32: return f(TypeTag<int32_t>{});
    case DType::kInt64: return f(TypeTag<int64_t>{});
    case DType::kBool: return f(TypeTag<BoolByte>{});
    default: return otherwise;
  }
}

// float -> integer: truncation toward zero; NaN -> 0; out of range
// saturates to int64, then wraps to narrower types.
template <typename Int>
__device__ Int FloatToInteger(double d) {
  if (d != d) return 0;
  const double t = trunc(d);
  constexpr double kTwo63 = 9223372036854775808.0;
  int64_t i;
  if (t >= kTwo63) {
    i = INT64_MAX;
  } else if (t < -kTwo63) {
    i = INT64_MIN;
  } else {
    i = static_cast<int64_t>(t);
  }
  return static_cast<Int>(i);
}

// `d` rounded to float32 with round-to-odd (truncate, then set the last bit
// when inexact), so a second rounding to a narrower format is exact RNE.
__device__ float RoundToOddFloat(double d) {
  const float f = __double2float_rz(d);  // +-FLT_MAX beyond the range, inf stays inf
  if (d != d || static_cast<double>(f) == d) return f;
  return __uint_as_float(__float_as_uint(f) | 1u);
}

// An integer rounded to float32 with round-to-odd.
template <typename Int>
__device__ float IntegerToFloatRoundToOdd(Int v) {
  bool negative = false;
  if constexpr (std::is_signed_v<Int>) negative = v < 0;
  uint64_t magnitude = static_cast<uint64_t>(static_cast<int64_t>(v));
  if (negative) magnitude = 0 - magnitude;
  if (magnitude < (uint64_t{1} << 24)) {
    const float f = static_cast<float>(magnitude);
    return negative ? -f : f;
  }
  const int bits = 64 - __clzll(static_cast<long long>(magnitude));
  const int shift = bits - 24;  // 1..40
  uint64_t kept = magnitude >> shift;
  if (magnitude & ((uint64_t{1} << shift) - 1)) kept |= 1;
  const float f = ldexpf(static_cast<float>(kept), shift);  // exact: kept < 2^24
  return negative ? -f : f;
}

template <typename Dst>
__device__ Dst FromFloat32Value(float f) {
  if constexpr (std::is_same_v<Dst, float>) {
    return f;
  } else if constexpr (std::is_same_v<Dst, double>) {
    return static_cast<double>(f);
  } else if constexpr (kIs16BitFloat<Dst>) {
    return FromFloat<Dst>(f);
  } else {
    return FloatToInteger<Dst>(static_cast<double>(f));
  }
}

template <typename Dst>
__device__ Dst FromFloat64Value(double d) {
  if constexpr (std::is_same_v<Dst, float>) {
    return static_cast<float>(d);
  } else if constexpr (std::is_same_v<Dst, double>) {
    return d;
  } else if constexpr (kIs16BitFloat<Dst>) {
    return FromFloat<Dst>(RoundToOddFloat(d));
  } else {
    return FloatToInteger<Dst>(d);
  }
}

template <typename Dst, typename Int>
__device__ Dst FromIntegerValue(Int v) {
  if constexpr (std::is_same_v<Dst, float> || std::is_same_v<Dst, double>) {
    return static_cast<Dst>(v);
  } else if constexpr (std::is_same_v<Dst, __half>) {
    // Exact below 2^24; above, float16 overflows to infinity either way.
    return FromFloat<__half>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Dst, __nv_bfloat16>) {
    return FromFloat<__nv_bfloat16>(IntegerToFloatRoundToOdd(v));
  } else {
    return static_cast<Dst>(v);
  }
}

template <typename Src>
__device__ bool IsNonZero(Src v) {
  if constexpr (std::is_same_v<Src, double>) {
    return v != 0.0;
  } else if constexpr (std::is_same_v<Src, float> || kIs16BitFloat<Src>) {
    return ToFloat(v) != 0.0f;  // NaN is nonzero
  } else if constexpr (std::is_same_v<Src, BoolByte>) {
    return v.value != 0;
  } else {
    return v != 0;
  }
}

template <typename Dst, typename Src>
__device__ Dst CastElement(Src v) {
  if constexpr (std::is_same_v<Dst, BoolByte>) {
    return BoolByte{static_cast<uint8_t>(IsNonZero(v) ? 1 : 0)};
  } else if constexpr (std::is_same_v<Src, BoolByte>) {
    return FromIntegerValue<Dst>(static_cast<uint8_t>(v.value != 0 ? 1 : 0));
  } else if constexpr (std::is_same_v<Src, double>) {
    return FromFloat64Value<Dst>(v);
  } else if constexpr (std::is_same_v<Src, float> || kIs16BitFloat<Src>) {
    return FromFloat32Value<Dst>(ToFloat(v));  // 16-bit floats widen exactly
  } else {
    return FromIntegerValue<Dst>(v);
  }
}

template <typename Src, typename Dst>
__global__ void CastKernel(const Src* in, Dst* out, int64_t n) {
  CASTOR_GRID_STRIDE(i, n) { out[i] = CastElement<Dst>(in[i]); }
}

bool IsCastType(DType dtype) {
  for (DType d : kCastTypes) {
    if (d == dtype) return true;
  }
  return false;
}

std::string CastTypeNames() {
  std::string names;
  for (DType d : kCastTypes) absl::StrAppend(&names, names.empty() ? "" : ", ", DTypeName(d));
  return names;
}

absl::Status CastSupports(const Node& node) {
  const Value* in = node.input(0);
  if (in == nullptr || !IsCastType(in->dtype())) {
    return absl::UnimplementedError(absl::StrCat(
        "input 0 is ", in != nullptr ? DTypeName(in->dtype()) : "absent",
        ", the CUDA Cast converts between ", CastTypeNames()));
  }
  absl::StatusOr<DType> to = DTypeFromOnnx(static_cast<int32_t>(node.GetInt("to", 0)));
  if (!to.ok()) return to.status();
  if (!IsCastType(*to)) {
    return absl::UnimplementedError(absl::StrCat("cast to ", DTypeName(*to),
                                                 ": the CUDA Cast converts between ",
                                                 CastTypeNames()));
  }
  return absl::OkStatus();
}

absl::Status CastKernelRun(KernelContext& ctx) {
  const TensorView& in = ctx.input(0);
  absl::StatusOr<DType> to = DTypeFromOnnx(static_cast<int32_t>(ctx.GetInt("to", 0)));
  if (!to.ok()) return ctx.Error(std::string(to.status().message()));
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(0, *to, in.dims));
  const int64_t n = in.num_elements();
  if (in.dtype == *to && in.dtype != DType::kBool) {
    return CopyDevice(ctx, out->data, in.data, out->byte_size());
  }
  const absl::Status unsupported = ctx.Unimplemented(absl::StrCat(
      "cast ", DTypeName(in.dtype), " -> ", DTypeName(*to), ": the CUDA Cast converts between ",
      CastTypeNames()));
  return DispatchCastType(in.dtype, unsupported, [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    return DispatchCastType(*to, unsupported, [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      return Launch(ctx, n, CastKernel<Src, Dst>, in.as<const Src>(), out->as<Dst>(), n);
    });
  });
}

// ---- registration ------------------------------------------------------------------

void Add(KernelTable& table, const std::string& op, SupportsFn supports, KernelFn run,
         bool in_place_ok, const std::string& domain = "") {
  KernelDef def;
  def.domain = domain;
  def.op_type = op;
  def.supports = std::move(supports);
  def.run = run;
  def.in_place_ok = in_place_ok;
  table.Register(std::move(def));
}

// Pow: a float base and a float, int32 or int64 exponent.
absl::Status PowSupports(const Node& node) {
  CASTOR_RETURN_IF_ERROR(InputDTypeIn(0, kFloats)(node));
  return InputDTypeIn(1, kNumeric)(node);
}

}  // namespace

void RegisterElementwiseKernels(KernelTable& table) {
  using namespace math;  // NOLINT: the functor names read best unqualified here
  const std::vector<DType> floats = kFloats;
  const bool in_place = true;

  Add(table, "Add", InputDTypeIn(0, kNumeric), &ArithmeticKernel<AddOp>, in_place);
  Add(table, "Sub", InputDTypeIn(0, kNumeric), &ArithmeticKernel<SubOp>, in_place);
  Add(table, "Mul", InputDTypeIn(0, kNumeric), &ArithmeticKernel<MulOp>, in_place);
  Add(table, "Div", InputDTypeIn(0, kNumeric), &ArithmeticKernel<DivOp>, in_place);
  Add(table, "Pow", &PowSupports, &PowKernel, in_place);
  // Not in place: a bool output the size of a wider input 0 is a broadcast
  // of it (Equal([2] float32, [4, 2])), whose bytes other threads still read.
  Add(table, "Equal", InputDTypeIn(0, Join(kNumeric, {DType::kBool})), &CompareKernel<EqualOp>,
      /*in_place_ok=*/false);
  Add(table, "Less", InputDTypeIn(0, kNumeric), &CompareKernel<LessOp>, /*in_place_ok=*/false);
  Add(table, "Greater", InputDTypeIn(0, kNumeric), &CompareKernel<GreaterOp>,
      /*in_place_ok=*/false);
  Add(table, "LessOrEqual", InputDTypeIn(0, kNumeric), &CompareKernel<LessOrEqualOp>,
      /*in_place_ok=*/false);
  Add(table, "GreaterOrEqual", InputDTypeIn(0, kNumeric), &CompareKernel<GreaterOrEqualOp>,
      /*in_place_ok=*/false);
  const std::vector<DType> bools = {DType::kBool};
  Add(table, "And", InputDTypeIn(0, bools), &LogicKernel<AndOp>, /*in_place_ok=*/false);
  Add(table, "Or", InputDTypeIn(0, bools), &LogicKernel<OrOp>, /*in_place_ok=*/false);
  Add(table, "Xor", InputDTypeIn(0, bools), &LogicKernel<XorOp>, /*in_place_ok=*/false);
  Add(table, "Not", InputDTypeIn(0, bools), &NotKernel, in_place);
  Add(table, "Mod", InputDTypeIn(0, kNumeric), &ModKernel, in_place);
  Add(table, "IsNaN", InputDTypeIn(0, floats), &IsNanKernel, /*in_place_ok=*/false);
  Add(table, "IsInf", InputDTypeIn(0, floats), &IsInfKernel, /*in_place_ok=*/false);

  Add(table, "Neg", InputDTypeIn(0, kNumeric), &NumericUnaryOpKernel<NegOp>, in_place);
  Add(table, "Abs", InputDTypeIn(0, kNumeric), &NumericUnaryOpKernel<AbsOp>, in_place);
  Add(table, "Sign", InputDTypeIn(0, kNumeric), &NumericUnaryOpKernel<SignOp>, in_place);
  Add(table, "Floor", InputDTypeIn(0, floats), &UnaryOpKernel<FloorOp>, in_place);
  Add(table, "Ceil", InputDTypeIn(0, floats), &UnaryOpKernel<CeilOp>, in_place);
  Add(table, "Round", InputDTypeIn(0, floats), &UnaryOpKernel<RoundOp>, in_place);
  Add(table, "Relu", InputDTypeIn(0, floats), &UnaryOpKernel<ReluOp>, in_place);
  Add(table, "Erf", InputDTypeIn(0, floats), &UnaryOpKernel<ErfOp>, in_place);
  Add(table, "Sigmoid", InputDTypeIn(0, floats), &UnaryOpKernel<SigmoidOp>, in_place);
  Add(table, "Tanh", InputDTypeIn(0, floats), &UnaryOpKernel<TanhOp>, in_place);
  Add(table, "Exp", InputDTypeIn(0, floats), &UnaryOpKernel<ExpOp>, in_place);
  Add(table, "Log", InputDTypeIn(0, floats), &UnaryOpKernel<LogOp>, in_place);
  Add(table, "Sqrt", InputDTypeIn(0, floats), &UnaryOpKernel<SqrtOp>, in_place);
  Add(table, "Reciprocal", InputDTypeIn(0, floats), &UnaryOpKernel<ReciprocalOp>, in_place);
  Add(table, "Sin", InputDTypeIn(0, floats), &UnaryOpKernel<SinOp>, in_place);
  Add(table, "Cos", InputDTypeIn(0, floats), &UnaryOpKernel<CosOp>, in_place);
  Add(table, "Tan", InputDTypeIn(0, floats), &UnaryOpKernel<TanOp>, in_place);
  Add(table, "Asin", InputDTypeIn(0, floats), &UnaryOpKernel<AsinOp>, in_place);
  Add(table, "Acos", InputDTypeIn(0, floats), &UnaryOpKernel<AcosOp>, in_place);
  Add(table, "Atan", InputDTypeIn(0, floats), &UnaryOpKernel<AtanOp>, in_place);
  Add(table, "Sinh", InputDTypeIn(0, floats), &UnaryOpKernel<SinhOp>, in_place);
  Add(table, "Cosh", InputDTypeIn(0, floats), &UnaryOpKernel<CoshOp>, in_place);
  Add(table, "Asinh", InputDTypeIn(0, floats), &UnaryOpKernel<AsinhOp>, in_place);
  Add(table, "Acosh", InputDTypeIn(0, floats), &UnaryOpKernel<AcoshOp>, in_place);
  Add(table, "Atanh", InputDTypeIn(0, floats), &UnaryOpKernel<AtanhOp>, in_place);
  Add(table, "LeakyRelu", InputDTypeIn(0, floats), &LeakyReluKernel, in_place);
  Add(table, "Gelu", InputDTypeIn(0, floats), &GeluKernel, in_place);
  Add(table, "Gelu", InputDTypeIn(0, floats), &GeluKernel, in_place, kCastorDomain);
  Add(table, "HardSigmoid", InputDTypeIn(0, floats), &HardSigmoidKernel, in_place);
  Add(table, "HardSwish", InputDTypeIn(0, floats), &UnaryOpKernel<HardSwishOp>, in_place);
  Add(table, "Elu", InputDTypeIn(0, floats), &EluKernel, in_place);
  Add(table, "Selu", InputDTypeIn(0, floats), &SeluKernel, in_place);
  Add(table, "Celu", InputDTypeIn(0, floats), &CeluKernel, in_place);
  Add(table, "Softplus", InputDTypeIn(0, floats), &UnaryOpKernel<SoftplusOp>, in_place);
  Add(table, "Softsign", InputDTypeIn(0, floats), &UnaryOpKernel<SoftsignOp>, in_place);
  Add(table, "ThresholdedRelu", InputDTypeIn(0, floats), &ThresholdedReluKernel, in_place);
  Add(table, "Mish", InputDTypeIn(0, floats), &UnaryOpKernel<MishOp>, in_place);
  Add(table, "PRelu", InputDTypeIn(0, kNumeric), &PReluKernel, in_place);
  Add(table, "Clip", InputDTypeIn(0, floats), &ClipKernel, in_place);

  Add(table, "Sum", InputDTypeIn(0, floats), &VariadicOpKernel<AddOp>, in_place);
  Add(table, "Max", InputDTypeIn(0, floats), &VariadicOpKernel<MaxOp>, in_place);
  Add(table, "Min", InputDTypeIn(0, floats), &VariadicOpKernel<MinOp>, in_place);

  Add(table, "Where", InputDTypeIn(1, Join(kNumeric, {DType::kBool})), &WhereOpKernel,
      /*in_place_ok=*/false);
  Add(table, "Cast", &CastSupports, &CastKernelRun, /*in_place_ok=*/false);
  Add(table, "ReluGrad", FloatDTypesIn(floats), &ReluGradOpKernel, /*in_place_ok=*/false,
      kCastorDomain);
  Add(table, "GeluGrad", FloatDTypesIn(floats), &GeluGradOpKernel, /*in_place_ok=*/false,
      kCastorDomain);
}

}  // namespace castor::cuda
