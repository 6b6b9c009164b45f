// Tests master/master.h: the Master service over real RPC (fencing at every
// server, straggler splits, master restarts).
// The fixture is in tests/master/master_fixture.h.

#include "tests/master/master_fixture.h"

namespace eps {
namespace {

// A dead worker's pushes may still reach a server that has not fenced it
// yet: its shard must not move until every live server refuses it.
TEST_F(MasterTest, DeadWorkersShardWaitsUntilEveryServerFencedIt) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  SetRefuseFences(1, true);

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

  // The lease runs out: ps[0] fences the worker, ps[1] refuses again and
  // again.
  ASSERT_TRUE(Eventually(
      [&] { return FencedSeen(0).count(doomed->id()) == 1 && FenceCalls(1) >= 3; }, alive));
  json doc = Doc();
  EXPECT_EQ(doc["workers"][0]["state"], "dead");
  EXPECT_EQ(doc["shards"]["doing"], 1);
  EXPECT_EQ(doc["shards"]["todo"], 1);
  EXPECT_EQ(doc["reassignments"], 0);
  EXPECT_TRUE(FencedSeen(1).empty());
  // The master refuses the dead worker already, but does not hand its
  // shard out: the survivor gets the other one, then nothing.
  ExpectCode(doomed->Heartbeat().status(), absl::StatusCode::kFailedPrecondition, proto::FENCED);
  const proto::ShardAssignment other = TakeShard(*survivor);
  EXPECT_NE(other.shard_id(), shard.shard_id());
  StatusOr<proto::GetShardReply> nothing = survivor->GetShard();
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->action(), proto::GetShardReply::WAIT);

  // Once ps[1] acknowledges, the shard goes back, from its committed offset.
  SetRefuseFences(1, false);
  ASSERT_TRUE(Eventually([&] { return Doc()["shards"]["todo"] == 1; }, alive));
  EXPECT_EQ(FencedSeen(0), std::set<uint32_t>{doomed->id()});
  EXPECT_EQ(FencedSeen(1), std::set<uint32_t>{doomed->id()});
  doc = Doc();
  EXPECT_EQ(doc["reassignments"], 1);
  EXPECT_EQ(doc["workers_fenced"], 1);
  EXPECT_GE(doc["max_reassign_delay_ms"].get<double>(), kLeaseMs);
  EXPECT_EQ(CommitAll(*survivor, other, 2), other.records());
  const proto::ShardAssignment resumed = TakeShard(*survivor);
  EXPECT_EQ(resumed.shard_id(), shard.shard_id());
  EXPECT_EQ(resumed.start(), pieces[0].end);
  EXPECT_EQ(resumed.start_line(), shard.start_line() + 2);
  EXPECT_EQ(resumed.records(), shard.records() - 2);
  EXPECT_EQ(CommitAll(*survivor, resumed, 2), shard.records() - 2);
  doc = Doc();
  EXPECT_EQ(doc["state"], "finished");
  EXPECT_EQ(doc["records_trained"], 10);
  ASSERT_EQ(doc["ledger"].size(), 1u);
  EXPECT_EQ(doc["ledger"][0]["exactly_once"], true);
}

// A worker that leaves is fenced too: its id reaches every server.
TEST_F(MasterTest, DeregisteredWorkerIsFencedAtEveryServer) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> staying = Peer();
  ASSERT_TRUE(staying->RegisterWorker().ok());
  std::unique_ptr<FakePeer> leaving = Peer();
  ASSERT_TRUE(leaving->RegisterWorker().ok());
  TakeShard(*leaving);
  ASSERT_TRUE(leaving->Deregister().ok());
  std::vector<FakePeer*> alive = ServerPtrs();
  alive.push_back(staying.get());
  ASSERT_TRUE(Eventually(
      [&] {
        return FencedSeen(0).count(leaving->id()) == 1 && FencedSeen(1).count(leaving->id()) == 1;
      },
      alive));
  EXPECT_EQ(FencedSeen(0).count(staying->id()), 0u);
  EXPECT_EQ(FencedSeen(1).count(staying->id()), 0u);
  EXPECT_EQ(Doc()["workers_fenced"], 1);
}

