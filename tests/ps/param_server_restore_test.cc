// Tests ps/param_server.h: RESTORE, the stored server id and checkpoint.dir.
// The fixture is in tests/ps/param_server_fixture.h.

#include "tests/ps/param_server_fixture.h"

namespace eps {
namespace {

TEST_F(ParamServerTest, RestoreBringsBackExactlyTheCheckpointedValues) {
  TempDir temp;
  StartServer(OptionsWithDataDir(temp.path()));
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(20, /*here=*/true);
  const std::vector<uint64_t> chunks = DenseKeysHere();
  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  ASSERT_TRUE(Push(kDense, chunks, Grads(chunks.size())).ok());
  StatusOr<std::vector<float>> before = Pull(kEmb, keys);
  ASSERT_TRUE(before.ok()) << before.status();
  StatusOr<std::vector<float>> dense_before = Pull(kDense, chunks);
  ASSERT_TRUE(dense_before.ok()) << dense_before.status();
  StatusOr<uint64_t> fenced = Fence({2});
  ASSERT_TRUE(fenced.ok()) << fenced.status();

  StatusOr<proto::CheckpointReply> checkpoint = Checkpoint(1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->path(), temp.path() + "/checkpoints/1");

  // More pushes, one of them with a sequence number it will send again.
  const uint64_t seq = NextSeq();
  StatusOr<Message> pushed = Call(PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  ASSERT_TRUE(pushed->header().push_reply().applied());
  ASSERT_TRUE(Push(kDense, chunks, Grads(chunks.size())).ok());
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_NE(*rows, *before);

  for (int round = 0; round < 2; ++round) {  // a retried restore: the same state
    StatusOr<proto::RestoreReply> restored = Restore(1, checkpoint->path());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_GT(restored->bytes(), 0u);
    EXPECT_GE(restored->duration_ms(), 0.0);
    rows = Pull(kEmb, keys);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(*rows, *before) << "round " << round;
    rows = Pull(kDense, chunks);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(*rows, *dense_before) << "round " << round;
  }

  // The push undone by the restore is applied again when resent: the
  // deduplication state went with it.
  pushed = Call(PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(pushed->header().push_reply().applied());
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ((*rows)[i], Sgd((*before)[i], grads[i])) << i;
  // The fence set stays.
  StatusOr<std::vector<float>> refused = Pull(kEmb, keys, &other_worker_);
  EXPECT_EQ(ReasonOf(refused.status()), proto::FENCED) << refused.status();
}

TEST_F(ParamServerTest, RestoreIsForTheMasterOnlyAndValidatesItsBody) {
  TempDir temp;
  StartServer(OptionsWithDataDir(temp.path()));
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(4, /*here=*/true);
  ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok());
  StatusOr<proto::CheckpointReply> checkpoint = Checkpoint(1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok());
  StatusOr<std::vector<float>> pushed_twice = Pull(kEmb, keys);
  ASSERT_TRUE(pushed_twice.ok()) << pushed_twice.status();

  RpcChannel server(&factory_, Node(proto::ROLE_SERVER, 4));
  RpcChannel tool(&factory_, Node(proto::ROLE_TOOL, 1));
  for (RpcChannel* sender : {&channel_, &server, &tool}) {
    StatusOr<proto::RestoreReply> restored = Restore(1, checkpoint->path(), sender);
    EXPECT_EQ(restored.status().code(), absl::StatusCode::kPermissionDenied) << restored.status();
  }
  {
    Message request;
    request.header().set_method(proto::RESTORE);  // no body
    StatusOr<Message> reply = CallOn(master_channel_, std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
  }
  StatusOr<proto::RestoreReply> restored = Restore(1, "");
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument) << restored.status();
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, *pushed_twice) << "a refused restore changed the table";

  // The master may.
  restored = Restore(1, checkpoint->path(), &master_channel_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_NE(*rows, *pushed_twice);
}

TEST_F(ParamServerTest, RestoreOfAMissingCheckpointIsNotFoundNamingIt) {
  TempDir temp;
  StartServer(OptionsWithDataDir(temp.Join("data")));
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(4, /*here=*/true);
  const uint64_t seq = NextSeq();
  ASSERT_TRUE(Call(PushRequest({kEmb}, {keys}, {Grads(keys.size())}, seq)).ok());
  StatusOr<std::vector<float>> before_retry = Pull(kEmb, keys);
  ASSERT_TRUE(before_retry.ok()) << before_retry.status();

  const std::string missing = temp.Join("checkpoints/ps-3/8");
  StatusOr<proto::RestoreReply> restored = Restore(8, missing);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kNotFound) << restored.status();
  EXPECT_THAT(restored.status().message(), HasSubstr(missing));
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, *before_retry);
  // Nothing was undone, so a retried push is still recognised.
  StatusOr<Message> retried = Call(PushRequest({kEmb}, {keys}, {Grads(keys.size())}, seq));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_FALSE(retried->header().push_reply().applied());
}

TEST_F(ParamServerTest, RestoreWithoutADataDirIsFailedPrecondition) {
  TempDir temp;
  StartServer();
  AwaitMap();
  StatusOr<proto::RestoreReply> restored = Restore(1, temp.path());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition) << restored.status();
  StatusOr<proto::CheckpointReply> checkpoint = Checkpoint(1);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kFailedPrecondition)
      << checkpoint.status();
}

TEST_F(ParamServerTest, RestoreIsNotReadyWhileStillRegisteringAndServedWithoutAMap) {
  TempDir temp;
  master_->set_map_version(0);  // no map ever, until said otherwise
  master_->HoldRegister();
  Status started;
  server_ = std::make_unique<ParamServer>(OptionsWithDataDir(temp.path()));
  std::thread starter([&] { started = server_->Start(); });
  const std::string endpoint = master_->AwaitRegistration(absl::Seconds(3));
  StatusOr<Message> reply = absl::UnknownError("no server registered");
  if (!endpoint.empty()) {
    Message request;
    request.header().set_method(proto::RESTORE);
    request.header().mutable_restore_request()->set_checkpoint_id(1);
    request.header().mutable_restore_request()->set_path(temp.Join("checkpoints/1"));
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(500);  // the server's Start waits 1 s per attempt
    call.max_attempts = 1;
    reply = master_channel_.Call(endpoint, std::move(request), call);
  }
  master_->ReleaseRegister();
  starter.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();
  ASSERT_TRUE(started.ok()) << started;

  // Started, still without a map: a restore is served (here: nothing there).
  ASSERT_TRUE(master_->AwaitHeartbeats(2, absl::Seconds(3)));
  StatusOr<proto::RestoreReply> restored = Restore(1, temp.Join("checkpoints/1"));
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kNotFound) << restored.status();
}

TEST_F(ParamServerTest, PushesAndPullsDuringRestoresNeitherFailNorCorrupt) {
  TempDir temp;
  StartServer(OptionsWithDataDir(temp.path()));
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(200, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  StatusOr<std::vector<float>> checkpointed = Pull(kEmb, keys);
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  StatusOr<proto::CheckpointReply> checkpoint = Checkpoint(1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();

  std::atomic<bool> stop{false};
  std::atomic<int> pushes{0};
  absl::Mutex mu;
  std::vector<std::string> failures;  // guarded by mu
  std::vector<std::thread> workers;
  for (uint32_t worker : {11u, 12u, 13u}) {
    workers.emplace_back([&, worker] {
      RpcChannel channel(&factory_, Node(proto::ROLE_WORKER, worker));
      auto fail = [&](const std::string& what) {
        absl::MutexLock lock(&mu);
        failures.push_back(absl::StrCat("worker ", worker, ": ", what));
      };
      while (!stop.load()) {
        StatusOr<Message> reply = CallOn(channel, PushRequest({kEmb}, {keys}, {grads}));
        if (!reply.ok()) return fail(absl::StrCat("push: ", reply.status().ToString()));
        pushes.fetch_add(1);
        StatusOr<std::vector<float>> rows = Pull(kEmb, keys, &channel);
        if (!rows.ok()) return fail(absl::StrCat("pull: ", rows.status().ToString()));
        // Every row is the checkpoint's (one push) plus whole pushes: SGD
        // from zero makes row i k * -lr * grads of row i, for a whole k >= 1.
        for (size_t i = 0; i < keys.size(); ++i) {
          const double k = (*rows)[i * kDim] / (-kLearningRate * grads[i * kDim]);
          const double whole = std::round(k);
          bool ok = whole >= 1 && std::abs(k - whole) < 1e-2;
          for (uint32_t e = 0; ok && e < kDim; ++e) {
            const double want = whole * -kLearningRate * grads[i * kDim + e];
            ok = std::abs((*rows)[i * kDim + e] - want) <= 1e-3 * (1 + std::abs(want));
          }
          if (!ok) {
            return fail(absl::StrCat("row ", i, " is not a number of whole pushes: ",
                                     (*rows)[i * kDim], " ", (*rows)[i * kDim + 1], " ",
                                     (*rows)[i * kDim + 2], " ", (*rows)[i * kDim + 3]));
          }
        }
      }
    });
  }
  for (int round = 0; round < 10; ++round) {
    // Let some pushes in between (bounded: the workers may have failed).
    const int seen = pushes.load();
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (pushes.load() < seen + 3 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    StatusOr<proto::RestoreReply> restored = Restore(1, checkpoint->path());
    ASSERT_TRUE(restored.ok()) << "round " << round << ": " << restored.status();
  }
  stop = true;
  for (std::thread& worker : workers) worker.join();
  EXPECT_THAT(failures, ::testing::IsEmpty());
  EXPECT_GE(pushes.load(), 30);

  // Quiet now: the checkpoint's values exactly, and pushes apply on them.
  StatusOr<proto::RestoreReply> restored = Restore(1, checkpoint->path());
  ASSERT_TRUE(restored.ok()) << restored.status();
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, *checkpointed);
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_EQ((*rows)[i], Sgd((*checkpointed)[i], grads[i])) << i;
  }
}

TEST_F(ParamServerTest, ServerIdIsStoredAndAskedForAgainOnRestart) {
  TempDir temp;
  StartServer(OptionsWithDataDir(temp.Join("data")));
  EXPECT_FALSE(master_->last_registration().has_stored_server_id()) << "a fresh dir";
  EXPECT_EQ(ReadFile(temp.Join("data/SERVER")), absl::StrCat(kServerId, "\n"));
  server_.reset();

  // Restarted on the same dir: it asks for its slot; the master gives
  // another, which the server takes and records.
  master_->set_server_id(5);
  StartServer(OptionsWithDataDir(temp.Join("data")));
  const proto::RegisterServerRequest registration = master_->last_registration();
  ASSERT_TRUE(registration.has_stored_server_id());
  EXPECT_EQ(registration.stored_server_id(), kServerId);
  EXPECT_EQ(server_->id(), 5u);
  EXPECT_EQ(ReadFile(temp.Join("data/SERVER")), "5\n");
  AwaitMap();  // and serves as ps[5]
  server_.reset();

  // Another fresh dir, and no dir at all: nothing to ask for.
  StartServer(OptionsWithDataDir(temp.Join("fresh")));
  EXPECT_FALSE(master_->last_registration().has_stored_server_id());
  server_.reset();
  StartServer();
  EXPECT_FALSE(master_->last_registration().has_stored_server_id());
}

TEST_F(ParamServerTest, CheckpointDirHoldsEachSlotsCheckpointsForAReplacementServer) {
  JobConfig config;
  config.checkpoint.dir = "/shared/checkpoints";
  EXPECT_EQ(ParamServerOptions::FromConfig(config).storage.checkpoint_dir, "/shared/checkpoints");

  TempDir temp;
  master_->set_server_id(6);
  ParamServerOptions options = OptionsWithDataDir(temp.Join("data"));
  options.storage.checkpoint_dir = temp.Join("shared");
  StartServer(options);
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(10, /*here=*/true);
  StatusOr<std::vector<float>> at_2;
  for (uint64_t id = 1; id <= 4; ++id) {
    ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok());
    if (id == 2) {
      at_2 = Pull(kEmb, keys);
      ASSERT_TRUE(at_2.ok()) << at_2.status();
    }
    // The master keeps 2 (say, the last complete one).
    StatusOr<proto::CheckpointReply> checkpoint =
        Checkpoint(id, id > 2 ? std::vector<uint64_t>{2} : std::vector<uint64_t>{});
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    EXPECT_EQ(checkpoint->path(), temp.Join(absl::StrCat("shared/ps-6/", id)));
  }
  std::set<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(temp.Join("shared/ps-6"))) {
    kept.insert(entry.path().filename().string());
  }
  EXPECT_EQ(kept, (std::set<std::string>{"2", "4"}));
  EXPECT_FALSE(std::filesystem::exists(temp.Join("data/checkpoints")));
  server_.reset();

  // A replacement on a fresh dir takes slot 6 and restores its checkpoint.
  options.storage.data_dir = temp.Join("replacement");
  StartServer(options);
  EXPECT_FALSE(master_->last_registration().has_stored_server_id());
  AwaitMap();
  StatusOr<proto::RestoreReply> restored = Restore(2, temp.Join("shared/ps-6/2"));
  ASSERT_TRUE(restored.ok()) << restored.status();
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, *at_2);
}

TEST_F(ParamServerTest, AServerThatCannotWriteSaysSoInEveryHeartbeat) {
  TempDir temp;
  std::ofstream(temp.Join("file")) << "x";
  ParamServerOptions options = OptionsWithDataDir(temp.Join("data"));
  options.storage.checkpoint_dir = temp.Join("file/checkpoints");  // can never be made
  StartServer(options);
  AwaitMap();
  ASSERT_TRUE(master_->AwaitHeartbeats(master_->heartbeats() + 1, absl::Seconds(5)));
  EXPECT_EQ(master_->last_heartbeat().storage_error(), "");
  EXPECT_EQ(Checkpoint(1, {}).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(master_->AwaitHeartbeats(master_->heartbeats() + 2, absl::Seconds(5)));
  EXPECT_THAT(master_->last_heartbeat().storage_error(),
              HasSubstr("cannot create checkpoint dir " + temp.Join("file/checkpoints/ps-3")));
}

}  // namespace
}  // namespace eps
