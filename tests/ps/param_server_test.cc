// Tests ps/param_server.h in-process against a fake master: an RpcServer on
// loopback (ephemeral port) that registers the server, hands it a job of an
// embedding table and a dense tensor, answers heartbeats as the test says,
// and serves a cluster map giving the server the even partitions (the odd
// ones belong to a server that does not exist). The test then speaks PULL
// and PUSH (as workers), and FENCE_WORKERS, CHECKPOINT and RESTORE (as the
// master) to the server's endpoint over RpcChannels.

#include "ps/param_server.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::TempDir;
using ::testing::HasSubstr;

constexpr uint32_t kPartitions = 8;
constexpr uint32_t kServerId = 3;
constexpr uint32_t kOtherServerId = 9;
constexpr uint32_t kEmb = 0;    // EMBEDDING, dim 4
constexpr uint32_t kDense = 1;  // DENSE, dim 4, 38 floats = 10 chunks
constexpr uint32_t kDim = 4;
constexpr uint64_t kDenseChunks = 10;
constexpr float kLearningRate = 0.1f;

proto::JobSpec MakeJob() {
  proto::JobSpec job;
  job.set_name("param-server-test");
  job.set_seed(17);
  job.set_num_partitions(kPartitions);
  proto::TableSpec* emb = job.add_tables();
  emb->set_id(kEmb);
  emb->set_name("emb");
  emb->set_kind(proto::EMBEDDING);
  emb->set_dim(kDim);
  emb->mutable_initializer()->set_kind(proto::InitializerSpec::ZEROS);
  emb->mutable_optimizer()->set_kind(proto::OptimizerSpec::SGD);
  emb->mutable_optimizer()->set_learning_rate(kLearningRate);
  proto::TableSpec* dense = job.add_tables();
  *dense = *emb;
  dense->set_id(kDense);
  dense->set_name("dense");
  dense->set_kind(proto::DENSE);
  dense->set_dense_size(38);
  return job;
}

bool OwnedHere(uint64_t key) { return PartitionOf(key, kPartitions) % 2 == 0; }

// `n` embedding keys that the fake map puts on this server (or elsewhere).
std::vector<uint64_t> EmbKeys(size_t n, bool here) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; keys.size() < n; ++i) {
    const uint64_t key = 0x9e3779b97f4a7c15ULL * i;
    if (OwnedHere(key) == here) keys.push_back(key);
  }
  return keys;
}

// The dense tensor's chunk keys that the fake map puts on this server.
std::vector<uint64_t> DenseKeysHere() {
  std::vector<uint64_t> keys;
  for (uint64_t c = 0; c < kDenseChunks; ++c) {
    if (OwnedHere(DenseChunkKey(kDense, c))) keys.push_back(DenseChunkKey(kDense, c));
  }
  return keys;
}

// A fake master; the test sets its answers and reads what it saw.
class FakeMaster {
 public:
  explicit FakeMaster(SocketFactory* factory) {
    RpcServerOptions options;
    options.name = "fake-master";
    StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(
        factory, options,
        [this](Message& request, Message* reply) { return Handle(request, reply); });
    CHECK_OK(server.status());
    server_ = std::move(server).value();
    endpoint_ = server_->endpoint();
  }

  const std::string& endpoint() const { return endpoint_; }
  // Stops answering; the port is closed.
  void Stop() { server_->Stop(); }