// Straggler split: with nothing queued, an idle worker's GET_SHARD makes
// the master ask the holder of the shard with most records left to give
// part of it up; the holder hears it in its next heartbeat or commit reply,
// cuts at a record start, and the idle worker trains the part cut off.
TEST_F(MasterTest, IdleWorkerGetsThePartAStragglerSplitsOff) {
  const std::string text = CriteoText(20, /*seed=*/1);
  const std::string train = Write("train.tsv", text);
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.data.shard_records = 20;
  options.job.worker.batch_size.value = 2;   // splits need 4 records left
  options.job.master.lease_ms = 5000;  // nobody's lease runs out by accident
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));

  std::unique_ptr<FakePeer> slow = Peer();
  ASSERT_TRUE(slow->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*slow);
  ASSERT_EQ(shard.records(), 20u);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/2);
  ASSERT_EQ(pieces.size(), 10u);
  StatusOr<proto::CommitProgressReply> committed = slow->CommitReply(shard, pieces[0]);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->applied());
  EXPECT_FALSE(committed->has_split_shard());
  StatusOr<proto::HeartbeatReply> beat = slow->Heartbeat();
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(beat->has_split_shard());

  std::unique_ptr<FakePeer> idle = Peer();
  ASSERT_TRUE(idle->RegisterWorker().ok());
  StatusOr<proto::GetShardReply> wait = idle->GetShard();
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_EQ(wait->action(), proto::GetShardReply::WAIT);
  EXPECT_GT(wait->retry_after_ms(), 0u);

  beat = slow->Heartbeat();
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_TRUE(beat->has_split_shard());
  EXPECT_EQ(beat->split_shard(), shard.shard_id());
  committed = slow->CommitReply(shard, pieces[1]);  // committed: lines 1..4
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->applied());
  ASSERT_TRUE(committed->has_split_shard());
  EXPECT_EQ(committed->split_shard(), shard.shard_id());

  // Cuts outside the uncommitted part are errors; the request stands.
  const uint64_t cut = LineStart(text, 11);
  EXPECT_EQ(slow->Split(shard, shard.end(), 21).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slow->Split(shard, pieces[1].begin, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slow->Split(shard, cut, 4).status().code(), absl::StatusCode::kInvalidArgument);
  // Nobody else answers for the holder, and no answer counts for another
  // pass.
  StatusOr<proto::SplitShardReply> refused = idle->Split(shard, cut, 11);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->accepted());
  proto::ShardAssignment next_epoch = shard;
  next_epoch.set_epoch(1);
  refused = slow->Split(next_epoch, cut, 11);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->accepted());

  // Lines 11..20 go.
  StatusOr<proto::SplitShardReply> split = slow->Split(shard, cut, 11);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_TRUE(split->accepted());
  EXPECT_EQ(split->new_shard_id(), 1u);
  beat = slow->Heartbeat();
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(beat->has_split_shard());
  // The same split again (its reply lost): the same answer, no new shard.
  StatusOr<proto::SplitShardReply> again = slow->Split(shard, cut, 11);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->accepted());
  EXPECT_EQ(again->new_shard_id(), 1u);
  // Asked once, answered once.
  refused = slow->Split(shard, LineStart(text, 9), 9);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->accepted());
  json doc = Doc();
  EXPECT_EQ(doc["splits"], 1);
  EXPECT_EQ(doc["shards"]["total"], 2);
  EXPECT_EQ(doc["shards"]["todo"], 1);
  EXPECT_EQ(doc["shards"]["doing"], 1);

  const proto::ShardAssignment part = TakeShard(*idle);
  EXPECT_EQ(part.shard_id(), 1u);
  EXPECT_EQ(part.path(), shard.path());
  EXPECT_EQ(part.begin(), cut);
  EXPECT_EQ(part.start(), cut);
  EXPECT_EQ(part.start_line(), 11u);
  EXPECT_EQ(part.end(), shard.end());
  EXPECT_EQ(part.records(), 10u);

  // The holder can no longer commit past the cut.
  Piece across = pieces[2];
  across.end = pieces[6].end;
  across.lines = 10;
  EXPECT_EQ(slow->Commit(shard, across).status().code(), absl::StatusCode::kInvalidArgument);

  // Both finish their parts; every record counts once.
  proto::ShardAssignment kept = shard;
  kept.set_start(pieces[2].begin);
  kept.set_end(cut);
  EXPECT_EQ(CommitAll(*slow, kept, 2), 6u);
  EXPECT_EQ(Doc()["state"], "running");
  EXPECT_EQ(CommitAll(*idle, part, 3), 10u);
  doc = Doc();
  EXPECT_EQ(doc["state"], "finished");
  EXPECT_EQ(doc["records_trained"], 20);
  EXPECT_EQ(doc["splits"], 1);
  ASSERT_EQ(doc["ledger"].size(), 1u);
  EXPECT_EQ(doc["ledger"][0]["lines_committed"], 20);
  EXPECT_EQ(doc["ledger"][0]["lines_expected"], 20);
  EXPECT_EQ(doc["ledger"][0]["exactly_once"], true);
  for (const json& worker : doc["workers"]) EXPECT_EQ(worker["records"], 10) << worker.dump();

  for (FakePeer* worker : {slow.get(), idle.get()}) {
    StatusOr<proto::GetShardReply> over = worker->GetShard();
    ASSERT_TRUE(over.ok()) << over.status();
    EXPECT_EQ(over->action(), proto::GetShardReply::FINISHED);
  }
  Beat(ServerPtrs());
  EXPECT_TRUE(master_->Wait().ok());
  const std::vector<json> requested = Events("split_requested");
  ASSERT_EQ(requested.size(), 1u);
  EXPECT_EQ(requested[0]["shard"], shard.shard_id());
  EXPECT_EQ(requested[0]["holder"], slow->id());
  EXPECT_EQ(requested[0]["idle_worker"], idle->id());
  const std::vector<json> splits = Events("shard_split");
  ASSERT_EQ(splits.size(), 1u);
  EXPECT_EQ(splits[0]["shard"], shard.shard_id());
  EXPECT_EQ(splits[0]["new_shard"], 1);
  EXPECT_EQ(splits[0]["split_offset"], cut);
  EXPECT_EQ(splits[0]["split_line"], 11);
  EXPECT_EQ(splits[0]["records_moved"], 10);
}

TEST_F(MasterTest, SplitNobodyAskedForIsNotAccepted) {
  const std::string text = CriteoText(20, /*seed=*/1);
  const std::string train = Write("train.tsv", text);
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.data.shard_records = 20;
  options.job.worker.batch_size.value = 2;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  const std::vector<Piece> pieces = ReadPieces(shard, /*batch_lines=*/10);
  ASSERT_EQ(pieces.size(), 2u);
  ASSERT_TRUE(*worker->Commit(shard, pieces[0]));

  StatusOr<proto::SplitShardReply> split = worker->Split(shard, LineStart(text, 15), 15);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_FALSE(split->accepted());
  const json doc = Doc();
  EXPECT_EQ(doc["splits"], 0);
  EXPECT_EQ(doc["shards"]["total"], 1);
  // The shard is whole: its holder commits it to its end.
  ASSERT_TRUE(*worker->Commit(shard, pieces[1]));
  EXPECT_EQ(Doc()["state"], "finished");
}

// A second master must not write into the state of a running one.
TEST_F(MasterTest, SecondMasterOnTheSameDataDirIsUnavailable) {
  MasterOptions options = Options();
  options.job.data.train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  Master second(options);
  const Status started = second.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
  EXPECT_THAT(started.message(), HasSubstr(options.data_dir));
  EXPECT_EQ(Doc()["state"], "running");
}

TEST_F(MasterTest, RestartAfterTheJobFinishedIsRefused) {
  MasterOptions options = Options();
  options.job.data.train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  EXPECT_EQ(CommitAll(*worker, TakeShard(*worker), 5), 5u);
  StatusOr<proto::GetShardReply> over = worker->GetShard();
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->action(), proto::GetShardReply::FINISHED);
  Beat(ServerPtrs());
  ASSERT_TRUE(master_->Wait().ok());
  master_.reset();

  Master again(options);
  const Status started = again.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kFailedPrecondition) << started;
  EXPECT_THAT(started.message(), HasSubstr("is over (finished)"));
  EXPECT_THAT(started.message(), HasSubstr(options.data_dir));
}

TEST_F(MasterTest, RestartWithOtherOptionsIsRefusedNamingThem) {
  MasterOptions options = Options();
  options.job.data.train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  master_->RequestStop("stopped by the test");
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
  master_.reset();

  auto start = [](const MasterOptions& options) {
    Master master(options);
    return master.Start();
  };
  MasterOptions changed = options;
  changed.job.data.shard_records = 3;
  Status started = start(changed);
  EXPECT_EQ(started.code(), absl::StatusCode::kFailedPrecondition) << started;
  EXPECT_THAT(started.message(), HasSubstr("data.shard_records"));
  EXPECT_THAT(started.message(), Not(HasSubstr("job.seed")));
  EXPECT_THAT(started.message(), HasSubstr(options.data_dir));

  changed.job.job.seed = options.job.job.seed + 1;
  started = start(changed);
  EXPECT_EQ(started.code(), absl::StatusCode::kFailedPrecondition) << started;
  EXPECT_THAT(started.message(), HasSubstr("data.shard_records"));
  EXPECT_THAT(started.message(), HasSubstr("job.seed"));

  // The same options: the job was stopped, and goes on with --resume only.
  started = start(options);
  EXPECT_EQ(started.code(), absl::StatusCode::kFailedPrecondition) << started;
  EXPECT_THAT(started.message(), HasSubstr("stopped (stopped by the test)"));
  EXPECT_THAT(started.message(), HasSubstr("--resume"));
}

