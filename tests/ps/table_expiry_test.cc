// Expiry (TableSpec.ttl_passes): rows untrained for ttl passes leave memory
// and the store; the others keep their values.

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ps/kv_store.h"
#include "ps/table.h"
#include "ps/write_queue.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

constexpr uint32_t kDim = 4;

proto::TableSpec ExpirySpec(uint32_t ttl_passes) {
  proto::TableSpec spec;
  spec.set_id(2);
  spec.set_name("emb");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(kDim);
  spec.mutable_initializer()->set_kind(proto::InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  spec.mutable_optimizer()->set_initial_accumulator(0.1f);
  spec.mutable_optimizer()->set_epsilon(1e-8f);
  spec.set_ttl_passes(ttl_passes);
  return spec;
}

std::vector<float> Grads(size_t keys) { return std::vector<float>(keys * kDim, 1.0f); }

// Whether each key's pulled row is trained (non-zero: ZEROS initializer).
std::vector<bool> Trained(Table& table, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * kDim);
  EXPECT_TRUE(table.Pull(keys, out).ok());
  std::vector<bool> trained;
  for (size_t i = 0; i < keys.size(); ++i) trained.push_back(out[i * kDim] != 0.0f);
  return trained;
}

TEST(TableExpiry, WithoutTtlNothingExpiresAndRowsKeepTheirWidth) {
  auto table = Table::Create(ExpirySpec(0), 1);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->stored_floats(), (*table)->row_floats());
  ASSERT_TRUE((*table)->Push(std::vector<uint64_t>{1, 2}, Grads(2), 1.0f, nullptr, 1).ok());
  StatusOr<uint64_t> expired = (*table)->Expire(100);
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(*expired, 0u);
  EXPECT_EQ((*table)->num_rows(), 2u);
}

TEST(TableExpiry, InMemoryRowsGoAfterTtlPassesUntrained) {
  std::atomic<uint32_t> pass{0};
  TableStorage storage;
  storage.pass = &pass;
  auto made = Table::Create(ExpirySpec(2), 1, storage);
  ASSERT_TRUE(made.ok()) << made.status();
  Table& table = **made;
  EXPECT_EQ(table.stored_floats(), table.row_floats() + 1);
  // Pass 0 trains 1 and 2, pass 1 trains 2 and 3, pass 2 trains 4; 5 is only
  // pulled (a new row, counted as of the pass in progress, 0); 6 comes from
  // a warm start (the pass before the first).
  ASSERT_TRUE(table.Push(std::vector<uint64_t>{1, 2}, Grads(2), 1.0f, nullptr, 1).ok());
  ASSERT_TRUE(table.Push(std::vector<uint64_t>{2, 3}, Grads(2), 1.0f, nullptr, 2).ok());
  ASSERT_TRUE(table.Push(std::vector<uint64_t>{4}, Grads(1), 1.0f, nullptr, 3).ok());
  std::vector<float> pulled(kDim);
  ASSERT_TRUE(table.Pull(std::vector<uint64_t>{5}, pulled).ok());
  const std::vector<float> imported(table.row_floats(), 0.25f);
  ASSERT_TRUE(table.Put(std::vector<uint64_t>{6}, imported, table.row_floats()).ok());
  // A late push of pass 0 to row 4 does not make it look older.
  ASSERT_TRUE(table.Push(std::vector<uint64_t>{4}, Grads(1), 1.0f, nullptr, 1).ok());
  ASSERT_EQ(table.num_rows(), 6u);

  // Two passes done: with a ttl of 2 only rows of the pass before the first
  // (6) went untrained for two.
  StatusOr<uint64_t> expired = table.Expire(2);
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, 1u);
  // Three done: what pass 0 trained last (1) and the row made in pass 0 (5).
  expired = table.Expire(3);
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(*expired, 2u);
  EXPECT_EQ(table.num_rows(), 3u);
  // Again for the same passes: nothing more.
  expired = table.Expire(3);
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(*expired, 0u);
  EXPECT_EQ(table.stats().rows_expired, 3u);
  // 2 and 3 were trained last in pass 1, 4 in pass 2.
  EXPECT_EQ(Trained(table, {1, 2, 3, 4, 6}),
            (std::vector<bool>{false, true, true, true, false}));

  // A push naming no pass counts as of the pass in progress.
  pass = 4;
  ASSERT_TRUE(table.Push(std::vector<uint64_t>{2}, Grads(1), 1.0f, nullptr, 0).ok());
  expired = table.Expire(5);  // rows of pass 2 and before: 3, 4 and the pulled 1 and 6
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(Trained(table, {2, 3, 4}), (std::vector<bool>{true, false, false}));
}

// Over a store with a small budget, so that most rows live only in the
// store: expired rows leave it, the rest keep their values.
class StoredExpiry : public ::testing::TestWithParam<bool> {};

TEST_P(StoredExpiry, RowsOnlyInTheStoreExpireToo) {
  ::eps::testing::TempDir temp;
  std::unique_ptr<KvStore> store;
  if (GetParam()) {
    RocksKvStoreOptions options;
    options.dir = temp.path() + "/db";
    StatusOr<std::unique_ptr<KvStore>> opened = OpenRocksKvStore(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    store = *std::move(opened);
  } else {
    store = NewMemoryKvStore();
  }
  WriteQueue queue(store.get());
  std::atomic<uint32_t> pass{0};
  auto probe = Table::Create(ExpirySpec(1), 1);
  ASSERT_TRUE(probe.ok());
  MemoryBudget budget(static_cast<int64_t>(100 * (*probe)->bytes_per_row()));
  TableStorage storage;
  storage.store = store.get();
  storage.queue = &queue;
  storage.budget = &budget;
  storage.pass = &pass;
  auto made = Table::Create(ExpirySpec(1), 1, storage);
  ASSERT_TRUE(made.ok()) << made.status();
  Table& table = **made;
  const auto flush = [&] {
    const uint64_t seq = table.QueueDirtyRows();
    if (seq > 0) {
      ASSERT_TRUE(queue.WaitDurable(seq, absl::Seconds(20)).ok());
    }
    table.EvictToBudget();
  };

  // Pass 0 trains 2,000 rows; pass 1 trains the first 300 of them again,
  // after they were written and evicted (their pass comes back with them).
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 2000; ++k) keys.push_back(k * 7919 + 11);
  ASSERT_TRUE(table.Push(keys, Grads(keys.size()), 1.0f, nullptr, 1).ok());
  flush();
  ASSERT_LE(table.num_rows(), 200u);
  const std::vector<uint64_t> kept(keys.begin(), keys.begin() + 300);
  ASSERT_TRUE(table.Push(kept, Grads(kept.size()), 1.0f, nullptr, 2).ok());
  flush();

  StatusOr<uint64_t> expired = table.Expire(2);
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, 1700u);
  std::set<uint64_t> stored;
  ASSERT_TRUE(store
                  ->Scan(2,
                         [&](uint64_t key, absl::string_view value) {
                           EXPECT_EQ(value.size(), sizeof(float) * table.stored_floats());
                           stored.insert(key);
                           return absl::OkStatus();
                         })
                  .ok());
  EXPECT_EQ(stored, std::set<uint64_t>(kept.begin(), kept.end()));
  const std::vector<bool> trained = Trained(table, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(trained[i], i < kept.size()) << "key " << keys[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, StoredExpiry, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Rocks" : "Memory";
                         });

}  // namespace
}  // namespace eps
