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
    EXPECT_FALSE(batch.ready(0)) << "after " << worker << " pushes";
    ASSERT_EQ(batch.Add(PushOf(grads[worker], 1024, 0)).value(), GlobalBatch::Outcome::kAdded);
  }
  ASSERT_TRUE(batch.ready(0));
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
  ASSERT_TRUE(two.ready(0) && one.ready(0));
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
  EXPECT_FALSE(batch.ready(0));
  EXPECT_EQ(batch.records_in_hand(), 750u);
  // Computed before this server restarted (ahead of it): fresh.
  ASSERT_EQ(batch.Add(PushOf({4, 4, 4, 4}, 250, 9)).value(), GlobalBatch::Outcome::kAdded);
  ASSERT_TRUE(batch.ready(0));
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
  EXPECT_TRUE(batch.ready(0));
}

// A worker that leaves mid-batch keeps what it added; the others fill the
// batch without waiting for it.
TEST(GlobalBatchTest, AWorkerLeavingMidBatchIsFilledInByTheOthers) {
  GlobalBatch batch(Options(3072));
  ASSERT_TRUE(batch.Add(PushOf({3, 3, 3, 3}, 1024, 0)).ok());  // worker A, then gone
  ASSERT_TRUE(batch.Add(PushOf({0, 0, 0, 0}, 1024, 0)).ok());  // worker B
  EXPECT_FALSE(batch.ready(0));
  ASSERT_TRUE(batch.Add(PushOf({0, 0, 0, 0}, 1024, 0)).ok());  // B again, A's share
  ASSERT_TRUE(batch.ready(0));
  EXPECT_THAT(batch.Take().grads, Pointwise(FloatEq(), std::vector<float>{1, 1, 1, 1}));
}

