// Tests of ps/storage.h: ServerStorage without and with a data dir,
// reopening, export, import, expiry, admission, the flusher and option
// validation (checkpoints: storage_checkpoint_test.cc).
//
// Updates are SGD with learning rate 0.5 on zero-initialised rows and
// gradients that are powers of two, so every expected weight is exact.

#include "ps/storage.h"

#include <stdlib.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "core/npy.h"
#include "nlohmann/json.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ps/storage_testing.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::TempDir;
using ::testing::HasSubstr;

TEST(ServerStorage, MemoryOnlyWorksAndCannotCheckpoint) {
  std::unique_ptr<ServerStorage> storage = MustOpen(StorageOptions{});
  ASSERT_NE(storage, nullptr);
  EXPECT_EQ(storage->num_tables(), 2u);
  EXPECT_EQ(storage->table(2), nullptr);
  const std::vector<uint64_t> keys = Keys(1, 500);
  PushAll(*storage, 0, keys, 2.0f);
  PushAll(*storage, 1, keys, -4.0f);
  ExpectAll(*storage, 0, keys, -1.0f, "memory only");
  ExpectAll(*storage, 1, keys, 2.0f, "memory only");
  EXPECT_TRUE(storage->Flush().ok());
  StatusOr<CheckpointInfo> checkpoint = storage->Checkpoint(1);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kFailedPrecondition)
      << checkpoint.status();
  const StorageStats stats = storage->stats();
  EXPECT_EQ(stats.rows_in_memory, 2 * keys.size());
  EXPECT_EQ(stats.rows_on_disk, 0u);
  EXPECT_EQ(stats.disk_bytes, 0u);
  EXPECT_EQ(stats.store_memory_bytes, 0u);
  EXPECT_EQ(stats.evictions, 0u);
}

TEST(ServerStorage, ValidatesOptions) {
  auto expect_invalid = [](const StorageOptions& options, const std::string& needle) {
    EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(options.Validate().message().find(needle), absl::string_view::npos)
        << options.Validate();
    EXPECT_EQ(ServerStorage::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
  };
  StorageOptions options;
  options.memory_budget_mb = 16;  // no data dir to evict rows to
  expect_invalid(options, "memory_budget_mb");
  options = StorageOptions{};
  options.memory_budget_mb = -1;
  expect_invalid(options, "memory_budget_mb");
  options = StorageOptions{};
  options.data_dir = "/nonexistent-but-unused";
  options.keep_checkpoints = 0;
  expect_invalid(options, "checkpoint.keep");
  options = StorageOptions{};
  options.flush_interval = absl::ZeroDuration();
  expect_invalid(options, "flush_interval");
  options = StorageOptions{};
  options.restore_checkpoint = "3";  // no data dir to restore into
  expect_invalid(options, "checkpoint.restore");
  EXPECT_TRUE(StorageOptions{}.Validate().ok());
}

TEST(ServerStorage, RejectsTableIdsOutOfOrder) {
  StatusOr<std::unique_ptr<ServerStorage>> storage = ServerStorage::Open(StorageOptions{});
  ASSERT_TRUE(storage.ok()) << storage.status();
  proto::JobSpec job = TwoTables();
  job.mutable_tables(1)->set_id(5);
  EXPECT_EQ((*storage)->CreateTables(job).code(), absl::StatusCode::kInvalidArgument);
}

// Rows written by a server that shut down gracefully are there when the
// next one opens the same data dir: the destructor flushes.
void ExpectRowsSurviveReopen(StorageOptions options) {
  TempDir temp;
  options.data_dir = temp.path() + "/data";
  // So that the flusher writes only when over the budget, and the last
  // pushes reach the store through the destructor's flush.
  options.flush_interval = absl::Hours(1);
  const std::vector<uint64_t> keys = Keys(10, 60000);  // 2.9 MB of dim-4 rows
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    PushAll(*storage, 0, keys, 1.0f);
    if (options.memory_budget_mb > 0) {
      // Within the budget once flushed.
      const uint64_t budget_rows = (static_cast<uint64_t>(options.memory_budget_mb) << 20) /
                                   storage->table(0)->bytes_per_row();
      ASSERT_TRUE(storage->Flush().ok());
      EXPECT_LE(storage->stats().rows_in_memory, budget_rows);
    }
    PushAll(*storage, 0, keys, 2.0f);
    PushAll(*storage, 1, Keys(3, 100), 8.0f);
    ExpectAll(*storage, 0, keys, -1.5f, "before closing");
  }
  EXPECT_TRUE(std::filesystem::exists(options.data_dir + "/db/CURRENT"));
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  ExpectAll(*storage, 0, keys, -1.5f, "reopened");
  ExpectAll(*storage, 1, Keys(3, 100), -4.0f, "reopened");
  ExpectAll(*storage, 1, Keys(5, 100), 0.0f, "never pushed");
  const StorageStats stats = storage->stats();
  EXPECT_EQ(stats.misses, keys.size() + 200);  // every row came from the store (or is new)
  EXPECT_GT(stats.rows_on_disk, 0u);
  EXPECT_GT(stats.disk_bytes, 0u);
  EXPECT_GT(stats.store_memory_bytes, 0u);  // the reads went through the block cache
  if (options.memory_budget_mb > 0) {
    EXPECT_GT(stats.evictions, 0u);
    EXPECT_LE(stats.rows_in_memory * storage->table(0)->bytes_per_row(),
              static_cast<uint64_t>(options.memory_budget_mb) << 20);
  }
}

