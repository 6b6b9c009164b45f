// Tests master/job_control.h: a whole job, and the interleavings of its units
// (a server lost while it writes a checkpoint, a lease expiring while fences
// propagate, a recovery during a round, a commit after a fence).
// The fixture is in tests/master/job_control_fixture.h.

#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

TEST_F(JobControlTest, RunsASmallJobToTheEnd) {
  control_->StartNew("job-1");
  EXPECT_EQ(events_.Count("job_started"), 1u);
  proto::GetClusterMapReply map;
  Status early = control_->GetClusterMap(WorkerNode(0), &map);
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(early), proto::NOT_READY);

  proto::RegisterServerReply registered;
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_, &registered).ok());
  EXPECT_EQ(registered.server_id(), 0u);
  EXPECT_EQ(registered.job().job_id(), "job-1");
  EXPECT_EQ(registered.job().num_partitions(), 8u);
  EXPECT_FALSE(control_->membership().placed());
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_, &registered).ok());
  EXPECT_EQ(registered.server_id(), 1u);
  EXPECT_TRUE(control_->membership().placed());
  EXPECT_EQ(control_->progress().phase(), JobPhase::kScanning) << "the data is not scanned yet";
  EXPECT_FALSE(control_->checkpoints().last().has_value());

  // Refused servers: a bad endpoint, another job's, one too many.
  proto::RegisterServerRequest bad;
  bad.set_endpoint("localhost:5002");
  EXPECT_EQ(control_->RegisterServer(bad, t0_, &registered).code(),
            absl::StatusCode::kInvalidArgument);
  proto::RegisterServerRequest other_job;
  AddSharedOptions(job_.SharedOptions(), other_job.mutable_job_options());
  other_job.set_endpoint(Endpoint(5002));
  other_job.set_stored_job("job-0 tiny");
  other_job.set_stored_server_id(0);
  EXPECT_EQ(control_->RegisterServer(other_job, t0_, &registered).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RegisterServer(5002, 102, std::nullopt, t0_).code(),
            absl::StatusCode::kFailedPrecondition);

  control_->DataScanned(TinyData(), At(500));
  ASSERT_EQ(control_->progress().phase(), JobPhase::kTraining);
  ASSERT_TRUE(control_->checkpoints().last().has_value());
  EXPECT_EQ(control_->checkpoints().last()->id(), 0u);
  EXPECT_EQ(control_->checkpoints().last()->shards_size(), 3);
  EXPECT_EQ(control_->checkpoints().last()->servers_size(), 0) << "checkpoint 0 is written by nobody";
  ASSERT_TRUE(control_->GetClusterMap(WorkerNode(0), &map).ok());
  EXPECT_EQ(map.map().version(), 1u);

  proto::RegisterWorkerRequest request;
  request.set_hostname("worker-host");
  AddSharedOptions(job_.SharedOptions(), request.mutable_job_options());
  proto::RegisterWorkerReply worker_reply;
  ASSERT_TRUE(control_->RegisterWorker(request, At(600), &worker_reply).ok());
  EXPECT_EQ(worker_reply.worker_id(), 0u);
  EXPECT_EQ(worker_reply.lease_ms(), kLeaseMs);
  EXPECT_EQ(worker_reply.heartbeat_ms(), 100u);
  EXPECT_EQ(worker_reply.job().job_id(), "job-1");
  ASSERT_EQ(AddWorker(At(600)), 1u);

  // Both workers take shards and commit them in 2-line pieces until the
  // pass is done; each GetShard and commit renews the worker's lease.
  int64_t ms = 600;
  std::set<uint32_t> finished;
  while (finished.size() < 2 && ms < 10'000) {
    for (uint32_t worker : {0u, 1u}) {
      ms += 50;
      if (!control_->over()) Beat(At(ms), {0, 1}, {});
      const proto::GetShardReply reply = GetShard(worker, At(ms));
      if (reply.action() == proto::GetShardReply::FINISHED) {
        finished.insert(worker);
        continue;
      }
      if (reply.action() == proto::GetShardReply::WAIT) {
        EXPECT_EQ(reply.retry_after_ms(), 25u);
        continue;
      }
      ASSERT_EQ(reply.action(), proto::GetShardReply::ASSIGNED);
      const proto::ShardAssignment& shard = reply.shard();
      EXPECT_EQ(shard.path(), "/data/train-0");
      for (uint64_t begin = shard.start(); begin < shard.end(); begin += 2 * kLineBytes) {
        const uint64_t lines = std::min<uint64_t>(2, (shard.end() - begin) / kLineBytes);
        proto::CommitProgressReply committed;
        ASSERT_TRUE(Commit(worker, CommitOf(shard, begin, lines), At(ms), &committed).ok());
        EXPECT_TRUE(committed.applied());
      }
    }
  }
  EXPECT_THAT(finished, ElementsAre(0u, 1u));
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFinished);
  EXPECT_EQ(control_->progress().records_trained(), 10u);
  EXPECT_EQ(control_->progress().ledger()[0].lines_committed(), 10u);
  ASSERT_EQ(events_.Count("job_finished"), 1u);
  EXPECT_EQ(events_.Named("job_finished")[0]["records_trained"], 10);

  bool ended = false;
  Take(&ended);
  EXPECT_TRUE(ended);
  Take(&ended);
  EXPECT_FALSE(ended) << "the end is reported once";

  // The job loop ends once every live peer heard it.
  EXPECT_FALSE(control_->Done(At(ms))) << "the servers have not heard yet";
  proto::HeartbeatReply beat;
  ASSERT_TRUE(ServerBeat(0, At(ms), &beat).ok());
  EXPECT_TRUE(beat.shutdown());
  EXPECT_EQ(beat.state(), proto::JOB_FINISHED);
  EXPECT_FALSE(control_->Done(At(ms)));
  ASSERT_TRUE(ServerBeat(1, At(ms)).ok());
  EXPECT_TRUE(control_->Done(At(ms)));
  EXPECT_EQ(control_->RegisterWorker(request, At(ms), &worker_reply).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Worker 0 takes and commits every shard of the pass, whole.
void CommitEveryShard(JobControlTest& test, const std::function<proto::GetShardReply()>& get,
                      const std::function<Status(const proto::CommitProgressRequest&)>& commit) {
  while (true) {
    const proto::GetShardReply reply = get();
    if (reply.action() != proto::GetShardReply::ASSIGNED) return;
    const uint64_t lines = (reply.shard().end() - reply.shard().start()) / kLineBytes;
    ASSERT_TRUE(commit(CommitOf(reply.shard(), reply.shard().start(), lines)).ok());
  }
}

TEST_F(JobControlTest, AJobWithAnExportFinishesOnlyOnceEveryServerWroteIt) {
  job_.job.export_dir = "/models/tiny";
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  EXPECT_FALSE(control_->NextExport(At(10)).has_value()) << "nothing to export yet";
  ASSERT_NO_FATAL_FAILURE(CommitEveryShard(
      *this, [&] { return GetShard(0, At(10)); },
      [&](const proto::CommitProgressRequest& commit) { return Commit(0, commit, At(10)); }));
  // The last pass is done: the job waits for the export, and says so.
  EXPECT_FALSE(control_->over());
  EXPECT_EQ(GetShard(1, At(20)).action(), proto::GetShardReply::WAIT);
  const std::vector<std::string> waits = control_->Waits(At(20));
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_THAT(waits[0], HasSubstr("export the model to /models/tiny"));
  // No checkpoint round starts meanwhile.
  Beat(At(61'000), {0, 1}, {0, 1});
  control_->Tick(At(61'000));
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_FALSE(control_->checkpoints().round_id().has_value());

  std::optional<JobControl::ExportWrite> write = control_->NextExport(At(61'030));
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->dir, "/models/tiny");
  EXPECT_EQ(write->servers.size(), 2u);
  EXPECT_EQ(write->attempt, 1u);
  proto::ExportReply part;
  part.set_rows(10);
  part.set_bytes(1000);
  // One server failed: the export is tried again.
  control_->Exported(*write, {part, absl::UnavailableError("ps[1]: disk full")}, absl::OkStatus(),
                     At(61'040));
  EXPECT_FALSE(control_->over());
  EXPECT_THAT(control_->Waits(At(61'040))[0], HasSubstr("disk full"));
  write = control_->NextExport(At(61'050));
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->attempt, 2u);
  control_->Exported(*write, {part, part}, absl::OkStatus(), At(61'060));
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFinished);
  ASSERT_EQ(events_.Count("model_exported"), 1u);
  EXPECT_EQ(events_.Named("model_exported")[0]["rows"], 20);
  EXPECT_EQ(events_.Count("export_failed"), 1u);
}

// An export needs no worker: workers gone while it is due do not stop the
// job (master.worker_wait_s).
TEST_F(JobControlTest, AnExportDueNeedsNoWorker) {
  job_.job.export_dir = "/models/tiny";
  job_.master.worker_wait_s = 5;
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_NO_FATAL_FAILURE(CommitEveryShard(
      *this, [&] { return GetShard(0, At(10)); },
      [&](const proto::CommitProgressRequest& commit) { return Commit(0, commit, At(10)); }));
  for (int64_t ms = 1000; ms <= 30'000; ms += 1000) {
    Beat(At(ms), {0, 1}, {});
    control_->Tick(At(ms));
  }
  EXPECT_EQ(control_->membership().alive_workers(), 0u);
  EXPECT_FALSE(control_->over()) << control_->progress().failure();
  EXPECT_TRUE(control_->NextExport(At(30'000)).has_value());
}

TEST_F(JobControlTest, AnExportThatKeepsFailingStopsTheJobResumably) {
  job_.job.export_dir = "/models/tiny";
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_NO_FATAL_FAILURE(CommitEveryShard(
      *this, [&] { return GetShard(0, At(10)); },
      [&](const proto::CommitProgressRequest& commit) { return Commit(0, commit, At(10)); }));
  for (uint32_t attempt = 1; attempt <= JobControl::kMaxExportAttempts; ++attempt) {
    std::optional<JobControl::ExportWrite> write = control_->NextExport(At(20 * attempt));
    ASSERT_TRUE(write.has_value()) << attempt;
    proto::ExportReply part;
    control_->Exported(*write, {part, part},
                       absl::UnavailableError("cannot write /models/tiny/manifest.json"),
                       At(20 * attempt + 10));
  }
  EXPECT_TRUE(control_->over());
  EXPECT_TRUE(control_->progress().stopped());
  EXPECT_THAT(control_->progress().failure(), HasSubstr("could not be exported to /models/tiny"));
  EXPECT_THAT(control_->progress().failure(), HasSubstr("manifest.json"));
  EXPECT_THAT(control_->progress().failure(), HasSubstr("--resume"));
}

TEST_F(JobControlTest, AWarmStartLoadsTheExportBeforeTrainingStarts) {
  job_.job.init_from = "/models/day1";
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
  control_->DataScanned(TinyData(), t0_);
  // Placed and scanned, but not training: the servers load the model first.
  EXPECT_EQ(control_->progress().phase(), JobPhase::kScanning);
  EXPECT_FALSE(control_->checkpoints().last().has_value());
  EXPECT_THAT(control_->Waits(At(10))[0], HasSubstr("load the model in /models/day1"));
  std::optional<JobControl::ImportWrite> write = control_->NextImport(At(10));
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->servers.size(), 2u);
  // A server still starting is not a failed attempt.
  control_->Imported(*write,
                     {uint64_t{5}, ErrorWithReason(absl::StatusCode::kUnavailable,
                                                   "no cluster map yet", proto::NOT_READY)},
                     At(20));
  write = control_->NextImport(At(30));
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->attempt, 1u);
  control_->Imported(*write, {absl::UnavailableError("disk"), uint64_t{5}}, At(40));
  write = control_->NextImport(At(50));
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->attempt, 2u);
  control_->Imported(*write, {uint64_t{7}, uint64_t{5}}, At(60));
  EXPECT_EQ(control_->progress().phase(), JobPhase::kTraining);
  ASSERT_TRUE(control_->checkpoints().last().has_value());
  EXPECT_EQ(control_->checkpoints().last()->id(), 0u);
  EXPECT_FALSE(control_->NextImport(At(70)).has_value());
  ASSERT_EQ(events_.Count("model_loaded"), 1u);
  EXPECT_EQ(events_.Named("model_loaded")[0]["rows"], 12);
}

TEST_F(JobControlTest, AWarmStartThatCannotLoadFailsTheJobNamingTheCause) {
  job_.job.init_from = "/models/day1";
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
  control_->DataScanned(TinyData(), t0_);
  for (uint32_t attempt = 1; attempt <= JobControl::kMaxExportAttempts; ++attempt) {
    std::optional<JobControl::ImportWrite> write = control_->NextImport(At(10 * attempt));
    ASSERT_TRUE(write.has_value());
    control_->Imported(*write, {absl::UnavailableError("cannot stat /models/day1"), uint64_t{0}},
                       At(10 * attempt + 5));
  }
  EXPECT_TRUE(control_->over());
  EXPECT_FALSE(control_->progress().stopped());
  EXPECT_THAT(control_->progress().failure(), HasSubstr("ps[0]: cannot stat /models/day1"));
}

// Issue 49: an export a server refuses as such is not tried again.
TEST_F(JobControlTest, AWarmStartAServerRefusesStopsTheJobAtOnce) {
  job_.job.init_from = "/models/day1";
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
  control_->DataScanned(TinyData(), t0_);
  std::optional<JobControl::ImportWrite> write = control_->NextImport(At(10));
  ASSERT_TRUE(write.has_value());
  control_->Imported(*write,
                     {absl::InvalidArgumentError("job.init_from: no embedding table 'emb'"),
                      uint64_t{0}},
                     At(15));
  EXPECT_TRUE(control_->over());
  EXPECT_TRUE(control_->progress().stopped());
  EXPECT_THAT(control_->progress().failure(), HasSubstr("ps[0]: job.init_from: no embedding table"));
  EXPECT_FALSE(control_->NextImport(At(20)).has_value());
  EXPECT_FALSE(control_->checkpoints().last().has_value());
}

// Issue 49: the master's own check of the export (ValidateModelExport)
// stops the job before any server is asked to load it.
TEST_F(JobControlTest, AWarmStartTheMasterRefusesStopsTheJobNamingTheFile) {
  job_.job.init_from = "/models/day1";
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, t0_).ok());
  control_->DataScanned(TinyData(), t0_);
  std::optional<JobControl::ImportWrite> write = control_->NextImport(At(10));
  ASSERT_TRUE(write.has_value());
  control_->ImportChecked(*write, absl::OkStatus(), At(11));
  EXPECT_FALSE(control_->over());
  control_->ImportChecked(
      *write, absl::DataLossError("/models/day1/params/emb/part-0.keys.npy is a FIFO"), At(12));
  EXPECT_TRUE(control_->over());
  EXPECT_TRUE(control_->progress().stopped());
  EXPECT_THAT(control_->progress().failure(),
              HasSubstr("job.init_from: /models/day1/params/emb/part-0.keys.npy is a FIFO"));
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFailed);
  EXPECT_FALSE(control_->NextImport(At(20)).has_value());
  EXPECT_EQ(events_.Count("model_loaded"), 0u);
}

TEST_F(JobControlTest, ServerLostBeforeTrainingOnlyFreesItsSlot) {
  control_->StartNew("job-1");
  ASSERT_TRUE(RegisterServer(5000, 100, std::nullopt, t0_).ok());
  control_->ExpireLeases(At(kLeaseMs + 1));
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_TRUE(control_->membership().servers().empty());
  EXPECT_FALSE(control_->over());

  ASSERT_TRUE(RegisterServer(5001, 101, std::nullopt, At(2000)).ok());
  ASSERT_TRUE(RegisterServer(5002, 102, std::nullopt, At(2000)).ok());
  control_->DataScanned(TinyData(), At(2000));
  EXPECT_EQ(control_->progress().phase(), JobPhase::kTraining);
  EXPECT_EQ(control_->membership().cluster_map().version(), 1u);
}

TEST_F(JobControlTest, AFailedScanFailsTheJob) {
  control_->StartNew("job-1");
  control_->DataScanned(absl::NotFoundError("data.train: no file matches /data/*.tsv"), t0_);
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFailed);
  EXPECT_EQ(control_->progress().failure(), "data.train: no file matches /data/*.tsv");
  EXPECT_FALSE(control_->progress().stopped());
  bool ended = false;
  Take(&ended);
  EXPECT_TRUE(ended);
}

// --- Interleavings ---------------------------------------------------------------

// (a) A server lost while the servers write a checkpoint: the round fails,
// the previous checkpoint stands, and the job is restored.
TEST_F(JobControlTest, ServerLostWhileWritingACheckpointFailsTheRound) {
  StartTraining();
  const proto::ShardAssignment shard = Assigned(0, At(100));
  ASSERT_TRUE(Commit(0, CommitOf(shard, shard.start(), 1), At(100)).ok());

  ASSERT_EQ(control_->RequestCheckpoint().value(), 1u);
  control_->Tick(At(200));
  ASSERT_EQ(control_->checkpoints().round_id(), 1u);
  proto::HeartbeatReply beat;
  ASSERT_TRUE(WorkerBeat(0, At(200), /*paused_for=*/0, &beat).ok());
  EXPECT_EQ(beat.pause_for_checkpoint(), 1u);
  EXPECT_FALSE(control_->NextCheckpointWrite(At(200)).has_value()) << "no worker paused yet";
  ASSERT_TRUE(WorkerBeat(0, At(300), /*paused_for=*/1).ok());
  EXPECT_FALSE(control_->NextCheckpointWrite(At(300)).has_value()) << "worker 1 is not paused";
  ASSERT_TRUE(WorkerBeat(1, At(300), /*paused_for=*/1).ok());
  const std::optional<JobControl::CheckpointWrite> write = control_->NextCheckpointWrite(At(300));
  ASSERT_TRUE(write.has_value());
  EXPECT_EQ(write->write.id, 1u);
  EXPECT_THAT(write->write.keep, IsEmpty());
  EXPECT_THAT(write->servers,
              ElementsAre(Pair(0u, Endpoint(5000)), Pair(1u, Endpoint(5001))));
  EXPECT_TRUE(control_->checkpoints().writing());
  // No shard is handed out while the servers write.
  EXPECT_EQ(GetShard(1, At(300)).action(), proto::GetShardReply::WAIT);

  // ps[1] stops heartbeating while it writes.
  ASSERT_TRUE(ServerBeat(0, At(1100)).ok());
  ASSERT_TRUE(WorkerBeat(0, At(1100), 1).ok());
  ASSERT_TRUE(WorkerBeat(1, At(1100), 1).ok());
  control_->ExpireLeases(At(1200));
  ASSERT_TRUE(control_->recovery().active());
  EXPECT_EQ(control_->recovery().why(), "ps[1] stopped heartbeating");
  EXPECT_TRUE(control_->checkpoints().writing()) << "a round writing waits for its servers";
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kFenced);
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kFenced);

  std::vector<StatusOr<proto::ServerCheckpoint>> parts;
  parts.push_back(Part(0, 1, 1000));
  parts.push_back(absl::UnavailableError("ps[1] at tcp://127.0.0.1:5001: connection lost"));
  StateUpdate update;
  EXPECT_FALSE(
      control_->CheckpointWritten(*write, std::move(parts), At(300), At(1300), &update)
          .has_value());
  EXPECT_TRUE(update.empty());
  EXPECT_EQ(control_->checkpoints().failed(), 1u);
  EXPECT_EQ(control_->checkpoints().written(), 0u);
  EXPECT_FALSE(control_->checkpoints().round_id().has_value());
  ASSERT_TRUE(control_->checkpoints().last().has_value());
  EXPECT_EQ(control_->checkpoints().last()->id(), 0u) << "the previous checkpoint stands";
  const nlohmann::json* result = control_->checkpoints().Result(1);
  ASSERT_NE(result, nullptr);
  EXPECT_THAT((*result)["error"].get<std::string>(), HasSubstr("connection lost"));
  EXPECT_THAT((*result)["error"].get<std::string>(), HasSubstr("the previous checkpoint stands"));
  EXPECT_TRUE(control_->recovery().active());
  ASSERT_EQ(events_.Count("recovery_started"), 1u);
  EXPECT_EQ(events_.Named("recovery_started")[0]["checkpoint"], 0);
  EXPECT_EQ(events_.Named("recovery_started")[0]["server"], 1);

  // Its workers were fenced: their calls are refused.
  proto::GetShardReply reply;
  Status fenced = control_->GetShard(WorkerNode(0), At(1300), &reply);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(fenced), proto::FENCED);
}

// (b) A worker's lease runs out: its shard stays with it until every
// server refuses its pushes, then goes back from its committed offset.
TEST_F(JobControlTest, DeadWorkersShardMovesOnlyOnceItsFenceIsAcknowledged) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 1), t0_).ok());
  const proto::ShardAssignment b = Assigned(1, t0_);

  // Worker 0 falls silent.
  Beat(At(700), {0, 1}, {1});
  Beat(At(1100), {0, 1}, {1});
  control_->Tick(At(1100));
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kDead);
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kAlive);
  EXPECT_THAT(control_->membership().fenced(), ElementsAre(0u));
  EXPECT_FALSE(control_->recovery().active()) << "a worker's death needs no recovery";

  const std::optional<Membership::FenceRound> first = control_->PendingFences();
  ASSERT_TRUE(first.has_value());
  EXPECT_THAT(first->fenced, ElementsAre(0u));
  EXPECT_THAT(first->servers, ElementsAre(Pair(0u, Endpoint(5000)), Pair(1u, Endpoint(5001))));

  // Before the servers acknowledge, worker 0 might still push: its shard
  // stays DOING and is not handed to anyone else.
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kDoing);
  EXPECT_EQ(ShardState(a.shard_id()).holder, 0u);
  const uint32_t w2 = AddWorker(At(1100));
  const proto::ShardAssignment c = Assigned(w2, At(1100));
  EXPECT_NE(c.shard_id(), a.shard_id());
  EXPECT_NE(c.shard_id(), b.shard_id());
  ASSERT_TRUE(Commit(w2, CommitOf(c, c.start(), c.records()), At(1100)).ok());
  EXPECT_EQ(GetShard(w2, At(1100)).action(), proto::GetShardReply::WAIT);

  // Worker 1 falls silent too, after the first round was taken.
  Beat(At(2200), {0, 1}, {w2});
  control_->Tick(At(2200));
  EXPECT_EQ(control_->membership().workers().at(1).state, PeerState::kDead);
  EXPECT_THAT(control_->membership().fenced(), ElementsAre(0u, 1u));

  // The first round releases worker 0 only.
  control_->FencesAcknowledged(*first, At(2200));
  EXPECT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kTodo);
  EXPECT_EQ(ShardState(b.shard_id()).state, ShardTracker::State::kDoing);
  EXPECT_EQ(ShardState(b.shard_id()).holder, 1u);
  ASSERT_EQ(events_.Count("shard_reassigned"), 1u);
  const nlohmann::json moved = events_.Named("shard_reassigned")[0];
  EXPECT_EQ(moved["shard"], a.shard_id());
  EXPECT_EQ(moved["from_worker"], 0);
  EXPECT_EQ(moved["reason"], "fenced");
  EXPECT_EQ(moved["since_last_seen_ms"], 2200.0) << "from its last sign of life at t0";
  EXPECT_EQ(control_->progress().worst_reassign_delay(), absl::Milliseconds(2200));

  const proto::ShardAssignment resumed = Assigned(w2, At(2200));
  EXPECT_EQ(resumed.shard_id(), a.shard_id());
  EXPECT_EQ(resumed.start(), a.start() + kLineBytes) << "from its committed offset";
  EXPECT_EQ(resumed.start_line(), a.start_line() + 1);
  EXPECT_EQ(resumed.records(), a.records() - 1);

  const std::optional<Membership::FenceRound> second = control_->PendingFences();
  ASSERT_TRUE(second.has_value());
  EXPECT_THAT(second->fenced, ElementsAre(0u, 1u));
  control_->FencesAcknowledged(*second, At(2300));
  EXPECT_EQ(ShardState(b.shard_id()).state, ShardTracker::State::kTodo);
  EXPECT_FALSE(control_->PendingFences().has_value());
  const proto::ShardAssignment b_again = Assigned(w2, At(2300));
  EXPECT_EQ(b_again.shard_id(), b.shard_id());
  EXPECT_EQ(b_again.start(), b.start());
  EXPECT_EQ(control_->progress().records_trained(), 1u + c.records());
}