// A master restarted on the --data-dir of a running job resumes it: its
// counts, ledger and every shard's committed offset come back, the workers
// of its previous life are fenced at every server before their shards
// move, and the job completes with every record trained once.
//
// An in-process Master cannot be killed -9: stopping it marks its job
// failed. The test turns the saved phase back to training, which leaves
// the store as a master killed at that point leaves it.
// (ElasticTest.MasterKilledAndRestarted kills a real one.)
TEST_F(MasterTest, RestartedMasterResumesTheJob) {
  const std::string text = CriteoText(30, /*seed=*/1);
  MasterOptions options = Options();
  options.job.data.train = Write("train.tsv", text);
  options.job.data.shard_records = 10;
  options.job.worker.batch_size.value = 2;   // splits need 4 records left
  options.job.master.lease_ms = 5000;  // nobody's lease runs out by accident
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));

  // w1 trains a whole shard and the start of another, w2 the start of the
  // third; an idle w3 has the master split one of the two.
  std::vector<std::unique_ptr<FakePeer>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(Peer());
    ASSERT_TRUE(workers.back()->RegisterWorker().ok());
  }
  FakePeer& w1 = *workers[0];
  FakePeer& w2 = *workers[1];
  EXPECT_EQ(CommitAll(w1, TakeShard(w1), 2), 10u);
  const proto::ShardAssignment a = TakeShard(w1);
  const Piece a0 = ReadPieces(a, 2)[0];
  ASSERT_TRUE(*w1.Commit(a, a0));
  const proto::ShardAssignment b = TakeShard(w2);
  const Piece b0 = ReadPieces(b, 2)[0];
  ASSERT_TRUE(*w2.Commit(b, b0));
  StatusOr<proto::GetShardReply> wait = workers[2]->GetShard();
  ASSERT_TRUE(wait.ok()) << wait.status();
  ASSERT_EQ(wait->action(), proto::GetShardReply::WAIT);
  // Both have 8 records left; the lower id is asked.
  const bool a_split = a.shard_id() < b.shard_id();
  FakePeer& holder = a_split ? w1 : w2;
  const proto::ShardAssignment& halved = a_split ? a : b;
  StatusOr<proto::HeartbeatReply> beat = holder.Heartbeat();
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->split_shard(), halved.shard_id());
  const uint64_t cut_line = halved.start_line() + 6;
  const uint64_t cut = LineStart(text, cut_line);
  StatusOr<proto::SplitShardReply> split = holder.Split(halved, cut, cut_line);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_TRUE(split->accepted());
  ASSERT_EQ(split->new_shard_id(), 3u);
  const json before = Doc();
  EXPECT_EQ(before["records_trained"], 14);
  EXPECT_EQ(before["splits"], 1);

  // The master goes away.
  master_->RequestStop("the master goes away");
  for (const auto& worker : workers) {
    StatusOr<proto::GetShardReply> over = worker->GetShard();
    ASSERT_TRUE(over.ok()) << over.status();
  }
  Beat(ServerPtrs());
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
  master_.reset();
  ASSERT_NO_FATAL_FAILURE(MarkSavedJobKilled(options.data_dir));

  // A new master on the same directory, with the same servers (which
  // find it again on their own).
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  servers_.clear();
  for (uint32_t id : {0u, 1u}) {
    servers_.push_back(Peer());
    servers_.back()->ActAs(proto::ROLE_SERVER, id);
  }
  Beat(ServerPtrs());
  json doc = Doc();
  EXPECT_EQ(doc["resumed"], true);
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["phase"], "training");
  EXPECT_EQ(doc["epoch"], 1);
  EXPECT_EQ(doc["records_trained"], 14);
  EXPECT_EQ(doc["splits"], 1);
  EXPECT_EQ(doc["shards"]["total"], 4);
  EXPECT_EQ(doc["shards"]["done"], 1);
  EXPECT_EQ(doc["cluster_map_version"], 1);
  EXPECT_GT(doc["membership_epoch"].get<uint64_t>(), before["membership_epoch"].get<uint64_t>());
  // The previous life's workers must register again.
  for (const auto& worker : workers) {
    FakePeer old(&factory_, master_->rpc_endpoint(), job_);
    old.ActAs(proto::ROLE_WORKER, worker->id());
    ExpectCode(old.Heartbeat().status(), absl::StatusCode::kFailedPrecondition, proto::FENCED);
  }
  // Their shards move once every server refuses them.
  ASSERT_TRUE(Eventually([&] { return Doc()["shards"]["todo"] == 3; }, ServerPtrs()));
  for (int server = 0; server < 2; ++server) {
    EXPECT_EQ(FencedSeen(server).count(w1.id()), 1u) << server;
    EXPECT_EQ(FencedSeen(server).count(w2.id()), 1u) << server;
  }
  EXPECT_EQ(Doc()["reassignments"], 2);

  // A new worker (ids are never reused) finishes the job.
  std::unique_ptr<FakePeer> fresh = Peer();
  ASSERT_TRUE(fresh->RegisterWorker().ok());
  EXPECT_EQ(fresh->id(), 3u);
  std::map<uint64_t, proto::ShardAssignment> handed;
  uint64_t valid = 0;
  for (int i = 0; i < 3; ++i) {
    const proto::ShardAssignment shard = TakeShard(*fresh);
    handed[shard.shard_id()] = shard;
    valid += CommitAll(*fresh, shard, 2);
  }
  EXPECT_EQ(valid, 16u);
  ASSERT_EQ(handed.size(), 3u);
  for (const auto& [old, first] : {std::pair{a, a0}, std::pair{b, b0}}) {
    SCOPED_TRACE(old.shard_id());
    ASSERT_EQ(handed.count(old.shard_id()), 1u);
    const proto::ShardAssignment& resumed = handed[old.shard_id()];
    const bool was_split = old.shard_id() == halved.shard_id();
    EXPECT_EQ(resumed.start(), first.end);
    EXPECT_EQ(resumed.start_line(), old.start_line() + 2);
    EXPECT_EQ(resumed.end(), was_split ? cut : old.end());
    EXPECT_EQ(resumed.records(), was_split ? 4u : 8u);
  }
  ASSERT_EQ(handed.count(3), 1u);
  EXPECT_EQ(handed[3].start(), cut);
  EXPECT_EQ(handed[3].start_line(), cut_line);
  EXPECT_EQ(handed[3].end(), halved.end());
  EXPECT_EQ(handed[3].records(), 4u);

  doc = Doc();
  EXPECT_EQ(doc["state"], "finished");
  EXPECT_EQ(doc["records_trained"], 30);
  EXPECT_EQ(doc["splits"], 1);
  EXPECT_EQ(doc["reassignments"], 2);
  ASSERT_EQ(doc["ledger"].size(), 1u);
  EXPECT_EQ(doc["ledger"][0]["lines_committed"], 30);
  EXPECT_EQ(doc["ledger"][0]["exactly_once"], true);
  StatusOr<proto::GetShardReply> over = fresh->GetShard();
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->action(), proto::GetShardReply::FINISHED);
  Beat(ServerPtrs());
  EXPECT_TRUE(master_->Wait().ok());
  EXPECT_EQ(Events("master_resumed").size(), 1u);
}

// Servers usually register while the master is still scanning a large data
// set; training must start once the scan is done.
TEST_F(MasterTest, TrainingStartsWhenServersRegisteredDuringTheScan) {
  // A sparse 256 MiB file (one long record) takes a moment to scan and no disk.
  const std::string big = dir_ + "/big.tsv";
  std::ofstream(big, std::ios::binary).close();
  std::filesystem::resize_file(big, uint64_t{256} << 20);
  MasterOptions options = Options();
  options.job.data.train = big;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  const bool registered_during_scan = Doc()["phase"] == "scanning";
  ASSERT_TRUE(WaitForPhase("training")) << "registered during the scan: " << registered_during_scan;
  if (!registered_during_scan) {
    GTEST_SKIP() << "the scan finished before the servers registered";
  }
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  EXPECT_EQ(shard.records(), 1u);
  EXPECT_EQ(shard.end(), uint64_t{256} << 20);
}

}  // namespace
}  // namespace eps
