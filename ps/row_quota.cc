#include "ps/row_quota.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rpc/message.h"

namespace eps {

void RowQuota::Refill(Bucket& bucket, uint64_t capacity, absl::Time now) {
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - bucket.refilled));
  bucket.tokens = std::min<double>(static_cast<double>(capacity),
                                   bucket.tokens + elapsed * static_cast<double>(capacity));
  bucket.refilled = now;
}

Status RowQuota::Admit(uint32_t worker) {
  // Every pull and push asks: once no worker creates rows, no lock.
  if (kept_.load(std::memory_order_relaxed) == 0 && total_full_.load(std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (total_rows_s_ > 0 && !total_full_.load(std::memory_order_relaxed)) {
    Refill(total_, total_rows_s_, now);
    if (total_.tokens >= static_cast<double>(total_rows_s_)) {
      total_full_.store(true, std::memory_order_relaxed);
    } else if (total_.tokens <= 0) {
      return ErrorWithReason(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("the workers together created more than ps.max_new_rows_s = ",
                       total_rows_s_, " rows per second on this server; retry after a pause"),
          proto::SLOW_DOWN);
    }
  }
  auto it = buckets_.find(worker);
  if (it == buckets_.end()) return absl::OkStatus();  // full
  Refill(it->second, rows_per_s_, now);
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
  if ((rows_per_s_ == 0 && total_rows_s_ == 0) || rows == 0) return;
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (total_rows_s_ > 0) {
    if (total_full_.load(std::memory_order_relaxed)) {
      total_ = Bucket{static_cast<double>(total_rows_s_), now};
    } else {
      Refill(total_, total_rows_s_, now);
    }
    total_.tokens -= static_cast<double>(rows);
    total_full_.store(false, std::memory_order_relaxed);
  }
  if (rows_per_s_ == 0) return;
  auto [it, added] =
      buckets_.try_emplace(worker, Bucket{static_cast<double>(rows_per_s_), now});
  if (!added) Refill(it->second, rows_per_s_, now);
  it->second.tokens -= static_cast<double>(rows);
  // Forget the buckets that have refilled: they are as good as new.
  constexpr size_t kSweepAbove = 1024;
  if (buckets_.size() > kSweepAbove) {
    absl::erase_if(buckets_, [&](auto& entry) {
      Refill(entry.second, rows_per_s_, now);
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
