// Tests for graph/half.h (float32 <-> float16 / bfloat16 bit conversions)
// and graph/dtype.h (names, ONNX codes, sizes).
//
// The conversions are checked against references that do not share code
// with half.h: a decode written from the IEEE bit definitions with
// std::ldexp in double, a "nearest representable value, ties to even"
// encoder that searches a table of every representable value, and, for
// float16, the x86 F16C instruction.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CASTOR_TEST_HAVE_X86 1
#endif

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "graph/dtype.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

constexpr uint16_t kHalfInf = 0x7c00;
constexpr uint16_t kBF16Inf = 0x7f80;
constexpr int kRandomSamples = 10'000'000;
constexpr uint32_t kRandomSeed = 20240611;

std::string Hex(uint32_t bits) { return absl::StrFormat("0x%08x", bits); }
std::string Hex16(uint16_t bits) { return absl::StrFormat("0x%04x", bits); }

float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint32_t BitsFromFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// ------------------------------------------------------------------ references

// Decodes a 16-bit float with `exponent_bits` exponent and `mantissa_bits`
// mantissa bits from the IEEE definition: (-1)^s * (1 + m/2^M) * 2^(e-bias)
// for normals, (-1)^s * m/2^M * 2^(1-bias) for subnormals, inf and NaN for
// the all-ones exponent.
double ReferenceDecode(uint16_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const bool negative = (bits >> 15) & 1;
  const int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exponent_bits) - 1) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -mantissa_bits),
                           exponent - bias);
  }
  return negative ? -magnitude : magnitude;
}

double ReferenceHalfDecode(uint16_t bits) { return ReferenceDecode(bits, 5, 10); }
double ReferenceBFloat16Decode(uint16_t bits) { return ReferenceDecode(bits, 8, 7); }

// Round-to-nearest-even encoder over a table of every non-negative value of
// a 16-bit format, indexed by bit pattern from +0 up to +inf. The +inf entry
// holds 2^(emax+1), the value the next pattern would have with an unbounded
// exponent: IEEE rounds to infinity exactly when the value would round to
// that (so the max finite value plus half an ulp ties to the even inf
// pattern, and everything beyond goes to inf).
class NearestEvenEncoder {
 public:
  NearestEvenEncoder(int exponent_bits, int mantissa_bits)
      : inf_bits_(static_cast<uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits)) {
    for (uint32_t bits = 0; bits < inf_bits_; ++bits) {
      table_.push_back(ReferenceDecode(static_cast<uint16_t>(bits), exponent_bits, mantissa_bits));
    }
    const int bias = (1 << (exponent_bits - 1)) - 1;
    table_.push_back(std::ldexp(1.0, bias + 1));
  }

  // The pattern nearest to `value` (not NaN), ties to the even pattern.
  uint16_t Encode(float value) const {
    const double x = value;  // exact
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double magnitude = std::fabs(x);
    // Index of the largest table entry <= magnitude.
    const auto above = std::upper_bound(table_.begin(), table_.end(), magnitude);
    const size_t below = static_cast<size_t>(above - table_.begin()) - 1;
    if (below + 1 >= table_.size()) return static_cast<uint16_t>(sign | inf_bits_);
    // Both differences are exact in double: float and 16-bit values have at
    // most 24 significant bits and the operands are within a factor of 2.
    const double down = magnitude - table_[below];
    const double up = table_[below + 1] - magnitude;
    size_t chosen;
    if (down < up) {
      chosen = below;
    } else if (up < down) {
      chosen = below + 1;
    } else {
      chosen = (below % 2 == 0) ? below : below + 1;
    }
    return static_cast<uint16_t>(sign | chosen);
  }

  uint16_t inf_bits() const { return inf_bits_; }
  double value(uint16_t bits) const { return table_[bits]; }

 private:
  uint16_t inf_bits_;
  std::vector<double> table_;
};

const NearestEvenEncoder& HalfEncoder() {
  static const NearestEvenEncoder* encoder = new NearestEvenEncoder(5, 10);
  return *encoder;
}
const NearestEvenEncoder& BFloat16Encoder() {
  static const NearestEvenEncoder* encoder = new NearestEvenEncoder(8, 7);
  return *encoder;
}

