// Tests master/job_control.h: every wait on something outside the master
// ends within its bound (docs/design.md 2.14), and a server that cannot
// write stops the job instead of finishing it.
// Scripted time; the fixture is in tests/master/job_control_fixture.h.

#include <cmath>
#include <limits>

#include "core/metrics.h"
#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

// --- Who may join ------------------------------------------------------------------

TEST_F(JobControlLivenessTest, RefusesMembersWhoseJobOptionsDiffer) {
  control_->StartNew("job-1");
  JobConfig other = job_;
  other.optimizer.learning_rate = 0.5;
  other.model.embedding_dim = 8;
  proto::RegisterServerRequest server = ServerRequest(5000, 100);
  AddSharedOptions(other.SharedOptions(), server.mutable_job_options());
  proto::RegisterServerReply server_reply;
  const Status refused = control_->RegisterServer(server, t0_, &server_reply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("the job options of this server differ"));
  EXPECT_THAT(refused.message(), HasSubstr("model.embedding_dim = 8 (the master has 16)"));
  EXPECT_THAT(refused.message(), HasSubstr("optimizer.learning_rate = 0.5 (the master has 0.05)"));
  EXPECT_TRUE(control_->membership().servers().empty()) << "a refused server takes no slot";

  // A server's own settings may differ.
  JobConfig own = job_;
  own.ps.threads = 7;
  own.ps.memory_budget_mb = 64;
  proto::RegisterServerRequest fine = ServerRequest(5000, 100);
  AddSharedOptions(own.SharedOptions(), fine.mutable_job_options());
  EXPECT_TRUE(control_->RegisterServer(fine, t0_, &server_reply).ok());

  JobConfig heartbeat = job_;
  heartbeat.master.heartbeat_ms = 5000;
  proto::RegisterWorkerRequest worker = WorkerRequest(300);
  AddSharedOptions(heartbeat.SharedOptions(), worker.mutable_job_options());
  proto::RegisterWorkerReply worker_reply;
  const Status worker_refused = control_->RegisterWorker(worker, t0_, &worker_reply);
  EXPECT_EQ(worker_refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(worker_refused.message(),
              HasSubstr("this worker differ from the master's: master.heartbeat_ms = 5000 (the "
                        "master has 100)"));
  EXPECT_TRUE(control_->membership().workers().empty());
}

// --- Servers to register ------------------------------------------------------------

TEST_F(JobControlLivenessTest, ServersThatNeverRegisterFailTheJobAtTheTimeout) {
  job_.master.recovery_timeout_s = 30;
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  control_->DataScanned(TinyData(), t0_);
  control_->Tick(At(100));
  for (int64_t ms = 1000; ms <= 30'000; ms += 1000) {
    ASSERT_TRUE(ServerBeat(0, At(ms)).ok());
    control_->Tick(At(ms));
  }
  EXPECT_FALSE(control_->over()) << "within the bound";
  EXPECT_THAT(control_->Waits(At(30'000)),
              ElementsAre(HasSubstr("parameter servers to register: 1 of 2 for 29s")));
  ASSERT_TRUE(ServerBeat(0, At(30'200)).ok());
  control_->Tick(At(30'200));
  EXPECT_TRUE(control_->over());
  EXPECT_FALSE(control_->progress().stopped()) << "nothing was trained: nothing to resume";
  EXPECT_THAT(control_->progress().failure(),
              HasSubstr("only 1 of 2 parameter server(s) registered within "
                        "master.recovery_timeout_s (30 s)"));
}

TEST_F(JobControlLivenessTest, ServersRegisteringInTimeStartTheJob) {
  job_.master.recovery_timeout_s = 30;
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  control_->DataScanned(TinyData(), t0_);
  control_->Tick(At(100));
  ASSERT_TRUE(ServerBeat(0, At(29'000)).ok());
  control_->Tick(At(29'000));
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, At(29'500)).ok());
  EXPECT_EQ(control_->progress().phase(), JobPhase::kTraining);
  Beat(At(30'900), {0, 1}, {});
  control_->Tick(At(31'000));
  EXPECT_FALSE(control_->over());
  EXPECT_THAT(control_->Waits(At(31'000)), ElementsAre(HasSubstr("workers: none alive")));
}

// --- A slot to be filled --------------------------------------------------------------

TEST_F(JobControlLivenessTest, RecoveryPastItsTimeoutStopsNamingTheMissingSlot) {
  job_.master.recovery_timeout_s = 20;
  StartTraining();
  // ps[1] falls silent: a recovery starts and waits for the slot.
  Beat(At(900), {0}, {});
  control_->Tick(At(1100));
  ASSERT_TRUE(control_->recovery().active());
  for (int64_t ms = 2000; ms <= 21'000; ms += 1000) {
    ASSERT_TRUE(ServerBeat(0, At(ms)).ok());
    control_->Tick(At(ms));
    EXPECT_FALSE(control_->NextRestore(At(ms)).has_value());
  }
  EXPECT_FALSE(control_->over()) << "20 s after the loss at 1.1 s: not yet";
  EXPECT_THAT(control_->Waits(At(21'000)),
              ElementsAre(HasSubstr("ps[1] to come back (master.recovery_timeout_s = 20 s)")));
  ASSERT_TRUE(ServerBeat(0, At(21'200)).ok());
  EXPECT_FALSE(control_->NextRestore(At(21'200)).has_value());
  ExpectStoppedWith("ps[1] did not come back within master.recovery_timeout_s (20s)");
  EXPECT_THAT(control_->progress().failure(), HasSubstr("then run eps-master --resume"));
}

TEST_F(JobControlLivenessTest, ARestoreThatKeepsFailingEndsAtTheTimeout) {
  job_.master.recovery_timeout_s = 20;
  StartTraining();
  Beat(At(900), {0}, {});
  control_->Tick(At(1100));
  ASSERT_TRUE(RegisterServer(6001, 201, /*stored=*/1, At(1200)).ok());
  const std::optional<Membership::FenceRound> round = control_->PendingFences();
  ASSERT_TRUE(round.has_value());
  control_->FencesAcknowledged(*round, At(1300));
  // Every restore call times out.
  for (int64_t ms = 2000; ms <= 21'000; ms += 1000) {
    Beat(At(ms), {0, 1}, {});
    const std::optional<Recovery::Step> step = control_->NextRestore(At(ms));
    ASSERT_TRUE(step.has_value()) << ms;
    control_->Restored(*step,
                       {absl::DeadlineExceededError("ps[0] did not answer"),
                        absl::DeadlineExceededError("ps[1] did not answer")},
                       At(ms), At(ms));
    ASSERT_TRUE(control_->recovery().active());
  }
  Beat(At(21'200), {0, 1}, {});
  EXPECT_FALSE(control_->NextRestore(At(21'200)).has_value());
  ExpectStoppedWith("the restore of checkpoint 0 did not complete within");
  EXPECT_THAT(control_->progress().failure(), HasSubstr("ps[0]: ps[0] did not answer"));
}

// --- Fences to be acknowledged ---------------------------------------------------------

TEST_F(JobControlLivenessTest, AServerThatDoesNotAcknowledgeFencesIsLost) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  // Worker 0 dies: its fence must reach both servers; ps[1] never answers.
  Beat(At(700), {0, 1}, {1});
  Beat(At(1100), {0, 1}, {1});
  control_->Tick(At(1100));
  ASSERT_EQ(control_->membership().workers().at(0).state, PeerState::kDead);
  const std::vector<ServerAddress> refused = {{1, Endpoint(5001)}};
  for (int64_t ms = 1100; ms <= 2100; ms += 100) {
    Beat(At(ms), {0, 1}, {1});
    const std::optional<Membership::FenceRound> round = control_->PendingFences();
    ASSERT_TRUE(round.has_value());
    control_->FencesRefused(*round, refused, At(ms));
  }
  EXPECT_FALSE(control_->recovery().active()) << "a lease (1 s) of refusals is still patience";
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kDoing) << "not fenced yet";
  control_->FencesRefused(*control_->PendingFences(), refused, At(2200));
  EXPECT_EQ(control_->membership().servers().at(1).state, PeerState::kDead);
  EXPECT_TRUE(control_->recovery().active());
  EXPECT_THAT(control_->recovery().why(), HasSubstr("did not acknowledge the fence list"));
  ASSERT_EQ(events_.Count("server_dead"), 1u);
  EXPECT_THAT(events_.Named("server_dead")[0]["reason"].get<std::string>(),
              HasSubstr("did not acknowledge the fence list"));
}

TEST_F(JobControlLivenessTest, AServerThatAcknowledgesAgainIsForgiven) {
  StartTraining();
  Beat(At(1100), {0, 1}, {1});
  control_->Tick(At(1100));
  const std::vector<ServerAddress> refused = {{1, Endpoint(5001)}};
  control_->FencesRefused(*control_->PendingFences(), refused, At(1100));
  control_->FencesRefused(*control_->PendingFences(), {}, At(1900));  // it answered once
  control_->FencesRefused(*control_->PendingFences(), refused, At(2000));
  control_->FencesRefused(*control_->PendingFences(), refused, At(2600));
  EXPECT_FALSE(control_->recovery().active()) << "refusing since 2.0 s only";
}

// --- A shard's holder to make progress --------------------------------------------------

TEST_F(JobControlLivenessTest, AHolderThatMakesNoProgressIsFencedAndItsShardMoves) {
  job_.master.progress_timeout_s = 10;
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 1), At(1000)).ok());
  // Worker 0 heartbeats on, but its trainer commits nothing more.
  for (int64_t ms = 2000; ms <= 11'000; ms += 500) {
    Beat(At(ms), {0, 1}, {0, 1});
    control_->Tick(At(ms));
  }
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kAlive) << "10 s: not yet";
  Beat(At(11'100), {0, 1}, {0, 1});
  control_->Tick(At(11'100));
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kFenced);
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kAlive)
      << "holding nothing is not being stuck";
  ASSERT_EQ(events_.Count("worker_fenced_alive"), 1u);
  EXPECT_THAT(events_.Named("worker_fenced_alive")[0]["reason"].get<std::string>(),
              HasSubstr("made no progress for 10.1s (master.progress_timeout_s = 10 s)"));
  EXPECT_EQ(WorkerBeat(0, At(11'200)).code(), absl::StatusCode::kFailedPrecondition);
  // Its shard moves once the servers refuse it, from its committed offset.
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kDoing);
  control_->FencesAcknowledged(*control_->PendingFences(), At(11'300));
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kTodo);
  const proto::ShardAssignment again = Assigned(1, At(11'300));
  EXPECT_EQ(again.shard_id(), a.shard_id());
  EXPECT_EQ(again.start(), a.start() + kLineBytes);
}

TEST_F(JobControlLivenessTest, TimeHeldByACheckpointDoesNotCountAsNoProgress) {
  job_.master.progress_timeout_s = 10;
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  // A checkpoint round holds the workers from 5 s to 9 s.
  Beat(At(5000), {0, 1}, {0, 1});
  ASSERT_EQ(control_->RequestCheckpoint().value(), 1u);
  for (int64_t ms = 5000; ms <= 9000; ms += 500) {
    Beat(At(ms), {0, 1}, {});
    ASSERT_TRUE(WorkerBeat(0, At(ms), /*paused_for=*/1).ok());
    ASSERT_TRUE(WorkerBeat(1, At(ms), /*paused_for=*/1).ok());
    control_->Tick(At(ms));
  }
  ASSERT_TRUE(control_->checkpoints().round_id().has_value());
  const std::optional<JobControl::CheckpointWrite> write = control_->NextCheckpointWrite(At(9000));
  ASSERT_TRUE(write.has_value());
  StateUpdate update;
  const std::optional<proto::CheckpointRecord> record =
      control_->CheckpointWritten(*write, {Part(0, 1), Part(1, 1)}, At(9000), At(9000), &update);
  ASSERT_TRUE(record.has_value());
  control_->CheckpointRecorded(*record, absl::OkStatus(), At(9000));
  for (int64_t ms = 9500; ms <= 18'500; ms += 500) {
    Beat(At(ms), {0, 1}, {0, 1});
    control_->Tick(At(ms));
  }
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kAlive)
      << "10 s without progress counts from the end of the round (9 s)";
  Beat(At(19'100), {0, 1}, {0, 1});
  control_->Tick(At(19'100));
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kFenced);
  EXPECT_EQ(ShardState(a.shard_id()).holder, 0u);
}

TEST_F(JobControlLivenessTest, AWorkerThatNeverPausesIsFencedByTheCheckpointRound) {
  // A hung trainer (or a key holder) that never pauses for a checkpoint
  // cannot fail the round for everyone: after two leases it is fenced,
  // long before master.progress_timeout_s, and the round goes on.
  job_.master.progress_timeout_s = 600;
  job_.checkpoint.max_failures = 1;
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  ASSERT_TRUE(control_->RequestCheckpoint().ok());
  const int64_t patience_ms = 2 * job_.master.lease_ms;
  int64_t ms = 0;
  while (control_->membership().workers().at(0).state == PeerState::kAlive &&
         ms <= patience_ms + 2000) {
    ms += 500;
    Beat(At(ms), {0, 1}, {0});
    control_->Tick(At(ms));
    const std::optional<uint64_t> round = control_->checkpoints().round_id();
    ASSERT_TRUE(round.has_value()) << "the round never failed";
    ASSERT_TRUE(WorkerBeat(1, At(ms), *round).ok());
    ASSERT_FALSE(control_->NextCheckpointWrite(At(ms)).has_value()) << "worker 0 is not paused";
  }
  // The round started at the first tick (500 ms): fenced at the first tick
  // past its patience.
  EXPECT_EQ(ms, 500 + patience_ms + 500);
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kFenced);
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kAlive);
  EXPECT_EQ(ShardState(a.shard_id()).holder, 0u) << "until the servers refuse it";
  ASSERT_EQ(events_.Count("worker_fenced_alive"), 1u);
  EXPECT_THAT(events_.Named("worker_fenced_alive")[0]["reason"].get<std::string>(),
              HasSubstr("did not pause for checkpoint 1"));
  EXPECT_EQ(control_->checkpoints().failed(), 0u);
  EXPECT_FALSE(control_->over());
}

// --- Workers to train ---------------------------------------------------------------------

TEST_F(JobControlLivenessTest, NoWorkerForTooLongStopsTheJobResumably) {
  job_.master.worker_wait_s = 60;
  StartTraining();
  // Both workers die at once; nobody comes.
  for (int64_t ms = 1000; ms <= 62'000; ms += 1000) {
    Beat(At(ms), {0, 1}, {});
    control_->Tick(At(ms));
  }
  ASSERT_FALSE(control_->over()) << "dead at 1.1 s: 60 s pass at 61.1 s";
  EXPECT_THAT(control_->Waits(At(62'000)),
              ::testing::Contains(HasSubstr("workers: none alive for 1m (master.worker_wait_s")));
  Beat(At(62'200), {0, 1}, {});
  control_->Tick(At(62'200));
  ExpectStoppedWith("no worker was alive for 1m (master.worker_wait_s = 60 s)");
}

// The default bound is minutes, not an hour (issue 49: a job whose workers
// all exited sat an hour at "waiting for workers").
TEST_F(JobControlLivenessTest, NoWorkerStopsTheJobWithinFiveMinutesByDefault) {
  job_.master.worker_wait_s = JobConfig().master.worker_wait_s;
  ASSERT_EQ(job_.master.worker_wait_s, 300);
  StartTraining();
  for (int64_t s = 1; s <= 320 && !control_->over(); ++s) {
    Beat(At(s * 1000), {0, 1}, {});
    control_->Tick(At(s * 1000));
  }
  ExpectStoppedWith("no worker was alive for 5m");
}

// An autoscaler that may still start workers holds the bound (it is waiting
// for free GPUs, or replacing the workers); once it may not (its
// autoscale.max_restarts reached), the bound runs from then.
TEST_F(JobControlLivenessTest, AnAutoscalerThatMayStillLaunchHoldsTheWorkersBound) {
  job_.master.worker_wait_s = 60;
  StartTraining();
  bool may_launch = true;
  control_->ExpectWorkersFrom([&may_launch] { return may_launch; });
  int64_t s = 1;
  for (; s <= 600; ++s) {
    Beat(At(s * 1000), {0, 1}, {});
    control_->Tick(At(s * 1000));
  }
  EXPECT_FALSE(control_->over());
  EXPECT_THAT(control_->Waits(At(s * 1000)),
              ::testing::Not(::testing::Contains(HasSubstr("workers: none alive"))));
  may_launch = false;
  for (const int64_t until = s + 62; s <= until && !control_->over(); ++s) {
    Beat(At(s * 1000), {0, 1}, {});
    control_->Tick(At(s * 1000));
  }
  ExpectStoppedWith("no worker was alive for 1m1s (master.worker_wait_s = 60 s)");
}

TEST_F(JobControlLivenessTest, WorkerWaitZeroWaitsForWorkersForever) {
  job_.master.worker_wait_s = 0;
  StartTraining();
  for (int64_t s = 1; s <= 7200; s += 10) {
    Beat(At(s * 1000), {0, 1}, {});
    control_->Tick(At(s * 1000));
  }
  EXPECT_FALSE(control_->over());
}

// --- Checkpoints to succeed -----------------------------------------------------------------

TEST_F(JobControlLivenessTest, CheckpointsFailingInARowStopTheJob) {
  job_.checkpoint.max_failures = 3;
  StartTraining();
  for (uint64_t id = 1; id <= 3; ++id) {
    const absl::Time now = At(static_cast<int64_t>(id) * 1000);
    ASSERT_NO_FATAL_FAILURE(FailCheckpointRound(id, now, /*failing=*/1));
    if (id < 3) {
      control_->Tick(now);
      EXPECT_FALSE(control_->over()) << id;
    }
  }
  control_->Tick(At(3100));
  ExpectStoppedWith(
      "the last 3 checkpoints failed (checkpoint.max_failures = 3), the last one: "
      "checkpoint 3: ps[1]: disk full");
}

TEST_F(JobControlLivenessTest, ACompleteCheckpointResetsTheFailureCount) {
  job_.checkpoint.max_failures = 2;
  StartTraining();
  ASSERT_NO_FATAL_FAILURE(FailCheckpointRound(1, At(1000), /*failing=*/0));
  proto::CheckpointRecord record;
  ASSERT_NO_FATAL_FAILURE(RecordCheckpoint(2, At(2000), &record));
  ASSERT_NO_FATAL_FAILURE(FailCheckpointRound(3, At(3000), /*failing=*/0));
  control_->Tick(At(3100));
  EXPECT_FALSE(control_->over()) << "one failure since the last complete checkpoint";
  ASSERT_NO_FATAL_FAILURE(FailCheckpointRound(4, At(4000), /*failing=*/0));
  control_->Tick(At(4100));
  ExpectStoppedWith("the last 2 checkpoints failed");
}

// --- Servers that cannot write -------------------------------------------------------------------

TEST_F(JobControlLivenessTest, AServerThatCannotWriteStopsTheJobNamingIt) {
  StartTraining();
  proto::HeartbeatRequest request;
  request.set_endpoint(Endpoint(5001));
  request.set_storage_error(
      "IO error: No space left on device: While appending to file: /data/ps-1/db/000012.log");
  proto::HeartbeatReply reply;
  ASSERT_TRUE(control_->Heartbeat(ServerNode(1), request, /*map_version=*/0, At(500), &reply).ok());
  EXPECT_TRUE(reply.shutdown()) << "the server hears it at once";
  ExpectStoppedWith(
      "ps[1] (ps-host pid 101) cannot write its store: IO error: No space left on "
      "device: While appending to file: /data/ps-1/db/000012.log");
  EXPECT_THAT(control_->progress().failure(), HasSubstr("run eps-master --resume"));
}

// --- A shard nobody can read
// ----------------------------------------------------------------------

class UnreadableShardTest : public JobControlLivenessTest {
 protected:
  // Worker 1 committed the first line of shard `a_` and reports the rest
  // unreadable.
  void SetUp() override {
    StartTraining();
    a_ = Assigned(1, t0_);
    ASSERT_TRUE(Commit(1, CommitOf(a_, a_.start(), 1), At(100)).ok());
    report_.set_shard_id(a_.shard_id());
    report_.set_epoch(a_.epoch());
    report_.set_phase(a_.phase());
    report_.set_offset(a_.start() + kLineBytes);
    report_.set_line(a_.start_line() + 1);
    report_.set_error("range [10, 40) is beyond /data/train-0 (25 bytes)");
  }

  // The report's range, checked: StatusOr of whether the master would read it.
  TrainingProgress::UnreadRange Range(absl::Time now) {
    StatusOr<std::optional<TrainingProgress::UnreadRange>> range =
        control_->UnreadableShard(WorkerNode(1), report_, now, &reply_);
    EXPECT_TRUE(range.ok()) << range.status();
    EXPECT_TRUE(range.ok() && range->has_value());
    return range.ok() && range->has_value() ? **range : TrainingProgress::UnreadRange();
  }

  proto::ShardAssignment a_;
  proto::ShardUnreadableRequest report_;
  proto::ShardUnreadableReply reply_;
};

TEST_F(UnreadableShardTest, TheMasterReadsTheUnreadPartOfTheShard) {
  const TrainingProgress::UnreadRange range = Range(At(200));
  EXPECT_EQ(range.path, "/data/train-0");
  EXPECT_EQ(range.begin, a_.start() + kLineBytes);
  EXPECT_EQ(range.end, a_.end());
  EXPECT_EQ(range.first_line, a_.start_line() + 1);
  EXPECT_EQ(range.lines, a_.records() - 1);
  // Another worker's shard, or an offset that is not the committed one.
  EXPECT_EQ(control_->UnreadableShard(WorkerNode(0), report_, At(200), &reply_).status().code(),
            absl::StatusCode::kFailedPrecondition);
  proto::ShardUnreadableRequest early = report_;
  early.set_offset(a_.start());
  EXPECT_EQ(control_->UnreadableShard(WorkerNode(1), early, At(200), &reply_).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(UnreadableShardTest, FailStopsTheJobResumablyNamingTheFile) {
  job_.data.on_unreadable = "fail";
  const TrainingProgress::UnreadRange range = Range(At(200));
  const Status stopped = control_->ShardUnreadable(
      WorkerNode(1), report_, range, absl::DataLossError("truncated: 25 bytes, the scan saw 40"),
      At(250), &reply_);
  EXPECT_EQ(ReasonOf(stopped), proto::JOB_OVER);
  ExpectStoppedWith(
      "data file /data/train-0 cannot be read (truncated: 25 bytes, the scan saw 40; lines 2-4 in "
      "epoch 1, first seen by worker[1]: range [10, 40) is beyond /data/train-0 (25 bytes)); "
      "restore it and run eps-master --resume, or set data.on_unreadable = skip");
}

TEST_F(UnreadableShardTest, SkipCountsTheUnreadLinesAndTheJobGoesOn) {
  job_.data.on_unreadable = "skip";
  const TrainingProgress::UnreadRange range = Range(At(200));
  ASSERT_TRUE(control_
                  ->ShardUnreadable(WorkerNode(1), report_, range,
                                    absl::NotFoundError("the file is gone"), At(250), &reply_)
                  .ok());
  EXPECT_TRUE(reply_.skipped());
  EXPECT_FALSE(control_->over());
  EXPECT_EQ(ShardState(a_.shard_id()).state, ShardTracker::State::kDone);
  const proto::EpochLedger& entry = control_->progress().ledger()[0];
  EXPECT_EQ(entry.lines_skipped(), a_.records() - 1);
  EXPECT_EQ(entry.lines_committed(), 1u);
  ASSERT_EQ(entry.skipped_size(), 1);
  EXPECT_EQ(entry.skipped(0), "/data/train-0 lines 2-4: the file is gone");
  ASSERT_EQ(events_.Count("shard_skipped"), 1u);
  // A repeat (a lost reply) gets the same answer and changes nothing.
  proto::ShardUnreadableReply again;
  StatusOr<std::optional<TrainingProgress::UnreadRange>> repeat =
      control_->UnreadableShard(WorkerNode(1), report_, At(300), &again);
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_FALSE(repeat->has_value());
  EXPECT_TRUE(again.skipped());
  EXPECT_EQ(control_->progress().ledger()[0].lines_skipped(), a_.records() - 1);
  // The other shards finish the epoch: every line committed or skipped once.
  for (int i = 0; i < 2; ++i) {
    const proto::ShardAssignment next = Assigned(0, At(400));
    ASSERT_TRUE(Commit(0, CommitOf(next, next.start(), next.records()), At(400)).ok());
  }
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFinished);
  const proto::EpochLedger& done = control_->progress().ledger()[0];
  EXPECT_EQ(done.lines_committed() + done.lines_skipped(), done.records_expected());
}

TEST_F(UnreadableShardTest, AFileTheMasterCanReadIsTheWorkersProblem) {
  job_.data.on_unreadable = "skip";
  const TrainingProgress::UnreadRange range = Range(At(200));
  const Status refused =
      control_->ShardUnreadable(WorkerNode(1), report_, range, absl::OkStatus(), At(250), &reply_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              HasSubstr("the master reads /data/train-0 (lines 2-4) fine, but this worker cannot"));
  EXPECT_FALSE(control_->over());
  EXPECT_EQ(control_->progress().ledger()[0].lines_skipped(), 0u);
  EXPECT_EQ(ShardState(a_.shard_id()).state, ShardTracker::State::kDoing)
      << "it moves when the worker leaves";
  ASSERT_TRUE(control_->Deregister(WorkerNode(1)).ok());
  EXPECT_EQ(ShardState(a_.shard_id()).state, ShardTracker::State::kTodo);
}

// --- The end, heard by everyone
// ---------------------------------------------------------------------

TEST_F(JobControlLivenessTest, PeersHearTheEndEvenAfterTheirLeaseRanOut) {
  StartTraining();
  control_->Stop("stopped by the test", At(100));
  // Nobody heard it in time (a master slow to answer): every lease runs out.
  control_->Tick(At(5000));
  ASSERT_EQ(control_->membership().workers().at(0).state, PeerState::kDead);
  ASSERT_EQ(control_->membership().servers().at(1).state, PeerState::kDead);
  proto::HeartbeatReply reply;
  ASSERT_TRUE(WorkerBeat(0, At(5100), 0, &reply).ok()) << "not FENCED: the job is over";
  EXPECT_TRUE(reply.shutdown());
  EXPECT_EQ(reply.state(), proto::JOB_FAILED);
  reply.Clear();
  ASSERT_TRUE(ServerBeat(1, At(5100), &reply).ok());
  EXPECT_TRUE(reply.shutdown());
  // Nor may anyone join, and they are told why.
  proto::RegisterWorkerReply registered;
  proto::RegisterWorkerRequest late = WorkerRequest(301);
  AddSharedOptions(job_.SharedOptions(), late.mutable_job_options());
  EXPECT_EQ(ReasonOf(control_->RegisterWorker(late, At(5200), &registered)), proto::JOB_OVER);
  EXPECT_EQ(ReasonOf(RegisterServer(6001, 201, /*stored=*/1, At(5200))), proto::JOB_OVER);
}

TEST_F(JobControlLivenessTest, TheMasterWaitsForPeersToHearTheEndAtMostThreeLeasesAndTenSeconds) {
  StartTraining();
  control_->Stop("stopped by the test", At(100));
  // A peer that heartbeats without ever being told (it should not happen)
  // keeps the master only until the deadline.
  const int64_t deadline_ms = 100 + 3 * kLeaseMs + 10'000;
  EXPECT_FALSE(control_->Done(At(deadline_ms - 1)));
  EXPECT_TRUE(control_->Done(At(deadline_ms)));
}

}  // namespace
}  // namespace eps
