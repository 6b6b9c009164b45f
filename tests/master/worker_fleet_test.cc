// WorkerFleet with scripted time: growing, shrinking the workers that lose
// least, replacing the dead and the stuck, the crash-loop back-off and the
// restart limit, and the bounds on starting and stopping.

#include "master/autoscale/worker_fleet.h"

#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/recording_events.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using Seen = WorkerFleet::Seen;

JobConfig Job() {
  JobConfig job;
  job.autoscale.source = "command";
  job.autoscale.command = "true";
  job.autoscale.max_restarts = 3;
  job.autoscale.restart_backoff_s = 5;
  job.master.lease_ms = 2000;
  return job;
}

class WorkerFleetTest : public ::testing::Test {
 protected:
  // Carries out `plan`'s launches: each gets the next launch id.
  std::vector<uint64_t> Launch(const WorkerFleet::Plan& plan) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < plan.launches; ++i) {
      const uint64_t id = fleet_.NewLaunchId();
      fleet_.Launched(id, absl::StrCat("pid-", id), now_);
      ids.push_back(id);
    }
    return ids;
  }
  // Registered, alive, holding a shard or not, last progress at `last`.
  static Seen Alive(bool holds_shard, absl::Time last) {
    Seen seen;
    seen.alive = true;
    seen.holds_shard = holds_shard;
    seen.last_progress = last;
    return seen;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  RecordingEvents events_;
  WorkerFleet fleet_{Job(), &events_};
};

TEST_F(WorkerFleetTest, LaunchesUpToTheTargetAndCountsStartingOnes) {
  WorkerFleet::Plan plan = fleet_.Next(3, {}, now_);
  EXPECT_EQ(plan.launches, 3);
  const std::vector<uint64_t> ids = Launch(plan);
  EXPECT_THAT(ids, ElementsAre(1, 2, 3));
  EXPECT_EQ(fleet_.starting(), 3);
  EXPECT_EQ(fleet_.live(), 3);
  EXPECT_TRUE(fleet_.Next(3, {}, now_).empty());
  now_ += absl::Seconds(5);
  EXPECT_TRUE(fleet_.Next(3, {{1, Alive(true, now_)}, {2, Alive(false, now_)}}, now_).empty());
  EXPECT_EQ(fleet_.starting(), 1);
  EXPECT_EQ(fleet_.handle(2), "pid-2");
  EXPECT_EQ(events_.Count("worker_launched"), 3u);
}

TEST_F(WorkerFleetTest, ShrinkingStopsTheWorkersThatLoseTheLeast) {
  Launch(fleet_.Next(5, {}, now_));
  now_ += absl::Seconds(30);
  // 1 and 2 hold shards (2 committed last), 3 holds none, 4 and 5 have not
  // registered yet (5 launched last).
  const std::map<uint64_t, Seen> seen = {{1, Alive(true, now_ - absl::Seconds(9))},
                                         {2, Alive(true, now_ - absl::Seconds(1))},
                                         {3, Alive(false, now_ - absl::Seconds(20))}};
  WorkerFleet::Plan plan = fleet_.Next(5, seen, now_);
  ASSERT_TRUE(plan.empty());
  plan = fleet_.Next(1, seen, now_);
  EXPECT_EQ(plan.launches, 0);
  EXPECT_THAT(plan.stop, ElementsAre(5, 4, 3, 2));
  EXPECT_EQ(fleet_.live(), 1);
  // Stopped ones leave as asked: nothing to replace.
  for (uint64_t id : {2, 3, 4, 5}) fleet_.Exited(id, 0, now_);
  EXPECT_EQ(events_.Count("worker_stopped"), 4u);
  EXPECT_TRUE(fleet_.Next(1, {{1, Alive(true, now_)}}, now_).empty());
  EXPECT_EQ(fleet_.restarts(), 0);
}

TEST_F(WorkerFleetTest, ADeadWorkerIsReplacedAndCounted) {
  Launch(fleet_.Next(2, {}, now_));
  now_ += absl::Minutes(5);
  fleet_.Next(2, {{1, Alive(true, now_)}, {2, Alive(true, now_)}}, now_);
  fleet_.Exited(2, 137, now_);  // killed by the engine, after 5 minutes
  EXPECT_EQ(events_.Count("worker_exited"), 1u);
  WorkerFleet::Plan plan = fleet_.Next(2, {{1, Alive(true, now_)}}, now_);
  EXPECT_EQ(plan.launches, 1);  // at once: not an early death
  EXPECT_EQ(fleet_.restarts(), 1);
  EXPECT_EQ(events_.Named("worker_replaced").at(0)["restarts"], 1);
}

