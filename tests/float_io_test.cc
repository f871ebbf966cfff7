// Bit-exactness of the bulk float conversions in backend/cpu/float_io.h:
// every implementation this CPU runs (scalar, AVX2/F16C, AVX-512) and the
// dispatched ToFloat32 / FromFloat32 against graph/half.h's scalar
// conversions, for every 16-bit pattern and for millions of float32
// patterns (subnormals, infinities, NaN payloads, rounding ties, float16
// overflow), at every length up to 40 from unaligned starts.
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/float_io.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor::cpu {
namespace {

namespace fi = float_io_internal;

std::vector<uint16_t> AllSixteenBitPatterns() {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  return all;
}

// Float32 patterns that stress the narrowing: a stride through all 2^32
// patterns, every float16/bfloat16 rounding boundary (exact halfway, one
// ulp either side) in every binade, specials, and random values.
std::vector<float> StressFloats() {
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 1021) bits.push_back(static_cast<uint32_t>(u));
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t mantissa : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffu,
                                0x8000u, 0x8001u, 0x18000u, 0x7fe000u, 0x7ff000u, 0x7fefffu,
                                0x7ff001u, 0x7fffffu, 0x400000u, 0x400001u, 0x3fffffu}) {
        bits.push_back(sign | (exponent << 23) | mantissa);
      }
    }
    // Around float16's largest finite value (65504) and its overflow
    // threshold (65520), and the subnormal/zero boundaries (2^-24, 2^-25).
    for (uint32_t center : {0x477fe000u, 0x477ff000u, 0x33800000u, 0x33000000u, 0x38800000u}) {
      for (uint32_t d = 0; d < 64; ++d) {
        bits.push_back(sign | (center + d));
        bits.push_back(sign | (center - d));
      }
    }
  }
  std::mt19937 rng(12345);
  for (int i = 0; i < 1000000; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * sizeof(float));
  return values;
}

uint32_t Bits(float f) { return FloatBits(f); }

TEST(FloatIoTest, ReportsTheImplementationsThisCpuRuns) {
  const std::vector<fi::ConversionLoops> loops = fi::AvailableConversionLoops();
  ASSERT_FALSE(loops.empty());
  EXPECT_STREQ(loops.front().name, "scalar");
  // The message says which loops the other tests exercised here.
  std::cout << "conversion loops:";
  for (const fi::ConversionLoops& l : loops) std::cout << " " << l.name;
  std::cout << " (ToFloat32/FromFloat32 use " << loops.back().name << ")\n";
}

TEST(FloatIoTest, HalfToFloat32MatchesScalarForAllPatterns) {
  const std::vector<uint16_t> all = AllSixteenBitPatterns();
  const int64_t n = static_cast<int64_t>(all.size());
  std::vector<float> expected(all.size()), out(all.size());
  for (size_t i = 0; i < all.size(); ++i) expected[i] = HalfBitsToFloat(all[i]);
  for (const fi::ConversionLoops& loops : fi::AvailableConversionLoops()) {
    SCOPED_TRACE(loops.name);
    loops.half_to_float(all.data(), out.data(), n);
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(Bits(out[i]), Bits(expected[i])) << "half 0x" << std::hex << all[i];
    }
    // Shifted by 3, vectors straddle the inf/NaN range, mixing lanes that
    // need the NaN fix-up with lanes that do not.
    loops.half_to_float(all.data() + 3, out.data(), n - 3);
    for (size_t i = 3; i < all.size(); ++i) {
      ASSERT_EQ(Bits(out[i - 3]), Bits(expected[i])) << "half 0x" << std::hex << all[i];
    }
  }
  std::vector<float> dispatched(all.size());
  ToFloat32(reinterpret_cast<const Half*>(all.data()), dispatched.data(), n);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(Bits(dispatched[i]), Bits(expected[i])) << "half 0x" << std::hex << all[i];
  }
  // A signalling NaN keeps its payload unquietened (F16C alone would set the
  // quiet bit).
  EXPECT_EQ(Bits(dispatched[0x7c01]), 0x7f802000u);
  EXPECT_EQ(Bits(dispatched[0xfc01]), 0xff802000u);
}

TEST(FloatIoTest, BFloat16ToFloat32MatchesScalarForAllPatterns) {
  const std::vector<uint16_t> all = AllSixteenBitPatterns();
  const int64_t n = static_cast<int64_t>(all.size());
  std::vector<float> out(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(Bits(BFloat16BitsToFloat(all[i])), static_cast<uint32_t>(all[i]) << 16);
  }
  for (const fi::ConversionLoops& loops : fi::AvailableConversionLoops()) {
    SCOPED_TRACE(loops.name);
    loops.bfloat16_to_float(all.data(), out.data(), n);
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(Bits(out[i]), static_cast<uint32_t>(all[i]) << 16)
          << "bfloat16 0x" << std::hex << all[i];
    }
  }
  ToFloat32(reinterpret_cast<const BFloat16*>(all.data()), out.data(), n);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(Bits(out[i]), static_cast<uint32_t>(all[i]) << 16)
        << "bfloat16 0x" << std::hex << all[i];
  }
}