#if defined(CASTOR_TEST_HAVE_X86)
// The hardware conversion (VCVTPS2PH), round to nearest even from the
// immediate, not from MXCSR.
__attribute__((target("f16c"))) uint16_t F16cFloatToHalf(float value) {
  return static_cast<uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
bool HaveF16c() { return __builtin_cpu_supports("f16c"); }
#else
uint16_t F16cFloatToHalf(float) { return 0; }
bool HaveF16c() { return false; }
#endif

// Every float16 rounding boundary: each non-negative finite half h, the
// midpoint between h and its upper neighbour (the +inf neighbour counts as
// 2^16), and the floats one ulp below and above that midpoint; the half
// values themselves; all of it with both signs.
std::vector<float> HalfBoundaryFloats() {
  const NearestEvenEncoder& encoder = HalfEncoder();
  std::vector<float> result;
  for (uint32_t h = 0; h < encoder.inf_bits(); ++h) {
    const double midpoint = (encoder.value(h) + encoder.value(h + 1)) / 2;
    const float mid = static_cast<float>(midpoint);
    EXPECT_EQ(static_cast<double>(mid), midpoint) << "midpoint above half " << Hex16(h);
    for (float f : {static_cast<float>(encoder.value(h)), mid,
                    std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      result.push_back(f);
      result.push_back(-f);
    }
  }
  return result;
}

// The same for bfloat16: each finite bfloat16 pattern's upper midpoint and
// the floats one ulp either side, with both signs.
std::vector<float> BFloat16BoundaryFloats() {
  const NearestEvenEncoder& encoder = BFloat16Encoder();
  std::vector<float> result;
  for (uint32_t b = 0; b < encoder.inf_bits(); ++b) {
    const double midpoint = (encoder.value(b) + encoder.value(b + 1)) / 2;
    const float mid = static_cast<float>(midpoint);
    EXPECT_EQ(static_cast<double>(mid), midpoint) << "midpoint above bfloat16 " << Hex16(b);
    for (float f : {static_cast<float>(encoder.value(b)), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      result.push_back(f);
      result.push_back(-f);
    }
  }
  return result;
}

// Random float32 patterns: even draws are uniform over all 2^32 patterns
// (every exponent, NaNs included); odd draws keep a random sign and
// mantissa but an exponent in 97..146, the range where float16 rounding,
// subnormals and overflow happen.
std::vector<uint32_t> RandomFloatPatterns() {
  std::mt19937 rng(kRandomSeed);
  std::uniform_int_distribution<uint32_t> exponent(97, 146);
  std::vector<uint32_t> result(kRandomSamples);
  for (int k = 0; k < kRandomSamples; ++k) {
    uint32_t bits = rng();
    if (k % 2 == 1) bits = (bits & 0x807fffffu) | (exponent(rng) << 23);
    result[k] = bits;
  }
  return result;
}

const std::vector<uint32_t>& RandomPatterns() {
  static const std::vector<uint32_t>* patterns = new std::vector<uint32_t>(RandomFloatPatterns());
  return *patterns;
}

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool IsBFloat16NaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

// ------------------------------------------------------------------ float16

TEST(HalfTest, DecodeMatchesDefinitionForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float decoded = HalfBitsToFloat(h);
    const double expected = ReferenceHalfDecode(h);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(decoded)) << Hex16(h);
      ASSERT_EQ(std::signbit(decoded), (bits & 0x8000) != 0) << Hex16(h);
      // The 10 payload bits land in the top of the float mantissa.
      ASSERT_EQ(BitsFromFloat(decoded) & 0x007fe000u, static_cast<uint32_t>(h & 0x3ff) << 13)
          << Hex16(h);
    } else {
      ASSERT_EQ(static_cast<double>(decoded), expected) << Hex16(h);
      ASSERT_EQ(std::signbit(decoded), std::signbit(expected)) << Hex16(h);  // -0
    }
  }
}

// Every non-NaN pattern survives float16 -> float32 -> float16 bit for bit.
// A NaN comes back as a NaN with the same sign and the same 10 mantissa bits
// except that the quiet bit (0x0200) is set: quiet NaNs are unchanged,
// signalling NaNs are quietened with their other payload bits kept.
TEST(HalfTest, RoundTripEveryPattern) {
  int nan_patterns = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const uint16_t back = FloatToHalfBits(HalfBitsToFloat(h));
    if (IsHalfNaN(h)) {
      ++nan_patterns;
      ASSERT_EQ(back, h | 0x0200) << Hex16(h);
    } else {
      ASSERT_EQ(back, h) << Hex16(h);
    }
  }
  EXPECT_EQ(nan_patterns, 2 * 1023);
}

