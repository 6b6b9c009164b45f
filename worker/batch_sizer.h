// BatchSizer and LearningRateScale: a worker's batch size under
// worker.batch_size = auto, and the learning rate that follows it
// (optimizer.lr_scaling).
//
// BatchSizer starts at worker.min_batch_size and measures the worker's
// training rate at each size: the batch over the median time of whole steps
// (pulls, the math, the push and the commit) in a window of them. While a doubling raised the rate by
// more than a tenth over the size before, it doubles again, up to
// worker.max_batch_size; once a doubling gains less, it goes back to the
// size before (the device was already busy: a larger batch only costs
// statistical efficiency) and stays there. A step that runs out of memory
// halves the size at once (not below the minimum) and stays below the size
// that failed. A fixed worker.batch_size never changes.
//
// LearningRateScale turns a batch's records into the factor the servers
// multiply the learning rate by: none (1), linear (b / reference) or sqrt
// (sqrt(b / reference)), the reference being the batch size the learning
// rate was tuned for (JobConfig::Worker::reference_batch_size). After the
// worker's batch size changes, the factor moves from the old size's to the
// new one's linearly over optimizer.lr_warmup_batches batches, so that no
// step jumps.
//
// WorkerBatchSize holds both for a worker across its sessions, and what
// heartbeats report of them.
//
// Thread-safety: BatchSizer and LearningRateScale are not thread-safe; the
// trainer thread owns them. WorkerBatchSize: size() and Report from any
// thread, the rest from the trainer's.

#ifndef EPS_WORKER_BATCH_SIZER_H_
#define EPS_WORKER_BATCH_SIZER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/job_config.h"
#include "proto/eps.pb.h"

namespace eps {

class BatchSizer {
 public:
  struct Options {
    bool automatic = false;
    // The fixed size, or where auto starts: min. REQUIRES 1 <= min <= max.
    int64_t min = 1024;
    int64_t max = 1024;
    // Full batches a measurement takes at least, after one batch at the
    // new size is left out (its buffers grow), and the training time it
    // covers at least.
    int window_batches = 8;
    absl::Duration window_time = absl::Seconds(1);
    // A doubling must raise records/s by more than this fraction.
    double min_gain = 0.10;
  };
  // What a worker's options make: fixed at worker.batch_size, or auto
  // between worker.min_batch_size and worker.max_batch_size.
  static Options OptionsFor(const JobConfig::Worker& worker);

  struct Change {
    int64_t from = 0;
    int64_t to = 0;
    std::string reason;
  };

  explicit BatchSizer(const Options& options);

  // The size the next batches should have.
  int64_t size() const { return size_; }
  // Whether it stopped looking for a better size.
  bool settled() const { return settled_; }

  // One step of `records` that took `took` (from the end of the step before
  // to the end of this one). Only full batches of the current size count.
  // Returns the change it decided, if any.
  std::optional<Change> StepDone(int64_t records, absl::Duration took);

  // A step of `records` ran out of memory. Returns the change, if any
  // (none when fixed, at the minimum already, or when a batch made before
  // an earlier shrink failed too).
  std::optional<Change> OutOfMemory(int64_t records);

 private:
  std::optional<Change> MoveTo(int64_t to, std::string reason);

  const Options options_;
  int64_t size_;
  // The largest size not known to run out of memory.
  int64_t ceiling_;
  bool settled_;
  // The current size's measurement.
  int skipped_ = 0;
  std::vector<absl::Duration> steps_;
  absl::Duration time_;
  // The size before and its records/s; 0 before the first measurement.
  int64_t previous_size_ = 0;
  double previous_rate_ = 0;
};

class LearningRateScale {
 public:
  enum class Rule { kNone, kLinear, kSqrt };
  // `rule` is none, linear or sqrt (optimizer.lr_scaling); `reference` >= 1.
  LearningRateScale(const std::string& rule, int64_t reference, int64_t warmup_batches);
  static LearningRateScale For(const JobConfig& job);

  // The factor for the push of a batch of `records`.
  float Next(int64_t records);
  // The worker's batch size changed from `from` to `to`.
  void SizeChanged(int64_t from, int64_t to);

 private:
  // The rule's factor for a batch of `records`, without warm-up.
  double Target(int64_t records) const;
  // `target` blended with the warm-up's start, while one runs.
  double Ramped(double target) const;

  const Rule rule_;
  const int64_t reference_;
  const int64_t warmup_batches_;
  // During a warm-up: the factor it starts from, and batches left.
  double ramp_from_ = 1.0;
  int64_t ramp_left_ = 0;
};

class WorkerBatchSize {
 public:
  // From the job's worker.* and optimizer.lr_scaling options.
  explicit WorkerBatchSize(const JobConfig& job);

  // The size the next batches should have.
  int64_t size() const { return size_.load(std::memory_order_relaxed); }
  // The learning-rate factor for the push of a training batch of `records`.
  float LrScale(int64_t records) { return lr_scale_.Next(records); }
  // BatchSizer::StepDone and OutOfMemory; a change they make is logged,
  // moves the learning rate's warm-up and is kept for Report.
  std::optional<BatchSizer::Change> StepDone(int64_t records, absl::Duration took);
  std::optional<BatchSizer::Change> OutOfMemory(int64_t records);

  // The number of the latest change (0: none yet).
  uint64_t last_change() const;
  // The size now and the changes numbered after `after` (the latest
  // kChangesKept at most), into a heartbeat's stats.
  void Report(uint64_t after, proto::WorkerStats* stats) const;

  static constexpr size_t kChangesKept = 16;

 private:
  std::optional<BatchSizer::Change> Took(std::optional<BatchSizer::Change> change);

  BatchSizer sizer_;
  LearningRateScale lr_scale_;
  std::atomic<int64_t> size_;
  mutable absl::Mutex mu_;
  std::deque<proto::BatchSizeChange> changes_ ABSL_GUARDED_BY(mu_);
  uint64_t last_change_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace eps

#endif  // EPS_WORKER_BATCH_SIZER_H_
