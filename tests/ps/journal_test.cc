// The journal (ps/journal.h) and the storage over it: what it replays, what
// a torn or corrupt segment does, and that a restore is not overwritten by
// it.

#include "ps/journal.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps/kv_store.h"
#include "ps/table.h"
#include "ps/write_queue.h"
#include "tests/ps/storage_testing.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

KvWrite Put(uint32_t table, uint64_t key, absl::string_view value) {
  return KvWrite{table, key, value, false};
}

// The 4-byte value of `key` in `table`, or "absent".
std::string Value(KvStore& store, uint32_t table, uint64_t key) {
  std::vector<char> out(4);
  std::vector<bool> found;
  const uint64_t keys[] = {key};
  if (!store.MultiGet(table, keys, 4, out, &found).ok() || !found[0]) return "absent";
  return std::string(out.data(), 4);
}

std::vector<std::string> Segments(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Journal, ReplaysItsBatchesInOrderIntoTheStoreAndStartsAfresh) {
  TempDir dir;
  std::unique_ptr<KvStore> first = NewMemoryKvStore();
  {
    StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir.path(), first.get(), 1);
    ASSERT_TRUE(journal.ok()) << journal.status();
    const KvWrite one[] = {Put(0, 1, "aaaa"), Put(0, 2, "bbbb")};
    ASSERT_TRUE((*journal)->Append(one).ok());
    const KvWrite two[] = {Put(0, 1, "cccc"), KvWrite{0, 2, {}, true}};
    ASSERT_TRUE((*journal)->Append(two).ok());
    ASSERT_TRUE((*journal)->Rotate(10).ok());
    const KvWrite three[] = {Put(7, 3, "dddd")};
    ASSERT_TRUE((*journal)->Append(three).ok());
    EXPECT_EQ(Segments(dir.path()).size(), 2u);
    EXPECT_GT((*journal)->bytes(), 0u);
  }
  // Nothing reached the first store: the journal alone holds the rows.
  EXPECT_EQ(Value(*first, 0, 1), "absent");

  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  JournalReplay replayed;
  StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir.path(), store.get(), 1, &replayed);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ(replayed.segments, 2u);
  EXPECT_EQ(replayed.batches, 3u);
  EXPECT_EQ(replayed.writes, 3u);  // each key once per segment
  EXPECT_EQ(replayed.torn_bytes, 0u);
  EXPECT_EQ(Value(*store, 0, 1), "cccc");
  EXPECT_EQ(Value(*store, 0, 2), "absent");
  EXPECT_EQ(Value(*store, 7, 3), "dddd");
  // The replayed segments are gone; one new, empty one is open.
  EXPECT_EQ(Segments(dir.path()), std::vector<std::string>{"00000000000000000001.log"});
  EXPECT_EQ((*journal)->bytes(), 0u);
}

// Opens the journal in `dir` (replaying it into `store`) and appends two
// batches to its segment 1: key 1 "aaaa", then key 2 "bbbb".
void WriteTwoBatches(const std::string& dir, KvStore* store) {
  StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir, store, 1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  const KvWrite one[] = {Put(0, 1, "aaaa")};
  const KvWrite two[] = {Put(0, 2, "bbbb")};
  ASSERT_TRUE((*journal)->Append(one).ok());
  ASSERT_TRUE((*journal)->Append(two).ok());
}

