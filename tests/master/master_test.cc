// Tests master/master.h: the Master service over real RPC (a whole job,
// checkpoint rounds, leases, commits and malformed requests).
// The fixture is in tests/master/master_fixture.h.

#include "tests/master/master_fixture.h"

namespace eps {
namespace {

// The whole life of a small job: registration and placement, two epochs of
// training with exactly-once accounting, the final evaluation with exact
// metrics, and a clean shutdown.
TEST_F(MasterTest, RunsAWholeJob) {
  // 30 train lines (2 malformed, the last line without '\n') in 7 shards;
  // 12 eval lines (1 malformed) in 3 shards.
  Write("train/part-0", CriteoText(23, /*seed=*/1, {4, 17}));
  Write("train/part-1", CriteoText(7, /*seed=*/2, {}, /*final_newline=*/false));
  Write("train/.crc", "hidden files are skipped\n");
  const std::string eval = Write("eval.tsv", CriteoText(12, /*seed=*/3, {6}));
  MasterOptions options = Options();
  options.job.data.train = dir_ + "/train";
  options.job.data.eval = eval;
  options.job.job.epochs = 2;
  // Long leases: Wait must return because everyone was told, not because
  // leases ran out.
  options.job.master.lease_ms = 20000;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));

  std::unique_ptr<FakePeer> early = Peer();
  ExpectCode(early->GetClusterMap().status(), absl::StatusCode::kUnavailable, proto::NOT_READY);

  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  EXPECT_EQ(servers_[0]->id(), 0u);
  EXPECT_EQ(servers_[1]->id(), 1u);
  EXPECT_EQ(servers_[0]->job().num_partitions(), 8u);
  EXPECT_EQ(servers_[0]->job().tables_size(), 2);
  // A retried registration gets the same id. (A third server would join:
  // tests/master/job_control_moves_test.cc.)
  std::unique_ptr<FakePeer> again = Peer();
  ASSERT_TRUE(again->RegisterServer(fake_server_listeners_[0]->endpoint()).ok());
  EXPECT_EQ(again->id(), 0u);