// (c) A server lost while a checkpoint round waits for the workers to
// pause: the round is abandoned, the workers fenced, and once the slot is
// filled and fenced every server returns to the last checkpoint.
TEST_F(JobControlTest, RecoveryDuringACheckpointRoundRollsBack) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, At(100));
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 2), At(100)).ok());

  // Checkpoint 1: two lines trained, shard a half done by worker 0.
  proto::CheckpointRecord record;
  ASSERT_NO_FATAL_FAILURE(RecordCheckpoint(1, At(200), &record));
  EXPECT_EQ(record.master().records_trained(), 2u);
  EXPECT_EQ(record.bytes(), 3000u);
  EXPECT_EQ(control_->checkpoints().written(), 1u);

  // Training goes on: worker 0 finishes a and starts c, worker 1 starts b.
  Beat(At(300), {}, {0, 1});
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start() + 2 * kLineBytes, 2), At(300)).ok());
  const proto::ShardAssignment b = Assigned(1, At(300));
  ASSERT_TRUE(Commit(1, CommitOf(b, b.start(), 1), At(300)).ok());
  const proto::ShardAssignment c = Assigned(0, At(300));
  ASSERT_TRUE(Commit(0, CommitOf(c, c.start(), 1), At(300)).ok());
  ASSERT_EQ(control_->progress().records_trained(), 6u);

  // Checkpoint 2 starts; only worker 0 pauses.
  ASSERT_EQ(control_->RequestCheckpoint().value(), 2u);
  control_->Tick(At(400));
  ASSERT_EQ(control_->checkpoints().round_id(), 2u);
  ASSERT_TRUE(WorkerBeat(0, At(400), 2).ok());
  EXPECT_FALSE(control_->NextCheckpointWrite(At(400)).has_value());

  // ps[1] stops heartbeating.
  ASSERT_TRUE(ServerBeat(0, At(1100)).ok());
  ASSERT_TRUE(WorkerBeat(0, At(1100), 2).ok());
  ASSERT_TRUE(WorkerBeat(1, At(1100), 0).ok());
  control_->Tick(At(1300));
  ASSERT_TRUE(control_->recovery().active());
  EXPECT_TRUE(control_->recovery().rollback());
  EXPECT_FALSE(control_->checkpoints().round_id().has_value());
  EXPECT_EQ(control_->checkpoints().failed(), 1u);
  ASSERT_NE(control_->checkpoints().Result(2), nullptr);
  EXPECT_EQ((*control_->checkpoints().Result(2))["error"],
            "abandoned: ps[1] stopped heartbeating");
  EXPECT_EQ(control_->checkpoints().last()->id(), 1u);

  // The workers are fenced; a new one waits; no checkpoint may start.
  proto::GetShardReply shard_reply;
  Status fenced = control_->GetShard(WorkerNode(1), At(1300), &shard_reply);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(fenced), proto::FENCED);
  EXPECT_THAT(fenced.message(), HasSubstr("a parameter server was lost (ps[1] stopped heartbeating)"));
  const uint32_t w2 = AddWorker(At(1300));
  EXPECT_EQ(GetShard(w2, At(1300)).action(), proto::GetShardReply::WAIT);
  proto::GetClusterMapReply map;
  Status not_ready = control_->GetClusterMap(WorkerNode(w2), &map);
  EXPECT_EQ(not_ready.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(not_ready), proto::NOT_READY);
  EXPECT_TRUE(control_->GetClusterMap(ServerNode(0), &map).ok()) << "servers still get the map";
  EXPECT_EQ(control_->RequestCheckpoint().status().code(), absl::StatusCode::kFailedPrecondition);
  // A checkpoint is due by now (interval 60 s), but none starts.
  const int64_t later = 61'000;
  Beat(At(later), {0}, {w2});
  control_->Tick(At(later));
  EXPECT_FALSE(control_->checkpoints().round_id().has_value()) << "no round during a recovery";
  EXPECT_FALSE(control_->NextRestore(At(later)).has_value()) << "ps[1] is missing";

  // ps[1] restarts on its data dir; the fences must reach it first.
  proto::RegisterServerReply registered;
  ASSERT_TRUE(RegisterServer(6001, 201, /*stored=*/1, At(later + 100), &registered).ok());
  EXPECT_EQ(registered.server_id(), 1u);
  EXPECT_EQ(control_->membership().cluster_map().version(), 2u);
  EXPECT_FALSE(control_->NextRestore(At(later + 100)).has_value()) << "fences pending";
  const std::optional<Membership::FenceRound> round = control_->PendingFences();
  ASSERT_TRUE(round.has_value());
  EXPECT_THAT(round->fenced, ElementsAre(0u, 1u));
  EXPECT_THAT(round->servers, ElementsAre(Pair(0u, Endpoint(5000)), Pair(1u, Endpoint(6001))));
  control_->FencesAcknowledged(*round, At(later + 200));
  EXPECT_EQ(ShardState(c.shard_id()).state, ShardTracker::State::kDoing)
      << "a rollback replaces the pass instead of moving shards";

  const std::optional<Recovery::Step> step = control_->NextRestore(At(later + 200));
  ASSERT_TRUE(step.has_value());
  ASSERT_EQ(step->kind, Recovery::Step::Kind::kRestore);
  ASSERT_EQ(step->targets.size(), 2u);
  EXPECT_EQ(step->targets[0].slot, 0u);
  EXPECT_EQ(step->targets[0].path, "/ckpt/ps-0/1");
  EXPECT_EQ(step->targets[1].slot, 1u);
  EXPECT_EQ(step->targets[1].endpoint, Endpoint(6001));
  EXPECT_EQ(step->targets[1].path, "/ckpt/ps-1/1");

  control_->Restored(*step, {StatusOr<uint64_t>(1000), StatusOr<uint64_t>(2000)},
                     At(later + 200), At(later + 300));
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_EQ(control_->progress().records_trained(), 2u);
  EXPECT_EQ(control_->progress().records_retrained(), 4u);
  EXPECT_EQ(control_->progress().tracker()->committed_lines(), 2u);
  const nlohmann::json& last = control_->recovery().last();
  EXPECT_EQ(last["mode"], "rollback");
  EXPECT_EQ(last["checkpoint"], 1);
  EXPECT_EQ(last["records_rolled_back"], 4);
  EXPECT_EQ(last["bytes"], 3000);
  EXPECT_EQ(last["servers_restored"], nlohmann::json({0, 1}));
  EXPECT_EQ(events_.Count("recovered"), 1u);

  // Training resumes from the checkpoint: shard a from its 2 lines.
  ASSERT_TRUE(control_->GetClusterMap(WorkerNode(w2), &map).ok());
  EXPECT_EQ(map.map().version(), 2u);
  const proto::ShardAssignment again = Assigned(w2, At(later + 300));
  EXPECT_EQ(again.shard_id(), a.shard_id());
  EXPECT_EQ(again.start(), a.start() + 2 * kLineBytes);
  EXPECT_EQ(again.records(), 2u);
}

