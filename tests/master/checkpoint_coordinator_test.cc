// Tests master/checkpoint_coordinator.h: when rounds start (interval,
// request), how they wait for paused workers and give up, which older
// checkpoints the servers keep and the store deletes, and the saved ids.

#include "master/checkpoint_coordinator.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"
#include "tests/master/unit_testing.h"
#include "tests/testing/recording_events.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kIntervalS = 60;
const absl::Duration kInterval = absl::Seconds(kIntervalS);
const absl::Duration kPatience = absl::Milliseconds(2 * kLeaseMs);

proto::CheckpointRecord Record(uint64_t id, uint64_t records_trained = 0) {
  proto::CheckpointRecord record;
  record.set_id(id);
  record.mutable_master()->set_records_trained(records_trained);
  *record.add_servers() = Part(0, id, /*bytes=*/100);
  record.set_bytes(100);
  record.set_pause_ms(500);
  return record;
}

class CheckpointCoordinatorTest : public ::testing::Test {
 protected:
  // Round `id`'s error, or "" when it has no result or succeeded.
  std::string ErrorOf(uint64_t id) const {
    const nlohmann::json* result = checkpoints_.Result(id);
    return result != nullptr && result->contains("error") ? (*result)["error"].get<std::string>()
                                                          : "";
  }

  CheckpointCoordinatorTest() {
    job_.checkpoint.interval_s = kIntervalS;
    job_.checkpoint.keep = 3;
    job_.master.lease_ms = kLeaseMs;
  }

  // Starts a round at `now` by request and has it written and completed.
  // Returns the write.
  CheckpointCoordinator::Write CompleteRound(absl::Time now) {
    const uint64_t id = checkpoints_.Request();
    EXPECT_EQ(checkpoints_.MaybeStart(now, /*may_start=*/true), id);
    std::optional<CheckpointCoordinator::Write> write =
        checkpoints_.Next(now, /*not_paused=*/{}, /*fences_pending=*/false, /*job_over=*/false);
    EXPECT_TRUE(write.has_value());
    if (!write.has_value()) return {};
    checkpoints_.Completed(Record(write->id), now);
    return *write;
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  JobConfig job_;
  RecordingEvents events_;
  CheckpointCoordinator checkpoints_{job_, &events_};
};

TEST_F(CheckpointCoordinatorTest, FirstRoundStartsAnIntervalAfterTheFirstCall) {
  EXPECT_EQ(checkpoints_.MaybeStart(t0_, /*may_start=*/true), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + kInterval - absl::Seconds(1), true), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + kInterval, /*may_start=*/false), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + kInterval, true), 1u);
  EXPECT_EQ(checkpoints_.round_id(), 1u);
  EXPECT_EQ(checkpoints_.last_id(), 1u);
  EXPECT_FALSE(checkpoints_.writing());
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + 3 * kInterval, true), std::nullopt)
      << "one round at a time";
  EXPECT_EQ(checkpoints_.round_id(), 1u);
}

TEST_F(CheckpointCoordinatorTest, IntervalCountsFromTheFirstCallThatMayStart) {
  // Before training (may_start false) no interval runs.
  EXPECT_EQ(checkpoints_.MaybeStart(t0_, /*may_start=*/false), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(30), true), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(30) + kInterval - absl::Seconds(1), true),
            std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(30) + kInterval, true), 1u);
}

TEST_F(CheckpointCoordinatorTest, WaitsWhileWorkersAreNotPaused) {
  checkpoints_.MaybeStart(t0_, true);
  const absl::Time started = t0_ + kInterval;
  ASSERT_EQ(checkpoints_.MaybeStart(started, true), 1u);
  EXPECT_EQ(checkpoints_.Next(started + absl::Milliseconds(100), {2, 5}, false, false),
            std::nullopt);
  EXPECT_EQ(checkpoints_.Next(started + absl::Milliseconds(200), {5}, false, false), std::nullopt);
  // Every worker paused, but a dead worker's fence has not reached every
  // server: it might still push.
  EXPECT_EQ(checkpoints_.Next(started + absl::Milliseconds(300), {}, /*fences_pending=*/true,
                              false),
            std::nullopt);
  EXPECT_EQ(checkpoints_.round_id(), 1u);
  EXPECT_FALSE(checkpoints_.writing());

  std::optional<CheckpointCoordinator::Write> write =
      checkpoints_.Next(started + absl::Milliseconds(400), {}, false, false);
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->id, 1u);
  EXPECT_EQ(write->started, started);
  EXPECT_THAT(write->keep, IsEmpty());
  EXPECT_TRUE(checkpoints_.writing());
  EXPECT_EQ(checkpoints_.Next(started + absl::Milliseconds(500), {}, false, false), std::nullopt)
      << "the write is returned once";
  // A writing round waits for its servers, not for patience.
  EXPECT_EQ(checkpoints_.Next(started + 10 * kPatience, {7}, false, false), std::nullopt);
  EXPECT_TRUE(checkpoints_.writing());
  EXPECT_EQ(checkpoints_.failed(), 0u);
}