  StatusOr<proto::GetClusterMapReply> map = early->GetClusterMap();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->map().version(), 1u);
  EXPECT_EQ(map->map().num_partitions(), 8u);
  ASSERT_EQ(map->map().servers_size(), 2);
  EXPECT_EQ(map->map().servers(0).endpoint(), fake_server_listeners_[0]->endpoint());
  EXPECT_EQ(map->map().servers(1).endpoint(), fake_server_listeners_[1]->endpoint());
  ASSERT_EQ(map->map().partition_owner_size(), 8);
  for (int p = 0; p < 8; ++p) EXPECT_EQ(map->map().partition_owner(p), p % 2u) << p;

  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  EXPECT_EQ(worker->heartbeat_ms(), static_cast<uint32_t>(kHeartbeatMs));
  ASSERT_TRUE(WaitForPhase("training"));

  std::map<std::pair<int, int>, std::vector<uint64_t>> handed;  // (phase, epoch) -> shards
  std::vector<float> all_labels;
  std::vector<float> all_predictions;
  std::vector<double> shard_aucs;
  uint64_t duplicates = 0;
  bool finished = false;
  for (int round = 0; round < 100 && !finished; ++round) {
    StatusOr<proto::GetShardReply> reply = worker->GetShard();
    ASSERT_TRUE(reply.ok()) << reply.status();
    if (reply->action() == proto::GetShardReply::FINISHED) {
      finished = true;
      break;
    }
    ASSERT_EQ(reply->action(), proto::GetShardReply::ASSIGNED) << reply->DebugString();
    const proto::ShardAssignment& shard = reply->shard();
    EXPECT_EQ(shard.start(), shard.begin());
    handed[{shard.phase(), static_cast<int>(shard.epoch())}].push_back(shard.shard_id());
    const bool eval_shard = shard.phase() == proto::EVAL;
    const double loss = shard.epoch() == 0 ? 0.75 : 0.25;
    std::vector<float> shard_labels;
    std::vector<float> shard_predictions;
    const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/2);
    uint64_t lines = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& piece = pieces[i];
      lines += piece.lines;
      StatusOr<bool> applied = worker->Commit(shard, piece, loss * (piece.lines - piece.malformed));
      ASSERT_TRUE(applied.ok()) << applied.status();
      EXPECT_TRUE(*applied);
      // A retried commit (not the shard's last: that one may end the pass)
      // is acknowledged and counted once.
      if (i == 0 && pieces.size() > 1) {
        StatusOr<bool> repeated = worker->Commit(shard, piece, loss);
        ASSERT_TRUE(repeated.ok()) << repeated.status();
        EXPECT_FALSE(*repeated);
        ++duplicates;
      }
      shard_labels.insert(shard_labels.end(), piece.labels.begin(), piece.labels.end());
      shard_predictions.insert(shard_predictions.end(), piece.predictions.begin(),
                               piece.predictions.end());
    }
    EXPECT_EQ(lines, shard.records());
    if (eval_shard) {
      all_labels.insert(all_labels.end(), shard_labels.begin(), shard_labels.end());
      all_predictions.insert(all_predictions.end(), shard_predictions.begin(),
                             shard_predictions.end());
      shard_aucs.push_back(ComputeAuc(shard_predictions, shard_labels));
    }
  }
  ASSERT_TRUE(finished);
  EXPECT_GT(duplicates, 0u);
  EXPECT_THAT((handed[{proto::TRAIN, 0}]), UnorderedElementsAre(0, 1, 2, 3, 4, 5, 6));
  EXPECT_THAT((handed[{proto::TRAIN, 1}]), UnorderedElementsAre(0, 1, 2, 3, 4, 5, 6));
  EXPECT_THAT((handed[{proto::EVAL, 1}]), UnorderedElementsAre(0, 1, 2));
  EXPECT_EQ(handed.size(), 3u);
  ASSERT_EQ(all_labels.size(), 11u);

  // Everyone is told to exit: the worker by GET_SHARD above, the servers
  // by their heartbeats. Then Wait returns at once.
  for (const auto& server : servers_) {
    StatusOr<proto::HeartbeatReply> beat = server->Heartbeat();
    ASSERT_TRUE(beat.ok()) << beat.status();
    EXPECT_TRUE(beat->shutdown());
    EXPECT_EQ(beat->state(), proto::JOB_FINISHED);
  }
  const absl::Time before_wait = absl::Now();
  EXPECT_TRUE(master_->Wait().ok());
  EXPECT_LT(absl::Now() - before_wait, absl::Seconds(5));

  const double expected_auc = ComputeAuc(all_predictions, all_labels);
  const double expected_logloss = ComputeLogLoss(all_predictions, all_labels);
  double mean_shard_auc = 0;
  for (double auc : shard_aucs) mean_shard_auc += auc / shard_aucs.size();
  // The data is such that an average over shards would be caught.
  ASSERT_GT(std::abs(mean_shard_auc - expected_auc), 1e-3);

  for (const json& doc : {Doc(), FinalStatus()}) {
    SCOPED_TRACE(doc.dump());
    EXPECT_EQ(doc["state"], "finished");
    EXPECT_EQ(doc["epoch"], 2);
    EXPECT_EQ(doc["records_trained"], 28 * 2);
    EXPECT_EQ(doc["records_malformed"], 2 * 2 + 1);
    EXPECT_EQ(doc["shards"]["total"], 7);
    EXPECT_EQ(doc["shards"]["done"], 7);
    EXPECT_EQ(doc["shards"]["todo"], 0);
    EXPECT_EQ(doc["shards"]["doing"], 0);
    EXPECT_NEAR(doc["metrics"]["train_loss"].get<double>(), 0.25, 1e-12);
    ASSERT_EQ(doc["metrics"]["epoch_train_loss"].size(), 2u);
    EXPECT_NEAR(doc["metrics"]["epoch_train_loss"][0].get<double>(), 0.75, 1e-12);
    EXPECT_NEAR(doc["metrics"]["eval_auc"].get<double>(), expected_auc, 1e-12);
    EXPECT_NEAR(doc["metrics"]["eval_logloss"].get<double>(), expected_logloss, 1e-12);
    EXPECT_EQ(doc["metrics"]["eval_records"], 11);
    ASSERT_EQ(doc["workers"].size(), 1u);
    EXPECT_EQ(doc["workers"][0]["records"], 28 * 2);
    ASSERT_EQ(doc["servers"].size(), 2u);
    EXPECT_EQ(doc["servers"][0]["partitions"], 4);
    EXPECT_EQ(doc["servers"][1]["partitions"], 4);
    EXPECT_EQ(doc["reassignments"], 0);
  }
}

