#include "models/metrics.h"

#include <cmath>
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