TEST(Journal, DropsATornLastBatchAndRefusesACorruptEarlierOne) {
  TempDir dir;
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  ASSERT_NO_FATAL_FAILURE(WriteTwoBatches(dir.path(), store.get()));
  const std::string segment = dir.Join("00000000000000000001.log");
  // A crash in the second append: its last bytes never reached the file.
  fs::resize_file(segment, fs::file_size(segment) - 3);
  {
    JournalReplay replayed;
    StatusOr<std::unique_ptr<Journal>> journal =
        Journal::Open(dir.path(), store.get(), 1, &replayed);
    ASSERT_TRUE(journal.ok()) << journal.status();
    EXPECT_EQ(replayed.batches, 1u);
    EXPECT_GT(replayed.torn_bytes, 0u);
    EXPECT_EQ(Value(*store, 0, 1), "aaaa");
    EXPECT_EQ(Value(*store, 0, 2), "absent");

    const KvWrite three[] = {Put(0, 3, "cccc")};
    ASSERT_TRUE((*journal)->Append(three).ok());
    ASSERT_TRUE((*journal)->Rotate(5).ok());
    ASSERT_TRUE((*journal)->Append(three).ok());
  }
  // A flipped byte in a segment that is not the last is corruption.
  {
    std::fstream file(segment, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);
    file.put('\x7f');
  }
  std::unique_ptr<KvStore> other = NewMemoryKvStore();
  StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir.path(), other.get(), 1);
  ASSERT_TRUE(absl::IsDataLoss(journal.status())) << journal.status();
  EXPECT_NE(journal.status().message().find(segment), std::string::npos) << journal.status();
  EXPECT_NE(journal.status().message().find("byte 0"), std::string::npos) << journal.status();
}

// In the last segment, only a batch that reaches its end can be torn: a
// damaged one before others is corruption, a tail of zeros (what a machine
// crash can leave) is torn.
TEST(Journal, OnlyTheEndOfTheLastSegmentCanBeTorn) {
  TempDir dir;
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  const std::string segment = dir.Join("00000000000000000001.log");
  ASSERT_NO_FATAL_FAILURE(WriteTwoBatches(dir.path(), store.get()));
  {
    std::ofstream tail(segment, std::ios::binary | std::ios::app);
    tail << std::string(100, '\0');
  }
  JournalReplay replayed;
  ASSERT_TRUE(Journal::Apply(dir.path(), store.get(), &replayed).ok());
  EXPECT_EQ(replayed.batches, 2u);
  EXPECT_EQ(replayed.torn_bytes, 100u);
  EXPECT_EQ(Value(*store, 0, 2), "bbbb");

  ASSERT_NO_FATAL_FAILURE(WriteTwoBatches(dir.path(), store.get()));
  {
    std::fstream file(segment, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);  // in the first batch's entry
    file.put('\x7f');
  }
  const Status applied = Journal::Apply(dir.path(), NewMemoryKvStore().get());
  EXPECT_TRUE(absl::IsDataLoss(applied)) << applied;
}

TEST(Journal, DropBeforeDeletesOnlyClosedSegmentsBelowTheSequenceNumber) {
  TempDir dir;
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir.path(), store.get(), 1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  const KvWrite one[] = {Put(0, 1, "aaaa")};
  ASSERT_TRUE((*journal)->Append(one).ok());
  ASSERT_TRUE((*journal)->Rotate(5).ok());
  ASSERT_TRUE((*journal)->Append(one).ok());
  ASSERT_TRUE((*journal)->Rotate(9).ok());
  ASSERT_TRUE((*journal)->Append(one).ok());
  const uint64_t all = (*journal)->bytes();
  // Segment 5 holds 5..8: not all below 8.
  StatusOr<int> dropped = (*journal)->DropBefore(8);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 1);
  EXPECT_EQ(Segments(dir.path()).size(), 2u);
  dropped = (*journal)->DropBefore(100);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 1);  // the open segment stays
  EXPECT_EQ(Segments(dir.path()), std::vector<std::string>{"00000000000000000009.log"});
  EXPECT_EQ((*journal)->bytes(), all / 3);
}

// The directory a test and its death-test children share. A child re-runs
// the test from its start (threadsafe style), so the parent's directory is
// handed down in the environment rather than made again.
class SharedDir {
 public:
  SharedDir() {
    if (const char* inherited = std::getenv(kVariable)) {
      path_ = inherited;
      return;
    }
    owned_.emplace();
    path_ = owned_->path();
    setenv(kVariable, path_.c_str(), 1);
  }
  ~SharedDir() {
    if (owned_.has_value()) unsetenv(kVariable);
  }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  static constexpr const char* kVariable = "EPS_JOURNAL_TEST_DIR";
  std::optional<TempDir> owned_;
  std::string path_;
};

