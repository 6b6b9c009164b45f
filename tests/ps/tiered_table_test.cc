// Tests of ps/table.h with a store: the hot tier under a memory budget,
// eviction of durable rows, read-back of missing rows, durability on every
// push, and store errors. Every test runs against both KvStore back ends
// (the in-memory fake and RocksDB) unless it needs RocksDB.
//
// Updates are SGD with learning rate 0.5 on zero-initialised rows and
// gradients that are signed powers of two in [1/4, 4], so every weight is a
// multiple of 1/8 far below 2^20 and each expected value is exact,
// whatever order the updates were applied in.

#include <stdlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/hashing.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "cluster/initializer.h"
#include "ps/kv_store.h"
#include "ps/table.h"
#include "ps/write_queue.h"
#include "tests/ps/kv_store_testing.h"

namespace eps {
namespace {

constexpr uint32_t kDim = 4;
constexpr uint32_t kTableId = 3;

proto::TableSpec SgdSpec(proto::InitializerSpec::Kind initializer = proto::InitializerSpec::ZEROS) {
  proto::TableSpec spec;
  spec.set_id(kTableId);
  spec.set_name("emb");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(kDim);
  spec.mutable_initializer()->set_kind(initializer);
  spec.mutable_initializer()->set_scale(0.5f);
  spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  return spec;
}

// Bytes one resident row of SgdSpec() is charged against a budget.
uint64_t SgdBytesPerRow() {
  auto table = Table::Create(SgdSpec(), /*seed=*/1);
  CHECK(table.ok()) << table.status();
  return (*table)->bytes_per_row();
}

using ::eps::testing::TempDir;

std::unique_ptr<KvStore> OpenRocks(const std::string& dir) {
  RocksKvStoreOptions options;
  options.dir = dir;
  StatusOr<std::unique_ptr<KvStore>> store = OpenRocksKvStore(options);
  CHECK(store.ok()) << store.status();
  return *std::move(store);
}

// A gradient row for SgdSpec(): signed powers of two in [1/4, 4].
std::vector<float> RandomGrad(std::mt19937_64& rng) {
  std::vector<float> grad(kDim);
  for (float& g : grad) {
    const int exponent = static_cast<int>(rng() % 5) - 2;
    g = std::ldexp((rng() & 1) ? 1.0f : -1.0f, exponent);
  }
  return grad;
}

// `n` distinct keys spread over the whole 64-bit range.
std::vector<uint64_t> DistinctKeys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::unordered_set<uint64_t> seen;
  std::vector<uint64_t> keys;
  while (keys.size() < n) {
    const uint64_t key = rng();
    if (seen.insert(key).second) keys.push_back(key);
  }
  return keys;
}

// Reads `keys` of the test table straight from the store.
std::vector<std::vector<float>> StoreRows(KvStore& store, const std::vector<uint64_t>& keys,
                                          std::vector<bool>* found) {
  std::vector<char> bytes(keys.size() * kDim * sizeof(float));
  Status status = store.MultiGet(kTableId, keys, kDim * sizeof(float), bytes, found);
  EXPECT_TRUE(status.ok()) << status;
  std::vector<std::vector<float>> rows(keys.size(), std::vector<float>(kDim));
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(rows[i].data(), bytes.data() + i * kDim * sizeof(float), kDim * sizeof(float));
  }
  return rows;
}

// ---------------------------------------------------------------------------
// A table over a store of each back end, with its queue and budget.

enum class BackEnd { kMemory, kRocks };

std::string BackEndName(const ::testing::TestParamInfo<BackEnd>& info) {
  return info.param == BackEnd::kMemory ? "Memory" : "Rocks";
}

class TieredTable : public ::testing::TestWithParam<BackEnd> {
 protected:
  TieredTable() : bytes_per_row_(SgdBytesPerRow()) {}
  ~TieredTable() override { Close(); }