// A coordinated checkpoint: the master asks the workers to pause (in
// heartbeat and commit replies), has the servers write only once every live
// worker says it has paused, records it with the job's state, and lets the
// workers go on. A server that fails its part fails the round: the previous
// checkpoint stands.
TEST_F(MasterTest, CheckpointWaitsForEveryWorkerToPause) {
  const std::string train = Write("train.tsv", CriteoText(40, /*seed=*/2));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.checkpoint.interval_s = 1;
  options.job.checkpoint.keep = 1;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/2);
  ASSERT_GE(pieces.size(), 2u);
  ASSERT_TRUE(*worker->Commit(shard, pieces[0]));

  auto seen = [&](int server) {
    absl::MutexLock lock(&fenced_mu_);
    return checkpoints_seen_[server];
  };
  // Round 1 starts within the interval; the worker is told to pause.
  uint64_t pause_for = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        StatusOr<proto::HeartbeatReply> reply = worker->Heartbeat();
        pause_for = reply.ok() ? reply->pause_for_checkpoint() : 0;
        return pause_for != 0;
      },
      ServerPtrs()));
  EXPECT_EQ(pause_for, 1u);
  // A commit (the batch in hand) is still accepted, and says the same.
  StatusOr<proto::CommitProgressReply> committed = worker->CommitReply(shard, pieces[1]);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->applied());
  EXPECT_EQ(committed->pause_for_checkpoint(), 1u);
  // Until the worker says it has paused, no server is asked to write.
  for (int i = 0; i < 5; ++i) {
    Beat(ServerPtrs());
    ASSERT_TRUE(worker->Heartbeat().ok());
    absl::SleepFor(absl::Milliseconds(kHeartbeatMs));
  }
  EXPECT_TRUE(seen(0).empty());
  EXPECT_EQ(Doc()["checkpoints"]["in_progress"], 1);
  // Paused: the servers write checkpoint 1, the master records it, and the
  // worker is told to go on.
  std::vector<FakePeer*> alive = ServerPtrs();
  ASSERT_TRUE(Eventually(
      [&] {
        StatusOr<proto::HeartbeatReply> reply = worker->Heartbeat(0, /*paused_for=*/1);
        return reply.ok() && reply->pause_for_checkpoint() == 0;
      },
      alive));
  EXPECT_EQ(seen(0), std::vector<uint64_t>{1});
  EXPECT_EQ(seen(1), std::vector<uint64_t>{1});
  json checkpoints = Doc()["checkpoints"];
  EXPECT_EQ(checkpoints["written"], 1) << checkpoints.dump();
  EXPECT_EQ(checkpoints["last"]["checkpoint"], 1);
  EXPECT_EQ(checkpoints["last"]["bytes"], 2001);
  // The record holds the ledger at the pause: both pieces committed.
  const uint64_t committed_records = pieces[0].lines + pieces[1].lines;
  EXPECT_EQ(checkpoints["last"]["records_trained"], committed_records) << checkpoints.dump();
  ASSERT_EQ(Events("checkpoint").size(), 1u);
  EXPECT_EQ(Events("checkpoint")[0]["servers"][1]["path"], "/fake-ps1/checkpoints/1");

  // Round 2 fails at one server: recorded as failed, checkpoint 1 stands.
  {
    absl::MutexLock lock(&fenced_mu_);
    refuse_checkpoints_[1] = true;
  }
  ASSERT_TRUE(Eventually(
      [&] {
        StatusOr<proto::HeartbeatReply> reply = worker->Heartbeat(0, /*paused_for=*/2);
        return Doc()["checkpoints"]["failed"] == 1;
      },
      alive));
  checkpoints = Doc()["checkpoints"];
  EXPECT_EQ(checkpoints["written"], 1) << checkpoints.dump();
  EXPECT_EQ(checkpoints["last"]["checkpoint"], 1) << checkpoints.dump();
  ASSERT_EQ(Events("checkpoint_failed").size(), 1u);
  EXPECT_NE(Events("checkpoint_failed")[0]["error"].get<std::string>().find("disk full"),
            std::string::npos);

  // The store holds checkpoint 1 alone (keep = 1; 2 is incomplete) with the
  // ledger at its pause, and remembers that id 2 was used.
  master_.reset();
  StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir_ + "/master/state");
  ASSERT_TRUE(store.ok()) << store.status();
  StatusOr<std::optional<MasterSnapshot>> saved = (*store)->Load();
  ASSERT_TRUE(saved.ok() && saved->has_value()) << saved.status();
  // Checkpoint 0 (training starting, no server part) stays as well.
  ASSERT_EQ((*saved)->checkpoints.size(), 2u);
  const proto::CheckpointRecord& start = (*saved)->checkpoints.at(0);
  EXPECT_EQ(start.master().records_trained(), 0u);
  EXPECT_EQ(start.servers_size(), 0);
  const proto::CheckpointRecord& record = (*saved)->checkpoints.at(1);
  EXPECT_EQ(record.id(), 1u);
  EXPECT_EQ(record.master().records_trained(), committed_records);
  EXPECT_EQ(record.servers_size(), 2);
  EXPECT_GT(record.shards_size(), 0);
  EXPECT_EQ((*saved)->master.last_checkpoint_id(), 2u);
}

