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
//               store's WAL (group commit: concurrent pushes share one
//               write); a crash loses no acknowledged push. The WAL is not
//               fsynced per push: a machine crash (not a process crash) may
//               still lose the last writes the OS had not flushed.
//
// Checkpoints: Checkpoint(N) flushes, then writes a RocksDB checkpoint into
// DATA_DIR/checkpoints/N and keeps the newest `keep_checkpoints`. A server
// started with restore_checkpoint = N replaces its database by that
// checkpoint before opening it.
//
// Thread-safety: safe for concurrent use once Open returns.

#ifndef EPS_PS_STORAGE_H_
#define EPS_PS_STORAGE_H_

#include <cstdint>
#include <map>
#include <memory>
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
  // Acknowledge pushes only once durable. Default false ("flush").
  bool every_push = false;
  // RocksDB block cache and memtable sizes, MiB. Defaults 8 and 4.
  int64_t block_cache_mb = 8;
  int64_t write_buffer_mb = 4;
  // Checkpoints kept in DATA_DIR/checkpoints. Default 3.
  int keep_checkpoints = 3;
  // Checkpoint id to restore before opening; empty restores nothing.
  std::string restore_checkpoint;
  // Longest wait of a push for durability. Default 30 s.
  absl::Duration durability_timeout = absl::Seconds(30);

  Status Validate() const;
};

struct StorageStats {
  uint64_t rows_in_memory = 0;
  uint64_t rows_on_disk = 0;  // approximate
  uint64_t memory_bytes = 0;
  uint64_t disk_bytes = 0;    // approximate
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  double last_flush_ms = 0;   // queueing + writing of the last flush
  uint64_t flushes = 0;
};

struct CheckpointInfo {
  std::string path;
  uint64_t bytes = 0;
  absl::Duration duration;
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
  // Table `id`, or null.
  Table* table(uint32_t id) const;
  size_t num_tables() const;

  // Queues every changed row and waits until it is durable, then evicts
  // durable rows while over the memory budget. No-op without a store.
  // Errors of the queue (kUnavailable; kDeadlineExceeded after
  // durability_timeout).
  Status Flush();
  // Flush + checkpoint `id` into DATA_DIR/checkpoints/<id>, then drops all
  // but the newest keep_checkpoints. kFailedPrecondition without a store,
  // kAlreadyExists when that checkpoint exists.
  StatusOr<CheckpointInfo> Checkpoint(uint64_t id);

  // The job (DATA_DIR/JOB: "id name") whose parameters the data dir holds;
  // empty for a fresh or memory-only store.
  std::string stored_job() const;

  StorageStats stats() const;
  const StorageOptions& options() const { return options_; }

 private:
  explicit ServerStorage(const StorageOptions& options);
  void FlushLoop();

  const StorageOptions options_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<WriteQueue> queue_;
  std::unique_ptr<MemoryBudget> budget_;
  std::vector<std::unique_ptr<Table>> tables_;  // set once by CreateTables
  std::thread flusher_;
  // Serialises flushes and checkpoints.
  absl::Mutex flush_mu_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool tables_ready_ ABSL_GUARDED_BY(mu_) = false;
  double last_flush_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flushes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace eps

#endif  // EPS_PS_STORAGE_H_
