// Tests master/master.h: the Master service over real RPC (a lost server,
// --resume, stopping the job).
// The fixture is in tests/master/master_fixture.h.

#include "tests/master/master_fixture.h"

namespace eps {
namespace {

// A server that misses its lease: every worker is fenced, the job waits
// for a server to take the slot, then every server restores the last
// complete checkpoint and the data progress returns to it.
TEST_F(MasterTest, LostServerRollsTheJobBackToTheLastCheckpoint) {
  const std::string train = Write("train.tsv", CriteoText(40, /*seed=*/2));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.checkpoint.interval_s = 1;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/1);
  ASSERT_GE(pieces.size(), 3u);
  ASSERT_TRUE(*worker->Commit(shard, pieces[0]));
  // Checkpoint 1 holds piece 0; later rounds fail.
  std::vector<FakePeer*> alive = ServerPtrs();
  ASSERT_TRUE(Eventually(
      [&] {
        StatusOr<proto::HeartbeatReply> reply = worker->Heartbeat(0, /*paused_for=*/1);
        return Doc()["checkpoints"]["written"] == 1;
      },
      alive));
  {
    absl::MutexLock lock(&fenced_mu_);
    refuse_checkpoints_[0] = true;
  }
  ASSERT_TRUE(*worker->Commit(shard, pieces[1]));
  ASSERT_TRUE(*worker->Commit(shard, pieces[2]));
  EXPECT_EQ(Doc()["records_trained"], 3);

  // ps[1] goes silent: the recovery starts and waits for a server.
  ASSERT_TRUE(Eventually([&] { return !Doc()["recovery"]["in_progress"].is_null(); },
                         {servers_[0].get()}));
  json doc = Doc();
  EXPECT_EQ(doc["servers"][1]["state"], "dead");
  EXPECT_EQ(doc["recovery"]["in_progress"]["checkpoint"], 1);
  EXPECT_EQ(doc["recovery"]["in_progress"]["waiting_for_servers"], json::array({1}));
  EXPECT_EQ(doc["state"], "running");
  // The worker is fenced; a new one gets neither the map nor a shard yet.
  ExpectCode(worker->Heartbeat().status(), absl::StatusCode::kFailedPrecondition, proto::FENCED);
  std::unique_ptr<FakePeer> next = Peer();
  ASSERT_TRUE(next->RegisterWorker().ok());
  ExpectCode(next->GetClusterMap().status(), absl::StatusCode::kUnavailable, proto::NOT_READY);
  StatusOr<proto::GetShardReply> held = next->GetShard();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->action(), proto::GetShardReply::WAIT);
  EXPECT_TRUE(RestoresSeen(0).empty());
  // An operator's checkpoint is refused at once, not left waiting.
  httplib::Client http(master_->http_url());
  httplib::Result posted = http.Post("/checkpoint", "", "text/plain");
  ASSERT_TRUE(posted) << httplib::to_string(posted.error());
  EXPECT_EQ(posted->status, 409);
  EXPECT_THAT(posted->body, HasSubstr("being restored"));