// A worker that heartbeats but never pauses (stuck in a long batch) makes
// the round give up after two leases; training goes on.
// A worker that heartbeats but never pauses is fenced after two leases, and
// the round goes on without it: it cannot fail every checkpoint.
TEST_F(MasterTest, CheckpointFencesAWorkerThatDoesNotPauseAndGoesOn) {
  const std::string train = Write("train.tsv", CriteoText(40, /*seed=*/3));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.checkpoint.interval_s = 1;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  // It heartbeats (alive) but never pauses, until it is fenced (its
  // heartbeat is refused from then on).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Events("worker_fenced_alive").empty() && absl::Now() < deadline) {
    Beat(ServerPtrs());
    (void)worker->Heartbeat();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(Eventually([&] { return Doc()["checkpoints"]["written"] == 1; }, ServerPtrs()));
  const std::vector<json> fenced = Events("worker_fenced_alive");
  ASSERT_EQ(fenced.size(), 1u);
  EXPECT_THAT(fenced[0]["reason"].get<std::string>(),
              ::testing::HasSubstr("did not pause for checkpoint 1"));
  EXPECT_EQ(Doc()["checkpoints"]["failed"], 0);
  absl::MutexLock lock(&fenced_mu_);
  EXPECT_EQ(checkpoints_seen_[0].size(), 1u);
}

// A launch id is the autoscaler's to give: claimed without its secret (here
// there is no autoscaler at all) the registration is refused.
TEST_F(MasterTest, ARegistrationClaimingALaunchIdWithoutItsSecretIsRefused) {
  MasterOptions options = Options();
  options.job.data.train = Write("train.tsv", CriteoText(20, /*seed=*/1));
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  std::unique_ptr<FakePeer> spoofer = Peer();
  const Status refused = spoofer->RegisterWorker(/*launch_id=*/3, "guess");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("launch secret"));
  EXPECT_TRUE(Peer()->RegisterWorker().ok()) << "one started by hand registers";
}