TEST(ServerStorage, RowsSurviveGracefulReopen) { ExpectRowsSurviveReopen(StorageOptions{}); }

TEST(ServerStorage, RowsSurviveGracefulReopenOverBudget) {
  StorageOptions options;
  options.memory_budget_mb = 1;
  ExpectRowsSurviveReopen(options);
}

TEST(ServerStorage, RowsSurviveGracefulReopenEveryPush) {
  StorageOptions options;
  options.every_push = true;
  options.memory_budget_mb = 1;
  ExpectRowsSurviveReopen(options);
}

// Exports `storage` (server id 4) and expects table `table` to hold exactly
// `keys`, every weight `want`.
void ExpectExported(ServerStorage& storage, const std::string& dir, uint32_t table,
                    const std::vector<uint64_t>& keys, float want) {
  const Table& t = *storage.table(table);
  const std::string stem = dir + "/params/" + t.spec().name() + "/part-4";
  StatusOr<NpyArray> ids = ReadNpy(stem + ".keys.npy");
  StatusOr<NpyArray> rows = ReadNpy(stem + ".rows.npy");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(ids->rows(), keys.size());
  ASSERT_EQ(rows->rows(), keys.size());
  ASSERT_EQ(rows->row_size(), t.row_floats());
  std::vector<uint64_t> got(ids->as<uint64_t>(), ids->as<uint64_t>() + keys.size());
  std::sort(got.begin(), got.end());
  std::vector<uint64_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(got, sorted);
  for (uint64_t i = 0; i < keys.size() * t.row_floats(); ++i) {
    ASSERT_EQ(rows->as<float>()[i], want) << "table " << table << " value " << i;
  }
}

