// WriteQueue: the ordered path from a server's hot tier to its KvStore.
//
// Tables append row images (key + bytes) while holding the row's stripe
// lock, so the queue holds every key's writes in the order they were made;
// one committer thread writes whatever has queued up as one atomic batch
// (group commit: each key's last image only, in key order, which RocksDB's
// memtable inserts fastest) and advances durable_seq(). A row whose latest image is
// durable may leave memory: the store then holds exactly what memory held.
//
// With a Journal (ps/journal.h), each batch is appended to it first, and
// only the images queued `to_store` (and erases) are written to the store
// as well: durable_seq() then means journaled, and an image queued for the
// journal only must be queued again for the store before its row may leave
// memory. MarkSegment and DropJournalBefore bound the journal: a full flush
// marks a segment boundary, queues every row the store lacks, waits for it,
// and drops the segments before the boundary.
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_PS_WRITE_QUEUE_H_
#define EPS_PS_WRITE_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "ps/journal.h"
#include "ps/kv_store.h"

namespace eps {

class WriteQueue {
 public:
  // `store` must outlive the queue. Starts the committer thread. Without a
  // journal every image goes to the store.
  explicit WriteQueue(KvStore* store, std::unique_ptr<Journal> journal = nullptr);
  // Writes what is queued, then stops the committer.
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues a row image; returns its sequence number (rising from 1). With a
  // journal (which must have been opened at sequence number 1), `to_store`
  // false writes it to the journal only.
  uint64_t Append(uint32_t table, uint64_t key, const void* bytes, size_t size,
                  bool to_store = true);
  // Queues the deletion of a row (an expired one), in order with the
  // images, for the store; returns its sequence number.
  uint64_t AppendErase(uint32_t table, uint64_t key);

  bool journaled() const { return journal_ != nullptr; }
  // With a journal: images queued from now on go to a new segment. Returns
  // the first sequence number of that segment (the next one Append gives);
  // 0 without a journal.
  uint64_t MarkSegment();
  // With a journal: deletes the segments holding only sequence numbers
  // below `seq` (a MarkSegment's), once everything queued before it is
  // durable and every row the store lacked then was queued to_store after
  // it and is durable too. kUnavailable naming the file.
  Status DropJournalBefore(uint64_t seq);
  // Bytes of the journal on disk; 0 without one.
  uint64_t journal_bytes() const { return journal_ == nullptr ? 0 : journal_->bytes(); }

  // Highest sequence number written to the store (every lower one too).
  uint64_t durable_seq() const { return durable_seq_.load(std::memory_order_acquire); }

  // Blocks until `seq` is durable or `timeout` passes. kDeadlineExceeded on
  // timeout; the committer's error (kUnavailable) when a write failed.
  Status WaitDurable(uint64_t seq, absl::Duration timeout);

  // The first write error, if any (the queue then stops writing: a server
  // that cannot persist must not acknowledge more).
  Status status() const;

  // Statistics.
  uint64_t batches_written() const { return batches_.load(std::memory_order_relaxed); }
  uint64_t rows_written() const { return rows_.load(std::memory_order_relaxed); }
  // Duration of the last batch write, in microseconds.
  uint64_t last_write_us() const { return last_write_us_.load(std::memory_order_relaxed); }
  // Bytes queued and not yet written.
  uint64_t queued_bytes() const;

  // Skips `n` sequence numbers, as if `n` more rows had been written.
  // REQUIRES: everything appended so far is durable.
  void SkipSequenceNumbersForTesting(uint64_t n);

 private:
  struct Entry {
    uint32_t table;
    uint64_t key;
    std::string bytes;
    bool erase = false;
    bool to_store = true;
  };
  void CommitLoop();
  // Writes `batch` (in queue order) to the journal and the store.
  Status Commit(std::span<const Entry> batch, std::vector<KvWrite>& writes,
                std::vector<KvWrite>& store_writes);

  KvStore* const store_;
  const std::unique_ptr<Journal> journal_;
  mutable absl::Mutex mu_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // A MarkSegment's boundary the committer has not reached yet; 0 if none.
  uint64_t rotate_at_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> durable_seq_{0};
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> last_write_us_{0};
  std::thread committer_;
};

}  // namespace eps

#endif  // EPS_PS_WRITE_QUEUE_H_
