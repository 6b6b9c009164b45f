// Tests master/job_control.h: what a worker's commits and calls may do.
// Proven work and false evaluations fence their worker; a recovery holds
// back pass counts and refuses its fenced workers; malformed requests are
// refused; a deregistered worker's shard moves at once; each batch-size
// change is one event. The fixture is in tests/master/job_control_fixture.h.

#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

// Proven work (master/trust/work_proof.h): under CURVE a training commit counts
// only what the servers' receipts cover; a worker that claims more is
// fenced at once, its shard goes on from its last proven commit, and the
// refusal says why.
TEST_F(JobControlTest, ACommitOverWhatTheServersSawPushedFencesItsWorker) {
  const StatusOr<WorkerCredentials> key = WorkerCredentials::FromKey(std::string(32, 'k'));
  ASSERT_TRUE(key.ok()) << key.status();
  control_->CheckWorkWith(&*key);
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  const auto receipted = [&](uint64_t begin, uint64_t lines, uint32_t records) {
    proto::CommitProgressRequest commit = CommitOf(a, begin, lines);
    proto::WorkBatch batch;
    batch.set_shard_id(commit.shard_id());
    batch.set_epoch(commit.epoch());
    batch.set_begin_offset(commit.begin_offset());
    batch.set_end_offset(commit.end_offset());
    batch.set_records(records);
    proto::WorkReceipt* receipt = commit.add_receipts();
    receipt->set_records(records);
    receipt->set_tag(key->Receipt(0, batch));
    return commit;
  };
  ASSERT_TRUE(Commit(0, receipted(a.start(), 1, 1), t0_).ok());
  EXPECT_EQ(control_->progress().records_trained(), 1u);

  // Two records claimed, one pushed.
  Status refused = Commit(0, receipted(a.start() + kLineBytes, 2, 1), At(100));
  EXPECT_EQ(ReasonOf(refused), proto::FENCED);
  EXPECT_THAT(refused.message(), HasSubstr("its work is not proven"));
  EXPECT_THAT(refused.message(), HasSubstr("committed 2 records"));
  EXPECT_THAT(refused.message(), HasSubstr("prove pushes of 1"));
  EXPECT_EQ(control_->progress().records_trained(), 1u);
  EXPECT_TRUE(control_->membership().IsFenced(0));
  // Everything it sends from now on is refused with the reason.
  EXPECT_THAT(WorkerBeat(0, At(200)).message(), HasSubstr("its work is not proven"));

  // Once the servers refuse it, its shard goes on from its last proven
  // commit, with another worker.
  const std::optional<Membership::FenceRound> round = control_->PendingFences();
  ASSERT_TRUE(round.has_value());
  control_->FencesAcknowledged(*round, At(300));
  const proto::ShardAssignment moved = Assigned(1, At(300));
  EXPECT_EQ(moved.shard_id(), a.shard_id());
  EXPECT_EQ(moved.start(), a.start() + kLineBytes);
}

// The master's check found an evaluation commit false (master/trust/eval_check.h).
// A liar with nothing taken yet is only fenced; one whose evaluation was
// taken before makes the evaluation start over, every worker registering
// again, so the job's metrics come from none of its commits.
TEST_F(JobControlTest, AFalseEvaluationFencesItsWorkerAndDropsWhatItEvaluated) {
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
  control_->DataScanned(std::pair(MakeData("/data/train-0", {2}), MakeData("/data/eval-0", {2, 2, 2})),
                        t0_);
  ASSERT_EQ(AddWorker(t0_), 0u);
  ASSERT_EQ(AddWorker(t0_), 1u);
  ASSERT_EQ(AddWorker(t0_), 2u);
  const proto::ShardAssignment train = Assigned(0, t0_);
  ASSERT_TRUE(Commit(0, CommitOf(train, train.start(), 2), t0_).ok());
  ASSERT_EQ(control_->progress().phase(), JobPhase::kEvaluating);
  const auto evaluate = [&](uint32_t worker, const proto::ShardAssignment& shard, absl::Time now) {
    const std::vector<float> labels = {1.0f, 0.0f};
    const std::vector<float> predictions = {0.8f, 0.3f};
    proto::CommitProgressReply reply;
    return control_->Commit(WorkerNode(worker), CommitOf(shard, shard.start(), 2), labels,
                            predictions, now, &reply);
  };
  const proto::ShardAssignment a = Assigned(0, At(100));
  ASSERT_TRUE(evaluate(0, a, At(100)).ok());
  const proto::ShardAssignment b = Assigned(1, At(100));
  Assigned(2, At(100));

  // Worker 2 lies at its first commit: fenced, nothing else changes.
  Status fenced = control_->RefuseEvaluation(WorkerNode(2), "its evaluation of c predicts 1", At(200));
  EXPECT_EQ(ReasonOf(fenced), proto::FENCED);
  EXPECT_THAT(fenced.message(), HasSubstr("the master's check of its evaluation of c predicts 1"));
  EXPECT_EQ(events_.Count("evaluation_restarted"), 0u);
  EXPECT_EQ(control_->progress().eval_records(), 2u);
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kAlive);

  // Worker 0 had a commit taken: the evaluation starts over.
  fenced = control_->RefuseEvaluation(WorkerNode(0), "its evaluation of b predicts 1", At(300));
  EXPECT_EQ(ReasonOf(fenced), proto::FENCED);
  EXPECT_EQ(events_.Count("evaluation_restarted"), 1u);
  EXPECT_EQ(control_->progress().eval_records(), 0u);
  EXPECT_EQ(control_->progress().phase(), JobPhase::kEvaluating);
  EXPECT_THAT(WorkerBeat(1, At(300)).message(), HasSubstr("worker[0] evaluated falsely"));
  EXPECT_EQ(ReasonOf(evaluate(1, b, At(300))), proto::FENCED);

  // A worker registering again evaluates everything: the metrics are its.
  const uint32_t honest = AddWorker(At(400));
  for (int shard = 0; shard < 3; ++shard) {
    ASSERT_TRUE(evaluate(honest, Assigned(honest, At(400)), At(400)).ok());
  }
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFinished);
  EXPECT_EQ(control_->progress().eval_records(), 6u);
  EXPECT_EQ(control_->progress().eval_auc(), 1.0);
}