TEST(ServerStorage, ExportWritesEveryRowEvictedOrNot) {
  TempDir dir;
  std::unique_ptr<ServerStorage> storage = MustOpen(OverBudget(dir.Join("data")));
  ASSERT_NE(storage, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(storage->Export(dir.Join("model")).status()));
  ASSERT_TRUE(storage->SetServerId(4).ok());
  const std::vector<uint64_t> keys = Keys(1, 30000);
  PushAll(*storage, 0, keys, 2.0f);
  PushAll(*storage, 1, Keys(2, 20000), -4.0f);
  // Some rows are only in the store: the export streams them from there.
  ASSERT_TRUE(storage->Flush().ok());
  ASSERT_GT(storage->stats().evictions, 0u);
  StatusOr<ExportInfo> info = storage->Export(dir.Join("model"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, 50000u);
  ExpectExported(*storage, dir.Join("model"), 0, keys, -1.0f);
  ExpectExported(*storage, dir.Join("model"), 1, Keys(2, 20000), 2.0f);
  // Exported again (a retried export) over the same files.
  PushAll(*storage, 0, keys, 2.0f);
  ASSERT_TRUE(storage->Export(dir.Join("model")).ok());
  ExpectExported(*storage, dir.Join("model"), 0, keys, -2.0f);
}

// Expiry: once told a pass is done the expirer deletes what went untrained
// for ttl_passes, from the store too, and the store shrinks; the export
// leaves out the rows' last pass.
TEST(ServerStorage, ExpiredRowsLeaveTheStoreWhichShrinks) {
  TempDir dir;
  std::unique_ptr<ServerStorage> storage = OpenExpiring(OverBudget(dir.Join("data")));
  ASSERT_NE(storage, nullptr);
  // Pass 0 trains 40,000 rows of "wide" (and 1,000 of "emb", which keeps
  // every row); pass 1 trains 4,000 of them again.
  const std::vector<uint64_t> all = Keys(1, 40000);
  const std::vector<uint64_t> kept(all.begin(), all.begin() + 4000);
  PushAll(*storage, 1, all, 2.0f);
  PushAll(*storage, 0, Keys(5, 1000), 2.0f);
  storage->NotePassesDone(1);
  PushAll(*storage, 1, kept, 2.0f);
  ASSERT_TRUE(storage->Flush().ok());
  ASSERT_GT(storage->stats().evictions, 0u);
  const uint64_t disk_before = storage->stats().disk_bytes;
  EXPECT_EQ(storage->stats().rows_expired, 0u);

  storage->NotePassesDone(2);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (storage->stats().rows_expired < 36000 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const StorageStats stats = storage->stats();
  EXPECT_EQ(stats.rows_expired, 36000u);
  EXPECT_EQ(stats.passes_done, 2u);
  EXPECT_LT(stats.disk_bytes, disk_before / 2) << "before " << disk_before;
  ExpectAll(*storage, 1, {all[4000], all[39999]}, 0.0f, "expired rows start anew");

  StatusOr<ExportInfo> info = storage->Export(dir.Join("model"), 2);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, 5000u);
  ExpectExported(*storage, dir.Join("model"), 1, kept, -2.0f);
  ExpectExported(*storage, dir.Join("model"), 0, Keys(5, 1000), -1.0f);
}

TEST(ServerStorage, ExportOfAMemoryOnlyServerWritesItsRows) {
  TempDir dir;
  std::unique_ptr<ServerStorage> storage = MustOpen(StorageOptions{});
  ASSERT_NE(storage, nullptr);
  ASSERT_TRUE(storage->SetServerId(4).ok());
  PushAll(*storage, 0, Keys(1, 500), 2.0f);
  StatusOr<ExportInfo> info = storage->Export(dir.Join("model"));
  ASSERT_TRUE(info.ok()) << info.status();
  ExpectExported(*storage, dir.Join("model"), 0, Keys(1, 500), -1.0f);
  ExpectExported(*storage, dir.Join("model"), 1, {}, 0.0f);
  // A directory that cannot be made names itself.
  std::ofstream(dir.Join("file")) << "x";
  const Status refused = storage->Export(dir.Join("file")).status();
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(dir.Join("file")));
}

// Every row of `table` in export `dir` (all parts): key -> its floats.
std::map<uint64_t, std::vector<float>> ExportedRows(const std::string& dir, const std::string& table,
                                                    const std::vector<uint32_t>& parts) {
  std::map<uint64_t, std::vector<float>> rows;
  for (uint32_t part : parts) {
    const std::string stem = dir + "/params/" + table + "/part-" + std::to_string(part);
    StatusOr<NpyArray> ids = ReadNpy(stem + ".keys.npy");
    StatusOr<NpyArray> values = ReadNpy(stem + ".rows.npy");
    EXPECT_TRUE(ids.ok() && values.ok()) << stem;
    if (!ids.ok() || !values.ok()) return rows;
    for (uint64_t i = 0; i < ids->rows(); ++i) {
      const float* row = values->as<float>() + i * values->row_size();
      rows[ids->as<uint64_t>()[i]].assign(row, row + values->row_size());
    }
  }
  return rows;
}

// Writes the manifest a model export of TwoTables()-shaped `job` from
// server 4 would have.
void WriteManifest(const std::string& dir, const proto::JobSpec& job) {
  nlohmann::json params = nlohmann::json::array();
  for (const proto::TableSpec& table : job.tables()) {
    params.push_back({{"name", table.name()},
                      {"kind", "embedding"},
                      {"dim", table.dim()},
                      {"size", 0},
                      {"parts", {"params/" + table.name() + "/part-4"}}});
  }
  std::ofstream(dir + "/manifest.json")
      << nlohmann::json({{"format", "eps-model"}, {"version", 1}, {"params", params}}).dump();
}

TEST(ServerStorage, ImportLoadsTheRowsItOwnsWithOrWithoutTheirState) {
  TempDir dir;
  proto::JobSpec job = TwoTables();
  job.mutable_tables(1)->mutable_optimizer()->set_kind(proto::OptimizerSpec::ADAGRAD);
  job.mutable_tables(1)->mutable_optimizer()->set_epsilon(1e-8f);
  StorageOptions options;
  options.data_dir = dir.Join("source");
  std::unique_ptr<ServerStorage> source = MustOpen(options, job);
  ASSERT_NE(source, nullptr);
  ASSERT_TRUE(source->SetServerId(4).ok());
  PushAll(*source, 0, Keys(1, 3000), 2.0f);
  PushAll(*source, 1, Keys(2, 2000), -4.0f);
  ASSERT_TRUE(source->Export(dir.Join("model")).ok());
  WriteManifest(dir.Join("model"), job);

  // Two servers of a job placed otherwise: each takes the rows it owns,
  // one of them over a memory budget.
  std::vector<std::unique_ptr<ServerStorage>> targets;
  for (uint32_t slot : {0u, 1u}) {
    StorageOptions target_options;
    target_options.data_dir = dir.Join("target-" + std::to_string(slot));
    target_options.memory_budget_mb = slot == 0 ? 1 : 0;
    targets.push_back(MustOpen(target_options, job));
    ASSERT_NE(targets.back(), nullptr);
    ASSERT_TRUE(targets.back()->SetServerId(slot).ok());
    StatusOr<ImportInfo> imported = targets.back()->Import(
        dir.Join("model"), [slot](uint64_t key) { return key % 2 == slot; }, /*with_state=*/true);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_GT(imported->rows, 1000u);
    ASSERT_TRUE(targets.back()->Export(dir.Join("again")).ok());
  }
  for (const std::string table : {"emb", "wide"}) {
    const auto before = ExportedRows(dir.Join("model"), table, {4});
    const auto after = ExportedRows(dir.Join("again"), table, {0, 1});
    EXPECT_EQ(after, before) << table;
  }
  // Pushes after the import start from the imported rows.
  ExpectAll(*targets[0], 0, {Keys(1, 3000)[1]}, -1.0f, "imported (an even key)");

  // Without the state: Adagrad's accumulators start afresh.
  std::unique_ptr<ServerStorage> fresh = MustOpen(StorageOptions{}, job);
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(fresh->SetServerId(7).ok());
  ASSERT_TRUE(fresh->Import(dir.Join("model"), [](uint64_t) { return true; }, false).ok());
  ASSERT_TRUE(fresh->Export(dir.Join("weights")).ok());
  const auto weights = ExportedRows(dir.Join("weights"), "wide", {7});
  const auto with_state = ExportedRows(dir.Join("model"), "wide", {4});
  ASSERT_EQ(weights.size(), with_state.size());
  for (const auto& [key, row] : weights) {
    const std::vector<float>& original = with_state.at(key);
    EXPECT_TRUE(std::equal(row.begin(), row.begin() + 16, original.begin())) << key;
    EXPECT_TRUE(std::all_of(row.begin() + 16, row.end(), [](float v) { return v == 0.0f; }))
        << "accumulators of " << key << " start at optimizer.initial_accumulator (0)";
    ASSERT_FALSE(std::all_of(original.begin() + 16, original.end(), [](float v) { return v == 0; }));
  }

  // Another model: named, and nothing loaded.
  proto::JobSpec other = job;
  other.mutable_tables(0)->set_dim(8);
  std::unique_ptr<ServerStorage> wrong = MustOpen(StorageOptions{}, other);
  ASSERT_NE(wrong, nullptr);
  const Status refused =
      wrong->Import(dir.Join("model"), [](uint64_t) { return true; }, true).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("'emb'"));
  EXPECT_TRUE(absl::IsNotFound(
      wrong->Import(dir.Join("nothing"), [](uint64_t) { return true; }, true).status()));
}

