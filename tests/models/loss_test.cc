#include "models/loss.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(SigmoidLogLoss, MatchesTheFormulaAndItsGradient) {
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f};
  const std::vector<float> labels = {1.0f, 0.0f, 1.0f};
  std::vector<float> p(3), d(3);
  const double loss = SigmoidLogLoss(logits, labels, p, d);
  double expected = 0;
  for (int i = 0; i < 3; ++i) {
    const double q = 1 / (1 + std::exp(-static_cast<double>(logits[i])));
    EXPECT_NEAR(p[i], q, 1e-7);
    EXPECT_NEAR(d[i], (q - labels[i]) / 3, 1e-7);
    expected += -(labels[i] * std::log(q) + (1 - labels[i]) * std::log(1 - q));
  }
  EXPECT_NEAR(loss, expected, 1e-9);
}

TEST(SigmoidLogLoss, StaysFiniteForExtremeLogits) {
  const std::vector<float> logits = {100.0f, -100.0f};
  const std::vector<float> labels = {0.0f, 1.0f};
  std::vector<float> p(2);
  const double loss = SigmoidLogLoss(logits, labels, p, {});
  EXPECT_NEAR(loss, 200.0, 1e-9);  // each: log(1 + e^100) ~ 100
}

}  // namespace
}  // namespace eps
