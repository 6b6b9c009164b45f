// What the tests of worker/ps_client.h share: a job of two tables, rows and
// gradients computed from (table, key, element), and FakePs, fake
// parameter servers: in-process RpcServers on loopback (ephemeral ports)
// that serve PULL, record every PUSH, check key ownership against their
// own view of the cluster map, and fail on command; PsClientTest runs a
// client against them.

#ifndef EPS_TESTS_WORKER_PS_CLIENT_TESTING_H_
#define EPS_TESTS_WORKER_PS_CLIENT_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/message.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"
#include "worker/ps_client.h"

namespace eps {

constexpr uint32_t kPartitions = 16;
constexpr uint32_t kWide = 0;  // dim 1
constexpr uint32_t kDeep = 1;  // dim 8

inline proto::JobSpec TwoTableJob() {
  proto::JobSpec job;
  job.set_name("ps-client-test");
  job.set_num_partitions(kPartitions);
  proto::TableSpec* wide = job.add_tables();
  wide->set_id(kWide);
  wide->set_name("wide");
  wide->set_kind(proto::EMBEDDING);
  wide->set_dim(1);
  proto::TableSpec* deep = job.add_tables();
  deep->set_id(kDeep);
  deep->set_name("deep");
  deep->set_kind(proto::EMBEDDING);
  deep->set_dim(8);
  return job;
}

inline uint32_t DimOf(uint32_t table) { return table == kWide ? 1 : 8; }

// What a fake server returns for element `e` of `key`'s row in `table`:
// exact in float (< 2^24) and different for keys with different low bits.
inline float RowValue(uint32_t table, uint64_t key, uint32_t e) {
  return static_cast<float>((table << 20) | (e << 16) | (key & 0xffff));
}
// The gradient the tests push for element `e` of `key`.
inline float GradValue(uint32_t table, uint64_t key, uint32_t e) {
  return RowValue(table, key, e) * 0.5f + 0.25f;
}

// `n` distinct keys spread over every partition; their low 16 bits differ.
inline std::vector<uint64_t> MakeKeys(size_t n, uint64_t salt = 0) {
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = 0x9e3779b97f4a7c15ULL * (i + 1 + salt);
  return keys;
}

inline std::vector<float> GradsFor(uint32_t table, std::span<const uint64_t> keys) {
  const uint32_t dim = DimOf(table);
  std::vector<float> grads(keys.size() * dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t e = 0; e < dim; ++e) grads[i * dim + e] = GradValue(table, keys[i], e);
  }
  return grads;
}

// Expects `rows` to hold RowValue for every key of `keys`, in order.
inline void ExpectRows(uint32_t table, std::span<const uint64_t> keys,
                       const std::vector<float>& rows) {
  const uint32_t dim = DimOf(table);
  ASSERT_EQ(rows.size(), keys.size() * dim) << "table " << table;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t e = 0; e < dim; ++e) {
      ASSERT_EQ(rows[i * dim + e], RowValue(table, keys[i], e))
          << "table " << table << " key #" << i << " element " << e;
    }
  }
}

// How a fake server mangles its PULL replies.
enum class PullReplyMode { kNormal, kMissingFrame, kExtraValue };

// A fake parameter server. Its handler runs on the RpcServer's thread; the
// test thread reads what it recorded under mu_.
class FakePs {
 public:
  FakePs(SocketFactory* factory, uint32_t id) : id_(id) {
    RpcServerOptions options;
    options.name = absl::StrCat("fake-ps[", id, "]");
    StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(
        factory, options,
        [this](Message& request, Message* reply) { return Handle(request, reply); });
    CHECK_OK(server.status());
    server_ = std::move(server).value();
  }

  proto::ServerInfo info() const {
    proto::ServerInfo info;
    info.set_id(id_);
    info.set_endpoint(server_->endpoint());
    return info;
  }

