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
  GatherFields(batch, rows.data(), /*dim=*/2, Pooling::kSum, out.data(), /*stride=*/5, /*offset=*/1);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 4, 0, 5, 6, 1, 2}));
}

TEST(FieldEmbeddings, ScatterSumsTheUsesOfEachRow) {
  const Batch batch = TwoExamples();
  const std::vector<float> d = {0, 1, 2, 3, 4, 0, 5, 6, 10, 20};
  std::vector<float> grad(6, 0.0f);
  ScatterAddFields(batch, d.data(), /*stride=*/5, /*offset=*/1, /*dim=*/2, Pooling::kSum, grad.data());
  EXPECT_EQ(grad, (std::vector<float>{11, 22, 3, 4, 5, 6}));
}

TEST(FieldEmbeddings, SumsAndScattersDimOneWeights) {
  const Batch batch = TwoExamples();
  const std::vector<float> w = {0.5f, 2, -1};
  std::vector<float> sums(2);
  SumFieldWeights(batch, w.data(), Pooling::kSum, sums.data());
  EXPECT_EQ(sums, (std::vector<float>{2.5f, -0.5f}));
  const std::vector<float> dout = {1, 3};
  std::vector<float> grad(3, 0.0f);
  ScatterAddFieldWeights(batch, dout.data(), Pooling::kSum, grad.data());
  EXPECT_EQ(grad, (std::vector<float>{4, 1, 3}));
}

// Example 0: field 0 has ids (7, 8), field 1 has (9); example 1: field 0
// has (8), field 1 has (7, 9, 8). keys = [7, 8, 9].
Batch MultiValue() {
  BatchBuilder builder(/*num_dense=*/0, /*num_fields=*/2);
  builder.Add(1, {}, std::vector<uint64_t>{7, 8, 9}, std::vector<uint32_t>{2, 3});
  builder.Add(0, {}, std::vector<uint64_t>{8, 7, 9, 8}, std::vector<uint32_t>{1, 4});
  return builder.Finish();
}

TEST(FieldEmbeddings, BuilderKeepsOffsetsOnlyForMultiValueBatches) {
  BatchBuilder builder(/*num_dense=*/0, /*num_fields=*/2);
  builder.Add(1, {}, std::vector<uint64_t>{7, 8}, std::vector<uint32_t>{1, 2});
  EXPECT_FALSE(builder.Finish().multi_value());
  // A single-value example first, then a multi-value one: the first gets
  // its offsets spelled out; a later single-value one continues them.
  builder.Add(1, {}, std::vector<uint64_t>{7, 8});
  builder.Add(1, {}, std::vector<uint64_t>{9, 7, 8}, std::vector<uint32_t>{2, 3});
  builder.Add(1, {}, std::vector<uint64_t>{8, 9});
  const Batch batch = builder.Finish();
  ASSERT_TRUE(batch.multi_value());
  EXPECT_EQ(batch.offsets, (std::vector<uint32_t>{0, 1, 2, 4, 5, 6, 7}));
  EXPECT_EQ(batch.slots, (std::vector<uint32_t>{0, 1, 2, 0, 1, 1, 2}));
  batch.CheckShape();
}

TEST(FieldEmbeddings, PoolsMultiValueFields) {
  const Batch batch = MultiValue();
  ASSERT_EQ(batch.keys, (std::vector<uint64_t>{7, 8, 9}));
  const std::vector<float> rows = {1, 2, 10, 20, 100, 200};  // dim 2
  std::vector<float> sum(2 * 4), mean(2 * 4);
  GatherFields(batch, rows.data(), 2, Pooling::kSum, sum.data(), /*stride=*/4, /*offset=*/0);
  GatherFields(batch, rows.data(), 2, Pooling::kMean, mean.data(), /*stride=*/4, /*offset=*/0);
  EXPECT_EQ(sum, (std::vector<float>{11, 22, 100, 200, 10, 20, 111, 222}));
  EXPECT_EQ(mean, (std::vector<float>{5.5f, 11, 100, 200, 10, 20, 37, 74}));

  const std::vector<float> w = {1, 10, 100};
  std::vector<float> sums(2), means(2);
  SumFieldWeights(batch, w.data(), Pooling::kSum, sums.data());
  SumFieldWeights(batch, w.data(), Pooling::kMean, means.data());
  EXPECT_EQ(sums, (std::vector<float>{111, 121}));
  EXPECT_EQ(means, (std::vector<float>{105.5f, 47}));
}

TEST(FieldEmbeddings, ScattersPooledGradientsToEveryId) {
  const Batch batch = MultiValue();
  // d of example 0: field 0 (1, 2), field 1 (3, 4); example 1: (5, 6), (6, 3).
  const std::vector<float> d = {1, 2, 3, 4, 5, 6, 6, 3};
  std::vector<float> sum(6, 0.0f), mean(6, 0.0f);
  ScatterAddFields(batch, d.data(), 4, 0, 2, Pooling::kSum, sum.data());
  ScatterAddFields(batch, d.data(), 4, 0, 2, Pooling::kMean, mean.data());
  // key 7: ex0 f0 + ex1 f1; key 8: ex0 f0 + ex1 f0 + ex1 f1; key 9: ex0 f1 + ex1 f1.
  EXPECT_EQ(sum, (std::vector<float>{7, 5, 12, 11, 9, 7}));
  EXPECT_EQ(mean, (std::vector<float>{2.5f, 2, 7.5f, 8, 5, 5}));

  const std::vector<float> dout = {2, 6};
  std::vector<float> g_sum(3, 0.0f), g_mean(3, 0.0f);
  ScatterAddFieldWeights(batch, dout.data(), Pooling::kSum, g_sum.data());
  ScatterAddFieldWeights(batch, dout.data(), Pooling::kMean, g_mean.data());
  EXPECT_EQ(g_sum, (std::vector<float>{8, 14, 8}));
  EXPECT_EQ(g_mean, (std::vector<float>{3, 9, 4}));
}

}  // namespace
}  // namespace eps