  void set_job(proto::JobSpec job) {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
  }
  // The map version heartbeats announce (0: not placed yet).
  void set_map_version(uint64_t version) {
    absl::MutexLock lock(&mu_);
    map_version_ = version;
  }
  void set_shutdown(bool shutdown) {
    absl::MutexLock lock(&mu_);
    shutdown_ = shutdown;
  }
  // The id REGISTER_SERVER assigns (and the map and heartbeats expect).
  void set_server_id(uint32_t id) {
    absl::MutexLock lock(&mu_);
    server_id_ = id;
  }
  // The last REGISTER_SERVER request.
  proto::RegisterServerRequest last_registration() const {
    absl::MutexLock lock(&mu_);
    return last_registration_;
  }
  void set_heartbeat_error(Status status) {
    absl::MutexLock lock(&mu_);
    heartbeat_error_ = std::move(status);
  }
  // REGISTER_SERVER is held (for at most 5 s) until ReleaseRegister; the
  // registered endpoint is known before that.
  void HoldRegister() {
    absl::MutexLock lock(&mu_);
    hold_register_ = true;
  }
  void ReleaseRegister() { release_.Notify(); }
  // Waits until a server has asked to register; its endpoint.
  std::string AwaitRegistration(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::string* endpoint) { return !endpoint->empty(); }, &registered_endpoint_),
        timeout);
    return registered_endpoint_;
  }

  // Waits until `heartbeats` heartbeats have been answered; false on timeout.
  bool AwaitHeartbeats(int heartbeats, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return heartbeats_ >= heartbeats; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // Waits until a heartbeat reports at least `pushes` pushes; the stats of
  // the last heartbeat.
  proto::ServerStats AwaitPushes(uint64_t pushes, absl::Duration timeout) {
    return AwaitStats([&](const proto::ServerStats& stats) { return stats.pushes() >= pushes; },
                      timeout);
  }
  // Waits until a heartbeat's stats satisfy `done`; the stats of the last
  // heartbeat.
  proto::ServerStats AwaitStats(const std::function<bool(const proto::ServerStats&)>& done,
                                absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done(last_stats_); };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return last_stats_;
  }

 private:
  Status Handle(Message& request, Message* reply) {
    switch (request.header().method()) {
      case proto::REGISTER_SERVER: {
        bool hold = false;
        {
          absl::MutexLock lock(&mu_);
          registered_endpoint_ = request.header().register_server_request().endpoint();
          last_registration_ = request.header().register_server_request();
          hold = hold_register_;
          proto::RegisterServerReply* body = reply->header().mutable_register_server_reply();
          body->set_server_id(server_id_);
          *body->mutable_job() = job_;
        }
        if (hold) release_.WaitForNotificationWithTimeout(absl::Seconds(5));
        return absl::OkStatus();
      }
      case proto::HEARTBEAT: {
        absl::MutexLock lock(&mu_);
        ++heartbeats_;
        EXPECT_EQ(request.header().sender().role(), proto::ROLE_SERVER);
        EXPECT_EQ(request.header().sender().id(), server_id_);
        last_stats_ = request.header().heartbeat_request().server();
        if (!heartbeat_error_.ok()) return heartbeat_error_;
        proto::HeartbeatReply* body = reply->header().mutable_heartbeat_reply();
        body->set_state(shutdown_ ? proto::JOB_FINISHED : proto::JOB_RUNNING);
        body->set_shutdown(shutdown_);
        body->set_cluster_map_version(map_version_);
        return absl::OkStatus();
      }
      case proto::GET_CLUSTER_MAP: {
        absl::MutexLock lock(&mu_);
        proto::ClusterMap* map = reply->header().mutable_get_cluster_map_reply()->mutable_map();
        map->set_version(map_version_);
        map->set_num_partitions(kPartitions);
        proto::ServerInfo* here = map->add_servers();
        here->set_id(server_id_);
        here->set_endpoint(registered_endpoint_);
        proto::ServerInfo* other = map->add_servers();
        other->set_id(kOtherServerId);
        other->set_endpoint("tcp://127.0.0.1:9");
        for (uint32_t p = 0; p < kPartitions; ++p) {
          map->add_partition_owner(p % 2 == 0 ? server_id_ : kOtherServerId);
        }
        return absl::OkStatus();
      }
      default:
        return absl::UnimplementedError("fake master");
    }
  }

  mutable absl::Mutex mu_;
  proto::JobSpec job_ ABSL_GUARDED_BY(mu_) = MakeJob();
  uint32_t server_id_ ABSL_GUARDED_BY(mu_) = kServerId;
  proto::RegisterServerRequest last_registration_ ABSL_GUARDED_BY(mu_);
  uint64_t map_version_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  Status heartbeat_error_ ABSL_GUARDED_BY(mu_);
  bool hold_register_ ABSL_GUARDED_BY(mu_) = false;
  std::string registered_endpoint_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  proto::ServerStats last_stats_ ABSL_GUARDED_BY(mu_);
  absl::Notification release_;
  std::string endpoint_;
  // Last: stopped (joining its threads) before the state above goes.
  std::unique_ptr<RpcServer> server_;
};

// A PULL of `keys` frames, one per table id.
Message PullRequest(const std::vector<uint32_t>& table_ids,
                    const std::vector<std::vector<uint64_t>>& keys) {
  Message request;
  request.header().set_method(proto::PULL);
  for (uint32_t id : table_ids) request.header().mutable_pull_request()->add_table_ids(id);
  for (const auto& frame : keys) request.AddArray(frame);
  return request;
}

// A rising push sequence number, as a worker's push client numbers them.
uint64_t NextSeq() {
  static std::atomic<uint64_t> seq{0};
  return ++seq;
}

// A PUSH: for each table id, its keys frame then its gradients frame.
Message PushRequest(const std::vector<uint32_t>& table_ids,
                    const std::vector<std::vector<uint64_t>>& keys,
                    const std::vector<std::vector<float>>& grads, uint64_t client_seq = NextSeq()) {
  Message request;
  request.header().set_method(proto::PUSH);
  request.header().mutable_push_request()->set_client_seq(client_seq);
  for (uint32_t id : table_ids) request.header().mutable_push_request()->add_table_ids(id);
  for (size_t i = 0; i < keys.size(); ++i) {
    request.AddArray(keys[i]);
    if (i < grads.size()) request.AddArray(grads[i]);
  }
  return request;
}

// Gradients for `n` rows: element e of row i is (i + 1) * 0.5 - e * 0.25.
std::vector<float> Grads(size_t n) {
  std::vector<float> grads(n * kDim);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t e = 0; e < kDim; ++e) grads[i * kDim + e] = (i + 1) * 0.5f - e * 0.25f;
  }
  return grads;
}

// One SGD step (l2 = 0), computed the way the server does.
float Sgd(float weight, float grad) {
  weight -= kLearningRate * grad;
  return weight;
}

class ParamServerTest : public ::testing::Test {
 protected:
  ParamServerOptions Options() const {
    ParamServerOptions options;
    options.master = master_->endpoint();
    options.host = "127.0.0.1";
    options.heartbeat = absl::Milliseconds(50);
    options.master_wait = absl::Seconds(2);
    options.rpc_timeout = absl::Seconds(2);
    return options;
  }

  void StartServer(const ParamServerOptions& options) {
    server_ = std::make_unique<ParamServer>(options);
    const Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  void StartServer() { StartServer(Options()); }

  StatusOr<Message> Call(Message request) { return CallOn(channel_, std::move(request)); }
  StatusOr<Message> CallOn(RpcChannel& channel, Message request) {
    CallOptions call;
    call.attempt_timeout = absl::Seconds(3);
    call.max_attempts = 1;
    return channel.Call(server_->endpoint(), std::move(request), call);
  }

  // FENCE_WORKERS of `workers` sent by `channel` (the master by default);
  // the reply's count of fenced workers.
  StatusOr<uint64_t> Fence(const std::vector<uint32_t>& workers, RpcChannel* channel = nullptr) {
    Message request;
    request.header().set_method(proto::FENCE_WORKERS);
    proto::FenceWorkersRequest* body = request.header().mutable_fence_workers_request();
    for (uint32_t worker : workers) body->add_worker_ids(worker);
    body->set_membership_epoch(7);
    ASSIGN_OR_RETURN(Message reply,
                     CallOn(channel != nullptr ? *channel : master_channel_, std::move(request)));
    if (!reply.header().has_fence_workers_reply()) return absl::DataLossError("no reply body");
    return reply.header().fence_workers_reply().fenced();
  }

  // Pulls `keys` of `table` (as worker 1 unless `channel` says otherwise),
  // retrying while the server is NOT_READY (it gets the map with its first
  // heartbeats).
  StatusOr<std::vector<float>> Pull(uint32_t table, const std::vector<uint64_t>& keys,
                                    RpcChannel* channel = nullptr) {
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (true) {
      StatusOr<Message> reply =
          CallOn(channel != nullptr ? *channel : channel_, PullRequest({table}, {keys}));
      if (!reply.ok()) {
        if (ReasonOf(reply.status()) == proto::NOT_READY && absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(5));  // polling for the map, bounded
          continue;
        }
        return reply.status();
      }
      if (reply->num_frames() != 1) return absl::DataLossError("want 1 frame");
      ASSIGN_OR_RETURN(std::span<const float> rows, reply->Array<float>(0));
      return std::vector<float>(rows.begin(), rows.end());
    }
  }

