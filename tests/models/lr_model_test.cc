#include "models/lr_model.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "models/batch.h"
#include "models/metrics.h"
#include "models/model.h"
#include "tests/models/gradient_check.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::unique_ptr<Model> MakeLr(int num_dense, int num_fields) {
  ModelOptions options;
  options.type = "lr";
  options.num_dense = num_dense;
  options.num_fields = num_fields;
  StatusOr<std::unique_ptr<Model>> model = Model::Create(options);
  CHECK_OK(model.status());
  return *std::move(model);
}

// Three examples, two dense features, three fields:
//   example 0: y=1, x=(0.5, -1),  ids (10, 20, 30)
//   example 1: y=0, x=(1, 2),     ids (10, 21, 31)
//   example 2: y=1, x=(0, 0.25),  ids (11, 20, 30)
// keys = [10, 20, 30, 21, 31, 11].
Batch TinyBatch() {
  BatchBuilder builder(/*num_dense=*/2, /*num_fields=*/3);
  builder.Add(1, std::vector<float>{0.5f, -1.0f}, std::vector<uint64_t>{10, 20, 30});
  builder.Add(0, std::vector<float>{1.0f, 2.0f}, std::vector<uint64_t>{10, 21, 31});
  builder.Add(1, std::vector<float>{0.0f, 0.25f}, std::vector<uint64_t>{11, 20, 30});
  return builder.Finish();
}

// w for keys [10, 20, 30, 21, 31, 11]; dense weights (0.7, -0.3), bias 0.2.
ParamBuffers TinyParams() {
  return {{0.1f, -0.2f, 0.3f, 0.05f, -0.4f, 0.6f}, {0.7f, -0.3f, 0.2f}};
}

// The logits of TinyBatch under TinyParams, by hand:
//   0: (0.1 - 0.2 + 0.3) + (0.7 * 0.5 - 0.3 * -1) + 0.2  = 1.05
//   1: (0.1 + 0.05 - 0.4) + (0.7 * 1 - 0.3 * 2) + 0.2    = 0.05
//   2: (0.6 - 0.2 + 0.3) + (0.7 * 0 - 0.3 * 0.25) + 0.2  = 0.825
constexpr double kTinyLogits[3] = {1.05, 0.05, 0.825};
constexpr double kTinyLabels[3] = {1, 0, 1};

TEST(LrModel, DeclaresItsParams) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const std::vector<ParamSpec>& params = model->params();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].name, "lr.w");
  EXPECT_EQ(params[0].kind, ParamSpec::Kind::kEmbedding);
  EXPECT_EQ(params[0].size, 1u);
  EXPECT_EQ(params[1].name, "lr.dense");
  EXPECT_EQ(params[1].kind, ParamSpec::Kind::kDense);
  EXPECT_EQ(params[1].size, 3u);  // two weights and the bias
}

TEST(LrModel, BufferSizeFollowsKeysForEmbeddings) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = TinyBatch();
  ASSERT_EQ(batch.keys.size(), 6u);
  EXPECT_EQ(model->BufferSize(0, batch), 6u);
  EXPECT_EQ(model->BufferSize(1, batch), 3u);
  EXPECT_EQ(model->BufferSize(0, Batch{}), 0u);
  EXPECT_EQ(model->BufferSize(1, Batch{}), 3u);
}

TEST(AllFinite, FindsANonFiniteValueInAnyLaneOrTheTail) {
  EXPECT_TRUE(AllFinite({}));
  EXPECT_TRUE(AllFinite({std::vector<float>(19, 3e38f), {}, {-1.0f}}));
  for (size_t at : {0u, 5u, 15u, 16u, 18u}) {
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      ParamBuffers buffers = {std::vector<float>(3, 1.0f), std::vector<float>(19, 0.5f)};
      buffers[1][at] = bad;
      EXPECT_FALSE(AllFinite(buffers)) << bad << " at " << at;
    }
  }
}

// The halves of a batch, each with its SliceParams, predict what the whole
// batch predicts (what a step that ran out of memory relies on).
TEST(LrModel, SlicesWithSlicedParamsPredictAsTheWholeBatch) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = TinyBatch();
  std::vector<float> whole;
  const double whole_loss = model->ForwardBackward(batch, TinyParams(), &whole, nullptr);
  std::vector<float> halves;
  double halves_loss = 0;
  for (const auto& [begin, end] : {std::pair{0, 1}, std::pair{1, batch.size()}}) {
    std::vector<uint32_t> from;
    const Batch piece = SliceBatch(batch, begin, end, &from);
    const ParamBuffers params = model->SliceParams(TinyParams(), from);
    for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(params[i].size(), model->BufferSize(i, piece));
    std::vector<float> predictions;
    halves_loss += model->ForwardBackward(piece, params, &predictions, nullptr);
    halves.insert(halves.end(), predictions.begin(), predictions.end());
  }
  ASSERT_EQ(halves.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_FLOAT_EQ(halves[i], whole[i]) << i;
  EXPECT_NEAR(halves_loss, whole_loss, 1e-6);
}