  // A fresh server takes the dead one's slot; both restore checkpoint 1.
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(2));
  EXPECT_EQ(servers_.back()->id(), 1u);
  // The old ps[1] process, back from a partition, cannot keep the slot's
  // lease alive: it was replaced.
  ExpectCode(servers_[1]->Heartbeat(0, 0, fake_server_listeners_[1]->endpoint()).status(),
             absl::StatusCode::kFailedPrecondition, proto::FENCED);
  EXPECT_TRUE(servers_[2]->Heartbeat(0, 0, fake_server_listeners_[2]->endpoint()).ok());
  alive = {servers_[0].get(), servers_[2].get(), next.get()};
  ASSERT_TRUE(Eventually([&] { return Doc()["recovery"]["in_progress"].is_null(); }, alive));
  EXPECT_EQ(RestoresSeen(0),
            (std::vector<std::pair<uint64_t, std::string>>{{1, "/fake-ps0/checkpoints/1"}}));
  EXPECT_EQ(RestoresSeen(2),
            (std::vector<std::pair<uint64_t, std::string>>{{1, "/fake-ps1/checkpoints/1"}}));
  doc = Doc();
  EXPECT_EQ(doc["records_trained"], 1);
  EXPECT_EQ(doc["recovery"]["recoveries"], 1);
  EXPECT_EQ(doc["recovery"]["last"]["records_rolled_back"], 2);
  EXPECT_EQ(doc["recovery"]["last"]["mode"], "rollback");
  EXPECT_EQ(doc["servers"][1]["state"], "alive");
  StatusOr<proto::GetClusterMapReply> map = next->GetClusterMap();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->map().servers(1).endpoint(), fake_server_listeners_[2]->endpoint());
  EXPECT_GT(map->map().version(), 1u);
  // The shard resumes where checkpoint 1 had it: after piece 0.
  const proto::ShardAssignment resumed = TakeShard(*next);
  EXPECT_EQ(resumed.shard_id(), shard.shard_id());
  EXPECT_EQ(resumed.start(), pieces[1].begin);
  EXPECT_EQ(Events("server_dead").size(), 1u);
  ASSERT_EQ(Events("recovered").size(), 1u);
  EXPECT_EQ(Events("recovered")[0]["checkpoint"], 1);
}

// Before the first written checkpoint, checkpoint 0 (training starting)
// stands: servers restore it empty; with checkpoint.on_server_failure =
// continue only the new server restores and the progress stays.
TEST_F(MasterTest, LostServerBeforeAnyCheckpointRestoresTheStart) {
  for (const std::string mode : {"rollback", "continue"}) {
    SCOPED_TRACE(mode);
    master_.reset();
    servers_.clear();
    fake_server_listeners_.clear();
    {
      absl::MutexLock lock(&fenced_mu_);
      for (auto& seen : restores_seen_) seen.clear();
    }
    std::filesystem::remove_all(dir_ + "/master");
    const std::string train = Write("train.tsv", CriteoText(20, /*seed=*/3));
    MasterOptions options = Options();
    options.job.data.train = train;
    options.job.checkpoint.on_server_failure = mode;
    ASSERT_NO_FATAL_FAILURE(StartMaster(options));
    ASSERT_NO_FATAL_FAILURE(RegisterServers());
    ASSERT_TRUE(WaitForPhase("training"));
    std::unique_ptr<FakePeer> worker = Peer();
    ASSERT_TRUE(worker->RegisterWorker().ok());
    const proto::ShardAssignment shard = TakeShard(*worker);
    const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/2);
    ASSERT_TRUE(*worker->Commit(shard, pieces[0]));
    ASSERT_TRUE(Eventually([&] { return !Doc()["recovery"]["in_progress"].is_null(); },
                           {servers_[0].get()}));
    ASSERT_NO_FATAL_FAILURE(AddFakeServer(2));
    std::vector<FakePeer*> alive = {servers_[0].get(), servers_[2].get()};
    ASSERT_TRUE(Eventually([&] { return Doc()["recovery"]["in_progress"].is_null(); }, alive));
    const std::vector<std::pair<uint64_t, std::string>> empty = {{0, ""}};
    EXPECT_EQ(RestoresSeen(2), empty);
    std::unique_ptr<FakePeer> next = Peer();
    ASSERT_TRUE(next->RegisterWorker().ok());
    const proto::ShardAssignment resumed = TakeShard(*next);
    EXPECT_EQ(resumed.shard_id(), shard.shard_id());
    if (mode == "rollback") {
      EXPECT_EQ(RestoresSeen(0), empty);
      EXPECT_EQ(Doc()["records_trained"], 0);
      EXPECT_EQ(resumed.start(), shard.start());
    } else {
      EXPECT_TRUE(RestoresSeen(0).empty());
      EXPECT_EQ(Doc()["records_trained"], pieces[0].lines);
      EXPECT_EQ(resumed.start(), pieces[0].end);
    }
  }
}