  // The server's own view of the map: keys of partitions it does not own
  // under `map` are refused with WRONG_OWNER.
  void SetMap(const proto::ClusterMap& map) {
    absl::MutexLock lock(&mu_);
    map_ = map;
  }
  // Adopts `map` once it has refused `refusals` requests for wrong ownership
  // (a new owner that learns of its partitions late).
  void AdoptMapAfterRefusals(int refusals, const proto::ClusterMap& map) {
    absl::MutexLock lock(&mu_);
    adopt_after_ = refusals;
    adopt_map_ = map;
  }
  // Answers the next `n` requests with `status` (-1: every request).
  void FailNext(int n, Status status) {
    absl::MutexLock lock(&mu_);
    fail_next_ = n;
    fail_status_ = std::move(status);
  }
  // Pushes asking for their rows back (PushRequest.reply_rows) get none.
  void IgnoreReplyRows() {
    absl::MutexLock lock(&mu_);
    ignore_reply_rows_ = true;
  }
  // Tables of pushes that asked for their rows back.
  int rows_asked() const {
    absl::MutexLock lock(&mu_);
    return rows_asked_;
  }
  void SetPullReplyMode(PullReplyMode mode) {
    absl::MutexLock lock(&mu_);
    pull_mode_ = mode;
  }

  int requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  int refusals() const {
    absl::MutexLock lock(&mu_);
    return refusals_;
  }
  // Largest request seen, in bulk bytes.
  size_t max_request_bytes() const {
    absl::MutexLock lock(&mu_);
    return max_request_bytes_;
  }
  // Keys of `table` this server answered a PULL for, in arrival order.
  std::vector<uint64_t> pulled(uint32_t table) const {
    absl::MutexLock lock(&mu_);
    auto it = pulled_.find(table);
    return it == pulled_.end() ? std::vector<uint64_t>() : it->second;
  }
  // Keys of `table` this server received but refused (WRONG_OWNER).
  std::vector<uint64_t> refused(uint32_t table) const {
    absl::MutexLock lock(&mu_);
    auto it = refused_.find(table);
    return it == refused_.end() ? std::vector<uint64_t>() : it->second;
  }
  // Applied pushes that named their batch (each answered with the receipt
  // "receipt of ps <id>").
  int batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // (table, key) -> gradient rows applied, in arrival order.
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::vector<float>>> pushed() const {
    absl::MutexLock lock(&mu_);
    return pushed_;
  }

