// Tests master/job_control.h: a model that diverged stops the job instead of
// finishing it (a non-finite loss, a loss past job.divergence_factor, a NaN
// or ruinous evaluation), and what a holder of the worker key cannot grow at
// will (live workers, registrations, heartbeat stats); leases are judged on
// when requests arrived. Scripted time; the fixture is in
// tests/master/job_control_fixture.h.

#include <cmath>
#include <limits>

#include "core/metrics.h"
#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

// --- A diverged model ---------------------------------------------------------------------------

TEST_F(JobControlLivenessTest, ANonFiniteLossStopsTheJobNamingTheEpochAndTheWorker) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(1, t0_);
  ASSERT_TRUE(Commit(1, CommitOf(a, a.start(), 1), At(100)).ok());
  proto::CommitProgressRequest poisoned = CommitOf(a, a.start() + kLineBytes, 1);
  poisoned.set_loss_sum(std::numeric_limits<double>::quiet_NaN());
  const Status refused = Commit(1, poisoned, At(200));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), proto::JOB_OVER);
  ExpectStoppedWith("training diverged in epoch 1: worker[1] computed a non-finite loss (nan)");
  EXPECT_THAT(control_->progress().failure(), HasSubstr("/data/train-0 from line 2"));
  EXPECT_THAT(control_->progress().failure(),
              HasSubstr("resume from checkpoint 0 with a smaller step: eps-master --resume "
                        "--optimizer.learning_rate="));
  EXPECT_EQ(control_->progress().ledger()[0].lines_committed(), 1u) << "not applied";
  // Whatever comes after is refused the same way.
  EXPECT_EQ(ReasonOf(Commit(0, CommitOf(a, a.start() + kLineBytes, 1), At(300))), proto::JOB_OVER);
}

TEST_F(JobControlLivenessTest, ALossPastTheDivergenceFactorStopsTheJob) {
  job_.job.divergence_factor = 2;
  job_.worker.batch_size.value = 8;  // a window of 64 records
  StartTrainingOn(MakeData("/data/train-0", {2000, 2000}));
  const proto::ShardAssignment a = Assigned(0, t0_);
  int batch = 0;
  for (; batch < 12; ++batch) ASSERT_TRUE(CommitBatch(a, batch, 0.5).ok());  // 96 records
  // The loss rises to 0.9: within twice epoch 1's mean.
  for (; batch < 24; ++batch) ASSERT_TRUE(CommitBatch(a, batch, 0.9).ok());
  EXPECT_FALSE(control_->over());
  EXPECT_GT(*control_->progress().RecentLoss(), 0.8) << "the last 64 records weigh most";
  EXPECT_LT(*control_->progress().RecentLoss(), 0.9);
  // Then far past it, for good.
  int commits = 0;
  for (; !control_->over() && commits < 100; ++commits) {
    ASSERT_TRUE(CommitBatch(a, batch++, 5.0).ok());
  }
  ExpectStoppedWith("training diverged in epoch 1: the mean loss of the last 64 records");
  EXPECT_THAT(control_->progress().failure(),
              HasSubstr("job.divergence_factor (2) times epoch 1's mean loss before them"));
  EXPECT_THAT(control_->progress().failure(), HasSubstr("first seen in worker[0]'s commit"));
  EXPECT_THAT(control_->progress().failure(), HasSubstr("for 512 records"));
  // A window of 64 records is past the factor within a few batches; it
  // must stay there for 8 windows of 8 batches.
  EXPECT_GE(commits, 64);
  EXPECT_LE(commits, 67);
}

TEST_F(JobControlLivenessTest, ALossThatExplodesFromTheFirstBatchIsCaughtToo) {
  // A loss huge from the start would be its own baseline: ln 2 caps it.
  job_.worker.batch_size.value = 8;
  StartTrainingOn(MakeData("/data/train-0", {2000, 2000}));
  const proto::ShardAssignment a = Assigned(0, t0_);
  int commits = 0;
  for (; !control_->over() && commits < 100; ++commits) {
    ASSERT_TRUE(CommitBatch(a, commits, 1000.0).ok());
  }
  ExpectStoppedWith("times the loss of a model that knows nothing (ln 2: predicting 0.5 for every "
                    "record), 0.69315");
  // The recent loss is judged after half a window (45 records), then
  // stays past the factor for 8 windows.
  EXPECT_LE(commits, 6 + 64);
}

