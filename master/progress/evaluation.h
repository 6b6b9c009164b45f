// Evaluation: the results of the evaluation pass and the job's metrics.
//
// Each applied evaluation commit leaves its labels and predictions under
// (shard, begin offset), one per valid record; the unit knows who
// committed in the pass in progress, the malformed lines it saw, and the
// lines skipped as unreadable (with sample reasons). When the pass is
// complete, Finish computes the job's evaluation AUC and log loss over
// every result, logs them and records the event evaluation_finished.
//
// Every result is queued for TakeChanges (the stored eval results); the
// metrics, counts and skips go into MasterRecord (SaveTo, RestoreFrom).
// Who committed is not stored: after a restart it is not known
// (CommittedBy answers true), unless the pass had no result yet.
//
// Time and I/O stay outside; events are queued on the sink.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_PROGRESS_EVALUATION_H_
#define EPS_MASTER_PROGRESS_EVALUATION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "master/event_log.h"
#include "master/progress/shard_tracker.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"

namespace eps {

class Evaluation {
 public:
  // `events` is not owned and must outlive the unit.
  explicit Evaluation(EventSink* events) : events_(events) {}

  // A new evaluation pass: the results, counts and skips of any earlier
  // one are dropped (its metrics stay until this one finishes).
  void Start();
  // Drops everything, the metrics too (a rollback to a checkpoint taken
  // while training).
  void Reset();
  // An evaluation commit of `worker` for [begin, ...) of `shard`, applied:
  // one label and one prediction per valid record, and the malformed
  // lines it skipped.
  void Add(uint32_t worker, uint64_t shard, uint64_t begin, std::span<const float> labels,
           std::span<const float> predictions, uint64_t malformed);
  // `lines` of the pass skipped as unreadable; `where` names them (kept
  // for the first 20).
  void Skip(uint64_t lines, const std::string& where);
  // The pass is complete: the metrics over every result.
  void Finish();

  // Whether a commit of `worker` was applied in the pass in progress (true
  // when not known: a master restarted while evaluating).
  bool CommittedBy(uint32_t worker) const {
    return !committers_known_ || committers_.contains(worker);
  }
  // The labels and predictions in the order of the eval data (by file,
  // then offset; `tracker` is the pass's): what eps-predict gives for the
  // same files.
  void InDataOrder(const ShardTracker& tracker, std::vector<float>* labels,
                   std::vector<float>* predictions) const;

  std::optional<double> auc() const { return auc_; }
  std::optional<double> logloss() const { return logloss_; }
  // Records with a result in the pass in progress (or the last one).
  uint64_t records() const { return records_; }
  // Malformed lines the pass's commits reported since this master started.
  uint64_t malformed() const { return malformed_; }
  uint64_t lines_skipped() const { return lines_skipped_; }
  const std::vector<std::string>& skipped() const { return skipped_; }

  // Moves the results applied since the last call into `update`.
  void TakeChanges(StateUpdate* update);
  // The metrics, counts and skips, as MasterRecord holds them.
  void SaveTo(proto::MasterRecord* record) const;
  // A restarted master: the metrics and skips of `record`, then the stored
  // results of the pass in progress (when evaluating).
  void RestoreFrom(const proto::MasterRecord& record);
  void RestoreResults(const MasterSnapshot& snapshot);

 private:
  EventSink* const events_;
  // By (shard, begin offset): labels, predictions.
  using Result = std::pair<std::vector<float>, std::vector<float>>;
  std::map<std::pair<uint64_t, uint64_t>, Result> results_;
  uint64_t records_ = 0;
  uint64_t malformed_ = 0;
  std::set<uint32_t> committers_;
  bool committers_known_ = true;
  uint64_t lines_skipped_ = 0;
  std::vector<std::string> skipped_;
  std::optional<double> auc_;
  std::optional<double> logloss_;
  StateUpdate pending_;
};

}  // namespace eps

#endif  // EPS_MASTER_PROGRESS_EVALUATION_H_
