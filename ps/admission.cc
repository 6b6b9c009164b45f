#include "ps/admission.h"

#include <algorithm>

#include "core/hashing.h"
#include "core/logging.h"

namespace eps {

AdmissionFilter::AdmissionFilter(uint32_t min_count, uint64_t max_candidates)
    : min_count_(min_count),
      shard_capacity_(std::max<uint64_t>(1, max_candidates / kShards)),
      shards_(std::make_unique<Shard[]>(kShards)) {
  CHECK_GE(min_count, 2u);
}

bool AdmissionFilter::Sight(uint64_t key) {
  // Not the table's stripe hash: the shards stay balanced whatever it is.
  Shard& shard = shards_[Mix64(key ^ 0x61646d6974ULL) % kShards];
  absl::MutexLock lock(&shard.mu);
  auto [it, inserted] = shard.counts.try_emplace(key, 0);
  if (++it->second >= min_count_) {
    shard.counts.erase(it);
    return true;
  }
  if (inserted && shard.counts.size() > shard_capacity_) {
    forgotten_.fetch_add(shard.counts.size() - 1, std::memory_order_relaxed);
    shard.counts.clear();
    shard.counts.emplace(key, 1);
  }
  return false;
}

uint64_t AdmissionFilter::candidates() const {
  uint64_t total = 0;
  for (int s = 0; s < kShards; ++s) {
    absl::MutexLock lock(&shards_[s].mu);
    total += shards_[s].counts.size();
  }
  return total;
}

}  // namespace eps