TEST_F(MasterTest, ExpiredWorkerLeaseReturnsItsShardFromTheCommittedOffset) {
  const std::string train = Write("train.tsv", CriteoText(20, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));

  std::unique_ptr<FakePeer> doomed = Peer();
  ASSERT_TRUE(doomed->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*doomed);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/2);
  ASSERT_EQ(pieces.size(), 3u);
  ASSERT_TRUE(doomed->Commit(shard, pieces[0]).ok());

  std::unique_ptr<FakePeer> survivor = Peer();
  ASSERT_TRUE(survivor->RegisterWorker().ok());
  std::vector<FakePeer*> alive = ServerPtrs();
  alive.push_back(survivor.get());
  // The doomed worker stops heartbeating; its lease runs out, and once
  // both servers have fenced it (a moment later) its shard is released.
  ASSERT_TRUE(Eventually(
      [&] {
        const json doc = Doc();
        if (doc["shards"]["doing"] != 0) return false;
        for (const json& worker : doc["workers"]) {
          if (worker["id"] == doomed->id()) return worker["state"] == "dead";
        }
        return false;
      },
      alive));
  json doc = Doc();
  EXPECT_EQ(doc["shards"]["doing"], 0);
  EXPECT_EQ(doc["shards"]["todo"], 4);
  EXPECT_EQ(doc["reassignments"], 1);
  EXPECT_EQ(doc["state"], "running");

  // The next worker resumes the shard where the dead one stopped.
  const proto::ShardAssignment resumed = TakeShard(*survivor);
  EXPECT_EQ(resumed.shard_id(), shard.shard_id());
  EXPECT_EQ(resumed.path(), shard.path());
  EXPECT_EQ(resumed.begin(), shard.begin());
  EXPECT_EQ(resumed.end(), shard.end());
  EXPECT_EQ(resumed.start(), pieces[0].end);
  EXPECT_EQ(resumed.start_line(), shard.start_line() + 2);
  EXPECT_EQ(resumed.records(), shard.records() - 2);

  // The dead worker is fenced.
  ExpectCode(doomed->GetShard().status(), absl::StatusCode::kFailedPrecondition, proto::FENCED);
  ExpectCode(doomed->Heartbeat().status(), absl::StatusCode::kFailedPrecondition, proto::FENCED);
  ExpectCode(doomed->Commit(shard, pieces[1]).status(), absl::StatusCode::kFailedPrecondition,
             proto::FENCED);

  // The survivor finishes the job; each record counts once.
  uint64_t valid = CommitAll(*survivor, resumed, 2);
  for (int i = 0; i < 3; ++i) valid += CommitAll(*survivor, TakeShard(*survivor), 2);
  EXPECT_EQ(valid, 18u);
  doc = Doc();
  EXPECT_EQ(doc["state"], "finished");
  EXPECT_EQ(doc["records_trained"], 20);
  EXPECT_EQ(doc["reassignments"], 1);
  for (const json& worker : doc["workers"]) {
    EXPECT_EQ(worker["records"], worker["id"] == doomed->id() ? 2 : 18) << worker.dump();
  }

  StatusOr<proto::GetShardReply> over = survivor->GetShard();
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->action(), proto::GetShardReply::FINISHED);
  Beat(ServerPtrs());
  EXPECT_TRUE(master_->Wait().ok());
}

TEST_F(MasterTest, DeregisterReleasesShards) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));

  std::unique_ptr<FakePeer> leaving = Peer();
  ASSERT_TRUE(leaving->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*leaving);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/3);
  ASSERT_TRUE(leaving->Commit(shard, pieces[0]).ok());
  ASSERT_TRUE(leaving->Deregister().ok());
  json doc = Doc();
  EXPECT_EQ(doc["workers"][0]["state"], "left");
  EXPECT_EQ(doc["shards"]["doing"], 0);
  EXPECT_EQ(doc["shards"]["todo"], 2);
  // Deregistering twice is harmless; a departed worker is fenced.
  EXPECT_TRUE(leaving->Deregister().ok());
  ExpectCode(leaving->Heartbeat().status(), absl::StatusCode::kFailedPrecondition, proto::FENCED);

  std::unique_ptr<FakePeer> next = Peer();
  ASSERT_TRUE(next->RegisterWorker().ok());
  const proto::ShardAssignment resumed = TakeShard(*next);
  EXPECT_EQ(resumed.shard_id(), shard.shard_id());
  EXPECT_EQ(resumed.start(), pieces[0].end);
  EXPECT_EQ(resumed.start_line(), shard.start_line() + 3);
  EXPECT_EQ(resumed.records(), shard.records() - 3);

  master_->RequestStop("test over");
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
}