// A row only the journal holds never leaves memory (the store would answer
// for it with an older image, or none); once queued for the store it may.
TEST(JournaledTable, RowsLeaveMemoryOnlyOnceQueuedForTheStore) {
  TempDir dir;
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir.path(), store.get(), 1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  WriteQueue queue(store.get(), *std::move(journal));
  proto::TableSpec spec;
  spec.set_name("t");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(4);
  spec.mutable_initializer()->set_kind(proto::InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  MemoryBudget budget(1);  // every row is over it
  TableStorage storage{.store = store.get(), .queue = &queue, .budget = &budget};
  StatusOr<std::unique_ptr<Table>> table = Table::Create(spec, /*seed=*/1, storage);
  ASSERT_TRUE(table.ok()) << table.status();
  const std::vector<uint64_t> keys = Keys(1, 500);
  const std::vector<float> grads(keys.size() * 4, 2.0f);
  ASSERT_TRUE((*table)->Push(keys, grads).ok());

  uint64_t seq = (*table)->QueueDirtyRows(/*journal_only=*/true);
  ASSERT_TRUE(queue.WaitDurable(seq, absl::Seconds(10)).ok());
  EXPECT_EQ((*table)->EvictToBudget(), 0u);
  EXPECT_EQ((*table)->stats().rows_in_memory, keys.size());

  seq = (*table)->QueueDirtyRows();
  ASSERT_TRUE(queue.WaitDurable(seq, absl::Seconds(10)).ok());
  EXPECT_EQ((*table)->EvictToBudget(), keys.size());
  std::vector<float> out(keys.size() * 4, 0.0f);
  ASSERT_TRUE((*table)->Pull(keys, out).ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], -1.0f) << "key " << keys[i / 4];
}

StorageOptions Journaled(const std::string& data_dir) {
  StorageOptions options;
  options.data_dir = data_dir;
  options.flush_interval = absl::Milliseconds(10);
  return options;
}

