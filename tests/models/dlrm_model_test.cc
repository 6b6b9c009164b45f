#include "models/dlrm_model.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/logging.h"
#include "gtest/gtest.h"
#include "models/interactions.h"
#include "tests/models/gradient_check.h"

namespace eps {
namespace {

std::unique_ptr<Model> Make(const std::string& activation, const std::string& pooling = "sum") {
  ModelOptions options;
  options.type = "dlrm";
  options.num_dense = 3;
  options.num_fields = 4;
  options.embedding_dim = 3;
  options.bottom_mlp = {5, 3};
  options.top_mlp = {6, 1};
  options.activation = activation;
  options.pooling = pooling;
  StatusOr<std::unique_ptr<Model>> model = Model::Create(options);
  CHECK_OK(model.status());
  return *std::move(model);
}

TEST(DlrmModel, DeclaresItsParams) {
  std::unique_ptr<Model> model = Make("relu");
  const std::vector<ParamSpec>& params = model->params();
  ASSERT_EQ(params.size(), 5u);
  EXPECT_EQ(params[0].name, "dlrm.emb");
  EXPECT_EQ(params[0].kind, ParamSpec::Kind::kEmbedding);
  EXPECT_EQ(params[0].size, 3u);
  EXPECT_EQ(params[1].name, "dlrm.bottom.0");
  EXPECT_EQ(params[1].size, 3u * 5 + 5);
  EXPECT_EQ(params[2].name, "dlrm.bottom.1");
  EXPECT_EQ(params[2].size, 5u * 3 + 3);
  // Top input: z (3) + (4+1)*4/2 = 10 dots.
  EXPECT_EQ(params[3].name, "dlrm.top.0");
  EXPECT_EQ(params[3].size, 13u * 6 + 6);
  EXPECT_EQ(params[4].name, "dlrm.top.1");
  EXPECT_EQ(params[4].size, 6u * 1 + 1);
}

TEST(DlrmModel, DefaultsAreTheReferenceCriteoConfiguration) {
  StatusOr<std::unique_ptr<Model>> model = Model::Create(ModelOptions{.type = "dlrm"});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<ParamSpec>& params = (*model)->params();
  ASSERT_EQ(params.size(), 1u + 4 + 3);
  EXPECT_EQ(params[0].size, 16u);
  EXPECT_EQ(params[1].size, 13u * 512 + 512);   // 13-512
  EXPECT_EQ(params[4].size, 64u * 16 + 16);     // ...-64-16
  EXPECT_EQ(params[5].size, 367u * 512 + 512);  // 16 + 351 dots -> 512
  EXPECT_EQ(params[7].size, 256u * 1 + 1);      // ...-256-1
}

TEST(DlrmModel, GradientsMatchFiniteDifferences) {
  for (const std::string activation : {"tanh", "sigmoid"}) {
    SCOPED_TRACE(activation);
    std::unique_ptr<Model> model = Make(activation);
    const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/3, /*seed=*/11);
    ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 12));
  }
}

TEST(DlrmModel, MultiValueGradientsMatchFiniteDifferences) {
  for (const std::string pooling : {"sum", "mean"}) {
    SCOPED_TRACE(pooling);
    std::unique_ptr<Model> model = Make("tanh", pooling);
    const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/4, /*seed=*/23, /*max_values=*/3);
    ASSERT_TRUE(batch.multi_value());
    ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 24));
  }
}

// Mean pooling of a field whose ids all have the same row is that row: the
// model's output equals that of a single-value batch with one of the ids.
TEST(DlrmModel, MeanOfEqualRowsIsTheRow) {
  std::unique_ptr<Model> model = Make("relu", "mean");
  BatchBuilder multi(3, 4), single(3, 4);
  const std::vector<float> dense = {0.5f, 1, 1.5f};
  multi.Add(1, dense, std::vector<uint64_t>{1, 2, 3, 4, 5, 6}, std::vector<uint32_t>{3, 4, 5, 6});
  single.Add(1, dense, std::vector<uint64_t>{1, 4, 5, 6});
  const Batch a = multi.Finish();
  const Batch b = single.Finish();
  ParamBuffers pa = RandomParams(*model, a, 25);
  ParamBuffers pb = pa;
  // Rows of ids 1, 2, 3 (keys 0..2 of `a`) all equal: b's key 0 is id 1.
  for (int k = 0; k < 3; ++k) {
    for (int j = 0; j < 3; ++j) pa[0][k * 3 + j] = pa[0][j];
  }
  pb[0] = {pa[0].begin(), pa[0].begin() + 3};
  pb[0].insert(pb[0].end(), pa[0].begin() + 9, pa[0].end());  // ids 4, 5, 6
  std::vector<float> predictions_a, predictions_b;
  model->ForwardBackward(a, pa, &predictions_a, nullptr);
  model->ForwardBackward(b, pb, &predictions_b, nullptr);
  EXPECT_NEAR(predictions_a[0], predictions_b[0], 1e-6);
}

TEST(DlrmModel, ReluGradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> model = Make("relu");
  const Batch batch = RandomBatch(/*n=*/6, 3, 4, /*vocabulary=*/3, /*seed=*/13);
  ExpectModelGradientsMatchFiniteDifferences(*model, batch, RandomParams(*model, batch, 14),
                                             {.step = 1e-3f, .abs_tolerance = 3e-4});
}

TEST(DlrmModel, RejectsABottomMlpNotEndingInTheEmbeddingDim) {
  ModelOptions options;
  options.type = "dlrm";
  options.embedding_dim = 8;  // bottom_mlp still ends in 16
  EXPECT_EQ(Model::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps
