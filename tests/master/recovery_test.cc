// Tests master/recovery.h: what a recovery waits for (slots, fences), which
// slots it restores (rollback or continue), and how it judges the
// servers' RESTORE replies. The membership is a real Membership driven
// with scripted time.

#include "master/recovery.h"

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/membership.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "tests/master/unit_testing.h"
#include "tests/testing/recording_events.h"

namespace eps {

// Verdicts and steps by name in failure messages.
static void PrintTo(Recovery::Verdict verdict, std::ostream* os) {
  *os << (verdict == Recovery::Verdict::kDone    ? "kDone"
          : verdict == Recovery::Verdict::kRetry ? "kRetry"
                                                 : "kFail");
}
static void PrintTo(Recovery::Step::Kind kind, std::ostream* os) {
  *os << (kind == Recovery::Step::Kind::kWait      ? "kWait"
          : kind == Recovery::Step::Kind::kRestore ? "kRestore"
                                                   : "kFail");
}

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Duration kLogEvery = absl::Seconds(10);
const absl::Duration kTimeout = absl::Seconds(600);

// Checkpoint `id` with a part for each of `slots`.
proto::CheckpointRecord Checkpoint(uint64_t id, const std::vector<uint32_t>& slots) {
  proto::CheckpointRecord checkpoint;
  checkpoint.set_id(id);
  for (uint32_t slot : slots) *checkpoint.add_servers() = Part(slot, id);
  return checkpoint;
}

// The slot and endpoint of every target, as "slot@endpoint path".
std::vector<std::string> Targets(const Recovery::Step& step) {
  std::vector<std::string> targets;
  for (const Recovery::RestoreTarget& target : step.targets) {
    targets.push_back(std::to_string(target.slot) + "@" + target.endpoint + " " + target.path);
  }
  return targets;
}

class RecoveryTest : public ::testing::Test {
 protected:
  RecoveryTest() {
    // Two servers at ports 5000 and 5001, placed at t0.
    for (int slot = 0; slot < 2; ++slot) {
      const proto::RegisterServerRequest request = ServerRequest(5000 + slot, 100 + slot);
      StatusOr<Membership::Claim> claim = members_.ClaimSlot(request);
      EXPECT_TRUE(claim.ok() && claim->slot == static_cast<uint32_t>(slot));
      members_.AdmitServer(slot, request, t0_);
    }
    EXPECT_TRUE(members_.MaybePlace(8));
  }

  // Slot 1 misses its lease (slot 0 heartbeats); returns when.
  absl::Time LoseSlotOne() {
    bool first_contact = false;
    EXPECT_TRUE(members_
                    .ServerHeartbeat(0, "", proto::ServerStats(), t0_ + absl::Milliseconds(900),
                                     &first_contact)
                    .ok());
    const absl::Time lost = t0_ + absl::Milliseconds(kLeaseMs + 1);
    EXPECT_EQ(members_.ExpireLeases(lost).servers, std::vector<uint32_t>{1});
    return lost;
  }

  // A new process takes slot 1 at port 6001.
  void RefillSlotOne(absl::Time now) {
    const proto::RegisterServerRequest request = ServerRequest(6001, 201, /*stored=*/1);
    StatusOr<Membership::Claim> claim = members_.ClaimSlot(request);
    ASSERT_TRUE(claim.ok()) << claim.status();
    ASSERT_EQ(claim->slot, 1u);
    ASSERT_TRUE(members_.AdmitServer(1, request, now));
  }

  // Some worker fenced by the recovery: its fence must reach every server.
  void FenceAWorker(absl::Time now) {
    proto::RegisterWorkerRequest worker;
    worker.set_hostname("worker-host");
    members_.AdmitWorker(worker, now);
    members_.FenceAllAlive(now, "ps[1] lost");
  }

  // Slot 1 lost, a recovery started at once, the slot refilled a second
  // later and the fences acknowledged: ready to restore. Returns when slot 1
  // was lost.
  absl::Time ReadyToRestore(bool rollback) {
    const absl::Time lost = LoseSlotOne();
    recovery_.Start("ps[1] lost", rollback, 1, lost);
    RefillSlotOne(lost + absl::Seconds(1));
    AcknowledgeFences();
    return lost;
  }

  // Every server acknowledges the fence list, if there is one to send.
  void AcknowledgeFences() {
    if (std::optional<Membership::FenceRound> round = members_.PendingFences(); round) {
      members_.FencesAcknowledged(*round);
    }
    ASSERT_FALSE(members_.fencing());
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  const JobConfig job_ = TwoServerJob();
  RecordingEvents events_;
  Membership members_{job_, &events_};
  Recovery recovery_;
};

TEST_F(RecoveryTest, StartsOnceAndCollectsTheLostSlots) {
  EXPECT_FALSE(recovery_.active());
  EXPECT_EQ(recovery_.why(), "");
  EXPECT_TRUE(recovery_.Start("ps[1] lost", /*rollback=*/false, 1, t0_));
  EXPECT_TRUE(recovery_.active());
  EXPECT_FALSE(recovery_.rollback());
  EXPECT_FALSE(recovery_.Start("ps[0] lost", /*rollback=*/true, 0, t0_ + absl::Seconds(1)));
  EXPECT_EQ(recovery_.why(), "ps[1] lost") << "the first cause stands";
  EXPECT_FALSE(recovery_.rollback());
  EXPECT_EQ(recovery_.started(), t0_);
  EXPECT_EQ(recovery_.count(), 1u);
  proto::MasterRecord record;
  recovery_.SaveTo(&record);
  EXPECT_TRUE(record.recovering());

  recovery_.Done({{"checkpoint", 3}});
  EXPECT_FALSE(recovery_.active());
  EXPECT_EQ(recovery_.last()["checkpoint"], 3);
  recovery_.SaveTo(&record);
  EXPECT_FALSE(record.recovering());
  recovery_.StartRollback("resuming", t0_ + absl::Seconds(5));
  EXPECT_TRUE(recovery_.rollback());
  EXPECT_EQ(recovery_.count(), 2u);
}

TEST_F(RecoveryTest, NextWaitsForMissingSlotsAndSaysSoEveryInterval) {
  const absl::Time lost = LoseSlotOne();
  recovery_.Start("ps[1] stopped heartbeating", /*rollback=*/true, 1, lost);
  const proto::CheckpointRecord checkpoint = Checkpoint(3, {0, 1});

  Recovery::Step step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost);
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kWait);
  EXPECT_FALSE(step.waiting_line.has_value()) << "no line before an interval passed";
  step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(9));
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kWait);
  EXPECT_FALSE(step.waiting_line.has_value());
  step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(10));
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kWait);
  ASSERT_TRUE(step.waiting_line.has_value());
  EXPECT_THAT(*step.waiting_line, HasSubstr("ps[1] stopped heartbeating 10s ago"));
  EXPECT_THAT(*step.waiting_line, HasSubstr("waiting for ps[1]"));
  EXPECT_TRUE(step.targets.empty());
  step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(15));
  EXPECT_FALSE(step.waiting_line.has_value()) << "one line per interval";
  step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(20));
  EXPECT_TRUE(step.waiting_line.has_value());
}

TEST_F(RecoveryTest, NextFailsAtTheTimeoutNamingTheMissingSlot) {
  const absl::Time lost = LoseSlotOne();
  recovery_.Start("ps[1] stopped heartbeating", /*rollback=*/true, 1, lost);
  const proto::CheckpointRecord checkpoint = Checkpoint(3, {0, 1});
  const absl::Duration timeout = absl::Seconds(30);
  EXPECT_EQ(recovery_.Next(members_, checkpoint, kLogEvery, timeout, lost + timeout).kind,
            Recovery::Step::Kind::kWait);
  const Recovery::Step step = recovery_.Next(members_, checkpoint, kLogEvery, timeout,
                                             lost + timeout + absl::Milliseconds(1));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kFail);
  EXPECT_EQ(step.error,
            "ps[1] did not come back within master.recovery_timeout_s (30s) of ps[1] stopped "
            "heartbeating: restart each on its --data-dir (or start an eps-server on a fresh "
            "--data-dir in its place), then run eps-master --resume");
}

TEST_F(RecoveryTest, NextWaitsForPendingFences) {
  const absl::Time lost = LoseSlotOne();
  FenceAWorker(lost);
  recovery_.Start("ps[1] lost", /*rollback=*/true, 1, lost);
  RefillSlotOne(lost + absl::Seconds(1));
  const proto::CheckpointRecord checkpoint = Checkpoint(3, {0, 1});

  Recovery::Step step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(10));
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kWait);
  ASSERT_TRUE(step.waiting_line.has_value());
  EXPECT_THAT(*step.waiting_line, HasSubstr("fencing the workers at every server"));
  EXPECT_THAT(*step.waiting_line, Not(HasSubstr("waiting for ps[")));

  ASSERT_TRUE(members_.PendingFences().has_value());
  AcknowledgeFences();
  step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(11));
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kRestore);
}

TEST_F(RecoveryTest, RollbackRestoresEverySlot) {
  const absl::Time lost = ReadyToRestore(/*rollback=*/true);
  Recovery::Step step =
      recovery_.Next(members_, Checkpoint(3, {0, 1}), kLogEvery, kTimeout, lost + absl::Seconds(2));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kRestore);
  EXPECT_THAT(Targets(step), ::testing::ElementsAre("0@tcp://127.0.0.1:5000 /ckpt/ps-0/3",
                                                    "1@tcp://127.0.0.1:6001 /ckpt/ps-1/3"));
}

TEST_F(RecoveryTest, ContinueRestoresOnlyTheLostSlots) {
  const absl::Time lost = ReadyToRestore(/*rollback=*/false);
  const proto::CheckpointRecord checkpoint = Checkpoint(3, {0, 1});
  Recovery::Step step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(2));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kRestore);
  EXPECT_THAT(Targets(step), ::testing::ElementsAre("1@tcp://127.0.0.1:6001 /ckpt/ps-1/3"));

  // A replacement took slot 0 meanwhile: it restores too.
  recovery_.AddLost(0);
  step = recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(3));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kRestore);
  EXPECT_EQ(step.targets.size(), 2u);
}

// In `continue` mode a slot lost while the other lost ones restore (its
// server restarted: AddLost) is not among the step's targets; the
// recovery is not done until it restored too.
// FAILS at the time of writing: Restored judges only the step's targets
// (see the report).
TEST_F(RecoveryTest, ContinueIsNotDoneWhileASlotLostMeanwhileHasNotRestored) {
  const absl::Time lost = ReadyToRestore(/*rollback=*/false);
  const Recovery::Step step =
      recovery_.Next(members_, Checkpoint(3, {0, 1}), kLogEvery, kTimeout, lost + absl::Seconds(2));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kRestore);
  ASSERT_EQ(step.targets.size(), 1u);

  // ps[0] restarts on its data dir while ps[1] restores.
  const proto::RegisterServerRequest request = ServerRequest(6000, 200, /*stored=*/0);
  StatusOr<Membership::Claim> claim = members_.ClaimSlot(request);
  ASSERT_TRUE(claim.ok() && claim->restarted);
  recovery_.Start("ps[0] restarted", /*rollback=*/false, 0, lost + absl::Seconds(3));
  members_.AdmitServer(0, request, lost + absl::Seconds(3));
  recovery_.AddLost(0);

  std::string error;
  EXPECT_NE(recovery_.Restored(members_, step, 3, {StatusOr<uint64_t>(100)}, &error),
            Recovery::Verdict::kDone);
}

TEST_F(RecoveryTest, CheckpointZeroEmptiesTheServers) {
  const absl::Time lost = ReadyToRestore(/*rollback=*/true);
  Recovery::Step step =
      recovery_.Next(members_, Checkpoint(0, {}), kLogEvery, kTimeout, lost + absl::Seconds(2));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kRestore);
  EXPECT_THAT(Targets(step), ::testing::ElementsAre("0@tcp://127.0.0.1:5000 ",
                                                    "1@tcp://127.0.0.1:6001 "));
}

TEST_F(RecoveryTest, FailsForASlotTheCheckpointHasNoPartOf) {
  const absl::Time lost = ReadyToRestore(/*rollback=*/true);
  Recovery::Step step =
      recovery_.Next(members_, Checkpoint(3, {0}), kLogEvery, kTimeout, lost + absl::Seconds(2));
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kFail);
  EXPECT_EQ(step.error, "checkpoint 3 has no part of ps[1]");
}

TEST_F(RecoveryTest, FailsForACheckpointHoldingPartitionsInThePartOfASlotThatLeft) {
  // ps[2] joins, is given nothing, and leaves the job.
  const proto::RegisterServerRequest request = ServerRequest(6002, 202, std::nullopt);
  StatusOr<Membership::Claim> claim = members_.ClaimSlot(request);
  ASSERT_TRUE(claim.ok() && claim->joined) << claim.status();
  members_.AdmitServer(claim->slot, request, t0_);
  members_.RetireServer(claim->slot, absl::Now());
  const absl::Time lost = ReadyToRestore(/*rollback=*/true);
  // An older checkpoint, from when ps[2] held partition 0.
  proto::CheckpointRecord checkpoint = Checkpoint(3, {0, 1, 2});
  for (uint32_t owner : {2, 0, 1}) {
    checkpoint.mutable_master()->mutable_cluster_map()->add_partition_owner(owner);
  }
  Recovery::Step step =
      recovery_.Next(members_, checkpoint, kLogEvery, kTimeout, lost + absl::Seconds(2));
  EXPECT_EQ(step.kind, Recovery::Step::Kind::kFail);
  EXPECT_EQ(step.error,
            "checkpoint 3 holds partition 0 in the part of ps[2], which has left the job");
}

