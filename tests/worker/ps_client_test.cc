// Tests worker/ps_client.h against fake parameter servers: in-process
// RpcServers on loopback (ephemeral ports) that serve PULL with rows computed
// from (table, key, element), record every PUSH, check key ownership against
// their own view of the cluster map, and fail on command.

#include "worker/ps_client.h"

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

namespace eps {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kPartitions = 16;
constexpr uint32_t kWide = 0;  // dim 1
constexpr uint32_t kDeep = 1;  // dim 8

proto::JobSpec TwoTableJob() {
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

uint32_t DimOf(uint32_t table) { return table == kWide ? 1 : 8; }

// What a fake server returns for element `e` of `key`'s row in `table`:
// exact in float (< 2^24) and different for keys with different low bits.
float RowValue(uint32_t table, uint64_t key, uint32_t e) {
  return static_cast<float>((table << 20) | (e << 16) | (key & 0xffff));
}
// The gradient the tests push for element `e` of `key`.
float GradValue(uint32_t table, uint64_t key, uint32_t e) {
  return RowValue(table, key, e) * 0.5f + 0.25f;
}

// `n` distinct keys spread over every partition; their low 16 bits differ.
std::vector<uint64_t> MakeKeys(size_t n, uint64_t salt = 0) {
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = 0x9e3779b97f4a7c15ULL * (i + 1 + salt);
  return keys;
}

std::vector<float> GradsFor(uint32_t table, std::span<const uint64_t> keys) {
  const uint32_t dim = DimOf(table);
  std::vector<float> grads(keys.size() * dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t e = 0; e < dim; ++e) grads[i * dim + e] = GradValue(table, keys[i], e);
  }
  return grads;
}

// Expects `rows` to hold RowValue for every key of `keys`, in order.
void ExpectRows(uint32_t table, std::span<const uint64_t> keys, const std::vector<float>& rows) {
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
        continue;
      }
      pulled_[table].insert(pulled_[table].end(), keys.begin(), keys.end());
      if (pull_mode_ == PullReplyMode::kMissingFrame && t + 1 == table_ids.size()) break;
      const size_t extra = pull_mode_ == PullReplyMode::kExtraValue ? 1 : 0;
      std::span<float> rows = reply->AddUninitializedArray<float>(keys.size() * dim + extra);
      for (size_t i = 0; i < keys.size(); ++i) {
        for (uint32_t e = 0; e < dim; ++e) rows[i * dim + e] = RowValue(table, keys[i], e);
      }
      if (extra) rows.back() = 0;
    }
    if (push) {
      reply->header().mutable_push_reply();
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

  // A client whose refresh_map returns refreshed_map_ (and counts calls).
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

  // Declared first: destroyed after every server and client.
  SocketFactory factory_;
  std::vector<std::unique_ptr<FakePs>> servers_;
  proto::ClusterMap map_;
  proto::ClusterMap refreshed_map_;
  int refreshes_ = 0;
};

TEST_F(PsClientTest, PullReturnsEveryRowInPlaceIncludingDuplicates) {
  std::vector<uint64_t> wide = MakeKeys(200);
  std::vector<uint64_t> deep = MakeKeys(150, /*salt=*/1000);
  // Duplicates, within a table and across the two tables.
  wide.push_back(wide[3]);
  wide.push_back(wide[3]);
  wide.insert(wide.begin(), wide[17]);
  deep.push_back(deep[0]);
  deep.push_back(wide[5]);
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  ExpectRows(kWide, wide, out[0]);
  ExpectRows(kDeep, deep, out[1]);

  // Each server saw only keys it owns, each occurrence exactly once, and in
  // one request (the default cap is far above this pull).
  for (const auto& server : servers_) {
    const uint32_t id = server->info().id();
    EXPECT_EQ(server->requests(), 1) << "server " << id;
    EXPECT_EQ(server->refusals(), 0) << "server " << id;
    for (uint32_t table : {kWide, kDeep}) {
      std::multiset<uint64_t> expected;
      for (uint64_t key : table == kWide ? wide : deep) {
        if (OwnerOf(map_, key) == id) expected.insert(key);
      }
      const std::vector<uint64_t> got = server->pulled(table);
      EXPECT_FALSE(got.empty()) << "server " << id << " table " << table;
      EXPECT_EQ(std::multiset<uint64_t>(got.begin(), got.end()), expected)
          << "server " << id << " table " << table;
    }
  }
  EXPECT_EQ(refreshes_, 0);
}

