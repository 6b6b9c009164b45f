// Table: one embedding table or dense tensor held by a parameter server.
//
// Rows are keyed by the exact 64-bit key (feature id, or DenseChunkKey for
// dense chunks), created on first touch by the table's initializer, and
// updated by the table's optimizer. Under admission
// (TableSpec.admission_min_count >= 2) a row is made only by the push that
// admits its id (ps/admission.h): pulls of an id without a row read its
// initializer's values, and pushes to it are dropped until then. A row is
// its weights followed by its optimizer state (row_floats()).
//
// Expiry (TableSpec.ttl_passes >= 1): each row also keeps the last training
// pass (0-based epoch) that pushed to it, after its optimizer state
// (stored_floats() = row_floats() + 1; a new row counts as pushed in the
// pass in progress, a warm start's rows in the pass before the job's first).
// Expire(D), once D passes are done, deletes every row last pushed in a
// pass p with p + ttl_passes < D (untrained for ttl_passes passes), from
// memory and from the store.
//
// Hot tier: 64 lock stripes (by key hash), each an open-addressing index
// (8-byte entries: a hash tag and a slot) over an arena of fixed-size rows
// with 16 bytes of metadata per row; no allocation per row, rows never move.
//
// Cold tier and store of record (optional, TableStorage.store): a KvStore.
// Changed rows are queued to it (in order, through the server's WriteQueue)
// by the flusher at least every ps.flush_interval_ms, or on every push with
// ps.durability = every_push, where a push returns only once its rows are
// durable. With a journaled queue (ps/journal.h) those images go to the
// journal only, and a full flush queues the rows the store lacks for the
// store. Over the memory budget, rows whose latest image is in the store leave
// memory (GCLOCK order: a small use count per row); a miss reads them back with one MultiGet per
// request, outside the stripe lock. A table made over an empty store table
// asks the store nothing about a stripe's keys until the stripe first drops
// a row: until then every stored row of it is also in memory, so a key it
// does not hold is new.
//
// Thread-safety: safe for concurrent use. Stripe locks are held only for
// in-memory work, never across store reads or writes.

#ifndef EPS_PS_TABLE_H_
#define EPS_PS_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/time/time.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

class KvStore;
class WriteQueue;

