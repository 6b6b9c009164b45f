#include "ps/write_queue.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "ps/kv_store.h"
#include "tests/ps/kv_store_testing.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

// What was queued while the store wrote goes as one write in key order, with
// only each key's last image (a put or an erase): what writing every image
// in queue order would leave.
TEST(WriteQueue, WritesEachKeysLastImageInKeyOrder) {
  // Each write as the store got it: table, key, value, erase. The first is
  // held until released, so what is queued meanwhile goes as one batch.
  using Row = std::tuple<uint32_t, uint64_t, std::string, bool>;
  absl::Mutex mu;
  std::vector<std::vector<Row>> batches;
  absl::Notification first_started;
  absl::Notification release;
  FailingKvStore store(NewMemoryKvStore());
  store.before_write = [&](std::span<const KvWrite> writes) {
    if (!first_started.HasBeenNotified()) {
      first_started.Notify();
      release.WaitForNotification();
    }
    absl::MutexLock lock(&mu);
    std::vector<Row>& batch = batches.emplace_back();
    for (const KvWrite& write : writes) {
      batch.emplace_back(write.table, write.key, std::string(write.erase ? "" : write.value),
                         write.erase);
    }
  };
  ASSERT_TRUE(store.CreateTable(0).ok());
  ASSERT_TRUE(store.CreateTable(1).ok());
  WriteQueue queue(&store);
  queue.Append(0, 7, "x", 1);
  first_started.WaitForNotification();  // the committer holds [7]
  queue.Append(1, 9, "a", 1);
  queue.Append(0, 7, "b", 1);
  queue.Append(1, 9, "c", 1);
  queue.Append(0, 3, "d", 1);
  queue.AppendErase(0, 7);
  const uint64_t last = queue.Append(0, 2, "e", 1);
  release.Notify();
  ASSERT_TRUE(queue.WaitDurable(last, absl::Seconds(10)).ok());

  absl::MutexLock lock(&mu);
  ASSERT_EQ(batches.size(), 2u);
  const std::vector<Row> want = {
      {0, 2, "e", false}, {0, 3, "d", false}, {0, 7, "", true}, {1, 9, "c", false}};
  EXPECT_EQ(batches[1], want);
  EXPECT_EQ(queue.rows_written(), 1u + want.size());  // each key once per write

  std::vector<bool> found;
  std::string value(1, '\0');
  const uint64_t seven = 7;
  ASSERT_TRUE(store.MultiGet(0, std::span(&seven, 1), 1, std::span(value.data(), 1), &found).ok());
  EXPECT_FALSE(found[0]) << "the erase came last";
  const uint64_t nine = 9;
  ASSERT_TRUE(store.MultiGet(1, std::span(&nine, 1), 1, std::span(value.data(), 1), &found).ok());
  EXPECT_TRUE(found[0]);
  EXPECT_EQ(value, "c");
}

// The 1-byte value of `key` in table 0, or "absent".
std::string ValueOf(KvStore& store, uint64_t key) {
  std::vector<bool> found;
  std::string value(1, '\0');
  if (!store.MultiGet(0, std::span(&key, 1), 1, std::span(value.data(), 1), &found).ok()) {
    return "error";
  }
  return found[0] ? value : "absent";
}

// With a journal, every batch is journaled and only the images queued
// to_store (and erases) reach the store too; the segments before a mark are
// dropped once what follows it is durable.
TEST(WriteQueue, WithAJournalOnlyImagesQueuedForTheStoreReachIt) {
  testing::TempDir dir;
  std::unique_ptr<KvStore> store = NewMemoryKvStore();
  ASSERT_TRUE(store->CreateTable(0).ok());
  StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir.path(), store.get(), 1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  WriteQueue queue(store.get(), *std::move(journal));
  ASSERT_TRUE(queue.journaled());
  ASSERT_TRUE(queue.Append(0, 3, "z", 1, /*to_store=*/true) > 0);
  queue.Append(0, 1, "a", 1, /*to_store=*/false);
  queue.Append(0, 2, "b", 1, /*to_store=*/true);
  queue.Append(0, 2, "c", 1, /*to_store=*/false);  // the store keeps "b"
  uint64_t last = queue.AppendErase(0, 3);
  ASSERT_TRUE(queue.WaitDurable(last, absl::Seconds(10)).ok());
  EXPECT_EQ(ValueOf(*store, 1), "absent");
  EXPECT_EQ(ValueOf(*store, 2), "b");
  EXPECT_EQ(ValueOf(*store, 3), "absent");
  const uint64_t before = queue.journal_bytes();
  EXPECT_GT(before, 0u);

  const uint64_t boundary = queue.MarkSegment();
  EXPECT_EQ(boundary, last + 1);
  last = queue.Append(0, 2, "d", 1, /*to_store=*/true);
  ASSERT_TRUE(queue.WaitDurable(last, absl::Seconds(10)).ok());
  ASSERT_TRUE(queue.DropJournalBefore(boundary).ok());
  EXPECT_EQ(ValueOf(*store, 2), "d");
  EXPECT_GT(queue.journal_bytes(), 0u);
  EXPECT_LT(queue.journal_bytes(), before) << "only the segment after the mark is left";
}

}  // namespace
}  // namespace eps
