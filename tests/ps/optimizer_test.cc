#include "ps/optimizer.h"

#include <cmath>
#include <limits>
#include <memory>
#include <utility>
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

proto::OptimizerSpec Adam(float lr, float beta1, float beta2, float epsilon, float l2 = 0) {
  proto::OptimizerSpec spec;
  spec.set_kind(proto::OptimizerSpec::ADAM);
  spec.set_learning_rate(lr);
  spec.set_beta1(beta1);
  spec.set_beta2(beta2);
  spec.set_epsilon(epsilon);
  spec.set_l2(l2);
  return spec;
}

proto::OptimizerSpec Ftrl(float alpha, float beta, float l1, float l2 = 0) {
  proto::OptimizerSpec spec;
  spec.set_kind(proto::OptimizerSpec::FTRL);
  spec.set_learning_rate(alpha);
  spec.set_ftrl_beta(beta);
  spec.set_l1(l1);
  spec.set_l2(l2);
  return spec;
}

// One row of the update rules of ps/optimizer.h in double precision, written
// straight from the formulas, as the reference the float code must match.
struct AdamReference {
  AdamReference(double lr, double beta1, double beta2, double eps, double l2)
      : lr(lr), beta1(beta1), beta2(beta2), eps(eps), l2(l2) {}

  void Apply(std::vector<double>& w, const std::vector<double>& g) {
    m.resize(w.size());
    v.resize(w.size());
    t += 1;
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i] + l2 * w[i];
      m[i] = beta1 * m[i] + (1 - beta1) * gi;
      v[i] = beta2 * v[i] + (1 - beta2) * gi * gi;
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }

  const double lr, beta1, beta2, eps, l2;
  std::vector<double> m, v;
  double t = 0;
};

struct FtrlReference {
  FtrlReference(double alpha, double beta, double l1, double l2)
      : alpha(alpha), beta(beta), l1(l1), l2(l2) {}

  void Apply(std::vector<double>& w, const std::vector<double>& g) {
    z.resize(w.size());
    n.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      if (n[i] + g[i] * g[i] == 0) continue;  // keeps the initial weight
      const double sigma = (std::sqrt(n[i] + g[i] * g[i]) - std::sqrt(n[i])) / alpha;
      z[i] += g[i] - sigma * w[i];
      n[i] += g[i] * g[i];
      if (std::fabs(z[i]) <= l1) {
        w[i] = 0;
      } else {
        const double sign = z[i] < 0 ? -1 : 1;
        w[i] = -(z[i] - sign * l1) / ((beta + std::sqrt(n[i])) / alpha + l2);
      }
    }
  }

  const double alpha, beta, l1, l2;
  std::vector<double> z, n;
};

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