// A server restarted on its data dir takes its own slot back, even before
// its old lease ran out; one claiming a slot the job never had is refused.
TEST_F(MasterTest, RestartedServerTakesItsSlotBack) {
  const std::string train = Write("train.tsv", CriteoText(20, /*seed=*/4));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> stranger = Peer();
  const Status refused = stranger->RegisterServer("tcp://127.0.0.1:1", 77, /*stored_id=*/7);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("ps[7]"));
  // ps[0] restarts (a new pid) at once.
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(2, /*stored_id=*/0));
  EXPECT_EQ(servers_.back()->id(), 0u);
  std::vector<FakePeer*> alive = {servers_[1].get(), servers_[2].get()};
  ASSERT_TRUE(Eventually(
      [&] { return Doc()["recovery"]["recoveries"] == 1 && Doc()["recovery"]["in_progress"].is_null(); },
      alive));
  EXPECT_EQ(RestoresSeen(2).size(), 1u);
  EXPECT_EQ(RestoresSeen(1).size(), 1u);
  // The events log is written at the end of the job loop's tick.
  ASSERT_TRUE(Eventually([&] { return Events("server_dead").size() == 1; }, alive));
  EXPECT_EQ(Events("server_dead")[0]["reason"], "restarted");
  EXPECT_EQ(Doc()["state"], "running");
}

// --resume: a stopped job starts again from its last checkpoint once every
// server slot is back and restored.
TEST_F(MasterTest, ResumeContinuesAStoppedJobFromItsLastCheckpoint) {
  const std::string train = Write("train.tsv", CriteoText(40, /*seed=*/5));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.checkpoint.interval_s = 1;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/1);
  ASSERT_TRUE(*worker->Commit(shard, pieces[0]));
  ASSERT_TRUE(Eventually(
      [&] {
        StatusOr<proto::HeartbeatReply> reply = worker->Heartbeat(0, /*paused_for=*/1);
        return Doc()["checkpoints"]["written"] == 1;
      },
      ServerPtrs()));
  {
    absl::MutexLock lock(&fenced_mu_);
    refuse_checkpoints_[0] = true;
  }
  ASSERT_TRUE(*worker->Commit(shard, pieces[1]));
  master_->RequestStop("stopped by SIGTERM");
  Beat(ServerPtrs());
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(FinalStatus()["resumable"], true);
  master_.reset();

  MasterOptions resume = options;
  resume.resume = true;
  ASSERT_NO_FATAL_FAILURE(StartMaster(resume));
  json doc = Doc();
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["recovery"]["in_progress"]["checkpoint"], 1);
  // The servers come back on their data dirs (new processes).
  servers_.clear();
  fake_server_listeners_.clear();
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(0, /*stored_id=*/0));
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(1, /*stored_id=*/1));
  ASSERT_TRUE(Eventually([&] { return Doc()["recovery"]["in_progress"].is_null(); },
                         ServerPtrs()));
  EXPECT_EQ(RestoresSeen(0).back(), (std::pair<uint64_t, std::string>{1, "/fake-ps0/checkpoints/1"}));
  EXPECT_EQ(RestoresSeen(1).back(), (std::pair<uint64_t, std::string>{1, "/fake-ps1/checkpoints/1"}));
  doc = Doc();
  EXPECT_EQ(doc["records_trained"], 1);
  EXPECT_EQ(doc["phase"], "training");
  // The old worker is fenced at every server; a new one resumes the shard.
  EXPECT_TRUE(FencedSeen(0).contains(worker->id()));
  std::unique_ptr<FakePeer> next = Peer();
  ASSERT_TRUE(next->RegisterWorker().ok());
  const proto::ShardAssignment resumed = TakeShard(*next);
  EXPECT_EQ(resumed.shard_id(), shard.shard_id());
  EXPECT_EQ(resumed.start(), pieces[1].begin);
  EXPECT_EQ(Events("job_resuming").size(), 1u);
}

