// Tests master/wait_bounds.h with scripted time: each bounded wait starts
// when the job begins to wait, ends when it stops waiting, and reaches its
// verdict only past its bound; a recovery's hold does not count against a
// holder's progress.

#include "master/wait_bounds.h"

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

const absl::Time t0 = absl::FromUnixSeconds(1000);
absl::Time At(double seconds) { return t0 + absl::Seconds(seconds); }

class WaitBoundsTest : public ::testing::Test {
 protected:
  WaitBoundsTest() {
    job_.ps.num_servers = 2;
    job_.master.recovery_timeout_s = 10;
    job_.master.progress_timeout_s = 5;
    job_.master.worker_wait_s = 20;
    job_.checkpoint.max_failures = 3;
  }
  // A job training with both servers and one worker.
  static WaitBounds::Facts Training() {
    WaitBounds::Facts facts;
    facts.training = true;
    facts.servers_registered = facts.servers_alive = 2;
    facts.workers_alive = 1;
    return facts;
  }
  // Before training, with `registered` servers of 2, all alive.
  static WaitBounds::Facts Scanning(size_t registered) {
    WaitBounds::Facts facts;
    facts.scanning = true;
    facts.servers_registered = facts.servers_alive = registered;
    return facts;
  }

  JobConfig job_;
  WaitBounds bounds_{job_};
};

TEST_F(WaitBoundsTest, MissingServersFailTheJobOnlyPastTheRecoveryTimeout) {
  WaitBounds::Facts scanning = Scanning(1);
  EXPECT_TRUE(bounds_.Check(scanning, At(0)).fail.empty());
  EXPECT_THAT(*bounds_.ServersWait(1, At(4)), HasSubstr("parameter servers to register: 1 of 2"));
  EXPECT_TRUE(bounds_.Check(scanning, At(10)).fail.empty()) << "at the bound, not past it";
  const WaitBounds::Verdict verdict = bounds_.Check(scanning, At(10.5));
  EXPECT_THAT(verdict.fail, HasSubstr("only 1 of 2 parameter server(s) registered"));
  EXPECT_THAT(verdict.fail, HasSubstr("master.recovery_timeout_s (10 s)"));
  EXPECT_TRUE(verdict.stop.empty());
}

TEST_F(WaitBoundsTest, AServerThatRegistersEndsTheWaitAndANewOneStartsAfresh) {
  WaitBounds::Facts scanning = Scanning(1);
  bounds_.Check(scanning, At(0));
  scanning.servers_registered = scanning.servers_alive = 2;
  bounds_.Check(scanning, At(9));
  EXPECT_FALSE(bounds_.ServersWait(2, At(9)).has_value());
  // One dies before training: the wait starts again from now.
  scanning.servers_alive = 1;
  scanning.all_servers_alive = false;
  bounds_.Check(scanning, At(12));
  EXPECT_TRUE(bounds_.Check(scanning, At(21)).fail.empty());
  EXPECT_FALSE(bounds_.Check(scanning, At(22.5)).fail.empty());
}

TEST_F(WaitBoundsTest, ARecoveryBoundsItselfNotTheServersWait) {
  WaitBounds::Facts scanning = Scanning(1);
  scanning.recovering = true;
  bounds_.Check(scanning, At(0));
  EXPECT_TRUE(bounds_.Check(scanning, At(100)).fail.empty());
  EXPECT_FALSE(bounds_.ServersWait(1, At(100)).has_value());
}

TEST_F(WaitBoundsTest, AHolderWithoutProgressIsFencedPastTheProgressTimeout) {
  WaitBounds::Facts facts = Training();
  facts.holders = {{3, At(0)}, {4, At(4)}};
  EXPECT_TRUE(bounds_.Check(facts, At(5)).fence.empty()) << "at the bound, not past it";
  const WaitBounds::Verdict verdict = bounds_.Check(facts, At(6));
  ASSERT_EQ(verdict.fence.size(), 1u);
  EXPECT_EQ(verdict.fence[0].first, 3u);
  EXPECT_THAT(verdict.fence[0].second, HasSubstr("made no progress for 6s"));
  EXPECT_THAT(verdict.fence[0].second, HasSubstr("master.progress_timeout_s = 5 s"));
}