// Waits for two more flushes: the rows changed before are journaled.
void WaitForFlushes(ServerStorage& storage) {
  const uint64_t before = storage.stats().flushes;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (storage.stats().flushes < before + 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(storage.stats().flushes, before + 2);
}

// The flusher appends changed rows to the journal, not the store, and a
// server killed then finds them replayed; with journal_mb = 0 the flusher
// writes the store.
TEST(ServerStorageJournal, RowsOnlyTheJournalHeldSurviveAKill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const SharedDir dir;
  const std::vector<uint64_t> keys = Keys(1, 3000);
  EXPECT_EXIT(
      {
        std::unique_ptr<ServerStorage> storage = MustOpen(Journaled(dir.Join("data")));
        PushAll(*storage, 0, keys, 2.0f);
        WaitForFlushes(*storage);
        const StorageStats stats = storage->stats();
        if (stats.rows_on_disk == 0 && stats.disk_bytes > 0) std::fputs("journal only\n", stderr);
        raise(SIGKILL);
      },
      ::testing::KilledBySignal(SIGKILL), "journal only");
  std::unique_ptr<ServerStorage> storage = MustOpen(Journaled(dir.Join("data")));
  ASSERT_NE(storage, nullptr);
  EXPECT_GT(storage->stats().rows_on_disk, 0u);  // replayed into the store
  ExpectAll(*storage, 0, keys, -1.0f, "rows replayed from the journal");

  StorageOptions direct = Journaled(dir.Join("direct"));
  direct.journal_mb = 0;
  storage = MustOpen(direct);
  ASSERT_NE(storage, nullptr);
  PushAll(*storage, 0, keys, 2.0f);
  WaitForFlushes(*storage);
  EXPECT_GT(storage->stats().rows_on_disk, 0u);
  EXPECT_FALSE(fs::exists(dir.Join("direct/journal")));
}

// A restore, of a running storage or at start, replaces the state the
// journal completes: the rows journaled after the checkpoint stay out.
TEST(ServerStorageJournal, ARestoredCheckpointIsNotOverwrittenByTheJournal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const SharedDir dir;
  const std::vector<uint64_t> keys = Keys(1, 2000);
  const auto train_past_checkpoint = [&](ServerStorage& storage) {
    PushAll(storage, 0, keys, 2.0f);  // -1
    StatusOr<CheckpointInfo> info = storage.Checkpoint(1);
    ASSERT_TRUE(info.ok()) << info.status();
    PushAll(storage, 0, keys, 2.0f);  // -2, journaled only
    WaitForFlushes(storage);
  };
  // And without a journal (none to discard).
  for (const int64_t journal_mb : {256, 0}) {
    SCOPED_TRACE(absl::StrCat("ps.journal_mb = ", journal_mb));
    const std::string running = dir.Join(absl::StrCat("running-", journal_mb));
    StorageOptions options = Journaled(running);
    options.journal_mb = journal_mb;
    {
      std::unique_ptr<ServerStorage> storage = MustOpen(options);
      ASSERT_NE(storage, nullptr);
      train_past_checkpoint(*storage);
      ExpectAll(*storage, 0, keys, -2.0f, "before the restore");
      StatusOr<CheckpointInfo> restored = storage->Restore(running + "/checkpoints/1");
      ASSERT_TRUE(restored.ok()) << restored.status();
      ExpectAll(*storage, 0, keys, -1.0f, "restored while running");
    }
    std::unique_ptr<ServerStorage> reopened = MustOpen(options);
    ASSERT_NE(reopened, nullptr);
    ExpectAll(*reopened, 0, keys, -1.0f, "restored, then reopened");
    reopened.reset();

    const std::string start = dir.Join(absl::StrCat("start-", journal_mb));
    options.data_dir = start;
    EXPECT_EXIT(
        {
          std::unique_ptr<ServerStorage> storage = MustOpen(options);
          train_past_checkpoint(*storage);
          raise(SIGKILL);
        },
        ::testing::KilledBySignal(SIGKILL), "");
    options.restore_checkpoint = "1";
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -1.0f, "checkpoint.restore at start");
    storage.reset();
    // Started again without checkpoint.restore: no journal replays over it.
    options.restore_checkpoint.clear();
    storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -1.0f, "restored at start, then started again");
  }
}

// A journal that cannot be applied does not block a restore, which
// replaces its rows anyway: it is discarded, loudly.
TEST(ServerStorageJournal, ADamagedJournalDoesNotBlockARestore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const SharedDir dir;
  const std::vector<uint64_t> keys = Keys(1, 2000);
  const StorageOptions options = Journaled(dir.Join("data"));
  EXPECT_EXIT(
      {
        std::unique_ptr<ServerStorage> storage = MustOpen(options);
        PushAll(*storage, 0, keys, 2.0f);  // -1
        if (!storage->Checkpoint(1).ok()) std::_Exit(1);
        PushAll(*storage, 0, keys, 2.0f);  // -2, journaled only
        WaitForFlushes(*storage);
        raise(SIGKILL);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  const std::string journal = dir.Join("data/journal");
  const std::vector<std::string> segments = Segments(journal);
  ASSERT_FALSE(segments.empty());
  {
    const std::string first = journal + "/" + segments.front();
    std::fstream file(first, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);
    file.put('\x7f');
    file.seekp(0, std::ios::end);
    file << std::string(100, '\x01');
  }
  StorageOptions restoring = options;
  restoring.restore_checkpoint = "1";
  std::unique_ptr<ServerStorage> storage = MustOpen(restoring);
  ASSERT_NE(storage, nullptr);
  ExpectAll(*storage, 0, keys, -1.0f, "restored over a damaged journal");
  for (const std::string& segment : Segments(journal)) {
    EXPECT_EQ(fs::file_size(journal + "/" + segment), 0u) << segment << ": the damaged one went";
  }
}

}  // namespace
}  // namespace eps