TEST_F(WorkerFleetTest, EarlyDeathsBackOffDoublingAndTheLimitStopsReplacing) {
  std::vector<uint64_t> ids = Launch(fleet_.Next(1, {}, now_));
  std::vector<absl::Duration> waits;
  for (int death = 0; death < 4; ++death) {
    ASSERT_EQ(ids.size(), 1u) << "death " << death;
    now_ += absl::Seconds(2);
    fleet_.Exited(ids[0], 1, now_);  // a crash at startup
    const absl::Time died = now_;
    WorkerFleet::Plan plan;
    while ((plan = fleet_.Next(1, {}, now_)).launches == 0 && now_ - died < absl::Minutes(10)) {
      now_ += absl::Milliseconds(500);
    }
    if (plan.launches == 0) break;
    waits.push_back(now_ - died);
    ids = Launch(plan);
  }
  EXPECT_THAT(waits, ElementsAre(absl::Seconds(5), absl::Seconds(10), absl::Seconds(20)));
  // Three replacements made (the limit): no more, said once.
  EXPECT_EQ(fleet_.restarts(), 3);
  EXPECT_EQ(events_.Count("restart_limit_reached"), 1u);
  EXPECT_EQ(fleet_.ToJson(now_)["restarts_left"], 0);
}

TEST_F(WorkerFleetTest, AStalledWorkerIsKilledAndReplaced) {
  Launch(fleet_.Next(1, {}, now_));
  now_ += absl::Minutes(10);
  fleet_.Next(1, {{1, Alive(true, now_)}}, now_);
  Seen stalled;
  stalled.stalled = true;
  stalled.gone_since = now_;
  WorkerFleet::Plan plan = fleet_.Next(1, {{1, stalled}}, now_);
  EXPECT_THAT(plan.kill, ElementsAre(1));
  EXPECT_EQ(plan.launches, 1);  // the replacement, at once
  EXPECT_EQ(events_.Count("worker_stuck"), 1u);
  EXPECT_EQ(fleet_.restarts(), 1);
  Launch(plan);
  fleet_.Exited(1, 137, now_);  // the kill landed: nothing more owed
  EXPECT_TRUE(fleet_.Next(1, {}, now_).empty());
  EXPECT_EQ(fleet_.restarts(), 1);
}

TEST_F(WorkerFleetTest, AFrozenWorkerIsKilledAfterALeaseWithoutANewRegistration) {
  Launch(fleet_.Next(1, {}, now_));
  now_ += absl::Minutes(10);
  fleet_.Next(1, {{1, Alive(false, now_)}}, now_);
  Seen dead;
  dead.gone_since = now_;
  EXPECT_TRUE(fleet_.Next(1, {{1, dead}}, now_ + absl::Seconds(2)).empty());  // one lease
  WorkerFleet::Plan plan = fleet_.Next(1, {{1, dead}}, now_ + absl::Seconds(3));
  EXPECT_THAT(plan.kill, ElementsAre(1));
  EXPECT_EQ(plan.launches, 1);
}

TEST_F(WorkerFleetTest, StartingAndStoppingAreBounded) {
  Launch(fleet_.Next(2, {}, now_));
  // Worker 1 registers; worker 2 never does.
  now_ += absl::Seconds(10);
  fleet_.Next(2, {{1, Alive(false, now_)}}, now_);
  now_ += absl::Minutes(3);  // past the start timeout (2 minutes)
  WorkerFleet::Plan plan = fleet_.Next(2, {{1, Alive(false, now_)}}, now_);
  EXPECT_THAT(plan.kill, ElementsAre(2));
  EXPECT_EQ(plan.launches, 0);  // a failed start backs off
  // Worker 1 is asked to stop and ignores it: killed after the grace.
  plan = fleet_.Next(0, {{1, Alive(false, now_)}}, now_);
  EXPECT_THAT(plan.stop, ElementsAre(1));
  // The grace: a lease and the worker's RPC budget (2 + 3 x 10 s).
  EXPECT_TRUE(fleet_.Next(0, {{1, Alive(false, now_)}}, now_ + absl::Seconds(31)).empty());
  plan = fleet_.Next(0, {{1, Alive(false, now_)}}, now_ + absl::Seconds(33));
  EXPECT_THAT(plan.kill, UnorderedElementsAre(1));
  // Killed ones whose end is never seen are forgotten after another grace
  // (worker 2 was killed 33 s ago).
  EXPECT_THAT(fleet_.launched(), ElementsAre(1));
  fleet_.Next(0, {}, now_ + absl::Seconds(64));
  EXPECT_THAT(fleet_.launched(), ElementsAre(1));
  fleet_.Next(0, {}, now_ + absl::Seconds(70));
  EXPECT_TRUE(fleet_.launched().empty());
}

}  // namespace
}  // namespace eps
