// PushDeduplicator: remembers which pushes each worker has had applied, so
// that a retried push (the same request re-sent after a lost reply) is
// applied once.
//
// A worker's push client numbers its PUSH requests with a rising per-client
// sequence number (PushRequest.client_seq, 1, 2, 3, ...) and a retry
// re-sends the same request with the same number. The server asks
// FirstTime(worker, seq) after validating a push and applies it only when
// the answer is true. Check and record are one atomic step, so of two
// deliveries of the same request arriving at once exactly one is applied.
// "Applied once" means once per server process: the state lives in memory.
//
// Per worker only a window of the kWindow most recent sequence numbers is
// remembered (a fixed bitmap of kWindow bits, whatever the sequence numbers
// are). A number at or below `highest seen - kWindow` is answered false, as
// if already applied: such a push arrives after kWindow later pushes of
// the same client, which a client that waits for its pushes never does; so
// the window bounds memory at the cost of dropping a push delayed that
// much. A worker's memory is freed by Forget (the server calls it when the
// worker is fenced: nothing it sends is applied again).
//
// Thread-safety: safe for concurrent use. Workers are spread over kStripes
// stripes, each with its own mutex, so pushes of different workers rarely
// contend; no lock is held across anything but a few memory operations.

#ifndef EPS_PS_PUSH_DEDUPLICATOR_H_
#define EPS_PS_PUSH_DEDUPLICATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace eps {

class PushDeduplicator {
 public:
  // Sequence numbers remembered per worker (a power of two).
  static constexpr uint64_t kWindow = uint64_t{1} << 16;

  PushDeduplicator() = default;
  PushDeduplicator(const PushDeduplicator&) = delete;
  PushDeduplicator& operator=(const PushDeduplicator&) = delete;

  // True exactly once per (worker, seq): the first call records seq and
  // answers true, every later one answers false. seq 0 means "no sequence
  // number" and is always true (never recorded). A seq at or below the
  // worker's highest seen minus kWindow is false (treated as applied). Never
  // blocks beyond a stripe lock held for a few memory operations.
  bool FirstTime(uint32_t worker, uint64_t seq);

  // Whether FirstTime(worker, seq) would answer false now, without
  // recording anything.
  bool Seen(uint32_t worker, uint64_t seq) const;
  // Drops everything remembered about `worker`; its next seq is new again.
  // No-op for an unknown worker.
  void Forget(uint32_t worker);

  // Workers with remembered sequence numbers.
  size_t workers() const;
  // Bytes held for the remembered sequence numbers (for stats and tests).
  size_t memory_bytes() const;

 private:
  static constexpr size_t kStripes = 16;

  // One worker's window: bit (s % kWindow) is set when s was seen, for s in
  // (highest - kWindow, highest]; bits of older numbers are cleared as
  // highest advances.
  struct Window {
    uint64_t highest = 0;
    std::array<uint64_t, kWindow / 64> bits{};
  };

  struct Stripe {
    mutable absl::Mutex mu;
    absl::flat_hash_map<uint32_t, std::unique_ptr<Window>> windows ABSL_GUARDED_BY(mu);
  };

  Stripe& StripeOf(uint32_t worker) { return stripes_[worker % kStripes]; }
  const Stripe& StripeOf(uint32_t worker) const { return stripes_[worker % kStripes]; }

  std::array<Stripe, kStripes> stripes_;
};

}  // namespace eps

#endif  // EPS_PS_PUSH_DEDUPLICATOR_H_