TEST(GlobalBatchTest, NothingIsAppliedTwice) {
  GlobalBatch batch(Options(100));
  ASSERT_TRUE(batch.Add(PushOf({8, 8, 8, 8}, 100, 0)).ok());
  ASSERT_TRUE(batch.ready(0));
  EXPECT_THAT(batch.Take().grads, Pointwise(FloatEq(), std::vector<float>{8, 8, 8, 8}));
  EXPECT_EQ(batch.records_in_hand(), 0u);
  EXPECT_FALSE(batch.ready(0));
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
  ASSERT_FALSE(batch.ready(0));
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

// Reservations (the synchronous rule): a push from worker `w` at `at_ms`.
GlobalBatch::Push PushBy(uint64_t worker, int64_t at_ms, uint32_t records, uint64_t based_on) {
  static const std::vector<float> kOnes = {1, 1, 1, 1};
  GlobalBatch::Push push = PushOf(kOnes, records, based_on);
  push.worker = worker;
  push.at_ms = at_ms;
  return push;
}

// Reads the version being filled as `worker` would: true when granted.
bool Read(GlobalBatch& batch, uint64_t worker, int64_t now_ms) {
  if (!batch.MayRead(worker, now_ms)) return false;
  batch.Hold(worker, now_ms);
  return true;
}

// Every gradient the batch counted on arrives before it steps: a worker
// that comes back for more while the others still compute is told to wait
// for the next version instead of computing one that would be dropped.
TEST(GlobalBatchTest, AReadOfAFullBatchWaitsAndNoPushIsDropped) {
  GlobalBatch batch(Options(4096, /*max_staleness=*/0));
  // Two workers (0 is an id like any other), batches of 1,024: each reads
  // once (nothing measured yet: a reservation stands for one record),
  // pushes, and reads again.
  for (int64_t t = 0; t < 4; ++t) {
    const uint64_t worker = static_cast<uint64_t>(t % 2);
    ASSERT_TRUE(Read(batch, worker, 10 * t)) << "read " << t;
    ASSERT_EQ(batch.Add(PushBy(worker, 10 * t + 5, 1024, 0)).value(),
              GlobalBatch::Outcome::kAdded);
    // 4,096 in after the fourth: the step is due.
    EXPECT_EQ(batch.ready(10 * t + 5), t == 3) << "after push " << t;
  }
  batch.Take();
  // Version 1, from empty: worker 1 reads, pushes, reads; worker 2 reads.
  ASSERT_TRUE(Read(batch, 1, 100));
  ASSERT_TRUE(Read(batch, 2, 100));
  ASSERT_TRUE(batch.Add(PushBy(1, 110, 1024, 1)).ok());
  ASSERT_TRUE(Read(batch, 1, 111));  // 1,024 in + 2 x 1,024 reserved
  ASSERT_TRUE(batch.Add(PushBy(1, 120, 1024, 1)).ok());
  // 2,048 in, worker 2 computing on 1,024 more: worker 1's next batch fits.
  ASSERT_TRUE(Read(batch, 1, 121));
  ASSERT_TRUE(batch.Add(PushBy(1, 130, 1024, 1)).ok());
  // 3,072 in + worker 2's 1,024: full. Worker 1 waits; the step waits for 2.
  EXPECT_FALSE(Read(batch, 1, 131));
  EXPECT_FALSE(batch.ready(131));
  ASSERT_EQ(batch.Add(PushBy(2, 140, 1024, 1)).value(), GlobalBatch::Outcome::kAdded);
  ASSERT_TRUE(batch.ready(140));
  EXPECT_EQ(batch.Take().records, 4096u);
  // Version 2: the waiter reads it.
  EXPECT_TRUE(Read(batch, 1, 141));
  EXPECT_EQ(batch.stats().pushes_dropped, 0u);
  EXPECT_EQ(batch.stats().reads_refused, 1u);
  EXPECT_EQ(batch.stats().reservations_expired, 0u);
}

// A worker that read and never pushes (killed, frozen) delays the step by
// at most the bound on a reservation; its late push is then dropped.
TEST(GlobalBatchTest, AReservationNotPushedExpiresAfterItsBound) {
  GlobalBatch::Options options = Options(2048, /*max_staleness=*/0);
  options.min_hold_ms = 50;
  options.max_hold_ms = 1000;
  GlobalBatch batch(options);
  // Unmeasured: the bound is max_hold_ms.
  EXPECT_EQ(batch.hold_bound_ms(), 1000);
  ASSERT_TRUE(Read(batch, 1, 0));
  ASSERT_TRUE(Read(batch, 2, 0));
  ASSERT_TRUE(batch.Add(PushBy(1, 20, 1024, 0)).ok());  // held 20 ms
  EXPECT_EQ(batch.hold_bound_ms(), 80);                  // 4 x 20 ms
  // 1,024 in, worker 2 computing on the other 1,024: worker 1 waits,
  // until worker 2 (frozen since 0) is past its bound.
  EXPECT_FALSE(Read(batch, 1, 20));
  EXPECT_FALSE(Read(batch, 1, 60));
  EXPECT_EQ(batch.holders(), 1u);
  ASSERT_TRUE(Read(batch, 1, 100));
  EXPECT_EQ(batch.stats().reservations_expired, 1u);
  ASSERT_TRUE(batch.Add(PushBy(1, 120, 1024, 0)).ok());
  ASSERT_TRUE(batch.ready(120));
  batch.Take();
  // Thawed: its push on version 0 is stale now.
  EXPECT_EQ(batch.Add(PushBy(2, 300, 1024, 0)).value(), GlobalBatch::Outcome::kDropped);
  // The bound never falls below min_hold_ms nor rises above max_hold_ms.
  ASSERT_TRUE(Read(batch, 1, 1000));
  ASSERT_TRUE(batch.Add(PushBy(1, 1000, 1024, 1)).ok());
  EXPECT_GE(batch.hold_bound_ms(), 50);
  ASSERT_TRUE(Read(batch, 1, 1000));
  ASSERT_TRUE(batch.Add(PushBy(1, 60000, 1024, 1)).ok());
  EXPECT_EQ(batch.hold_bound_ms(), 1000);
}

// A refused worker queues: a worker coming back at once cannot take the
// room the step freed from the one that waited.
TEST(GlobalBatchTest, AWorkerThatWaitedReadsBeforeANewcomer) {
  GlobalBatch batch(Options(2048, /*max_staleness=*/0));
  ASSERT_TRUE(Read(batch, 1, 0));
  ASSERT_TRUE(batch.Add(PushBy(1, 1, 1024, 0)).ok());
  ASSERT_TRUE(Read(batch, 2, 2));       // 1,024 in + 1,024 reserved: full
  EXPECT_FALSE(Read(batch, 3, 3));      // worker 3 waits
  ASSERT_TRUE(batch.Add(PushBy(2, 4, 1024, 0)).ok());
  ASSERT_TRUE(batch.ready(4));
  batch.Take();
  // Room for worker 3 and one more: worker 2, back at once, gets in;
  // a newcomer does not (the room left is worker 3's).
  EXPECT_TRUE(Read(batch, 2, 5));
  EXPECT_FALSE(Read(batch, 4, 5)) << "worker 4 took worker 3's turn";
  EXPECT_TRUE(Read(batch, 3, 6));
  EXPECT_FALSE(Read(batch, 4, 8));  // full again: 2 x 1,024 reserved
  ASSERT_TRUE(batch.Add(PushBy(3, 9, 1024, 1)).ok());
  ASSERT_TRUE(batch.Add(PushBy(2, 9, 1024, 1)).ok());
  ASSERT_TRUE(batch.ready(9));
  batch.Take();
  // Worker 4 stopped asking: after waiter_ms its turn is gone.
  EXPECT_TRUE(Read(batch, 5, 2000));
  // A worker another server let in gets in over the batch, up to twice it.
  EXPECT_TRUE(batch.MayRead(6, 2001, /*held_elsewhere=*/true));
  batch.Hold(6, 2001);
  EXPECT_FALSE(batch.MayRead(7, 2001)) << "workers 5 and 6 hold 2 x 1,024";
  for (uint64_t worker : {7, 8}) {
    EXPECT_TRUE(batch.MayRead(worker, 2001, /*held_elsewhere=*/true)) << worker;
    batch.Hold(worker, 2001);
  }
  EXPECT_FALSE(batch.MayRead(9, 2001, /*held_elsewhere=*/true)) << "4,096 reserved";
  // A flush drops the reservations without counting them as expired.
  batch.DropReservations();
  EXPECT_EQ(batch.holders(), 0u);
  EXPECT_EQ(batch.stats().reservations_expired, 0u);
}

}  // namespace
}  // namespace eps
