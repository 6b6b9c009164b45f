// Tests master/master.h: the Master service in-process, driven over real
// RPC on loopback by fake servers and workers that call it the way
// ps/param_server.cc and worker/worker.cc do.
//
// Every wait in this file polls a condition with a deadline; the only
// fixed waits are the leases the tests let run out.

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
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr int kHeartbeatMs = 100;
constexpr int kLeaseMs = 600;

// Generous bounds: a loaded machine must not turn calls into retries.
CallOptions Patient() {
  CallOptions options;
  options.attempt_timeout = absl::Seconds(5);
  options.max_attempts = 1;
  return options;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A Criteo record: label, 13 integers (some empty), 26 hex categories.
std::string CriteoLine(int label, int i) {
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
std::string CriteoText(int n, int seed, const std::set<int>& malformed = {},
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
uint64_t LineStart(const std::string& text, uint64_t line) {
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
std::vector<Piece> ReadPieces(const proto::ShardAssignment& shard, uint64_t batch_lines) {
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
// from the registration reply like real peers do.
class FakePeer {
 public:
  FakePeer(SocketFactory* factory, std::string master)
      : channel_(factory, proto::NodeId()), master_(std::move(master)) {}

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
    ASSIGN_OR_RETURN(Message reply, Call(proto::REGISTER_SERVER, std::move(request)));
    SetSelf(proto::ROLE_SERVER, reply.header().register_server_reply().server_id());
    job_ = reply.header().register_server_reply().job();
    return absl::OkStatus();
  }

  Status RegisterWorker() {
    Message request;
    proto::RegisterWorkerRequest* body = request.header().mutable_register_worker_request();
    body->set_hostname("test-host");
    body->set_pid(2000);
    body->set_device("cpu");
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
  proto::NodeId self_;
  proto::JobSpec job_;
  uint32_t heartbeat_ms_ = 0;
};

void ExpectCode(const Status& status, absl::StatusCode code, proto::ErrorReason reason) {
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
    master_ = std::make_unique<Master>(options);
    ASSERT_TRUE(master_->Start().ok());
  }

  std::unique_ptr<FakePeer> Peer() {
    return std::make_unique<FakePeer>(&factory_, master_->rpc_endpoint());
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
  // A retried registration gets the same id; a third server is refused.
  std::unique_ptr<FakePeer> again = Peer();
  ASSERT_TRUE(again->RegisterServer(fake_server_listeners_[0]->endpoint()).ok());
  EXPECT_EQ(again->id(), 0u);
  std::unique_ptr<FakePeer> third = Peer();
  EXPECT_EQ(third->RegisterServer("tcp://127.0.0.1:40003").code(),
            absl::StatusCode::kFailedPrecondition);

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
TEST_F(MasterTest, CheckpointGivesUpOnAWorkerThatDoesNotPause) {
  const std::string train = Write("train.tsv", CriteoText(40, /*seed=*/3));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.checkpoint.interval_s = 1;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  std::vector<FakePeer*> alive = ServerPtrs();
  alive.push_back(worker.get());
  ASSERT_TRUE(Eventually([&] { return Doc()["checkpoints"]["failed"] == 1; }, alive));
  ASSERT_EQ(Events("checkpoint_failed").size(), 1u);
  EXPECT_NE(Events("checkpoint_failed")[0]["error"].get<std::string>().find("did not pause"),
            std::string::npos)
      << Events("checkpoint_failed")[0].dump();
  EXPECT_EQ(Doc()["checkpoints"]["written"], 0);
  absl::MutexLock lock(&fenced_mu_);
  EXPECT_TRUE(checkpoints_seen_[0].empty());
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
  // Predictions that are not probabilities (a diverged model) would break
  // the metrics; labels must be numbers.
  for (float bad : {std::nanf(""), -0.5f, 1.5f, std::numeric_limits<float>::infinity()}) {
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
  EXPECT_EQ(worker->Call(proto::REGISTER_SERVER).status().code(),
            absl::StatusCode::kInvalidArgument);
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
  ASSERT_EQ(Events("server_dead").size(), 1u);
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

TEST_F(MasterTest, ServesStatusAndMetricsOverHttp) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));

  const json endpoints = json::parse(ReadFile(dir_ + "/master/master.json"));
  EXPECT_EQ(endpoints["rpc"], master_->rpc_endpoint());
  EXPECT_EQ(endpoints["http"], master_->http_url());
  EXPECT_THAT(master_->rpc_endpoint(), HasSubstr("tcp://127.0.0.1:"));
  EXPECT_THAT(master_->http_url(), HasSubstr("http://127.0.0.1:"));

  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  ASSERT_TRUE(WaitForPhase("training"));
  const proto::ShardAssignment shard = TakeShard(*worker);
  ASSERT_TRUE(worker->Commit(shard, ReadPieces(shard, 2)[0], 0.5).ok());
  // After WaitForPhase, whose keep-alive heartbeats report 0 rows.
  ASSERT_TRUE(servers_[0]->Heartbeat(/*rows=*/123).ok());
  ASSERT_TRUE(worker->Heartbeat().ok());

  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result status = client.Get("/status");
  ASSERT_TRUE(status) << httplib::to_string(status.error());
  EXPECT_EQ(status->status, 200);
  const json doc = json::parse(status->body);
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["epoch"], 1);
  for (const char* key : {"total", "todo", "doing", "done"}) {
    EXPECT_TRUE(doc["shards"].contains(key)) << key;
  }
  EXPECT_EQ(doc["shards"]["total"], 2);
  EXPECT_EQ(doc["shards"]["doing"], 1);
  EXPECT_EQ(doc["records_trained"], 2);
  ASSERT_EQ(doc["workers"].size(), 1u);
  for (const char* key : {"id", "state", "records", "records_per_s"}) {
    EXPECT_TRUE(doc["workers"][0].contains(key)) << key;
  }
  EXPECT_EQ(doc["workers"][0]["state"], "alive");
  EXPECT_EQ(doc["workers"][0]["records_per_s"], 12.5);
  ASSERT_EQ(doc["servers"].size(), 2u);
  for (const char* key : {"id", "partitions", "rows"}) {
    EXPECT_TRUE(doc["servers"][0].contains(key)) << key;
  }
  EXPECT_EQ(doc["servers"][0]["rows"], 123);
  for (const char* key : {"train_loss", "eval_auc", "eval_logloss"}) {
    EXPECT_TRUE(doc["metrics"].contains(key)) << key;
  }
  EXPECT_TRUE(doc["metrics"]["eval_auc"].is_null());

  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE eps_records_trained_total counter"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_records_trained_total 2\n"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_workers{state=\"alive\"} 1\n"));

  httplib::Result page = client.Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("master-test"));
}

// Counters in /metrics keep every digit (a six-digit float would not).
TEST_F(MasterTest, MetricsKeepEveryDigit) {
  // 1234567 empty lines: records as far as the master is concerned.
  const std::string train = Write("train.tsv", std::string(1234567, '\n'));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.data.shard_records = 2000000;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  ASSERT_EQ(shard.records(), 1234567u);
  Piece all;
  all.begin = shard.start();
  all.end = shard.end();
  all.lines = shard.records();
  ASSERT_TRUE(worker->Commit(shard, all, /*loss_sum=*/0.5 * 1234567).ok());

  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_THAT(metrics->body, HasSubstr("\neps_job_records_trained 1234567\n"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_records_trained_total 1234567\n"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_train_loss 0.5\n"));
  EXPECT_EQ(Doc()["records_trained"], 1234567);
}

// Checks an exposition the way a scraper reads it: every sample belongs to
// the family whose HELP and TYPE precede it, no family comes twice, and
// counters end in _total. Returns what is wrong, one line each.
std::string ExpositionErrors(const std::string& text) {
  std::string errors;
  std::set<std::string> families;
  std::string family;
  std::string type;
  std::string help_of;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> words = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    if (absl::StartsWith(line, "# HELP ") && words.size() >= 3) {
      help_of = words[2];
      continue;
    }
    if (absl::StartsWith(line, "# TYPE ") && words.size() == 4) {
      family = words[2];
      type = words[3];
      if (help_of != family) absl::StrAppend(&errors, family, ": no HELP before TYPE\n");
      if (!families.insert(family).second) absl::StrAppend(&errors, family, ": twice\n");
      if ((type == "counter") != absl::EndsWith(family, "_total")) {
        absl::StrAppend(&errors, family, ": a ", type, " named so\n");
      }
      continue;
    }
    const std::string name(line.substr(0, line.find_first_of("{ ")));
    const bool belongs =
        name == family ||
        (type == "histogram" &&
         (name == family + "_bucket" || name == family + "_sum" || name == family + "_count"));
    if (!belongs) absl::StrAppend(&errors, "'", line, "' outside family ", family, "\n");
  }
  return errors;
}

// /metrics: the job's progress, and what servers and workers report in
// heartbeats (their counters and latency histograms), labelled by peer; a
// gone worker's series keep their last values.
TEST_F(MasterTest, MetricsExposeProgressAndWhatPeersReport) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  ASSERT_TRUE(*worker->Commit(shard, ReadPieces(shard, 2)[0], /*loss_sum=*/1.0));

  LatencyHistogram pulls;
  pulls.Observe(absl::Milliseconds(3));
  pulls.Observe(absl::Milliseconds(3));
  pulls.Observe(absl::Milliseconds(300));
  LatencyHistogram pushes;
  pushes.Observe(absl::Microseconds(50));
  {
    Message beat;
    proto::ServerStats* stats = beat.header().mutable_heartbeat_request()->mutable_server();
    stats->set_rows(123);
    stats->set_rows_on_disk(45);
    stats->set_bytes(6789);
    stats->set_hits(3);
    stats->set_misses(1);
    stats->set_evictions(7);
    stats->set_pushes_fenced(2);
    stats->set_pushes_deduplicated(1);
    HistogramToProto(pulls.Snapshot(), stats->mutable_pull_latency());
    HistogramToProto(pushes.Snapshot(), stats->mutable_push_latency());
    ASSERT_TRUE(servers_[0]->Call(proto::HEARTBEAT, std::move(beat)).ok());
  }
  {
    Message beat;
    proto::WorkerStats* stats = beat.header().mutable_heartbeat_request()->mutable_worker();
    stats->set_records_per_s(12.5);
    HistogramToProto(pulls.Snapshot(), stats->mutable_pull_latency());
    HistogramToProto(pushes.Snapshot(), stats->mutable_push_latency());
    ASSERT_TRUE(worker->Call(proto::HEARTBEAT, std::move(beat)).ok());
  }

  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  const std::string text = "\n" + metrics->body;  // every line starts after a newline
  EXPECT_EQ(ExpositionErrors(text), "") << text;
  for (const auto& [family, type] : std::vector<std::pair<std::string, std::string>>{
           {"eps_job_info", "gauge"},
           {"eps_job_phase", "gauge"},
           {"eps_job_epoch", "gauge"},
           {"eps_job_pass_done_ratio", "gauge"},
           {"eps_job_records_trained", "gauge"},
           {"eps_records_trained_total", "counter"},
           {"eps_records_retrained_total", "counter"},
           {"eps_records_per_second", "gauge"},
           {"eps_train_loss_current_epoch", "gauge"},
           {"eps_membership_epoch", "gauge"},
           {"eps_shards", "gauge"},
           {"eps_reassignments_total", "counter"},
           {"eps_splits_total", "counter"},
           {"eps_workers", "gauge"},
           {"eps_servers", "gauge"},
           {"eps_worker_records_per_second", "gauge"},
           {"eps_worker_records_committed_total", "counter"},
           {"eps_worker_pull_seconds", "histogram"},
           {"eps_worker_push_seconds", "histogram"},
           {"eps_server_rows", "gauge"},
           {"eps_server_rows_on_disk", "gauge"},
           {"eps_server_memory_bytes", "gauge"},
           {"eps_server_hit_ratio", "gauge"},
           {"eps_server_evictions_total", "counter"},
           {"eps_server_pushes_fenced_total", "counter"},
           {"eps_server_pushes_deduplicated_total", "counter"},
           {"eps_server_pull_seconds", "histogram"},
           {"eps_server_push_seconds", "histogram"},
           {"eps_checkpoints_written_total", "counter"},
           {"eps_checkpoints_failed_total", "counter"},
           {"eps_checkpoint_pause_seconds_total", "counter"},
           {"eps_recoveries_total", "counter"},
       }) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n# HELP ", family, " "))) << family;
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n# TYPE ", family, " ", type, "\n"))) << family;
  }
  // Not known yet: no evaluation, no finished epoch, no checkpoint written.
  for (const char* absent : {"eps_eval_auc", "eps_train_loss ", "eps_checkpoint_last_"}) {
    EXPECT_THAT(text, Not(HasSubstr(absent))) << absent;
  }

  const std::string w = absl::StrCat("{worker=\"", worker->id(), "\"");
  for (const std::string& sample : {
           std::string("eps_job_info{name=\"master-test\",job_id=\""),
           std::string("\neps_job_phase{phase=\"training\"} 1\n"),
           std::string("\neps_job_phase{phase=\"scanning\"} 0\n"),
           std::string("\neps_job_epoch 1\n"),
           std::string("\neps_job_pass_done_ratio 0.2\n"),
           std::string("\neps_job_records_trained 2\n"),
           std::string("\neps_records_trained_total 2\n"),
           std::string("\neps_train_loss_current_epoch 0.5\n"),
           std::string("\neps_shards{state=\"todo\"} 1\n"),
           std::string("\neps_shards{state=\"doing\"} 1\n"),
           std::string("\neps_shards{state=\"done\"} 0\n"),
           std::string("\neps_workers{state=\"alive\"} 1\n"),
           std::string("\neps_servers{state=\"alive\"} 2\n"),
           absl::StrCat("\neps_worker_records_per_second", w, "} 12.5\n"),
           absl::StrCat("\neps_worker_records_committed_total", w, "} 2\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"0.0016\"} 0\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"0.0032\"} 2\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"0.4096\"} 3\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"+Inf\"} 3\n"),
           absl::StrCat("\neps_worker_pull_seconds_sum", w, "} 0.306\n"),
           absl::StrCat("\neps_worker_pull_seconds_count", w, "} 3\n"),
           absl::StrCat("\neps_worker_push_seconds_count", w, "} 1\n"),
           std::string("\neps_server_partitions{server=\"0\"} 4\n"),
           std::string("\neps_server_rows{server=\"0\"} 123\n"),
           std::string("\neps_server_rows_on_disk{server=\"0\"} 45\n"),
           std::string("\neps_server_memory_bytes{server=\"0\"} 6789\n"),
           std::string("\neps_server_hit_ratio{server=\"0\"} 0.75\n"),
           std::string("\neps_server_hit_ratio{server=\"1\"} 1\n"),
           std::string("\neps_server_row_hits_total{server=\"0\"} 3\n"),
           std::string("\neps_server_evictions_total{server=\"0\"} 7\n"),
           std::string("\neps_server_pushes_fenced_total{server=\"0\"} 2\n"),
           std::string("\neps_server_pushes_deduplicated_total{server=\"0\"} 1\n"),
           std::string("\neps_server_pull_seconds_bucket{server=\"0\",le=\"0.0032\"} 2\n"),
           std::string("\neps_server_pull_seconds_count{server=\"0\"} 3\n"),
           std::string("\neps_server_push_seconds_bucket{server=\"0\",le=\"0.0001\"} 1\n"),
           std::string("\neps_recoveries_total 0\n"),
       }) {
    EXPECT_THAT(text, HasSubstr(sample)) << sample;
  }
  // ps[1] reported no histogram: it has no series.
  EXPECT_THAT(text, Not(HasSubstr("eps_server_pull_seconds_count{server=\"1\"}")));

  // The worker goes silent and its lease runs out: it counts as dead, its
  // rate drops to 0, its counters and histograms stay.
  ASSERT_TRUE(Eventually([&] { return Doc()["workers"][0]["state"] == "dead"; }, ServerPtrs()));
  metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(ExpositionErrors(metrics->body), "") << metrics->body;
  for (const std::string& sample : {
           std::string("\neps_workers{state=\"alive\"} 0\n"),
           std::string("\neps_workers{state=\"dead\"} 1\n"),
           absl::StrCat("\neps_worker_records_per_second", w, "} 0\n"),
           absl::StrCat("\neps_worker_records_committed_total", w, "} 2\n"),
           absl::StrCat("\neps_worker_pull_seconds_count", w, "} 3\n"),
           absl::StrCat("\neps_worker_push_seconds_count", w, "} 1\n"),
           std::string("\neps_records_trained_total 2\n"),
       }) {
    EXPECT_THAT(metrics->body, HasSubstr(sample)) << sample;
  }
}