// The fence round goes out without the master's lock. A slot filled while
// it is out never received it: the recovery must not restore before it has.
// FAILS at the time of writing (Membership::FencesAcknowledged; see the
// report).
TEST_F(JobControlTest, FenceRoundTakenBeforeAReplacementDoesNotCoverIt) {
  StartTraining();
  Beat(At(900), {0}, {0, 1});
  control_->ExpireLeases(At(1100));
  ASSERT_TRUE(control_->recovery().active());
  const std::optional<Membership::FenceRound> round = control_->PendingFences();
  ASSERT_TRUE(round.has_value());
  ASSERT_THAT(round->servers, ElementsAre(Pair(0u, Endpoint(5000))));

  ASSERT_TRUE(RegisterServer(6001, 201, /*stored=*/1, At(1200)).ok());
  control_->FencesAcknowledged(*round, At(1300));  // ps[0] acknowledged
  EXPECT_FALSE(control_->NextRestore(At(1300)).has_value())
      << "ps[1]'s new process does not refuse the fenced workers yet";
  const std::optional<Membership::FenceRound> again = control_->PendingFences();
  ASSERT_TRUE(again.has_value());
  EXPECT_THAT(again->servers, ElementsAre(Pair(0u, Endpoint(5000)), Pair(1u, Endpoint(6001))));
}