// After a machine restart (master killed, not stopped), a server that
// registers again on its data dir is a new process: the job rolls back
// even though this master never saw the old one die.
TEST_F(MasterTest, ServerRegisteringAfterAMasterRestartRollsTheJobBack) {
  const std::string train = Write("train.tsv", CriteoText(20, /*seed=*/6));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/2);
  ASSERT_TRUE(*worker->Commit(shard, pieces[0]));
  master_->RequestStop("killed");
  Beat(ServerPtrs());
  master_->Wait().IgnoreError();
  master_.reset();
  ASSERT_NO_FATAL_FAILURE(MarkSavedJobKilled(options.data_dir));
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  EXPECT_EQ(Doc()["records_trained"], pieces[0].lines);
  servers_.clear();
  fake_server_listeners_.clear();
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(0, /*stored_id=*/0));
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(1, /*stored_id=*/1));
  ASSERT_TRUE(Eventually(
      [&] { return Doc()["recovery"]["recoveries"] == 1 && Doc()["recovery"]["in_progress"].is_null(); },
      ServerPtrs()));
  const std::vector<std::pair<uint64_t, std::string>> start = {{0, ""}};
  EXPECT_EQ(RestoresSeen(0), start);
  EXPECT_EQ(RestoresSeen(1), start);
  EXPECT_EQ(Doc()["records_trained"], 0);
}

// Every job.progress_interval_s the master samples the job's progress:
// /status "history", a "progress" event, and the rate and ETA peers hear
// in heartbeat replies.
TEST_F(MasterTest, ProgressSamplesFeedTheHistoryTheEventsAndThePeers) {
  const std::string train = Write("train.tsv", CriteoText(40, /*seed=*/7));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.job.progress_interval_s = 1;
  options.job.job.epochs = 2;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/1);
  ASSERT_TRUE(*worker->Commit(shard, pieces[0], /*loss_sum=*/0.5));
  ASSERT_TRUE(*worker->Commit(shard, pieces[1], /*loss_sum=*/0.25));
  std::vector<FakePeer*> alive = ServerPtrs();
  alive.push_back(worker.get());
  // The first sample after the commits has their rate.
  ASSERT_TRUE(Eventually(
      [&] {
        const json history = Doc()["history"];
        return !history.empty() && history.back()["records_per_s"].get<double>() > 0;
      },
      alive, absl::Seconds(5)));
  const json sample = Doc()["history"].back();
  EXPECT_EQ(sample["records_trained"], 2);
  EXPECT_EQ(sample["phase"], "training");
  EXPECT_EQ(sample["workers"], 1);
  EXPECT_DOUBLE_EQ(sample["train_loss"].get<double>(), 0.375);
  EXPECT_GT(sample["eta_s"].get<double>(), 0.0);
  EXPECT_NEAR(sample["pass_fraction"].get<double>(), 2.0 / 40, 1e-9);
  StatusOr<proto::HeartbeatReply> beat = worker->Heartbeat();
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_GT(beat->job_records_per_s(), 0.0);
  ASSERT_TRUE(beat->has_eta_s());
  EXPECT_GT(beat->eta_s(), 0.0);
  EXPECT_EQ(beat->pass_records_left(), 38u);
  master_.reset();  // flushes the events
  const std::vector<json> progress = Events("progress");
  ASSERT_FALSE(progress.empty());
  EXPECT_TRUE(progress.back().contains("records_per_s"));
  EXPECT_TRUE(progress.back().contains("time"));
}