TEST(Optimizer, AdamStateIsMomentsAndAStepCount) {
  auto adam = MustCreate(Adam(0.01f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  ASSERT_EQ(adam->state_floats(4), 9);
  std::vector<float> state(9, -1.0f);
  adam->InitState(state.data(), 4);
  for (float s : state) EXPECT_EQ(s, 0.0f);
}

TEST(Optimizer, AdamFirstStepsMatchHandComputation) {
  auto adam = MustCreate(Adam(0.1f, 0.5f, 0.75f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  float w = 1.0f;
  float state[3];
  adam->InitState(state, 1);
  // Step 1, g = 2: m = 1, v = 1; m_hat = 1 / 0.5 = 2, v_hat = 1 / 0.25 = 4;
  //   w = 1 - 0.1 * 2 / 2 = 0.9 (the first step moves by lr).
  // Step 2, g = -1: m = 0.5 - 0.5 = 0, v = 0.75 + 0.25 = 1; m_hat = 0;
  //   w stays 0.9.
  // Step 3, g = 4: m = 2, v = 0.75 + 4 = 4.75; m_hat = 2 / 0.875 = 2.2857143,
  //   v_hat = 4.75 / (1 - 0.421875) = 8.2162162, sqrt = 2.8664
  //   w = 0.9 - 0.1 * 2.2857143 / 2.8664 = 0.82025820.
  const float grads[3] = {2.0f, -1.0f, 4.0f};
  const double expected_w[3] = {0.9, 0.9, 0.82025820};
  const double expected_m[3] = {1.0, 0.0, 2.0};
  const double expected_v[3] = {1.0, 1.0, 4.75};
  for (int step = 0; step < 3; ++step) {
    adam->Apply(&w, state, &grads[step], 1);
    EXPECT_NEAR(state[0], expected_m[step], kTolerance) << "step " << step;
    EXPECT_NEAR(state[1], expected_v[step], kTolerance) << "step " << step;
    EXPECT_EQ(state[2], step + 1.0f) << "step " << step;
    EXPECT_NEAR(w, expected_w[step], kTolerance) << "step " << step;
  }
}

TEST(Optimizer, AdamStepsMatchDoublePrecisionReference) {
  for (const float l2 : {0.0f, 0.1f}) {
    SCOPED_TRACE(l2);
    auto adam = MustCreate(Adam(0.01f, 0.9f, 0.999f, 1e-8f, l2));
    ASSERT_NE(adam, nullptr);
    AdamReference ref(0.01, 0.9, 0.999, 1e-8, l2);
    std::vector<float> w = {1.0f, -0.5f, 0.25f};
    std::vector<double> ref_w = {1.0, -0.5, 0.25};
    std::vector<float> state(adam->state_floats(3));
    adam->InitState(state.data(), 3);
    // Element 1 never has a gradient; with l2 > 0 it still decays.
    const std::vector<std::vector<double>> grads = {{0.5, 0, -3},  {-0.25, 0, 1e-3}, {1, 0, 0},
                                                    {0.125, 0, 2}, {-2, 0, -0.5},    {0.5, 0, 0}};
    for (size_t step = 0; step < grads.size(); ++step) {
      const std::vector<float> g(grads[step].begin(), grads[step].end());
      adam->Apply(w.data(), state.data(), g.data(), 3);
      ref.Apply(ref_w, grads[step]);
      for (int i = 0; i < 3; ++i) {
        EXPECT_NEAR(w[i], ref_w[i], kTolerance) << "step " << step << " element " << i;
        EXPECT_NEAR(state[i], ref.m[i], kTolerance) << "m, step " << step << " element " << i;
        EXPECT_NEAR(state[3 + i], ref.v[i], kTolerance) << "v, step " << step << " element " << i;
      }
      if (l2 == 0) {
        EXPECT_EQ(w[1], -0.5f) << "no gradient, no l2: Adam's moments stay 0";
      }
    }
  }
}

TEST(Optimizer, AdamMatchesTorch) {
  // torch.optim.Adam([w], lr=0.01, betas=(0.9, 0.999), eps=1e-8,
  // weight_decay=0.1) in float64 from w = [1, -0.5], five steps of
  // gradients [0.5, 0], [-0.25, 0], [1, 0], [0.125, 0], [-2, 0].
  auto adam = MustCreate(Adam(0.01f, 0.9f, 0.999f, 1e-8f, /*l2=*/0.1f));
  ASSERT_NE(adam, nullptr);
  std::vector<float> w = {1.0f, -0.5f};
  std::vector<float> state(adam->state_floats(2));
  adam->InitState(state.data(), 2);
  const float grads[5] = {0.5f, -0.25f, 1.0f, 0.125f, -2.0f};
  const double torch_w[5][2] = {{0.9900000002, -0.4900000020},
                                {0.9853191993, -0.4800057797},
                                {0.9779775548, -0.4700213352},
                                {0.9710436281, -0.4600507755},
                                {0.9723022404, -0.4500983049}};
  for (int step = 0; step < 5; ++step) {
    const float g[2] = {grads[step], 0.0f};
    adam->Apply(w.data(), state.data(), g, 2);
    EXPECT_NEAR(w[0], torch_w[step][0], kTolerance) << "step " << step;
    EXPECT_NEAR(w[1], torch_w[step][1], kTolerance) << "step " << step;
  }
}

TEST(Optimizer, AdamCountsStepsPerRow) {
  auto adam = MustCreate(Adam(0.1f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  float hot_w = 0.0f;
  float cold_w = 0.0f;
  float hot[3];
  float cold[3];
  adam->InitState(hot, 1);
  adam->InitState(cold, 1);
  const float g = 1.0f;
  for (int i = 0; i < 10; ++i) adam->Apply(&hot_w, hot, &g, 1);
  EXPECT_EQ(hot[2], 10.0f);
  // The cold row's first update is its step 1, not the table's step 11: it
  // moves by lr, not by lr * 0.1 / sqrt(1 - 0.999^11).
  adam->Apply(&cold_w, cold, &g, 1);
  EXPECT_EQ(cold[2], 1.0f);
  EXPECT_NEAR(cold_w, -0.1, kTolerance);
}

TEST(Optimizer, FtrlStateIsZAndN) {
  auto ftrl = MustCreate(Ftrl(0.1f, 1.0f, 0.0f));
  ASSERT_NE(ftrl, nullptr);
  ASSERT_EQ(ftrl->state_floats(3), 6);
  std::vector<float> state(6, -1.0f);
  ftrl->InitState(state.data(), 3);
  for (float s : state) EXPECT_EQ(s, 0.0f);
}

TEST(Optimizer, FtrlStepsMatchHandComputation) {
  auto ftrl = MustCreate(Ftrl(/*alpha=*/0.5f, /*beta=*/1.0f, /*l1=*/0.5f, /*l2=*/1.0f));
  ASSERT_NE(ftrl, nullptr);
  float w = 0.2f;  // from the initializer
  float state[2];
  ftrl->InitState(state, 1);
  // Step 1, g = 1:  sigma = (1 - 0) / 0.5 = 2; z = 1 - 2 * 0.2 = 0.6; n = 1;
  //   |z| > l1: w = -(0.6 - 0.5) / ((1 + 1) / 0.5 + 1) = -0.02.
  // Step 2, g = -0.3: n = 1.09, sigma = (1.0440307 - 1) / 0.5 = 0.0880613;
  //   z = 0.6 - 0.3 + 0.0880613 * 0.02 = 0.30176123; |z| <= l1: w = 0.
  // Step 3, g = 3: n = 10.09, sigma = (3.1764760 - 1.0440307) / 0.5 = 4.2648906;
  //   z = 3.30176123 (w was 0); w = -(2.80176123) / ((1 + 3.1764760) / 0.5 + 1)
  //   = -0.29955903.
  const float grads[3] = {1.0f, -0.3f, 3.0f};
  const double expected_w[3] = {-0.02, 0.0, -0.29955903};
  const double expected_z[3] = {0.6, 0.30176123, 3.30176123};
  const double expected_n[3] = {1.0, 1.09, 10.09};
  for (int step = 0; step < 3; ++step) {
    ftrl->Apply(&w, state, &grads[step], 1);
    EXPECT_NEAR(state[0], expected_z[step], kTolerance) << "step " << step;
    EXPECT_NEAR(state[1], expected_n[step], kTolerance) << "step " << step;
    EXPECT_NEAR(w, expected_w[step], kTolerance) << "step " << step;
  }
}

TEST(Optimizer, FtrlStepsMatchDoublePrecisionReference) {
  struct Params {
    double alpha, beta, l1, l2;
  };
  for (const Params& p : {Params{0.1, 1.0, 0.0, 0.0}, Params{0.05, 0.5, 0.01, 0.1},
                          Params{0.2, 0.0, 0.0, 0.0}, Params{1.0, 1.0, 2.0, 0.5}}) {
    SCOPED_TRACE(testing::Message()
                 << "alpha " << p.alpha << " beta " << p.beta << " l1 " << p.l1 << " l2 " << p.l2);
    auto ftrl = MustCreate(Ftrl(p.alpha, p.beta, p.l1, p.l2));
    ASSERT_NE(ftrl, nullptr);
    FtrlReference ref(p.alpha, p.beta, p.l1, p.l2);
    std::vector<float> w = {0.01f, -0.02f, 0.5f};
    std::vector<double> ref_w(w.begin(), w.end());
    std::vector<float> state(ftrl->state_floats(3));
    ftrl->InitState(state.data(), 3);
    // Element 2 gets its first gradient at step 3.
    const std::vector<std::vector<double>> grads = {
        {0.5, -1, 0}, {-0.25, 0.5, 0}, {1, 0, 0.75}, {0.125, 2, -1}, {-2, 0, 0.25}, {0.5, -0.5, 0}};
    for (size_t step = 0; step < grads.size(); ++step) {
      const std::vector<float> g(grads[step].begin(), grads[step].end());
      ftrl->Apply(w.data(), state.data(), g.data(), 3);
      ref.Apply(ref_w, grads[step]);
      for (int i = 0; i < 3; ++i) {
        EXPECT_NEAR(w[i], ref_w[i], kTolerance) << "step " << step << " element " << i;
        EXPECT_NEAR(state[i], ref.z[i], 1e-5) << "z, step " << step << " element " << i;
        EXPECT_NEAR(state[3 + i], ref.n[i], 1e-5) << "n, step " << step << " element " << i;
      }
      if (step < 2) {
        EXPECT_EQ(w[2], 0.5f) << "the initial weight stays until a gradient";
      }
    }
  }
}

TEST(Optimizer, FtrlL1MakesSmallWeightsExactlyZero) {
  auto ftrl = MustCreate(Ftrl(/*alpha=*/0.1f, /*beta=*/1.0f, /*l1=*/1.0f));
  ASSERT_NE(ftrl, nullptr);
  std::vector<float> w = {0.3f, -0.3f, 0.0f, 0.0f};
  std::vector<float> state(ftrl->state_floats(4));
  ftrl->InitState(state.data(), 4);
  // Small gradients of either sign keep |z| <= l1: the weights are exactly 0,
  // whatever the initializer gave them. A large one leaves the L1 ball.
  const float g[4] = {0.01f, -0.02f, 0.5f, 5.0f};
  ftrl->Apply(w.data(), state.data(), g, 4);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[1], 0.0f);
  EXPECT_EQ(w[2], 0.0f);
  // z = 5, n = 25: w = -(5 - 1) / ((1 + 5) / 0.1) = -1/15.
  EXPECT_NEAR(w[3], -4.0 / 60.0, kTolerance);
}

TEST(Optimizer, FtrlWithoutBetaOrL2KeepsZeroGradientCoordinatesFinite) {
  // beta = l2 = 0 leaves only sqrt(n) / alpha in the denominator; a
  // coordinate that never had a gradient must not divide by it.
  auto ftrl = MustCreate(Ftrl(/*alpha=*/0.1f, /*beta=*/0.0f, /*l1=*/0.0f));
  ASSERT_NE(ftrl, nullptr);
  std::vector<float> w = {0.25f, 0.25f};
  std::vector<float> state(ftrl->state_floats(2));
  ftrl->InitState(state.data(), 2);
  const float g[2] = {0.0f, 1.0f};
  for (int i = 0; i < 3; ++i) ftrl->Apply(w.data(), state.data(), g, 2);
  EXPECT_EQ(w[0], 0.25f);
  EXPECT_TRUE(std::isfinite(w[1]));
}

void ExpectInvalid(const proto::OptimizerSpec& spec, const std::string& field) {
  auto optimizer = Optimizer::Create(spec);
  ASSERT_FALSE(optimizer.ok()) << spec.DebugString();
  EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(optimizer.status().message()).find(field), std::string::npos)
      << optimizer.status();
}

// A push's lr_scale (optimizer.lr_scaling) acts as that many times the
// learning rate (FTRL: alpha), step after step, with the state following.
TEST(Optimizer, LrScaleActsAsThatManyTimesTheLearningRate) {
  struct Case {
    const char* name;
    proto::OptimizerSpec base;
    proto::OptimizerSpec scaled;  // the same with 4x the learning rate
  };
  const std::vector<Case> cases = {
      {"sgd", Sgd(0.05f, 0.01f), Sgd(0.2f, 0.01f)},
      {"adagrad", Adagrad(0.05f, 0.1f, 1e-8f), Adagrad(0.2f, 0.1f, 1e-8f)},
      {"adam", Adam(0.001f, 0.9f, 0.999f, 1e-8f), Adam(0.004f, 0.9f, 0.999f, 1e-8f)},
      {"ftrl", Ftrl(0.05f, 1.0f, 0.001f), Ftrl(0.2f, 1.0f, 0.001f)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto base = MustCreate(c.base);
    auto scaled = MustCreate(c.scaled);
    constexpr int kDim = 3;
    std::vector<float> w_scale = {0.1f, -0.2f, 0.3f};
    std::vector<float> w_lr = w_scale;
    std::vector<float> w_plain = w_scale;
    std::vector<float> s_scale(base->state_floats(kDim));
    base->InitState(s_scale.data(), kDim);
    std::vector<float> s_lr = s_scale;
    std::vector<float> s_plain = s_scale;
    for (int step = 0; step < 5; ++step) {
      const float g[kDim] = {0.5f - 0.1f * step, -0.25f, 0.125f * step};
      ASSERT_TRUE(base->Apply(w_scale.data(), s_scale.data(), g, kDim, 4.0f));
      ASSERT_TRUE(scaled->Apply(w_lr.data(), s_lr.data(), g, kDim));
      ASSERT_TRUE(base->Apply(w_plain.data(), s_plain.data(), g, kDim));
    }
    for (int i = 0; i < kDim; ++i) {
      EXPECT_NEAR(w_scale[i], w_lr[i], 1e-6) << i;
      EXPECT_NE(w_scale[i], w_plain[i]) << i;  // the scale did something
    }
    for (size_t i = 0; i < s_scale.size(); ++i) EXPECT_NEAR(s_scale[i], s_lr[i], 1e-6) << i;
  }
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
  ExpectInvalid(Adam(0.0f, 0.9f, 0.999f, 1e-8f), "learning_rate");
  ExpectInvalid(Adam(0.1f, -0.1f, 0.999f, 1e-8f), "beta1");
  ExpectInvalid(Adam(0.1f, 1.0f, 0.999f, 1e-8f), "beta1");
  ExpectInvalid(Adam(0.1f, nan, 0.999f, 1e-8f), "beta1");
  ExpectInvalid(Adam(0.1f, 0.9f, 1.0f, 1e-8f), "beta2");
  ExpectInvalid(Adam(0.1f, 0.9f, -0.5f, 1e-8f), "beta2");
  ExpectInvalid(Adam(0.1f, 0.9f, 0.999f, 0.0f), "epsilon");
  ExpectInvalid(Adam(0.1f, 0.9f, 0.999f, 1e-8f, /*l2=*/-1.0f), "l2");
  ExpectInvalid(Ftrl(0.0f, 1.0f, 0.0f), "learning_rate");
  ExpectInvalid(Ftrl(0.1f, -1.0f, 0.0f), "ftrl_beta");
  ExpectInvalid(Ftrl(0.1f, nan, 0.0f), "ftrl_beta");
  ExpectInvalid(Ftrl(0.1f, 1.0f, -0.5f), "l1");
  ExpectInvalid(Ftrl(0.1f, 1.0f, std::numeric_limits<float>::infinity()), "l1");
  ExpectInvalid(Ftrl(0.1f, 1.0f, 0.0f, /*l2=*/-0.5f), "l2");
}

// One spec of each kind, with l2 so that clipping must come before it.
std::vector<proto::OptimizerSpec> EveryKind() {
  return {Sgd(0.1f, /*l2=*/0.1f), Adagrad(0.1f, 0.1f, 1e-8f, /*l2=*/0.1f),
          Adam(0.1f, 0.9f, 0.999f, 1e-8f, /*l2=*/0.1f), Ftrl(0.1f, 1.0f, 0.01f, /*l2=*/0.1f)};
}

struct Row {
  std::vector<float> weights;
  std::vector<float> state;
  bool operator==(const Row& other) const = default;
};

Row NewRow(const Optimizer& optimizer, std::vector<float> weights) {
  Row row{std::move(weights), {}};
  row.state.resize(optimizer.state_floats(static_cast<int>(row.weights.size())));
  optimizer.InitState(row.state.data(), static_cast<int>(row.weights.size()));
  return row;
}

bool ApplyTo(const Optimizer& optimizer, Row& row, const std::vector<float>& grad) {
  return optimizer.Apply(row.weights.data(), row.state.data(), grad.data(),
                         static_cast<int>(row.weights.size()));
}

TEST(Optimizer, ClipBoundsEachGradientValueBeforeTheRule) {
  for (proto::OptimizerSpec spec : EveryKind()) {
    SCOPED_TRACE(spec.ShortDebugString());
    auto plain = MustCreate(spec);
    spec.set_clip(1.0f);
    auto clipped = MustCreate(spec);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(clipped, nullptr);
    Row a = NewRow(*clipped, {0.5f, -0.5f, 2.0f, 0.0f});
    Row b = a;
    // Twice, so that the state the first step made is used too.
    for (int step = 0; step < 2; ++step) {
      EXPECT_TRUE(ApplyTo(*clipped, a, {10.0f, -10.0f, 0.25f, -1.0f}));
      EXPECT_TRUE(ApplyTo(*plain, b, {1.0f, -1.0f, 0.25f, -1.0f}));
      EXPECT_EQ(a, b) << "step " << step;
    }
  }
}

TEST(Optimizer, ClipMatchesHandComputation) {
  proto::OptimizerSpec spec = Sgd(0.1f);
  spec.set_clip(2.0f);
  auto sgd = MustCreate(spec);
  ASSERT_NE(sgd, nullptr);
  float w[3] = {1.0f, 1.0f, 1.0f};
  const float g[3] = {5.0f, -3.0f, 1.5f};
  EXPECT_TRUE(sgd->Apply(w, nullptr, g, 3));
  EXPECT_FLOAT_EQ(w[0], 0.8f);   // 1 - 0.1 * 2
  EXPECT_FLOAT_EQ(w[1], 1.2f);   // 1 + 0.1 * 2
  EXPECT_FLOAT_EQ(w[2], 0.85f);  // within the bound: 1 - 0.1 * 1.5
}

TEST(Optimizer, ClipZeroIsOff) {
  proto::OptimizerSpec spec = Sgd(0.1f);
  spec.set_clip(0.0f);
  auto sgd = MustCreate(spec);
  ASSERT_NE(sgd, nullptr);
  float w = 1.0f;
  const float g = 1000.0f;
  EXPECT_TRUE(sgd->Apply(&w, nullptr, &g, 1));
  EXPECT_FLOAT_EQ(w, -99.0f);
}

// A gradient of 3e38 is finite, so the push handler takes it; every rule
// would make a value non-finite with it (SGD through lr = 10; Adagrad, Adam
// and FTRL through g^2), so the whole row keeps its values, the finite
// coordinates' too.
TEST(Optimizer, RefusesAnUpdateThatWouldMakeAValueNonFinite) {
  std::vector<proto::OptimizerSpec> specs = EveryKind();
  specs[0] = Sgd(10.0f);
  for (const proto::OptimizerSpec& spec : specs) {
    SCOPED_TRACE(spec.ShortDebugString());
    auto optimizer = MustCreate(spec);
    ASSERT_NE(optimizer, nullptr);
    Row row = NewRow(*optimizer, {0.5f, -0.5f, 0.25f});
    ASSERT_TRUE(ApplyTo(*optimizer, row, {0.1f, 0.2f, -0.3f}));
    const Row before = row;
    EXPECT_FALSE(ApplyTo(*optimizer, row, {0.1f, 3e38f, -0.3f}));
    EXPECT_EQ(row, before);
    // The row still takes sane updates, as if the refused one never came.
    Row reference = before;
    EXPECT_TRUE(ApplyTo(*optimizer, row, {0.1f, 0.2f, -0.3f}));
    EXPECT_TRUE(ApplyTo(*optimizer, reference, {0.1f, 0.2f, -0.3f}));
    EXPECT_EQ(row, reference);
    for (float value : row.weights) EXPECT_TRUE(std::isfinite(value));
    for (float value : row.state) EXPECT_TRUE(std::isfinite(value));
  }
}

TEST(Optimizer, ClippingKeepsAHugeGradientUsable) {
  for (proto::OptimizerSpec spec : EveryKind()) {
    SCOPED_TRACE(spec.ShortDebugString());
    spec.set_clip(1.0f);
    auto optimizer = MustCreate(spec);
    ASSERT_NE(optimizer, nullptr);
    Row row = NewRow(*optimizer, {0.5f, -0.5f});
    EXPECT_TRUE(ApplyTo(*optimizer, row, {3e38f, -3e38f}));
    for (float value : row.weights) EXPECT_TRUE(std::isfinite(value));
    for (float value : row.state) EXPECT_TRUE(std::isfinite(value));
  }
}

TEST(Optimizer, AppliesAFiniteButHugeResult) {
  // w -= 0.3 * 3e38 stays finite: not refused (clipping is for that).
  auto sgd = MustCreate(Sgd(0.3f));
  ASSERT_NE(sgd, nullptr);
  float w = 1.0f;
  const float g = 3e38f;
  EXPECT_TRUE(sgd->Apply(&w, nullptr, &g, 1));
  EXPECT_FLOAT_EQ(w, 1.0f - 0.3f * 3e38f);
}

TEST(Optimizer, RefusalOfAWideRowKeepsEveryValue) {
  // Rows wider than the stack scratch (dense chunks) take the same path.
  auto adam = MustCreate(Adam(0.01f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  Row row = NewRow(*adam, std::vector<float>(4096, 0.5f));
  std::vector<float> grad(4096, 0.01f);
  ASSERT_TRUE(ApplyTo(*adam, row, grad));
  const Row before = row;
  grad[4000] = 3e38f;
  EXPECT_FALSE(ApplyTo(*adam, row, grad));
  EXPECT_EQ(row, before);
}

TEST(Optimizer, CreateRejectsBadClip) {
  for (proto::OptimizerSpec spec : EveryKind()) {
    for (float clip :
         {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      spec.set_clip(clip);
      ExpectInvalid(spec, "optimizer.clip");
    }
  }
}

TEST(Optimizer, CreateAcceptsGoodSpecs) {
  EXPECT_TRUE(Optimizer::Create(Sgd(0.1f)).ok());
  EXPECT_TRUE(Optimizer::Create(Sgd(0.1f, /*l2=*/1e-4f)).ok());
  EXPECT_TRUE(Optimizer::Create(Adagrad(0.1f, 0.0f, 1e-8f)).ok());
  EXPECT_TRUE(Optimizer::Create(Adam(0.1f, 0.0f, 0.0f, 1e-8f)).ok());
  EXPECT_TRUE(Optimizer::Create(Adam(0.1f, 0.9f, 0.999f, 1e-8f, /*l2=*/0.01f)).ok());
  EXPECT_TRUE(Optimizer::Create(Ftrl(0.1f, 0.0f, 0.0f)).ok());
  EXPECT_TRUE(Optimizer::Create(Ftrl(0.1f, 1.0f, 1.0f, /*l2=*/1.0f)).ok());
}

}  // namespace
}  // namespace eps