  Status Push(uint32_t table, const std::vector<uint64_t>& keys, const std::vector<float>& grads) {
    return Call(PushRequest({table}, {keys}, {grads})).status();
  }

  // CHECKPOINT `id` sent by `channel` (the master by default).
  StatusOr<proto::CheckpointReply> Checkpoint(uint64_t id,
                                              const std::vector<uint64_t>& keep_ids = {},
                                              RpcChannel* channel = nullptr) {
    Message request;
    request.header().set_method(proto::CHECKPOINT);
    proto::CheckpointRequest* body = request.header().mutable_checkpoint_request();
    body->set_checkpoint_id(id);
    for (uint64_t keep : keep_ids) body->add_keep_ids(keep);
    ASSIGN_OR_RETURN(Message reply,
                     CallOn(channel != nullptr ? *channel : master_channel_, std::move(request)));
    if (!reply.header().has_checkpoint_reply()) return absl::DataLossError("no reply body");
    return reply.header().checkpoint_reply();
  }

  // RESTORE of checkpoint `id` from `path`, sent by `channel` (the master
  // by default).
  StatusOr<proto::RestoreReply> Restore(uint64_t id, const std::string& path,
                                        RpcChannel* channel = nullptr) {
    Message request;
    request.header().set_method(proto::RESTORE);
    proto::RestoreRequest* body = request.header().mutable_restore_request();
    body->set_checkpoint_id(id);
    body->set_path(path);
    ASSIGN_OR_RETURN(Message reply,
                     CallOn(channel != nullptr ? *channel : master_channel_, std::move(request)));
    if (!reply.header().has_restore_reply()) return absl::DataLossError("no reply body");
    return reply.header().restore_reply();
  }

  // Options of a server keeping its rows in `data_dir`.
  ParamServerOptions OptionsWithDataDir(const std::string& data_dir) const {
    ParamServerOptions options = Options();
    options.storage.data_dir = data_dir;
    return options;
  }

  // Blocks until the server serves (it has the map).
  void AwaitMap() {
    StatusOr<std::vector<float>> rows = Pull(kEmb, EmbKeys(1, /*here=*/true));
    ASSERT_TRUE(rows.ok()) << rows.status();
  }

  // Declared first: destroyed after the server, the master and the channel.
  SocketFactory factory_;
  std::unique_ptr<FakeMaster> master_ = std::make_unique<FakeMaster>(&factory_);
  static proto::NodeId Node(proto::Role role, uint32_t id) {
    proto::NodeId node;
    node.set_role(role);
    node.set_id(id);
    return node;
  }
  RpcChannel channel_{&factory_, Node(proto::ROLE_WORKER, 1)};
  RpcChannel other_worker_{&factory_, Node(proto::ROLE_WORKER, 2)};
  RpcChannel master_channel_{&factory_, Node(proto::ROLE_MASTER, 0)};
  // Destroyed before the master: its heartbeats find the master until the end.
  std::unique_ptr<ParamServer> server_;
};

TEST_F(ParamServerTest, PullCreatesRowsAndPushAppliesSgdExactly) {
  StartServer();
  EXPECT_EQ(server_->id(), kServerId);
  EXPECT_EQ(master_->AwaitRegistration(absl::Seconds(1)), server_->endpoint());
  EXPECT_THAT(server_->endpoint(), HasSubstr("tcp://127.0.0.1:"));

  std::vector<uint64_t> keys = EmbKeys(20, /*here=*/true);
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(keys.size() * kDim, 0.0f));

  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  // A second push with one key twice: applied one after the other.
  std::vector<uint64_t> again = {keys[0], keys[5], keys[0]};
  std::vector<float> again_grads = Grads(again.size());
  ASSERT_TRUE(Push(kEmb, again, again_grads).ok());

  std::vector<float> expected(keys.size() * kDim);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t e = 0; e < kDim; ++e) {
      expected[i * kDim + e] = Sgd(0.0f, grads[i * kDim + e]);
    }
  }
  for (uint32_t e = 0; e < kDim; ++e) {
    expected[0 * kDim + e] =
        Sgd(Sgd(expected[0 * kDim + e], again_grads[0 * kDim + e]), again_grads[2 * kDim + e]);
    expected[5 * kDim + e] = Sgd(expected[5 * kDim + e], again_grads[1 * kDim + e]);
  }
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, expected);

  // The dense tensor: chunks of 4 floats, placed like embedding rows.
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  rows = Pull(kDense, chunks);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(chunks.size() * kDim, 0.0f));
  const std::vector<float> dense_grads = Grads(chunks.size());
  ASSERT_TRUE(Push(kDense, chunks, dense_grads).ok());
  rows = Pull(kDense, chunks);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (size_t i = 0; i < dense_grads.size(); ++i) {
    EXPECT_EQ((*rows)[i], Sgd(0.0f, dense_grads[i])) << i;
  }

  // Both tables in one request, in either order.
  StatusOr<Message> reply = Call(PullRequest({kDense, kEmb}, {chunks, keys}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->num_frames(), 2u);
  EXPECT_EQ(reply->frame(0).size(), chunks.size() * kDim * sizeof(float));
  StatusOr<std::span<const float>> emb_rows = reply->Array<float>(1);
  ASSERT_TRUE(emb_rows.ok());
  EXPECT_EQ(std::vector<float>(emb_rows->begin(), emb_rows->end()), expected);
}

