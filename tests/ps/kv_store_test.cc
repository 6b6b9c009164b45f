#include "ps/kv_store.h"

#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

// A deterministic value of `bytes` bytes for (key, version): a reader can
// tell which write it sees, and a torn value does not check out.
std::string ValueFor(uint64_t key, uint64_t version, size_t bytes) {
  std::string value(bytes, '\0');
  uint64_t state = key * 0x9E3779B97F4A7C15ull + version * 0xBF58476D1CE4E5B9ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    state ^= state >> 29;
    state *= 0x94D049BB133111EBull;
    value[i] = static_cast<char>(state >> 56);
  }
  if (bytes >= 16) {
    std::memcpy(value.data(), &key, 8);
    std::memcpy(value.data() + 8, &version, 8);
  }
  return value;
}

uint64_t VersionOf(const char* value) {
  uint64_t version = 0;
  std::memcpy(&version, value + 8, 8);
  return version;
}

std::vector<KvWrite> WritesFor(uint32_t table, const std::vector<uint64_t>& keys,
                               const std::vector<std::string>& values) {
  std::vector<KvWrite> writes;
  for (size_t i = 0; i < keys.size(); ++i) writes.push_back({table, keys[i], values[i]});
  return writes;
}

// The result of a MultiGet: each key's value, or nullopt when missing.
struct Read {
  Status status;
  std::vector<std::optional<std::string>> values;
};

Read Get(KvStore& store, uint32_t table, const std::vector<uint64_t>& keys, size_t value_bytes) {
  std::vector<char> out(keys.size() * value_bytes, '\x5A');
  std::vector<bool> found(3, true);  // MultiGet must resize it
  Read read;
  read.status = store.MultiGet(table, keys, value_bytes, out, &found);
  if (!read.status.ok()) return read;
  EXPECT_EQ(found.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string bytes(out.data() + i * value_bytes, value_bytes);
    if (found[i]) {
      read.values.emplace_back(std::move(bytes));
    } else {
      EXPECT_EQ(bytes, std::string(value_bytes, '\x5A')) << "missing key " << keys[i];
      read.values.emplace_back(std::nullopt);
    }
  }
  return read;
}

using ::eps::testing::TempDir;

// A store with the smallest cache and memtables (1 MiB each), so that a
// few MiB of rows fill its memtables and flush.
RocksKvStoreOptions SmallStoreOptions(const std::string& dir) {
  RocksKvStoreOptions options;
  options.dir = dir;
  options.block_cache_mb = 1;
  options.write_buffer_mb = 1;
  return options;
}

std::unique_ptr<KvStore> OpenRocks(const std::string& dir) {
  RocksKvStoreOptions options;
  options.dir = dir;
  StatusOr<std::unique_ptr<KvStore>> store = OpenRocksKvStore(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// ---------------------------------------------------------------------------
// The conformance suite: every back end passes it.

struct BackEnd {
  std::string name;
  // Opens a store kept in `dir` (the fake ignores it).
  std::function<std::unique_ptr<KvStore>(const std::string& dir)> open;
};

class KvStoreConformance : public ::testing::TestWithParam<BackEnd> {
 protected:
  void SetUp() override {
    store_ = GetParam().open(temp_.path() + "/db");
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override { store_.reset(); }

  KvStore& store() { return *store_; }

  TempDir temp_;
  std::unique_ptr<KvStore> store_;
};

TEST_P(KvStoreConformance, CreateTableIsIdempotent) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store().Write(WritesFor(1, {5}, {ValueFor(5, 1, 8)}), /*sync=*/false).ok());
  ASSERT_TRUE(store().CreateTable(1).ok());
  Read read = Get(store(), 1, {5}, 8);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.values[0], ValueFor(5, 1, 8));
}

TEST_P(KvStoreConformance, MissingKeysAreNotFoundAndLeaveBytesUntouched) {
  ASSERT_TRUE(store().CreateTable(3).ok());
  Read read = Get(store(), 3, {0, 1, std::numeric_limits<uint64_t>::max()}, 12);
  ASSERT_TRUE(read.status.ok()) << read.status;
  for (const auto& value : read.values) EXPECT_FALSE(value.has_value());
}

