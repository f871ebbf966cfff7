// float32 <-> float16 / bfloat16 conversions on raw 16-bit patterns.
//
// One definition for every backend: the functions are `CASTOR_HOST_DEVICE`,
// so CUDA kernels call the same code the CPU backend and the tests use.
// Rounding is round-to-nearest-even, as hardware does; values too large for
// the target round to infinity; subnormals are produced and consumed exactly;
// NaN stays NaN (quietened, sign and top payload bits kept).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CASTOR_HOST_DEVICE __host__ __device__
#else
#define CASTOR_HOST_DEVICE
#endif

namespace castor {

CASTOR_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

CASTOR_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds `mantissa` right by `shift` bits (1..31) to nearest, ties to even.
CASTOR_HOST_DEVICE inline uint32_t ShiftRightRoundEven(uint32_t mantissa, int shift) {
  const uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  return kept + ((rest > halfway || (rest == halfway && (kept & 1u))) ? 1u : 0u);
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
CASTOR_HOST_DEVICE inline uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf or NaN
    if (magnitude == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 = 65504 + half an ulp: it and everything above rounds to infinity.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {  // normal half (>= 2^-14): rebias 127 -> 15
    return static_cast<uint16_t>(sign | ShiftRightRoundEven(magnitude - 0x38000000u, 13));
  }
  // Subnormal half: value / 2^-24 rounded to an integer in [0, 1024].
  // Below 2^-25 everything rounds to zero (2^-25 itself ties to even zero).
  if (magnitude < 0x33000000u) return static_cast<uint16_t>(sign);
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const int exponent = static_cast<int>(magnitude >> 23);  // 102..112
  return static_cast<uint16_t>(sign | ShiftRightRoundEven(mantissa, 126 - exponent));
}

CASTOR_HOST_DEVICE inline float HalfBitsToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return BitsToFloat(sign | FloatBits(magnitude));
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// bfloat16: the top 16 bits of a float32 (8 exponent, 7 mantissa bits).
CASTOR_HOST_DEVICE inline uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign/payload, force quiet
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);  // carries into inf
}

CASTOR_HOST_DEVICE inline float BFloat16BitsToFloat(uint16_t bf16) {
  return BitsToFloat(static_cast<uint32_t>(bf16) << 16);
}

}  // namespace castor