TEST_F(JobControlTest, RestoreFailureStopsTheJobResumably) {
  StartTraining();
  Beat(At(900), {0}, {0, 1});
  control_->ExpireLeases(At(1100));
  ASSERT_TRUE(control_->recovery().active());
  ASSERT_TRUE(RegisterServer(6001, 201, /*stored=*/1, At(1200)).ok());
  control_->FencesAcknowledged(*control_->PendingFences(), At(1200));
  const std::optional<Recovery::Step> step = control_->NextRestore(At(1200));
  ASSERT_TRUE(step.has_value());
  // A server still starting: try again.
  control_->Restored(*step,
                     {StatusOr<uint64_t>(0),
                      StatusOr<uint64_t>(ErrorWithReason(absl::StatusCode::kUnavailable,
                                                         "opening", proto::NOT_READY))},
                     At(1200), At(1300));
  EXPECT_TRUE(control_->recovery().active());
  EXPECT_FALSE(control_->over());
  control_->Restored(*step, {StatusOr<uint64_t>(0), StatusOr<uint64_t>(absl::InternalError("bad"))},
                     At(1300), At(1400));
  EXPECT_EQ(control_->progress().phase(), JobPhase::kFailed);
  EXPECT_TRUE(control_->progress().stopped()) << "--resume continues it";
  EXPECT_THAT(control_->progress().failure(), HasSubstr("cannot restore ps[1] to checkpoint 0"));
}

