#include "models/metrics.h"

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(Metrics, AucCountsOrderedPairs) {
  // Positives at 0.8 and 0.4; negatives at 0.5, 0.1. Pairs (pos > neg):
  // 0.8>0.5, 0.8>0.1, 0.4>0.1; 0.4<0.5. AUC = 3/4.
  std::vector<float> p = {0.8f, 0.4f, 0.5f, 0.1f};
  std::vector<float> y = {1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(ComputeAuc(p, y), 0.75);
}

TEST(Metrics, AucCountsTiesAsHalf) {
  std::vector<float> p = {0.5f, 0.5f, 0.5f, 0.9f};
  std::vector<float> y = {1, 0, 0, 1};
  // Pos 0.5 vs negs 0.5, 0.5: two ties = 1; pos 0.9 beats both = 2. 3/4.
  EXPECT_DOUBLE_EQ(ComputeAuc(p, y), 0.75);
}

TEST(Metrics, AucOfOneClassIsHalf) {
  std::vector<float> p = {0.1f, 0.2f};
  std::vector<float> y = {1, 1};
  EXPECT_DOUBLE_EQ(ComputeAuc(p, y), 0.5);
}

TEST(Metrics, FirstNonFiniteNamesTheFirstBadPrediction) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(std::vector<float>{0.1f, 0.9f}), std::nullopt);
  EXPECT_EQ(FirstNonFinite(std::vector<float>{}), std::nullopt);
  EXPECT_EQ(FirstNonFinite(std::vector<float>{0.1f, kNan, kInf}), std::optional<size_t>(1));
  EXPECT_EQ(FirstNonFinite(std::vector<float>{0.1f, 0.2f, -kInf, kNan}),
            std::optional<size_t>(2));
}

// The ties loop once spun forever on a NaN (NaN == NaN is false), and a NaN
// in std::sort's comparison is undefined behavior.
TEST(Metrics, AucAndLogLossOfNanPredictionsAreNanAndReturn) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> p(1000, kNan);
  std::vector<float> y(1000);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 2);
  EXPECT_TRUE(std::isnan(ComputeAuc(p, y)));
  EXPECT_TRUE(std::isnan(ComputeLogLoss(p, y)));
  std::vector<float> one_bad = {0.8f, kNan, 0.5f, 0.1f};
  EXPECT_TRUE(std::isnan(ComputeAuc(one_bad, std::vector<float>{1, 1, 0, 0})));
}

TEST(Metrics, AucRanksInfinitePredictionsAtTheEnds) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Positives at +inf, +inf and 0.4; negatives at 0.5 and -inf: the infinite
  // pair ties among themselves; 5 of 6 pairs ordered.
  std::vector<float> p = {kInf, kInf, 0.4f, 0.5f, -kInf};
  std::vector<float> y = {1, 1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(ComputeAuc(p, y), 5.0 / 6.0);
  EXPECT_TRUE(std::isfinite(ComputeLogLoss(p, y)));
}

TEST(Metrics, LogLossMatchesHandComputation) {
  std::vector<float> p = {0.9f, 0.2f};
  std::vector<float> y = {1, 0};
  const double expected = -(std::log(0.9) + std::log(0.8)) / 2;
  EXPECT_NEAR(ComputeLogLoss(p, y), expected, 1e-7);
}

TEST(Metrics, LogLossClipsCertainMistakes) {
  EXPECT_NEAR(LogLoss(0.0, 1.0), -std::log(1e-7), 1e-9);
  EXPECT_TRUE(std::isfinite(LogLoss(1.0, 0.0)));
}

}  // namespace
}  // namespace eps