 private:
  Status Handle(Message& request, Message* reply) {
    absl::MutexLock lock(&mu_);
    ++requests_;
    size_t bytes = 0;
    for (size_t i = 0; i < request.num_frames(); ++i) bytes += request.frame(i).size();
    max_request_bytes_ = std::max(max_request_bytes_, bytes);
    if (fail_next_ != 0) {
      if (fail_next_ > 0) --fail_next_;
      return fail_status_;
    }
    const bool push = request.header().method() == proto::PUSH;
    std::vector<uint32_t> table_ids;
    if (push) {
      table_ids.assign(request.header().push_request().table_ids().begin(),
                       request.header().push_request().table_ids().end());
    } else {
      table_ids.assign(request.header().pull_request().table_ids().begin(),
                       request.header().pull_request().table_ids().end());
    }
    const size_t frames_per_table = push ? 2 : 1;
    if (request.num_frames() != table_ids.size() * frames_per_table) {
      ADD_FAILURE() << "malformed request " << request.DebugString();
      return absl::InvalidArgumentError("frame count");
    }
    // Ownership first, as a real server does: a refused request applies nothing.
    StatusOr<Placement> placement = Placement::FromProto(map_);
    CHECK_OK(placement.status());
    for (size_t t = 0; t < table_ids.size(); ++t) {
      ASSIGN_OR_RETURN(std::span<const uint64_t> keys,
                       request.Array<uint64_t>(t * frames_per_table));
      for (uint64_t key : keys) {
        if (placement->server(placement->ServerIndexOf(key)).id() == id_) continue;
        for (size_t u = 0; u < table_ids.size(); ++u) {
          std::span<const uint64_t> all = *request.Array<uint64_t>(u * frames_per_table);
          refused_[table_ids[u]].insert(refused_[table_ids[u]].end(), all.begin(), all.end());
        }
        ++refusals_;
        if (refusals_ == adopt_after_) map_ = adopt_map_;
        return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                               absl::StrCat("key ", key, " is not on fake ps ", id_),
                               proto::WRONG_OWNER);
      }
    }
    for (size_t t = 0; t < table_ids.size(); ++t) {
      const uint32_t table = table_ids[t];
      const uint32_t dim = DimOf(table);
      std::span<const uint64_t> keys = *request.Array<uint64_t>(t * frames_per_table);
      if (push) {
        ASSIGN_OR_RETURN(std::span<const float> grads, request.Array<float>(2 * t + 1));
        if (grads.size() != keys.size() * dim) {
          ADD_FAILURE() << "push of " << keys.size() << " keys carries " << grads.size()
                        << " values";
          return absl::InvalidArgumentError("gradient count");
        }
        for (size_t i = 0; i < keys.size(); ++i) {
          pushed_[{table, keys[i]}].emplace_back(grads.begin() + i * dim,
                                                 grads.begin() + (i + 1) * dim);
        }
        // Its version: the requests this server took.
        reply->header().mutable_push_reply()->add_versions(requests_);
        if (!request.header().push_request().reply_rows()) continue;
        ++rows_asked_;
        if (ignore_reply_rows_) continue;  // an old server: no rows back
      } else {
        pulled_[table].insert(pulled_[table].end(), keys.begin(), keys.end());
      }
      if (pull_mode_ == PullReplyMode::kMissingFrame && t + 1 == table_ids.size()) break;
      const size_t extra = pull_mode_ == PullReplyMode::kExtraValue ? 1 : 0;
      std::span<float> rows = reply->AddUninitializedArray<float>(keys.size() * dim + extra);
      for (size_t i = 0; i < keys.size(); ++i) {
        for (uint32_t e = 0; e < dim; ++e) rows[i * dim + e] = RowValue(table, keys[i], e);
      }
      if (extra) rows.back() = 0;
    }
    if (push) {
      proto::PushReply* answer = reply->header().mutable_push_reply();
      if (request.header().push_request().has_batch()) {
        ++batches_;
        answer->set_receipt(absl::StrCat("receipt of ps ", id_));
      }
    } else {
      reply->header().mutable_pull_reply();
    }
    return absl::OkStatus();
  }

  const uint32_t id_;
  mutable absl::Mutex mu_;
  proto::ClusterMap map_ ABSL_GUARDED_BY(mu_);
  int adopt_after_ ABSL_GUARDED_BY(mu_) = -1;
  proto::ClusterMap adopt_map_ ABSL_GUARDED_BY(mu_);
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  Status fail_status_ ABSL_GUARDED_BY(mu_);
  PullReplyMode pull_mode_ ABSL_GUARDED_BY(mu_) = PullReplyMode::kNormal;
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
  int refusals_ ABSL_GUARDED_BY(mu_) = 0;
  int batches_ ABSL_GUARDED_BY(mu_) = 0;
  int rows_asked_ ABSL_GUARDED_BY(mu_) = 0;
  bool ignore_reply_rows_ ABSL_GUARDED_BY(mu_) = false;
  size_t max_request_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::vector<uint64_t>> pulled_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::vector<uint64_t>> refused_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::vector<float>>> pushed_
      ABSL_GUARDED_BY(mu_);
  // Last: stopped (joining the handler thread) before the state above goes.
  std::unique_ptr<RpcServer> server_;
};

class PsClientTest : public ::testing::Test {
 protected:
  PsClientTest() {
    for (uint32_t id = 0; id < 3; ++id) servers_.push_back(std::make_unique<FakePs>(&factory_, id));
    std::vector<proto::ServerInfo> infos;
    for (const auto& server : servers_) infos.push_back(server->info());
    map_ = MakeClusterMap(/*version=*/1, kPartitions, infos);
    for (const auto& server : servers_) server->SetMap(map_);
    refreshed_map_ = map_;
  }