TEST_F(PsClientTest, PullCutsRequestsAtTheSizeCap) {
  const std::vector<uint64_t> wide = MakeKeys(3000);
  const std::vector<uint64_t> deep = MakeKeys(1000, /*salt=*/5000);
  std::unique_ptr<PsClient> client = MakeClient(/*max_request_bytes=*/1024);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ExpectRows(kWide, wide, out[0]);
  ExpectRows(kDeep, deep, out[1]);
  int requests = 0;
  size_t pulled = 0;
  for (const auto& server : servers_) {
    requests += server->requests();
    // A PULL carries 8 bytes per key; the cap counts the reply's rows too.
    EXPECT_LE(server->max_request_bytes(), 1024u);
    pulled += server->pulled(kWide).size() + server->pulled(kDeep).size();
  }
  // 3000 x 12 B + 1000 x 40 B = 76000 B in pieces of at most 1 KiB.
  EXPECT_GE(requests, 76000 / 1024);
  EXPECT_EQ(pulled, wide.size() + deep.size());
}

TEST_F(PsClientTest, PushDeliversEachRowOnceToItsOwner) {
  const std::vector<uint64_t> wide = MakeKeys(500);
  const std::vector<uint64_t> deep = MakeKeys(300, /*salt=*/800);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  std::unique_ptr<PsClient> client = MakeClient(/*max_request_bytes=*/2048);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  ASSERT_TRUE(client->Push(tables, grads).ok());

  size_t rows = 0;
  for (const auto& server : servers_) {
    const uint32_t id = server->info().id();
    EXPECT_GT(server->requests(), 1) << "2 KiB cap: server " << id << " needs several pushes";
    for (const auto& [table_key, applied] : server->pushed()) {
      const auto& [table, key] = table_key;
      EXPECT_EQ(OwnerOf(map_, key), id) << "key " << key << " pushed to the wrong server";
      ASSERT_EQ(applied.size(), 1u) << "key " << key << " of table " << table;
      ASSERT_EQ(applied[0].size(), DimOf(table));
      for (uint32_t e = 0; e < DimOf(table); ++e) {
        EXPECT_EQ(applied[0][e], GradValue(table, key, e)) << "key " << key << " element " << e;
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, wide.size() + deep.size());
}

TEST_F(PsClientTest, PushOfAFewKeysKeepsThem) {
  // A handful of keys per server (like a dense tensor's chunks): key frames
  // of at most 32 bytes, which ZeroMQ keeps inside the message itself.
  const std::vector<uint64_t> wide = MakeKeys(4);
  const std::vector<uint64_t> deep = MakeKeys(3, /*salt=*/10);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  ASSERT_TRUE(client->Push(tables, grads).ok());
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::vector<float>>> all;
  for (const auto& server : servers_) {
    for (const auto& [table_key, rows] : server->pushed()) all[table_key] = rows;
  }
  ASSERT_EQ(all.size(), wide.size() + deep.size());
  for (uint32_t table : {kWide, kDeep}) {
    for (uint64_t key : table == kWide ? wide : deep) {
      ASSERT_EQ(all.count({table, key}), 1u) << "key " << key << " of table " << table;
      const std::vector<std::vector<float>>& rows = all[{table, key}];
      ASSERT_EQ(rows.size(), 1u);
      for (uint32_t e = 0; e < DimOf(table); ++e) {
        EXPECT_EQ(rows[0][e], GradValue(table, key, e));
      }
    }
  }
}

TEST_F(PsClientTest, PullReroutesRefusedKeysAfterWrongOwner) {
  // Server 0 has handed its partitions to server 1 (map v2); the client
  // still routes by v1.
  const proto::ClusterMap moved = MovePartitions(/*from=*/0, /*to=*/1);
  servers_[0]->SetMap(moved);
  servers_[1]->SetMap(moved);
  refreshed_map_ = moved;
  const std::vector<uint64_t> wide = MakeKeys(300);
  const std::vector<uint64_t> deep = MakeKeys(100, /*salt=*/400);
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ExpectRows(kWide, wide, out[0]);
  ExpectRows(kDeep, deep, out[1]);
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(client->map_version(), 2u);

  EXPECT_EQ(servers_[0]->requests(), 1);
  EXPECT_EQ(servers_[0]->refusals(), 1);
  EXPECT_TRUE(servers_[0]->pulled(kWide).empty());
  EXPECT_EQ(servers_[1]->requests(), 2);  // its own keys, then server 0's
  EXPECT_EQ(servers_[2]->requests(), 1);  // nothing re-sent to it
  for (uint32_t table : {kWide, kDeep}) {
    const std::vector<uint64_t>& keys = table == kWide ? wide : deep;
    std::multiset<uint64_t> refused_expected;
    std::multiset<uint64_t> one_expected;
    for (uint64_t key : keys) {
      if (OwnerOf(map_, key) == 0) refused_expected.insert(key);
      if (OwnerOf(moved, key) == 1) one_expected.insert(key);
    }
    const std::vector<uint64_t> refused = servers_[0]->refused(table);
    EXPECT_EQ(std::multiset<uint64_t>(refused.begin(), refused.end()), refused_expected);
    const std::vector<uint64_t> one = servers_[1]->pulled(table);
    EXPECT_EQ(std::multiset<uint64_t>(one.begin(), one.end()), one_expected);
  }
}

TEST_F(PsClientTest, PushAfterWrongOwnerAppliesEveryKeyOnce) {
  const proto::ClusterMap moved = MovePartitions(/*from=*/2, /*to=*/0);
  servers_[2]->SetMap(moved);
  servers_[0]->SetMap(moved);
  refreshed_map_ = moved;
  const std::vector<uint64_t> wide = MakeKeys(400);
  const std::vector<uint64_t> deep = MakeKeys(200, /*salt=*/900);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  // A small cap: several requests per server, all refused by server 2.
  std::unique_ptr<PsClient> client = MakeClient(/*max_request_bytes=*/1024);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  ASSERT_TRUE(client->Push(tables, grads).ok());
  EXPECT_EQ(refreshes_, 1);
  EXPECT_GT(servers_[2]->refusals(), 1);
  EXPECT_TRUE(servers_[2]->pushed().empty());

  std::map<std::pair<uint32_t, uint64_t>, int> applied;
  for (const auto& server : servers_) {
    for (const auto& [table_key, rows] : server->pushed()) {
      EXPECT_EQ(OwnerOf(moved, table_key.second), server->info().id());
      applied[table_key] += static_cast<int>(rows.size());
      for (const std::vector<float>& row : rows) {
        for (uint32_t e = 0; e < row.size(); ++e) {
          EXPECT_EQ(row[e], GradValue(table_key.first, table_key.second, e));
        }
      }
    }
  }
  EXPECT_EQ(applied.size(), wide.size() + deep.size());
  for (const auto& [table_key, count] : applied) {
    EXPECT_EQ(count, 1) << "table " << table_key.first << " key " << table_key.second;
  }
}

TEST_F(PsClientTest, WaitsForANewOwnerThatLearnsTheMapLate) {
  // The master already says v2 (server 0's partitions on server 1), server 0
  // refuses them, but server 1 still works by v1 for its first 8 refusals:
  // the client must keep asking (within its time) rather than give up
  // after a few instant rounds.
  const proto::ClusterMap moved = MovePartitions(/*from=*/0, /*to=*/1);
  servers_[0]->SetMap(moved);
  servers_[1]->AdoptMapAfterRefusals(8, moved);
  refreshed_map_ = moved;
  const std::vector<uint64_t> wide = MakeKeys(100);
  CallOptions call;
  call.attempt_timeout = absl::Seconds(2);
  call.max_attempts = 1;
  std::unique_ptr<PsClient> client = MakeClient(size_t{4} << 20, call);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::vector<std::vector<float>> out;
  const Status status = client->Pull(tables, &out);
  ASSERT_TRUE(status.ok()) << status;
  ExpectRows(kWide, wide, out[0]);
  EXPECT_EQ(servers_[1]->refusals(), 8);
}

TEST_F(PsClientTest, EndlessWrongOwnerFailsWithinTheCallTime) {
  // Server 0 refuses its keys and nobody else takes them.
  servers_[0]->SetMap(MovePartitions(/*from=*/0, /*to=*/1));
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(150);
  call.max_attempts = 2;
  std::unique_ptr<PsClient> client = MakeClient(size_t{4} << 20, call);
  const std::vector<uint64_t> wide = MakeKeys(50);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::vector<std::vector<float>> out;
  const absl::Time start = absl::Now();
  const Status status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_GE(refreshes_, 1);
}

TEST_F(PsClientTest, RetriesNotReadyUntilTheServerHasTheMap) {
  servers_[1]->FailNext(
      3, ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet", proto::NOT_READY));
  const std::vector<uint64_t> wide = MakeKeys(120);
  const std::vector<uint64_t> deep = MakeKeys(60, /*salt=*/300);
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ExpectRows(kWide, wide, out[0]);
  ExpectRows(kDeep, deep, out[1]);
  EXPECT_EQ(servers_[1]->requests(), 4);
  EXPECT_EQ(servers_[0]->requests(), 1);
  EXPECT_EQ(refreshes_, 0);  // NOT_READY is no reason to refetch the map

  servers_[2]->FailNext(
      2, ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet", proto::NOT_READY));
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  ASSERT_TRUE(client->Push(tables, grads).ok());
  for (const auto& server : servers_) {
    for (const auto& [table_key, rows] : server->pushed()) EXPECT_EQ(rows.size(), 1u);
  }
}

TEST_F(PsClientTest, NotReadyForeverFailsWithinTheCallTime) {
  servers_[2]->FailNext(
      -1, ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet", proto::NOT_READY));
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(100);
  call.max_attempts = 2;
  std::unique_ptr<PsClient> client = MakeClient(size_t{4} << 20, call);
  const std::vector<uint64_t> wide = MakeKeys(50);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::vector<std::vector<float>> out;
  const absl::Time start = absl::Now();
  const Status status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// A server telling the worker to slow down (its row quota) did nothing:
// the request goes again after a pause, and a worker kept waiting past its
// call time hears why.
TEST_F(PsClientTest, SlowDownIsWaitedOutAndNamedWhenItLasts) {
  const Status slow_down = ErrorWithReason(absl::StatusCode::kResourceExhausted,
                                           "worker 1 created more than ...", proto::SLOW_DOWN);
  servers_[1]->FailNext(2, slow_down);
  const std::vector<uint64_t> wide = MakeKeys(120);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::unique_ptr<PsClient> client = MakeClient();
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ExpectRows(kWide, wide, out[0]);
  EXPECT_EQ(servers_[1]->requests(), 3);
  EXPECT_EQ(refreshes_, 0);

  servers_[1]->FailNext(-1, slow_down);
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(100);
  call.max_attempts = 2;
  std::unique_ptr<PsClient> impatient = MakeClient(size_t{4} << 20, call);
  const Status status = impatient->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("ps.max_new_rows_per_worker_s"));
}

TEST_F(PsClientTest, DeadServerIsDeadlineExceededNamingIt) {
  // Server 1's port is closed: nobody listens there any more.
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(100);
  call.max_attempts = 2;
  std::unique_ptr<PsClient> client = MakeClient(size_t{4} << 20, call);
  const std::vector<uint64_t> wide = MakeKeys(100);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::vector<std::vector<float>> out;
  const absl::Time start = absl::Now();
  Status status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr(dead));
  const std::vector<std::span<const float>> grads = {wide_grads};
  status = client->Push(tables, grads);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr(dead));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// A client whose worker was fenced stops waiting for a silent server at
// once, well before the call's own time runs out.
TEST_F(PsClientTest, AbandonedCallsFailAtOnceWithAborted) {
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  CallOptions call;
  call.attempt_timeout = absl::Seconds(20);
  call.max_attempts = 3;
  std::unique_ptr<PsClient> client = MakeClient(size_t{4} << 20, call);
  const absl::Time start = absl::Now();
  client->set_abandon([start] { return absl::Now() - start > absl::Milliseconds(200); });
  const std::vector<uint64_t> wide = MakeKeys(100);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::vector<std::vector<float>> out;
  const Status status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(PsClientTest, ServerErrorIsReturnedAsSuch) {
  servers_[2]->FailNext(1, absl::InvalidArgumentError("table 1 is unknown here"));
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<uint64_t> deep = MakeKeys(60);
  const std::vector<PsClient::Keys> tables = {{kDeep, deep}};
  std::vector<std::vector<float>> out;
  const Status status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("table 1 is unknown here"));
  EXPECT_EQ(refreshes_, 0);
  // Every call of the failed round was waited for: the next call is clean.
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ExpectRows(kDeep, deep, out[0]);
}

TEST_F(PsClientTest, MalformedPullReplyIsDataLoss) {
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<uint64_t> wide = MakeKeys(80);
  const std::vector<uint64_t> deep = MakeKeys(80, /*salt=*/100);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  std::vector<std::vector<float>> out;
  servers_[0]->SetPullReplyMode(PullReplyMode::kMissingFrame);
  Status status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(servers_[0]->info().endpoint()));

  servers_[0]->SetPullReplyMode(PullReplyMode::kNormal);
  servers_[1]->SetPullReplyMode(PullReplyMode::kExtraValue);
  status = client->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(servers_[1]->info().endpoint()));
}

TEST_F(PsClientTest, EmptyKeyListsWork) {
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<uint64_t> none;
  const std::vector<uint64_t> deep = MakeKeys(30);
  std::vector<std::vector<float>> out = {{1.0f}, {2.0f}, {3.0f}};
  // No tables at all, and tables without keys: nothing is sent.
  ASSERT_TRUE(client->Pull({}, &out).ok());
  EXPECT_TRUE(out.empty());
  std::vector<PsClient::Keys> tables = {{kWide, none}, {kDeep, none}};
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].empty());
  EXPECT_TRUE(out[1].empty());
  std::vector<std::span<const float>> grads = {{}, {}};
  ASSERT_TRUE(client->Push(tables, grads).ok());
  for (const auto& server : servers_) EXPECT_EQ(server->requests(), 0);

  // An empty table next to a full one.
  tables = {{kWide, none}, {kDeep, deep}};
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  EXPECT_TRUE(out[0].empty());
  ExpectRows(kDeep, deep, out[1]);
  for (const auto& server : servers_) EXPECT_TRUE(server->pulled(kWide).empty());
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  grads = {{}, deep_grads};
  ASSERT_TRUE(client->Push(tables, grads).ok());
}

TEST_F(PsClientTest, FetchesTheMapOnFirstUse) {
  std::unique_ptr<PsClient> client = MakeClient(size_t{4} << 20, Patient(), /*install_map=*/false);
  EXPECT_EQ(client->map_version(), 0u);
  const std::vector<uint64_t> wide = MakeKeys(40);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(client->Pull(tables, &out).ok());
  ExpectRows(kWide, wide, out[0]);
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(client->map_version(), 1u);
}

TEST_F(PsClientTest, RejectsAnInconsistentMap) {
  std::unique_ptr<PsClient> client = MakeClient();
  proto::ClusterMap bad = map_;
  bad.set_version(9);
  bad.set_partition_owner(3, 42);  // no such server
  EXPECT_EQ(client->SetClusterMap(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->map_version(), 1u);
}

}  // namespace
}  // namespace eps
