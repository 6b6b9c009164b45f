// Journal: the append-only log of row images that stands in for the store
// between store writes.
//
// A server's WriteQueue appends every batch it commits to the journal, and
// writes to the store (RocksDB) only the images that must be there: rows
// leaving memory, erases, and what a full flush (a checkpoint, an export, a
// stop, the journal growing past its limit) writes. A row changed every
// second then costs one sequential append per flush interval, not one
// memtable insert, flush and compaction: the store receives it once per
// full flush. The store plus the journal replayed in order is the state of
// record: the journal's last image of a key is never older than the
// store's, since every image written to the store is journaled too.
//
// On disk: DIR/<first sequence number, 20 digits>.log segments, each a run
// of batches. A batch is a 24-byte header (magic "EPSJ", entry count,
// payload bytes, XXH3 of the payload) and its entries (table u32, erase
// u32, key u64, value bytes u32, value). A crash can tear only the batch
// being appended, the last of the last segment: Replay drops it. A bad batch
// anywhere else is corruption.
//
// Thread-safety: Append and Rotate serialized by the caller (the
// WriteQueue's committer, or MarkSegment under the queue's lock while the
// committer is idle); DropBefore and bytes() from any thread.

#ifndef EPS_PS_JOURNAL_H_
#define EPS_PS_JOURNAL_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "ps/kv_store.h"

namespace eps {

struct JournalReplay {
  uint64_t segments = 0;
  uint64_t batches = 0;
  uint64_t writes = 0;      // rows written to the store (each key once per write)
  uint64_t torn_bytes = 0;  // of a torn last batch, dropped
};

class Journal {
 public:
  // Replays the segments in `dir` (none when it does not exist) into
  // `store`, in order, in synced writes of up to 16 MiB (column families
  // made as needed), then deletes them oldest first (a crash meanwhile
  // leaves a suffix, which replays to the same state). kDataLoss naming the
  // segment and byte for a bad batch that is not a torn tail; kUnavailable
  // naming the path on I/O errors.
  static Status Apply(const std::string& dir, KvStore* store, JournalReplay* replayed = nullptr);
  // Apply, then opens segment `first_seq` in `dir` (made if missing) for
  // appending.
  static StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir, KvStore* store,
                                                 uint64_t first_seq,
                                                 JournalReplay* replayed = nullptr);
  // Deletes every segment in `dir`, if any. kUnavailable naming the path.
  static Status Discard(const std::string& dir);
  // Whether `dir` holds a segment (true when it cannot be read).
  static bool HasSegments(const std::string& dir);

  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Appends `writes` as one batch (one write(2); not fsynced: a process
  // crash loses nothing written, a machine crash what the OS had not
  // flushed). kUnavailable naming the segment.
  Status Append(std::span<const KvWrite> writes);
  // Closes the current segment and starts one whose first entry is
  // `first_seq`.
  Status Rotate(uint64_t first_seq);
  // Deletes, oldest first, every closed segment that holds only sequence
  // numbers below `seq` (the open segment stays). Returns how many.
  StatusOr<int> DropBefore(uint64_t seq);
  // Bytes of every segment on disk.
  uint64_t bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  explicit Journal(std::string dir) : dir_(std::move(dir)) {}
  Status OpenSegment(uint64_t first_seq);

  const std::string dir_;
  int fd_ = -1;  // the open segment; used by the appending thread only
  std::string buffer_;
  mutable absl::Mutex mu_;
  // First sequence numbers of the segments on disk, ascending; the last is
  // the open one.
  std::vector<uint64_t> segments_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> segment_bytes_ ABSL_GUARDED_BY(mu_);  // parallel to segments_
};

}  // namespace eps

#endif  // EPS_PS_JOURNAL_H_
