#include "models/wide_deep_model.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/logging.h"
#include "gtest/gtest.h"
#include "tests/models/gradient_check.h"

namespace eps {
namespace {

std::unique_ptr<Model> Make(const std::string& type, const std::string& activation,
                            std::vector<int> mlp = {5, 4, 1}, const std::string& pooling = "sum") {
  ModelOptions options;
  options.type = type;
  options.num_dense = 3;
  options.num_fields = 4;
  options.embedding_dim = 3;
  options.mlp = std::move(mlp);
  options.activation = activation;
  options.pooling = pooling;
  StatusOr<std::unique_ptr<Model>> model = Model::Create(options);
  CHECK_OK(model.status());
  return *std::move(model);
}

TEST(WideDeepModel, DeclaresItsParams) {
  for (const std::string type : {"wdl", "deepfm"}) {
    std::unique_ptr<Model> model = Make(type, "relu");
    const std::vector<ParamSpec>& params = model->params();
    ASSERT_EQ(params.size(), 6u) << type;
    const bool fm = type == "deepfm";
    EXPECT_EQ(params[0].name, type + (fm ? ".first" : ".wide"));
    EXPECT_EQ(params[0].size, 1u);
    EXPECT_EQ(params[1].name, type + ".emb");
    EXPECT_EQ(params[1].size, 3u);
    EXPECT_EQ(params[1].default_initializer, "uniform");
    EXPECT_EQ(params[2].name, type + (fm ? ".first_dense" : ".wide_dense"));
    EXPECT_EQ(params[2].size, 4u);  // 3 dense weights and the bias
    // Deep input: 3 dense + 4 fields x 3 = 15.
    EXPECT_EQ(params[3].name, type + ".mlp.0");
    EXPECT_EQ(params[3].size, 15u * 5 + 5);
    EXPECT_FLOAT_EQ(params[3].default_init_scale, 1.0f / std::sqrt(15.0f));
    EXPECT_EQ(params[4].size, 5u * 4 + 4);
    EXPECT_EQ(params[5].name, type + ".mlp.2");
    EXPECT_EQ(params[5].size, 4u * 1 + 1);
    for (size_t i = 2; i < params.size(); ++i) EXPECT_EQ(params[i].kind, ParamSpec::Kind::kDense);
  }
}

TEST(WideDeepModel, WdlGradientsMatchFiniteDifferences) {
  for (const std::string activation : {"tanh", "sigmoid"}) {
    SCOPED_TRACE(activation);
    std::unique_ptr<Model> model = Make("wdl", activation);
    const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/3, /*seed=*/1);
    ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 2));
  }
}

TEST(WideDeepModel, DeepFmGradientsMatchFiniteDifferences) {
  for (const std::string activation : {"tanh", "sigmoid"}) {
    SCOPED_TRACE(activation);
    std::unique_ptr<Model> model = Make("deepfm", activation);
    const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/3, /*seed=*/3);
    ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 4));
  }
}

TEST(WideDeepModel, MultiValueGradientsMatchFiniteDifferences) {
  for (const std::string type : {"wdl", "deepfm"}) {
    for (const std::string pooling : {"sum", "mean"}) {
      SCOPED_TRACE(type + " " + pooling);
      std::unique_ptr<Model> model = Make(type, "tanh", {5, 4, 1}, pooling);
      const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/4, /*seed=*/21, /*max_values=*/3);
      ASSERT_TRUE(batch.multi_value());
      ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 22));
    }
  }
}

TEST(WideDeepModel, ReluGradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> model = Make("deepfm", "relu");
  const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/3, /*seed=*/5);
  ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 6),
                                             {.step = 1e-3f, .abs_tolerance = 3e-4});
}

// DeepFM's logit is Wide & Deep's plus the FM term: with the same
// parameters the difference is 1/2 sum_k [(sum_f e)^2 - sum_f e^2].
TEST(WideDeepModel, DeepFmAddsTheFmTermToWideAndDeep) {
  std::unique_ptr<Model> wdl = Make("wdl", "relu");
  std::unique_ptr<Model> deepfm = Make("deepfm", "relu");
  const Batch batch = RandomBatch(/*n=*/4, 3, 4, /*vocabulary=*/5, /*seed=*/7);
  const ParamBuffers params = RandomParams(*wdl, batch, 8);
  std::vector<float> p_wdl, p_deepfm;
  wdl->ForwardBackward(batch, params, &p_wdl, nullptr);
  deepfm->ForwardBackward(batch, params, &p_deepfm, nullptr);
  auto logit = [](float p) { return std::log(p / (1 - p)); };
  for (int i = 0; i < batch.size(); ++i) {
    double fm = 0;
    for (int k = 0; k < 3; ++k) {
      double sum = 0, squares = 0;
      for (int f = 0; f < 4; ++f) {
        const float e = params[1][batch.slots[i * 4 + f] * 3 + k];
        sum += e;
        squares += e * e;
      }
      fm += 0.5 * (sum * sum - squares);
    }
    EXPECT_NEAR(logit(p_deepfm[i]) - logit(p_wdl[i]), fm, 1e-4) << "example " << i;
  }
}

TEST(WideDeepModel, RejectsAnMlpNotEndingInOne) {
  ModelOptions options;
  options.type = "wdl";
  options.mlp = {8, 2};
  EXPECT_EQ(Model::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps
