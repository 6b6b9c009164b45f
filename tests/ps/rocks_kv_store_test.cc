// Tests of ps/kv_store.h's RocksDB store alone: durability, checkpoints,
// locking, sizes, memory bounds and a full disk (the conformance suite every
// back end passes: kv_store_test.cc).

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
#include "cluster/placement.h"
#include "gtest/gtest.h"
#include "tests/ps/kv_store_testing.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::TempDir;

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

TEST_F(RocksKvStoreTest, ReopenKeepsEachTablesLayout) {
  {
    std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateTable(1).ok());      // as stores made before the layout
    ASSERT_TRUE(store->CreateTable(2, 16).ok());  // grouped by 16 partitions
    Fill(*store, 1, 300, 1);
    Fill(*store, 2, 300, 1);
  }
  std::unique_ptr<KvStore> store = OpenRocks(Path("db"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Partitions(1), 0u);
  EXPECT_EQ(store->Partitions(2), 16u);
  // A job asking for partitions keeps the old table as it is, readable.
  ASSERT_TRUE(store->CreateTable(1, 16).ok());
  EXPECT_EQ(store->Partitions(1), 0u);
  ExpectFilled(*store, 1, 300, 1);
  ExpectFilled(*store, 2, 300, 1);
  uint64_t rows = 0;
  for (uint32_t p = 0; p < 16; ++p) {
    ASSERT_TRUE(store
                    ->ScanPartition(2, p, 0,
                                    [&](uint64_t key, absl::string_view) {
                                      EXPECT_EQ(PartitionOf(key, 16), p) << "key " << key;
                                      ++rows;
                                      return absl::OkStatus();
                                    })
                    .ok());
  }
  EXPECT_EQ(rows, 300u);
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
