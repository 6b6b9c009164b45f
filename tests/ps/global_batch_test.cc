// GlobalBatch (ps/global_batch.h) with scripted pushes: one step per global
// batch whichever workers sent it, stale gradients decayed then dropped, a
// worker leaving mid-batch, nothing applied twice.

#include "ps/global_batch.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::Pointwise;

const std::vector<uint64_t> kKeys = {10, 11};  // two chunks of 2 floats

GlobalBatch::Push PushOf(const std::vector<float>& grads, uint32_t records, uint64_t based_on,
                         const std::vector<uint64_t>& keys = kKeys) {
  return GlobalBatch::Push{.keys = keys, .grads = grads, .records = records, .based_on = based_on};
}

GlobalBatch::Options Options(uint64_t records, uint32_t max_staleness = 1) {
  return GlobalBatch::Options{.records = records, .dim = 2, .max_staleness = max_staleness};
}

TEST(GlobalBatchTest, OneStepPerGlobalBatchOfRecordsWhoeverSentThem) {
  GlobalBatch batch(Options(4096));
  const std::vector<float> grads[4] = {
      {1, 2, 3, 4}, {5, 6, 7, 8}, {-1, 0, 1, 2}, {3, 3, 3, 3}};
  for (int worker = 0; worker < 4; ++worker) {
    EXPECT_FALSE(batch.ready()) << "after " << worker << " pushes";
    ASSERT_EQ(batch.Add(PushOf(grads[worker], 1024, 0)).value(), GlobalBatch::Outcome::kAdded);
  }
  ASSERT_TRUE(batch.ready());
  const GlobalBatch::Step step = batch.Take();
  EXPECT_THAT(step.keys, ElementsAre(10u, 11u));
  EXPECT_THAT(step.grads, Pointwise(FloatEq(), std::vector<float>{2, 2.75f, 3.5f, 4.25f}));
  EXPECT_EQ(step.records, 4096u);
  EXPECT_EQ(step.version, 1u);
  EXPECT_EQ(batch.version(), 1u);
  EXPECT_EQ(batch.stats().steps, 1u);
}

// The model does not change with the number of workers: two workers'
// halves make the step one worker's whole batch makes.
TEST(GlobalBatchTest, TwoWorkersHalvesMakeTheStepOfOneWorkersWholeBatch) {
  const std::vector<float> first = {0.5f, -1, 2, 0};  // the mean over records 0..511
  const std::vector<float> second = {1.5f, 1, 0, 4};  // over 512..2047
  GlobalBatch two(Options(2048));
  ASSERT_TRUE(two.Add(PushOf(first, 512, 0)).ok());
  ASSERT_TRUE(two.Add(PushOf(second, 1536, 0)).ok());
  GlobalBatch one(Options(2048));
  std::vector<float> whole(4);
  for (int j = 0; j < 4; ++j) whole[j] = (512 * first[j] + 1536 * second[j]) / 2048;
  ASSERT_TRUE(one.Add(PushOf(whole, 2048, 0)).ok());
  ASSERT_TRUE(two.ready() && one.ready());
  EXPECT_THAT(two.Take().grads, Pointwise(FloatEq(), one.Take().grads));
}

TEST(GlobalBatchTest, AStaleGradientIsDecayedThenDropped) {
  GlobalBatch batch(Options(1000, /*max_staleness=*/1), /*version=*/5);
  // On the current version: whole.
  ASSERT_EQ(batch.Add(PushOf({4, 4, 4, 4}, 500, 5)).value(), GlobalBatch::Outcome::kAdded);
  // One step behind: counts its records, its gradient halved.
  ASSERT_EQ(batch.Add(PushOf({4, 4, 4, 4}, 250, 4)).value(), GlobalBatch::Outcome::kAdded);
  // Two steps behind: dropped, its records uncounted.
  ASSERT_EQ(batch.Add(PushOf({100, 100, 100, 100}, 250, 3)).value(),
            GlobalBatch::Outcome::kDropped);
  EXPECT_FALSE(batch.ready());
  EXPECT_EQ(batch.records_in_hand(), 750u);
  // Computed before this server restarted (ahead of it): fresh.
  ASSERT_EQ(batch.Add(PushOf({4, 4, 4, 4}, 250, 9)).value(), GlobalBatch::Outcome::kAdded);
  ASSERT_TRUE(batch.ready());
  const GlobalBatch::Step step = batch.Take();
  // (500*4 + 250*2 + 250*4) / 1000
  EXPECT_THAT(step.grads, Pointwise(FloatEq(), std::vector<float>{3.5f, 3.5f, 3.5f, 3.5f}));
  EXPECT_EQ(step.version, 6u);
  EXPECT_EQ(batch.stats().pushes, 3u);
  EXPECT_EQ(batch.stats().pushes_decayed, 1u);
  EXPECT_EQ(batch.stats().pushes_dropped, 1u);
  EXPECT_EQ(batch.stats().records_dropped, 250u);
}

