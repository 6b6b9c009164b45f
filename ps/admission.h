// AdmissionFilter: which new feature ids earn a row (ps.admission_min_count).
//
// A feature id without a row is a candidate: the filter counts the pushes
// that name it, and admits it (a row is made and the push applied) at its
// min_count-th; until then its gradients are dropped and it reads as its
// initializer makes it. Counts are exact per candidate, in bounded memory:
// at most `max_candidates` ids are counted, in 64 shards; a shard that
// fills up forgets its candidates, which start counting again. So an id is
// never admitted before min_count sightings, and may need more when more
// ids than max_candidates wait at once. Counts live in memory only: a
// restarted server counts afresh.
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_PS_ADMISSION_H_
#define EPS_PS_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace eps {

class AdmissionFilter {
 public:
  // REQUIRES: min_count >= 2, max_candidates >= 64.
  AdmissionFilter(uint32_t min_count, uint64_t max_candidates);

  // One push names `key`, which has no row: true when this sighting admits
  // it (the key is then no longer a candidate).
  bool Sight(uint64_t key);

  uint32_t min_count() const { return min_count_; }
  // Ids counted now, and candidates forgotten because a shard was full.
  uint64_t candidates() const;
  uint64_t forgotten() const { return forgotten_.load(std::memory_order_relaxed); }
  // Bytes one candidate takes at most (the hash map's slot and control
  // byte at its lowest load), for sizing from a memory budget.
  static constexpr uint64_t kBytesPerCandidate = 40;

 private:
  static constexpr int kShards = 64;
  struct alignas(64) Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<uint64_t, uint32_t> counts ABSL_GUARDED_BY(mu);
  };
  const uint32_t min_count_;
  const uint64_t shard_capacity_;
  std::unique_ptr<Shard[]> shards_;
  std::atomic<uint64_t> forgotten_{0};
};

}  // namespace eps

#endif  // EPS_PS_ADMISSION_H_
