#include "worker/batch_sizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/logging.h"

namespace eps {

BatchSizer::Options BatchSizer::OptionsFor(const JobConfig::Worker& worker) {
  Options options;
  options.automatic = worker.batch_size.automatic;
  options.min = worker.reference_batch_size();
  options.max = worker.largest_batch_size();
  return options;
}

BatchSizer::BatchSizer(const Options& options)
    : options_(options),
      size_(options.min),
      ceiling_(options.max),
      settled_(!options.automatic || options.min >= options.max) {
  CHECK(options.min >= 1 && options.min <= options.max) << options.min << " " << options.max;
}

std::optional<BatchSizer::Change> BatchSizer::MoveTo(int64_t to, std::string reason) {
  Change change{size_, to, std::move(reason)};
  size_ = to;
  skipped_ = 0;
  steps_.clear();
  time_ = absl::ZeroDuration();
  return change;
}

std::optional<BatchSizer::Change> BatchSizer::StepDone(int64_t records, absl::Duration took) {
  if (settled_ || records != size_) return std::nullopt;
  if (skipped_ < 1) {
    ++skipped_;
    return std::nullopt;
  }
  steps_.push_back(took);
  time_ += took;
  if (static_cast<int>(steps_.size()) < options_.window_batches || time_ < options_.window_time) {
    return std::nullopt;
  }
  // The median step: a step that waited for a shard at an epoch's end or
  // for a checkpoint round says nothing about the batch size.
  std::nth_element(steps_.begin(), steps_.begin() + steps_.size() / 2, steps_.end());
  const double median = absl::ToDoubleSeconds(steps_[steps_.size() / 2]);
  const double rate = static_cast<double>(size_) / std::max(1e-9, median);
  if (previous_size_ > 0 && rate <= previous_rate_ * (1.0 + options_.min_gain)) {
    // The doubling did not pay: back to the size before, for good.
    settled_ = true;
    return MoveTo(previous_size_,
                  absl::StrFormat("%.0f records/s at %d against %.0f at %d (under +%.0f%%): "
                                  "settled at %d",
                                  rate, size_, previous_rate_, previous_size_,
                                  100 * options_.min_gain, previous_size_));
  }
  const int64_t next = std::min(size_ * 2, ceiling_);
  if (next <= size_) {
    settled_ = true;
    return std::nullopt;  // at the largest size allowed, and it is the best
  }
  const std::string reason =
      previous_size_ == 0
          ? absl::StrFormat("%.0f records/s at %d: trying %d", rate, size_, next)
          : absl::StrFormat("%.0f records/s at %d, +%.0f%% over %.0f at %d: trying %d", rate,
                            size_, 100 * (rate / previous_rate_ - 1), previous_rate_,
                            previous_size_, next);
  previous_size_ = size_;
  previous_rate_ = rate;
  return MoveTo(next, reason);
}

std::optional<BatchSizer::Change> BatchSizer::OutOfMemory(int64_t records) {
  if (!options_.automatic || records > size_) return std::nullopt;
  ceiling_ = std::max(options_.min, records - 1);
  settled_ = true;
  const int64_t to = std::max(options_.min, records / 2);
  if (to >= size_) return std::nullopt;
  return MoveTo(to, absl::StrFormat("a step of %d records ran out of memory: %d from now on",
                                    records, to));
}

namespace {

LearningRateScale::Rule RuleNamed(const std::string& rule) {
  if (rule == "linear") return LearningRateScale::Rule::kLinear;
  if (rule == "sqrt") return LearningRateScale::Rule::kSqrt;
  CHECK_EQ(rule, "none") << "optimizer.lr_scaling";
  return LearningRateScale::Rule::kNone;
}

}  // namespace

LearningRateScale::LearningRateScale(const std::string& rule, int64_t reference,
                                     int64_t warmup_batches)
    : rule_(RuleNamed(rule)), reference_(reference), warmup_batches_(warmup_batches) {
  CHECK_GE(reference_, 1);
}

LearningRateScale LearningRateScale::For(const JobConfig& job) {
  return LearningRateScale(job.optimizer.lr_scaling, job.worker.reference_batch_size(),
                           job.optimizer.lr_warmup_batches);
}

double LearningRateScale::Target(int64_t records) const {
  const double ratio = static_cast<double>(records) / static_cast<double>(reference_);
  switch (rule_) {
    case Rule::kLinear: return ratio;
    case Rule::kSqrt: return std::sqrt(ratio);
    case Rule::kNone: break;
  }
  return 1.0;
}

double LearningRateScale::Ramped(double target) const {
  if (ramp_left_ == 0) return target;
  const double weight = static_cast<double>(ramp_left_) / static_cast<double>(warmup_batches_ + 1);
  return weight * ramp_from_ + (1.0 - weight) * target;
}

float LearningRateScale::Next(int64_t records) {
  const double factor = Ramped(Target(records));
  if (ramp_left_ > 0) --ramp_left_;
  return static_cast<float>(factor);
}

void LearningRateScale::SizeChanged(int64_t from, int64_t to) {
  if (rule_ == Rule::kNone || warmup_batches_ == 0 || from == to) return;
  // From where the factor stands now (a warm-up may be under way).
  ramp_from_ = Ramped(Target(from));
  ramp_left_ = warmup_batches_;
}

WorkerBatchSize::WorkerBatchSize(const JobConfig& job)
    : sizer_(BatchSizer::OptionsFor(job.worker)),
      lr_scale_(LearningRateScale::For(job)),
      size_(sizer_.size()) {}

std::optional<BatchSizer::Change> WorkerBatchSize::StepDone(int64_t records, absl::Duration took) {
  return Took(sizer_.StepDone(records, took));
}

std::optional<BatchSizer::Change> WorkerBatchSize::OutOfMemory(int64_t records) {
  return Took(sizer_.OutOfMemory(records));
}

std::optional<BatchSizer::Change> WorkerBatchSize::Took(std::optional<BatchSizer::Change> change) {
  if (!change.has_value()) return change;
  LOG(INFO) << "batch size " << change->from << " -> " << change->to << ": " << change->reason;
  lr_scale_.SizeChanged(change->from, change->to);
  size_.store(change->to, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  proto::BatchSizeChange& kept = changes_.emplace_back();
  kept.set_seq(++last_change_);
  kept.set_from(static_cast<uint32_t>(change->from));
  kept.set_to(static_cast<uint32_t>(change->to));
  kept.set_reason(change->reason);
  if (changes_.size() > kChangesKept) changes_.pop_front();
  return change;
}

uint64_t WorkerBatchSize::last_change() const {
  absl::MutexLock lock(&mu_);
  return last_change_;
}

void WorkerBatchSize::Report(uint64_t after, proto::WorkerStats* stats) const {
  stats->set_batch_size(static_cast<uint32_t>(size()));
  absl::MutexLock lock(&mu_);
  for (const proto::BatchSizeChange& change : changes_) {
    if (change.seq() > after) *stats->add_batch_size_changes() = change;
  }
}

}  // namespace eps
