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

std::unique_ptr<Model> Make(const std::string& activation) {
  ModelOptions options;
  options.type = "dlrm";
  options.num_dense = 3;
  options.num_fields = 4;
  options.embedding_dim = 3;
  options.bottom_mlp = {5, 3};
  options.top_mlp = {6, 1};
  options.activation = activation;
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
