// Tests core/hashing.h: feature ids and the mixers.

#include "core/hashing.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(FeatureId, GoldenValues) {
  // Feature ids key every trained row: changing FeatureId invalidates every
  // model and checkpoint. If this fails, the change was not safe.
  EXPECT_EQ(FeatureId(0, "68fd1e64"), 16849715259266527486ULL);
  EXPECT_EQ(FeatureId(25, ""), 5718351212792232545ULL);
}

TEST(FeatureId, IsStable) {
  EXPECT_EQ(FeatureId(3, "abc"), FeatureId(3, std::string("abc")));
  const std::string value = "05db9164";
  EXPECT_EQ(FeatureId(7, value), FeatureId(7, absl::string_view(value.data(), value.size())));
}

TEST(FeatureId, DiffersAcrossFieldsForTheSameValue) {
  std::set<uint64_t> ids;
  for (uint32_t field = 0; field < 26; ++field) ids.insert(FeatureId(field, "68fd1e64"));
  EXPECT_EQ(ids.size(), 26u);
  EXPECT_NE(FeatureId(0, ""), FeatureId(1, ""));
}

TEST(FeatureId, DiffersAcrossValues) {
  std::set<uint64_t> ids;
  for (int v = 0; v < 100000; ++v) ids.insert(FeatureId(0, std::to_string(v)));
  EXPECT_EQ(ids.size(), 100000u);
  // Embedded NULs count.
  EXPECT_NE(FeatureId(0, absl::string_view("a\0b", 3)), FeatureId(0, absl::string_view("a", 1)));
}

TEST(Mix64, IsABijectionOnASample) {
  static_assert(Mix64(0) == 0, "splitmix64 finaliser fixes zero");
  std::set<uint64_t> out;
  for (uint64_t x = 0; x < 100000; ++x) out.insert(Mix64(x));
  EXPECT_EQ(out.size(), 100000u);
  EXPECT_NE(Mix64(1), 1u);
}

TEST(Hash3, DependsOnEveryArgument) {
  const uint64_t base = Hash3(1, 2, 3);
  EXPECT_EQ(base, Hash3(1, 2, 3));
  EXPECT_NE(base, Hash3(2, 2, 3));
  EXPECT_NE(base, Hash3(1, 3, 3));
  EXPECT_NE(base, Hash3(1, 2, 4));
  EXPECT_NE(Hash3(1, 2, 3), Hash3(3, 2, 1));
}

TEST(ToUnitInterval, CoversZeroToOne) {
  EXPECT_EQ(ToUnitInterval(0), 0.0);
  EXPECT_LT(ToUnitInterval(~0ULL), 1.0);
  EXPECT_GT(ToUnitInterval(~0ULL), 0.999999);
  double sum = 0;
  constexpr int kSamples = 100000;
  for (int i = 0; i < kSamples; ++i) {
    const double u = ToUnitInterval(Hash3(7, i, 0));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // Mean of U[0,1): 0.5, sd of the mean ~0.0009.
  EXPECT_NEAR(sum / kSamples, 0.5, 0.01);
}

}  // namespace
}  // namespace eps