// Admission over a store and a memory budget: rows are made at the second
// push only, leave memory, and come back from the store as admitted rows.
TEST(ServerStorage, AdmittedRowsAreStoredAndReadBackOverBudget) {
  TempDir dir;
  proto::JobSpec job = TwoTables();
  job.mutable_tables(0)->set_admission_min_count(2);
  StorageOptions options;
  options.data_dir = dir.Join("data");
  options.memory_budget_mb = 1;
  std::unique_ptr<ServerStorage> storage = MustOpen(options, job);
  ASSERT_NE(storage, nullptr);
  const std::vector<uint64_t> keys = Keys(1, 30000);
  PushAll(*storage, 0, keys, 2.0f);
  ExpectAll(*storage, 0, keys, 0.0f, "not admitted: the initializer's zeros");
  EXPECT_EQ(storage->table(0)->num_rows(), 0u);
  PushAll(*storage, 0, keys, 2.0f);
  ASSERT_TRUE(storage->Flush().ok());
  EXPECT_GT(storage->stats().evictions, 0u);
  PushAll(*storage, 0, keys, 2.0f);
  ExpectAll(*storage, 0, keys, -2.0f, "admitted at the second push, pushed once more");
  const StorageStats stats = storage->stats();
  EXPECT_EQ(stats.rows_admitted, keys.size()) << "rows read back from the store are not new";
  EXPECT_EQ(stats.updates_rejected, keys.size());
}