TEST(LrModel, ForwardMatchesHandComputation) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = TinyBatch();
  std::vector<float> predictions;
  const double loss_sum = model->ForwardBackward(batch, TinyParams(), &predictions, nullptr);
  ASSERT_EQ(predictions.size(), 3u);
  double expected_loss = 0;
  for (int i = 0; i < 3; ++i) {
    const double p = Sigmoid(kTinyLogits[i]);
    EXPECT_NEAR(predictions[i], p, 1e-6) << "example " << i;
    EXPECT_GT(predictions[i], 0.0f);
    EXPECT_LT(predictions[i], 1.0f);
    expected_loss += -(kTinyLabels[i] * std::log(p) + (1 - kTinyLabels[i]) * std::log(1 - p));
  }
  EXPECT_NEAR(loss_sum, expected_loss, 1e-5);
  // The sum is the per-example LogLoss of the returned predictions (the
  // model computes it from the logits, to within float rounding).
  double sum = 0;
  for (int i = 0; i < 3; ++i) sum += LogLoss(predictions[i], batch.labels[i]);
  EXPECT_NEAR(loss_sum, sum, 1e-6);
}

TEST(LrModel, GradientsMatchHandComputation) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = TinyBatch();
  std::vector<float> predictions;
  ParamBuffers grads;
  model->ForwardBackward(batch, TinyParams(), &predictions, &grads);
  // r_i = d(mean loss)/d logit_i = (p_i - y_i) / n.
  double r[3];
  for (int i = 0; i < 3; ++i) r[i] = (Sigmoid(kTinyLogits[i]) - kTinyLabels[i]) / 3;
  ASSERT_EQ(grads.size(), 2u);
  // keys [10, 20, 30, 21, 31, 11]: 10 in examples 0, 1; 20 and 30 in 0, 2;
  // 21 and 31 in 1; 11 in 2.
  const std::vector<double> expected_w = {r[0] + r[1], r[0] + r[2], r[0] + r[2], r[1], r[1], r[2]};
  const std::vector<double> expected_dense = {
      0.5 * r[0] + 1.0 * r[1] + 0.0 * r[2],
      -1.0 * r[0] + 2.0 * r[1] + 0.25 * r[2],
      r[0] + r[1] + r[2],
  };
  ASSERT_EQ(grads[0].size(), expected_w.size());
  ASSERT_EQ(grads[1].size(), expected_dense.size());
  for (size_t k = 0; k < expected_w.size(); ++k) {
    EXPECT_NEAR(grads[0][k], expected_w[k], 1e-6) << "w of key " << batch.keys[k];
  }
  for (size_t d = 0; d < expected_dense.size(); ++d) {
    EXPECT_NEAR(grads[1][d], expected_dense[d], 1e-6) << "dense " << d;
  }
}

void ExpectGradientsMatchFiniteDifferences(Model& model, const Batch& batch,
                                           const ParamBuffers& params) {
  ExpectModelGradientsMatchFiniteDifferences(model, batch, params,
                                             {.max_elements = params[0].size() + params[1].size()});
}

TEST(LrModel, GradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  ExpectGradientsMatchFiniteDifferences(*model, TinyBatch(), TinyParams());
}

TEST(LrModel, GradientsMatchFiniteDifferencesWithRepeatedIds) {
  // Ids repeat across examples and within one, labels are fractional too.
  constexpr int kDense = 3;
  constexpr int kFields = 4;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<uint64_t> id(1, 6);
  BatchBuilder builder(kDense, kFields);
  const float labels[] = {1, 0, 0.3f, 1, 0, 0.8f, 1};
  for (float label : labels) {
    std::vector<float> dense(kDense);
    for (float& x : dense) x = uniform(rng);
    std::vector<uint64_t> ids(kFields);
    for (uint64_t& i : ids) i = id(rng);
    builder.Add(label, dense, ids);
  }
  const uint64_t repeated[] = {99, 99, 99, 1};
  builder.Add(1, std::vector<float>(kDense, 0.5f), repeated);
  const Batch batch = builder.Finish();

  ParamBuffers params(2);
  for (size_t k = 0; k < batch.keys.size(); ++k) params[0].push_back(0.5f * uniform(rng));
  for (int d = 0; d <= kDense; ++d) params[1].push_back(0.5f * uniform(rng));
  std::unique_ptr<Model> model = MakeLr(kDense, kFields);
  ExpectGradientsMatchFiniteDifferences(*model, batch, params);
}