  // Points server 1 of the map at a port nobody listens on any more;
  // returns that endpoint.
  std::string MoveServerOneToAClosedPort() {
    std::string dead;
    {
      StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &dead);
      EXPECT_TRUE(router.ok()) << router.status();
      if (router.ok()) router->close();
    }
    for (int i = 0; i < map_.servers_size(); ++i) {
      if (map_.servers(i).id() == 1) map_.mutable_servers(i)->set_endpoint(dead);
    }
    return dead;
  }

  // A client whose refresh_map returns refreshed_map_ (and counts calls).
  std::unique_ptr<PsClient> MakeClient(size_t max_request_bytes = size_t{4} << 20,
                                       CallOptions call = Patient(), bool install_map = true) {
    proto::NodeId self;
    self.set_role(proto::ROLE_WORKER);
    self.set_id(7);
    auto client = std::make_unique<PsClient>(
        &factory_, self, TwoTableJob(), call,
        [this]() -> StatusOr<proto::ClusterMap> {
          ++refreshes_;
          return refreshed_map_;
        },
        max_request_bytes);
    if (install_map) CHECK_OK(client->SetClusterMap(map_));
    return client;
  }

  // Pulls `wide` and `deep` with `client` and expects every row.
  static void ExpectPulls(PsClient& client, const std::vector<uint64_t>& wide,
                          const std::vector<uint64_t>& deep) {
    const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
    std::vector<std::vector<float>> out;
    ASSERT_TRUE(client.Pull(tables, &out).ok());
    ExpectRows(kWide, wide, out[0]);
    ExpectRows(kDeep, deep, out[1]);
  }

  // A client whose calls get `attempts` attempts of `attempt_timeout` each.
  std::unique_ptr<PsClient> ClientGivingUpAfter(absl::Duration attempt_timeout, int attempts) {
    CallOptions call;
    call.attempt_timeout = attempt_timeout;
    call.max_attempts = attempts;
    return MakeClient(size_t{4} << 20, call);
  }

  // A pull of 50 keys by a client whose calls get `attempts` attempts of
  // `attempt_timeout` each: what it ended with, and how long it took.
  Status PullGivingUp(absl::Duration attempt_timeout, int attempts, absl::Duration* took) {
    std::unique_ptr<PsClient> client = ClientGivingUpAfter(attempt_timeout, attempts);
    const std::vector<uint64_t> wide = MakeKeys(50);
    const std::vector<PsClient::Keys> tables = {{kWide, wide}};
    std::vector<std::vector<float>> out;
    const absl::Time start = absl::Now();
    const Status status = client->Pull(tables, &out);
    *took = absl::Now() - start;
    return status;
  }

  static CallOptions Patient() {
    CallOptions call;
    call.attempt_timeout = absl::Seconds(3);
    call.max_attempts = 1;
    return call;
  }

  // Id of the server owning `key` under `map`.
  static uint32_t OwnerOf(const proto::ClusterMap& map, uint64_t key) {
    return map.partition_owner(static_cast<int>(PartitionOf(key, map.num_partitions())));
  }

  // map_ with every partition of server `from` given to server `to`.
  proto::ClusterMap MovePartitions(uint32_t from, uint32_t to) const {
    proto::ClusterMap moved = map_;
    moved.set_version(map_.version() + 1);
    for (int p = 0; p < moved.partition_owner_size(); ++p) {
      if (moved.partition_owner(p) == from) moved.set_partition_owner(p, to);
    }
    return moved;
  }

  // MovePartitions(from, to), known to both servers and what the client's
  // refresh returns.
  proto::ClusterMap HandOverPartitions(uint32_t from, uint32_t to) {
    const proto::ClusterMap moved = MovePartitions(from, to);
    servers_[from]->SetMap(moved);
    servers_[to]->SetMap(moved);
    refreshed_map_ = moved;
    return moved;
  }

  // Declared first: destroyed after every server and client.
  SocketFactory factory_;
  std::vector<std::unique_ptr<FakePs>> servers_;
  proto::ClusterMap map_;
  proto::ClusterMap refreshed_map_;
  int refreshes_ = 0;
};

}  // namespace eps

#endif  // EPS_TESTS_WORKER_PS_CLIENT_TESTING_H_
