// ServerStorage: a parameter server's tables, memory budget and store.
//
// Owns the KvStore (RocksDB in DATA_DIR/db, or nothing for a memory-only
// server), the WriteQueue to it, the shared hot-tier MemoryBudget, the
// tables, and a flusher thread that queues every changed row at least
// every flush_interval (sooner while over budget, so rows can be evicted).
//
// Durability (ps.durability):
//   flush       a push is acknowledged once applied in memory; a crash loses
//               at most the pushes of the last flush interval (plus the
//               write in flight).
//   every_push  a push is acknowledged only after its rows reached the
//               journal, or the store's WAL without one (group commit:
//               concurrent pushes share one write); a crash loses no
//               acknowledged push. Neither is fsynced per push: a machine
//               crash (not a process crash) may still lose the last writes
//               the OS had not flushed.
//
// The journal (ps/journal.h, DATA_DIR/journal; ps.journal_mb > 0): the
// flusher's periodic flushes append the changed rows to it and not to the
// store. A full flush (Flush(): checkpoints, exports, imports, stops; and
// the flusher's, while over the memory budget or once the journal holds
// journal_mb) queues every row the store lacks for the store, then drops
// the journal segments before it. Open replays the journal into the store;
// a restore discards it.
//
// Checkpoints: Checkpoint(N) flushes, then writes a RocksDB checkpoint into
// the checkpoint root: CHECKPOINT_DIR/ps-<server id>/N when
// checkpoint_dir is set (shared storage, so that a replacement server can
// restore it), else DATA_DIR/checkpoints/N. A server started with
// restore_checkpoint = N replaces its database by DATA_DIR/checkpoints/N
// before opening it; a running one replaces it with Restore(path).
//
// Expiry (TableSpec.ttl_passes): NotePassesDone(D) tells the storage the
// job completed D training passes (the master's heartbeat says so); an
// expirer thread then deletes the rows of every table that expired with
// them (Table::Expire), and compacts a table's store when that deleted at
// least an eighth of its rows, so that the disk shrinks now rather than as
// later writes compact it. Rows pushed without naming their pass count as
// pushed in pass D.
//
// The server's identity: SetServerId records the id the master gave this
// server in DATA_DIR/SERVER, and under CURVE the slot's credential in
// DATA_DIR/SERVER_CREDENTIAL (mode 0600), so that a server restarted on
// its dir asks for the same slot again and proves it may
// (stored_server_id, stored_server_credential).
//
// Thread-safety: safe for concurrent use once Open returns, with one
// exception: Restore replaces every table, so no Table* obtained before it
// may be used during or after it, and Restore must not run concurrently
// with itself, CreateTables, Checkpoint or a use of a table (the caller
// excludes them; ParamServer holds a reader/writer lock). stats() and the
// flusher may run during a Restore.

#ifndef EPS_PS_STORAGE_H_
#define EPS_PS_STORAGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "proto/eps.pb.h"
#include "ps/kv_store.h"
#include "ps/table.h"
#include "ps/write_queue.h"

namespace eps {

struct StorageOptions {
  // Where the server keeps its database and checkpoints; empty keeps rows
  // in memory only (no budget, no durability). Default empty.
  std::string data_dir;
  // Hot-tier budget in MiB; 0 = unlimited. Default 0.
  int64_t memory_budget_mb = 0;
  // Longest time a changed row stays unwritten (flush durability). Default 1 s.
  absl::Duration flush_interval = absl::Seconds(1);
  // With a data dir: the journal's limit in MiB (ps.journal_mb, see the
  // journal note above); 0 writes every flush to the store. Default 256.
  int64_t journal_mb = 256;
  // Acknowledge pushes only once durable. Default false ("flush").
  bool every_push = false;
  // RocksDB block cache and memtable sizes, MiB. Defaults 8 and 4.
  int64_t block_cache_mb = 8;
  int64_t write_buffer_mb = 4;
  // Root of every server's checkpoints (checkpoint.dir): checkpoint N of
  // server S goes to CHECKPOINT_DIR/ps-S/N. Empty: DATA_DIR/checkpoints/N.
  // Ignored without a data dir (nothing to checkpoint). Default empty.
  std::string checkpoint_dir;
  // Checkpoints kept in the checkpoint root when the caller names none to
  // keep (Checkpoint's keep_ids empty). Default 3.
  int keep_checkpoints = 3;
  // Checkpoint id to restore before opening; empty restores nothing.
  std::string restore_checkpoint;
  // Longest wait of a push for durability. Default 30 s.
  absl::Duration durability_timeout = absl::Seconds(30);
  // Memory each table's admission counts may take (ps.admission_memory_mb).
  int64_t admission_memory_mb = 32;

  Status Validate() const;
};

struct StorageStats {
  uint64_t rows_in_memory = 0;
  uint64_t rows_on_disk = 0;  // approximate
  uint64_t memory_bytes = 0;
  uint64_t disk_bytes = 0;    // approximate
  uint64_t store_memory_bytes = 0;  // approximate: KvStore::ApproximateMemoryBytes
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  // Row updates refused (TableStats.updates_refused) by every table since
  // the storage opened, tables a Restore replaced included.
  uint64_t updates_refused = 0;
  // Admission (TableStats), every table; since the tables were made.
  uint64_t rows_admitted = 0;
  uint64_t updates_rejected = 0;
  uint64_t admission_candidates = 0;
  // Rows expired (TableSpec.ttl_passes), every table, since the storage
  // opened; and the passes done as last told (NotePassesDone).
  uint64_t rows_expired = 0;
  uint32_t passes_done = 0;
  double last_flush_ms = 0;   // queueing + writing of the last flush
  uint64_t flushes = 0;
};

struct CheckpointInfo {
  std::string path;
  uint64_t bytes = 0;
  absl::Duration duration;
};

struct ImportInfo {
  uint64_t rows = 0;  // rows loaded, every table
  absl::Duration duration;
};

struct ExportInfo {
  uint64_t rows = 0;   // rows written, every table
  uint64_t bytes = 0;  // bytes of the files written
  absl::Duration duration;
};

// Where a read of a partition goes on (ServerStorage::ReadPartition).
struct PartitionCursor {
  uint32_t table = 0;  // the table to read on from
  uint64_t key = 0;    // the first key of it to look at
};

// Rows of one table as they are stored: each key's stored floats
// (weights, then optimizer state, then under expiry its last pass), row
// after row: values.size() == keys.size() * the table's stored_floats().
struct TableRows {
  uint32_t table = 0;
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

struct PartitionPage {
  std::vector<TableRows> tables;        // in table id order, none empty
  std::optional<PartitionCursor> next;  // where the next page starts; none: done
};

class ServerStorage {
 public:
  // Opens the store (restoring a checkpoint first if asked). kInvalidArgument
  // for bad options, kNotFound for a missing checkpoint, kUnavailable when
  // the database cannot be opened (naming it).
  static StatusOr<std::unique_ptr<ServerStorage>> Open(const StorageOptions& options);
  // Flushes, then stops the flusher and closes the store.
  ~ServerStorage();
  ServerStorage(const ServerStorage&) = delete;
  ServerStorage& operator=(const ServerStorage&) = delete;

  // Creates the job's tables (ids 0..n-1). With a data dir, first ties the
  // dir to the job: a dir holding another job's parameters (DATA_DIR/JOB
  // names it) is refused with kFailedPrecondition, naming both jobs.
  // kInvalidArgument for a bad spec.
  Status CreateTables(const proto::JobSpec& job);
  // Table `id`, or null. Valid until the next Restore.
  Table* table(uint32_t id) const;
  size_t num_tables() const;

  // Queues every row the store lacks for the store and waits until it is
  // durable (a full flush: see the journal above), then evicts durable
  // rows while over the memory budget. No-op without a store.
  // Errors of the queue (kUnavailable; kDeadlineExceeded after
  // durability_timeout).
  Status Flush();
  // Flush + checkpoint `id` into the checkpoint root (see above), then
  // drops older checkpoints there: with `keep_ids` non-empty, every
  // checkpoint with an id below `id` that keep_ids does not list (`id`
  // itself always stays); with `keep_ids` empty, all but the newest
  // keep_checkpoints. CheckpointInfo.path is absolute.
  // kFailedPrecondition without a store, or with checkpoint_dir set before
  // SetServerId; kAlreadyExists when that checkpoint exists; kUnavailable
  // on I/O errors. Failpoint ps.crash_in_checkpoint=`id` (core/failpoint.h)
  // kills the process once the checkpoint is written, before returning.
  StatusOr<CheckpointInfo> Checkpoint(uint64_t id, std::span<const uint64_t> keep_ids = {});

  // Writes every row this server holds into the model export in `dir`
  // (docs/model-format.md): for each table, DIR/params/<table name>/
  // part-<server id>.keys.npy (uint64: feature ids, or a dense tensor's
  // chunk indices) and .rows.npy (float32, rows x row_floats: the weights,
  // then the optimizer state), in the store's order with a store (by
  // partition, then key). Flushes first and then streams the store's rows
  // (bounded memory, whatever the table's size); without a store, writes
  // the rows in memory. Consistent only while nothing pushes
  // (the master exports at the end of the job). Files appear whole or not
  // at all. kFailedPrecondition before SetServerId or CreateTables;
  // kUnavailable naming the file on I/O errors; the store's errors.
  // With `passes_done`, first deletes the rows that expired with those
  // passes (as NotePassesDone, but before returning).
  // With `keep`, only the rows whose key it accepts (a server leaves out
  // the partitions it gave away: docs/design.md 2.20).
  StatusOr<ExportInfo> Export(const std::string& dir,
                              std::optional<uint32_t> passes_done = std::nullopt,
                              const std::function<bool(uint64_t key)>& keep = nullptr);

  // The job completed `passes_done` training passes (see Expiry above):
  // rows pushed without naming their pass count as pushed in this one, and
  // the expirer deletes what expired, in the background. Cheap: the
  // heartbeat thread calls it.
  void NotePassesDone(uint32_t passes_done) ABSL_LOCKS_EXCLUDED(mu_);

  // A page of the rows of `partition` (PartitionOf(key, num_partitions))
  // in the store, from `from` on: at most `max_rows` (> 0) rows, the tables
  // in id order, each in key order. A store table grouped by the job's
  // partitions reads the partition's range only; one in key order (a store
  // made before that layout) is a filtered scan of every key, at most
  // `max_scanned` keys a page (a page of a big store must not hold a
  // request thread for long; it may come back with fewer rows, or none, and
  // `next` set). Reads the store as it is: the rows changed in memory since
  // they were last stored are not in it (UnstoredKeys names them, ReadRows
  // reads them; a partition move reads them in its catch-up rounds:
  // docs/design.md 2.20).
  // kFailedPrecondition without a store or before CreateTables;
  // kInvalidArgument for a partition out of range; the store's errors.
  StatusOr<PartitionPage> ReadPartition(uint32_t partition, uint32_t num_partitions,
                                        const PartitionCursor& from, size_t max_rows,
                                        size_t max_scanned = ~size_t{0});

  // Writes rows another server read (ReadPartition, ReadRows) into
  // table `table`, as changed rows, whole (weights, optimizer state,
  // pass). kFailedPrecondition before CreateTables; kInvalidArgument for an
  // unknown table, or values that are not the table's stored floats per
  // key; the store's errors.
  Status WriteTableRows(uint32_t table, std::span<const uint64_t> keys,
                        std::span<const float> values);

  // Per table id, the keys `keep` accepts of the rows held in memory whose
  // latest image the store may lack (Table::VisitUnstored), unordered: what a
  // read of the store (ReadPartition) begun after this call may miss or
  // read stale, unless changed again since. Walks every resident row.
  // kFailedPrecondition without a store or before CreateTables.
  StatusOr<std::vector<std::vector<uint64_t>>> UnstoredKeys(
      const std::function<bool(uint64_t key)>& keep);