TEST_F(JobControlLivenessTest, AHealthyStartsOvershootPastTwiceLnTwoTrainsOn) {
  // Adagrad's first steps with stale workers: the loss climbs to twice ln 2
  // and more for a few windows before it falls (seen with 2 workers on 2
  // cores: 1.5 after 17408 records, 1024 per batch).
  job_.worker.batch_size.value = 8;
  StartTrainingOn(MakeData("/data/train-0", {2000, 2000}));
  const proto::ShardAssignment a = Assigned(0, t0_);
  for (int i = 0; i < 200; ++i) {
    // 2 windows near ln 2, 5 windows at 1.5, then learning.
    ASSERT_TRUE(CommitBatch(a, i, i < 16 ? 0.7 : i < 56 ? 1.5 : 0.5).ok());
  }
  EXPECT_FALSE(control_->over()) << control_->progress().failure();
}

TEST_F(JobControlLivenessTest, AStartAboveLnTwoWithinTheFactorTrainsOn) {
  job_.worker.batch_size.value = 8;
  StartTrainingOn(MakeData("/data/train-0", {2000, 2000}));
  const proto::ShardAssignment a = Assigned(0, t0_);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(CommitBatch(a, i, i < 10 ? 1.2 : 0.5).ok());  // a slow start, then learning
  }
  EXPECT_FALSE(control_->over()) << control_->progress().failure();
}

TEST_F(JobControlLivenessTest, DivergenceFactorZeroOnlyStopsOnANonFiniteLoss) {
  job_.job.divergence_factor = 0;
  job_.worker.batch_size.value = 8;
  StartTrainingOn(MakeData("/data/train-0", {2000, 2000}));
  const proto::ShardAssignment a = Assigned(0, t0_);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(CommitBatch(a, i, i < 10 ? 0.5 : 50.0).ok());
  EXPECT_FALSE(control_->over());
}

TEST_F(JobControlLivenessTest, NoCheckpointIsTakenWhileTheLossIsPastTheFactor) {
  // The checkpoint a diverged job resumes from is one taken before.
  job_.worker.batch_size.value = 8;
  job_.checkpoint.interval_s = 1;
  StartTrainingOn(MakeData("/data/train-0", {2000, 2000}));
  const proto::ShardAssignment a = Assigned(0, t0_);
  control_->Tick(At(100));  // the first checkpoint is due at 1.1 s
  int batch = 0;
  for (; batch < 12; ++batch) ASSERT_TRUE(CommitBatch(a, batch, 0.5).ok());
  for (; batch < 15; ++batch) ASSERT_TRUE(CommitBatch(a, batch, 5.0).ok());
  ASSERT_TRUE(control_->progress().LossPastFactor());
  ASSERT_FALSE(control_->over()) << "not for long enough to call it diverged";
  Beat(At(2000), {0, 1}, {0, 1});
  control_->Tick(At(2000));
  EXPECT_FALSE(control_->checkpoints().round_id().has_value());
  // It learns again: the checkpoint is taken.
  int64_t ms = 2000;
  while (control_->progress().LossPastFactor() && batch < 60) {
    ASSERT_TRUE(CommitBatch(a, batch++, 0.3, At(ms += 10)).ok());
  }
  ASSERT_FALSE(control_->progress().LossPastFactor());
  Beat(At(ms), {0, 1}, {0, 1});
  control_->Tick(At(ms));
  ASSERT_TRUE(control_->checkpoints().round_id().has_value());
  // A round still pausing the workers when the loss goes past is abandoned,
  // without counting as a failed checkpoint.
  while (!control_->progress().LossPastFactor() && batch < 80) {
    ASSERT_TRUE(CommitBatch(a, batch++, 5.0, At(ms += 10)).ok());
  }
  EXPECT_FALSE(control_->checkpoints().round_id().has_value());
  EXPECT_EQ(control_->checkpoints().consecutive_failures(), 0u);
  EXPECT_FALSE(control_->checkpoints().last().has_value() &&
               control_->checkpoints().last()->id() > 0)
      << "nothing of the suspect model was saved";
}

