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

LearningRateScale::LearningRateScale(std::string rule, int64_t reference, int64_t warmup_batches)
    : rule_(std::move(rule)), reference_(reference), warmup_batches_(warmup_batches) {
  CHECK(rule_ == "none" || rule_ == "linear" || rule_ == "sqrt") << rule_;
  CHECK_GE(reference_, 1);
}

LearningRateScale LearningRateScale::For(const JobConfig& job) {
  return LearningRateScale(job.optimizer.lr_scaling, job.worker.reference_batch_size(),
                           job.optimizer.lr_warmup_batches);
}

double LearningRateScale::Target(int64_t records) const {
  const double ratio = static_cast<double>(records) / static_cast<double>(reference_);
  if (rule_ == "linear") return ratio;
  if (rule_ == "sqrt") return std::sqrt(ratio);
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
  if (rule_ == "none" || warmup_batches_ == 0 || from == to) return;
  // From where the factor stands now (a warm-up may be under way).
  ramp_from_ = Ramped(Target(from));
  ramp_left_ = warmup_batches_;
}

}  // namespace eps