// The hot-tier memory all tables of a server share.
class MemoryBudget {
 public:
  // `limit_bytes` <= 0 means unlimited.
  explicit MemoryBudget(int64_t limit_bytes) : limit_(limit_bytes) {}
  void Add(int64_t bytes) { used_.fetch_add(bytes, std::memory_order_relaxed); }
  bool over() const { return limit_ > 0 && used_.load(std::memory_order_relaxed) > limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

struct TableStorage {
  // Cold tier and store of record; null keeps every row in memory only.
  KvStore* store = nullptr;
  // The job's partitions: a new store table groups its rows by them, so
  // that a partition move reads one range of it (KvStore::CreateTable).
  uint32_t partitions = 0;
  // Required with `store`: the ordered path to it.
  WriteQueue* queue = nullptr;
  // Shared hot-tier budget; null is unlimited. Only rows already durable in
  // `store` can be evicted, so a budget needs a store.
  MemoryBudget* budget = nullptr;
  // Queue rows on every push and return only when they are durable.
  bool write_every_push = false;
  // How long a push waits for durability before failing.
  absl::Duration durability_timeout = absl::Seconds(30);
  // Under admission (TableSpec.admission_min_count): the new ids counted at
  // most (ps/admission.h).
  uint64_t admission_candidates = uint64_t{1} << 20;
  // Under expiry (TableSpec.ttl_passes): the training pass in progress (the
  // passes done), for rows pushed without naming their pass; null is 0.
  const std::atomic<uint32_t>* pass = nullptr;
};

struct TableStats {
  uint64_t rows_in_memory = 0;
  uint64_t memory_bytes = 0;  // arenas, metadata and indexes
  uint64_t hits = 0;          // row lookups served from memory
  uint64_t misses = 0;        // lookups that went to the store
  uint64_t evictions = 0;
  // Row updates refused because they would have made a weight or an
  // optimizer state non-finite (the row kept its values; ps/optimizer.h).
  uint64_t updates_refused = 0;
  // Under admission (TableSpec.admission_min_count): rows made by a push
  // that admitted their id, pushed rows dropped because their id was not
  // admitted (yet), and the ids being counted now.
  uint64_t rows_admitted = 0;
  uint64_t updates_rejected = 0;
  uint64_t admission_candidates = 0;
  // Under expiry (TableSpec.ttl_passes): rows Expire deleted.
  uint64_t rows_expired = 0;
};

class Table {
 public:
  // kInvalidArgument when the spec is unusable (ValidateTableSpec in
  // cluster/job_spec_check.h), naming the table; kUnavailable when the store cannot make
  // the table's column family.
  static StatusOr<std::unique_ptr<Table>> Create(const proto::TableSpec& spec, uint64_t seed,
                                                 const TableStorage& storage = {});
  virtual ~Table() = default;

  virtual const proto::TableSpec& spec() const = 0;
  uint32_t dim() const { return spec().dim(); }

  // Copies the weights of each key into out[i*dim, (i+1)*dim), reading
  // rows from the store or creating them when missing. Duplicate keys are
  // allowed. `*created` (when given) gets the rows the call created (in
  // neither memory nor the store), even when it fails. kUnavailable/kDataLoss
  // when the store fails. REQUIRES: out.size() == keys.size() * dim().
  virtual Status Pull(std::span<const uint64_t> keys, std::span<float> out,
                      uint64_t* created) = 0;
  Status Pull(std::span<const uint64_t> keys, std::span<float> out) {
    return Pull(keys, out, nullptr);
  }

  // Applies grads[i*dim, (i+1)*dim) to key i with the optimizer, fetching or
  // creating missing rows first. Duplicate keys are applied one after the
  // other. A row whose update the optimizer refuses (it would make a value
  // non-finite) keeps its values and is counted in stats().updates_refused;
  // the push still succeeds. With write_every_push, returns once the rows are durable
  // (kDeadlineExceeded after durability_timeout). Errors as Pull.
  // `lr_scale` multiplies the optimizer's learning rate for these updates
  // (Optimizer::Apply). `created` as Pull's. `pass` is 1 + the training
  // pass the gradients come from (0: the pass in progress), for expiry.
  // REQUIRES: grads.size() == keys.size() * dim(), lr_scale finite and > 0.
  virtual Status Push(std::span<const uint64_t> keys, std::span<const float> grads,
                      float lr_scale, uint64_t* created, uint32_t pass) = 0;
  Status Push(std::span<const uint64_t> keys, std::span<const float> grads, float lr_scale) {
    return Push(keys, grads, lr_scale, nullptr, 0);
  }
  Status Push(std::span<const uint64_t> keys, std::span<const float> grads) {
    return Push(keys, grads, 1.0f, nullptr, 0);
  }

  // Sets the rows of `keys`, as changed rows (a warm start's import, or a
  // moved partition's rows): each to its `width` floats of `values`, the
  // weights and then, with width == row_floats(), the optimizer state, and
  // with width == stored_floats() the pass too; with width == dim(), the
  // state a new row starts with. Errors as Push. REQUIRES: width is dim(),
  // row_floats() or stored_floats(), values.size() == keys.size() * width,
  // keys distinct.
  virtual Status Put(std::span<const uint64_t> keys, std::span<const float> values,
                     uint32_t width) = 0;

  // Queues every row changed since it was last queued for the store;
  // returns the sequence number to wait for (WriteQueue::WaitDurable), 0
  // when nothing was queued. With `journal_only` and a journaled queue,
  // queues instead every row changed since it was last queued at all, for
  // the journal only: such a row stays in memory until queued for the store.
  // Without a store, does nothing and returns 0.
  virtual uint64_t QueueDirtyRows(bool journal_only) = 0;
  uint64_t QueueDirtyRows() { return QueueDirtyRows(/*journal_only=*/false); }

  // Evicts rows whose latest image is durable (GCLOCK order, evenly across
  // the stripes) until the memory budget holds or no such row is left;
  // returns how many. Requests evict only about as many rows as they touch,
  // so call this once rows written by a flush are durable: the rows that
  // could not leave memory while dirty leave now. Does no I/O; no-op
  // without a budget.
  virtual uint64_t EvictToBudget() = 0;

  // Deletes the rows that expired once `passes_done` training passes are
  // done (see above): those in memory that are not waiting to be written,
  // and those only in the store (read by one streaming Scan), queueing the
  // store's deletions in order with its writes; returns how many, once
  // they are durable. A row pushed while it is being deleted may stay (or
  // start again from its initializer). Returns 0 at once without expiry.
  // The store's errors (kUnavailable, kDataLoss naming the table).
  virtual StatusOr<uint64_t> Expire(uint32_t passes_done) = 0;

  // Floats per row in the model: dim() weights, then the optimizer's state.
  virtual uint32_t row_floats() const = 0;
  // Floats per row in memory and the store: row_floats(), then under
  // expiry the row's last pass (an int32's bits).
  virtual uint32_t stored_floats() const = 0;
  // Calls visit(key, row) (row_floats() floats) for every row held in
  // memory, stripe by stripe under each stripe's lock: rows pushed to
  // meanwhile may be seen before or after the push. Rows only in the store
  // are not visited (a table without a store holds every row in memory).
  virtual void VisitResident(const std::function<void(uint64_t key, const float* row)>& visit) = 0;

  // Copies each key's current row as stored (stored_floats() floats: the
  // weights, the optimizer state and under expiry the pass) into
  // out[i*stored_floats(), ...), from memory or else the store, and sets
  // found[i]; a key in neither has no row (found false, its floats
  // untouched). Makes no row. Errors as Pull.
  // REQUIRES: out.size() == keys.size() * stored_floats().
  virtual Status Read(std::span<const uint64_t> keys, std::span<float> out,
                      std::vector<bool>* found) = 0;
  // Calls visit(key) for every row held in memory whose latest image the
  // store may lack: changed since it was last queued for the store, or
  // queued and not yet durable. Stripe by stripe under each stripe's lock;
  // none without a store.
  virtual void VisitUnstored(const std::function<void(uint64_t key)>& visit) = 0;

  // Rows held in memory.
  uint64_t num_rows() const { return stats().rows_in_memory; }
  // Bytes of memory held (arenas, metadata and indexes).
  uint64_t memory_bytes() const { return stats().memory_bytes; }
  virtual TableStats stats() const = 0;
  // Bytes one resident row costs on average (row, metadata, index share).
  virtual uint64_t bytes_per_row() const = 0;
};

}  // namespace eps

#endif  // EPS_PS_TABLE_H_
