#include "tests/models/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace eps {

Batch RandomBatch(int n, int num_dense, int num_fields, int vocabulary, uint64_t seed,
                  int max_values) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0, 2);
  std::uniform_int_distribution<uint64_t> id(0, static_cast<uint64_t>(vocabulary) - 1);
  std::uniform_int_distribution<int> count(1, max_values);
  BatchBuilder builder(num_dense, num_fields);
  std::vector<float> dense(num_dense);
  std::vector<uint64_t> ids;
  std::vector<uint32_t> ends(num_fields);
  for (int i = 0; i < n; ++i) {
    for (float& x : dense) x = uniform(rng);
    ids.clear();
    for (int f = 0; f < num_fields; ++f) {
      const int values = count(rng);
      for (int v = 0; v < values; ++v) ids.push_back(static_cast<uint64_t>(f) * 1000 + id(rng));
      ends[f] = static_cast<uint32_t>(ids.size());
    }
    builder.Add(static_cast<float>(i % 2), dense, ids, ends);
  }
  return builder.Finish();
}

ParamBuffers RandomParams(const Model& model, const Batch& batch, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  ParamBuffers params(model.params().size());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].resize(model.BufferSize(i, batch));
    for (float& v : params[i]) v = uniform(rng);
  }
  return params;
}

void ExpectMatchesCentralDifferences(const std::function<double()>& f, std::vector<float>* x,
                                     std::span<const float> analytic, const std::string& what,
                                     const GradientCheckOptions& options) {
  ASSERT_EQ(analytic.size(), x->size()) << what;
  const size_t count = x->size();
  const size_t stride = std::max<size_t>(1, count / std::max<size_t>(1, options.max_elements));
  for (size_t j = 0; j < count; j += stride) {
    const float original = (*x)[j];
    (*x)[j] = original + options.step;
    const float up = (*x)[j];
    const double f_plus = f();
    (*x)[j] = original - options.step;
    const float down = (*x)[j];
    const double f_minus = f();
    (*x)[j] = original;
    const double numeric = (f_plus - f_minus) / (static_cast<double>(up) - down);
    EXPECT_NEAR(analytic[j], numeric, options.abs_tolerance + options.rel_tolerance * std::abs(numeric))
        << what << " element " << j;
  }
}

void ExpectModelGradientsMatchFiniteDifferences(Model& model, const Batch& batch,
                                                const ParamBuffers& params,
                                                const GradientCheckOptions& options) {
  std::vector<float> predictions;
  ParamBuffers grads;
  model.ForwardBackward(batch, params, &predictions, &grads);
  ASSERT_EQ(grads.size(), params.size());
  const double n = batch.size();
  ParamBuffers probe = params;
  for (size_t t = 0; t < params.size(); ++t) {
    ASSERT_EQ(grads[t].size(), params[t].size()) << model.params()[t].name;
    ExpectMatchesCentralDifferences(
        [&] { return model.ForwardBackward(batch, probe, &predictions, nullptr) / n; }, &probe[t],
        grads[t], model.params()[t].name, options);
  }
}

}  // namespace eps