// Every call of a worker that JobControl accepts renews its lease (the
// handlers go through Membership::LiveWorker or WorkerHeartbeat): a worker
// that makes one call of each kind in turn, each within a lease of the
// last, stays alive; silent for a lease, it dies.
TEST_F(JobControlTest, EveryWorkerCallRenewsTheLease) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  proto::ShardUnreadableRequest report;
  report.set_shard_id(a.shard_id());
  report.set_epoch(a.epoch());
  report.set_phase(a.phase());
  report.set_offset(a.start() + kLineBytes);
  report.set_line(a.start_line() + 1);
  report.set_error("test: not read");
  proto::SplitShardRequest split;
  split.set_shard_id(a.shard_id());
  split.set_epoch(a.epoch());
  split.set_phase(a.phase());
  split.set_split_offset(a.start() + 2 * kLineBytes);
  split.set_split_line(a.start_line() + 2);
  const std::vector<std::pair<std::string, std::function<Status(absl::Time)>>> calls = {
      {"GET_SHARD",
       [&](absl::Time now) {
         proto::GetShardReply reply;
         return control_->GetShard(WorkerNode(0), now, &reply);
       }},
      {"COMMIT_PROGRESS",
       [&](absl::Time now) { return Commit(0, CommitOf(a, a.start(), 1), now); }},
      {"SPLIT_SHARD",
       [&](absl::Time now) {
         proto::SplitShardReply reply;
         return control_->SplitShard(WorkerNode(0), split, now, &reply);
       }},
      {"SHARD_UNREADABLE",
       [&](absl::Time now) {
         proto::ShardUnreadableReply reply;
         return control_->UnreadableShard(WorkerNode(0), report, now, &reply).status();
       }},
      {"HEARTBEAT", [&](absl::Time now) { return WorkerBeat(0, now); }},
  };
  int64_t ms = 0;
  for (const auto& [name, call] : calls) {
    ms += 900;
    Beat(At(ms), {0, 1}, {1});
    ASSERT_TRUE(call(At(ms)).ok()) << name;
    control_->Tick(At(ms + 500));
    EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kAlive)
        << "the lease " << name << " renewed ran out";
  }
  Beat(At(ms + 1100), {0, 1}, {1});
  control_->Tick(At(ms + 1100));
  EXPECT_EQ(control_->membership().workers().at(0).state, PeerState::kDead);
}