// Label values come from outside (the job's name): quotes, backslashes and
// newlines are escaped, and bytes that are not UTF-8 replaced.
TEST_F(MasterTest, MetricsEscapeLabelValues) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.job.name = "a \"quoted\\\" name\nand \xFF";
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_THAT(metrics->body,
              HasSubstr("eps_job_info{name=\"a \\\"quoted\\\\\\\" name\\nand \xEF\xBF\xBD\","));
  EXPECT_EQ(ExpositionErrors(metrics->body), "") << metrics->body;
}

// Text the master did not write itself (the job name from the config file,
// file names, peers' messages) may be anything; /status must still render.
TEST_F(MasterTest, StatusSurvivesTextThatIsNotUtf8) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.job.name = "job-\xff\xfe";
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  std::string text;
  EXPECT_NO_THROW(text = master_->StatusJson());
  EXPECT_TRUE(json::accept(text));
  master_->RequestStop("stopped \xc3");
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(FinalStatus()["state"], "failed");
}

TEST_F(MasterTest, MissingDataIsNotFound) {
  MasterOptions options = Options();
  options.job.data.train = dir_ + "/no-such-train";
  Master master(options);
  const Status started = master.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(started.message(), HasSubstr("data.train"));
  EXPECT_THAT(started.message(), HasSubstr(dir_ + "/no-such-train"));

  MasterOptions with_eval = Options();
  with_eval.job.data.train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  with_eval.job.data.eval = dir_ + "/no-such-eval";
  Master master2(with_eval);
  const Status started2 = master2.Start();
  EXPECT_EQ(started2.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(started2.message(), HasSubstr("data.eval"));
  EXPECT_THAT(started2.message(), HasSubstr(dir_ + "/no-such-eval"));
}

TEST_F(MasterTest, TrainDataWithoutRecordsFailsTheJob) {
  const std::string train = Write("train.tsv", "");
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_TRUE(Eventually([&] { return Doc()["state"] == "failed"; }, {}));
  EXPECT_THAT(Doc()["error"].get<std::string>(), HasSubstr("data.train"));
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
}

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
  options.job.worker.batch_size = 2;   // splits need 4 records left
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
  options.job.worker.batch_size = 2;
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
  options.job.worker.batch_size = 2;   // splits need 4 records left
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
    FakePeer old(&factory_, master_->rpc_endpoint());
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
