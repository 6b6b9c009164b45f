// Tests master/job_control.h: what reaches the store, and a restarted or
// resumed master taking the job up.
// The fixture is in tests/master/job_control_fixture.h.

#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

TEST_F(JobControlTest, TakeChangesPutsTheMasterRecordOnlyWhenItChanged) {
  control_->StartNew("job-1");
  PeekedUpdate update = Take();
  EXPECT_THAT(update.put_keys, ElementsAre(kMasterKey));
  proto::MasterRecord record;
  ASSERT_TRUE(record.ParseFromString(update.values.at(kMasterKey)));
  EXPECT_EQ(record.job_id(), "job-1");
  EXPECT_EQ(record.config_fingerprint(), kFingerprint);
  EXPECT_THAT(Take().put_keys, IsEmpty()) << "nothing changed";

  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  EXPECT_THAT(Take().put_keys, ElementsAre(kMasterKey));
  ASSERT_TRUE(ServerBeat(0, At(100)).ok());
  StateUpdate heartbeat;
  control_->TakeChanges(&heartbeat);
  EXPECT_TRUE(heartbeat.empty()) << "a heartbeat changes nothing stored";

  // Training starts: checkpoint 0, the data sets and the pass go with it.
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, At(100)).ok());
  control_->DataScanned(TinyData(), At(200));
  bool ended = true;
  update = Take(&ended);
  EXPECT_FALSE(ended);
  EXPECT_TRUE(update.clear_pass);
  EXPECT_THAT(update.put_keys,
              UnorderedElementsAre(CheckpointKey(0), kTrainKey, kEvalKey, ShardKey(0),
                                   ShardKey(1), ShardKey(2), kMasterKey));
  proto::CheckpointRecord start;
  ASSERT_TRUE(start.ParseFromString(update.values.at(CheckpointKey(0))));
  EXPECT_EQ(start.id(), 0u);
  EXPECT_EQ(start.master().phase(), static_cast<uint32_t>(JobPhase::kTraining));
  EXPECT_EQ(start.shards_size(), 3);
  EXPECT_EQ(start.servers_size(), 0);
  EXPECT_THAT(Take().put_keys, IsEmpty()) << "checkpoint 0 is put once";

  const uint32_t worker = AddWorker(At(300));
  EXPECT_THAT(Take().put_keys, ElementsAre(kMasterKey)) << "a new worker id";
  const proto::ShardAssignment shard = Assigned(worker, At(300));
  EXPECT_THAT(Take().put_keys, ElementsAre(ShardKey(shard.shard_id())))
      << "an assignment changes the shard, not the master record";
  ASSERT_TRUE(WorkerBeat(worker, At(400)).ok());
  EXPECT_THAT(Take().put_keys, IsEmpty());
  ASSERT_TRUE(Commit(worker, CommitOf(shard, shard.start(), 1), At(400)).ok());
  update = Take();
  EXPECT_THAT(update.put_keys, ElementsAre(ShardKey(shard.shard_id()), kMasterKey));
  ASSERT_TRUE(record.ParseFromString(update.values.at(kMasterKey)));
  EXPECT_EQ(record.records_trained(), 1u);
}

// What TakeChanges hands over is all a restarted master needs.
TEST_F(JobControlTest, ARestartFromThePersistedChangesContinuesTheJob) {
  FakeStore store;
  auto persist = [&] {
    StateUpdate update;
    control_->TakeChanges(&update);
    store.Write(update);
  };
  StartTraining();
  persist();
  const proto::ShardAssignment a = Assigned(0, At(100));
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 3), At(100)).ok());
  persist();

  const MasterSnapshot snapshot = store.Load();
  EXPECT_EQ(snapshot.master.SerializeAsString(), control_->SaveRecord().SerializeAsString());
  ASSERT_EQ(snapshot.checkpoints.size(), 1u);
  EXPECT_TRUE(snapshot.checkpoints.contains(0));
  EXPECT_EQ(snapshot.shards.size(), 3u);

  control_ = NewControl();
  ASSERT_TRUE(control_->Restore(snapshot, /*resume=*/false, At(5000)).ok());
  EXPECT_EQ(control_->progress().records_trained(), 3u);
  EXPECT_EQ(ShardState(a.shard_id()).committed_offset, a.start() + 3 * kLineBytes);
  EXPECT_EQ(control_->checkpoints().last()->id(), 0u);
  EXPECT_THAT(control_->membership().fenced(), ElementsAre(0u));
}

