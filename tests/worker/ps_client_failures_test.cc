// Tests worker/ps_client.h when servers fail it (fake servers:
// tests/worker/ps_client_testing.h): a new owner that learns the map late,
// endless WRONG_OWNER or NOT_READY, SLOW_DOWN, a dead server, a server that
// left the job (drained and gone) while the client's map still names it,
// abandoned calls, errors and malformed replies, empty calls, and the map.

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
#include "tests/worker/ps_client_testing.h"

namespace eps {
namespace {

using ::testing::HasSubstr;


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
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Seconds(2), 1);
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
  absl::Duration took;
  const Status status = PullGivingUp(absl::Milliseconds(150), 2, &took);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_GE(refreshes_, 1);
}

TEST_F(PsClientTest, RetriesNotReadyUntilTheServerHasTheMap) {
  servers_[1]->FailNext(
      3, ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet", proto::NOT_READY));
  const std::vector<uint64_t> wide = MakeKeys(120);
  const std::vector<uint64_t> deep = MakeKeys(60, /*salt=*/300);
  std::unique_ptr<PsClient> client = MakeClient();
  ASSERT_NO_FATAL_FAILURE(ExpectPulls(*client, wide, deep));
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
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
  absl::Duration took;
  const Status status = PullGivingUp(absl::Milliseconds(100), 2, &took);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(took, absl::Seconds(2));
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
  std::unique_ptr<PsClient> impatient = ClientGivingUpAfter(absl::Milliseconds(100), 2);
  const Status status = impatient->Pull(tables, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("ps.max_new_rows_per_worker_s"));
}

TEST_F(PsClientTest, DeadServerIsDeadlineExceededNamingIt) {
  // Server 1's port is closed: nobody listens there any more.
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Milliseconds(100), 2);
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

// The master's map after a drain of server 1 into server 2 (issue 49): a
// newer version with server 1's partitions on server 2 and server 1 erased
// (retired); servers 0 and 2 work by it, and the client's refresh returns
// it. Server 1's port in the client's map is closed (MoveServerOneToAClosedPort):
// the retired server has exited.
proto::ClusterMap RetireServerOne(const proto::ClusterMap& before) {
  proto::ClusterMap retired = before;
  retired.set_version(before.version() + 1);
  for (int p = 0; p < retired.partition_owner_size(); ++p) {
    if (retired.partition_owner(p) == 1) retired.set_partition_owner(p, 2);
  }
  retired.clear_servers();
  for (const proto::ServerInfo& server : before.servers()) {
    if (server.id() != 1) *retired.add_servers() = server;
  }
  return retired;
}

// A push whose server no longer answers (it was drained, retired and exited
// while the worker's map still named it) asks the master for the map and
// goes to the new owner: applied exactly once, receipt and all, instead of
// failing the worker with kDeadlineExceeded.
TEST_F(PsClientTest, SilentServerGoneFromTheMapIsLeftForItsNewOwner) {
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Milliseconds(100), 2);
  const proto::ClusterMap retired = RetireServerOne(map_);
  servers_[0]->SetMap(retired);
  servers_[2]->SetMap(retired);
  refreshed_map_ = retired;

  const std::vector<uint64_t> wide = MakeKeys(100);
  const std::vector<uint64_t> deep = MakeKeys(60, /*salt=*/500);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  // Some keys were server 1's, or the test proves nothing.
  size_t on_one = 0;
  for (uint64_t key : wide) on_one += OwnerOf(map_, key) == 1 ? 1 : 0;
  ASSERT_GT(on_one, 0u);

  proto::WorkBatch batch;
  batch.set_records(7);
  std::string receipt;
  const Status status =
      client->Push(tables, grads, {.pass = 1, .batch = &batch, .receipt = &receipt});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_FALSE(receipt.empty());
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(client->map_version(), retired.version());
  EXPECT_EQ(servers_[1]->requests(), 0);  // the live fake behind the old endpoint
  // Every key applied once, on its owner under the new map.
  for (uint32_t table : {kWide, kDeep}) {
    for (uint64_t key : table == kWide ? wide : deep) {
      const uint32_t owner = OwnerOf(retired, key);
      for (uint32_t id = 0; id < servers_.size(); ++id) {
        const auto pushed = servers_[id]->pushed();
        const auto it = pushed.find({table, key});
        const size_t times = it == pushed.end() ? 0 : it->second.size();
        EXPECT_EQ(times, id == owner ? 1u : 0u) << "table " << table << " key " << key
                                                << " on server " << id;
      }
    }
  }
  // Pulls go by the new map, with no more silence to wait out.
  ASSERT_NO_FATAL_FAILURE(ExpectPulls(*client, wide, deep));
  EXPECT_EQ(refreshes_, 1);
}

// A pull meeting the silence fetches the map and reads the new owner too.
TEST_F(PsClientTest, SilentServerGoneFromTheMapIsLeftByPulls) {
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Milliseconds(100), 2);
  const proto::ClusterMap retired = RetireServerOne(map_);
  servers_[0]->SetMap(retired);
  servers_[2]->SetMap(retired);
  refreshed_map_ = retired;
  ASSERT_NO_FATAL_FAILURE(ExpectPulls(*client, MakeKeys(100), MakeKeys(60, /*salt=*/500)));
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(client->map_version(), retired.version());
}

// A client told of a newer map (a worker's heartbeat reply announced it)
// fetches it before its next call: nothing goes to a server the new map
// retired, even one still up that would take the keys by the old map.
TEST_F(PsClientTest, AnAnnouncedMapIsFetchedBeforeTheNextCall) {
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Milliseconds(500), 2);
  const proto::ClusterMap retired = RetireServerOne(map_);
  servers_[0]->SetMap(retired);
  servers_[2]->SetMap(retired);
  refreshed_map_ = retired;
  uint64_t announced = map_.version();
  client->set_newest_map([&announced] { return announced; });
  const std::vector<uint64_t> wide = MakeKeys(100);
  const std::vector<uint64_t> deep = MakeKeys(60, /*salt=*/500);
  ASSERT_NO_FATAL_FAILURE(ExpectPulls(*client, wide, deep));
  EXPECT_EQ(refreshes_, 0) << "no newer map announced";
  const int before = servers_[1]->requests();
  ASSERT_GT(before, 0) << "server 1 owns some of the keys by the old map";

  announced = retired.version();
  ASSERT_NO_FATAL_FAILURE(ExpectPulls(*client, wide, deep));
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(client->map_version(), retired.version());
  EXPECT_EQ(servers_[1]->requests(), before) << "the retired server heard nothing more";
}

// Only a map that leaves the keys elsewhere is followed: a newer map that
// still places them on the silent server leaves the silence standing (the
// worker's AwaitVerdict decides), and the client's map as it was.
TEST_F(PsClientTest, SilentServerStillInTheNewerMapIsDeadlineExceeded) {
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Milliseconds(100), 2);
  // v2 moves server 0's partitions to server 2; server 1 keeps its own.
  refreshed_map_ = map_;
  refreshed_map_.set_version(map_.version() + 1);
  for (int p = 0; p < refreshed_map_.partition_owner_size(); ++p) {
    if (refreshed_map_.partition_owner(p) == 0) refreshed_map_.set_partition_owner(p, 2);
  }
  const std::vector<uint64_t> wide = MakeKeys(100);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  const std::vector<std::span<const float>> grads = {wide_grads};
  const Status status = client->Push(tables, grads);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr(dead));
  EXPECT_THAT(status.message(), HasSubstr("still places"));
  EXPECT_EQ(refreshes_, 1);
  EXPECT_EQ(client->map_version(), map_.version());
  // Nothing of server 1's keys went anywhere else.
  for (uint64_t key : wide) {
    if (OwnerOf(map_, key) != 1) continue;
    for (const auto& server : servers_) EXPECT_EQ(server->pushed().count({kWide, key}), 0u);
  }
}

// A client whose worker was fenced stops waiting for a silent server at
// once, well before the call's own time runs out.
TEST_F(PsClientTest, AbandonedCallsFailAtOnceWithAborted) {
  const std::string dead = MoveServerOneToAClosedPort();
  ASSERT_FALSE(dead.empty());
  std::unique_ptr<PsClient> client = ClientGivingUpAfter(absl::Seconds(20), 3);
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
