// Reading and writing float tensors of any float dtype as float32, the way
// every CPU kernel does its arithmetic: 16-bit inputs widen exactly to
// float32, results round once on store (round-to-nearest-even).
//
//   DispatchFloat(view.dtype, [&](auto tag) {
//     using T = typename decltype(tag)::type;   // float, Half or BFloat16
//     const T* x = view.as<T>();
//     float v = LoadF(x[i]); ... StoreF(&y[i], v);
//   });
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "graph/dtype.h"
#include "graph/half.h"

namespace castor::cpu {

// Storage types of the 16-bit floats (distinct types so overloads pick the
// right conversion).
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

inline float LoadF(float v) { return v; }
inline float LoadF(double v) { return static_cast<float>(v); }
inline float LoadF(Half v) { return HalfBitsToFloat(v.bits); }
inline float LoadF(BFloat16 v) { return BFloat16BitsToFloat(v.bits); }

inline void StoreF(float* p, float v) { *p = v; }
inline void StoreF(double* p, float v) { *p = v; }
inline void StoreF(Half* p, float v) { p->bits = FloatToHalfBits(v); }
inline void StoreF(BFloat16* p, float v) { p->bits = FloatToBFloat16Bits(v); }

template <typename T>
struct TypeTag { using type = T; };

// Calls fn(TypeTag<T>{}) for T the storage type of float dtype `dtype`
// (float32, float16, bfloat16, float64). Returns false for other dtypes.
template <typename Fn>
bool DispatchFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(TypeTag<float>{}); return true;
    case DType::kFloat16: fn(TypeTag<Half>{}); return true;
    case DType::kBFloat16: fn(TypeTag<BFloat16>{}); return true;
    case DType::kFloat64: fn(TypeTag<double>{}); return true;
    default: return false;
  }
}

// Converts n elements of float dtype `dtype` at `src` to float32 (and back).
// Bit-identical to LoadF / StoreF element by element; the 16-bit
// conversions run 16 lanes at a time with AVX-512 or 8 with AVX2 (+F16C)
// when the CPU has them (chosen once at run time), else the scalar code.
void ToFloat32(DType dtype, const void* src, float* dst, int64_t n);
void FromFloat32(DType dtype, const float* src, void* dst, int64_t n);

// ToFloat32 / FromFloat32 split across the thread pool (parallel.h) in
// chunks of at least kParallelConvertGrain elements; serial when n is small
// or inside a ParallelFor. The same bits as the serial calls.
inline constexpr int64_t kParallelConvertGrain = 16384;
void ParallelToFloat32(DType dtype, const void* src, float* dst, int64_t n);
void ParallelFromFloat32(DType dtype, const float* src, void* dst, int64_t n);

// The same per storage type, for templated kernels.
void ToFloat32(const Half* src, float* dst, int64_t n);
void ToFloat32(const BFloat16* src, float* dst, int64_t n);
void FromFloat32(const float* src, Half* dst, int64_t n);
void FromFloat32(const float* src, BFloat16* dst, int64_t n);

// Elements per block when a kernel widens 16-bit data into float32 scratch
// (on the stack), computes, and narrows back: small enough for L1.
inline constexpr int64_t kFloatConvertBlock = 512;

// True for the 16-bit float storage types (computed in float32).
template <typename T>
inline constexpr bool kIsFloat16Storage =
    std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The conversion loops behind the dispatch, exposed for the exhaustive
// bit-exactness test (tests/float_io_test.cc).
namespace float_io_internal {
// One implementation of the four bulk conversions.
struct ConversionLoops {
  const char* name;  // "scalar", "AVX2+F16C" or "AVX-512"
  void (*half_to_float)(const uint16_t* src, float* dst, int64_t n);
  void (*float_to_half)(const float* src, uint16_t* dst, int64_t n);
  void (*bfloat16_to_float)(const uint16_t* src, float* dst, int64_t n);
  void (*float_to_bfloat16)(const float* src, uint16_t* dst, int64_t n);
};
// Every implementation this CPU runs, narrowest first: the scalar loops,
// then the AVX2+F16C loops (8 lanes) when it has AVX2 and F16C, then the
// AVX-512 loops (16 lanes, masked tails) when it also has AVX512F/BW/VL.
// ToFloat32/FromFloat32 use the last.
std::vector<ConversionLoops> AvailableConversionLoops();
}  // namespace float_io_internal

}  // namespace castor::cpu
