#include "ps/optimizer.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

constexpr double kTolerance = 1e-6;

proto::OptimizerSpec Sgd(float lr, float l2 = 0) {
  proto::OptimizerSpec spec;
  spec.set_kind(proto::OptimizerSpec::SGD);
  spec.set_learning_rate(lr);
  spec.set_l2(l2);
  return spec;
}

proto::OptimizerSpec Adagrad(float lr, float initial_accumulator, float epsilon, float l2 = 0) {
  proto::OptimizerSpec spec;
  spec.set_kind(proto::OptimizerSpec::ADAGRAD);
  spec.set_learning_rate(lr);
  spec.set_initial_accumulator(initial_accumulator);
  spec.set_epsilon(epsilon);
  spec.set_l2(l2);
  return spec;
}

std::unique_ptr<Optimizer> MustCreate(const proto::OptimizerSpec& spec) {
  auto optimizer = Optimizer::Create(spec);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return optimizer.ok() ? *std::move(optimizer) : nullptr;
}

TEST(Optimizer, SgdHasNoState) {
  auto sgd = MustCreate(Sgd(0.1f));
  ASSERT_NE(sgd, nullptr);
  EXPECT_EQ(sgd->state_floats(8), 0);
}

TEST(Optimizer, SgdStepsMatchHandComputation) {
  auto sgd = MustCreate(Sgd(0.1f));
  ASSERT_NE(sgd, nullptr);
  // Element 1 gets no gradient and must not move.
  std::vector<float> w = {1.0f, 3.0f};
  // w = 1 - 0.1*0.5 = 0.95; 0.95 + 0.1*0.25 = 0.975; 0.975 - 0.1*1 = 0.875.
  const float grads[3] = {0.5f, -0.25f, 1.0f};
  const double expected[3] = {0.95, 0.975, 0.875};
  for (int step = 0; step < 3; ++step) {
    const float g[2] = {grads[step], 0.0f};
    sgd->Apply(w.data(), nullptr, g, 2);
    EXPECT_NEAR(w[0], expected[step], kTolerance) << "step " << step;
    EXPECT_EQ(w[1], 3.0f);
  }
}

TEST(Optimizer, SgdL2AddsWeightToGradient) {
  auto sgd = MustCreate(Sgd(0.1f, /*l2=*/0.1f));
  ASSERT_NE(sgd, nullptr);
  float w = 1.0f;
  // 1 - 0.1*(0.5 + 0.1*1) = 0.94
  // 0.94 - 0.1*(-0.25 + 0.094) = 0.9556
  // 0.9556 - 0.1*(1 + 0.09556) = 0.846044
  const float grads[3] = {0.5f, -0.25f, 1.0f};
  const double expected[3] = {0.94, 0.9556, 0.846044};
  for (int step = 0; step < 3; ++step) {
    sgd->Apply(&w, nullptr, &grads[step], 1);
    EXPECT_NEAR(w, expected[step], kTolerance) << "step " << step;
  }
}

TEST(Optimizer, AdagradStepsMatchHandComputation) {
  auto adagrad = MustCreate(Adagrad(0.1f, /*initial_accumulator=*/0.1f, /*epsilon=*/1e-10f));
  ASSERT_NE(adagrad, nullptr);
  ASSERT_EQ(adagrad->state_floats(1), 1);
  float w = 1.0f;
  float acc = -1.0f;
  adagrad->InitState(&acc, 1);
  EXPECT_FLOAT_EQ(acc, 0.1f);
  // acc = 0.1 + 0.25 = 0.35;  w = 1 - 0.1*0.5/sqrt(0.35) = 0.91548457
  // acc = 0.35 + 0.04 = 0.39; w += 0.1*0.2/sqrt(0.39)     = 0.94751021
  // acc = 0.39 + 0.09 = 0.48; w -= 0.1*0.3/sqrt(0.48)     = 0.90420894
  const float grads[3] = {0.5f, -0.2f, 0.3f};
  const double expected_w[3] = {0.91548457, 0.94751021, 0.90420894};
  const double expected_acc[3] = {0.35, 0.39, 0.48};
  for (int step = 0; step < 3; ++step) {
    adagrad->Apply(&w, &acc, &grads[step], 1);
    EXPECT_NEAR(acc, expected_acc[step], kTolerance) << "step " << step;
    EXPECT_NEAR(w, expected_w[step], kTolerance) << "step " << step;
  }
}