// Workers still not paused after the patience are named once, for the
// caller to fence; the round then waits another patience for the fences.
TEST_F(CheckpointCoordinatorTest, NamesWorkersOverdueToPauseOncePerRound) {
  ASSERT_EQ(checkpoints_.Request(), 1u);
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 1u);
  EXPECT_THAT(checkpoints_.OverdueToPause(t0_ + kPatience, {3, 4}), IsEmpty());
  const absl::Time overdue_at = t0_ + kPatience + absl::Milliseconds(1);
  EXPECT_THAT(checkpoints_.OverdueToPause(overdue_at, {3, 4}), ElementsAreArray({3u, 4u}));
  EXPECT_THAT(checkpoints_.OverdueToPause(overdue_at, {3, 4}), IsEmpty()) << "once per round";
  // Fenced, they are not waited for; their fences are, with a new patience.
  EXPECT_EQ(checkpoints_.Next(overdue_at + kPatience, {}, /*fences_pending=*/true, false),
            std::nullopt);
  EXPECT_EQ(checkpoints_.round_id(), 1u) << "still patient with the fences";
  std::optional<CheckpointCoordinator::Write> write =
      checkpoints_.Next(overdue_at + kPatience, {}, false, false);
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->id, 1u);
  EXPECT_EQ(checkpoints_.failed(), 0u);
}

TEST_F(CheckpointCoordinatorTest, WriteKeepsAtMostKeepMinusOneOlderCheckpoints) {
  const std::vector<std::vector<uint64_t>> expected_keep = {{}, {1}, {1, 2}, {2, 3}, {3, 4}};
  for (uint64_t id = 1; id <= 5; ++id) {
    const CheckpointCoordinator::Write write = CompleteRound(t0_ + absl::Minutes(id));
    EXPECT_EQ(write.id, id);
    EXPECT_THAT(write.keep, ElementsAreArray(expected_keep[id - 1])) << "checkpoint " << id;
  }
  EXPECT_EQ(checkpoints_.written(), 5u);
}

TEST_F(CheckpointCoordinatorTest, FailsAfterTwoLeasesOfPatienceNamingTheWorkers) {
  ASSERT_EQ(checkpoints_.Request(), 1u);
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 1u);
  EXPECT_EQ(checkpoints_.Next(t0_ + kPatience, {3, 4}, false, false), std::nullopt);
  EXPECT_EQ(checkpoints_.round_id(), 1u) << "exactly the patience is still patient";

  const absl::Time failed_at = t0_ + kPatience + absl::Milliseconds(1);
  EXPECT_EQ(checkpoints_.Next(failed_at, {3, 4}, false, false), std::nullopt);
  EXPECT_EQ(checkpoints_.round_id(), std::nullopt);
  EXPECT_EQ(checkpoints_.failed(), 1u);
  EXPECT_EQ(checkpoints_.written(), 0u);
  const nlohmann::json* result = checkpoints_.Result(1);
  ASSERT_NE(result, nullptr);
  ASSERT_TRUE(result->contains("error"));
  EXPECT_THAT((*result)["error"].get<std::string>(),
              HasSubstr("abandoned: worker(s) 3, 4 did not pause within 2s"));
  ASSERT_EQ(events_.Count("checkpoint_failed"), 1u);
  EXPECT_EQ(events_.Named("checkpoint_failed")[0]["checkpoint"], 1);
  EXPECT_TRUE(checkpoints_.LastResult().is_null()) << "no complete round";

  // The next round is due an interval after the failure, with a new id.
  EXPECT_EQ(checkpoints_.MaybeStart(failed_at + kInterval - absl::Milliseconds(1), true),
            std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(failed_at + kInterval, true), 2u);
}

TEST_F(CheckpointCoordinatorTest, FailsWhenFencesDoNotReachTheServersInTime) {
  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 1u);
  checkpoints_.Next(t0_ + kPatience + absl::Milliseconds(1), {}, /*fences_pending=*/true, false);
  EXPECT_EQ(checkpoints_.failed(), 1u);
  EXPECT_THAT(ErrorOf(1),
              HasSubstr("dead workers were not fenced at every server"));
}

TEST_F(CheckpointCoordinatorTest, FailsAtOnceWhenTheJobIsOver) {
  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 1u);
  checkpoints_.Next(t0_ + absl::Milliseconds(1), {3}, false, /*job_over=*/true);
  EXPECT_EQ(checkpoints_.round_id(), std::nullopt);
  EXPECT_THAT(ErrorOf(1), HasSubstr("the job is over"));
}

