// LossWatch: whether the training loss says the model diverged
// (job.divergence_factor).
//
// Fed the loss of every applied training commit, it keeps the recent loss:
// sums of loss and records decayed by record count (exp(-records /
// window)), so they weigh about the last window() records, 8 of the
// largest batches. The recent loss is judged against a reference: epoch
// 1's mean loss (in epoch 1, that of its records before the recent ones,
// once they cover a window) while it is under ln 2, the loss of a model
// that knows nothing, and ln 2 otherwise. So a loss that explodes from the
// first batches on is caught too, and the overshoot of a healthy start
// (twice ln 2 for a few batches under Adagrad with stale workers) is not.
// It judges once the recent loss covers half a window; the model diverges
// when the recent loss stays above the factor times the reference for
// kDivergedWindows windows in a row. While it stays past, it is judged
// against the reference it first went past (the records past it would
// raise the baseline).
//
// In memory only: a restarted master, or a rollback (Reset), starts it
// again. A job.divergence_factor of 0 turns it off.
//
// Thread-safety: not thread-safe; JobControl's owner guards it.

#ifndef EPS_MASTER_PROGRESS_LOSS_WATCH_H_
#define EPS_MASTER_PROGRESS_LOSS_WATCH_H_

#include <cstdint>
#include <optional>
#include <string>

#include "core/job_config.h"

namespace eps {

// The log loss of a model that knows nothing (predicting 0.5 for every
// record): ln 2. A mean loss far above it is a model that diverged.
inline constexpr double kKnowNothingLogLoss = 0.6931471805599453;
// Windows of records (8 batches each) the recent loss must stay past the
// divergence factor before the job stops: a healthy start's overshoot
// lasts a few.
inline constexpr double kDivergedWindows = 8;

class LossWatch {
 public:
  // `job` must outlive the unit.
  explicit LossWatch(const JobConfig& job) : job_(job) {}

  // Epoch 1's training totals (the ledger's first entry).
  struct EpochTotals {
    double loss_sum = 0;
    uint64_t records = 0;
  };
  // A training commit applied in `epoch` (0-based): `records` valid
  // records whose losses sum to `loss_sum`. `epoch1` is epoch 1's totals
  // before this commit (nullopt before epoch 1's first commit).
  void Add(double loss_sum, uint64_t records, uint32_t epoch,
           std::optional<EpochTotals> epoch1);
  // Forgets the recent loss (a rollback to a checkpoint).
  void Reset();

  // Why the model diverges, naming `epoch` (0-based, the epoch in
  // progress); nullopt while healthy or off.
  std::optional<std::string> Diverging(uint32_t epoch) const;
  // The recent loss is past the factor times its reference (diverging, or
  // a healthy start's overshoot): the model is suspect, so no checkpoint
  // should be taken of it.
  bool past_factor() const { return records_over_ > 0; }
  // Mean loss of the last records trained; nullopt before any.
  std::optional<double> recent() const;
  // Records the recent loss weighs: 8 of the largest batches, at least 64.
  double window() const;

 private:
  struct Reference {
    double loss;
    const char* what;
  };
  // What the recent loss is judged against now; nullopt when it is not
  // judged (off, no epoch 1 yet, or under half a window).
  std::optional<Reference> ReferenceNow(uint32_t epoch, std::optional<EpochTotals> epoch1) const;

  const JobConfig& job_;
  double recent_loss_sum_ = 0;
  double recent_records_ = 0;
  // Records trained since the recent loss last was within the factor, and
  // the reference it went past then.
  double records_over_ = 0;
  Reference over_reference_{kKnowNothingLogLoss, ""};
};

}  // namespace eps

#endif  // EPS_MASTER_PROGRESS_LOSS_WATCH_H_