TEST_F(ParamServerTest, HeartbeatsCarryStats) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(7, /*here=*/true);
  ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok());
  const proto::ServerStats stats = master_->AwaitPushes(1, absl::Seconds(3));
  EXPECT_EQ(stats.pushes(), 1u);
  EXPECT_GE(stats.pulls(), 1u);
  EXPECT_GE(stats.rows(), keys.size());
}

TEST_F(ParamServerTest, KeysOfOtherPartitionsAreWrongOwner) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> elsewhere = EmbKeys(3, /*here=*/false);
  StatusOr<std::vector<float>> rows = Pull(kEmb, elsewhere);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kFailedPrecondition) << rows.status();
  EXPECT_EQ(ReasonOf(rows.status()), proto::WRONG_OWNER);

  // A push mixing its own keys with another server's applies nothing.
  std::vector<uint64_t> mixed = EmbKeys(4, /*here=*/true);
  mixed.push_back(elsewhere[0]);
  const Status pushed = Push(kEmb, mixed, Grads(mixed.size()));
  EXPECT_EQ(pushed.code(), absl::StatusCode::kFailedPrecondition) << pushed;
  EXPECT_EQ(ReasonOf(pushed), proto::WRONG_OWNER);
  mixed.pop_back();
  rows = Pull(kEmb, mixed);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(mixed.size() * kDim, 0.0f));

  // Dense chunks are placed the same way.
  std::vector<uint64_t> dense_elsewhere;
  for (uint64_t c = 0; c < kDenseChunks; ++c) {
    if (!OwnedHere(DenseChunkKey(kDense, c))) dense_elsewhere.push_back(DenseChunkKey(kDense, c));
  }
  ASSERT_FALSE(dense_elsewhere.empty());
  rows = Pull(kDense, dense_elsewhere);
  EXPECT_EQ(ReasonOf(rows.status()), proto::WRONG_OWNER) << rows.status();
}

TEST_F(ParamServerTest, NotReadyUntilTheMasterHasPlacedPartitions) {
  master_->set_map_version(0);  // heartbeats say: no map yet
  StartServer();
  const std::vector<uint64_t> keys = EmbKeys(2, /*here=*/true);
  // Several heartbeats have been answered, none announcing a map.
  ASSERT_TRUE(master_->AwaitHeartbeats(3, absl::Seconds(3)));
  StatusOr<Message> reply = Call(PullRequest({kEmb}, {keys}));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY);
  reply = Call(PushRequest({kEmb}, {keys}, {Grads(keys.size())}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();

  master_->set_map_version(1);
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);  // retries while NOT_READY
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(keys.size() * kDim, 0.0f));  // the push was not applied
}

TEST_F(ParamServerTest, NotReadyWhileStillRegistering) {
  // A request that reaches the port while Start is still waiting for the
  // master's reply (tables not yet made) is told to come back, not served
  // from half-built state.
  master_->HoldRegister();
  Status started;
  server_ = std::make_unique<ParamServer>(Options());
  std::thread starter([&] { started = server_->Start(); });
  const std::string endpoint = master_->AwaitRegistration(absl::Seconds(3));
  const std::vector<uint64_t> keys = EmbKeys(2, /*here=*/true);
  StatusOr<Message> reply = absl::UnknownError("no server registered");
  if (!endpoint.empty()) {
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(500);  // the server's Start waits 1 s per attempt
    call.max_attempts = 1;
    reply = channel_.Call(endpoint, PullRequest({kEmb}, {keys}), call);
  }
  master_->ReleaseRegister();
  starter.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();
  ASSERT_TRUE(started.ok()) << started;
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  EXPECT_TRUE(rows.ok()) << rows.status();
}

