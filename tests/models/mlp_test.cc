#include "models/mlp.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/models/gradient_check.h"

namespace eps {
namespace {

std::vector<float> Random(size_t count, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}

TEST(Mlp, ForwardMatchesHandComputedValues) {
  // One layer 2 -> 2 with relu, then 2 -> 1 linear.
  Mlp mlp(/*in=*/2, {2, 1}, Activation::kRelu, /*activate_last=*/false);
  ASSERT_EQ(mlp.layer_size(0), 6u);
  ASSERT_EQ(mlp.layer_size(1), 3u);
  // W0 = [[1, 2], [-1, 1]], b0 = [0.5, -3]; W1 = [[2, -1]], b1 = [0.25].
  const std::vector<float> w0 = {1, 2, -1, 1, 0.5f, -3};
  const std::vector<float> w1 = {2, -1, 0.25f};
  const std::vector<const float*> weights = {w0.data(), w1.data()};
  // x = (1, 1): h = relu(3.5, -3) = (3.5, 0); y = 7.25.
  // x = (-1, 0.5): h = relu(0.5, -1.5) = (0.5, 0); y = 1.25.
  const std::vector<float> x = {1, 1, -1, 0.5f};
  const float* y = mlp.Forward(x.data(), 2, weights);
  EXPECT_FLOAT_EQ(y[0], 7.25f);
  EXPECT_FLOAT_EQ(y[1], 1.25f);

  // dy = (1, 1): dW1 = sum h = (4, 0), db1 = 2; dh = (2, -1) masked by
  // relu' -> (2, 0) for both; dW0 row 0 = 2*(1,1) + 2*(-1,0.5) = (0, 3),
  // row 1 = 0; db0 = (4, 0); dx = (2,0) W0 = (2, 4) for both.
  const std::vector<float> dy = {1, 1};
  std::vector<float> g0(6), g1(3), dx(4);
  const std::vector<float*> grads = {g0.data(), g1.data()};
  mlp.Backward(dy.data(), weights, grads, dx.data());
  EXPECT_EQ(g1, (std::vector<float>{4, 0, 2}));
  EXPECT_EQ(g0, (std::vector<float>{0, 3, 0, 0, 4, 0}));
  EXPECT_EQ(dx, (std::vector<float>{2, 4, 2, 4}));
}

// sum(r * Mlp(x)) for a fixed random r, and its gradients by Backward.
void CheckGradients(Activation activation, bool activate_last, float step) {
  const int n = 5;
  const int in = 4;
  Mlp mlp(in, {6, 3, 2}, activation, activate_last);
  std::vector<std::vector<float>> w;
  for (int l = 0; l < mlp.num_layers(); ++l) w.push_back(Random(mlp.layer_size(l), 10 + l));
  std::vector<float> x = Random(static_cast<size_t>(n) * in, 3);
  const std::vector<float> r = Random(static_cast<size_t>(n) * mlp.out(), 4);
  auto weights = [&] {
    std::vector<const float*> pointers;
    for (const auto& t : w) pointers.push_back(t.data());
    return pointers;
  };
  auto f = [&] {
    const float* y = mlp.Forward(x.data(), n, weights());
    double sum = 0;
    for (size_t i = 0; i < r.size(); ++i) sum += static_cast<double>(r[i]) * y[i];
    return sum;
  };
  f();
  std::vector<std::vector<float>> g(w.size());
  std::vector<float*> grads;
  for (size_t l = 0; l < w.size(); ++l) {
    g[l].resize(w[l].size());
    grads.push_back(g[l].data());
  }
  std::vector<float> dx(x.size());
  mlp.Backward(r.data(), weights(), grads, dx.data());
  const GradientCheckOptions options{.step = step, .max_elements = 1000};
  for (size_t l = 0; l < w.size(); ++l) {
    ExpectMatchesCentralDifferences(f, &w[l], g[l], "layer " + std::to_string(l), options);
  }
  ExpectMatchesCentralDifferences(f, &x, dx, "input", options);
}

TEST(Mlp, GradientsMatchFiniteDifferencesTanh) { CheckGradients(Activation::kTanh, false, 1e-2f); }
TEST(Mlp, GradientsMatchFiniteDifferencesSigmoidActivatedLast) {
  CheckGradients(Activation::kSigmoid, true, 1e-2f);
}
// A small step, so that no relu input crosses 0 between the two probes.
TEST(Mlp, GradientsMatchFiniteDifferencesRelu) { CheckGradients(Activation::kRelu, true, 1e-3f); }

TEST(Mlp, ParsesActivations) {
  EXPECT_EQ(*ParseActivation("relu"), Activation::kRelu);
  EXPECT_EQ(*ParseActivation("sigmoid"), Activation::kSigmoid);
  EXPECT_EQ(*ParseActivation("tanh"), Activation::kTanh);
  EXPECT_EQ(ParseActivation("gelu").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps
