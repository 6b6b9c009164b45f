// Tests master/state_store.h: the master's RocksDB-backed state. Every
// record kind round-trips, updates apply atomically in order, a pass's
// records are cleared together, and the state survives closing the store.

#include "master/state_store.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

proto::MasterRecord MasterRecordFor(uint32_t epoch) {
  proto::MasterRecord record;
  record.set_format_version(1);
  record.set_config_fingerprint("data.train=/data\njob.seed=7");
  record.set_phase(1);
  record.set_epoch(epoch);
  record.set_next_worker_id(5);
  record.set_membership_epoch(12);
  record.add_fenced_workers(1);
  record.add_fenced_workers(3);
  record.set_records_trained(1234);
  proto::EpochLedger* ledger = record.add_ledger();
  ledger->set_epoch(1);
  ledger->set_records_expected(1000);
  ledger->set_records_committed(1000);
  ledger->set_loss_sum(0.25);
  record.set_eval_auc(0.75);
  return record;
}

proto::DataSetRecord DataSetRecordFor(const std::string& file, uint64_t records) {
  proto::DataSetRecord record;
  record.add_files(file);
  record.set_records(records);
  record.set_bytes(records * 10);
  proto::ShardRecord* shard = record.add_shards();
  shard->set_begin(0);
  shard->set_end(records * 10);
  shard->set_first_line(1);
  shard->set_records(records);
  return record;
}

proto::ShardRecord ShardRecordFor(uint64_t begin, proto::ShardStateProto state) {
  proto::ShardRecord record;
  record.set_file(1);
  record.set_begin(begin);
  record.set_end(begin + 100);
  record.set_first_line(begin / 10 + 1);
  record.set_records(10);
  record.set_state(state);
  record.set_holder(4);
  record.set_committed(begin + 30);
  record.set_committed_line(begin / 10 + 4);
  record.set_committed_records(3);
  record.set_assignments(2);
  return record;
}

std::string Bytes(const google::protobuf::Message& message) { return message.SerializeAsString(); }

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/state_store_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::unique_ptr<StateStore> OpenStore() {
    StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir_ + "/state");
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  MasterSnapshot LoadSnapshot(const StateStore& store) {
    StatusOr<std::optional<MasterSnapshot>> loaded = store.Load();
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded.ok() && loaded->has_value());
    return loaded.ok() && loaded->has_value() ? **std::move(loaded) : MasterSnapshot();
  }

  // One update with a record of every kind.
  StateUpdate Everything() {
    StateUpdate update;
    update.PutDataSet(/*eval=*/false, DataSetRecordFor("/data/train", 40));
    update.PutDataSet(/*eval=*/true, DataSetRecordFor("/data/eval", 20));
    update.PutShard(0, ShardRecordFor(0, proto::SHARD_DOING));
    update.PutShard(1, ShardRecordFor(100, proto::SHARD_TODO));
    update.PutShard(17, ShardRecordFor(300, proto::SHARD_DONE));
    update.PutEvalResult(1, 100, {1.0f, 0.0f}, {0.875f, 0.125f});
    update.PutMaster(MasterRecordFor(3));
    return update;
  }

  std::string dir_;
};

TEST_F(StateStoreTest, NewStoreLoadsNothing) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StatusOr<std::optional<MasterSnapshot>> loaded = store->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
  // An empty update is allowed and changes nothing.
  StateUpdate empty;
  EXPECT_TRUE(empty.empty());
  ASSERT_TRUE(store->Write(empty).ok());
  loaded = store->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
}

// Without the master record there is no job to resume, whatever else the
// store holds.
TEST_F(StateStoreTest, ShardsWithoutAMasterRecordLoadNothing) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StateUpdate update;
  update.PutShard(0, ShardRecordFor(0, proto::SHARD_TODO));
  EXPECT_FALSE(update.empty());
  ASSERT_TRUE(store->Write(update).ok());
  StatusOr<std::optional<MasterSnapshot>> loaded = store->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
}

TEST_F(StateStoreTest, EveryRecordKindRoundTrips) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(Everything()).ok());
  const MasterSnapshot snapshot = LoadSnapshot(*store);
  EXPECT_EQ(Bytes(snapshot.master), Bytes(MasterRecordFor(3)));
  EXPECT_EQ(Bytes(snapshot.train), Bytes(DataSetRecordFor("/data/train", 40)));
  EXPECT_EQ(Bytes(snapshot.eval), Bytes(DataSetRecordFor("/data/eval", 20)));
  ASSERT_EQ(snapshot.shards.size(), 3u);
  EXPECT_EQ(Bytes(snapshot.shards.at(0)), Bytes(ShardRecordFor(0, proto::SHARD_DOING)));
  EXPECT_EQ(Bytes(snapshot.shards.at(1)), Bytes(ShardRecordFor(100, proto::SHARD_TODO)));
  EXPECT_EQ(Bytes(snapshot.shards.at(17)), Bytes(ShardRecordFor(300, proto::SHARD_DONE)));
  ASSERT_EQ(snapshot.eval_results.size(), 1u);
  const auto& [labels, predictions] = snapshot.eval_results.at({1, 100});
  EXPECT_THAT(labels, ElementsAre(1.0f, 0.0f));
  EXPECT_THAT(predictions, ElementsAre(0.875f, 0.125f));
}

// Later puts of a key replace earlier ones, within an update and across
// updates.
TEST_F(StateStoreTest, LaterPutsWin) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(Everything()).ok());
  StateUpdate update;
  update.PutShard(0, ShardRecordFor(0, proto::SHARD_TODO));
  update.PutShard(0, ShardRecordFor(0, proto::SHARD_DONE));
  update.PutMaster(MasterRecordFor(4));
  ASSERT_TRUE(store->Write(update).ok());
  const MasterSnapshot snapshot = LoadSnapshot(*store);
  EXPECT_EQ(snapshot.master.epoch(), 4u);
  EXPECT_EQ(snapshot.shards.at(0).state(), proto::SHARD_DONE);
  EXPECT_EQ(snapshot.shards.size(), 3u);
}

TEST_F(StateStoreTest, ClearPassDropsShardsAndEvalResultsOnly) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(Everything()).ok());
  StateUpdate next_pass;
  next_pass.ClearPass();
  EXPECT_FALSE(next_pass.empty());
  // The new pass's first records go in the same update, after the clear.
  next_pass.PutShard(2, ShardRecordFor(200, proto::SHARD_TODO));
  next_pass.PutMaster(MasterRecordFor(4));
  ASSERT_TRUE(store->Write(next_pass).ok());

  const MasterSnapshot snapshot = LoadSnapshot(*store);
  EXPECT_EQ(snapshot.master.epoch(), 4u);
  EXPECT_EQ(Bytes(snapshot.train), Bytes(DataSetRecordFor("/data/train", 40)));
  EXPECT_EQ(Bytes(snapshot.eval), Bytes(DataSetRecordFor("/data/eval", 20)));
  ASSERT_EQ(snapshot.shards.size(), 1u);
  EXPECT_EQ(Bytes(snapshot.shards.at(2)), Bytes(ShardRecordFor(200, proto::SHARD_TODO)));
  EXPECT_TRUE(snapshot.eval_results.empty());

  // A clear alone keeps the master record too.
  StateUpdate clear;
  clear.ClearPass();
  ASSERT_TRUE(store->Write(clear).ok());
  const MasterSnapshot cleared = LoadSnapshot(*store);
  EXPECT_EQ(cleared.master.epoch(), 4u);
  EXPECT_TRUE(cleared.shards.empty());
}

TEST_F(StateStoreTest, AppendKeepsTheOrderOfChanges) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(Everything()).ok());

  // Puts then more puts: both land, the later winning.
  StateUpdate first;
  first.PutShard(3, ShardRecordFor(400, proto::SHARD_TODO));
  first.PutMaster(MasterRecordFor(5));
  StateUpdate second;
  second.PutShard(3, ShardRecordFor(400, proto::SHARD_DOING));
  second.PutEvalResult(3, 400, {1.0f}, {0.5f});
  first.Append(std::move(second));
  ASSERT_TRUE(store->Write(first).ok());
  MasterSnapshot snapshot = LoadSnapshot(*store);
  EXPECT_EQ(snapshot.master.epoch(), 5u);
  ASSERT_EQ(snapshot.shards.size(), 4u);
  EXPECT_EQ(snapshot.shards.at(3).state(), proto::SHARD_DOING);
  EXPECT_EQ(snapshot.eval_results.size(), 2u);

  // Puts of the pass then a clear: the clear drops them, the master record
  // stays, and what follows the clear lands.
  StateUpdate before;
  before.PutShard(8, ShardRecordFor(800, proto::SHARD_TODO));
  before.PutEvalResult(8, 800, {0.0f}, {0.25f});
  before.PutMaster(MasterRecordFor(6));
  StateUpdate clearing;
  clearing.ClearPass();
  clearing.PutShard(9, ShardRecordFor(900, proto::SHARD_TODO));
  before.Append(std::move(clearing));
  ASSERT_TRUE(store->Write(before).ok());
  snapshot = LoadSnapshot(*store);
  EXPECT_EQ(snapshot.master.epoch(), 6u);
  ASSERT_EQ(snapshot.shards.size(), 1u);
  EXPECT_EQ(snapshot.shards.count(9), 1u);
  EXPECT_TRUE(snapshot.eval_results.empty());

  // Appending an empty update changes nothing.
  StateUpdate none;
  none.Append(StateUpdate());
  EXPECT_TRUE(none.empty());
}

TEST_F(StateStoreTest, ReopeningKeepsEverything) {
  {
    std::unique_ptr<StateStore> store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Write(Everything()).ok());
    StateUpdate more;
    more.PutShard(2, ShardRecordFor(200, proto::SHARD_DONE));
    ASSERT_TRUE(store->Write(more).ok());
  }
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const MasterSnapshot snapshot = LoadSnapshot(*store);
  EXPECT_EQ(Bytes(snapshot.master), Bytes(MasterRecordFor(3)));
  EXPECT_EQ(Bytes(snapshot.train), Bytes(DataSetRecordFor("/data/train", 40)));
  EXPECT_EQ(Bytes(snapshot.eval), Bytes(DataSetRecordFor("/data/eval", 20)));
  ASSERT_EQ(snapshot.shards.size(), 4u);
  EXPECT_EQ(Bytes(snapshot.shards.at(2)), Bytes(ShardRecordFor(200, proto::SHARD_DONE)));
  EXPECT_EQ(Bytes(snapshot.shards.at(17)), Bytes(ShardRecordFor(300, proto::SHARD_DONE)));
  ASSERT_EQ(snapshot.eval_results.size(), 1u);
  EXPECT_THAT(snapshot.eval_results.at({1, 100}).second, ElementsAre(0.875f, 0.125f));
}

// A second master on the same --data-dir must not write alongside the first.
TEST_F(StateStoreTest, SecondOpenOfAnOpenStoreIsUnavailable) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string dir = dir_ + "/state";
  StatusOr<std::unique_ptr<StateStore>> second = StateStore::Open(dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(dir));
  // Once the first is closed, the directory opens again.
  store.reset();
  second = StateStore::Open(dir);
  EXPECT_TRUE(second.ok()) << second.status();
}

TEST_F(StateStoreTest, UnusableDirectoryIsUnavailable) {
  // A regular file where the directory should be.
  const std::string file = dir_ + "/not-a-dir";
  { std::ofstream(file) << "x"; }
  StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(file);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(file));
}

// Eval results come back ordered by (shard, begin) numerically, whatever
// the order they were written in: the metrics are computed over them in
// that order.
TEST_F(StateStoreTest, EvalResultsComeBackOrderedByShardThenOffset) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StateUpdate update;
  update.PutMaster(MasterRecordFor(0));
  const std::vector<std::pair<uint64_t, uint64_t>> keys = {
      {10, 5}, {2, 0x100}, {2, 0x20}, {0x1'0000'0000, 0}, {2, 3}, {0, 0xffff'ffff'ffff}};
  for (size_t i = 0; i < keys.size(); ++i) {
    update.PutEvalResult(keys[i].first, keys[i].second, {static_cast<float>(i)},
                         {static_cast<float>(i) / 8});
  }
  // An eval commit of malformed lines only: no records.
  update.PutEvalResult(7, 0, {}, {});
  ASSERT_TRUE(store->Write(update).ok());
  const MasterSnapshot snapshot = LoadSnapshot(*store);
  std::vector<std::pair<uint64_t, uint64_t>> loaded;
  std::vector<float> labels;
  for (const auto& [key, result] : snapshot.eval_results) {
    loaded.push_back(key);
    labels.insert(labels.end(), result.first.begin(), result.first.end());
  }
  EXPECT_EQ(loaded, (std::vector<std::pair<uint64_t, uint64_t>>{{0, 0xffff'ffff'ffff},
                                                                {2, 3},
                                                                {2, 0x20},
                                                                {2, 0x100},
                                                                {7, 0},
                                                                {10, 5},
                                                                {0x1'0000'0000, 0}}));
  EXPECT_THAT(labels, ElementsAre(5.0f, 4.0f, 2.0f, 1.0f, 0.0f, 3.0f));
  EXPECT_TRUE(snapshot.eval_results.at({7, 0}).first.empty());
  EXPECT_THAT(snapshot.eval_results.at({2, 0x20}).second, ElementsAre(0.25f));
}

}  // namespace
}  // namespace eps

