// ProgressMeter: the job's rate over the last progress interval and the
// last progress samples (the status page's chart, scripts/plot_run.py).
//
// Time is passed in; no lock, no clock, no I/O.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_PROGRESS_METER_H_
#define EPS_MASTER_PROGRESS_METER_H_

#include <cstdint>
#include <deque>
#include <optional>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace eps {

// A number, or null when there is none (JSON has no NaN).
inline nlohmann::json NullableNumber(const std::optional<double>& value) {
  return value.has_value() ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

class ProgressMeter {
 public:
  static constexpr size_t kHistorySamples = 720;

  // `start`: when the master started (the first interval runs from it).
  ProgressMeter(absl::Duration interval, absl::Time start)
      : interval_(interval), last_(start) {}

  // True when an interval has passed since the last sample: the rate is
  // then measured anew from `records_total` (a count that never falls).
  bool Due(absl::Time now, uint64_t records_total) {
    if (now - last_ < interval_) return false;
    records_per_s_ = static_cast<double>(records_total - records_at_last_) /
                     absl::ToDoubleSeconds(now - last_);
    last_ = now;
    records_at_last_ = records_total;
    return true;
  }
  // Keeps `sample` as the newest of the history.
  void Keep(nlohmann::json sample) {
    history_.push_back(std::move(sample));
    while (history_.size() > kHistorySamples) history_.pop_front();
  }

  double records_per_s() const { return records_per_s_; }
  const std::deque<nlohmann::json>& history() const { return history_; }

 private:
  const absl::Duration interval_;
  absl::Time last_;
  uint64_t records_at_last_ = 0;
  double records_per_s_ = 0;
  std::deque<nlohmann::json> history_;
};

}  // namespace eps

#endif  // EPS_MASTER_PROGRESS_METER_H_
