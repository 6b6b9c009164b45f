#include "models/field_embeddings.h"

#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

// Two examples, two fields; id 7 appears in both: keys = [7, 8, 9].
Batch TwoExamples() {
  BatchBuilder builder(/*num_dense=*/1, /*num_fields=*/2);
  builder.Add(1, std::vector<float>{0}, std::vector<uint64_t>{7, 8});
  builder.Add(0, std::vector<float>{0}, std::vector<uint64_t>{9, 7});
  return builder.Finish();
}

TEST(FieldEmbeddings, GathersRowsIntoTheLayout) {
  const Batch batch = TwoExamples();
  ASSERT_EQ(batch.keys, (std::vector<uint64_t>{7, 8, 9}));
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6};  // dim 2
  std::vector<float> out(2 * 5, 0.0f);
  GatherFields(batch, rows.data(), /*dim=*/2, out.data(), /*stride=*/5, /*offset=*/1);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 4, 0, 5, 6, 1, 2}));
}

TEST(FieldEmbeddings, ScatterSumsTheUsesOfEachRow) {
  const Batch batch = TwoExamples();
  const std::vector<float> d = {0, 1, 2, 3, 4, 0, 5, 6, 10, 20};
  std::vector<float> grad(6, 0.0f);
  ScatterAddFields(batch, d.data(), /*stride=*/5, /*offset=*/1, /*dim=*/2, grad.data());
  EXPECT_EQ(grad, (std::vector<float>{11, 22, 3, 4, 5, 6}));
}

TEST(FieldEmbeddings, SumsAndScattersDimOneWeights) {
  const Batch batch = TwoExamples();
  const std::vector<float> w = {0.5f, 2, -1};
  std::vector<float> sums(2);
  SumFieldWeights(batch, w.data(), sums.data());
  EXPECT_EQ(sums, (std::vector<float>{2.5f, -0.5f}));
  const std::vector<float> dout = {1, 3};
  std::vector<float> grad(3, 0.0f);
  ScatterAddFieldWeights(batch, dout.data(), grad.data());
  EXPECT_EQ(grad, (std::vector<float>{4, 1, 3}));
}

}  // namespace
}  // namespace eps