// A restarted master takes up the saved job where it was; the workers that
// held shards are fenced before their shards move.
TEST_F(JobControlTest, RestoreContinuesWhereItWasWithTheHoldersFenced) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, At(100));
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 1), At(100)).ok());
  const proto::ShardAssignment b = Assigned(1, At(100));

  const MasterSnapshot snapshot = Snapshot();
  ASSERT_TRUE(snapshot.checkpoints.contains(0));

  events_.Clear();
  control_ = NewControl();
  const absl::Time t1 = At(60'000);
  ASSERT_TRUE(control_->Restore(snapshot, /*resume=*/false, t1).ok());
  EXPECT_TRUE(control_->resumed());
  EXPECT_EQ(control_->job_spec().job_id(), "job-1");
  EXPECT_EQ(control_->progress().phase(), JobPhase::kTraining);
  EXPECT_EQ(control_->progress().records_trained(), 1u);
  EXPECT_EQ(control_->checkpoints().last()->id(), 0u);
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_EQ(events_.Count("master_resumed"), 1u);
  EXPECT_THAT(control_->membership().fenced(), ElementsAre(0u, 1u));
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kDoing);
  EXPECT_EQ(ShardState(a.shard_id()).holder, 0u);

  // The previous run's workers must register again.
  EXPECT_EQ(ReasonOf(Commit(0, CommitOf(a, a.start() + kLineBytes, 1), t1)), proto::FENCED);
  EXPECT_EQ(control_->progress().records_trained(), 1u);
  const uint32_t w2 = AddWorker(t1);
  EXPECT_EQ(w2, 2u) << "ids are never reused";
  // Only the untouched shard is free until the fences are acknowledged.
  const proto::ShardAssignment c = Assigned(w2, t1);
  EXPECT_NE(c.shard_id(), a.shard_id());
  EXPECT_NE(c.shard_id(), b.shard_id());
  EXPECT_EQ(GetShard(w2, t1).action(), proto::GetShardReply::WAIT);

  // The servers heartbeat the new master; the fences go out.
  proto::HeartbeatReply beat;
  ASSERT_TRUE(ServerBeat(0, t1, &beat).ok());
  EXPECT_EQ(beat.cluster_map_version(), 1u);
  ASSERT_TRUE(ServerBeat(1, t1).ok());
  const std::optional<Membership::FenceRound> round = control_->PendingFences();
  ASSERT_TRUE(round.has_value());
  EXPECT_THAT(round->fenced, ElementsAre(0u, 1u));
  control_->FencesAcknowledged(*round, t1);
  std::map<uint64_t, proto::ShardAssignment> moved;
  for (int i = 0; i < 2; ++i) {
    const proto::ShardAssignment shard = Assigned(w2, t1);
    moved[shard.shard_id()] = shard;
  }
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved.at(a.shard_id()).start(), a.start() + kLineBytes);
  EXPECT_EQ(moved.at(b.shard_id()).start(), b.start());
}

TEST_F(JobControlTest, RestoreRedoesARecoveryInProgress) {
  StartTraining();
  MasterSnapshot snapshot = Snapshot();
  snapshot.master.set_recovering(true);
  control_ = NewControl();
  ASSERT_TRUE(control_->Restore(snapshot, /*resume=*/false, At(5000)).ok());
  EXPECT_TRUE(control_->recovery().active());
  EXPECT_TRUE(control_->recovery().rollback());
  EXPECT_EQ(control_->RequestCheckpoint().status().code(), absl::StatusCode::kFailedPrecondition);
}

