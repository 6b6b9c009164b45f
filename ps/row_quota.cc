#include "ps/row_quota.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rpc/message.h"

namespace eps {

Status RowQuota::Admit(uint32_t worker) {
  // Every pull and push asks: once no worker creates rows, no lock.
  if (kept_.load(std::memory_order_relaxed) == 0 && total_full_.load(std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (total_rows_s_ > 0 && !total_full_.load(std::memory_order_relaxed)) {
    total_.Refill(now);
    if (total_.full()) {
      total_full_.store(true, std::memory_order_relaxed);
    } else if (total_.tokens() <= 0) {
      return ErrorWithReason(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("the workers together created more than ps.max_new_rows_s = ",
                       total_rows_s_, " rows per second on this server; retry after a pause"),
          proto::SLOW_DOWN);
    }
  }
  auto it = buckets_.find(worker);
  if (it == buckets_.end()) return absl::OkStatus();  // full
  it->second.Refill(now);
  if (it->second.full()) {
    buckets_.erase(it);  // as good as new
    kept_.store(buckets_.size(), std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (it->second.tokens() > 0) return absl::OkStatus();
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
    total_.Refill(now);
    total_.Spend(static_cast<double>(rows));
    total_full_.store(false, std::memory_order_relaxed);
  }
  if (rows_per_s_ == 0) return;
  const double per_s = static_cast<double>(rows_per_s_);
  TokenBucket& bucket = buckets_.try_emplace(worker, TokenBucket(per_s, per_s, now)).first->second;
  bucket.Refill(now);
  bucket.Spend(static_cast<double>(rows));
  // Forget the buckets that have refilled: they are as good as new.
  constexpr size_t kSweepAbove = 1024;
  if (buckets_.size() > kSweepAbove) {
    absl::erase_if(buckets_, [&](auto& entry) {
      entry.second.Refill(now);
      return entry.second.full();
    });
  }
  kept_.store(buckets_.size(), std::memory_order_relaxed);
}

size_t RowQuota::workers_kept() const {
  absl::MutexLock lock(&mu_);
  return buckets_.size();
}

}  // namespace eps