  // The current rows of `keys` of table `table` (Table::Read: from memory,
  // else the store), in the order of `keys`; a key in neither has none.
  // Makes no row. kFailedPrecondition without a store; kInvalidArgument for
  // an unknown table; the store's errors.
  StatusOr<TableRows> ReadRows(uint32_t table, std::span<const uint64_t> keys);

  // A warm start: loads the rows of the model export in `dir` that
  // `owned` accepts (by their key in this job: the feature id, or the
  // dense chunk's DenseChunkKey) into the tables of the same names, as
  // changed rows, then flushes. With `with_state`, the rows' optimizer
  // state comes too; without, each starts with a new row's state. Reads
  // the parts in pieces (bounded memory). Idempotent: rows of the export
  // overwrite what the tables hold. kNotFound naming manifest.json or a
  // part (an unfinished export); kInvalidArgument naming the table when
  // the export lacks one of this job's tables or has it with another
  // kind or dim, or, with `with_state`, another optimizer state width;
  // kDataLoss naming a part that does not fit its manifest; the store's
  // errors. kFailedPrecondition before CreateTables.
  StatusOr<ImportInfo> Import(const std::string& dir,
                              const std::function<bool(uint64_t key)>& owned, bool with_state);

  // Replaces every parameter by the checkpoint in directory `checkpoint`
  // (a CheckpointInfo.path): drops the tables and their changed rows
  // (nothing is written), closes the store, replaces DATA_DIR/db by a copy
  // of the checkpoint (RestoreRocksCheckpoint), reopens it and recreates the
  // tables of the same job with an empty hot tier; rows come back from the
  // store on demand. Idempotent: restoring the same checkpoint again gives
  // the same state. Blocks for the copy. Returns the checkpoint's absolute
  // path, its bytes and the time taken.
  // kFailedPrecondition without a data dir or before CreateTables;
  // kNotFound (naming the path) when `checkpoint` is not a directory and
  // kDataLoss when it is not a RocksDB checkpoint: both before anything
  // changes. Other errors (kUnavailable, kInvalidArgument) come after the
  // tables were dropped: the storage then serves whatever DATA_DIR/db holds
  // (its last flushed state, or the checkpoint when only the reopening
  // failed), or, when even that cannot be opened, has no tables and
  // status() says why.
  // An empty `checkpoint` empties the store instead (no rows at all: the
  // job as training starts).
  // REQUIRES: see the thread-safety note above.
  StatusOr<CheckpointInfo> Restore(const std::string& checkpoint);

  // OK unless a failed Restore left the storage without a database (then
  // every table() is null and the server must stop).
  Status status() const;

  // Why this storage could not write, once it could not: the store's first
  // failed write (naming DATA_DIR/db) or a checkpoint that could not be
  // written for an I/O reason (naming its path), with the error; empty
  // while every write succeeded. It stays once set, a Restore included (a
  // full disk stays full): the master stops the job on it.
  std::string write_error() const;

  // The job (DATA_DIR/JOB: "id name") whose parameters the data dir holds;
  // empty for a fresh or memory-only store.
  std::string stored_job() const;

  // The server id recorded in DATA_DIR/SERVER; nullopt for a fresh or
  // memory-only store (or an unreadable file, logged as a warning).
  std::optional<uint32_t> stored_server_id() const;
  // The slot's credential recorded in DATA_DIR/SERVER_CREDENTIAL; empty
  // when there is none (a fresh dir, security off, an older eps).
  std::string stored_server_credential() const;
  // Records `id` as this server's id: the checkpoint root under
  // checkpoint_dir names it, and with a data dir it is written to
  // DATA_DIR/SERVER (a temporary file, fsynced, then renamed over it, so the
  // file is always whole), with `credential` (when not empty) in
  // DATA_DIR/SERVER_CREDENTIAL, readable by its user alone. kUnavailable
  // when a file cannot be written.
  Status SetServerId(uint32_t id, const std::string& credential = "");

  StorageStats stats() const;
  const StorageOptions& options() const { return options_; }

