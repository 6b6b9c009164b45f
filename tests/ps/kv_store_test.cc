// Tests of ps/kv_store.h: the conformance suite every back end (the
// in-memory fake and RocksDB) passes, and the fake alone (RocksDB alone:
// rocks_kv_store_test.cc).

#include "ps/kv_store.h"

#include <stdlib.h>

#include <algorithm>
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
#include <utility>
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

  // From a key: that key and those after it (a page read resuming).
  const auto keys_from = [&](uint64_t from) {
    std::vector<uint64_t> keys_seen;
    EXPECT_TRUE(store()
                    .ScanFrom(1, from,
                              [&](uint64_t key, absl::string_view) {
                                keys_seen.push_back(key);
                                return absl::OkStatus();
                              })
                    .ok());
    return keys_seen;
  };
  EXPECT_EQ(keys_from(256),
            (std::vector<uint64_t>{256, 1ull << 40, std::numeric_limits<uint64_t>::max()}));
  EXPECT_EQ(keys_from(257),
            (std::vector<uint64_t>{1ull << 40, std::numeric_limits<uint64_t>::max()}));
}

TEST_P(KvStoreConformance, ATableGroupedByPartitionReadsOnePartitionInKeyOrder) {
  constexpr uint32_t kPartitions = 4;
  ASSERT_TRUE(store().CreateTable(1, kPartitions).ok());
  EXPECT_EQ(store().Partitions(1), kPartitions);
  std::vector<uint64_t> keys;
  std::vector<std::string> values;
  for (uint64_t i = 0; i < 200; ++i) {
    keys.push_back(i * 0x9e3779b97f4a7c15ULL);  // spread over the key space
    values.push_back(ValueFor(keys.back(), 2, 12));
  }
  ASSERT_TRUE(store().Write(WritesFor(1, keys, values), /*sync=*/false).ok());
  const auto scan_partition = [&](uint32_t p, uint64_t from) {
    std::vector<uint64_t> seen;
    const Status scanned =
        store().ScanPartition(1, p, from, [&](uint64_t key, absl::string_view value) {
          EXPECT_EQ(value, ValueFor(key, 2, 12)) << "key " << key;
          seen.push_back(key);
          return absl::OkStatus();
        });
    EXPECT_TRUE(scanned.ok()) << scanned;
    return seen;
  };
  size_t total = 0;
  for (uint32_t p = 0; p < kPartitions; ++p) {
    std::vector<uint64_t> want;
    for (uint64_t key : keys) {
      if (PartitionOf(key, kPartitions) == p) want.push_back(key);
    }
    std::sort(want.begin(), want.end());
    ASSERT_GT(want.size(), 10u) << "partition " << p;
    EXPECT_EQ(scan_partition(p, 0), want) << "partition " << p;
    // From a key of the partition on: a page resuming.
    EXPECT_EQ(scan_partition(p, want[5]), std::vector<uint64_t>(want.begin() + 5, want.end()));
    total += want.size();
  }
  EXPECT_EQ(total, keys.size());
  // A scan of the whole table sees every row, partition after partition.
  std::vector<std::pair<uint32_t, uint64_t>> order;
  ASSERT_TRUE(store()
                  .Scan(1,
                        [&](uint64_t key, absl::string_view) {
                          order.emplace_back(PartitionOf(key, kPartitions), key);
                          return absl::OkStatus();
                        })
                  .ok());
  EXPECT_EQ(order.size(), keys.size());
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  const auto nothing = [](uint64_t, absl::string_view) { return absl::OkStatus(); };
  EXPECT_TRUE(absl::IsInvalidArgument(store().ScanFrom(1, 5, nothing)));
  EXPECT_TRUE(absl::IsInvalidArgument(store().ScanPartition(1, kPartitions, 0, nothing)));
  // Point reads and erases find their keys under the layout.
  const std::vector<KvWrite> erase = {
      KvWrite{.table = 1, .key = keys[3], .value = {}, .erase = true}};
  ASSERT_TRUE(store().Write(erase, /*sync=*/false).ok());
  Read read = Get(store(), 1, {keys[2], keys[3]}, 12);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.values[0], ValueFor(keys[2], 2, 12));
  EXPECT_FALSE(read.values[1].has_value());

  // Of two writes of a key in one batch, across partitions, the later wins.
  ASSERT_TRUE(store()
                  .Write(WritesFor(1, {keys[7], keys[8], keys[7]},
                                   {ValueFor(keys[7], 5, 12), ValueFor(keys[8], 5, 12),
                                    ValueFor(keys[7], 6, 12)}),
                         /*sync=*/false)
                  .ok());
  read = Get(store(), 1, {keys[7], keys[8]}, 12);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.values[0], ValueFor(keys[7], 6, 12));
  EXPECT_EQ(read.values[1], ValueFor(keys[8], 5, 12));

  // A table keeps the layout it was made with: the same partitions are a
  // no-op, others are refused; a table in key order stays so.
  EXPECT_TRUE(store().CreateTable(1, kPartitions).ok());
  EXPECT_TRUE(store().CreateTable(1).ok());  // a journal's replay names no layout
  EXPECT_EQ(store().Partitions(1), kPartitions);
  EXPECT_TRUE(absl::IsFailedPrecondition(store().CreateTable(1, 8)));
  ASSERT_TRUE(store().CreateTable(2).ok());
  EXPECT_TRUE(store().CreateTable(2, kPartitions).ok());
  EXPECT_EQ(store().Partitions(2), 0u);
  EXPECT_TRUE(absl::IsFailedPrecondition(store().ScanPartition(2, 0, 0, nothing)));
  EXPECT_EQ(store().Partitions(9), 0u);
  EXPECT_TRUE(absl::IsNotFound(store().ScanPartition(9, 0, 0, nothing)));
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

}  // namespace
}  // namespace eps