  // Opens the store (wrapped in a FailingKvStore) and a queue to it, and
  // creates the table with a budget of `budget_rows` rows (0: unlimited).
  void Open(uint64_t budget_rows, bool every_push,
            proto::InitializerSpec::Kind initializer = proto::InitializerSpec::ZEROS) {
    std::unique_ptr<KvStore> base =
        GetParam() == BackEnd::kMemory ? NewMemoryKvStore() : OpenRocks(temp_.path() + "/db");
    store_ = std::make_unique<FailingKvStore>(std::move(base));
    queue_ = std::make_unique<WriteQueue>(store_.get());
    budget_ = std::make_unique<MemoryBudget>(static_cast<int64_t>(budget_rows * bytes_per_row_));
    TableStorage storage;
    storage.store = store_.get();
    storage.queue = queue_.get();
    storage.budget = budget_.get();
    storage.write_every_push = every_push;
    storage.durability_timeout = absl::Seconds(20);
    auto table = Table::Create(SgdSpec(initializer), /*seed=*/7, storage);
    ASSERT_TRUE(table.ok()) << table.status();
    table_ = *std::move(table);
    ASSERT_EQ(table_->bytes_per_row(), bytes_per_row_);
  }

  void Close() {
    table_.reset();
    queue_.reset();
    store_.reset();
  }

  // What ServerStorage::Flush does: queues every dirty row, waits until it
  // is durable, then evicts down to the budget.
  Status Flush() {
    const uint64_t seq = table_->QueueDirtyRows();
    if (seq > 0) RETURN_IF_ERROR(queue_->WaitDurable(seq, absl::Seconds(20)));
    table_->EvictToBudget();
    return absl::OkStatus();
  }

  // Pushes grads (kDim per key) and adds their effect to expected_.
  Status Push(const std::vector<uint64_t>& keys, const std::vector<float>& grads) {
    Status status = table_->Push(keys, grads);
    if (status.ok()) {
      for (size_t i = 0; i < keys.size(); ++i) {
        std::vector<double>& row = Expected(keys[i]);
        for (uint32_t d = 0; d < kDim; ++d) row[d] -= 0.5 * grads[i * kDim + d];
      }
    }
    return status;
  }

  std::vector<double>& Expected(uint64_t key) {
    auto [it, inserted] = expected_.try_emplace(key);
    if (inserted) it->second.assign(kDim, 0.0);
    return it->second;
  }

  // Pulls `keys` and expects each to hold exactly its expected weights.
  void ExpectWeights(const std::vector<uint64_t>& keys, const std::string& context) {
    std::vector<float> out(keys.size() * kDim, -1e9f);
    Status status = table_->Pull(keys, out);
    ASSERT_TRUE(status.ok()) << status;
    int mismatches = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = expected_.find(keys[i]);
      for (uint32_t d = 0; d < kDim; ++d) {
        const double want = it == expected_.end() ? 0.0 : it->second[d];
        if (out[i * kDim + d] != want && ++mismatches <= 5) {
          ADD_FAILURE() << context << ": key " << keys[i] << " dim " << d << " holds "
                        << out[i * kDim + d] << ", expected " << want;
        }
      }
    }
    ASSERT_EQ(mismatches, 0) << context;
  }

  const uint64_t bytes_per_row_;
  TempDir temp_;
  std::unique_ptr<FailingKvStore> store_;
  std::unique_ptr<WriteQueue> queue_;
  std::unique_ptr<MemoryBudget> budget_;
  std::unique_ptr<Table> table_;
  std::unordered_map<uint64_t, std::vector<double>> expected_;
};

// ---------------------------------------------------------------------------
// Eviction and read-back.

// The lock stripe of a key, as ps/table.cc chooses it (the top 6 bits of
// Mix64(key)); only used to state how far over the budget memory may go.
constexpr int kStripes = 64;
int StripeOfKey(uint64_t key) { return static_cast<int>(Mix64(key) >> 58); }

struct WorkloadResult {
  uint64_t lookups = 0;
  uint64_t requests = 0;
  uint64_t flushes = 0;
  int64_t max_over_budget = 0;      // rows_in_memory - budget rows - dirty rows
  uint64_t max_rows_in_stripe = 0;  // distinct keys one request had in one stripe
  uint64_t max_dirty = 0;
};

// 20k keys pushed and pulled in random orders and request sizes, with
// duplicates, under a budget of 1% of the rows, flushed now and then: every
// row leaves memory and comes back many times.
class TieredWorkload : public TieredTable {
 protected:
  static constexpr size_t kKeys = 20000;
  static constexpr uint64_t kBudgetRows = kKeys / 100;
  static constexpr size_t kMaxRequest = 400;

  std::vector<uint64_t> Keys() const { return DistinctKeys(kKeys, /*seed=*/11); }

  WorkloadResult Run(bool every_push, int rounds) {
    WorkloadResult result;
    Open(kBudgetRows, every_push);
    if (HasFatalFailure()) return result;
    std::mt19937_64 rng(every_push ? 5 : 6);
    std::unordered_set<uint64_t> dirty;  // keys pushed since the last flush
    std::vector<uint64_t> order = Keys();
    for (int round = 0; round < rounds; ++round) {
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t pos = 0; pos < order.size();) {
        const size_t n = std::min(order.size() - pos, 1 + rng() % kMaxRequest);
        std::vector<uint64_t> request(order.begin() + pos, order.begin() + pos + n);
        pos += n;
        std::array<uint64_t, kStripes> in_stripe{};
        for (uint64_t key : request) ++in_stripe[StripeOfKey(key)];
        result.max_rows_in_stripe = std::max(result.max_rows_in_stripe,
                                             *std::max_element(in_stripe.begin(), in_stripe.end()));
        for (size_t d = rng() % (n / 4 + 1); d > 0; --d) request.push_back(request[rng() % n]);
        std::shuffle(request.begin(), request.end(), rng);
        const uint64_t op = rng() % 10;
        if (op < 6) {
          std::vector<float> grads;
          for (size_t i = 0; i < request.size(); ++i) {
            const std::vector<float> g = RandomGrad(rng);
            grads.insert(grads.end(), g.begin(), g.end());
          }
          Status status = Push(request, grads);
          if (!status.ok()) {
            ADD_FAILURE() << "push: " << status;
            return result;
          }
          if (!every_push) dirty.insert(request.begin(), request.end());
        } else {
          ExpectWeights(request, absl::StrCat("round ", round));
          if (HasFatalFailure()) return result;
        }
        result.lookups += request.size();
        ++result.requests;
        result.max_dirty = std::max<uint64_t>(result.max_dirty, dirty.size());
        const int64_t over = static_cast<int64_t>(table_->stats().rows_in_memory) -
                             static_cast<int64_t>(kBudgetRows + dirty.size());
        result.max_over_budget = std::max(result.max_over_budget, over);
        if (op == 9) {
          Status status = Flush();
          if (!status.ok()) {
            ADD_FAILURE() << "flush: " << status;
            return result;
          }
          ++result.flushes;
          dirty.clear();
          // Every row is durable now, so the budget holds exactly.
          if (table_->stats().rows_in_memory > kBudgetRows) {
            ADD_FAILURE() << table_->stats().rows_in_memory << " rows in memory after a flush, "
                          << "budget " << kBudgetRows;
            return result;
          }
        }
      }
    }
    return result;
  }

  void ExpectAfterWorkload(const WorkloadResult& result) {
    // Between flushes, memory holds at most the budget, the dirty rows
    // (which cannot leave before they are written) and, in each stripe, the
    // rows of the last request there, which its eviction could not remove
    // (pending, or just used).
    EXPECT_LE(result.max_over_budget, static_cast<int64_t>(kStripes * result.max_rows_in_stripe));
    ASSERT_TRUE(Flush().ok());
    ExpectWeights(Keys(), "all keys at the end");
    const TableStats stats = table_->stats();
    RecordProperty("requests", static_cast<int>(result.requests));
    RecordProperty("evictions", static_cast<int>(stats.evictions));
    RecordProperty("max_rows_over_budget_and_dirty", static_cast<int>(result.max_over_budget));
    EXPECT_EQ(stats.hits + stats.misses, result.lookups + kKeys);
    EXPECT_GT(stats.misses, 0u);
    // Each row left memory several times over.
    EXPECT_GT(stats.evictions, 4 * kKeys);
    EXPECT_LE(stats.rows_in_memory, kBudgetRows);
  }
};

TEST_P(TieredWorkload, FlushMode) {
  const WorkloadResult result = Run(/*every_push=*/false, /*rounds=*/8);
  if (HasFatalFailure()) return;
  // Dirty rows went far past the budget between flushes.
  EXPECT_GT(result.max_dirty, 10 * kBudgetRows);
  RecordProperty("max_dirty", static_cast<int>(result.max_dirty));
  ExpectAfterWorkload(result);
}

TEST_P(TieredWorkload, EveryPush) {
  const WorkloadResult result = Run(/*every_push=*/true, /*rounds=*/8);
  if (HasFatalFailure()) return;
  ExpectAfterWorkload(result);
}

INSTANTIATE_TEST_SUITE_P(BackEnds, TieredWorkload,
                         ::testing::Values(BackEnd::kMemory, BackEnd::kRocks), BackEndName);

