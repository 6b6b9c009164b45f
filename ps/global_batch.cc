#include "ps/global_batch.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

GlobalBatch::GlobalBatch(const Options& options, uint64_t version)
    : options_(options), version_(version) {
  CHECK_GT(options_.records, 0u);
  CHECK_GT(options_.dim, 0u);
}

StatusOr<GlobalBatch::Outcome> GlobalBatch::Add(const Push& push) {
  const size_t dim = options_.dim;
  if (push.grads.size() != push.keys.size() * dim) {
    return absl::InvalidArgumentError(absl::StrCat("a push of ", push.keys.size(), " keys of ",
                                                   dim, " floats carries ", push.grads.size(),
                                                   " gradients"));
  }
  if (push.records == 0) return absl::InvalidArgumentError("a push of no record");
  if (push.worker.has_value()) {
    last_records_[*push.worker] = push.records;
    if (auto held = holders_.find(*push.worker); held != holders_.end()) {
      const double took = static_cast<double>(std::max<int64_t>(0, push.at_ms - held->second));
      hold_mean_ms_ = hold_mean_ms_ == 0 ? std::max(took, 1.0) : 0.8 * hold_mean_ms_ + 0.2 * took;
      holders_.erase(held);
    }
  }
  const uint64_t behind = push.based_on < version_ ? version_ - push.based_on : 0;
  if (behind > options_.max_staleness) {
    ++stats_.pushes_dropped;
    stats_.records_dropped += push.records;
    return Outcome::kDropped;
  }
  // The gradient decays; its records count whole (the mean divides by them).
  const float decay = options_.decay ? 1.0f / static_cast<float>(1 + behind) : 1.0f;
  for (size_t i = 0; i < push.keys.size(); ++i) {
    auto [it, fresh] = slots_.try_emplace(push.keys[i], keys_.size());
    if (fresh) {
      keys_.push_back(push.keys[i]);
      sums_.resize(sums_.size() + dim, 0.0f);
      records_by_slot_.push_back(0);
    }
    float* sum = &sums_[it->second * dim];
    const float* grad = &push.grads[i * dim];
    const float w = decay * static_cast<float>(push.records);
    for (size_t j = 0; j < dim; ++j) sum[j] += w * grad[j];
    records_by_slot_[it->second] += push.records;
  }
  records_ += push.records;
  records_pushed_ += push.records;
  ++stats_.pushes;
  if (behind > 0) ++stats_.pushes_decayed;
  return Outcome::kAdded;
}

int64_t GlobalBatch::hold_bound_ms() const {
  if (hold_mean_ms_ == 0) return std::min(options_.first_hold_ms, options_.max_hold_ms);
  const auto scaled = static_cast<int64_t>(static_cast<double>(options_.hold_factor) * hold_mean_ms_);
  return std::clamp(scaled, options_.min_hold_ms, options_.max_hold_ms);
}

void GlobalBatch::Expire(int64_t now_ms) {
  const int64_t bound = hold_bound_ms();
  stats_.reservations_expired +=
      absl::erase_if(holders_, [&](const auto& held) { return now_ms - held.second > bound; });
  absl::erase_if(waiters_, [&](const auto& waiter) {
    return now_ms - waiter.second.last_ms > options_.waiter_ms;
  });
}

uint64_t GlobalBatch::Expected(uint64_t worker) const {
  if (auto last = last_records_.find(worker); last != last_records_.end()) return last->second;
  return stats_.pushes == 0 ? 1 : std::max<uint64_t>(1, records_pushed_ / stats_.pushes);
}

bool GlobalBatch::MayRead(uint64_t worker, int64_t now_ms, bool held_elsewhere) {
  Expire(now_ms);
  if (holders_.contains(worker)) return true;
  uint64_t reserved = 0;
  for (const auto& [holder, since] : holders_) reserved += Expected(holder);
  if (held_elsewhere && records_ + reserved < 2 * options_.records) return true;
  // The waiters queued before this worker (all of them for a newcomer).
  const auto mine = waiters_.find(worker);
  uint64_t ahead = 0;
  for (const auto& [waiter, times] : waiters_) {
    if (mine == waiters_.end() ||
        std::pair(times.first_ms, waiter) < std::pair(mine->second.first_ms, worker)) {
      ahead += Expected(waiter);
    }
  }
  if (!held_elsewhere && records_ + reserved + ahead < options_.records) return true;
  Waiter& waiter = waiters_.try_emplace(worker, Waiter{now_ms, now_ms}).first->second;
  waiter.last_ms = now_ms;
  ++stats_.reads_refused;
  return false;
}

void GlobalBatch::Hold(uint64_t worker, int64_t now_ms) {
  holders_.try_emplace(worker, now_ms);
  waiters_.erase(worker);
}

bool GlobalBatch::ready(int64_t now_ms) {
  if (records_ < options_.records) return false;
  Expire(now_ms);
  return holders_.empty();
}

void GlobalBatch::Reset() {
  holders_.clear();
  waiters_.clear();
  keys_.clear();
  sums_.clear();
  records_by_slot_.clear();
  slots_.clear();
  records_ = 0;
}

GlobalBatch::Step GlobalBatch::Take() {
  const size_t dim = options_.dim;
  Step step;
  step.keys = std::move(keys_);
  step.grads = std::move(sums_);
  for (size_t slot = 0; slot < step.keys.size(); ++slot) {
    const float scale = 1.0f / static_cast<float>(records_by_slot_[slot]);
    for (size_t j = 0; j < dim; ++j) step.grads[slot * dim + j] *= scale;
  }
  step.records = records_;
  step.version = ++version_;
  ++stats_.steps;
  stats_.step_records += step.records;
  // Reservations were of the version just applied: their pushes are now
  // stale. Waiters keep their turn.
  auto waiters = std::move(waiters_);
  Reset();
  waiters_ = std::move(waiters);
  return step;
}

}  // namespace eps
