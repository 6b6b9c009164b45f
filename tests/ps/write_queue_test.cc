#include "ps/write_queue.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "ps/kv_store.h"

namespace eps {
namespace {

// A memory store that records what each Write was given, and holds its
// first Write until released (so that what is queued meanwhile goes as one
// batch).
class RecordingStore : public KvStore {
 public:
  using Row = std::tuple<uint32_t, uint64_t, std::string, bool>;  // table, key, value, erase

  Status CreateTable(uint32_t table) override { return store_->CreateTable(table); }
  Status MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t value_bytes,
                  std::span<char> out, std::vector<bool>* found) override {
    return store_->MultiGet(table, keys, value_bytes, out, found);
  }
  Status Write(std::span<const KvWrite> writes, bool sync) override {
    if (!first_started_.HasBeenNotified()) {
      first_started_.Notify();
      release_.WaitForNotification();
    }
    {
      absl::MutexLock lock(&mu_);
      std::vector<Row>& batch = batches_.emplace_back();
      for (const KvWrite& write : writes) {
        batch.emplace_back(write.table, write.key, std::string(write.erase ? "" : write.value),
                           write.erase);
      }
    }
    return store_->Write(writes, sync);
  }
  Status Scan(uint32_t table,
              const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    return store_->Scan(table, visit);
  }
  Status Compact(uint32_t table) override { return store_->Compact(table); }
  Status Checkpoint(const std::string& dir) override { return store_->Checkpoint(dir); }
  uint64_t ApproximateRows(uint32_t table) override { return store_->ApproximateRows(table); }
  uint64_t ApproximateDiskBytes() override { return 0; }
  uint64_t ApproximateMemoryBytes() override { return 0; }

  absl::Notification first_started_;
  absl::Notification release_;
  std::vector<std::vector<Row>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

 private:
  std::unique_ptr<KvStore> store_ = NewMemoryKvStore();
  absl::Mutex mu_;
  std::vector<std::vector<Row>> batches_;
};

// What was queued while the store wrote goes as one write in key order, with
// only each key's last image (a put or an erase): what writing every image
// in queue order would leave.
TEST(WriteQueue, WritesEachKeysLastImageInKeyOrder) {
  RecordingStore store;
  ASSERT_TRUE(store.CreateTable(0).ok());
  ASSERT_TRUE(store.CreateTable(1).ok());
  WriteQueue queue(&store);
  queue.Append(0, 7, "x", 1);
  store.first_started_.WaitForNotification();  // the committer holds [7]
  queue.Append(1, 9, "a", 1);
  queue.Append(0, 7, "b", 1);
  queue.Append(1, 9, "c", 1);
  queue.Append(0, 3, "d", 1);
  queue.AppendErase(0, 7);
  const uint64_t last = queue.Append(0, 2, "e", 1);
  store.release_.Notify();
  ASSERT_TRUE(queue.WaitDurable(last, absl::Seconds(10)).ok());

  const std::vector<std::vector<RecordingStore::Row>> batches = store.batches();
  ASSERT_EQ(batches.size(), 2u);
  const std::vector<RecordingStore::Row> want = {
      {0, 2, "e", false}, {0, 3, "d", false}, {0, 7, "", true}, {1, 9, "c", false}};
  EXPECT_EQ(batches[1], want);

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

}  // namespace
}  // namespace eps
