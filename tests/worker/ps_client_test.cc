// Tests worker/ps_client.h against fake parameter servers
// (tests/worker/ps_client_testing.h): pulls and pushes reach every row's
// owner once, in pieces under the size cap, and follow WRONG_OWNER.

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

// A push that reads its rows back gets them as a pull would, from every
// message of the push, with each server's lowest version of them.
TEST_F(PsClientTest, APushReadsItsRowsBack) {
  const std::vector<uint64_t> wide = MakeKeys(500);
  const std::vector<uint64_t> deep = MakeKeys(300, /*salt=*/800);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  std::unique_ptr<PsClient> client = MakeClient(/*max_request_bytes=*/2048);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  PsClient::Versions applied;
  PsClient::Rows after;
  ASSERT_TRUE(client->Push(tables, grads, {.versions = &applied, .after = &after})
                  .ok());
  ASSERT_EQ(after.values.size(), 2u);
  ExpectRows(kWide, wide, after.values[0]);
  ExpectRows(kDeep, deep, after.values[1]);
  ASSERT_EQ(after.versions.size(), 2u);
  int several = 0;  // (table, server) pairs sent in several messages
  for (size_t t = 0; t < 2; ++t) {
    ASSERT_EQ(after.versions[t].size(), servers_.size());
    for (size_t s = 0; s < servers_.size(); ++s) {
      EXPECT_GE(after.versions[t][s], 1u) << "table " << t << " server " << s;
      // The rows hold the lowest version of their messages, the push
      // reached the highest.
      EXPECT_LE(after.versions[t][s], applied[t][s]) << "table " << t << " server " << s;
      several += after.versions[t][s] < applied[t][s];
    }
  }
  EXPECT_GT(several, 0);
  // Without `after`, the servers are not asked for rows.
  int asked = 0;
  for (const auto& server : servers_) asked += server->rows_asked();
  EXPECT_GT(asked, 0);
  ASSERT_TRUE(client->Push(tables, grads).ok());
  int asked_after = 0;
  for (const auto& server : servers_) asked_after += server->rows_asked();
  EXPECT_EQ(asked_after, asked);
}

// A server that answers a push without its rows: the push succeeded (it
// was applied) and `after` is empty, so that the caller pulls instead.
TEST_F(PsClientTest, APushWhoseRowsDoNotComeBackStillSucceeds) {
  const std::vector<uint64_t> wide = MakeKeys(50);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  for (const auto& server : servers_) server->IgnoreReplyRows();
  std::unique_ptr<PsClient> client = MakeClient();
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  const std::vector<std::span<const float>> grads = {wide_grads};
  PsClient::Rows after;
  ASSERT_TRUE(client->Push(tables, grads, {.after = &after})
                  .ok());
  EXPECT_TRUE(after.values.empty());
  EXPECT_TRUE(after.versions.empty());
  size_t rows = 0;
  for (const auto& server : servers_) rows += server->pushed().size();
  EXPECT_EQ(rows, wide.size());
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
  const proto::ClusterMap moved = HandOverPartitions(/*from=*/0, /*to=*/1);
  const std::vector<uint64_t> wide = MakeKeys(300);
  const std::vector<uint64_t> deep = MakeKeys(100, /*salt=*/400);
  std::unique_ptr<PsClient> client = MakeClient();
  ASSERT_NO_FATAL_FAILURE(ExpectPulls(*client, wide, deep));
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

TEST_F(PsClientTest, PushAfterWrongOwnerAppliesEveryKeyOnceAndReadsEveryRowBack) {
  const proto::ClusterMap moved = HandOverPartitions(/*from=*/2, /*to=*/0);
  const std::vector<uint64_t> wide = MakeKeys(400);
  const std::vector<uint64_t> deep = MakeKeys(200, /*salt=*/900);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<float> deep_grads = GradsFor(kDeep, deep);
  // A small cap: several requests per server, all refused by server 2.
  std::unique_ptr<PsClient> client = MakeClient(/*max_request_bytes=*/1024);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}, {kDeep, deep}};
  const std::vector<std::span<const float>> grads = {wide_grads, deep_grads};
  // Its rows read back too: those of the refused requests come with the
  // re-sent ones.
  PsClient::Rows after;
  ASSERT_TRUE(client->Push(tables, grads, {.after = &after})
                  .ok());
  EXPECT_EQ(refreshes_, 1);
  EXPECT_GT(servers_[2]->refusals(), 1);
  EXPECT_TRUE(servers_[2]->pushed().empty());
  ASSERT_EQ(after.values.size(), 2u);
  ExpectRows(kWide, wide, after.values[0]);
  ExpectRows(kDeep, deep, after.values[1]);

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

// A push names its batch in one request, not in every server's: each server
// would make the same receipt (an HMAC) for it.
TEST_F(PsClientTest, OneRequestOfAPushCarriesItsBatchForTheReceipt) {
  const std::vector<uint64_t> wide = MakeKeys(400);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  const std::vector<std::span<const float>> grads = {wide_grads};
  proto::WorkBatch batch;
  batch.set_shard_id(3);
  batch.set_records(400);
  std::unique_ptr<PsClient> client = MakeClient();
  std::string receipt;
  ASSERT_TRUE(client->Push(tables, grads, {.batch = &batch, .receipt = &receipt}).ok());
  int batches = 0;
  for (const auto& server : servers_) {
    EXPECT_FALSE(server->pushed().empty()) << "every server took keys";
    if (server->batches() == 1) {
      EXPECT_EQ(receipt, absl::StrCat("receipt of ps ", server->info().id()));
    }
    batches += server->batches();
  }
  EXPECT_EQ(batches, 1);

  // A receipt string the caller left filled is not taken for this push's.
  receipt = "a stale receipt";
  ASSERT_TRUE(client->Push(tables, grads, {.batch = &batch, .receipt = &receipt}).ok());
  batches = 0;
  for (const auto& server : servers_) batches += server->batches();
  EXPECT_EQ(batches, 2);
  EXPECT_THAT(receipt, ::testing::StartsWith("receipt of ps "));
  // Without a receipt to take, no batch is sent (no server makes one).
  ASSERT_TRUE(client->Push(tables, grads, {.batch = &batch}).ok());
  batches = 0;
  for (const auto& server : servers_) batches += server->batches();
  EXPECT_EQ(batches, 2);
}

// The request carrying the batch refused (WRONG_OWNER): the next round's
// first request carries it, and the receipt still comes.
TEST_F(PsClientTest, ARefusedCarrierPassesTheBatchOnToTheNextRound) {
  HandOverPartitions(/*from=*/0, /*to=*/1);
  const std::vector<uint64_t> wide = MakeKeys(400);
  const std::vector<float> wide_grads = GradsFor(kWide, wide);
  const std::vector<PsClient::Keys> tables = {{kWide, wide}};
  const std::vector<std::span<const float>> grads = {wide_grads};
  proto::WorkBatch batch;
  batch.set_shard_id(3);
  std::unique_ptr<PsClient> client = MakeClient();
  std::string receipt;
  ASSERT_TRUE(client->Push(tables, grads, {.batch = &batch, .receipt = &receipt}).ok());
  EXPECT_EQ(servers_[0]->refusals(), 1);
  EXPECT_EQ(servers_[0]->batches(), 0) << "refused: applied nothing";
  EXPECT_FALSE(receipt.empty());
  int batches = 0;
  for (const auto& server : servers_) batches += server->batches();
  EXPECT_EQ(batches, 1) << "once applied, the batch goes no further";
}

}  // namespace
}  // namespace eps