TEST(Optimizer, AdagradWithL2AndZeroAccumulator) {
  auto adagrad =
      MustCreate(Adagrad(0.05f, /*initial_accumulator=*/0.0f, /*epsilon=*/1e-7f, /*l2=*/0.1f));
  ASSERT_NE(adagrad, nullptr);
  float w = -2.0f;
  float acc = -1.0f;
  adagrad->InitState(&acc, 1);
  EXPECT_EQ(acc, 0.0f);
  // g' = 0.5 - 0.2 = 0.3;           acc = 0.09;      w = -2 - 0.05*0.3/0.3   = -2.05
  // g' = 0.5 - 0.205 = 0.295;       acc = 0.177025;  w -= 0.05*0.295/0.42074 = -2.08505697
  // g' = -1 - 0.20850570 = -1.20851; acc = 1.637511; w += 0.05*1.20851/1.27965 = -2.03783691
  const float grads[3] = {0.5f, 0.5f, -1.0f};
  const double expected_w[3] = {-2.04999998, -2.08505697, -2.03783691};
  const double expected_acc[3] = {0.09, 0.177025, 1.63751102};
  for (int step = 0; step < 3; ++step) {
    adagrad->Apply(&w, &acc, &grads[step], 1);
    EXPECT_NEAR(acc, expected_acc[step], kTolerance) << "step " << step;
    EXPECT_NEAR(w, expected_w[step], kTolerance) << "step " << step;
  }
}

TEST(Optimizer, AdagradKeepsOneAccumulatorPerWeight) {
  auto adagrad = MustCreate(Adagrad(0.1f, /*initial_accumulator=*/0.0f, /*epsilon=*/1e-10f));
  ASSERT_NE(adagrad, nullptr);
  std::vector<float> w = {0.0f, 0.0f, 0.0f};
  std::vector<float> acc(3);
  adagrad->InitState(acc.data(), 3);
  const float g[3] = {1.0f, 0.0f, -2.0f};
  adagrad->Apply(w.data(), acc.data(), g, 3);
  EXPECT_NEAR(acc[0], 1.0, kTolerance);
  EXPECT_EQ(acc[1], 0.0f);
  EXPECT_NEAR(acc[2], 4.0, kTolerance);
  // The first Adagrad step moves every weight with a gradient by about lr.
  EXPECT_NEAR(w[0], -0.1, kTolerance);
  EXPECT_EQ(w[1], 0.0f);
  EXPECT_NEAR(w[2], 0.1, kTolerance);
}

void ExpectInvalid(const proto::OptimizerSpec& spec, const std::string& field) {
  auto optimizer = Optimizer::Create(spec);
  ASSERT_FALSE(optimizer.ok()) << spec.DebugString();
  EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(optimizer.status().message()).find(field), std::string::npos)
      << optimizer.status();
}

TEST(Optimizer, CreateRejectsBadSpecs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  proto::OptimizerSpec unknown;
  unknown.set_learning_rate(0.1f);
  ExpectInvalid(unknown, "kind");
  ExpectInvalid(Sgd(0.0f), "learning_rate");
  ExpectInvalid(Sgd(-0.1f), "learning_rate");
  ExpectInvalid(Sgd(nan), "learning_rate");
  ExpectInvalid(Sgd(0.1f, /*l2=*/-1.0f), "l2");
  ExpectInvalid(Adagrad(0.0f, 0.1f, 1e-8f), "learning_rate");
  ExpectInvalid(Adagrad(0.1f, -0.1f, 1e-8f), "initial_accumulator");
  ExpectInvalid(Adagrad(0.1f, 0.1f, 0.0f), "epsilon");
  ExpectInvalid(Adagrad(0.1f, 0.1f, -1e-8f), "epsilon");
  ExpectInvalid(Adagrad(0.1f, 0.1f, 1e-8f, /*l2=*/nan), "l2");
}

TEST(Optimizer, CreateAcceptsGoodSpecs) {
  EXPECT_TRUE(Optimizer::Create(Sgd(0.1f)).ok());
  EXPECT_TRUE(Optimizer::Create(Sgd(0.1f, /*l2=*/1e-4f)).ok());
  EXPECT_TRUE(Optimizer::Create(Adagrad(0.1f, 0.0f, 1e-8f)).ok());
}

}  // namespace
}  // namespace eps