class RestoredTest : public RecoveryTest {
 protected:
  // A rollback to checkpoint 3 ready to restore both slots.
  void SetUp() override {
    lost_ = ReadyToRestore(/*rollback=*/true);
    step_ = recovery_.Next(members_, Checkpoint(3, {0, 1}), kLogEvery, kTimeout, lost_ + absl::Seconds(2));
    ASSERT_EQ(step_.kind, Recovery::Step::Kind::kRestore);
    ASSERT_EQ(step_.targets.size(), 2u);
  }

  Recovery::Verdict Judge(const Status& slot_one, std::string* error) {
    return recovery_.Restored(members_, step_, 3, {StatusOr<uint64_t>(100), slot_one.ok()
                                                       ? StatusOr<uint64_t>(200)
                                                       : StatusOr<uint64_t>(slot_one)},
                              error);
  }

  absl::Time lost_;
  Recovery::Step step_;
};

TEST_F(RestoredTest, DoneWhenEveryTargetRestored) {
  std::string error;
  EXPECT_EQ(Judge(absl::OkStatus(), &error), Recovery::Verdict::kDone);
  EXPECT_EQ(error, "");
  EXPECT_TRUE(recovery_.active()) << "the caller applies the rollback, then Done";
}

TEST_F(RestoredTest, RetriesAServerNotReady) {
  std::string error;
  EXPECT_EQ(Judge(ErrorWithReason(absl::StatusCode::kUnavailable, "still opening its store",
                                  proto::NOT_READY),
                  &error),
            Recovery::Verdict::kRetry);
  EXPECT_EQ(error, "");
}

TEST_F(RestoredTest, RetriesALostReply) {
  std::string error;
  EXPECT_EQ(Judge(absl::DeadlineExceededError("no reply within 30s"), &error),
            Recovery::Verdict::kRetry);
}

TEST_F(RestoredTest, RetriesAServerReplacedMeanwhile) {
  // Slot 1's process is replaced (again) while the restore was under way:
  // whatever it answered no longer matters.
  const proto::RegisterServerRequest request = ServerRequest(7001, 301, /*stored=*/1);
  ASSERT_TRUE(members_.ClaimSlot(request).ok());
  members_.AdmitServer(1, request, lost_ + absl::Seconds(3));
  std::string error;
  EXPECT_EQ(Judge(absl::InternalError("stopped"), &error), Recovery::Verdict::kRetry);
}

// The RESTORE replies arrive without the master's lock: a target may have
// answered and then been replaced before they are judged. Its new process
// restored nothing, so the recovery must go on.
// FAILS at the time of writing: Restored looks for a replaced target only
// among the replies that failed (see the report).
TEST_F(RestoredTest, RetriesATargetReplacedAfterItAnswered) {
  const proto::RegisterServerRequest request = ServerRequest(7001, 301, /*stored=*/1);
  ASSERT_TRUE(members_.ClaimSlot(request).ok());
  members_.AdmitServer(1, request, lost_ + absl::Seconds(3));
  std::string error;
  EXPECT_EQ(Judge(absl::OkStatus(), &error), Recovery::Verdict::kRetry);
}

TEST_F(RestoredTest, FailsOtherwiseNamingThePath) {
  std::string error;
  EXPECT_EQ(Judge(absl::NotFoundError("no such directory"), &error), Recovery::Verdict::kFail);
  EXPECT_THAT(error, HasSubstr("cannot restore ps[1] to checkpoint 3: no such directory"));
  EXPECT_THAT(error, HasSubstr("its part is at /ckpt/ps-1/3"));
  EXPECT_THAT(error, HasSubstr("checkpoint.dir"));
}

TEST_F(RecoveryTest, FailureRestoringCheckpointZeroNamesNoPath) {
  const absl::Time lost = ReadyToRestore(/*rollback=*/true);
  Recovery::Step step =
      recovery_.Next(members_, Checkpoint(0, {}), kLogEvery, kTimeout, lost + absl::Seconds(2));
  ASSERT_EQ(step.kind, Recovery::Step::Kind::kRestore);
  std::string error;
  EXPECT_EQ(recovery_.Restored(members_, step, 0,
                               {StatusOr<uint64_t>(absl::InternalError("disk full")),
                                StatusOr<uint64_t>(0)},
                               &error),
            Recovery::Verdict::kFail);
  EXPECT_EQ(error, "cannot restore ps[0] to checkpoint 0: disk full");
}

}  // namespace
}  // namespace eps
