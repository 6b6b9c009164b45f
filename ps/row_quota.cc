#include "ps/row_quota.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rpc/message.h"

namespace eps {

void RowQuota::RefillLocked(Bucket& bucket, absl::Time now) const {
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - bucket.refilled));
  bucket.tokens = std::min<double>(static_cast<double>(rows_per_s_),
                                   bucket.tokens + elapsed * static_cast<double>(rows_per_s_));
  bucket.refilled = now;
}

Status RowQuota::Admit(uint32_t worker) {
  // Every pull and push asks: once no worker creates rows, no lock.
  if (rows_per_s_ == 0 || kept_.load(std::memory_order_relaxed) == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(worker);
  if (it == buckets_.end()) return absl::OkStatus();  // full
  RefillLocked(it->second, clock_->Now());
  if (it->second.tokens >= static_cast<double>(rows_per_s_)) {
    buckets_.erase(it);  // as good as new
    kept_.store(buckets_.size(), std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (it->second.tokens > 0) return absl::OkStatus();
  return ErrorWithReason(
      absl::StatusCode::kResourceExhausted,
      absl::StrCat("worker ", worker, " created more than ps.max_new_rows_per_worker_s = ",
                   rows_per_s_, " rows per second on this server; retry after a pause"),
      proto::SLOW_DOWN);
}

void RowQuota::Charge(uint32_t worker, uint64_t rows) {
  if (rows_per_s_ == 0 || rows == 0) return;
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto [it, added] =
      buckets_.try_emplace(worker, Bucket{static_cast<double>(rows_per_s_), now});
  if (!added) RefillLocked(it->second, now);
  it->second.tokens -= static_cast<double>(rows);
  // Forget the buckets that have refilled: they are as good as new.
  constexpr size_t kSweepAbove = 1024;
  if (buckets_.size() > kSweepAbove) {
    absl::erase_if(buckets_, [&](auto& entry) {
      RefillLocked(entry.second, now);
      return entry.second.tokens >= static_cast<double>(rows_per_s_);
    });
  }
  kept_.store(buckets_.size(), std::memory_order_relaxed);
}

size_t RowQuota::workers_kept() const {
  absl::MutexLock lock(&mu_);
  return buckets_.size();
}

}  // namespace eps