TEST(ServerStorage, FlusherWritesChangedRows) {
  TempDir temp;
  std::unique_ptr<ServerStorage> storage = OpenFlushingOften(temp.path());
  ASSERT_NE(storage, nullptr);
  PushAll(*storage, 0, Keys(1, 100), 1.0f);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (storage->stats().flushes < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(storage->stats().flushes, 2u);
  // Into the journal: the store receives them at a full flush.
  EXPECT_GT(storage->stats().disk_bytes, 0u);
  EXPECT_EQ(storage->stats().rows_on_disk, 0u);
  ASSERT_TRUE(storage->Flush().ok());
  EXPECT_GT(storage->stats().rows_on_disk, 0u);
}

// One stored row of a partition: its table, key and stored floats.
struct Row {
  uint32_t table = 0;
  uint64_t key = 0;
  std::vector<float> values;
};

// The rows of `rows`, one by one.
std::vector<Row> RowsOf(const TableRows& rows) {
  std::vector<Row> out;
  const size_t width = rows.keys.empty() ? 0 : rows.values.size() / rows.keys.size();
  EXPECT_EQ(rows.values.size(), rows.keys.size() * width);
  for (size_t i = 0; i < rows.keys.size(); ++i) {
    out.push_back(Row{.table = rows.table,
                      .key = rows.keys[i],
                      .values = std::vector<float>(rows.values.begin() + i * width,
                                                   rows.values.begin() + (i + 1) * width)});
  }
  return out;
}

// All pages of a partition, each table's rows as a page holds them.
std::vector<TableRows> ReadAll(ServerStorage& storage, uint32_t partition, uint32_t partitions,
                               size_t page_rows, int* pages = nullptr,
                               size_t max_scanned = ~size_t{0}) {
  std::vector<TableRows> runs;
  PartitionCursor cursor;
  while (true) {
    StatusOr<PartitionPage> page =
        storage.ReadPartition(partition, partitions, cursor, page_rows, max_scanned);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return runs;
    if (pages != nullptr) ++*pages;
    size_t rows = 0;
    for (const TableRows& run : page->tables) {
      EXPECT_FALSE(run.keys.empty());
      rows += run.keys.size();
    }
    EXPECT_LE(rows, page_rows);
    runs.insert(runs.end(), page->tables.begin(), page->tables.end());
    if (!page->next.has_value()) return runs;
    cursor = *page->next;
  }
}

std::vector<Row> RowsOf(const std::vector<TableRows>& runs) {
  std::vector<Row> out;
  for (const TableRows& run : runs) {
    for (Row& row : RowsOf(run)) out.push_back(std::move(row));
  }
  return out;
}

// A partition read a page at a time gives every row of it, each once, whole
// (weights, optimizer state, pass), and nothing of other partitions; written
// into another server's tables, it reads back the same (issue 18's copy).
// Both store layouts: tables grouped by the job's partitions, read a range
// at a time, and tables in key order (a store made before that layout, or
// partitions other than the job's), a filtered scan.
class PartitionCopyTest : public ::testing::TestWithParam<bool> {};

TEST_P(PartitionCopyTest, APartitionCopiesPageByPageWithEveryRowOnceAndWhole) {
  constexpr uint32_t kPartitions = 8;
  constexpr uint32_t kPartition = 5;
  const bool grouped = GetParam();
  TempDir temp;
  proto::JobSpec job = TwoTables();
  job.mutable_tables(1)->mutable_optimizer()->set_kind(proto::OptimizerSpec::ADAGRAD);
  job.mutable_tables(1)->mutable_optimizer()->set_epsilon(1e-8f);
  job.mutable_tables(1)->set_ttl_passes(2);
  if (grouped) job.set_num_partitions(kPartitions);
  StorageOptions options;
  options.data_dir = temp.Join("a");
  options.flush_interval = absl::Milliseconds(10);
  std::unique_ptr<ServerStorage> a = MustOpen(options, job);
  ASSERT_NE(a, nullptr);
  const std::vector<uint64_t> keys = Keys(1, 3000);
  PushAll(*a, 0, keys, 2.0f);  // -1, journaled only so far
  PushAll(*a, 1, keys, 4.0f);
  std::vector<std::pair<uint32_t, uint64_t>> want;
  for (uint32_t table : {0u, 1u}) {
    for (uint64_t key : keys) {
      if (PartitionOf(key, kPartitions) == kPartition) want.emplace_back(table, key);
    }
  }
  std::sort(want.begin(), want.end());
  ASSERT_GT(want.size(), 500u);

  // Journaled only so far: a page of the store has none of them, memory has
  // them all, and UnstoredKeys names them; read from memory they are the
  // rows the store has once flushed.
  const auto in_partition = [&](uint64_t key) {
    return PartitionOf(key, kPartitions) == kPartition;
  };
  StatusOr<std::vector<std::vector<uint64_t>>> unstored = a->UnstoredKeys(in_partition);
  ASSERT_TRUE(unstored.ok()) << unstored.status();
  std::vector<Row> from_memory;
  std::vector<std::pair<uint32_t, uint64_t>> unstored_keys;
  for (uint32_t table = 0; table < unstored->size(); ++table) {
    for (uint64_t key : (*unstored)[table]) unstored_keys.emplace_back(table, key);
    StatusOr<TableRows> read = a->ReadRows(table, (*unstored)[table]);
    ASSERT_TRUE(read.ok()) << read.status();
    for (Row& row : RowsOf(*read)) from_memory.push_back(std::move(row));
  }
  std::sort(unstored_keys.begin(), unstored_keys.end());
  std::sort(from_memory.begin(), from_memory.end(), [](const Row& a, const Row& b) {
    return std::tie(a.table, a.key) < std::tie(b.table, b.key);
  });
  EXPECT_EQ(unstored_keys, want);
  EXPECT_TRUE(ReadAll(*a, kPartition, kPartitions, 100).empty());
  ASSERT_TRUE(a->Flush().ok());
  unstored = a->UnstoredKeys(in_partition);
  ASSERT_TRUE(unstored.ok()) << unstored.status();
  for (const std::vector<uint64_t>& keys : *unstored) EXPECT_TRUE(keys.empty());

  int pages = 0;
  const std::vector<TableRows> runs = ReadAll(*a, kPartition, kPartitions, 100, &pages);
  const std::vector<Row> rows = RowsOf(runs);
  std::vector<std::pair<uint32_t, uint64_t>> got;
  for (const Row& row : rows) {
    got.emplace_back(row.table, row.key);
    ASSERT_EQ(row.values.size(), a->table(row.table)->stored_floats());
    if (row.table == 0) {
      ASSERT_EQ(row.values[0], -1.0f) << row.key;
    }
  }
  EXPECT_EQ(got, want);
  ASSERT_EQ(from_memory.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(from_memory[i].key, rows[i].key);
    ASSERT_EQ(from_memory[i].values, rows[i].values) << rows[i].key;
  }
  EXPECT_EQ(pages, static_cast<int>((want.size() + 99) / 100));
  // A page that scans at most 500 keys: the same rows. In key order, in
  // pages of fewer (6,000 keys in all: at least 12 pages); grouped by
  // partition, every key read is one of the partition's: the same pages.
  int short_pages = 0;
  EXPECT_EQ(RowsOf(ReadAll(*a, kPartition, kPartitions, 100, &short_pages, 500)).size(),
            rows.size());
  if (grouped) {
    EXPECT_EQ(short_pages, pages);
  } else {
    EXPECT_GE(short_pages, 12);
  }
  EXPECT_TRUE(
      absl::IsInvalidArgument(a->ReadPartition(kPartitions, kPartitions, {}, 100).status()));

  options.data_dir = temp.Join("b");
  std::unique_ptr<ServerStorage> b = MustOpen(options, job);
  ASSERT_NE(b, nullptr);
  for (const TableRows& run : runs) {
    ASSERT_TRUE(b->WriteTableRows(run.table, run.keys, run.values).ok());
  }
  ASSERT_TRUE(b->Flush().ok());
  const std::vector<Row> copied = RowsOf(ReadAll(*b, kPartition, kPartitions, 1000));
  ASSERT_EQ(copied.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(copied[i].key, rows[i].key);
    ASSERT_EQ(copied[i].values, rows[i].values) << "table " << rows[i].table << " key "
                                                << rows[i].key;
  }
  EXPECT_TRUE(ReadAll(*b, kPartition + 1, kPartitions, 1000).empty());
  const TableRows& first = runs.front();
  EXPECT_TRUE(absl::IsInvalidArgument(
      b->WriteTableRows(first.table, std::span(first.keys).first(1),
                        std::span(first.values).first(first.values.size() / first.keys.size() -
                                                      1))));
  EXPECT_TRUE(absl::IsInvalidArgument(b->WriteTableRows(9, {}, {})));
}

INSTANTIATE_TEST_SUITE_P(Layouts, PartitionCopyTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "GroupedByPartition" : "InKeyOrder";
                         });