TEST_F(ParamServerTest, RejectsMalformedRequestsWithoutTouchingTables) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(3, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  StatusOr<std::vector<float>> before = Pull(kEmb, keys);
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  StatusOr<std::vector<float>> dense_before = Pull(kDense, chunks);
  ASSERT_TRUE(dense_before.ok()) << dense_before.status();

  auto expect_invalid = [&](Message request, const std::string& what) {
    StatusOr<Message> reply = Call(std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << reply.status();
    StatusOr<std::vector<float>> after = Pull(kEmb, keys);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, *before) << what << " changed the embedding table";
    after = Pull(kDense, chunks);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, *dense_before) << what << " changed the dense table";
  };

  expect_invalid(PullRequest({7}, {keys}), "PULL of an unknown table");
  expect_invalid(PushRequest({7}, {keys}, {grads}), "PUSH to an unknown table");
  expect_invalid(PullRequest({kEmb, kDense}, {keys}), "PULL of 2 tables with 1 frame");
  expect_invalid(PullRequest({kEmb}, {keys, keys}), "PULL of 1 table with 2 frames");
  expect_invalid(PullRequest({}, {}), "PULL of no table");
  expect_invalid(PushRequest({kEmb}, {keys}, {}), "PUSH with keys but no gradients");
  expect_invalid(PushRequest({kEmb, kDense}, {keys, chunks}, {grads}),
                 "PUSH of 2 tables with 3 frames");
  {
    Message request;
    request.header().set_method(proto::PULL);  // no PullRequest body
    request.AddArray(keys);
    expect_invalid(std::move(request), "PULL without a body");
  }
  {
    Message request = PullRequest({kEmb}, {});
    const char twelve_bytes[12] = {};
    request.AddFrame(zmq::message_t(twelve_bytes, sizeof(twelve_bytes)));
    expect_invalid(std::move(request), "PULL keys frame of 12 bytes");
  }
  {
    Message request = PushRequest({kEmb}, {}, {});
    const char twelve_bytes[12] = {};
    request.AddFrame(zmq::message_t(twelve_bytes, sizeof(twelve_bytes)));
    request.AddArray(grads);
    expect_invalid(std::move(request), "PUSH keys frame of 12 bytes");
  }
  {
    std::vector<float> short_grads = grads;
    short_grads.pop_back();
    expect_invalid(PushRequest({kEmb}, {keys}, {short_grads}), "PUSH with too few gradients");
    std::vector<float> long_grads = grads;
    long_grads.push_back(1.0f);
    expect_invalid(PushRequest({kEmb}, {keys}, {long_grads}), "PUSH with too many gradients");
  }
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> bad_grads = grads;
    bad_grads[5] = bad;
    expect_invalid(PushRequest({kEmb}, {keys}, {bad_grads}),
                   absl::StrCat("PUSH with gradient ", bad));
    // The bad table second: the first, valid one must not be applied either.
    std::vector<float> bad_dense = Grads(chunks.size());
    bad_dense.back() = bad;
    expect_invalid(PushRequest({kEmb, kDense}, {keys, chunks}, {grads, bad_dense}),
                   absl::StrCat("PUSH of 2 tables, the second with gradient ", bad));
  }
  // Dense keys must be chunks of their own tensor.
  expect_invalid(PullRequest({kDense}, {{DenseChunkKey(kDense, kDenseChunks)}}),
                 "PULL of the chunk past the end");
  expect_invalid(PullRequest({kDense}, {{DenseChunkKey(kEmb, 0)}}),
                 "PULL of another table's chunk");
  expect_invalid(PullRequest({kDense}, {{keys[0]}}), "PULL of an embedding key as a chunk");
  expect_invalid(
      PushRequest({kEmb, kDense}, {keys, {DenseChunkKey(kDense, 1u << 20)}}, {grads, Grads(1)}),
      "PUSH of a chunk far past the end");
}