TEST(FloatIoTest, Float32ToHalfMatchesScalar) {
  const std::vector<float> values = StressFloats();
  ASSERT_GT(values.size(), 5000000u);
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<uint16_t> expected(values.size()), out(values.size());
  for (size_t i = 0; i < values.size(); ++i) expected[i] = FloatToHalfBits(values[i]);
  for (const fi::ConversionLoops& loops : fi::AvailableConversionLoops()) {
    SCOPED_TRACE(loops.name);
    loops.float_to_half(values.data(), out.data(), n);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(out[i], expected[i]) << "float bits 0x" << std::hex << Bits(values[i]);
    }
  }
  FromFloat32(values.data(), reinterpret_cast<Half*>(out.data()), n);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(out[i], expected[i]) << "float bits 0x" << std::hex << Bits(values[i]);
  }
  // Spot values: overflow to inf, the largest finite, a tie to even, a NaN.
  uint16_t spot_out[4];
  const float spot[4] = {65520.0f, 65519.0f, 1.0f + 1.0f / 2048.0f,
                         std::numeric_limits<float>::quiet_NaN()};
  FromFloat32(spot, reinterpret_cast<Half*>(spot_out), 4);
  EXPECT_EQ(spot_out[0], 0x7c00);
  EXPECT_EQ(spot_out[1], 0x7bff);
  EXPECT_EQ(spot_out[2], 0x3c00);
  EXPECT_EQ(spot_out[3], 0x7e00);
}

TEST(FloatIoTest, Float32ToBFloat16MatchesScalar) {
  const std::vector<float> values = StressFloats();
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<uint16_t> expected(values.size()), out(values.size());
  for (size_t i = 0; i < values.size(); ++i) expected[i] = FloatToBFloat16Bits(values[i]);
  for (const fi::ConversionLoops& loops : fi::AvailableConversionLoops()) {
    SCOPED_TRACE(loops.name);
    loops.float_to_bfloat16(values.data(), out.data(), n);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(out[i], expected[i]) << "float bits 0x" << std::hex << Bits(values[i]);
    }
  }
  FromFloat32(values.data(), reinterpret_cast<BFloat16*>(out.data()), n);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(out[i], expected[i]) << "float bits 0x" << std::hex << Bits(values[i]);
  }
  // Spot values: signalling NaN quietened with its payload, the largest
  // finite float rounding up to inf, a tie to even, a subnormal kept (not
  // flushed to zero).
  uint16_t spot_out[4];
  const float spot[4] = {BitsToFloat(0xff810001u), std::numeric_limits<float>::max(),
                         BitsToFloat(0x3f808000u), BitsToFloat(0x00018000u)};
  FromFloat32(spot, reinterpret_cast<BFloat16*>(spot_out), 4);
  EXPECT_EQ(spot_out[0], 0xffc1);
  EXPECT_EQ(spot_out[1], 0x7f80);
  EXPECT_EQ(spot_out[2], 0x3f80);
  EXPECT_EQ(spot_out[3], 0x0002);
}

// Every implementation at every length 0..40 from every start offset 0..7
// (unaligned starts, tails shorter than a vector, masked partial vectors):
// the results match the scalar conversions and the elements past the end
// stay untouched.
TEST(FloatIoTest, TailsAndOffsetsMatchScalar) {
  std::mt19937 rng(7);
  std::vector<uint16_t> sixteen(64);
  for (auto& v : sixteen) v = static_cast<uint16_t>(rng());
  sixteen[3] = 0x7c01;  // a signalling half NaN inside the first vector
  std::vector<float> floats(64);
  for (auto& v : floats) v = BitsToFloat(static_cast<uint32_t>(rng()));
  for (const fi::ConversionLoops& loops : fi::AvailableConversionLoops()) {
    SCOPED_TRACE(loops.name);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const bool half = dtype == DType::kFloat16;
      for (int64_t offset = 0; offset < 8; ++offset) {
        for (int64_t n = 0; n <= 40; ++n) {
          std::vector<float> widened(64, -1.0f);
          (half ? loops.half_to_float : loops.bfloat16_to_float)(sixteen.data() + offset,
                                                                 widened.data(), n);
          std::vector<uint16_t> narrowed(64, 0xabcd);
          (half ? loops.float_to_half : loops.float_to_bfloat16)(floats.data() + offset,
                                                                 narrowed.data(), n);
          for (int64_t i = 0; i < 64; ++i) {
            const uint16_t h = sixteen[offset + i < 64 ? offset + i : 0];
            const float expected_wide =
                i >= n ? -1.0f : (half ? HalfBitsToFloat(h) : BFloat16BitsToFloat(h));
            ASSERT_EQ(Bits(widened[i]), Bits(expected_wide))
                << DTypeName(dtype) << " offset " << offset << " n " << n << " i " << i;
            const uint16_t expected_narrow =
                i >= n ? 0xabcd
                       : (half ? FloatToHalfBits(floats[offset + i])
                               : FloatToBFloat16Bits(floats[offset + i]));
            ASSERT_EQ(narrowed[i], expected_narrow)
                << DTypeName(dtype) << " offset " << offset << " n " << n << " i " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace castor::cpu