// (d) A commit from a worker fenced meanwhile changes nothing.
TEST_F(JobControlTest, CommitFromAFencedWorkerIsRefused) {
  StartTraining();
  const proto::ShardAssignment a = Assigned(0, t0_);
  ASSERT_TRUE(Commit(0, CommitOf(a, a.start(), 1), t0_).ok());
  Beat(At(800), {0, 1}, {1});
  control_->Tick(At(1100));
  ASSERT_TRUE(control_->membership().IsFenced(0));
  // Its shard is still DOING (the fence is not acknowledged), so only the
  // fence stops the commit.
  ASSERT_EQ(ShardState(a.shard_id()).state, ShardTracker::State::kDoing);

  proto::CommitProgressReply reply;
  Status refused = Commit(0, CommitOf(a, a.start() + kLineBytes, 1), At(1200), &reply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), proto::FENCED);
  EXPECT_FALSE(reply.applied());
  EXPECT_EQ(control_->progress().records_trained(), 1u);
  EXPECT_EQ(control_->progress().ledger()[0].lines_committed(), 1u);
  EXPECT_EQ(ShardState(a.shard_id()).committed_offset, a.start() + kLineBytes);
  EXPECT_EQ(control_->membership().workers().at(0).records, 1u);
  Status beat = WorkerBeat(0, At(1200));
  EXPECT_EQ(ReasonOf(beat), proto::FENCED);
}

// --- Persistence -----------------------------------------------------------------

}  // namespace
}  // namespace eps
