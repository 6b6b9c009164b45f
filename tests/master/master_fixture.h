// The fixture of the Master service tests (tests/master/master_*_test.cc):
// the Master in-process, driven over real RPC on loopback by fake servers
// and workers that call it the way ps/param_server.cc and worker/worker.cc
// do.
//
// Every wait polls a condition with a deadline; the only fixed waits are the
// leases the tests let run out.
//
// Thread-safety: as each class says; the fixture runs on the test's thread.

#ifndef EPS_TESTS_MASTER_MASTER_FIXTURE_H_
#define EPS_TESTS_MASTER_MASTER_FIXTURE_H_

#include "master/master.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/job_options.h"
#include "core/job_config.h"
#include "core/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "master/state_store.h"
#include "models/metrics.h"
#include "nlohmann/json.hpp"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"

namespace eps {


using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

inline constexpr int kHeartbeatMs = 100;
inline constexpr int kLeaseMs = 600;

// Generous bounds: a loaded machine must not turn calls into retries.
inline CallOptions Patient() {
  CallOptions options;
  options.attempt_timeout = absl::Seconds(5);
  options.max_attempts = 1;
  return options;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A Criteo record: label, 13 integers (some empty), 26 hex categories.
inline std::string CriteoLine(int label, int i) {
  std::string line = std::to_string(label);
  for (int d = 0; d < 13; ++d) {
    if ((i + d) % 5 == 0) {
      line += '\t';
    } else {
      absl::StrAppend(&line, "\t", (i * 7 + d) % 50);
    }
  }
  for (int c = 0; c < 26; ++c) {
    absl::StrAppend(&line, "\t", absl::Hex((i * 131 + c * 17) % 4096, absl::kZeroPad8));
  }
  return line;
}

// `n` lines; the 1-based line numbers in `malformed` hold garbage.
inline std::string CriteoText(int n, int seed, const std::set<int>& malformed = {},
                       bool final_newline = true) {
  std::string text;
  for (int i = 1; i <= n; ++i) {
    if (malformed.count(i)) {
      text += "this is not a record";
    } else {
      text += CriteoLine(((i * 7 + seed) % 3) == 0 ? 1 : 0, i + 100 * seed);
    }
    if (i < n || final_newline) text += '\n';
  }
  return text;
}

// Byte offset of 1-based line `line` of `text`.
inline uint64_t LineStart(const std::string& text, uint64_t line) {
  uint64_t offset = 0;
  for (uint64_t l = 1; l < line; ++l) offset = text.find('\n', offset) + 1;
  return offset;
}

// What a worker reads for one commit: whole lines from a shard.
struct Piece {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t lines = 0;
  uint64_t malformed = 0;
  std::vector<float> labels;       // one per valid record
  std::vector<float> predictions;  // made up, one per valid record
};

// Splits [shard.start, shard.end) into pieces of `batch_lines` lines,
// parsing the way the worker does (40 tab-separated columns or malformed).
inline std::vector<Piece> ReadPieces(const proto::ShardAssignment& shard, uint64_t batch_lines) {
  const std::string text = ReadFile(shard.path());
  std::vector<Piece> pieces;
  uint64_t offset = shard.start();
  while (offset < shard.end()) {
    Piece piece;
    piece.begin = offset;
    while (piece.lines < batch_lines && offset < shard.end()) {
      const size_t newline = text.find('\n', offset);
      const size_t line_end = newline == std::string::npos ? text.size() : newline;
      const std::string line = text.substr(offset, line_end - offset);
      offset = newline == std::string::npos ? text.size() : newline + 1;
      ++piece.lines;
      const std::vector<std::string> columns = absl::StrSplit(line, '\t');
      if (columns.size() != 40) {
        ++piece.malformed;
        continue;
      }
      const float label = columns[0] == "1" ? 1.0f : 0.0f;
      piece.labels.push_back(label);
      // A noisy score, correlated with the label, ties included.
      const float noise = static_cast<float>(std::hash<std::string>{}(line) % 8) / 8.0f;
      piece.predictions.push_back(0.05f + 0.6f * noise + 0.3f * label);
    }
    piece.end = offset;
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

// A fake server or worker: one RpcChannel to the master, the sender id set
// from the registration reply like real peers do. It registers with the
// shared options of `job` (the master's, unless a test wants otherwise).
class FakePeer {
 public:
  FakePeer(SocketFactory* factory, std::string master, const JobConfig& job)
      : channel_(factory, proto::NodeId()),
        master_(std::move(master)),
        shared_options_(job.SharedOptions()) {
    // Unregistered, it speaks as a worker (whose key a real one would hold).
    SetSelf(proto::ROLE_WORKER, 0);
  }

  uint32_t id() const { return self_.id(); }
  const proto::JobSpec& job() const { return job_; }

  StatusOr<Message> Call(proto::Method method, Message request = Message()) {
    request.header().set_method(method);
    return channel_.Call(master_, std::move(request), Patient());
  }

  Status RegisterServer(const std::string& endpoint, uint32_t pid = 1000,
                        std::optional<uint32_t> stored_id = std::nullopt) {
    Message request;
    proto::RegisterServerRequest* body = request.header().mutable_register_server_request();
    body->set_endpoint(endpoint);
    body->set_hostname("test-host");
    body->set_pid(pid);
    if (stored_id.has_value()) body->set_stored_server_id(*stored_id);
    AddSharedOptions(shared_options_, body->mutable_job_options());
    if (self_.role() != proto::ROLE_SERVER) SetSelf(proto::ROLE_SERVER, 0);  // as real servers
    ASSIGN_OR_RETURN(Message reply, Call(proto::REGISTER_SERVER, std::move(request)));
    SetSelf(proto::ROLE_SERVER, reply.header().register_server_reply().server_id());
    job_ = reply.header().register_server_reply().job();
    return absl::OkStatus();
  }

  // `launch_id` and `launch_secret` as an autoscaler's launch would send.
  Status RegisterWorker(uint64_t launch_id = 0, const std::string& launch_secret = "") {
    Message request;
    proto::RegisterWorkerRequest* body = request.header().mutable_register_worker_request();
    body->set_launch_id(launch_id);
    body->set_launch_secret(launch_secret);
    body->set_hostname("test-host");
    body->set_pid(2000);
    body->set_device("cpu");
    AddSharedOptions(shared_options_, body->mutable_job_options());
    if (self_.role() != proto::ROLE_WORKER) SetSelf(proto::ROLE_WORKER, 0);  // as real workers
    ASSIGN_OR_RETURN(Message reply, Call(proto::REGISTER_WORKER, std::move(request)));
    const proto::RegisterWorkerReply& registered = reply.header().register_worker_reply();
    SetSelf(proto::ROLE_WORKER, registered.worker_id());
    job_ = registered.job();
    heartbeat_ms_ = registered.heartbeat_ms();
    return absl::OkStatus();
  }

  StatusOr<proto::HeartbeatReply> Heartbeat(uint64_t rows = 0, uint64_t paused_for = 0,
                                            const std::string& endpoint = "") {
    Message request;
    proto::HeartbeatRequest* body = request.header().mutable_heartbeat_request();
    body->set_paused_for_checkpoint(paused_for);
    body->set_endpoint(endpoint);
    if (self_.role() == proto::ROLE_SERVER) {
      body->mutable_server()->set_rows(rows);
    } else {
      body->mutable_worker()->set_records_per_s(12.5);
    }
    ASSIGN_OR_RETURN(Message reply, Call(proto::HEARTBEAT, std::move(request)));
    return reply.header().heartbeat_reply();
  }

  StatusOr<proto::GetClusterMapReply> GetClusterMap() {
    Message request;
    request.header().mutable_get_cluster_map_request();
    ASSIGN_OR_RETURN(Message reply, Call(proto::GET_CLUSTER_MAP, std::move(request)));
    return reply.header().get_cluster_map_reply();
  }

  StatusOr<proto::GetShardReply> GetShard() {
    Message request;
    request.header().mutable_get_shard_request();
    ASSIGN_OR_RETURN(Message reply, Call(proto::GET_SHARD, std::move(request)));
    return reply.header().get_shard_reply();
  }

  // Commits `piece` of `shard`; returns CommitProgressReply.applied. EVAL
  // commits carry the piece's labels and predictions.
  StatusOr<bool> Commit(const proto::ShardAssignment& shard, const Piece& piece,
                        double loss_sum = 0) {
    ASSIGN_OR_RETURN(proto::CommitProgressReply reply, CommitReply(shard, piece, loss_sum));
    return reply.applied();
  }

  // As Commit, returning the whole reply.
  StatusOr<proto::CommitProgressReply> CommitReply(const proto::ShardAssignment& shard,
                                                   const Piece& piece, double loss_sum = 0) {
    Message request;
    proto::CommitProgressRequest* body = request.header().mutable_commit_progress_request();
    body->set_shard_id(shard.shard_id());
    body->set_epoch(shard.epoch());
    body->set_phase(shard.phase());
    body->set_begin_offset(piece.begin);
    body->set_end_offset(piece.end);
    body->set_lines(piece.lines);
    body->set_malformed(piece.malformed);
    body->set_loss_sum(loss_sum);
    if (piece.malformed > 0) body->add_malformed_examples(absl::StrCat(shard.path(), ":?: bad"));
    if (shard.phase() == proto::EVAL) {
      request.AddArray(piece.labels);
      request.AddArray(piece.predictions);
    }
    ASSIGN_OR_RETURN(Message reply, Call(proto::COMMIT_PROGRESS, std::move(request)));
    return reply.header().commit_progress_reply();
  }

  // Offers [offset, end) of `shard`, whose record at `offset` is on `line`.
  StatusOr<proto::SplitShardReply> Split(const proto::ShardAssignment& shard, uint64_t offset,
                                         uint64_t line) {
    Message request;
    proto::SplitShardRequest* body = request.header().mutable_split_shard_request();
    body->set_shard_id(shard.shard_id());
    body->set_epoch(shard.epoch());
    body->set_phase(shard.phase());
    body->set_split_offset(offset);
    body->set_split_line(line);
    ASSIGN_OR_RETURN(Message reply, Call(proto::SPLIT_SHARD, std::move(request)));
    return reply.header().split_shard_reply();
  }

  // Speaks as peer `id` of `role` without registering (a peer of a
  // previous master's life, calling a restarted one).
  void ActAs(proto::Role role, uint32_t id) { SetSelf(role, id); }

  Status Deregister() {
    Message request;
    request.header().mutable_deregister_request();
    return Call(proto::DEREGISTER, std::move(request)).status();
  }

  uint32_t heartbeat_ms() const { return heartbeat_ms_; }

 private:
  void SetSelf(proto::Role role, uint32_t id) {
    self_.set_role(role);
    self_.set_id(id);
    channel_.set_self(self_);
  }

  RpcChannel channel_;
  const std::string master_;
  const std::vector<std::pair<std::string, std::string>> shared_options_;
  proto::NodeId self_;
  proto::JobSpec job_;
  uint32_t heartbeat_ms_ = 0;
};

inline void ExpectCode(const Status& status, absl::StatusCode code, proto::ErrorReason reason) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_EQ(ReasonOf(status), reason) << status;
}

class MasterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/master_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override {
    master_.reset();  // joins its threads before the files go
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream out(path, std::ios::binary);
    out << contents;
    out.close();
    return path;
  }

  // A job of 2 servers over 8 partitions, shards of 5 records, 100 ms
  // heartbeats and 600 ms leases; the caller sets data.train.
  MasterOptions Options() {
    MasterOptions options;
    options.port = 0;
    options.http_port = 0;
    options.data_dir = dir_ + "/master";
    options.job.job.name = "master-test";
    options.job.data.shard_records = 5;
    options.job.ps.num_servers = 2;
    options.job.ps.partitions = 8;
    options.job.master.heartbeat_ms = kHeartbeatMs;
    options.job.master.lease_ms = kLeaseMs;
    return options;
  }

  void StartMaster(const MasterOptions& options) {
    job_ = options.job;
    master_ = std::make_unique<Master>(options);
    ASSERT_TRUE(master_->Start().ok());
  }

  std::unique_ptr<FakePeer> Peer() {
    return std::make_unique<FakePeer>(&factory_, master_->rpc_endpoint(), job_);
  }

  // Two registered fake servers. Each listens for the master's
  // FENCE_WORKERS (the master moves a dead worker's shards only once every
  // server refuses that worker) and records the ids it is told, unless
  // told to refuse the call (SetRefuseFences); it answers CHECKPOINT and
  // RESTORE too, recording them.
  void RegisterServers() {
    for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(AddFakeServer(i));
  }

  // Fake server number `i` (0..2): listens, and registers as a fresh
  // server (or, with `stored_id`, as one restarted on its data dir).
  void AddFakeServer(int i, std::optional<uint32_t> stored_id = std::nullopt) {
    RpcServerOptions options;
    options.name = absl::StrCat("fake-ps", i);
    StatusOr<std::unique_ptr<RpcServer>> listener = RpcServer::Start(
        &factory_, options, [this, i](Message& request, Message* reply) -> Status {
          absl::MutexLock lock(&fenced_mu_);
          if (request.header().method() == proto::CHECKPOINT) {
            const uint64_t id = request.header().checkpoint_request().checkpoint_id();
            checkpoints_seen_[i].push_back(id);
            if (refuse_checkpoints_[i]) return absl::InternalError("fake server: disk full");
            proto::CheckpointReply* body = reply->header().mutable_checkpoint_reply();
            body->set_path(absl::StrCat("/fake-ps", i, "/checkpoints/", id));
            body->set_bytes(1000 + i);
            body->set_duration_ms(1);
            return absl::OkStatus();
          }
          if (request.header().method() == proto::RESTORE) {
            const proto::RestoreRequest& body = request.header().restore_request();
            restores_seen_[i].emplace_back(body.checkpoint_id(), body.path());
            if (refuse_restores_[i]) return absl::NotFoundError("fake server: no " + body.path());
            reply->header().mutable_restore_reply()->set_bytes(10);
            return absl::OkStatus();
          }
          if (request.header().method() != proto::FENCE_WORKERS) {
            return absl::UnimplementedError("fake server");
          }
          ++fence_calls_[i];
          if (refuse_fences_[i]) return absl::UnavailableError("fake server refuses to fence");
          for (uint32_t id : request.header().fence_workers_request().worker_ids()) {
            fenced_seen_[i].insert(id);
          }
          reply->header().mutable_fence_workers_reply()->set_fenced(fenced_seen_[i].size());
          return absl::OkStatus();
        });
    ASSERT_TRUE(listener.ok()) << listener.status();
    const std::string endpoint = (*listener)->endpoint();
    fake_server_listeners_.push_back(std::move(*listener));
    servers_.push_back(Peer());
    ASSERT_TRUE(servers_.back()->RegisterServer(endpoint, 1000 + i, stored_id).ok());
  }

  // The (checkpoint id, path) RESTORE calls fake server `server` received.
  std::vector<std::pair<uint64_t, std::string>> RestoresSeen(int server) {
    absl::MutexLock lock(&fenced_mu_);
    return restores_seen_[server];
  }

  // The worker ids fake server `server` was told to fence.
  std::set<uint32_t> FencedSeen(int server) {
    absl::MutexLock lock(&fenced_mu_);
    return fenced_seen_[server];
  }
  // FENCE_WORKERS calls fake server `server` received, refused or not.
  int FenceCalls(int server) {
    absl::MutexLock lock(&fenced_mu_);
    return fence_calls_[server];
  }
  void SetRefuseFences(int server, bool refuse) {
    absl::MutexLock lock(&fenced_mu_);
    refuse_fences_[server] = refuse;
  }

  // The events in DATA_DIR/events.jsonl named `name`.
  std::vector<json> Events(const std::string& name) const {
    std::vector<json> events;
    std::istringstream lines(ReadFile(dir_ + "/master/events.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      json event = json::parse(line);
      if (event["event"] == name) events.push_back(std::move(event));
    }
    return events;
  }

  json Doc() const { return json::parse(master_->StatusJson()); }

  // Rewrites the state a master stopped by RequestStop saved in `data_dir`
  // into what one killed with -9 while training leaves: not stopped, still
  // training.
  static void MarkSavedJobKilled(const std::string& data_dir) {
    StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(data_dir + "/state");
    ASSERT_TRUE(store.ok()) << store.status();
    StatusOr<std::optional<MasterSnapshot>> saved = (*store)->Load();
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_TRUE(saved->has_value());
    proto::MasterRecord record = (*saved)->master;
    ASSERT_EQ(record.phase(), 4u);  // failed
    ASSERT_TRUE(record.stopped());
    record.set_phase(1);  // training
    record.set_stopped(false);
    record.clear_failure();
    StateUpdate update;
    update.PutMaster(record);
    ASSERT_TRUE((*store)->Write(update).ok());
  }

  json FinalStatus() const {
    const std::string path = dir_ + "/master/final_status.json";
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
    return json::parse(ReadFile(path));
  }

  // Heartbeats every peer in `peers`, checking the replies.
  void Beat(const std::vector<FakePeer*>& peers) {
    for (FakePeer* peer : peers) {
      StatusOr<proto::HeartbeatReply> reply = peer->Heartbeat();
      EXPECT_TRUE(reply.ok()) << reply.status();
    }
  }
  std::vector<FakePeer*> ServerPtrs() const {
    std::vector<FakePeer*> out;
    for (const auto& server : servers_) out.push_back(server.get());
    return out;
  }

  // Polls `condition` until it holds or `timeout` passes; between polls
  // keeps `alive` heartbeating. Returns whether it held.
  bool Eventually(const std::function<bool()>& condition, const std::vector<FakePeer*>& alive,
                  absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (condition()) return true;
      Beat(alive);
      absl::SleepFor(absl::Milliseconds(20));
    }
    return condition();
  }

  bool WaitForPhase(const std::string& phase) {
    return Eventually([&] { return Doc()["phase"] == phase; }, ServerPtrs());
  }

  // Takes a shard that must be assigned.
  proto::ShardAssignment TakeShard(FakePeer& worker) {
    StatusOr<proto::GetShardReply> reply = worker.GetShard();
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {};
    EXPECT_EQ(reply->action(), proto::GetShardReply::ASSIGNED) << reply->DebugString();
    return reply->shard();
  }

  // Commits every piece of `shard`; returns the valid records committed.
  uint64_t CommitAll(FakePeer& worker, const proto::ShardAssignment& shard, uint64_t batch_lines,
                     double loss_per_record = 0.5) {
    uint64_t valid = 0;
    for (const Piece& piece : ReadPieces(shard, batch_lines)) {
      const uint64_t piece_valid = piece.lines - piece.malformed;
      StatusOr<bool> applied = worker.Commit(shard, piece, loss_per_record * piece_valid);
      EXPECT_TRUE(applied.ok()) << applied.status();
      EXPECT_TRUE(applied.ok() && *applied);
      valid += piece_valid;
    }
    return valid;
  }

  std::string dir_;
  SocketFactory factory_;
  JobConfig job_;  // the running master's, for its peers' registrations
  absl::Mutex fenced_mu_;
  std::set<uint32_t> fenced_seen_[3] ABSL_GUARDED_BY(fenced_mu_);
  int fence_calls_[3] ABSL_GUARDED_BY(fenced_mu_) = {0, 0, 0};
  bool refuse_fences_[3] ABSL_GUARDED_BY(fenced_mu_) = {false, false, false};
  std::vector<std::pair<uint64_t, std::string>> restores_seen_[3] ABSL_GUARDED_BY(fenced_mu_);
  bool refuse_restores_[3] ABSL_GUARDED_BY(fenced_mu_) = {false, false, false};
  // CHECKPOINT ids each fake server was asked for; whether it fails them.
  std::vector<uint64_t> checkpoints_seen_[3] ABSL_GUARDED_BY(fenced_mu_);
  bool refuse_checkpoints_[3] ABSL_GUARDED_BY(fenced_mu_) = {false, false, false};
  // Declared before master_ so they outlive it.
  std::vector<std::unique_ptr<RpcServer>> fake_server_listeners_;
  std::unique_ptr<Master> master_;
  std::vector<std::unique_ptr<FakePeer>> servers_;
};

}  // namespace eps

#endif  // EPS_TESTS_MASTER_MASTER_FIXTURE_H_