// Hand-computed results at the edges of the format.
TEST(HalfTest, SpecialValues) {
  const float kInf = std::numeric_limits<float>::infinity();
  struct Case {
    float value;
    uint16_t expected;
    const char* what;
  };
  const Case cases[] = {
      {0.0f, 0x0000, "+0"},
      {-0.0f, 0x8000, "-0"},
      {kInf, 0x7c00, "+inf"},
      {-kInf, 0xfc00, "-inf"},
      {1.0f, 0x3c00, "1"},
      {-2.0f, 0xc000, "-2"},
      {1.0f + 0x1p-11f, 0x3c00, "1 + half ulp ties to even 1"},
      {1.0f + 3 * 0x1p-11f, 0x3c02, "1 + 3 half ulps ties to even 1+2ulp"},
      {65504.0f, 0x7bff, "max finite"},
      {65519.99f, 0x7bff, "65519.99 below the overflow midpoint"},
      {std::nextafter(65520.0f, 0.0f), 0x7bff, "just below 65520"},
      {65520.0f, 0x7c00, "65520 ties to even inf"},
      {-65520.0f, 0xfc00, "-65520"},
      {std::nextafter(65520.0f, kInf), 0x7c00, "just above 65520"},
      {65536.0f, 0x7c00, "2^16"},
      {3.0e38f, 0x7c00, "huge"},
      {0x1p-24f, 0x0001, "smallest subnormal 2^-24"},
      {std::nextafter(0x1p-24f, 0.0f), 0x0001, "just below 2^-24"},
      {std::nextafter(0x1p-24f, kInf), 0x0001, "just above 2^-24"},
      {0x1p-25f, 0x0000, "2^-25 ties to even zero"},
      {-0x1p-25f, 0x8000, "-2^-25 ties to -0"},
      {std::nextafter(0x1p-25f, 0.0f), 0x0000, "just below 2^-25"},
      {std::nextafter(0x1p-25f, kInf), 0x0001, "just above 2^-25"},
      {3 * 0x1p-26f, 0x0001, "3*2^-26 = 0.75 subnormal ulps"},
      {3 * 0x1p-25f, 0x0002, "3*2^-25 = 1.5 ulps ties up to even 2"},
      {5 * 0x1p-25f, 0x0002, "5*2^-25 = 2.5 ulps ties down to even 2"},
      {1023 * 0x1p-24f, 0x03ff, "largest subnormal"},
      {std::nextafter(1023 * 0x1p-24f, 0.0f), 0x03ff, "just below largest subnormal"},
      {std::nextafter(1023 * 0x1p-24f, kInf), 0x03ff, "just above largest subnormal"},
      {1023.5f * 0x1p-24f, 0x0400, "between subnormal and normal ties to even 2^-14"},
      {0x1p-14f, 0x0400, "smallest normal 2^-14"},
      {std::nextafter(0x1p-14f, 0.0f), 0x0400, "just below 2^-14"},
      {std::nextafter(0x1p-14f, kInf), 0x0400, "just above 2^-14"},
      {FloatFromBits(0x00000001u), 0x0000, "smallest float subnormal"},
      {FloatFromBits(0x807fffffu), 0x8000, "largest negative float subnormal"},
      {FloatFromBits(0x7fc00000u), 0x7e00, "quiet NaN"},
      {FloatFromBits(0xffc00000u), 0xfe00, "negative quiet NaN"},
      {FloatFromBits(0x7f800001u), 0x7e00, "signalling NaN, low payload only"},
      {FloatFromBits(0x7fa00000u), 0x7f00, "signalling NaN keeps top payload bits"},
      {FloatFromBits(0xffffffffu), 0xffff, "all-ones NaN"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Hex16(FloatToHalfBits(c.value)), Hex16(c.expected))
        << c.what << " (" << Hex(BitsFromFloat(c.value)) << ")";
    if (!std::isnan(c.value)) {
      EXPECT_EQ(Hex16(HalfEncoder().Encode(c.value)), Hex16(c.expected))
          << "software reference disagrees with the hand-computed value for " << c.what;
    }
    if (HaveF16c()) {
      EXPECT_EQ(Hex16(F16cFloatToHalf(c.value)), Hex16(c.expected))
          << "F16C disagrees with the hand-computed value for " << c.what;
    }
  }
}

