#include "ps/global_batch.h"

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
  ++stats_.pushes;
  if (behind > 0) ++stats_.pushes_decayed;
  return Outcome::kAdded;
}

void GlobalBatch::Reset() {
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
  Reset();
  return step;
}

}  // namespace eps