TEST_F(WaitBoundsTest, TimeARecoveryHeldEveryWorkerDoesNotCount) {
  WaitBounds::Facts facts = Training();
  facts.holders = {{3, At(0)}};
  facts.recovering = true;
  bounds_.Check(facts, At(4));  // the recovery holds every worker until now
  facts.recovering = false;
  EXPECT_TRUE(bounds_.Check(facts, At(8)).fence.empty());
  EXPECT_EQ(bounds_.Check(facts, At(9.5)).fence.size(), 1u);
}

TEST_F(WaitBoundsTest, TheLastWorkerFencedStartsTheWorkersWaitAtOnce) {
  WaitBounds::Facts facts = Training();
  facts.holders = {{3, At(0)}};
  ASSERT_EQ(bounds_.Check(facts, At(6)).fence.size(), 1u);
  ASSERT_TRUE(bounds_.WorkersWait(At(6)).has_value()) << "its only worker is fenced";
  facts.holders.clear();
  facts.workers_alive = 0;
  EXPECT_TRUE(bounds_.Check(facts, At(26)).stop.empty());
  EXPECT_FALSE(bounds_.Check(facts, At(27)).stop.empty()) << "20 s from the fence";
}

TEST_F(WaitBoundsTest, NoWorkerForTheWorkerWaitStopsTheJobResumably) {
  WaitBounds::Facts facts = Training();
  facts.workers_alive = 0;
  bounds_.Check(facts, At(0));
  EXPECT_THAT(*bounds_.WorkersWait(At(3)), HasSubstr("workers: none alive for 3s"));
  EXPECT_TRUE(bounds_.Check(facts, At(20)).stop.empty());
  const WaitBounds::Verdict verdict = bounds_.Check(facts, At(21));
  EXPECT_THAT(verdict.stop, HasSubstr("no worker was alive for 21s"));
  EXPECT_THAT(verdict.stop, HasSubstr("eps-master --resume"));
  EXPECT_TRUE(verdict.fail.empty());
}

TEST_F(WaitBoundsTest, NoWorkersIsNoWaitDuringARecoveryAnExportAnAutoscalerOrWithTheBoundOff) {
  WaitBounds::Facts facts = Training();
  facts.workers_alive = 0;
  for (int excuse = 0; excuse < 4; ++excuse) {
    WaitBounds::Facts excused = facts;
    JobConfig job = job_;
    if (excuse == 0) excused.recovering = true;
    if (excuse == 1) excused.export_due = true;
    if (excuse == 2) job.master.worker_wait_s = 0;
    if (excuse == 3) excused.workers_coming = true;
    WaitBounds bounds(job);
    bounds.Check(excused, At(0));
    EXPECT_TRUE(bounds.Check(excused, At(1000)).stop.empty()) << excuse;
    EXPECT_FALSE(bounds.WorkersWait(At(1000)).has_value()) << excuse;
  }
  // Nor before training: the servers' wait covers that.
  WaitBounds::Facts scanning = Scanning(2);
  bounds_.Check(scanning, At(0));
  EXPECT_TRUE(bounds_.Check(scanning, At(1000)).stop.empty());
}

TEST_F(WaitBoundsTest, CheckpointsThatKeepFailingStopTheJobNamingTheLastFailure) {
  WaitBounds::Facts facts = Training();
  facts.checkpoint_failures = 2;
  facts.last_checkpoint_failure = "ps[1]: disk full";
  EXPECT_TRUE(bounds_.Check(facts, At(0)).stop.empty());
  facts.checkpoint_failures = 3;
  const WaitBounds::Verdict verdict = bounds_.Check(facts, At(1));
  EXPECT_THAT(verdict.stop, HasSubstr("the last 3 checkpoints failed"));
  EXPECT_THAT(verdict.stop, HasSubstr("ps[1]: disk full"));
  job_.checkpoint.max_failures = 0;  // off
  EXPECT_TRUE(bounds_.Check(facts, At(2)).stop.empty());
}

}  // namespace
}  // namespace eps