// ---------------------------------------------------------------------------
// Concurrency: four threads push to their own keys and to keys all of them
// share, under a budget of 1% of the rows, while (flush mode) another thread
// flushes; every weight ends exact.

void RunConcurrentPushes(BackEnd back_end, bool every_push) {
  constexpr int kThreads = 4;
  constexpr size_t kOwnKeys = 4000;
  constexpr size_t kSharedKeys = 2000;
  constexpr int kRounds = 5;
  const uint64_t bytes_per_row = SgdBytesPerRow();
  constexpr uint64_t kBudgetRows = (kThreads * kOwnKeys + kSharedKeys) / 100;

  TempDir temp;
  std::unique_ptr<KvStore> store =
      back_end == BackEnd::kMemory ? NewMemoryKvStore() : OpenRocks(temp.path() + "/db");
  WriteQueue queue(store.get());
  MemoryBudget budget(static_cast<int64_t>(kBudgetRows * bytes_per_row));
  TableStorage storage{.store = store.get(),
                       .queue = &queue,
                       .budget = &budget,
                       .write_every_push = every_push,
                       .durability_timeout = absl::Seconds(20)};
  auto created = Table::Create(SgdSpec(), /*seed=*/7, storage);
  ASSERT_TRUE(created.ok()) << created.status();
  Table& table = **created;

  const std::vector<uint64_t> all_keys = DistinctKeys(kThreads * kOwnKeys + kSharedKeys, 21);
  const std::vector<uint64_t> shared(all_keys.end() - kSharedKeys, all_keys.end());
  // expected[t][i]: what thread t added to all_keys[i].
  std::vector<std::vector<double>> expected(kThreads,
                                            std::vector<double>(all_keys.size() * kDim, 0.0));
  std::unordered_map<uint64_t, size_t> index;
  for (size_t i = 0; i < all_keys.size(); ++i) index[all_keys[i]] = i;
  std::atomic<uint64_t> lookups{0};
  std::atomic<bool> failed{false};

  std::atomic<bool> pushing{true};
  std::thread flusher([&] {
    while (pushing && !every_push) {
      const uint64_t seq = table.QueueDirtyRows();
      if (seq > 0) {
        Status status = queue.WaitDurable(seq, absl::Seconds(20));
        if (!status.ok()) {
          ADD_FAILURE() << "flush: " << status;
          failed = true;
          return;
        }
      }
      table.EvictToBudget();
      absl::SleepFor(absl::Milliseconds(2));  // pacing, not synchronisation
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<uint64_t> mine(all_keys.begin() + t * kOwnKeys,
                                 all_keys.begin() + (t + 1) * kOwnKeys);
      mine.insert(mine.end(), shared.begin(), shared.end());
      for (int round = 0; round < kRounds && !failed; ++round) {
        std::shuffle(mine.begin(), mine.end(), rng);
        for (size_t pos = 0; pos < mine.size() && !failed;) {
          const size_t n = std::min(mine.size() - pos, 1 + rng() % 300);
          std::vector<uint64_t> request(mine.begin() + pos, mine.begin() + pos + n);
          pos += n;
          for (size_t d = rng() % (n / 4 + 1); d > 0; --d) request.push_back(request[rng() % n]);
          std::vector<float> grads;
          for (size_t i = 0; i < request.size(); ++i) {
            const std::vector<float> g = RandomGrad(rng);
            grads.insert(grads.end(), g.begin(), g.end());
          }
          Status status = table.Push(request, grads);
          if (!status.ok()) {
            ADD_FAILURE() << "push: " << status;
            failed = true;
            return;
          }
          for (size_t i = 0; i < request.size(); ++i) {
            double* row = expected[t].data() + index.at(request[i]) * kDim;
            for (uint32_t d = 0; d < kDim; ++d) row[d] -= 0.5 * grads[i * kDim + d];
          }
          lookups += request.size();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  pushing = false;
  flusher.join();
  ASSERT_FALSE(failed);

  const uint64_t seq = table.QueueDirtyRows();
  if (seq > 0) {
    ASSERT_TRUE(queue.WaitDurable(seq, absl::Seconds(20)).ok());
  }
  table.EvictToBudget();
  EXPECT_LE(table.stats().rows_in_memory, kBudgetRows);
  std::vector<float> out(all_keys.size() * kDim);
  ASSERT_TRUE(table.Pull(all_keys, out).ok());
  int mismatches = 0;
  for (size_t i = 0; i < all_keys.size(); ++i) {
    for (uint32_t d = 0; d < kDim; ++d) {
      double want = 0;
      for (int t = 0; t < kThreads; ++t) want += expected[t][i * kDim + d];
      if (out[i * kDim + d] != want && ++mismatches <= 5) {
        ADD_FAILURE() << "key " << all_keys[i] << " dim " << d << " holds " << out[i * kDim + d]
                      << ", expected " << want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  const TableStats stats = table.stats();
  EXPECT_EQ(stats.hits + stats.misses, lookups + all_keys.size());
  EXPECT_GT(stats.misses, all_keys.size());
  EXPECT_GT(stats.evictions, all_keys.size());
}

TEST_P(TieredTable, ConcurrentPushesFlushMode) {
  RunConcurrentPushes(GetParam(), /*every_push=*/false);
}

TEST_P(TieredTable, ConcurrentPushesEveryPush) {
  RunConcurrentPushes(GetParam(), /*every_push=*/true);
}

// ---------------------------------------------------------------------------
// Contracts.

TEST(TieredTableStorage, BudgetWithoutStoreIsRejected) {
  MemoryBudget budget(1 << 20);
  TableStorage storage;
  storage.budget = &budget;
  auto table = Table::Create(SgdSpec(), 1, storage);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << table.status();
  EXPECT_NE(table.status().message().find("emb"), absl::string_view::npos) << table.status();

  // An unlimited budget needs no store.
  MemoryBudget unlimited(0);
  storage.budget = &unlimited;
  EXPECT_TRUE(Table::Create(SgdSpec(), 1, storage).ok());

  // A store needs a queue.
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  storage.store = store.get();
  table = Table::Create(SgdSpec(), 1, storage);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << table.status();
}

TEST(TieredTableStorage, EveryPushIsDurableWhenPushReturns) {
  TempDir temp;
  std::unique_ptr<KvStore> store = OpenRocks(temp.path() + "/db");
  WriteQueue queue(store.get());
  MemoryBudget budget(static_cast<int64_t>(8 * SgdBytesPerRow()));
  TableStorage storage{.store = store.get(),
                       .queue = &queue,
                       .budget = &budget,
                       .write_every_push = true,
                       .durability_timeout = absl::Seconds(20)};
  auto created = Table::Create(SgdSpec(), 1, storage);
  ASSERT_TRUE(created.ok()) << created.status();
  Table& table = **created;

  const std::vector<uint64_t> keys = DistinctKeys(64, 3);
  std::unordered_map<uint64_t, std::vector<double>> expected;
  std::mt19937_64 rng(9);
  for (int step = 0; step < 300; ++step) {
    std::vector<uint64_t> request;
    for (size_t n = 1 + rng() % 8; n > 0; --n) request.push_back(keys[rng() % keys.size()]);
    std::vector<float> grads;
    for (uint64_t key : request) {
      const std::vector<float> g = RandomGrad(rng);
      grads.insert(grads.end(), g.begin(), g.end());
      auto [it, inserted] = expected.try_emplace(key, std::vector<double>(kDim, 0.0));
      for (uint32_t d = 0; d < kDim; ++d) it->second[d] -= 0.5 * g[d];
    }
    ASSERT_TRUE(table.Push(request, grads).ok());
    // No flush: the store must already hold each pushed row's new image.
    std::vector<bool> found;
    const std::vector<std::vector<float>> rows = StoreRows(*store, request, &found);
    for (size_t i = 0; i < request.size(); ++i) {
      ASSERT_TRUE(found[i]) << "step " << step << ": key " << request[i] << " not in the store";
      for (uint32_t d = 0; d < kDim; ++d) {
        ASSERT_EQ(rows[i][d], expected[request[i]][d])
            << "step " << step << ": key " << request[i] << " dim " << d;
      }
    }
  }
  EXPECT_EQ(table.QueueDirtyRows(), 0u);  // nothing left dirty
  EXPECT_GT(table.stats().evictions, 0u);
}

TEST_P(TieredTable, DirtyRowsStayInMemoryUntilWritten) {
  constexpr uint64_t kBudgetRows = 100;
  Open(kBudgetRows, /*every_push=*/false);
  const std::vector<uint64_t> keys = DistinctKeys(5000, 4);
  std::mt19937_64 rng(4);
  for (size_t pos = 0; pos < keys.size(); pos += 100) {
    const std::vector<uint64_t> request(keys.begin() + pos, keys.begin() + pos + 100);
    std::vector<float> grads;
    for (size_t i = 0; i < request.size(); ++i) {
      const std::vector<float> g = RandomGrad(rng);
      grads.insert(grads.end(), g.begin(), g.end());
    }
    ASSERT_TRUE(Push(request, grads).ok());
  }
  // Far over the budget, yet nothing left memory: no row was written.
  EXPECT_EQ(table_->stats().rows_in_memory, keys.size());
  EXPECT_EQ(table_->stats().evictions, 0u);
  EXPECT_GT(budget_->used(), 10 * budget_->limit());
  EXPECT_EQ(table_->EvictToBudget(), 0u);
  std::vector<bool> found;
  StoreRows(*store_, keys, &found);
  EXPECT_EQ(std::count(found.begin(), found.end(), true), 0);
  ExpectWeights(keys, "dirty, in memory");

  // Once written, they leave memory down to the budget and come back exact.
  ASSERT_TRUE(Flush().ok());
  EXPECT_LE(table_->stats().rows_in_memory, kBudgetRows);
  EXPECT_GE(table_->stats().evictions, keys.size() - kBudgetRows);
  const std::vector<std::vector<float>> stored = StoreRows(*store_, keys, &found);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(found[i]) << keys[i];
    for (uint32_t d = 0; d < kDim; ++d) ASSERT_EQ(stored[i][d], expected_[keys[i]][d]) << keys[i];
  }
  const uint64_t misses = table_->stats().misses;
  ExpectWeights(keys, "read back");
  EXPECT_GE(table_->stats().misses - misses, keys.size() - kBudgetRows);
}

// A table made over an empty store knows every stored row, so it creates
// rows for new ids without asking the store; made over a store that holds
// rows (a restart), it asks about every id not in memory and finds them.
TEST_P(TieredTable, NewIdsAreLookedUpOnlyInAStoreThatHeldRows) {
  Open(/*budget_rows=*/0, /*every_push=*/false);
  const std::vector<uint64_t> keys = DistinctKeys(1000, 11);
  std::mt19937_64 rng(11);
  std::vector<float> grads;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> g = RandomGrad(rng);
    grads.insert(grads.end(), g.begin(), g.end());
  }
  ASSERT_TRUE(Push(keys, grads).ok());
  ExpectWeights(DistinctKeys(1000, 12), "never pushed");
  EXPECT_EQ(store_->reads, 0) << "a store that started empty was asked about new ids";
  ASSERT_TRUE(Flush().ok());
  if (GetParam() == BackEnd::kMemory) return;  // reopening starts an empty store

  Close();
  Open(/*budget_rows=*/0, /*every_push=*/false);
  ExpectWeights(keys, "after reopening");
  EXPECT_GT(store_->reads, 0);
}

TEST_P(TieredTable, PulledOnlyRowsAreNotWritten) {
  constexpr uint64_t kBudgetRows = 50;
  Open(kBudgetRows, /*every_push=*/false, proto::InitializerSpec::NORMAL);
  const std::vector<uint64_t> keys = DistinctKeys(2000, 5);
  std::vector<float> first(keys.size() * kDim);
  for (size_t pos = 0; pos < keys.size(); pos += 100) {
    ASSERT_TRUE(table_
                    ->Pull(std::span(keys).subspan(pos, 100),
                           std::span(first).subspan(pos * kDim, 100 * kDim))
                    .ok());
  }
  EXPECT_GT(table_->stats().evictions, 0u);
  EXPECT_LE(table_->stats().rows_in_memory, kBudgetRows + 100);
  EXPECT_EQ(table_->QueueDirtyRows(), 0u);
  EXPECT_EQ(queue_->rows_written(), 0u);
  EXPECT_EQ(store_->writes, 0);
  std::vector<bool> found;
  StoreRows(*store_, keys, &found);
  EXPECT_EQ(std::count(found.begin(), found.end(), true), 0);

  // Made again, identically, from (spec, seed, key).
  std::vector<float> again(keys.size() * kDim);
  ASSERT_TRUE(table_->Pull(keys, again).ok());
  EXPECT_EQ(first, again);
  for (size_t i = 0; i < keys.size(); i += 97) {
    std::vector<float> row(kDim);
    InitializeRow(SgdSpec(proto::InitializerSpec::NORMAL).initializer(), /*seed=*/7, kTableId,
                  keys[i], row.data(), kDim);
    EXPECT_EQ(std::vector<float>(first.begin() + i * kDim, first.begin() + (i + 1) * kDim), row);
  }
  EXPECT_NE(first, std::vector<float>(first.size(), 0.0f));
}

TEST_P(TieredTable, StoreReadErrorsReachPullAndPush) {
  Open(/*budget_rows=*/10, /*every_push=*/false);
  const std::vector<uint64_t> keys = DistinctKeys(500, 6);
  std::vector<float> grads(keys.size() * kDim, 1.0f);
  ASSERT_TRUE(Push(keys, grads).ok());
  ASSERT_TRUE(Flush().ok());
  ASSERT_LE(table_->stats().rows_in_memory, 10u);

  store_->fail_reads = true;
  std::vector<float> out(keys.size() * kDim);
  Status pulled = table_->Pull(keys, out);
  EXPECT_EQ(pulled.code(), absl::StatusCode::kUnavailable) << pulled;
  EXPECT_NE(pulled.message().find("injected read failure"), absl::string_view::npos) << pulled;
  EXPECT_NE(pulled.message().find("emb"), absl::string_view::npos) << pulled;
  Status pushed = table_->Push(keys, grads);  // not applied: nothing to apply it to
  EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable) << pushed;
  EXPECT_TRUE(queue_->status().ok()) << queue_->status();

  store_->fail_reads = false;
  ExpectWeights(keys, "after the failed reads");
}

TEST_P(TieredTable, StoreWriteErrorsReachPushAndQueue) {
  Open(/*budget_rows=*/10, /*every_push=*/true);
  const std::vector<uint64_t> keys = DistinctKeys(100, 7);
  std::vector<float> grads(keys.size() * kDim, 1.0f);
  ASSERT_TRUE(Push(keys, grads).ok());
  store_->fail_writes = true;
  Status pushed = table_->Push(keys, grads);
  EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable) << pushed;
  EXPECT_NE(pushed.message().find("injected write failure"), absl::string_view::npos) << pushed;
  EXPECT_EQ(queue_->status().code(), absl::StatusCode::kUnavailable) << queue_->status();
  // The queue stops writing: later pushes fail too, even once the store
  // works again.
  store_->fail_writes = false;
  pushed = table_->Push(keys, grads);
  EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable) << pushed;
}

TEST_P(TieredTable, StoreWriteErrorsReachFlushAndKeepRowsInMemory) {
  Open(/*budget_rows=*/10, /*every_push=*/false);
  const std::vector<uint64_t> keys = DistinctKeys(300, 8);
  std::vector<float> grads(keys.size() * kDim, 0.5f);
  ASSERT_TRUE(Push(keys, grads).ok());
  store_->fail_writes = true;
  Status flushed = Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_EQ(queue_->status().code(), absl::StatusCode::kUnavailable) << queue_->status();
  // Nothing was written, so nothing may leave memory.
  EXPECT_EQ(table_->EvictToBudget(), 0u);
  EXPECT_EQ(table_->stats().rows_in_memory, keys.size());
  ExpectWeights(keys, "after the failed write");
}

// A row written long ago stays evictable however many writes followed
// (sequence numbers kept per row must not wrap).
TEST_P(TieredTable, RowsStayEvictableAfterBillionsOfWrites) {
  Open(/*budget_rows=*/1, /*every_push=*/false);
  const std::vector<uint64_t> keys = DistinctKeys(2, 9);
  std::vector<float> grads(keys.size() * kDim, 1.0f);
  ASSERT_TRUE(Push(keys, grads).ok());
  const uint64_t seq = table_->QueueDirtyRows();
  ASSERT_GT(seq, 0u);
  ASSERT_TRUE(queue_->WaitDurable(seq, absl::Seconds(20)).ok());
  queue_->SkipSequenceNumbersForTesting((uint64_t{1} << 31) + 5);
  table_->EvictToBudget();
  EXPECT_LE(table_->stats().rows_in_memory, 1u);
  ExpectWeights(keys, "read back");
}

INSTANTIATE_TEST_SUITE_P(BackEnds, TieredTable,
                         ::testing::Values(BackEnd::kMemory, BackEnd::kRocks), BackEndName);

}  // namespace
}  // namespace eps