TEST_F(JobControlLivenessTest, ANaNPredictionInTheEvaluationStopsTheJob) {
  const proto::ShardAssignment eval = StartEvaluating();
  const Status refused =
      CommitEvaluation(eval, {0.7f, std::numeric_limits<float>::quiet_NaN()});
  EXPECT_EQ(ReasonOf(refused), proto::JOB_OVER);
  ExpectStoppedWith("the model diverged: worker[0] predicted NaN for the evaluation");
  EXPECT_FALSE(control_->progress().eval_auc().has_value()) << "never evaluated";
}

TEST_F(JobControlLivenessTest, AnEvaluationWorseThanKnowingNothingIsNeverFinished) {
  const proto::ShardAssignment eval = StartEvaluating();
  // Certain and wrong on every record: a clamped log loss of 16.1.
  ASSERT_TRUE(CommitEvaluation(eval, {0.0f, 1.0f}).ok());
  ExpectStoppedWith(
      "the model diverged: its evaluation log loss, 16.11810, is over "
      "job.divergence_factor (2) times that of a model that knows nothing");
  EXPECT_NE(control_->progress().phase(), JobPhase::kFinished);
}

// Only an evaluation commit Commit would apply is checked against the file
// (EvalRangeOf): a range Commit refuses (reversed, or a gap) is answered by
// Commit, not sent to the check.
TEST_F(JobControlLivenessTest, OnlyACommitThatWouldApplyIsCheckedAgainstTheFile) {
  const proto::ShardAssignment eval = StartEvaluating();
  proto::CommitProgressRequest commit = CommitOf(eval, eval.start(), 2);
  EXPECT_TRUE(control_->EvalRangeOf(WorkerNode(0), commit).has_value());
  proto::CommitProgressRequest reversed = commit;
  reversed.set_end_offset(reversed.begin_offset() - 1);
  EXPECT_FALSE(control_->EvalRangeOf(WorkerNode(0), reversed).has_value());
  proto::CommitProgressRequest gap = CommitOf(eval, eval.start() + kLineBytes, 1);
  EXPECT_FALSE(control_->EvalRangeOf(WorkerNode(0), gap).has_value());
  EXPECT_FALSE(control_->EvalRangeOf(WorkerNode(1), commit).has_value()) << "not its shard";
}