// Servers learn the passes done (for ps.ttl_passes) from heartbeat
// replies, but not while a recovery runs: a restored server must not
// expire rows by the count of before the checkpoint it was restored to.
TEST_F(JobControlTest, NoPassCountReachesTheServersDuringARecovery) {
  StartTraining();
  proto::HeartbeatReply reply;
  ASSERT_TRUE(ServerBeat(0, At(100), &reply).ok());
  EXPECT_TRUE(reply.has_training_passes_done());
  Beat(At(900), {0}, {0, 1});
  control_->ExpireLeases(At(1100));
  ASSERT_TRUE(control_->recovery().active());
  reply.Clear();
  ASSERT_TRUE(ServerBeat(0, At(1100), &reply).ok());
  EXPECT_FALSE(reply.has_training_passes_done());
}

TEST_F(JobControlTest, CommitFromAWorkerFencedByARecoveryIsRefused) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  Beat(At(900), {0}, {0, 1});
  control_->ExpireLeases(At(1100));
  ASSERT_TRUE(control_->recovery().active());
  Status refused = Commit(0, CommitOf(a, a.start(), 1), At(1200));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), proto::FENCED);
  EXPECT_THAT(refused.message(), HasSubstr("must register again"));
  EXPECT_EQ(control_->progress().records_trained(), 0u);
}

TEST_F(JobControlTest, MalformedRequestsAreRefused) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  proto::CommitProgressRequest commit = CommitOf(a, a.start(), 1);
  commit.set_malformed(2);
  EXPECT_EQ(Commit(0, commit, t0_).code(), absl::StatusCode::kInvalidArgument);
  proto::GetShardReply reply;
  EXPECT_EQ(control_->GetShard(ServerNode(0), t0_, &reply).code(),
            absl::StatusCode::kInvalidArgument);
  proto::NodeId tool;
  tool.set_role(proto::ROLE_TOOL);
  EXPECT_EQ(control_->Deregister(tool).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(control_->progress().records_trained(), 0u);
}

TEST_F(JobControlTest, DeregisteredWorkersShardMovesAtOnce) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 1), t0_).ok());
  ASSERT_TRUE(control_->Deregister(WorkerNode(0)).ok());
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kTodo);
  const proto::ShardAssignment moved = Assigned(1, t0_);
  EXPECT_EQ(moved.shard_id(), a.shard_id());
  EXPECT_EQ(moved.start(), a.start() + kLineBytes);
  EXPECT_EQ(ReasonOf(Commit(0, CommitOf(a, a.start() + kLineBytes, 1), t0_)), proto::FENCED);
}

// Heartbeats repeat a worker's latest batch-size changes until they drop
// out of its list: each becomes one batch_size_changed event, however many
// heartbeats carry it and however fast the changes came (two between
// heartbeats).
TEST_F(JobControlTest, EachBatchSizeChangeIsOneEvent) {
  StartTraining();
  auto beat = [&](int64_t ms, uint32_t size, const std::vector<std::pair<uint32_t, uint32_t>>& changes) {
    proto::HeartbeatRequest request;
    proto::WorkerStats* stats = request.mutable_worker();
    stats->set_batch_size(size);
    uint64_t seq = 0;
    for (const auto& [from, to] : changes) {
      proto::BatchSizeChange* change = stats->add_batch_size_changes();
      change->set_seq(++seq);
      change->set_from(from);
      change->set_to(to);
      change->set_reason(absl::StrCat(from, " to ", to));
    }
    proto::HeartbeatReply reply;
    ASSERT_TRUE(control_->Heartbeat(WorkerNode(0), request, /*map_version=*/0, At(ms), &reply).ok());
  };
  beat(100, 256, {});
  beat(200, 256, {{256, 512}, {512, 256}});
  beat(300, 256, {{256, 512}, {512, 256}});
  beat(400, 128, {{256, 512}, {512, 256}, {256, 128}});
  const std::vector<nlohmann::json> events = events_.Named("batch_size_changed");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["from"], 256);
  EXPECT_EQ(events[0]["to"], 512);
  EXPECT_EQ(events[1]["to"], 256);
  EXPECT_EQ(events[2]["to"], 128);
  EXPECT_EQ(events[2]["worker"], 0);
  EXPECT_EQ(events[2]["reason"], "256 to 128");
}

}  // namespace
}  // namespace eps
