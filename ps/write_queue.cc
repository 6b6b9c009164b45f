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

WriteQueue::WriteQueue(KvStore* store) : store_(store) {
  committer_ = std::thread([this] { CommitLoop(); });
}

WriteQueue::~WriteQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  committer_.join();
}

uint64_t WriteQueue::Append(uint32_t table, uint64_t key, const void* bytes, size_t size) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Entry{table, key, std::string(static_cast<const char*>(bytes), size)});
  queued_bytes_ += size;
  return next_seq_++;
}

uint64_t WriteQueue::AppendErase(uint32_t table, uint64_t key) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Entry{table, key, std::string(), /*erase=*/true});
  return next_seq_++;
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

void WriteQueue::CommitLoop() {
  std::vector<Entry> batch;
  std::vector<KvWrite> writes;
  // Failpoint ps.kill_in_store_write=N, looked up once.
  const std::optional<uint64_t> kill_in_write = FailpointValue("ps.kill_in_store_write");
  // Set as each write starts; the failpoint's thread waits for it, so it
  // lives as long as the loop (the process dies once the failpoint fires).
  std::atomic<bool> writing{false};
  while (true) {
    uint64_t last_seq;
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
    }
    // Everything queued so far as one atomic write, with only the last image
    // of each key (the one a write in queue order would leave), in key
    // order: RocksDB's memtable inserts keys in order at a fraction of the
    // cost of random ones (its skip list resumes from the last insert).
    writes.clear();
    writes.reserve(batch.size());
    for (const Entry& entry : batch) {
      writes.push_back(KvWrite{entry.table, entry.key, entry.bytes, entry.erase});
    }
    const auto key_order = [](const KvWrite& a, const KvWrite& b) {
      return std::tie(a.table, a.key) < std::tie(b.table, b.key);
    };
    std::stable_sort(writes.begin(), writes.end(), key_order);
    // Of equal keys, the last in queue order stays (stable: it sorts last).
    size_t kept = 0;
    for (size_t i = 0; i < writes.size(); ++i) {
      if (i + 1 < writes.size() && !key_order(writes[i], writes[i + 1])) continue;
      writes[kept++] = writes[i];
    }
    writes.resize(kept);
    // Failpoint: a thread spinning on another core kills the process
    // (SIGKILL) as soon as this write starts, and says first on stderr
    // whether the write had returned by then (batches_ counts it).
    if (const uint64_t write = batches_.load(std::memory_order_relaxed) + 1;
        kill_in_write == write) {
      LOG(WARNING) << "failpoint ps.kill_in_store_write=" << write << ": killing this server "
                   << "(SIGKILL) in its write of " << writes.size() << " rows";
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
    Status written = store_->Write(writes, /*sync=*/false);
    last_write_us_.store(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)),
                         std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    if (!written.ok()) {
      LOG(ERROR) << "writing " << writes.size() << " rows to the store failed: " << written;
      error_ = written;
      continue;
    }
    batches_.fetch_add(1, std::memory_order_relaxed);
    rows_.fetch_add(writes.size(), std::memory_order_relaxed);  // each key once
    durable_seq_.store(last_seq, std::memory_order_release);
    batch.clear();
  }
}

}  // namespace eps
