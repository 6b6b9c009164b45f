// GlobalBatch: one dense table's global batch on one parameter server
// (issue 51; docs/accuracy.md, "One model whatever the number of workers").
// Workers push the gradient of their batch's mean loss, with the batch's
// record count and the table's version they computed it on (global steps
// of this server, as their pull said). Instead of one optimizer step per
// push, the server adds each push to a running sum weighted by its records
// and, once `records` records are in, applies their mean in one step: the
// model sees one batch of `records` whichever workers sent it, so adding a
// worker makes a global step faster, not different (the GBA rule: Alibaba,
// NeurIPS 2022).
//
//   filling(v, r)  --Add, based on v-s with s <= max_staleness--> filling(v, r + n)
//     |                               (its gradient times 1 / (1 + s))
//     |--Add, s > max_staleness--> filling(v, r)       (dropped, counted)
//     |--r >= records: ready()--Take()--> filling(v + 1, 0)
//     |--Take() before ready() (a checkpoint pause, a hand-off)--> filling(v + 1, 0)
//     |                               (the part in hand, applied whole)
//     \--Reset() (a restore)--> filling(v, 0)
//
// Staleness: a push computed on version v - s, s global steps old, is
// dropped, its records uncounted, once s > max_staleness (by default once
// s > 0); within the bound it counts its records towards the batch and its
// gradient is scaled by 1 / (1 + s) (Zhang et al., "Staleness-aware
// async-SGD", IJCAI 2016) unless decay is off. A version ahead of this
// unit's (a push computed before this server restarted or restored) is
// taken as fresh. Pushes are deduplicated before they reach the unit
// (ps/worker_gate.h): each Add is a distinct push, applied once, whole or
// not at all. A worker that dies or is fenced leaves what it added: it was
// receipted, and its records count as trained.
//
// Per key: a push may carry only some of the table's keys on this server
// (a partition moving away); each key's mean divides its sum by the records
// of the pushes that carried it.
//
// No clock, no I/O, no lock.
//
// Thread-safety: not thread-safe; the server guards each table's unit with
// a mutex of its own.

#ifndef EPS_PS_GLOBAL_BATCH_H_
#define EPS_PS_GLOBAL_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/status.h"

namespace eps {

class GlobalBatch {
 public:
  struct Options {
    // Records per global step, > 0.
    uint64_t records = 0;
    // Floats per key (the table's dim), > 0.
    size_t dim = 0;
    // Global steps a push may be behind and still count. Default 0: a
    // gradient computed on an older version is dropped. Measured (DLRM, 4
    // workers, docs/accuracy.md): dropping beat 1 with decay by 0.003 to
    // 0.006 AUC, and 1 or 3 without decay by 0.004.
    uint32_t max_staleness = 0;
    // Whether a push s steps behind (s <= max_staleness) has its gradient
    // scaled by 1 / (1 + s).
    bool decay = true;
  };
  // A push to the table, as the server decoded it.
  struct Push {
    std::span<const uint64_t> keys;
    std::span<const float> grads;  // keys.size() * dim
    uint32_t records = 0;          // of the batch whose mean loss it is
    uint64_t based_on = 0;         // the version it was computed on
  };
  enum class Outcome { kAdded, kDropped };
  // One optimizer step: the keys and their mean gradients, in the order
  // the keys first came.
  struct Step {
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    uint64_t records = 0;  // counted towards it
    uint64_t version = 0;  // the version it makes
  };
  struct Stats {
    uint64_t steps = 0;            // global steps taken
    uint64_t step_records = 0;     // averaged by them
    uint64_t pushes = 0;           // added
    uint64_t pushes_decayed = 0;   // added with a decayed gradient
    uint64_t pushes_dropped = 0;   // too stale
    uint64_t records_dropped = 0;  // in the dropped ones
  };

  // `version` is the table's version to start from (0 for a new table).
  GlobalBatch(const Options& options, uint64_t version = 0);

  // kInvalidArgument for grads that are not keys.size() * dim floats or a
  // push of no record (nothing is added).
  StatusOr<Outcome> Add(const Push& push);
  // The records added reach the global batch: Take() the step.
  bool ready() const { return records_ >= options_.records; }
  // The step of the records added, which the caller applies with the
  // table's optimizer; the version rises by one and the sum is empty.
  // Call only when ready(), or to flush with records_in_hand() > 0.
  Step Take();
  // Forgets what was added since the last step (a restore: those pushes
  // are gone with the rest); the version stays.
  void Reset();
  // Records added since the last step.
  uint64_t records_in_hand() const { return records_; }
  uint64_t version() const { return version_; }
  const Stats& stats() const { return stats_; }

 private:
  const Options options_;
  uint64_t version_;
  uint64_t records_ = 0;
  // Per key: its slot in sums_ and records_by_slot_.
  absl::flat_hash_map<uint64_t, size_t> slots_;
  std::vector<uint64_t> keys_;              // by slot
  std::vector<float> sums_;                 // by slot, dim floats each: records x gradient
  std::vector<uint64_t> records_by_slot_;  // by slot
  Stats stats_;
};

}  // namespace eps

#endif  // EPS_PS_GLOBAL_BATCH_H_
