#include "models/batch.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(BatchBuilder, DedupesKeysInFirstSeenOrder) {
  BatchBuilder builder(/*num_dense=*/2, /*num_fields=*/3);
  const std::vector<std::vector<uint64_t>> ids = {{50, 7, 9}, {7, 8, 50}, {9, 9, 1}};
  const std::vector<std::vector<float>> dense = {{1, 2}, {3, 4}, {5, 6}};
  const std::vector<float> labels = {1, 0, 1};
  for (int i = 0; i < 3; ++i) builder.Add(labels[i], dense[i], ids[i]);
  EXPECT_EQ(builder.size(), 3);

  const Batch batch = builder.Finish();
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.num_dense, 2);
  EXPECT_EQ(batch.num_fields, 3);
  EXPECT_EQ(batch.labels, labels);
  EXPECT_EQ(batch.dense, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(batch.keys, (std::vector<uint64_t>{50, 7, 9, 8, 1}));
  EXPECT_EQ(batch.slots, (std::vector<uint32_t>{0, 1, 2, 1, 3, 0, 2, 2, 4}));
  ASSERT_EQ(batch.slots.size(), 9u);
  for (int i = 0; i < 3; ++i) {
    for (int f = 0; f < 3; ++f) {
      EXPECT_EQ(batch.keys[batch.slots[i * 3 + f]], ids[i][f]) << "example " << i << " field " << f;
    }
  }
}

TEST(BatchBuilder, FinishStartsAnEmptyBatch) {
  BatchBuilder builder(/*num_dense=*/1, /*num_fields=*/2);
  const float dense[] = {0.5f};
  const uint64_t first[] = {11, 12};
  builder.Add(1, dense, first);
  const Batch one = builder.Finish();
  EXPECT_EQ(one.keys, (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(builder.size(), 0);

  const Batch empty = builder.Finish();
  EXPECT_EQ(empty.size(), 0);
  EXPECT_EQ(empty.num_dense, 1);
  EXPECT_EQ(empty.num_fields, 2);
  EXPECT_TRUE(empty.dense.empty());
  EXPECT_TRUE(empty.slots.empty());
  EXPECT_TRUE(empty.keys.empty());

  // Ids seen before Finish are new again: slots index this batch's keys.
  const uint64_t second[] = {12, 13};
  builder.Add(0, dense, second);
  const Batch two = builder.Finish();
  EXPECT_EQ(two.num_dense, 1);
  EXPECT_EQ(two.num_fields, 2);
  EXPECT_EQ(two.labels, (std::vector<float>{0}));
  EXPECT_EQ(two.keys, (std::vector<uint64_t>{12, 13}));
  EXPECT_EQ(two.slots, (std::vector<uint32_t>{0, 1}));
}

// A slice is the batch its examples alone would have built, and `from`
// finds each of its keys in the whole batch.
TEST(SliceBatch, EqualsTheBatchOfItsExamplesAlone) {
  const std::vector<std::vector<uint64_t>> ids = {{50, 7}, {7, 8}, {9, 9}, {1, 50}, {8, 2}};
  for (bool multi : {false, true}) {
    SCOPED_TRACE(multi ? "multi-value" : "single-value");
    auto add = [&](BatchBuilder& builder, int i) {
      const float dense[] = {static_cast<float>(i), 0.5f * i};
      if (multi && i == 2) {
        // Example 2's second field has three ids.
        const uint64_t many[] = {9, 9, 4, 50};
        const uint32_t ends[] = {1, 4};
        builder.Add(static_cast<float>(i % 2), dense, many, ends);
      } else {
        builder.Add(static_cast<float>(i % 2), dense, ids[i]);
      }
    };
    BatchBuilder whole_builder(2, 2);
    for (int i = 0; i < 5; ++i) add(whole_builder, i);
    const Batch whole = whole_builder.Finish();
    EXPECT_EQ(whole.multi_value(), multi);
    for (const auto& [begin, end] : std::vector<std::pair<int, int>>{{0, 2}, {2, 5}, {1, 4}, {3, 3}}) {
      SCOPED_TRACE(::testing::Message() << "examples " << begin << ".." << end);
      BatchBuilder alone_builder(2, 2);
      for (int i = begin; i < end; ++i) add(alone_builder, i);
      const Batch alone = alone_builder.Finish();
      std::vector<uint32_t> from;
      const Batch slice = SliceBatch(whole, begin, end, &from);
      slice.CheckShape();
      EXPECT_EQ(slice.labels, alone.labels);
      EXPECT_EQ(slice.dense, alone.dense);
      EXPECT_EQ(slice.keys, alone.keys);
      EXPECT_EQ(slice.slots, alone.slots);
      // A single-value slice of a multi-value batch keeps its offsets.
      if (alone.multi_value()) {
        EXPECT_EQ(slice.offsets, alone.offsets);
      }
      ASSERT_EQ(from.size(), slice.keys.size());
      for (size_t k = 0; k < from.size(); ++k) EXPECT_EQ(whole.keys[from[k]], slice.keys[k]);
    }
  }
}

TEST(BatchBuilder, HandlesNoDenseFeatures) {
  BatchBuilder builder(/*num_dense=*/0, /*num_fields=*/1);
  const uint64_t a[] = {3};
  const uint64_t b[] = {3};
  builder.Add(1, {}, a);
  builder.Add(0, {}, b);
  const Batch batch = builder.Finish();
  EXPECT_EQ(batch.size(), 2);
  EXPECT_TRUE(batch.dense.empty());
  EXPECT_EQ(batch.keys, (std::vector<uint64_t>{3}));
  EXPECT_EQ(batch.slots, (std::vector<uint32_t>{0, 0}));
}

TEST(BatchBuilderDeathTest, RejectsWrongSizes) {
  BatchBuilder builder(/*num_dense=*/2, /*num_fields=*/2);
  const float dense[] = {1};
  const uint64_t ids[] = {1, 2};
  EXPECT_DEATH(builder.Add(1, dense, ids), "Check failed");
}

}  // namespace
}  // namespace eps