TEST_P(KvStoreConformance, WrittenValuesReadBack) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  constexpr size_t kBytes = 24;
  std::vector<uint64_t> keys = {0, 1, 255, 256, 1ull << 40, std::numeric_limits<uint64_t>::max()};
  for (uint64_t key = 1000; key < 2000; key += 3) keys.push_back(key);
  std::vector<std::string> values;
  for (uint64_t key : keys) values.push_back(ValueFor(key, 7, kBytes));
  ASSERT_TRUE(store().Write(WritesFor(1, keys, values), /*sync=*/true).ok());

  // Unsorted, repeated, and mixed with missing keys.
  std::vector<uint64_t> request = {
      1999, 2, 0, 1000, 1000, std::numeric_limits<uint64_t>::max(), 1001, 1ull << 40, 256};
  Read read = Get(store(), 1, request, kBytes);
  ASSERT_TRUE(read.status.ok()) << read.status;
  for (size_t i = 0; i < request.size(); ++i) {
    const uint64_t key = request[i];
    const bool stored = key < 1000 || key >= 2000 ? key != 2 : (key - 1000) % 3 == 0;
    if (stored) {
      EXPECT_EQ(read.values[i], ValueFor(key, 7, kBytes)) << "key " << key;
    } else {
      EXPECT_FALSE(read.values[i].has_value()) << "key " << key;
    }
  }
}

TEST_P(KvStoreConformance, ScanVisitsEveryRowInKeyOrderFromOneSnapshot) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store().CreateTable(2).ok());
  const std::vector<uint64_t> keys = {std::numeric_limits<uint64_t>::max(), 256, 0, 1ull << 40, 255};
  std::vector<std::string> values;
  for (uint64_t key : keys) values.push_back(ValueFor(key, 3, 16));
  ASSERT_TRUE(store().Write(WritesFor(1, keys, values), /*sync=*/false).ok());
  ASSERT_TRUE(store().Write(WritesFor(2, {9}, {ValueFor(9, 3, 16)}), /*sync=*/false).ok());
  std::vector<uint64_t> seen;
  const Status scanned = store().Scan(1, [&](uint64_t key, absl::string_view value) {
    EXPECT_EQ(value, ValueFor(key, 3, 16)) << "key " << key;
    seen.push_back(key);
    if (seen.size() == 1) {
      // Written during the scan: not in its snapshot.
      EXPECT_TRUE(store().Write(WritesFor(1, {7}, {ValueFor(7, 3, 16)}), false).ok());
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(scanned.ok()) << scanned;
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 255, 256, 1ull << 40,
                                         std::numeric_limits<uint64_t>::max()}));
  // The first error of the visitor ends the scan and is returned.
  int visits = 0;
  const Status stopped = store().Scan(1, [&](uint64_t, absl::string_view) {
    ++visits;
    return absl::UnavailableError("disk full");
  });
  EXPECT_TRUE(absl::IsUnavailable(stopped));
  EXPECT_EQ(visits, 1);
  EXPECT_TRUE(absl::IsNotFound(
      store().Scan(5, [](uint64_t, absl::string_view) { return absl::OkStatus(); })));
}

TEST_P(KvStoreConformance, LaterWritesOfAKeyInOneBatchWin) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store()
                  .Write(WritesFor(1, {4, 9, 4, 4},
                                   {ValueFor(4, 1, 8), ValueFor(9, 1, 8), ValueFor(4, 2, 8),
                                    ValueFor(4, 3, 8)}),
                         /*sync=*/false)
                  .ok());
  Read read = Get(store(), 1, {4, 9}, 8);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.values[0], ValueFor(4, 3, 8));
  EXPECT_EQ(read.values[1], ValueFor(9, 1, 8));
}

TEST_P(KvStoreConformance, ErasesApplyInOrderWithPutsAndCompactKeepsTheRest) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store()
                  .Write(WritesFor(1, {4, 9, 12}, {ValueFor(4, 1, 8), ValueFor(9, 1, 8),
                                                    ValueFor(12, 1, 8)}),
                         /*sync=*/false)
                  .ok());
  // 4 erased, 9 erased then written again, 12 written then erased; 77 was
  // never there.
  std::vector<KvWrite> writes = {KvWrite{1, 4, {}, /*erase=*/true},
                                 KvWrite{1, 9, {}, /*erase=*/true},
                                 KvWrite{1, 12, {}, /*erase=*/false},
                                 KvWrite{1, 12, {}, /*erase=*/true},
                                 KvWrite{1, 77, {}, /*erase=*/true}};
  const std::string nine = ValueFor(9, 2, 8);
  writes.insert(writes.begin() + 2, KvWrite{1, 9, nine});
  const std::string twelve = ValueFor(12, 2, 8);
  writes[3].value = twelve;
  ASSERT_TRUE(store().Write(writes, /*sync=*/false).ok());
  ASSERT_TRUE(store().Compact(1).ok());
  Read read = Get(store(), 1, {4, 9, 12, 77}, 8);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_FALSE(read.values[0].has_value());
  EXPECT_EQ(read.values[1], nine);
  EXPECT_FALSE(read.values[2].has_value());
  EXPECT_FALSE(read.values[3].has_value());
  std::vector<uint64_t> scanned;
  ASSERT_TRUE(store()
                  .Scan(1, [&](uint64_t key, absl::string_view) {
                    scanned.push_back(key);
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(scanned, std::vector<uint64_t>{9});
  EXPECT_EQ(store().Compact(5).code(), absl::StatusCode::kNotFound);
}

TEST_P(KvStoreConformance, ABatchWithAnUnknownTableWritesNothing) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store().Write(WritesFor(1, {1}, {ValueFor(1, 1, 8)}), /*sync=*/false).ok());
  std::string v2 = ValueFor(1, 2, 8);
  std::string other = ValueFor(2, 1, 8);
  std::vector<KvWrite> writes = {{1, 1, v2}, {1, 2, other}, {42, 3, other}, {1, 4, other}};
  Status status = store().Write(writes, /*sync=*/false);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  Read read = Get(store(), 1, {1, 2, 4}, 8);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.values[0], ValueFor(1, 1, 8));
  EXPECT_FALSE(read.values[1].has_value());
  EXPECT_FALSE(read.values[2].has_value());
}

TEST_P(KvStoreConformance, TablesAreIndependent) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store().CreateTable(2).ok());
  ASSERT_TRUE(store().CreateTable(1000000).ok());
  std::string a = ValueFor(7, 1, 8);
  std::string b = ValueFor(7, 2, 32);
  std::vector<KvWrite> writes = {{1, 7, a}, {2, 7, b}, {1, 8, a}};
  ASSERT_TRUE(store().Write(writes, /*sync=*/false).ok());

  Read one = Get(store(), 1, {7, 8}, 8);
  ASSERT_TRUE(one.status.ok()) << one.status;
  EXPECT_EQ(one.values[0], a);
  EXPECT_EQ(one.values[1], a);
  Read two = Get(store(), 2, {7, 8}, 32);
  ASSERT_TRUE(two.status.ok()) << two.status;
  EXPECT_EQ(two.values[0], b);
  EXPECT_FALSE(two.values[1].has_value());
  Read big = Get(store(), 1000000, {7, 8}, 8);
  ASSERT_TRUE(big.status.ok()) << big.status;
  EXPECT_FALSE(big.values[0].has_value());
  EXPECT_FALSE(big.values[1].has_value());
  EXPECT_EQ(store().ApproximateRows(2), 1u);
}

TEST_P(KvStoreConformance, ValueSizeMismatchIsDataLoss) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  ASSERT_TRUE(store()
                  .Write(WritesFor(1, {1, 2}, {ValueFor(1, 1, 8), ValueFor(2, 1, 12)}),
                         /*sync=*/false)
                  .ok());
  EXPECT_EQ(Get(store(), 1, {1, 2}, 8).status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Get(store(), 1, {2}, 16).status.code(), absl::StatusCode::kDataLoss);
  Read read = Get(store(), 1, {2, 3}, 12);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.values[0], ValueFor(2, 1, 12));
}

TEST_P(KvStoreConformance, UnknownTableIsNotFound) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  EXPECT_EQ(Get(store(), 9, {1}, 8).status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().Write(WritesFor(9, {1}, {ValueFor(1, 1, 8)}), /*sync=*/false).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ApproximateRows(9), 0u);
}

TEST_P(KvStoreConformance, EmptyCallsSucceed) {
  ASSERT_TRUE(store().CreateTable(1).ok());
  EXPECT_TRUE(store().Write({}, /*sync=*/true).ok());
  Read read = Get(store(), 1, {}, 8);
  EXPECT_TRUE(read.status.ok()) << read.status;
  EXPECT_TRUE(read.values.empty());
}

// Two writers each rewrite their own group of keys, one version per batch;
// two readers read both groups. Every read of a group sees one version for
// all its keys (a batch is atomic and a MultiGet is one snapshot), versions
// never go back, and the final state holds each writer's last version.
TEST_P(KvStoreConformance, ConcurrentWritersAndReadersStayConsistent) {
  constexpr int kWriters = 2;
  constexpr int kReaders = 2;
  constexpr uint64_t kGroup = 64;
  constexpr uint64_t kVersions = 500;
  constexpr size_t kBytes = 32;
  ASSERT_TRUE(store().CreateTable(1).ok());
  auto group_keys = [&](int writer) {
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < kGroup; ++i) keys.push_back(i * kWriters + writer);
    return keys;
  };

  std::atomic<int> writers_left{kWriters};
  std::atomic<int> failures{0};
  // Every thread starts once all exist, so reads overlap writes.
  std::atomic<int> waiting{kWriters + kReaders};
  auto start_together = [&] {
    --waiting;
    while (waiting.load() > 0) std::this_thread::yield();
  };
  std::vector<std::thread> threads;
  for (int writer = 0; writer < kWriters; ++writer) {
    threads.emplace_back([&, writer] {
      const std::vector<uint64_t> keys = group_keys(writer);
      start_together();
      for (uint64_t version = 1; version <= kVersions; ++version) {
        std::vector<std::string> values;
        for (uint64_t key : keys) values.push_back(ValueFor(key, version, kBytes));
        if (!store().Write(WritesFor(1, keys, values), /*sync=*/version % 250 == 0).ok()) {
          ++failures;
        }
      }
      --writers_left;
    });
  }
  for (int reader = 0; reader < kReaders; ++reader) {
    threads.emplace_back([&] {
      std::vector<uint64_t> last(kWriters, 0);
      start_together();
      bool done = false;
      while (!done) {
        done = writers_left.load() == 0;  // one more full read after the end
        for (int writer = 0; writer < kWriters; ++writer) {
          const std::vector<uint64_t> keys = group_keys(writer);
          std::vector<char> out(keys.size() * kBytes);
          std::vector<bool> found;
          if (!store().MultiGet(1, keys, kBytes, out, &found).ok()) {
            ++failures;
            continue;
          }
          const uint64_t version = found[0] ? VersionOf(out.data()) : 0;
          for (size_t i = 0; i < keys.size(); ++i) {
            const char* value = out.data() + i * kBytes;
            const bool consistent =
                found[i] == (version != 0) &&
                (!found[i] || std::string(value, kBytes) == ValueFor(keys[i], version, kBytes));
            if (!consistent) ++failures;
          }
          if (version < last[writer]) ++failures;
          last[writer] = version;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);

  for (int writer = 0; writer < kWriters; ++writer) {
    const std::vector<uint64_t> keys = group_keys(writer);
    Read read = Get(store(), 1, keys, kBytes);
    ASSERT_TRUE(read.status.ok()) << read.status;
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(read.values[i], ValueFor(keys[i], kVersions, kBytes)) << "key " << keys[i];
    }
  }
}

TEST_P(KvStoreConformance, LargeBatches) {
  constexpr uint64_t kRows = 100000;
  constexpr size_t kBytes = 16;
  ASSERT_TRUE(store().CreateTable(1).ok());
  std::vector<std::string> values;
  std::vector<KvWrite> writes;
  values.reserve(kRows);
  for (uint64_t i = 0; i < kRows; ++i) values.push_back(ValueFor(i * 7919, 1, kBytes));
  for (uint64_t i = 0; i < kRows; ++i) writes.push_back({1, i * 7919, values[i]});
  ASSERT_TRUE(store().Write(writes, /*sync=*/true).ok());

  // Every stored key, in reverse, with a missing key after each.
  std::vector<uint64_t> keys;
  for (uint64_t i = kRows; i-- > 0;) {
    keys.push_back(i * 7919);
    keys.push_back(i * 7919 + 1);
  }
  std::vector<char> out(keys.size() * kBytes, '\x5A');
  std::vector<bool> found;
  ASSERT_TRUE(store().MultiGet(1, keys, kBytes, out, &found).ok());
  ASSERT_EQ(found.size(), keys.size());
  uint64_t mismatches = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const std::string bytes(out.data() + j * kBytes, kBytes);
    const bool ok = j % 2 == 0 ? found[j] && bytes == values[keys[j] / 7919]
                               : !found[j] && bytes == std::string(kBytes, '\x5A');
    if (!ok) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u);
  const uint64_t rows = store().ApproximateRows(1);
  EXPECT_GE(rows, kRows * 9 / 10);
  EXPECT_LE(rows, kRows * 11 / 10);
}

INSTANTIATE_TEST_SUITE_P(
    BackEnds, KvStoreConformance,
    ::testing::Values(BackEnd{"Memory", [](const std::string&) { return NewMemoryKvStore(); }},
                      BackEnd{"Rocks", OpenRocks}),
    [](const ::testing::TestParamInfo<BackEnd>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// The fake alone.

TEST(MemoryKvStore, CannotCheckpoint) {
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  EXPECT_EQ(store->Checkpoint(::testing::TempDir() + "/never").code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(store->ApproximateDiskBytes(), 0u);
  EXPECT_EQ(store->ApproximateMemoryBytes(), 0u);
}

// ---------------------------------------------------------------------------
// RocksDB alone: durability, checkpoints, locking, sizes.

class RocksKvStoreTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return temp_.path() + "/" + name; }

  // Writes `rows` keys 0, 3, 6, ... of `table` at `version`.
  static void Fill(KvStore& store, uint32_t table, uint64_t rows, uint64_t version,
                   size_t bytes = 16) {
    std::vector<uint64_t> keys;
    std::vector<std::string> values;
    for (uint64_t i = 0; i < rows; ++i) {
      keys.push_back(3 * i);
      values.push_back(ValueFor(3 * i, version, bytes));
    }
    ASSERT_TRUE(store.Write(WritesFor(table, keys, values), /*sync=*/false).ok());
  }

  // Expects exactly `Fill(table, rows, version)`'s keys, at that version.
  static void ExpectFilled(KvStore& store, uint32_t table, uint64_t rows, uint64_t version,
                           size_t bytes = 16) {
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < rows + 10; ++i) keys.push_back(3 * i);
    keys.push_back(1);
    Read read = Get(store, table, keys, bytes);
    ASSERT_TRUE(read.status.ok()) << read.status;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] % 3 == 0 && keys[i] / 3 < rows) {
        EXPECT_EQ(read.values[i], ValueFor(keys[i], version, bytes)) << "key " << keys[i];
      } else {
        EXPECT_FALSE(read.values[i].has_value()) << "key " << keys[i];
      }
    }
  }

  TempDir temp_;
};

TEST_F(RocksKvStoreTest, ReopenKeepsDataAndTables) {
  {
    std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateTable(1).ok());
    ASSERT_TRUE(store->CreateTable(7).ok());
    ASSERT_TRUE(store->CreateTable(8).ok());
    Fill(*store, 1, 500, 1);
    Fill(*store, 7, 20, 2, 40);
  }
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  ExpectFilled(*store, 1, 500, 1);
  ExpectFilled(*store, 7, 20, 2, 40);
  ExpectFilled(*store, 8, 0, 0);
  EXPECT_EQ(Get(*store, 2, {1}, 16).status.code(), absl::StatusCode::kNotFound);
  // Still writable, and CreateTable of a reopened family stays a no-op.
  ASSERT_TRUE(store->CreateTable(7).ok());
  Fill(*store, 7, 30, 3, 40);
  ExpectFilled(*store, 7, 30, 3, 40);
}

TEST_F(RocksKvStoreTest, CheckpointRestoresIntoAnotherDir) {
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateTable(1).ok());
  ASSERT_TRUE(store->CreateTable(2).ok());
  Fill(*store, 1, 1000, 1);
  Fill(*store, 2, 10, 1, 8);
  ASSERT_TRUE(store->Checkpoint(Path("checkpoint")).ok());
  // Later writes reach neither the checkpoint nor its restored copies.
  Fill(*store, 1, 2000, 2);
  ASSERT_TRUE(store->CreateTable(3).ok());

  ASSERT_TRUE(RestoreRocksCheckpoint(Path("checkpoint"), Path("restored")).ok());
  {
    std::unique_ptr<KvStore> restored = OpenRocks(Path("restored"));
    ASSERT_NE(restored, nullptr);
    ExpectFilled(*restored, 1, 1000, 1);
    ExpectFilled(*restored, 2, 10, 1, 8);
    EXPECT_EQ(Get(*restored, 3, {1}, 16).status.code(), absl::StatusCode::kNotFound);
    // Writing to the restored copy and flushing it (a checkpoint flushes)
    // leaves the checkpoint as it was: the restore below checks.
    Fill(*restored, 1, 1500, 5);
    ASSERT_TRUE(restored->Checkpoint(Path("later")).ok());
  }

  // Restoring over an existing database (the original, closed) replaces it.
  store.reset();
  ASSERT_TRUE(RestoreRocksCheckpoint(Path("checkpoint"), Path("db")).ok());
  store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  ExpectFilled(*store, 1, 1000, 1);
  ExpectFilled(*store, 2, 10, 1, 8);
  EXPECT_EQ(Get(*store, 3, {1}, 16).status.code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(Path("db.restore")));
}