namespace eps {
namespace {

TEST_F(StateStoreTest, CheckpointRecordsSurviveClearPassAndCanBeDeleted) {
  std::unique_ptr<StateStore> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StateUpdate update = Everything();
  for (uint64_t id : {3, 1, 2}) {
    proto::CheckpointRecord record;
    record.set_id(id);
    *record.mutable_master() = MasterRecordFor(static_cast<uint32_t>(id));
    *record.add_shards() = ShardRecordFor(100 * id, proto::SHARD_DONE);
    record.add_servers()->set_path("/ps/checkpoints/" + std::to_string(id));
    update.PutCheckpoint(record);
  }
  ASSERT_TRUE(store->Write(update).ok());
  // A new pass clears its shards, never the checkpoints (they carry their
  // own copy of the pass); a deleted one is gone.
  StateUpdate next;
  next.ClearPass();
  next.DeleteCheckpoint(1);
  EXPECT_FALSE(next.empty());
  ASSERT_TRUE(store->Write(next).ok());
  const MasterSnapshot snapshot = LoadSnapshot(*store);
  EXPECT_TRUE(snapshot.shards.empty());
  ASSERT_EQ(snapshot.checkpoints.size(), 2u);
  EXPECT_EQ(snapshot.checkpoints.begin()->first, 2u);
  EXPECT_EQ(snapshot.checkpoints.rbegin()->first, 3u);
  const proto::CheckpointRecord& third = snapshot.checkpoints.at(3);
  EXPECT_EQ(third.master().epoch(), 3u);
  ASSERT_EQ(third.shards_size(), 1);
  EXPECT_EQ(third.shards(0).begin(), 300u);
  EXPECT_EQ(third.servers(0).path(), "/ps/checkpoints/3");
}

// What Load does per key, on bytes alone (fuzz/state_record_fuzzer.cc
// feeds it): a bad key or value is kDataLoss naming the key; keys of no
// record are ignored.
TEST(ParseStateRecord, DecodesEveryKindAndRefusesCorruptOnes) {
  StateUpdate update;
  update.PutMaster(MasterRecordFor(4));
  update.PutShard(7, ShardRecordFor(100, proto::SHARD_DOING));
  update.PutEvalResult(7, 100, {1, 0}, {0.75f, 0.25f});
  update.PutEvalResult(7, 200, {}, {});  // an empty commit (memcpy of null was UB)
  MasterSnapshot snapshot;
  for (const auto& [key, value] : update.puts_for_testing()) {
    ASSERT_TRUE(ParseStateRecord(key, value, &snapshot).ok()) << key;
  }
  EXPECT_EQ(snapshot.master.epoch(), 4u);
  EXPECT_EQ(snapshot.shards.at(7).begin(), 100u);
  EXPECT_THAT(snapshot.eval_results.at({7, 100}).second, ElementsAre(0.75f, 0.25f));
  EXPECT_TRUE(snapshot.eval_results.at({7, 200}).first.empty());
  EXPECT_TRUE(ParseStateRecord("pass/other", "x", &snapshot).ok());

  const std::string shard = update.puts_for_testing()[1].second;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"pass/shard/7", shard},                                // not 16 hex digits
           {"pass/shard/000000000000000g", shard},                 // not hex
           {"master", "\xff\xff"},                               // not a record
           {"eval/0000000000000007/0000000000000064", "abcdef"}}) {  // not two halves
    const Status status = ParseStateRecord(key, value, &snapshot);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << key;
    EXPECT_THAT(status.message(), HasSubstr(key));
  }
}

}  // namespace
}  // namespace eps