TEST_F(ParamServerTest, FencedWorkerIsRefusedAndOthersAreNot) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(5, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  StatusOr<std::vector<float>> before = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(before.ok()) << before.status();

  StatusOr<uint64_t> fenced = Fence({1});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 1u);

  // Worker 1: everything refused with FENCED, even a malformed push.
  StatusOr<Message> reply = Call(PullRequest({kEmb}, {keys}));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("worker 1 is fenced"));
  reply = Call(PushRequest({kEmb}, {keys}, {grads}));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  reply = Call(PushRequest({7}, {keys}, {grads}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();

  // Worker 2 sees the table as worker 1 left it, and is served as before.
  StatusOr<std::vector<float>> after = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
  reply = CallOn(other_worker_, PushRequest({kEmb}, {keys}, {grads}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());
  after = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(after.ok()) << after.status();
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ((*after)[i], Sgd((*before)[i], grads[i])) << i;
  }

  // Only workers are fenced by worker id: a tool with id 1 is not.
  RpcChannel tool(&factory_, Node(proto::ROLE_TOOL, 1));
  EXPECT_TRUE(Pull(kEmb, keys, &tool).ok());

  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.pushes_fenced() >= 2 && s.pushes() >= 2; },
      absl::Seconds(3));
  EXPECT_EQ(stats.pushes_fenced(), 2u);
  EXPECT_EQ(stats.pushes(), 2u);
}

TEST_F(ParamServerTest, FenceWorkersIsIdempotentMasterOnlyAndServedBeforeTheMap) {
  master_->set_map_version(0);  // no map: PULL and PUSH are NOT_READY
  StartServer();
  ASSERT_TRUE(master_->AwaitHeartbeats(2, absl::Seconds(3)));

  StatusOr<uint64_t> fenced = Fence({5, 7});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 2u);
  fenced = Fence({5, 7});  // re-sent: nothing changes
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 2u);
  fenced = Fence({5, 7, 9});  // the list grew
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 3u);
  fenced = Fence({});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 3u);

  // Only the master may fence.
  fenced = Fence({1}, &channel_);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kPermissionDenied) << fenced.status();
  RpcChannel server(&factory_, Node(proto::ROLE_SERVER, 4));
  fenced = Fence({1}, &server);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kPermissionDenied) << fenced.status();
  {
    Message request;
    request.header().set_method(proto::FENCE_WORKERS);  // no body
    StatusOr<Message> reply = CallOn(master_channel_, std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
  }

  // Still no map: a fenced worker hears FENCED, the others NOT_READY.
  const std::vector<uint64_t> keys = EmbKeys(2, /*here=*/true);
  RpcChannel worker5(&factory_, Node(proto::ROLE_WORKER, 5));
  StatusOr<Message> reply = CallOn(worker5, PushRequest({kEmb}, {keys}, {Grads(keys.size())}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  reply = Call(PullRequest({kEmb}, {keys}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();

  // With the map the fence still holds.
  master_->set_map_version(1);
  AwaitMap();
  reply = CallOn(worker5, PullRequest({kEmb}, {keys}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  fenced = Fence({1});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 4u);
}

TEST_F(ParamServerTest, FenceWorkersIsServedWhileStillRegistering) {
  master_->HoldRegister();
  Status started;
  server_ = std::make_unique<ParamServer>(Options());
  std::thread starter([&] { started = server_->Start(); });
  const std::string endpoint = master_->AwaitRegistration(absl::Seconds(3));
  StatusOr<Message> reply = absl::UnknownError("no server registered");
  if (!endpoint.empty()) {
    Message request;
    request.header().set_method(proto::FENCE_WORKERS);
    request.header().mutable_fence_workers_request()->add_worker_ids(1);
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(500);  // the server's Start waits 1 s per attempt
    call.max_attempts = 1;
    reply = master_channel_.Call(endpoint, std::move(request), call);
  }
  master_->ReleaseRegister();
  starter.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header().fence_workers_reply().fenced(), 1u);
  ASSERT_TRUE(started.ok()) << started;
  StatusOr<std::vector<float>> rows = Pull(kEmb, EmbKeys(1, /*here=*/true));
  EXPECT_EQ(ReasonOf(rows.status()), proto::FENCED) << rows.status();
}

TEST_F(ParamServerTest, RetriedPushIsAppliedOnce) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(6, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  const uint64_t seq = NextSeq();

  // The same request delivered twice (a retry after a lost reply).
  StatusOr<Message> reply = Call(PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());
  reply = Call(PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->header().has_push_reply());
  EXPECT_FALSE(reply->header().push_reply().applied());
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<float> expected(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) expected[i] = Sgd(0.0f, grads[i]);
  EXPECT_EQ(*rows, expected);

  // The same number from another worker is another push.
  reply = CallOn(other_worker_, PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());
  for (size_t i = 0; i < grads.size(); ++i) expected[i] = Sgd(expected[i], grads[i]);
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, expected);

  // Without a sequence number (0) every delivery is applied.
  for (int i = 0; i < 2; ++i) {
    reply = Call(PushRequest({kEmb}, {keys}, {grads}, /*client_seq=*/0));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(reply->header().push_reply().applied());
    for (size_t j = 0; j < grads.size(); ++j) expected[j] = Sgd(expected[j], grads[j]);
  }
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, expected);

  // A rejected push records nothing: resent valid, it is applied.
  const uint64_t next = NextSeq();
  std::vector<float> bad = grads;
  bad[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Call(PushRequest({kEmb}, {keys}, {bad}, next)).status().code(),
            absl::StatusCode::kInvalidArgument);
  reply = Call(PushRequest({kEmb}, {keys}, {grads}, next));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());

  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.pushes() >= 5; }, absl::Seconds(3));
  EXPECT_EQ(stats.pushes(), 5u);
  EXPECT_EQ(stats.pushes_deduplicated(), 1u);
  EXPECT_EQ(stats.pushes_fenced(), 0u);
}