 private:
  explicit ServerStorage(const StorageOptions& options);
  // A full flush, or with `journal_only` one into the journal (a full one
  // without a journal).
  Status FlushLocked(bool journal_only) ABSL_SHARED_LOCKS_REQUIRED(state_mu_)
      ABSL_LOCKS_EXCLUDED(flush_mu_, mu_);
  // Table::Put, then a full flush while over the memory budget (changed
  // rows leave memory only once written): loading many rows (an import, a
  // moved partition) stays within the budget.
  Status PutLocked(Table& table, std::span<const uint64_t> keys, std::span<const float> values,
                   uint32_t width) ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // Keeps the first I/O failure for write_error(); returns `error`.
  Status NoteWriteError(Status error) ABSL_LOCKS_EXCLUDED(mu_);
  // The directory checkpoints go to (absolute).
  StatusOr<std::string> CheckpointRoot() const;
  void StartFlusher() ABSL_LOCKS_EXCLUDED(mu_);
  void StopFlusher() ABSL_LOCKS_EXCLUDED(mu_);
  void FlushLoop();
  void ExpireLoop();
  // Deletes what expired once `passes_done` passes are done, unless that
  // was done already since the tables were made.
  Status ExpireLocked(uint32_t passes_done) ABSL_SHARED_LOCKS_REQUIRED(state_mu_)
      ABSL_LOCKS_EXCLUDED(expire_mu_, mu_);

  const StorageOptions options_;
  // Guards what Restore swaps. Held shared by flushes, checkpoints, stats()
  // and table() (a flush holds it across its writes); exclusively only for
  // the moments Restore takes the old state out and puts the new one in.
  mutable absl::Mutex state_mu_;
  std::unique_ptr<KvStore> store_ ABSL_GUARDED_BY(state_mu_);
  std::unique_ptr<WriteQueue> queue_ ABSL_GUARDED_BY(state_mu_);
  std::unique_ptr<MemoryBudget> budget_ ABSL_GUARDED_BY(state_mu_);
  std::vector<std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(state_mu_);
  proto::JobSpec job_ ABSL_GUARDED_BY(state_mu_);  // set by CreateTables
  Status broken_ ABSL_GUARDED_BY(state_mu_);       // see status()
  // Started by CreateTables, stopped and restarted by Restore, joined by the
  // destructor (never concurrently: see the thread-safety note).
  std::thread flusher_;
  // With expiry: started, stopped and joined as the flusher.
  std::thread expirer_;
  // The training pass in progress, for the tables (TableStorage.pass).
  std::atomic<uint32_t> pass_{0};
  // Serialises sweeps (the expirer's and an export's). Taken after state_mu_.
  absl::Mutex expire_mu_ ABSL_ACQUIRED_AFTER(state_mu_);
  // Serialises flushes and checkpoints. Taken after state_mu_.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_AFTER(state_mu_, expire_mu_);

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(flush_mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool tables_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint32_t> server_id_ ABSL_GUARDED_BY(mu_);
  double last_flush_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flushes_ ABSL_GUARDED_BY(mu_) = 0;
  // See write_error(); latched by write_error() itself from the queue.
  mutable std::string write_error_ ABSL_GUARDED_BY(mu_);
  // The updates_refused of the tables Restore dropped.
  uint64_t dropped_updates_refused_ ABSL_GUARDED_BY(mu_) = 0;
  // Expiry: the passes done as last told, those the last sweep of these
  // tables was for (reset when Restore makes new ones), rows deleted.
  // Unknown (nullopt) from a start or a restore until the master says:
  // a restored server must not expire by the pass count of before it.
  std::optional<uint32_t> passes_due_ ABSL_GUARDED_BY(mu_);
  std::optional<uint32_t> swept_through_ ABSL_GUARDED_BY(mu_);
  // The passes done whose background sweep failed: the expirer waits for
  // the next pass, but the export sweeps again (a failed sweep is no sweep).
  std::optional<uint32_t> failed_through_ ABSL_GUARDED_BY(mu_);
  uint64_t rows_expired_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace eps

#endif  // EPS_PS_STORAGE_H_