TEST(LrModel, ForwardOnlyMatchesForwardBackward) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = TinyBatch();
  std::vector<float> with_grads;
  std::vector<float> without_grads;
  // Stale, wrongly sized buffers are replaced.
  ParamBuffers grads = {{9, 9}, {9}, {9}};
  const double loss = model->ForwardBackward(batch, TinyParams(), &with_grads, &grads);
  EXPECT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].size(), 6u);
  EXPECT_EQ(grads[1].size(), 3u);
  EXPECT_EQ(model->ForwardBackward(batch, TinyParams(), &without_grads, nullptr), loss);
  EXPECT_EQ(with_grads, without_grads);
}

TEST(LrModel, MultiValueGradientsMatchFiniteDifferences) {
  for (const std::string pooling : {"sum", "mean"}) {
    SCOPED_TRACE(pooling);
    ModelOptions options;
    options.num_dense = 2;
    options.num_fields = 3;
    options.pooling = pooling;
    StatusOr<std::unique_ptr<Model>> model = Model::Create(options);
    ASSERT_TRUE(model.ok()) << model.status();
    const Batch batch = RandomBatch(/*n=*/5, 2, 3, /*vocabulary=*/4, /*seed=*/31, /*max_values=*/3);
    ASSERT_TRUE(batch.multi_value());
    ExpectModelGradientsMatchFiniteDifferences(**model, batch, RandomParams(**model, batch, 32),
                                               {.max_elements = 1000});
  }
}

TEST(LrModel, ExtremeLogitsStayFinite) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = TinyBatch();
  // Logits of +-100 and 300: float sigmoid saturates to exactly 0 or 1.
  ParamBuffers params = {{100, 100, 100, -100, -100, -100}, {0, 0, 0}};
  std::vector<float> predictions;
  ParamBuffers grads;
  const double loss = model->ForwardBackward(batch, params, &predictions, &grads);
  EXPECT_TRUE(std::isfinite(loss));
  for (float p : predictions) {
    EXPECT_GE(p, 0.0f);
    EXPECT_LE(p, 1.0f);
  }
  for (const std::vector<float>& g : grads) {
    for (float x : g) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(LrModel, EmptyBatchHasZeroLossAndGradients) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  BatchBuilder builder(/*num_dense=*/2, /*num_fields=*/3);
  const Batch batch = builder.Finish();
  std::vector<float> predictions = {0.5f};
  ParamBuffers grads;
  EXPECT_EQ(model->ForwardBackward(batch, {{}, {1, 2, 3}}, &predictions, &grads), 0.0);
  EXPECT_TRUE(predictions.empty());
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_TRUE(grads[0].empty());
  EXPECT_EQ(grads[1], (std::vector<float>{0, 0, 0}));
}

TEST(LrModelDeathTest, RejectsMalformedBatch) {
  std::unique_ptr<Model> model = MakeLr(/*num_dense=*/2, /*num_fields=*/3);
  std::vector<float> predictions;
  Batch short_dense = TinyBatch();
  short_dense.dense.pop_back();
  EXPECT_DEATH(model->ForwardBackward(short_dense, TinyParams(), &predictions, nullptr),
               "Check failed");
  Batch short_slots = TinyBatch();
  short_slots.slots.pop_back();
  EXPECT_DEATH(model->ForwardBackward(short_slots, TinyParams(), &predictions, nullptr),
               "Check failed");
  ParamBuffers too_few_rows = TinyParams();
  too_few_rows[0].pop_back();
  EXPECT_DEATH(model->ForwardBackward(TinyBatch(), too_few_rows, &predictions, nullptr),
               "Check failed");
}

TEST(Model, CreateRejectsUnknownType) {
  ModelOptions options;
  options.type = "dnn";
  StatusOr<std::unique_ptr<Model>> model = Model::Create(options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("'dnn'"));
}

TEST(Model, CreateRejectsBadSizes) {
  ModelOptions negative_dense;
  negative_dense.num_dense = -1;
  EXPECT_EQ(Model::Create(negative_dense).status().code(), absl::StatusCode::kInvalidArgument);
  ModelOptions negative_fields;
  negative_fields.num_fields = -1;
  EXPECT_EQ(Model::Create(negative_fields).status().code(), absl::StatusCode::kInvalidArgument);
  ModelOptions zero_dim;
  zero_dim.embedding_dim = 0;
  EXPECT_EQ(Model::Create(zero_dim).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Model, CreateDefaultsToCriteoLr) {
  StatusOr<std::unique_ptr<Model>> model = Model::Create(ModelOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->params().size(), 2u);
  EXPECT_EQ((*model)->params()[1].size, 14u);  // 13 dense weights and the bias
}

}  // namespace
}  // namespace eps