TEST(HalfTest, EncodeMatchesSoftwareReferenceOnBoundaries) {
  const std::vector<float> boundaries = HalfBoundaryFloats();
  ASSERT_EQ(boundaries.size(), 8u * 0x7c00);
  int mismatches = 0;
  for (float f : boundaries) {
    const uint16_t expected = HalfEncoder().Encode(f);
    const uint16_t actual = FloatToHalfBits(f);
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "FloatToHalfBits(" << absl::StrFormat("%.9g", f) << " = "
                    << Hex(BitsFromFloat(f)) << ") = " << Hex16(actual) << ", reference "
                    << Hex16(expected);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(HalfTest, EncodeMatchesSoftwareReferenceOnRandomFloats) {
  int mismatches = 0;
  int nans = 0;
  for (uint32_t bits : RandomPatterns()) {
    const float f = FloatFromBits(bits);
    const uint16_t actual = FloatToHalfBits(f);
    if (std::isnan(f)) {
      // NaN: a NaN of the same sign, quiet bit set, the top 10 mantissa bits kept.
      ++nans;
      const uint16_t expected =
          static_cast<uint16_t>(((bits >> 16) & 0x8000) | 0x7e00 | ((bits >> 13) & 0x3ff));
      if (actual != expected && ++mismatches <= 10) {
        ADD_FAILURE() << "NaN " << Hex(bits) << " -> " << Hex16(actual);
      }
      continue;
    }
    const uint16_t expected = HalfEncoder().Encode(f);
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "FloatToHalfBits(" << Hex(bits) << ") = " << Hex16(actual)
                    << ", reference " << Hex16(expected);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(nans, 0);  // the uniform draws include NaNs
}

TEST(HalfTest, EncodeMatchesF16cInstruction) {
  if (!HaveF16c()) GTEST_SKIP() << "this CPU has no F16C instruction to compare against";
  int mismatches = 0;
  auto check = [&](float f) {
    const uint16_t actual = FloatToHalfBits(f);
    const uint16_t expected = F16cFloatToHalf(f);
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "FloatToHalfBits(" << absl::StrFormat("%.9g", f) << " = "
                    << Hex(BitsFromFloat(f)) << ") = " << Hex16(actual) << ", F16C "
                    << Hex16(expected);
    }
  };
  const std::vector<float> boundaries = HalfBoundaryFloats();
  for (float f : boundaries) check(f);
  for (uint32_t bits : RandomPatterns()) check(FloatFromBits(bits));
  // NaN patterns compare bit for bit too: both quieten and keep the sign and
  // the top payload bits.
  for (uint32_t payload : {1u, 0x1000u, 0x2000u, 0x200000u, 0x3fffffu, 0x400000u, 0x7fffffu}) {
    check(FloatFromBits(0x7f800000u | payload));
    check(FloatFromBits(0xff800000u | payload));
  }
  EXPECT_EQ(mismatches, 0);
}

// The two references agree with each other on the boundaries, so neither
// is wrong in a way the other would hide.
TEST(HalfTest, SoftwareReferenceMatchesF16cOnBoundaries) {
  if (!HaveF16c()) GTEST_SKIP() << "this CPU has no F16C instruction to compare against";
  for (float f : HalfBoundaryFloats()) {
    ASSERT_EQ(Hex16(HalfEncoder().Encode(f)), Hex16(F16cFloatToHalf(f))) << Hex(BitsFromFloat(f));
  }
}

// ------------------------------------------------------------------ bfloat16

TEST(BFloat16Test, DecodeMatchesDefinitionForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float decoded = BFloat16BitsToFloat(b);
    const double expected = ReferenceBFloat16Decode(b);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(decoded)) << Hex16(b);
      ASSERT_EQ(BitsFromFloat(decoded), static_cast<uint32_t>(b) << 16) << Hex16(b);
    } else {
      ASSERT_EQ(static_cast<double>(decoded), expected) << Hex16(b);
      ASSERT_EQ(std::signbit(decoded), std::signbit(expected)) << Hex16(b);
    }
  }
}

// Same contract as float16: non-NaNs exact, NaNs get the quiet bit (0x0040).
TEST(BFloat16Test, RoundTripEveryPattern) {
  int nan_patterns = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const uint16_t back = FloatToBFloat16Bits(BFloat16BitsToFloat(b));
    if (IsBFloat16NaN(b)) {
      ++nan_patterns;
      ASSERT_EQ(back, b | 0x0040) << Hex16(b);
    } else {
      ASSERT_EQ(back, b) << Hex16(b);
    }
  }
  EXPECT_EQ(nan_patterns, 2 * 127);
}