// --resume: a stopped job continues from its last complete checkpoint,
// every server restoring it and every earlier worker fenced.
TEST_F(JobControlTest, ResumeReturnsToTheLastCheckpoint) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, At(100));
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 2), At(100)).ok());
  proto::CheckpointRecord checkpoint;
  ASSERT_NO_FATAL_FAILURE(RecordCheckpoint(1, At(200), &checkpoint));
  Beat(At(300), {}, {0, 1});
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start() + 2 * kLineBytes, 2), At(300)).ok());
  control_->Fail("stopped by the operator", /*stopped=*/true, At(400));
  ASSERT_EQ(control_->progress().records_trained(), 4u);

  MasterSnapshot snapshot;
  snapshot.master = control_->SaveRecord();
  EXPECT_TRUE(snapshot.master.stopped());
  snapshot.train = DataSetToRecord(TinyData().first);
  snapshot.eval = DataSetToRecord(TinyData().second);
  snapshot.checkpoints[1] = checkpoint;

  control_ = NewControl();
  Status plain = control_->Restore(snapshot, /*resume=*/false, At(5000));
  EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plain.message(), HasSubstr("--resume"));

  events_.Clear();
  control_ = NewControl();
  const absl::Time t1 = At(60'000);
  ASSERT_TRUE(control_->Restore(snapshot, /*resume=*/true, t1).ok());
  EXPECT_TRUE(control_->recovery().active());
  EXPECT_TRUE(control_->recovery().rollback());
  EXPECT_EQ(control_->progress().phase(), JobPhase::kTraining);
  EXPECT_THAT(control_->membership().fenced(), ElementsAre(0u, 1u));
  ASSERT_EQ(events_.Count("job_resuming"), 1u);
  EXPECT_EQ(events_.Named("job_resuming")[0]["checkpoint"], 1);
  const uint32_t w2 = AddWorker(t1);
  EXPECT_EQ(w2, 2u);
  EXPECT_EQ(GetShard(w2, t1).action(), proto::GetShardReply::WAIT);
  EXPECT_FALSE(control_->NextRestore(t1).has_value()) << "no server heard from yet";

  Beat(t1, {0, 1}, {});
  const std::optional<Membership::FenceRound> round = control_->PendingFences();
  ASSERT_TRUE(round.has_value());
  EXPECT_THAT(round->fenced, ElementsAre(0u, 1u));
  control_->FencesAcknowledged(*round, t1);
  const std::optional<Recovery::Step> step = control_->NextRestore(t1);
  ASSERT_TRUE(step.has_value());
  ASSERT_EQ(step->targets.size(), 2u);
  EXPECT_EQ(step->targets[0].path, "/ckpt/ps-0/1");
  EXPECT_EQ(step->targets[1].path, "/ckpt/ps-1/1");
  control_->Restored(*step, {StatusOr<uint64_t>(1000), StatusOr<uint64_t>(2000)}, t1,
                     t1 + absl::Seconds(1));
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_EQ(control_->progress().records_trained(), 2u);
  EXPECT_EQ(control_->progress().records_retrained(), 2u);
  const proto::ShardAssignment again = Assigned(w2, t1 + absl::Seconds(1));
  EXPECT_EQ(again.shard_id(), a.shard_id());
  EXPECT_EQ(again.start(), a.start() + 2 * kLineBytes);
}

TEST_F(JobControlTest, RestoreRefusesAnotherConfigurationOrAJobThatIsOver) {
  StartTraining();
  MasterSnapshot snapshot;
  snapshot.master = control_->SaveRecord();
  snapshot.train = DataSetToRecord(TinyData().first);

  control_ = NewControl("another fingerprint");
  EXPECT_EQ(control_->Restore(snapshot, /*resume=*/false, At(5000)).code(),
            absl::StatusCode::kFailedPrecondition);

  snapshot.master.set_phase(static_cast<uint32_t>(JobPhase::kFinished));
  control_ = NewControl();
  Status over = control_->Restore(snapshot, /*resume=*/false, At(5000));
  EXPECT_EQ(over.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over.message(), HasSubstr("is over"));
}

}  // namespace
}  // namespace eps