TEST_F(MasterTest, BadCommitsAreRefused) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  const std::string eval = Write("eval.tsv", CriteoText(5, /*seed=*/2, {3}));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.data.eval = eval;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());

  const proto::ShardAssignment train_shard = TakeShard(*worker);
  std::vector<Piece> pieces = ReadPieces(train_shard, /*batch_lines=*/5);
  ASSERT_EQ(pieces.size(), 1u);
  Piece piece = pieces[0];

  // Record counts that do not fit the byte range.
  Piece short_count = piece;
  short_count.lines = 4;
  EXPECT_EQ(worker->Commit(train_shard, short_count).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A commit for an epoch or phase that is not running.
  proto::ShardAssignment future = train_shard;
  future.set_epoch(1);
  EXPECT_EQ(worker->Commit(future, piece).status().code(), absl::StatusCode::kFailedPrecondition);
  proto::ShardAssignment early_eval = train_shard;
  early_eval.set_phase(proto::EVAL);
  Piece eval_like = piece;
  eval_like.labels.assign(5, 0.0f);
  eval_like.predictions.assign(5, 0.5f);
  EXPECT_EQ(worker->Commit(early_eval, eval_like).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A TRAIN commit carries no frames.
  Message framed;
  proto::CommitProgressRequest* body = framed.header().mutable_commit_progress_request();
  body->set_shard_id(train_shard.shard_id());
  body->set_phase(proto::TRAIN);
  body->set_begin_offset(piece.begin);
  body->set_end_offset(piece.end);
  body->set_lines(piece.lines);
  framed.AddArray(std::vector<float>{1.0f});
  EXPECT_EQ(worker->Call(proto::COMMIT_PROGRESS, std::move(framed)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // More malformed lines than lines.
  Piece overflow = piece;
  overflow.malformed = 6;
  EXPECT_EQ(worker->Commit(train_shard, overflow).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Doc()["records_trained"], 0);

  ASSERT_TRUE(*worker->Commit(train_shard, piece));
  ASSERT_TRUE(WaitForPhase("evaluating"));
  const proto::ShardAssignment eval_shard = TakeShard(*worker);
  ASSERT_EQ(eval_shard.phase(), proto::EVAL);
  pieces = ReadPieces(eval_shard, /*batch_lines=*/5);
  ASSERT_EQ(pieces.size(), 1u);
  piece = pieces[0];
  ASSERT_EQ(piece.malformed, 1u);
  ASSERT_EQ(piece.labels.size(), 4u);

  // Frames that do not match each other or the line count.
  Piece mismatched = piece;
  mismatched.predictions.pop_back();
  EXPECT_EQ(worker->Commit(eval_shard, mismatched).status().code(),
            absl::StatusCode::kInvalidArgument);
  Piece too_few = piece;
  too_few.labels.pop_back();
  too_few.predictions.pop_back();
  EXPECT_EQ(worker->Commit(eval_shard, too_few).status().code(),
            absl::StatusCode::kInvalidArgument);
  Message no_frames;
  body = no_frames.header().mutable_commit_progress_request();
  body->set_shard_id(eval_shard.shard_id());
  body->set_epoch(eval_shard.epoch());
  body->set_phase(proto::EVAL);  // an EVAL commit without its two frames
  body->set_begin_offset(piece.begin);
  body->set_end_offset(piece.end);
  body->set_lines(piece.lines);
  body->set_malformed(piece.malformed);
  EXPECT_EQ(worker->Call(proto::COMMIT_PROGRESS, std::move(no_frames)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Predictions that are not probabilities would break the metrics;
  // labels must be numbers. (A NaN prediction is a diverged model: the job
  // stops, tests/master/job_control_liveness_test.cc.)
  for (float bad : {-0.5f, 1.5f, std::numeric_limits<float>::infinity()}) {
    Piece not_probabilities = piece;
    not_probabilities.predictions[1] = bad;
    EXPECT_EQ(worker->Commit(eval_shard, not_probabilities).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  Piece bad_label = piece;
  bad_label.labels[2] = std::nanf("");
  EXPECT_EQ(worker->Commit(eval_shard, bad_label).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Wrong epoch for the evaluation.
  proto::ShardAssignment wrong_epoch = eval_shard;
  wrong_epoch.set_epoch(eval_shard.epoch() + 1);
  EXPECT_EQ(worker->Commit(wrong_epoch, piece).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Doc()["metrics"]["eval_records"], 0);

  ASSERT_TRUE(*worker->Commit(eval_shard, piece));
  const json doc = Doc();
  EXPECT_EQ(doc["state"], "finished");
  EXPECT_EQ(doc["metrics"]["eval_records"], 4);
  EXPECT_EQ(doc["records_trained"], 5);
}

// A commit whose reply was lost is resent; when the original ended a pass,
// the resend arrives in the next one and must still be acknowledged, not
// refused (the worker would fail on it).
TEST_F(MasterTest, RepeatedCommitAfterThePassMovedOnIsAcknowledged) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  const std::string eval = Write("eval.tsv", CriteoText(5, /*seed=*/2));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.data.eval = eval;
  options.job.job.epochs = 2;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());

  const proto::ShardAssignment first = TakeShard(*worker);
  const Piece whole = ReadPieces(first, 5)[0];
  ASSERT_TRUE(*worker->Commit(first, whole));
  EXPECT_EQ(Doc()["epoch"], 2);
  StatusOr<bool> repeated = worker->Commit(first, whole);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_FALSE(*repeated);
  // Still validated: a range outside the old shard is an error.
  Piece outside = whole;
  outside.end += 1;
  EXPECT_EQ(worker->Commit(first, outside).status().code(), absl::StatusCode::kInvalidArgument);

  const proto::ShardAssignment second = TakeShard(*worker);
  EXPECT_EQ(second.epoch(), 1u);
  ASSERT_TRUE(*worker->Commit(second, whole));
  EXPECT_EQ(Doc()["phase"], "evaluating");
  repeated = worker->Commit(second, whole);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_FALSE(*repeated);

  const proto::ShardAssignment eval_shard = TakeShard(*worker);
  const Piece eval_piece = ReadPieces(eval_shard, 5)[0];
  ASSERT_TRUE(*worker->Commit(eval_shard, eval_piece));
  EXPECT_EQ(Doc()["state"], "finished");
  repeated = worker->Commit(eval_shard, eval_piece);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_FALSE(*repeated);

  const json doc = Doc();
  EXPECT_EQ(doc["records_trained"], 10);
  EXPECT_EQ(doc["metrics"]["eval_records"], 5);
}

TEST_F(MasterTest, RefusesMalformedRequests) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());

  for (proto::Method method : {proto::GET_SHARD, proto::HEARTBEAT, proto::REGISTER_WORKER,
                               proto::GET_CLUSTER_MAP, proto::DEREGISTER}) {
    Message request;
    request.AddArray(std::vector<uint64_t>{1, 2, 3});
    StatusOr<Message> reply = worker->Call(method, std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument)
        << proto::Method_Name(method) << ": " << reply.status();
  }
  // Bodies are required.
  EXPECT_EQ(worker->Call(proto::HEARTBEAT).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker->Call(proto::COMMIT_PROGRESS).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Only servers register as servers.
  EXPECT_EQ(worker->Call(proto::REGISTER_SERVER).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Too many frames for any method.
  Message crowded;
  for (int i = 0; i < 3; ++i) crowded.AddArray(std::vector<float>{1.0f});
  EXPECT_EQ(worker->Call(proto::COMMIT_PROGRESS, std::move(crowded)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Methods the master does not serve.
  EXPECT_EQ(worker->Call(proto::PULL).status().code(), absl::StatusCode::kUnimplemented);
  // A server endpoint that is not one.
  std::unique_ptr<FakePeer> server = Peer();
  EXPECT_EQ(server->RegisterServer("not an endpoint").code(), absl::StatusCode::kInvalidArgument);

  // The master is none the worse.
  EXPECT_TRUE(worker->Heartbeat().ok());
  EXPECT_EQ(Doc()["state"], "running");
}

}  // namespace
}  // namespace eps