// A restore that fails (a checkpoint the new server cannot read) stops the
// job resumably: its checkpoints stand for --resume.
TEST_F(MasterTest, FailedRestoreStopsTheJobResumably) {
  const std::string train = Write("train.tsv", CriteoText(20, /*seed=*/8));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  ASSERT_TRUE(Eventually([&] { return !Doc()["recovery"]["in_progress"].is_null(); },
                         {servers_[0].get()}));
  {
    absl::MutexLock lock(&fenced_mu_);
    refuse_restores_[2] = true;
  }
  ASSERT_NO_FATAL_FAILURE(AddFakeServer(2));
  ASSERT_TRUE(Eventually([&] { return Doc()["state"] == "failed"; },
                         {servers_[0].get(), servers_[2].get()}));
  const json doc = Doc();
  EXPECT_THAT(doc["error"].get<std::string>(), HasSubstr("cannot restore ps[1]"));
  EXPECT_EQ(doc["resumable"], true);
  EXPECT_TRUE(master_->Resumable());
  EXPECT_EQ(FinalStatus()["resumable"], true);
}

TEST_F(MasterTest, ResumeNeedsAJobToResume) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.resume = true;
  Master master(options);
  const Status started = master.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kFailedPrecondition) << started;
  EXPECT_THAT(started.message(), HasSubstr("no job to resume"));
}

TEST_F(MasterTest, RequestStopFailsTheJobCleanly) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.master.lease_ms = 20000;  // Wait must not need leases to run out
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());

  master_->RequestStop("stopped by the test");
  master_->RequestStop("stopped twice");
  json doc = Doc();
  EXPECT_EQ(doc["state"], "failed");
  EXPECT_EQ(doc["error"], "stopped by the test");
  EXPECT_EQ(FinalStatus()["state"], "failed");
  // No new members once the job is over.
  std::unique_ptr<FakePeer> late = Peer();
  EXPECT_EQ(late->RegisterWorker().code(), absl::StatusCode::kFailedPrecondition);

  StatusOr<proto::GetShardReply> shard = worker->GetShard();
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->action(), proto::GetShardReply::FINISHED);
  for (const auto& server : servers_) {
    StatusOr<proto::HeartbeatReply> beat = server->Heartbeat();
    ASSERT_TRUE(beat.ok()) << beat.status();
    EXPECT_TRUE(beat->shutdown());
  }
  const absl::Time before_wait = absl::Now();
  const Status result = master_->Wait();
  EXPECT_LT(absl::Now() - before_wait, absl::Seconds(5));
  EXPECT_EQ(result.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(result.message(), HasSubstr("stopped by the test"));
}

// Start, stop at once, wait: never hangs (the HTTP thread may not have
// started listening yet when it is stopped).
TEST_F(MasterTest, StopRightAfterStart) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  for (int i = 0; i < 10; ++i) {
    MasterOptions options = Options();
    options.job.data.train = train;
    options.data_dir = absl::StrCat(dir_, "/master-", i);
    Master master(options);
    ASSERT_TRUE(master.Start().ok());
    master.RequestStop("stop");
    EXPECT_EQ(master.Wait().code(), absl::StatusCode::kAborted);
  }
}

// SIGTERM while a large data set is being scanned ends the job promptly.
TEST_F(MasterTest, RequestStopInterruptsTheScan) {
  // Sparse: 16 GiB of no disk, which would take far longer than the bound
  // below to scan.
  const std::string big = dir_ + "/huge.tsv";
  std::ofstream(big, std::ios::binary).close();
  std::filesystem::resize_file(big, uint64_t{16} << 30);
  MasterOptions options = Options();
  options.job.data.train = big;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  EXPECT_EQ(Doc()["phase"], "scanning");
  const absl::Time before_stop = absl::Now();
  master_->RequestStop("stopped during the scan");
  const Status result = master_->Wait();
  EXPECT_LT(absl::Now() - before_stop, absl::Seconds(5));
  EXPECT_EQ(result.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(result.message(), HasSubstr("stopped during the scan"));
  EXPECT_EQ(FinalStatus()["state"], "failed");
}

}  // namespace
}  // namespace eps