// A moving partition's catch-up and tail: the current rows of the keys
// asked for, in their order, from memory (changed since stored) or else the
// store; a key in neither has none, and no row is made for it.
TEST(ServerStorage, ReadsTheCurrentRowsOfKeys) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.Join("a");
  const std::vector<uint64_t> keys = Keys(1, 100);
  const std::vector<uint64_t> asked = {keys[7], 987654321, keys[3]};
  const auto expect_rows = [&](ServerStorage& storage, float weight) {
    StatusOr<TableRows> read = storage.ReadRows(0, asked);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->table, 0u);
    const std::vector<Row> rows = RowsOf(*read);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].key, keys[7]);
    EXPECT_EQ(rows[1].key, keys[3]);
    for (const Row& row : rows) {
      EXPECT_EQ(row.table, 0u);
      ASSERT_EQ(row.values.size(), storage.table(0)->stored_floats());
      EXPECT_EQ(row.values[0], weight);
    }
  };
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options, TwoTables());
    ASSERT_NE(storage, nullptr);
    PushAll(*storage, 0, keys, 2.0f);
    ASSERT_TRUE(storage->Flush().ok());
    PushAll(*storage, 0, keys, 2.0f);  // changed in memory since stored
    expect_rows(*storage, -2.0f);
    EXPECT_TRUE(absl::IsInvalidArgument(storage->ReadRows(9, asked).status()));
  }
  // Reopened: every row is in the store only.
  std::unique_ptr<ServerStorage> storage = MustOpen(options, TwoTables());
  ASSERT_NE(storage, nullptr);
  ASSERT_EQ(storage->table(0)->num_rows(), 0u);
  expect_rows(*storage, -2.0f);
  EXPECT_EQ(storage->table(0)->num_rows(), 2u);
  StorageOptions memory;
  std::unique_ptr<ServerStorage> no_store = MustOpen(memory, TwoTables());
  ASSERT_NE(no_store, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_store->ReadRows(0, asked).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(no_store->UnstoredKeys([](uint64_t) { return true; })
                                             .status()));
}

// An export leaves out the keys its filter refuses (a partition the
// server gave away).
TEST(ServerStorage, AnExportKeepsOnlyTheKeysItIsToldTo) {
  TempDir dir;
  StorageOptions options;
  options.data_dir = dir.Join("data");
  std::unique_ptr<ServerStorage> storage = MustOpen(options, TwoTables());
  ASSERT_NE(storage, nullptr);
  ASSERT_TRUE(storage->SetServerId(4).ok());
  const std::vector<uint64_t> keys = Keys(1, 1000);
  PushAll(*storage, 0, keys, 2.0f);
  std::vector<uint64_t> even;
  for (uint64_t key : keys) {
    if (PartitionOf(key, 4) % 2 == 0) even.push_back(key);
  }
  ASSERT_GT(even.size(), 100u);
  ASSERT_LT(even.size(), keys.size());
  StatusOr<ExportInfo> info = storage->Export(dir.Join("model"), std::nullopt, [](uint64_t key) {
    return PartitionOf(key, 4) % 2 == 0;
  });
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, even.size());
  ExpectExported(*storage, dir.Join("model"), 0, even, -1.0f);
}

}  // namespace
}  // namespace eps
