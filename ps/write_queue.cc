#include "ps/write_queue.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/time/clock.h"
#include "core/failpoint.h"
#include "core/logging.h"

namespace eps {

WriteQueue::WriteQueue(KvStore* store, std::unique_ptr<Journal> journal)
    : store_(store), journal_(std::move(journal)) {
  committer_ = std::thread([this] { CommitLoop(); });
}

WriteQueue::~WriteQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  committer_.join();
}

uint64_t WriteQueue::Append(uint32_t table, uint64_t key, const void* bytes, size_t size,
                            bool to_store) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Entry{table, key, std::string(static_cast<const char*>(bytes), size),
                         /*erase=*/false, to_store || journal_ == nullptr});
  queued_bytes_ += size;
  return next_seq_++;
}

uint64_t WriteQueue::AppendErase(uint32_t table, uint64_t key) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Entry{table, key, std::string(), /*erase=*/true});
  return next_seq_++;
}

uint64_t WriteQueue::MarkSegment() {
  if (journal_ == nullptr) return 0;
  absl::MutexLock lock(&mu_);
  if (queue_.empty() && durable_seq() + 1 == next_seq_ && error_.ok()) {
    // The committer is idle (it writes nothing until more is queued, which
    // waits for this lock): the segment starts now, so that the one before
    // it can go even if nothing more comes.
    rotate_at_ = 0;
    if (Status rotated = journal_->Rotate(next_seq_); !rotated.ok()) {
      LOG(ERROR) << "starting a journal segment failed: " << rotated;
      error_ = rotated;
    }
  } else {
    rotate_at_ = next_seq_;
  }
  return next_seq_;
}

Status WriteQueue::DropJournalBefore(uint64_t seq) {
  if (journal_ == nullptr) return absl::OkStatus();
  return journal_->DropBefore(seq).status();
}

Status WriteQueue::WaitDurable(uint64_t seq, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return durable_seq() >= seq || !error_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError("rows were not written to the store in time");
  }
  return durable_seq() >= seq ? absl::OkStatus() : error_;
}

Status WriteQueue::status() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

uint64_t WriteQueue::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}

void WriteQueue::SkipSequenceNumbersForTesting(uint64_t n) {
  absl::MutexLock lock(&mu_);
  CHECK(queue_.empty() && durable_seq() + 1 == next_seq_) << "rows are still being written";
  next_seq_ += n;
  durable_seq_.store(next_seq_ - 1, std::memory_order_release);
}

Status WriteQueue::Commit(std::span<const Entry> batch, std::vector<KvWrite>& writes,
                          std::vector<KvWrite>& store_writes) {
  // Each key's last image to the journal; to the store, each key's last
  // image queued for it: the same writes when every entry is for the store
  // (always without a journal; a full flush).
  writes.clear();
  bool all_to_store = true;
  for (const Entry& entry : batch) {
    writes.push_back(KvWrite{entry.table, entry.key, entry.bytes, entry.erase});
    all_to_store &= entry.to_store;
  }
  KeepLastWritePerKey(writes);
  std::span<const KvWrite> to_store = writes;
  if (!all_to_store) {
    store_writes.clear();
    for (const Entry& entry : batch) {
      if (entry.to_store) {
        store_writes.push_back(KvWrite{entry.table, entry.key, entry.bytes, entry.erase});
      }
    }
    KeepLastWritePerKey(store_writes);
    to_store = store_writes;
  }
  if (journal_ != nullptr) RETURN_IF_ERROR(journal_->Append(writes));
  RETURN_IF_ERROR(store_->Write(to_store, /*sync=*/false));
  rows_.fetch_add(writes.size(), std::memory_order_relaxed);  // each key once
  return absl::OkStatus();
}

void WriteQueue::CommitLoop() {
  std::vector<Entry> batch;
  std::vector<KvWrite> writes;
  std::vector<KvWrite> store_writes;
  // Failpoint ps.kill_in_store_write=N, looked up once.
  const std::optional<uint64_t> kill_in_write = FailpointValue("ps.kill_in_store_write");
  // Set as each write starts; the failpoint's thread waits for it, so it
  // lives as long as the loop (the process dies once the failpoint fires).
  std::atomic<bool> writing{false};
  while (true) {
    uint64_t last_seq;
    uint64_t rotate_at = 0;
    {
      absl::MutexLock lock(&mu_);
      // After a failed write nothing more is written: wait for the end.
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (!queue_.empty() && error_.ok());
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() || !error_.ok()) return;  // stopping
      batch.swap(queue_);
      queued_bytes_ = 0;
      last_seq = next_seq_ - 1;
      // A segment boundary this batch reaches: the entries from it on go to
      // a new segment.
      if (rotate_at_ != 0 && rotate_at_ <= last_seq) rotate_at = std::exchange(rotate_at_, 0);
    }
    const uint64_t first_seq = last_seq + 1 - batch.size();
    CHECK(rotate_at == 0 || rotate_at >= first_seq) << "a segment boundary behind the queue";
    // Failpoint: a thread spinning on another core kills the process
    // (SIGKILL) as soon as this write starts, and says first on stderr
    // whether the write had returned by then (batches_ counts it).
    if (const uint64_t write = batches_.load(std::memory_order_relaxed) + 1;
        kill_in_write == write) {
      LOG(WARNING) << "failpoint ps.kill_in_store_write=" << write << ": killing this server "
                   << "(SIGKILL) in its write of " << batch.size() << " rows";
      std::atomic<bool> spinning{false};
      writing.store(false);  // set by the writes before this one
      std::thread([this, &writing, &spinning, write] {
        spinning.store(true);
        while (!writing.load()) {
        }
        const bool returned = batches_.load(std::memory_order_relaxed) >= write;
        const absl::string_view where =
            returned ? "killed after the store write returned\n" : "killed inside the store write\n";
        (void)!::write(STDERR_FILENO, where.data(), where.size());
        raise(SIGKILL);
      }).detach();
      while (!spinning.load()) {
      }
    }
    const absl::Time start = absl::Now();
    writing.store(true);
    const std::span<const Entry> entries(batch);
    const size_t split = rotate_at == 0 ? batch.size() : static_cast<size_t>(rotate_at - first_seq);
    Status written = Commit(entries.first(split), writes, store_writes);
    if (written.ok() && rotate_at != 0) written = journal_->Rotate(rotate_at);
    if (written.ok() && split < batch.size()) {
      written = Commit(entries.subspan(split), writes, store_writes);
    }
    last_write_us_.store(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)),
                         std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    if (!written.ok()) {
      LOG(ERROR) << "writing " << batch.size() << " rows to the store failed: " << written;
      error_ = written;
      continue;
    }
    batches_.fetch_add(1, std::memory_order_relaxed);
    durable_seq_.store(last_seq, std::memory_order_release);
    batch.clear();
  }
}

}  // namespace eps