TEST_F(CheckpointCoordinatorTest, RequestStartsOneAtOnce) {
  EXPECT_EQ(checkpoints_.MaybeStart(t0_, true), std::nullopt);
  EXPECT_EQ(checkpoints_.Request(), 1u);
  EXPECT_EQ(checkpoints_.round_id(), std::nullopt) << "it starts at the next MaybeStart";
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(1), /*may_start=*/false), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(2), true), 1u);
  // Asked again during the round: the round in progress.
  EXPECT_EQ(checkpoints_.Request(), 1u);
  ASSERT_TRUE(checkpoints_.Next(t0_ + absl::Seconds(3), {}, false, false).has_value());
  checkpoints_.Completed(Record(1), t0_ + absl::Seconds(3));
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(4), true), std::nullopt)
      << "the request was served";

  // A request cancelled by a recovery does not start.
  EXPECT_EQ(checkpoints_.Request(), 2u);
  checkpoints_.CancelRequest();
  EXPECT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(5), true), std::nullopt);
}

TEST_F(CheckpointCoordinatorTest, CompleteUpdateDeletesTheOldestBeyondKeep) {
  CompleteRound(t0_ + absl::Minutes(1));
  CompleteRound(t0_ + absl::Minutes(2));
  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_ + absl::Minutes(3), true), 3u);
  ASSERT_TRUE(checkpoints_.Next(t0_ + absl::Minutes(3), {}, false, false).has_value());
  // Two kept and this one: keep = 3, nothing goes.
  PeekedUpdate update = PeekUpdate(checkpoints_.CompleteUpdate(Record(3)));
  EXPECT_THAT(update.put_keys, ElementsAre(CheckpointKey(3)));
  EXPECT_THAT(update.deleted_keys, IsEmpty());
  proto::CheckpointRecord stored;
  ASSERT_TRUE(stored.ParseFromString(update.values.at(CheckpointKey(3))));
  EXPECT_EQ(stored.id(), 3u);
  checkpoints_.Completed(Record(3), t0_ + absl::Minutes(3));

  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_ + absl::Minutes(4), true), 4u);
  ASSERT_TRUE(checkpoints_.Next(t0_ + absl::Minutes(4), {}, false, false).has_value());
  update = PeekUpdate(checkpoints_.CompleteUpdate(Record(4)));
  EXPECT_THAT(update.put_keys, ElementsAre(CheckpointKey(4)));
  EXPECT_THAT(update.deleted_keys, ElementsAre(CheckpointKey(1)));
  // The list changes only once the write succeeded.
  update = PeekUpdate(checkpoints_.CompleteUpdate(Record(4)));
  EXPECT_THAT(update.deleted_keys, ElementsAre(CheckpointKey(1)));
  checkpoints_.Completed(Record(4), t0_ + absl::Minutes(4));

  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_ + absl::Minutes(5), true), 5u);
  ASSERT_TRUE(checkpoints_.Next(t0_ + absl::Minutes(5), {}, false, false).has_value());
  EXPECT_THAT(PeekUpdate(checkpoints_.CompleteUpdate(Record(5))).deleted_keys,
              ElementsAre(CheckpointKey(2)));
}

TEST_F(CheckpointCoordinatorTest, CompletedMakesItLast) {
  EXPECT_FALSE(checkpoints_.last().has_value());
  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 1u);
  ASSERT_TRUE(checkpoints_.Next(t0_, {}, false, false).has_value());
  const absl::Time done = t0_ + absl::Seconds(2);
  checkpoints_.Completed(Record(1, /*records_trained=*/123), done);
  ASSERT_TRUE(checkpoints_.last().has_value());
  EXPECT_EQ(checkpoints_.last()->id(), 1u);
  EXPECT_EQ(checkpoints_.last()->master().records_trained(), 123u);
  EXPECT_EQ(checkpoints_.written(), 1u);
  EXPECT_EQ(checkpoints_.round_id(), std::nullopt);
  EXPECT_FALSE(checkpoints_.writing());
  EXPECT_DOUBLE_EQ(checkpoints_.pause_s(), 0.5);
  EXPECT_EQ(checkpoints_.LastResult()["checkpoint"], 1);
  EXPECT_EQ(checkpoints_.LastResult()["records_trained"], 123);
  ASSERT_NE(checkpoints_.Result(1), nullptr);
  EXPECT_FALSE(checkpoints_.Result(1)->contains("error"));
  ASSERT_EQ(events_.Count("checkpoint"), 1u);
  EXPECT_EQ(events_.Named("checkpoint")[0]["servers"][0]["path"], "/ckpt/ps-0/1");
  // The next one is due an interval after this one completed.
  EXPECT_EQ(checkpoints_.MaybeStart(done + kInterval - absl::Milliseconds(1), true), std::nullopt);
  EXPECT_EQ(checkpoints_.MaybeStart(done + kInterval, true), 2u);
}