TEST(BFloat16Test, SpecialValues) {
  const float kInf = std::numeric_limits<float>::infinity();
  struct Case {
    float value;
    uint16_t expected;
    const char* what;
  };
  const Case cases[] = {
      {0.0f, 0x0000, "+0"},
      {-0.0f, 0x8000, "-0"},
      {kInf, 0x7f80, "+inf"},
      {-kInf, 0xff80, "-inf"},
      {1.0f, 0x3f80, "1"},
      {1.0f + 0x1p-8f, 0x3f80, "1 + half ulp ties to even 1"},
      {1.0f + 3 * 0x1p-8f, 0x3f82, "1 + 3 half ulps ties to even"},
      {FloatFromBits(0x7f7f0000u), 0x7f7f, "max finite bfloat16"},
      {FloatFromBits(0x7f7f7fffu), 0x7f7f, "just below the overflow midpoint"},
      {FloatFromBits(0x7f7f8000u), 0x7f80, "overflow midpoint ties to even inf"},
      {std::numeric_limits<float>::max(), 0x7f80, "FLT_MAX rounds to inf"},
      {-std::numeric_limits<float>::max(), 0xff80, "-FLT_MAX rounds to -inf"},
      {FloatFromBits(0x00008000u), 0x0000, "float subnormal tie to even zero"},
      {FloatFromBits(0x00018000u), 0x0002, "float subnormal tie up to even"},
      {FloatFromBits(0x00010001u), 0x0001, "float subnormal just above a bfloat16"},
      {FloatFromBits(0x007fffffu), 0x0080, "largest float subnormal rounds to min normal"},
      {FloatFromBits(0x7fc00000u), 0x7fc0, "quiet NaN"},
      {FloatFromBits(0xffc00001u), 0xffc0, "negative quiet NaN"},
      {FloatFromBits(0x7f800001u), 0x7fc0, "signalling NaN with low payload only stays NaN"},
      {FloatFromBits(0x7f810000u), 0x7fc1, "signalling NaN keeps its top payload bits"},
      {FloatFromBits(0x7fffffffu), 0x7fff, "all-ones NaN does not carry"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Hex16(FloatToBFloat16Bits(c.value)), Hex16(c.expected))
        << c.what << " (" << Hex(BitsFromFloat(c.value)) << ")";
    if (!std::isnan(c.value)) {
      EXPECT_EQ(Hex16(BFloat16Encoder().Encode(c.value)), Hex16(c.expected))
          << "software reference disagrees with the hand-computed value for " << c.what;
    }
  }
}

