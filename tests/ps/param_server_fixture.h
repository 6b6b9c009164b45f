// The fixture of the ParamServer tests (tests/ps/param_server*_test.cc): the
// server in-process against a fake master on loopback (an RpcServer on an
// ephemeral port) that registers it, hands it a job of an embedding table and
// a dense tensor, answers heartbeats as the test says and serves a cluster
// map giving it the even partitions. Tests speak PULL and PUSH (as workers)
// and FENCE_WORKERS, CHECKPOINT and RESTORE (as the master) over RpcChannels.
//
// Thread-safety: as each class says; the fixture runs on the test's thread.

#ifndef EPS_TESTS_PS_PARAM_SERVER_FIXTURE_H_
#define EPS_TESTS_PS_PARAM_SERVER_FIXTURE_H_

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


using ::eps::testing::TempDir;
using ::testing::HasSubstr;

inline constexpr uint32_t kPartitions = 8;
inline constexpr uint32_t kServerId = 3;
inline constexpr uint32_t kOtherServerId = 9;
inline constexpr uint32_t kEmb = 0;    // EMBEDDING, dim 4
inline constexpr uint32_t kDense = 1;  // DENSE, dim 4, 38 floats = 10 chunks
inline constexpr uint32_t kDim = 4;
inline constexpr uint64_t kDenseChunks = 10;
inline constexpr float kLearningRate = 0.1f;

inline proto::JobSpec MakeJob() {
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

inline bool OwnedHere(uint64_t key) { return PartitionOf(key, kPartitions) % 2 == 0; }

// `n` embedding keys that the fake map puts on this server (or elsewhere).
inline std::vector<uint64_t> EmbKeys(size_t n, bool here) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; keys.size() < n; ++i) {
    const uint64_t key = 0x9e3779b97f4a7c15ULL * i;
    if (OwnedHere(key) == here) keys.push_back(key);
  }
  return keys;
}

// The dense tensor's chunk keys that the fake map puts on this server.
inline std::vector<uint64_t> DenseKeysHere() {
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
  // The map gives this server the odd partitions instead of the even ones
  // (every partition moved); announce it with a new map version.
  void set_partitions_moved(bool moved) {
    absl::MutexLock lock(&mu_);
    partitions_moved_ = moved;
  }
  // The moves heartbeat replies name this server the old owner of
  // (HeartbeatReply.moves_out).
  void set_moves_out(std::vector<proto::MoveNotice> moves) {
    absl::MutexLock lock(&mu_);
    moves_out_ = std::move(moves);
  }
  // The id REGISTER_SERVER assigns (and the map and heartbeats expect).
  void set_server_id(uint32_t id) {
    absl::MutexLock lock(&mu_);
    server_id_ = id;
  }
  // The last HEARTBEAT request.
  proto::HeartbeatRequest last_heartbeat() const {
    absl::MutexLock lock(&mu_);
    return last_heartbeat_;
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
  // Refuses the next `n` heartbeats with `status`, then answers again.
  void RefuseHeartbeats(int n, Status status) {
    absl::MutexLock lock(&mu_);
    refuse_heartbeats_ = n;
    heartbeat_error_ = std::move(status);
  }
  // REGISTER_SERVER answers `status` (OK: registers).
  void set_register_error(Status status) {
    absl::MutexLock lock(&mu_);
    register_error_ = std::move(status);
  }
  int registrations() const {
    absl::MutexLock lock(&mu_);
    return registrations_;
  }
  int heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
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
          ++registrations_;
          if (!register_error_.ok()) return register_error_;
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
        last_heartbeat_ = request.header().heartbeat_request();
        if (refuse_heartbeats_ > 0 && --refuse_heartbeats_ == 0) {
          const Status refused = heartbeat_error_;
          heartbeat_error_ = absl::OkStatus();
          return refused;
        }
        if (!heartbeat_error_.ok()) return heartbeat_error_;
        proto::HeartbeatReply* body = reply->header().mutable_heartbeat_reply();
        body->set_state(shutdown_ ? proto::JOB_FINISHED : proto::JOB_RUNNING);
        body->set_shutdown(shutdown_);
        body->set_cluster_map_version(map_version_);
        for (const proto::MoveNotice& move : moves_out_) *body->add_moves_out() = move;
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
          map->add_partition_owner((p % 2 == 0) != partitions_moved_ ? server_id_ : kOtherServerId);
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
  bool partitions_moved_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::MoveNotice> moves_out_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  Status heartbeat_error_ ABSL_GUARDED_BY(mu_);
  int refuse_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  Status register_error_ ABSL_GUARDED_BY(mu_);
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  proto::HeartbeatRequest last_heartbeat_ ABSL_GUARDED_BY(mu_);
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
inline Message PullRequest(const std::vector<uint32_t>& table_ids,
                    const std::vector<std::vector<uint64_t>>& keys) {
  Message request;
  request.header().set_method(proto::PULL);
  for (uint32_t id : table_ids) request.header().mutable_pull_request()->add_table_ids(id);
  for (const auto& frame : keys) request.AddArray(frame);
  return request;
}

// A rising push sequence number, as a worker's push client numbers them.
inline uint64_t NextSeq() {
  static std::atomic<uint64_t> seq{0};
  return ++seq;
}

// A PUSH: for each table id, its keys frame then its gradients frame.
inline Message PushRequest(const std::vector<uint32_t>& table_ids,
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
inline std::vector<float> Grads(size_t n) {
  std::vector<float> grads(n * kDim);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t e = 0; e < kDim; ++e) grads[i * kDim + e] = (i + 1) * 0.5f - e * 0.25f;
  }
  return grads;
}

// One SGD step (l2 = 0), computed the way the server does.
inline float Sgd(float weight, float grad) {
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

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace eps

#endif  // EPS_TESTS_PS_PARAM_SERVER_FIXTURE_H_
