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
// Reservations make it synchronous without a barrier: a worker that reads
// the version being filled (a pull, or a push's rows) holds a reservation
// of its batch's records until its push on that version arrives. A read is
// refused (the worker asks again shortly) while the records in plus those
// reserved fill the batch, and the step waits until no reservation is
// outstanding; so every gradient the batch was counting on arrives before
// it steps, and none is dropped as stale. A reservation older than its
// bound (hold_factor times the mean read-to-push time, clamped) is given up:
// a dead, fenced or frozen worker delays one step by at most the bound, and
// the others fill its share. Refused readers queue in the order of their
// first refusal: a reader is let in only if the room left also covers
// those before it, so a fast worker cannot starve a slow one. A reader
// another server already let in (so that two servers that each admitted a
// different worker do not keep both waiting) is let in over the batch, up
// to twice its records. A checkpoint's or hand-off's flush drops every
// reservation: the workers, paused, read again.
//
//   filling(v, r, H)  --MayRead(w) && Hold(w): r + reserved(H) < records
//     |                 (or w in H)--> filling(v, r, H + w)
//     |--Add(w), based on v-s with s <= max_staleness--> filling(v, r + n, H - w)
//     |                               (its gradient times 1 / (1 + s))
//     |--Add(w), s > max_staleness--> filling(v, r, H - w)   (dropped, counted)
//     |--a reservation older than its bound--> filling(v, r, H - w)  (expired)
//     |--DropReservations() (a flush)--> filling(v, r, {})
//     |--r >= records, H empty: ready()--Take()--> filling(v + 1, 0, {})
//     |--Take() before ready() (a checkpoint pause, a hand-off)--> filling(v + 1, 0, {})
//     |                               (the part in hand, applied whole)
//     \--Reset() (a restore)--> filling(v, 0, {})
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
// No clock (the caller passes the time in ms), no I/O, no lock.
//
// Thread-safety: not thread-safe; the server guards each table's unit with
// a mutex of its own.

#ifndef EPS_PS_GLOBAL_BATCH_H_
#define EPS_PS_GLOBAL_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
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
    // The bound on a reservation: hold_factor times the mean time from a
    // read to its push (an exponential average), within [min_hold_ms,
    // max_hold_ms]; max_hold_ms until a push has measured it.
    int64_t hold_factor = 4;
    int64_t min_hold_ms = 50;
    int64_t max_hold_ms = 10000;
    // The bound until a push has measured the mean.
    int64_t first_hold_ms = 2000;
    // A refused reader that has not asked again for this long no longer
    // queues (it died, or took another way).
    int64_t waiter_ms = 1000;
  };
  // A push to the table, as the server decoded it.
  struct Push {
    std::span<const uint64_t> keys;
    std::span<const float> grads;  // keys.size() * dim
    uint32_t records = 0;          // of the batch whose mean loss it is
    uint64_t based_on = 0;         // the version it was computed on
    std::optional<uint64_t> worker;  // the pusher, whose reservation ends (none: no reservation)
    int64_t at_ms = 0;             // when it arrived
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
    uint64_t reads_refused = 0;          // MayRead said no (full)
    uint64_t reservations_expired = 0;   // given up after their bound
  };

  // `version` is the table's version to start from (0 for a new table).
  GlobalBatch(const Options& options, uint64_t version = 0);

  // kInvalidArgument for grads that are not keys.size() * dim floats or a
  // push of no record (nothing is added).
  StatusOr<Outcome> Add(const Push& push);
  // Whether `worker` may compute on the version being filled: it holds a
  // reservation, or the records in plus those reserved plus those of the
  // waiters queued before it leave room (with `held_elsewhere`: the
  // records in plus reserved are below twice the batch). A refusal queues
  // it. Expired reservations are given up first.
  bool MayRead(uint64_t worker, int64_t now_ms, bool held_elsewhere = false);
  // Gives `worker` a reservation of its batch (its last push's records, or
  // the mean push's until it pushed) on the version being filled, from
  // now_ms unless it holds one already. Call after MayRead said yes.
  void Hold(uint64_t worker, int64_t now_ms);
  // The records added reach the global batch and no reservation is
  // outstanding (expired ones given up): Take() the step.
  bool ready(int64_t now_ms);
  // Gives up every reservation, uncounted (a flush: the workers are
  // paused and read again); the waiters keep their turn.
  void DropReservations() { holders_.clear(); }
  // Reservations outstanding, and the bound on one now.
  size_t holders() const { return holders_.size(); }
  int64_t hold_bound_ms() const;
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
  // Gives up reservations older than the bound, and forgets waiters.
  void Expire(int64_t now_ms);
  // The records `worker`'s reservation stands for.
  uint64_t Expected(uint64_t worker) const;

  const Options options_;
  uint64_t version_;
  // Reservations: worker -> when it read the version being filled.
  absl::flat_hash_map<uint64_t, int64_t> holders_;
  // Refused readers: worker -> when it was first refused, and last asked.
  struct Waiter {
    int64_t first_ms = 0;
    int64_t last_ms = 0;
  };
  absl::flat_hash_map<uint64_t, Waiter> waiters_;
  // Per worker, the records of its last push.
  absl::flat_hash_map<uint64_t, uint32_t> last_records_;
  uint64_t records_pushed_ = 0;  // over every push added
  double hold_mean_ms_ = 0;      // 0: not measured yet
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