// An out-of-range finite prediction is a broken request, not a model.
TEST_F(JobControlLivenessTest, AnOutOfRangePredictionIsABadRequest) {
  const proto::ShardAssignment eval = StartEvaluating();
  EXPECT_EQ(CommitEvaluation(eval, {1.5f, 0.2f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(control_->over());
}

// A holder of the worker key cannot register ids without end: past
// master.max_workers live workers, and past the registration rate, a
// registration is told to wait (SLOW_DOWN).
TEST_F(JobControlTest, WorkersAreAdmittedUpToMaxWorkersAndTheRegistrationRate) {
  job_.master.max_workers = 16;
  control_ = NewControl();
  StartTraining();  // workers 0 and 1
  proto::RegisterWorkerRequest request = WorkerRequest(/*pid=*/300);
  AddSharedOptions(job_.SharedOptions(), request.mutable_job_options());
  const auto add = [&](absl::Time now) {
    proto::RegisterWorkerReply reply;
    return control_->RegisterWorker(request, now, &reply);
  };
  for (int i = 2; i < 16; ++i) ASSERT_TRUE(add(t0_).ok()) << i;
  Status refused = add(t0_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(refused), proto::SLOW_DOWN);
  EXPECT_THAT(refused.message(), HasSubstr("master.max_workers"));

  // Room again once one leaves; but 16 registrations at once spent the
  // bucket, refilled at 8 a second.
  ASSERT_TRUE(control_->Deregister(WorkerNode(3)).ok());
  refused = add(t0_);
  EXPECT_EQ(ReasonOf(refused), proto::SLOW_DOWN);
  EXPECT_THAT(refused.message(), HasSubstr("registrations a second"));
  EXPECT_TRUE(add(t0_ + absl::Milliseconds(130)).ok());
  EXPECT_EQ(control_->membership().alive_workers(), 16u);
}

// A heartbeat's stats are bounded before the master keeps them: no
// histogram of the peer's own buckets (each would be series in /metrics),
// no endless batch-size changes, no huge storage error.
TEST_F(JobControlTest, HeartbeatStatsOutOfBoundsAreRefusedAndNotKept) {
  StartTraining();
  proto::HeartbeatReply reply;
  proto::HeartbeatRequest request;
  HistogramToProto(LatencyHistogram().Snapshot(), request.mutable_worker()->mutable_pull_latency());
  request.mutable_worker()->set_records_per_s(5);
  ASSERT_TRUE(control_->Heartbeat(WorkerNode(0), request, /*map_version=*/0, At(10), &reply).ok());
  EXPECT_EQ(control_->membership().workers().at(0).stats.records_per_s(), 5);

  proto::HeartbeatRequest bloated = request;
  bloated.mutable_worker()->set_records_per_s(7);
  proto::Histogram* histogram = bloated.mutable_worker()->mutable_push_latency();
  for (int i = 0; i < 1000; ++i) histogram->add_bounds(i);
  for (int i = 0; i < 1001; ++i) histogram->add_counts(1);
  Status refused = control_->Heartbeat(WorkerNode(0), bloated, /*map_version=*/0, At(20), &reply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("push_latency"));

  bloated = request;
  bloated.mutable_worker()->set_records_per_s(7);
  for (int i = 0; i < 17; ++i) bloated.mutable_worker()->add_batch_size_changes()->set_seq(i + 1);
  refused = control_->Heartbeat(WorkerNode(0), bloated, /*map_version=*/0, At(30), &reply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("batch-size changes"));
  EXPECT_EQ(control_->membership().workers().at(0).stats.records_per_s(), 5) << "nothing kept";

  proto::HeartbeatRequest server;
  server.set_endpoint(control_->membership().servers().at(0).endpoint);
  server.set_storage_error(std::string(5000, 'x'));
  refused = control_->Heartbeat(ServerNode(0), server, /*map_version=*/0, At(40), &reply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(control_->over()) << "a storage error out of bounds stops nothing";
}

// Leases are judged on when messages arrived: while a request that came in
// time waits for a busy handler, no lease runs out; for one lease at most.
TEST_F(JobControlTest, LeasesAreJudgedOnWhenTheOldestWaitingRequestArrived) {
  StartTraining();  // workers 0 and 1 beat at t0
  const int64_t lease = job_.master.lease_ms;
  Beat(At(lease - 100), {0, 1}, {0});  // worker 1 falls silent at t0
  // A request (worker 1's heartbeat, say) arrived at lease - 50 and waits.
  control_->NoteUnhandledSince(At(lease - 50));
  control_->ExpireLeases(At(lease + 200));
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kAlive);
  // Not forever: a lease after the arrival the clock runs again.
  control_->ExpireLeases(At(2 * lease + 100));
  EXPECT_NE(control_->membership().workers().at(1).state, PeerState::kAlive);
  // Nothing waiting: judged now.
  control_->NoteUnhandledSince(std::nullopt);
  Beat(At(2 * lease + 100), {0, 1}, {});
  control_->ExpireLeases(At(3 * lease + 200));
  EXPECT_NE(control_->membership().workers().at(0).state, PeerState::kAlive);
}

}  // namespace
}  // namespace eps