TEST_F(CheckpointCoordinatorTest, AbandonPausingFailsOnlyAPausingRound) {
  checkpoints_.AbandonPausing("nothing to abandon", t0_);
  EXPECT_EQ(checkpoints_.failed(), 0u);

  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 1u);
  checkpoints_.AbandonPausing("ps[1] stopped heartbeating", t0_ + absl::Seconds(1));
  EXPECT_EQ(checkpoints_.round_id(), std::nullopt);
  EXPECT_EQ(checkpoints_.failed(), 1u);
  EXPECT_EQ(ErrorOf(1), "abandoned: ps[1] stopped heartbeating");

  checkpoints_.Request();
  ASSERT_EQ(checkpoints_.MaybeStart(t0_ + absl::Seconds(2), true), 2u);
  ASSERT_TRUE(checkpoints_.Next(t0_ + absl::Seconds(2), {}, false, false).has_value());
  checkpoints_.AbandonPausing("ps[1] stopped heartbeating", t0_ + absl::Seconds(3));
  EXPECT_TRUE(checkpoints_.writing()) << "a round writing carries on";
  EXPECT_EQ(checkpoints_.round_id(), 2u);
  EXPECT_EQ(checkpoints_.failed(), 1u);
  // Its servers' answer decides it.
  checkpoints_.Fail("ps[1]: connection lost", t0_ + absl::Seconds(4));
  EXPECT_EQ(checkpoints_.failed(), 2u);
  EXPECT_EQ(ErrorOf(2), "ps[1]: connection lost");
}

TEST_F(CheckpointCoordinatorTest, CheckpointZeroIsRecordedOnce) {
  proto::CheckpointRecord start;
  start.set_id(0);
  checkpoints_.RecordStart(start);
  ASSERT_TRUE(checkpoints_.last().has_value());
  EXPECT_EQ(checkpoints_.last()->id(), 0u);
  std::optional<proto::CheckpointRecord> pending = checkpoints_.TakePendingRecord();
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->id(), 0u);
  EXPECT_FALSE(checkpoints_.TakePendingRecord().has_value());
  EXPECT_EQ(checkpoints_.written(), 0u);
  // Checkpoint 0 is nothing the servers keep.
  EXPECT_THAT(CompleteRound(t0_).keep, IsEmpty());
}

TEST_F(CheckpointCoordinatorTest, RestoreFromTakesTheSavedIds) {
  MasterSnapshot snapshot;
  snapshot.master.set_last_checkpoint_id(7);  // 7 was started, never completed
  snapshot.checkpoints[0] = Record(0);
  snapshot.checkpoints[4] = Record(4, /*records_trained=*/40);
  snapshot.checkpoints[6] = Record(6, /*records_trained=*/60);
  checkpoints_.RestoreFrom(snapshot);
  ASSERT_TRUE(checkpoints_.last().has_value());
  EXPECT_EQ(checkpoints_.last()->id(), 6u);
  EXPECT_EQ(checkpoints_.last_id(), 7u);
  EXPECT_EQ(checkpoints_.written(), 2u);
  ASSERT_NE(checkpoints_.Result(4), nullptr);
  EXPECT_EQ((*checkpoints_.Result(4))["records_trained"], 40);
  EXPECT_EQ(checkpoints_.Result(0), nullptr);
  EXPECT_EQ(checkpoints_.LastResult()["checkpoint"], 6);

  // Ids are never reused; the servers keep the saved ones.
  EXPECT_EQ(checkpoints_.Request(), 8u);
  ASSERT_EQ(checkpoints_.MaybeStart(t0_, true), 8u);
  std::optional<CheckpointCoordinator::Write> write = checkpoints_.Next(t0_, {}, false, false);
  ASSERT_TRUE(write.has_value());
  EXPECT_THAT(write->keep, ElementsAre(4u, 6u));
}

TEST_F(CheckpointCoordinatorTest, RestoreFromOnlyCheckpointZero) {
  MasterSnapshot snapshot;
  snapshot.checkpoints[0] = Record(0);
  checkpoints_.RestoreFrom(snapshot);
  ASSERT_TRUE(checkpoints_.last().has_value());
  EXPECT_EQ(checkpoints_.last()->id(), 0u);
  EXPECT_EQ(checkpoints_.written(), 0u);
  EXPECT_EQ(checkpoints_.Request(), 1u);
}

}  // namespace
}  // namespace eps
