// KvStore: a parameter server's store of record and cold tier.
//
// Rows of each table live under their exact 64-bit key as fixed-width byte
// values (weights, optimizer state, a version; the table decides). Two back
// ends pass one conformance suite (tests/ps/kv_store_test.cc): an in-memory
// fake, and RocksDB with one column family per table, batched reads
// (MultiGet) and atomic batched writes (WriteBatch, WAL on).
//
// Keys are stored as 8-byte big-endian strings, so RocksDB's bytewise order
// is numeric order. A table made with partitions (the job's
// num_partitions) stores each key behind its partition, 4 more bytes
// big-endian: the rows of a partition lie together, and a partition move
// reads one range rather than filtering the whole table (docs/design.md
// 2.20). Tables made before that layout keep key order.
//
// Thread-safety: safe for concurrent use (a KvStore's destruction excepted).

#ifndef EPS_PS_KV_STORE_H_
#define EPS_PS_KV_STORE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

namespace eps {

struct KvWrite {
  uint32_t table = 0;
  uint64_t key = 0;
  absl::string_view value;  // must stay valid during Write; ignored by an erase
  bool erase = false;       // deletes the key (absent keys too) instead
};

// Sorts `writes` by (table, key) and keeps each key's last write in the
// given order: what applying them in order would leave, in the key order
// RocksDB's memtable inserts fastest (its skip list resumes from the last
// insert; RocksKvStore::Write puts a table grouped by partition in its own
// order).
inline void KeepLastWritePerKey(std::vector<KvWrite>& writes) {
  const auto key_order = [](const KvWrite& a, const KvWrite& b) {
    return std::tie(a.table, a.key) < std::tie(b.table, b.key);
  };
  // Of equal keys, the last in the given order sorts last (stable).
  std::stable_sort(writes.begin(), writes.end(), key_order);
  size_t kept = 0;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (i + 1 < writes.size() && !key_order(writes[i], writes[i + 1])) continue;
    writes[kept++] = writes[i];
  }
  writes.resize(kept);
}