TEST_F(RocksKvStoreTest, CheckpointIntoAnExistingDirIsAlreadyExists) {
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  std::filesystem::create_directory(Path("taken"));
  EXPECT_EQ(store->Checkpoint(Path("taken")).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store->Checkpoint(Path("fresh")).ok());
  EXPECT_EQ(store->Checkpoint(Path("fresh")).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Checkpoint(Path("no/parent")).code(), absl::StatusCode::kNotFound);
}

TEST_F(RocksKvStoreTest, OpenOfALockedDirIsUnavailable) {
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  RocksKvStoreOptions options;
  options.dir = Path("db");
  StatusOr<std::unique_ptr<KvStore>> second = OpenRocksKvStore(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(Path("db")), absl::string_view::npos) << second.status();
}

TEST_F(RocksKvStoreTest, BadOptionsAreInvalidArgument) {
  RocksKvStoreOptions options;
  EXPECT_EQ(OpenRocksKvStore(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.dir = Path("db");
  options.block_cache_mb = 0;
  EXPECT_EQ(OpenRocksKvStore(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RocksKvStoreTest, RestoreRejectsWhatIsNotACheckpoint) {
  EXPECT_EQ(RestoreRocksCheckpoint(Path("missing"), Path("db")).code(),
            absl::StatusCode::kNotFound);
  std::filesystem::create_directory(Path("empty"));
  EXPECT_EQ(RestoreRocksCheckpoint(Path("empty"), Path("db")).code(), absl::StatusCode::kDataLoss);
  {
    std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Checkpoint(Path("db/checkpoints")).ok());
  }
  // Replacing `db` would delete the checkpoint inside it.
  EXPECT_EQ(RestoreRocksCheckpoint(Path("db/checkpoints"), Path("db")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::exists(Path("db/checkpoints/CURRENT")));
}

TEST_F(RocksKvStoreTest, SizesGrowWithWrites) {
  constexpr uint64_t kRows = 20000;
  constexpr size_t kBytes = 64;
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateTable(1).ok());
  EXPECT_EQ(store->ApproximateRows(1), 0u);
  const uint64_t empty_bytes = store->ApproximateDiskBytes();

  Fill(*store, 1, kRows, 1, kBytes);
  const uint64_t unflushed_rows = store->ApproximateRows(1);
  EXPECT_GE(unflushed_rows, kRows * 9 / 10);
  EXPECT_LE(unflushed_rows, kRows * 11 / 10);

  // A checkpoint flushes the memtables into SSTs.
  ASSERT_TRUE(store->Checkpoint(Path("checkpoint")).ok());
  const uint64_t rows = store->ApproximateRows(1);
  EXPECT_GE(rows, kRows * 9 / 10);
  EXPECT_LE(rows, kRows * 11 / 10);
  const uint64_t bytes = store->ApproximateDiskBytes();
  const uint64_t raw = kRows * (8 + kBytes);
  EXPECT_GT(bytes, empty_bytes);
  EXPECT_GE(bytes, raw / 2) << "raw " << raw;
  EXPECT_LE(bytes, raw * 3) << "raw " << raw;
}

// Erased rows leave the disk once the table is compacted.
TEST_F(RocksKvStoreTest, CompactionGivesBackTheSpaceOfErasedRows) {
  constexpr uint64_t kRows = 20000;
  constexpr size_t kBytes = 64;
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateTable(1).ok());
  Fill(*store, 1, kRows, 1, kBytes);
  ASSERT_TRUE(store->Compact(1).ok());
  const uint64_t full = store->ApproximateDiskBytes();
  ASSERT_GE(full, kRows * (8 + kBytes) / 2);
  // Erase 3 rows in 4.
  std::vector<KvWrite> erases;
  for (uint64_t i = 0; i < kRows; ++i) {
    if (i % 4 != 0) erases.push_back(KvWrite{1, 3 * i, {}, /*erase=*/true});
  }
  ASSERT_TRUE(store->Write(erases, /*sync=*/false).ok());
  ASSERT_TRUE(store->Compact(1).ok());
  const uint64_t after = store->ApproximateDiskBytes();
  EXPECT_LT(after, full / 2) << "before " << full;
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < kRows; i += 997) keys.push_back(3 * i);
  Read read = Get(*store, 1, keys, kBytes);
  ASSERT_TRUE(read.status.ok()) << read.status;
  for (size_t k = 0; k < keys.size(); ++k) {
    const uint64_t i = keys[k] / 3;
    if (i % 4 == 0) {
      EXPECT_EQ(read.values[k], ValueFor(keys[k], 1, kBytes));
    } else {
      EXPECT_FALSE(read.values[k].has_value()) << "key " << keys[k];
    }
  }
}

// The store's own memory: memtables while rows are unflushed, then the
// block cache as reads fill it, never more than the two bounds allow.
TEST_F(RocksKvStoreTest, MemoryIsTheCacheAndMemtablesWithinTheirBounds) {
  constexpr uint64_t kRows = 40000;
  constexpr size_t kBytes = 64;
  const RocksKvStoreOptions options = SmallStoreOptions(Path("db"));
  StatusOr<std::unique_ptr<KvStore>> opened = OpenRocksKvStore(options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  KvStore& store = **opened;
  ASSERT_TRUE(store.CreateTable(1).ok());
  const uint64_t empty = store.ApproximateMemoryBytes();
  // Two tables' memtables (two each) and the cache, with 1 MiB of slack for
  // table readers and the cache's own bookkeeping.
  const uint64_t bound = (1 + 2 * 2 + 1) << 20;

  Fill(store, 1, kRows / 100, 1, kBytes);
  const uint64_t unflushed = store.ApproximateMemoryBytes();
  EXPECT_GT(unflushed, empty + kRows / 100 * kBytes);

  Fill(store, 1, kRows, 1, kBytes);  // 2.8 MB: memtables fill and flush
  ASSERT_TRUE(store.Checkpoint(Path("checkpoint")).ok());
  const uint64_t flushed = store.ApproximateMemoryBytes();
  EXPECT_LE(flushed, bound);
  // Reading every row back fills the block cache up to its capacity.
  ExpectFilled(store, 1, kRows, 1, kBytes);
  const uint64_t read = store.ApproximateMemoryBytes();
  EXPECT_GT(read, flushed + (512 << 10)) << "flushed " << flushed;
  EXPECT_LE(read, bound);
}

// A full disk: the write that finds no space fails (kUnavailable, "No space
// left on device"), and so does everything after it that would write,
// checkpoints included, without aborting the process. (RocksDB's own info
// logger, which the store replaced, aborts at its next line once a write to
// DIR/LOG failed, Debian's RocksDB being built with assertions: the liveness
// test's server died so, SIGABRT, and the job waited for it.) Every write
// acknowledged before the failure is there when the store is reopened with
// space again.
TEST_F(RocksKvStoreTest, AFullDiskFailsEveryLaterWriteWithoutAbortingAndLosesNothingAcknowledged) {
  testing::SmallDisk disk(Path("small"), 24);
  if (!disk.error().empty()) GTEST_SKIP() << "no full-disk test: " << disk.error();
  constexpr size_t kBytes = 256;
  constexpr uint64_t kBatch = 512;
  const RocksKvStoreOptions options = SmallStoreOptions(Path("small/db"));
  uint64_t acknowledged = 0;  // keys 0 .. acknowledged - 1, at version 1
  std::string filler;
  {
    StatusOr<std::unique_ptr<KvStore>> opened = OpenRocksKvStore(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    KvStore& store = **opened;
    ASSERT_TRUE(store.CreateTable(1).ok());
    filler = disk.Fill(/*spare=*/1 << 20);
    Status failed;
    // 1 MiB of spare space takes a few batches of 128 KiB, and far fewer
    // than this.
    for (int batch = 0; batch < 1000 && failed.ok(); ++batch) {
      std::vector<uint64_t> keys;
      std::vector<std::string> values;
      for (uint64_t key = acknowledged; key < acknowledged + kBatch; ++key) {
        keys.push_back(key);
        values.push_back(ValueFor(key, 1, kBytes));
      }
      failed = store.Write(WritesFor(1, keys, values), /*sync=*/true);
      if (failed.ok()) acknowledged += kBatch;
    }
    ASSERT_FALSE(failed.ok()) << "the disk never filled";
    EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
    EXPECT_NE(failed.message().find("No space left on device"), std::string::npos) << failed;
    ASSERT_GT(acknowledged, 0u);

    // Everything that writes fails alike, however often, and reads go on.
    // KvWrite holds a view: the value must outlive the writes.
    const std::string value = ValueFor(acknowledged, 1, kBytes);
    const std::vector<KvWrite> one = {{1, acknowledged, value}};
    for (int i = 0; i < 3; ++i) {
      const Status write = store.Write(one, /*sync=*/true);
      EXPECT_EQ(write.code(), absl::StatusCode::kUnavailable) << write;
      EXPECT_NE(write.message().find("No space left on device"), std::string::npos) << write;
      const Status checkpoint = store.Checkpoint(Path(absl::StrCat("checkpoint-", i)));
      EXPECT_EQ(checkpoint.code(), absl::StatusCode::kUnavailable) << checkpoint;
      EXPECT_NE(checkpoint.message().find("No space left on device"), std::string::npos)
          << checkpoint;
    }
    Read read = Get(store, 1, {0, acknowledged - 1}, kBytes);
    ASSERT_TRUE(read.status.ok()) << read.status;
    EXPECT_EQ(read.values[1], ValueFor(acknowledged - 1, 1, kBytes));

    // Space again: a store that failed stays failed (its server restarts,
    // and the reopened store replays its WAL).
    std::filesystem::remove(filler);
    EXPECT_EQ(store.Write(one, /*sync=*/true).code(), absl::StatusCode::kUnavailable);
  }
  StatusOr<std::unique_ptr<KvStore>> reopened = OpenRocksKvStore(options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::vector<uint64_t> keys;
  for (uint64_t key = 0; key < acknowledged; ++key) keys.push_back(key);
  Read read = Get(**reopened, 1, keys, kBytes);
  ASSERT_TRUE(read.status.ok()) << read.status;
  for (uint64_t key = 0; key < acknowledged; ++key) {
    ASSERT_EQ(read.values[key], ValueFor(key, 1, kBytes)) << "acknowledged key " << key;
  }
  const std::string value = ValueFor(0, 2, kBytes);
  const std::vector<KvWrite> again = {{1, 0, value}};
  EXPECT_TRUE((**reopened).Write(again, /*sync=*/true).ok()) << "writable again";
}

}  // namespace
}  // namespace eps