TEST_F(ParamServerTest, OtherMethodsAreUnimplemented) {
  StartServer();
  AwaitMap();
  for (proto::Method method : {proto::GET_SHARD, proto::HEARTBEAT, proto::METHOD_UNSPECIFIED}) {
    Message request;
    request.header().set_method(method);
    StatusOr<Message> reply = Call(std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnimplemented)
        << proto::Method_Name(method) << ": " << reply.status();
  }
}

TEST_F(ParamServerTest, ShutdownFromTheMasterEndsWait) {
  StartServer();
  AwaitMap();
  master_->set_shutdown(true);
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ParamServerTest, RequestStopEndsWait) {
  StartServer();
  server_->RequestStop();
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ParamServerTest, StartFailsWhenTheMasterIsUnreachable) {
  // The master's port is closed: nobody listens there.
  std::string dead;
  {
    StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &dead);
    ASSERT_TRUE(router.ok()) << router.status();
    router->close();
  }
  ParamServerOptions options = Options();
  options.master = dead;
  options.master_wait = absl::Seconds(2);
  ParamServer server(options);
  const absl::Time start = absl::Now();
  const Status started = server.Start();
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(started.code() == absl::StatusCode::kDeadlineExceeded ||
              started.code() == absl::StatusCode::kUnavailable)
      << started;
  EXPECT_THAT(started.message(), HasSubstr(dead));
  EXPECT_LT(took, absl::Seconds(4));
  EXPECT_EQ(server.Wait().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ParamServerTest, StartRefusesAJobWithBadTableIds) {
  proto::JobSpec job = MakeJob();
  job.mutable_tables(1)->set_id(5);
  master_->set_job(job);
  ParamServer server(Options());
  const Status started = server.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kInvalidArgument) << started;
}

TEST_F(ParamServerTest, LosingTheMasterEndsWaitWithUnavailable) {
  ParamServerOptions options = Options();
  options.master_wait = absl::Seconds(1);
  StartServer(options);
  AwaitMap();
  master_->Stop();
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(waited.message(), HasSubstr(master_->endpoint()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST_F(ParamServerTest, FencedHeartbeatEndsWaitWithFailedPrecondition) {
  StartServer();
  AwaitMap();
  master_->set_heartbeat_error(ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                               "ps[3] is not registered", proto::FENCED));
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition) << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

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

TEST_F(ParamServerTest, RestoreIsForTheMasterAndToolsOnlyAndValidatesItsBody) {
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
  for (RpcChannel* sender : {&channel_, &server}) {
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

  // An operator's tool may.
  RpcChannel tool(&factory_, Node(proto::ROLE_TOOL, 1));
  restored = Restore(1, checkpoint->path(), &tool);
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

}  // namespace
}  // namespace eps