// Whether CreateTable(table, `asked`) may keep a table that exists grouped
// by `have` partitions (0: key order): OK unless both are set and differ.
inline Status CheckTableLayout(uint32_t table, uint32_t have, uint32_t asked) {
  if (have == asked || have == 0 || asked == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("table ", table, " is stored by ", have,
                                                    " partitions, not ", asked,
                                                    " (a store of another job?)"));
}

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Makes `table` usable (a column family "t<table>" in RocksDB, or
  // "t<table>.p<partitions>"). With `partitions` > 0 a new table stores its
  // rows grouped by PartitionOf(key, partitions) (cluster/placement.h), in
  // key order within each; with 0, in key order. A table that exists keeps
  // its layout (Partitions says which), whatever `partitions` asks, except
  // that one grouped by another number of partitions than asked (not 0) is
  // kFailedPrecondition. Idempotent. kUnavailable on I/O errors.
  virtual Status CreateTable(uint32_t table, uint32_t partitions) = 0;
  Status CreateTable(uint32_t table) { return CreateTable(table, 0); }
  // The partitions `table` groups its rows by; 0 for key order or an
  // unknown table.
  virtual uint32_t Partitions(uint32_t table) = 0;

  // Reads `keys` of `table` from one consistent snapshot of it: *found is
  // resized to keys.size(); for each found key i, its value is copied to
  // out[i * value_bytes, (i + 1) * value_bytes) and (*found)[i] = true;
  // missing keys leave their bytes untouched and (*found)[i] = false. Keys
  // may repeat and need not be sorted. Blocks on disk reads. kDataLoss when
  // a stored value is not `value_bytes` long or unreadable (corrupt);
  // kNotFound for an unknown table; kUnavailable on I/O errors. On an error,
  // `out` and *found hold unspecified contents.
  // REQUIRES: out.size() == keys.size() * value_bytes; found != nullptr.
  virtual Status MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t value_bytes,
                          std::span<char> out, std::vector<bool>* found) = 0;

  // Applies all `writes` (puts and erases) atomically (all or none), through
  // the WAL. With `sync` the WAL is fsynced before returning. Later writes of
  // the same key in one call win. Values may have any length. An empty
  // `writes` is OK.
  // kNotFound for an unknown table (nothing is written); kUnavailable on I/O
  // errors.
  virtual Status Write(std::span<const KvWrite> writes, bool sync) = 0;

  // Calls visit(key, value) for every row of `table` whose key is at least
  // `from`, in the table's order (key order; grouped by partition, then
  // key order, when Partitions(table) > 0, where `from` must be 0), from
  // one consistent snapshot of it (writes made meanwhile are not seen).
  // Streams: RocksDB seeks to `from` and reads block by block without
  // filling its cache, so a table far larger than memory scans in bounded
  // memory, and a scan stopped by its visitor can go on from the next key
  // (a partition of a table in key order read a page at a time). Stops at
  // the first error `visit` returns and returns it. kNotFound for an
  // unknown table; kInvalidArgument for a `from` a partitioned table
  // cannot start at; kDataLoss/kUnavailable as MultiGet.
  virtual Status ScanFrom(
      uint32_t table, uint64_t from,
      const std::function<Status(uint64_t key, absl::string_view value)>& visit) = 0;
  // ScanFrom(table, 0, visit): every row.
  Status Scan(uint32_t table,
              const std::function<Status(uint64_t key, absl::string_view value)>& visit) {
    return ScanFrom(table, 0, visit);
  }
  // As ScanFrom, for the rows of partition `partition` of a table grouped
  // by partition (Partitions(table) > 0) whose key is at least `from`, in
  // key order: reads that partition's range only. kFailedPrecondition for a
  // table in key order (filter a ScanFrom instead); kInvalidArgument for a
  // partition out of range.
  virtual Status ScanPartition(
      uint32_t table, uint32_t partition, uint64_t from,
      const std::function<Status(uint64_t key, absl::string_view value)>& visit) = 0;

  // Compacts `table` whole, so that the space of erased and overwritten rows
  // is given back to the file system now rather than when later writes
  // compact it (RocksDB: CompactRange over the column family, blocking; it
  // rewrites the table, so callers do it rarely). No-op for the fake.
  // kNotFound for an unknown table; kUnavailable on I/O errors.
  virtual Status Compact(uint32_t table) = 0;

  // Writes a consistent snapshot of every table into `dir`, which must not
  // exist (its parent must). Blocks while the memtables are flushed.
  // RocksDB: a Checkpoint (SSTs hard-linked where possible, so it is cheap
  // and shares disk space with the store until compaction replaces them).
  // kAlreadyExists when `dir` exists; kNotFound when its parent does not;
  // kUnavailable on other I/O errors; kUnimplemented for the fake.
  virtual Status Checkpoint(const std::string& dir) = 0;

  // Approximate number of stored rows of `table` (0 for an unknown table;
  // RocksDB's estimate counts overwritten keys until compaction merges
  // them), and approximate bytes on disk of the whole store (SST files plus
  // unflushed memtables, which stand for the WAL; 0 for the fake). Cheap:
  // no disk I/O.
  virtual uint64_t ApproximateRows(uint32_t table) = 0;
  virtual uint64_t ApproximateDiskBytes() = 0;
  // Approximate bytes of memory the store itself holds: for RocksDB its
  // block cache (bounded by block_cache_mb; index and filter blocks are
  // charged to it) and its memtables (bounded by write_buffer_mb per table,
  // twice). 0 for the fake. Cheap, and takes no DB lock: servers call it
  // on their heartbeat thread, which must not wait on a stalled store.
  virtual uint64_t ApproximateMemoryBytes() = 0;
};

struct RocksKvStoreOptions {
  // Directory of the database. Required.
  std::string dir;
  // RocksDB block cache, MiB. Default 8. Counts toward the server's fixed
  // memory overhead.
  int64_t block_cache_mb = 8;
  // Memtable size per column family, MiB. Default 4.
  int64_t write_buffer_mb = 4;
};

// Opens (creating if missing) a RocksDB store, with every column family it
// already holds. kInvalidArgument for an empty dir or non-positive sizes;
// kUnavailable naming the directory when it cannot be opened (locked by
// another open store, in this process or another; not writable); kDataLoss
// when corrupt or holding a column family that is not "t<id>".
StatusOr<std::unique_ptr<KvStore>> OpenRocksKvStore(const RocksKvStoreOptions& options);

// The in-memory fake: the same contract, nothing durable; its Checkpoint
// returns kUnimplemented.
std::unique_ptr<KvStore> NewMemoryKvStore();

// Replaces the database in `dir` by a copy of checkpoint `checkpoint`
// (made by KvStore::Checkpoint), leaving the checkpoint unchanged. The store
// in `dir` must not be open. The copy is built and fsynced beside `dir`
// (in `dir`.restore) and then renamed into place, so a crash leaves either
// the old database or the restored one (or, between the two steps, no `dir`
// and a complete `dir`.restore; calling again finishes the job). kNotFound
// when the checkpoint does not exist; kDataLoss when it is not a database
// (no CURRENT file); kInvalidArgument when it lies inside `dir`;
// kUnavailable on I/O errors.
Status RestoreRocksCheckpoint(const std::string& checkpoint, const std::string& dir);

}  // namespace eps

#endif  // EPS_PS_KV_STORE_H_