TEST(BFloat16Test, EncodeMatchesReferenceOnBoundaries) {
  const std::vector<float> boundaries = BFloat16BoundaryFloats();
  ASSERT_EQ(boundaries.size(), 8u * 0x7f80);
  int mismatches = 0;
  for (float f : boundaries) {
    const uint16_t expected = BFloat16Encoder().Encode(f);
    const uint16_t actual = FloatToBFloat16Bits(f);
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "FloatToBFloat16Bits(" << absl::StrFormat("%.9g", f) << " = "
                    << Hex(BitsFromFloat(f)) << ") = " << Hex16(actual) << ", reference "
                    << Hex16(expected);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BFloat16Test, EncodeMatchesReferenceOnRandomFloats) {
  int mismatches = 0;
  for (uint32_t bits : RandomPatterns()) {
    const float f = FloatFromBits(bits);
    const uint16_t actual = FloatToBFloat16Bits(f);
    uint16_t expected;
    if (std::isnan(f)) {
      // NaN stays NaN: same sign, top 7 payload bits kept, quiet bit set.
      expected = static_cast<uint16_t>((bits >> 16) | 0x0040);
    } else {
      expected = BFloat16Encoder().Encode(f);
    }
    if (actual != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "FloatToBFloat16Bits(" << Hex(bits) << ") = " << Hex16(actual)
                    << ", reference " << Hex16(expected);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ------------------------------------------------------------------ DType

struct DTypeRow {
  DType dtype;
  const char* name;
  const char* onnx_name;
  int32_t onnx_code;
  size_t size;
};

const DTypeRow kDTypeRows[] = {
    {DType::kFloat32, "float32", "FLOAT", 1, 4},
    {DType::kUInt8, "uint8", "UINT8", 2, 1},
    {DType::kInt8, "int8", "INT8", 3, 1},
    {DType::kUInt16, "uint16", "UINT16", 4, 2},
    {DType::kInt16, "int16", "INT16", 5, 2},
    {DType::kInt32, "int32", "INT32", 6, 4},
    {DType::kInt64, "int64", "INT64", 7, 8},
    {DType::kString, "string", "STRING", 8, 0},
    {DType::kBool, "bool", "BOOL", 9, 1},
    {DType::kFloat16, "float16", "FLOAT16", 10, 2},
    {DType::kFloat64, "float64", "DOUBLE", 11, 8},
    {DType::kUInt32, "uint32", "UINT32", 12, 4},
    {DType::kUInt64, "uint64", "UINT64", 13, 8},
    {DType::kBFloat16, "bfloat16", "BFLOAT16", 16, 2},
};

TEST(DTypeTest, NamesCodesAndSizesOfEveryDType) {
  for (const DTypeRow& row : kDTypeRows) {
    SCOPED_TRACE(row.name);
    EXPECT_STREQ(DTypeName(row.dtype), row.name);
    EXPECT_EQ(DTypeSize(row.dtype), row.size);
    EXPECT_EQ(DTypeToOnnx(row.dtype), row.onnx_code);

    absl::StatusOr<DType> from_name = DTypeFromName(row.name);
    ASSERT_TRUE(from_name.ok()) << from_name.status();
    EXPECT_EQ(*from_name, row.dtype);

    absl::StatusOr<DType> from_onnx_name = DTypeFromName(row.onnx_name);
    ASSERT_TRUE(from_onnx_name.ok()) << from_onnx_name.status();
    EXPECT_EQ(*from_onnx_name, row.dtype);

    absl::StatusOr<DType> from_code = DTypeFromOnnx(row.onnx_code);
    ASSERT_TRUE(from_code.ok()) << from_code.status();
    EXPECT_EQ(*from_code, row.dtype);
  }
  EXPECT_STREQ(DTypeName(DType::kUndefined), "undefined");
  EXPECT_EQ(DTypeSize(DType::kUndefined), 0u);
}

TEST(DTypeTest, NameAliases) {
  const std::pair<const char*, DType> aliases[] = {
      {"float", DType::kFloat32},   {"fp32", DType::kFloat32},   {"half", DType::kFloat16},
      {"fp16", DType::kFloat16},    {"bf16", DType::kBFloat16},  {"double", DType::kFloat64},
      {"Float16", DType::kFloat16}, {"bfloat16", DType::kBFloat16},
  };
  for (const auto& [name, dtype] : aliases) {
    absl::StatusOr<DType> parsed = DTypeFromName(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, dtype) << name;
  }
}

TEST(DTypeTest, UnsupportedOnnxCodesNameTheType) {
  absl::StatusOr<DType> float8 = DTypeFromOnnx(17);
  ASSERT_FALSE(float8.ok());
  EXPECT_EQ(float8.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(float8.status().message(),
            "ONNX element type FLOAT8E4M3FN (code 17) is not supported by castor");

  absl::StatusOr<DType> complex = DTypeFromOnnx(14);
  ASSERT_FALSE(complex.ok());
  EXPECT_THAT(std::string(complex.status().message()), HasSubstr("COMPLEX64 (code 14)"));

  absl::StatusOr<DType> undefined = DTypeFromOnnx(0);
  ASSERT_FALSE(undefined.ok());
  EXPECT_THAT(std::string(undefined.status().message()), HasSubstr("UNDEFINED (code 0)"));

  absl::StatusOr<DType> unknown = DTypeFromOnnx(99);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "ONNX element type (code 99) is not supported by castor");
}

TEST(DTypeTest, UnknownNameIsAnErrorNamingIt) {
  absl::StatusOr<DType> parsed = DTypeFromName("float8");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("unknown dtype 'float8'"));
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("bfloat16"));  // lists choices
  EXPECT_FALSE(DTypeFromName("").ok());
}

TEST(DTypeTest, Categories) {
  for (const DTypeRow& row : kDTypeRows) {
    const std::string name = row.name;
    const bool is_float = name == "float32" || name == "float16" || name == "bfloat16" ||
                          name == "float64";
    const bool is_signed = name == "int8" || name == "int16" || name == "int32" || name == "int64";
    const bool is_unsigned =
        name == "uint8" || name == "uint16" || name == "uint32" || name == "uint64";
    EXPECT_EQ(IsFloatingPoint(row.dtype), is_float) << name;
    EXPECT_EQ(IsLowPrecisionFloat(row.dtype), name == "float16" || name == "bfloat16") << name;
    EXPECT_EQ(IsSignedInteger(row.dtype), is_signed) << name;
    EXPECT_EQ(IsInteger(row.dtype), is_signed || is_unsigned) << name;
  }
}

}  // namespace
}  // namespace castor
