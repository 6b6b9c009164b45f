// Tests rpc/bfloat16.h: rounding to nearest even, the error bound, and
// the values that must survive (zeros, infinities, NaN).

#include "rpc/bfloat16.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(Bfloat16, KeepsWhatItCanHoldExactly) {
  for (float value : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, 1e-30f}) {
    const float back = FromBfloat16(ToBfloat16(value));
    if (value == 1e-30f) {
      EXPECT_NEAR(back, value, value * 0x1p-8f);
    } else {
      EXPECT_EQ(back, value);
      EXPECT_EQ(std::signbit(back), std::signbit(value));
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FromBfloat16(ToBfloat16(inf)), inf);
  EXPECT_EQ(FromBfloat16(ToBfloat16(-inf)), -inf);
  // The largest floats stay finite (the largest bfloat16), not inf.
  const float largest = std::numeric_limits<float>::max();
  EXPECT_EQ(FromBfloat16(ToBfloat16(largest)), std::bit_cast<float>(0x7f7f0000u));
  EXPECT_EQ(FromBfloat16(ToBfloat16(-largest)), -std::bit_cast<float>(0x7f7f0000u));
  // A NaN whose payload lies in the dropped bits stays a NaN, not an inf.
  EXPECT_TRUE(std::isnan(FromBfloat16(ToBfloat16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(FromBfloat16(ToBfloat16(std::nanf("")))));
}

TEST(Bfloat16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even is 1.
  EXPECT_EQ(FromBfloat16(ToBfloat16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even is the latter.
  EXPECT_EQ(FromBfloat16(ToBfloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // Just above half: up.
  EXPECT_EQ(FromBfloat16(ToBfloat16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  // Truncation would give 1 for this one; nearest is 1 + 2^-7.
  EXPECT_EQ(FromBfloat16(ToBfloat16(1.0f + 0x1p-7f - 0x1p-12f)), 1.0f + 0x1p-7f);
}

TEST(Bfloat16, EveryValueIsWithinTwoToTheMinusEightOfItself) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  std::vector<float> values(100000);
  for (float& v : values) v = normal(rng) * std::exp2(static_cast<float>(rng() % 40) - 20.0f);
  std::vector<uint16_t> narrow(values.size());
  std::vector<float> back(values.size());
  ToBfloat16(values, narrow);
  FromBfloat16(narrow, back);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_LE(std::fabs(back[i] - values[i]), std::fabs(values[i]) * 0x1p-8f) << values[i];
    ASSERT_EQ(FromBfloat16(ToBfloat16(values[i])), back[i]);
  }
}

}  // namespace
}  // namespace eps