TEST(GlobalBatchTest, ByDefaultAGradientOfAnOlderVersionIsDropped) {
  GlobalBatch batch(GlobalBatch::Options{.records = 100, .dim = 2}, /*version=*/2);
  EXPECT_EQ(batch.Add(PushOf({1, 1, 1, 1}, 50, 1)).value(), GlobalBatch::Outcome::kDropped);
  EXPECT_EQ(batch.Add(PushOf({1, 1, 1, 1}, 100, 2)).value(), GlobalBatch::Outcome::kAdded);
  EXPECT_EQ(batch.stats().records_dropped, 50u);
  EXPECT_TRUE(batch.ready());
}

// A worker that leaves mid-batch keeps what it added; the others fill the
// batch without waiting for it.
TEST(GlobalBatchTest, AWorkerLeavingMidBatchIsFilledInByTheOthers) {
  GlobalBatch batch(Options(3072));
  ASSERT_TRUE(batch.Add(PushOf({3, 3, 3, 3}, 1024, 0)).ok());  // worker A, then gone
  ASSERT_TRUE(batch.Add(PushOf({0, 0, 0, 0}, 1024, 0)).ok());  // worker B
  EXPECT_FALSE(batch.ready());
  ASSERT_TRUE(batch.Add(PushOf({0, 0, 0, 0}, 1024, 0)).ok());  // B again, A's share
  ASSERT_TRUE(batch.ready());
  EXPECT_THAT(batch.Take().grads, Pointwise(FloatEq(), std::vector<float>{1, 1, 1, 1}));
}

TEST(GlobalBatchTest, NothingIsAppliedTwice) {
  GlobalBatch batch(Options(100));
  ASSERT_TRUE(batch.Add(PushOf({8, 8, 8, 8}, 100, 0)).ok());
  ASSERT_TRUE(batch.ready());
  EXPECT_THAT(batch.Take().grads, Pointwise(FloatEq(), std::vector<float>{8, 8, 8, 8}));
  EXPECT_EQ(batch.records_in_hand(), 0u);
  EXPECT_FALSE(batch.ready());
  // The next step holds only what came after.
  ASSERT_TRUE(batch.Add(PushOf({2, 2, 2, 2}, 100, 1)).ok());
  const GlobalBatch::Step next = batch.Take();
  EXPECT_THAT(next.grads, Pointwise(FloatEq(), std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(next.version, 2u);
}

// A flush (a checkpoint pause, a hand-off) applies the part in hand whole.
TEST(GlobalBatchTest, AFlushAppliesThePartInHandAsOneStep) {
  GlobalBatch batch(Options(4096));
  ASSERT_TRUE(batch.Add(PushOf({1, 2, 3, 4}, 1000, 0)).ok());
  ASSERT_FALSE(batch.ready());
  const GlobalBatch::Step step = batch.Take();
  EXPECT_EQ(step.records, 1000u);
  EXPECT_THAT(step.grads, Pointwise(FloatEq(), std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(batch.version(), 1u);
}

// A push that carries only some keys (a partition moving away): each key's
// mean is over the pushes that carried it.
TEST(GlobalBatchTest, EachKeysMeanIsOverThePushesThatCarriedIt) {
  GlobalBatch batch(Options(300));
  ASSERT_TRUE(batch.Add(PushOf({1, 1, 6, 6}, 100, 0)).ok());
  ASSERT_TRUE(batch.Add(PushOf({4, 4}, 200, 0, {11})).ok());
  const GlobalBatch::Step step = batch.Take();
  EXPECT_THAT(step.keys, ElementsAre(10u, 11u));
  // Key 10: 1 (one push); key 11: (100*6 + 200*4) / 300.
  EXPECT_THAT(step.grads, Pointwise(FloatEq(), std::vector<float>{1, 1, 14.0f / 3, 14.0f / 3}));
}

TEST(GlobalBatchTest, AResetForgetsTheSumAndKeepsTheVersion) {
  GlobalBatch batch(Options(100), /*version=*/3);
  ASSERT_TRUE(batch.Add(PushOf({9, 9, 9, 9}, 50, 3)).ok());
  batch.Reset();
  EXPECT_EQ(batch.records_in_hand(), 0u);
  ASSERT_TRUE(batch.Add(PushOf({1, 1, 1, 1}, 100, 3)).ok());
  const GlobalBatch::Step step = batch.Take();
  EXPECT_THAT(step.grads, Pointwise(FloatEq(), std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(step.version, 4u);
}

TEST(GlobalBatchTest, AMalformedPushAddsNothing) {
  GlobalBatch batch(Options(100));
  EXPECT_EQ(batch.Add(PushOf({1, 2, 3}, 10, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.Add(PushOf({1, 2, 3, 4}, 0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.records_in_hand(), 0u);
  EXPECT_EQ(batch.stats().pushes, 0u);
}

}  // namespace
}  // namespace eps
