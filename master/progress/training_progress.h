// TrainingProgress: where the job is in its data. The job phase, the data
// sets, the pass in progress (one training epoch or the evaluation, as a
// ShardTracker), the ledger that counts every line once per epoch and the
// job's record counts. It feeds the training loss to its LossWatch and the
// evaluation's commits to its Evaluation.
//
//   scanning --data scanned, servers placed--> training (epoch 1..E)
//     --last epoch done--> evaluating (when data.eval is set) --> finished
//   any phase --Fail--> failed
//
// Every change to what is stored (shards of the pass, data sets, eval
// results) is queued for TakeChanges(); the fields of MasterRecord the unit
// owns are written by SaveTo.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O
// (events are queued on the sink).
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_PROGRESS_TRAINING_PROGRESS_H_
#define EPS_MASTER_PROGRESS_TRAINING_PROGRESS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/status.h"
#include "master/event_log.h"
#include "master/progress/data_set.h"
#include "master/progress/evaluation.h"
#include "master/progress/loss_watch.h"
#include "master/progress/shard_tracker.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"

namespace eps {

// Persisted as MasterRecord.phase: never renumber.
enum class JobPhase { kScanning = 0, kTraining = 1, kEvaluating = 2, kFinished = 3, kFailed = 4 };
const char* JobPhaseName(JobPhase phase);

class TrainingProgress {
 public:
  // `events` is not owned and must outlive the unit.
  TrainingProgress(const JobConfig& job, EventSink* events);

  // The scanned data; training can start.
  void SetData(DataSet train, DataSet eval);
  bool data_ready() const { return data_ready_; }

  // Starts training epoch `epoch` (0-based): a new pass over data.train in
  // the epoch's shuffled order.
  void StartEpoch(uint32_t epoch);

  // --- Shards ---------------------------------------------------------------

  // The next shard for `worker`, nullopt when none is queued.
  std::optional<proto::ShardAssignment> Assign(uint32_t worker);
  // With nothing queued, asks the holder of the DOING shard with the most
  // lines left to split it for `idle_worker`. Returns that shard.
  std::optional<uint64_t> RequestSplit(uint32_t idle_worker);
  // The shard `worker` was asked to split, if any.
  std::optional<uint64_t> SplitRequestedOf(uint32_t worker) const;

  struct Committed {
    bool applied = false;          // false: a repeat, acknowledged without effect
    bool current_pass = false;     // false: a repeat of a pass that is over
    uint64_t records_trained = 0;  // well-formed training lines it added
  };
  // Applies a worker's commit. `labels` and `predictions` are an eval
  // commit's, validated by the caller. A commit for a pass that is over
  // repeats an applied one and is acknowledged unapplied.
  //   kInvalidArgument: a range outside its shard, or what the
  //     ShardTracker refuses as such.
  //   kFailedPrecondition: a pass that is not the current one, or a shard
  //     not held by `worker` / a gap (ShardTracker::Commit).
  StatusOr<Committed> Commit(uint32_t worker, const proto::CommitProgressRequest& commit,
                             std::span<const float> labels, std::span<const float> predictions);

  // Where an evaluation commit that Commit would apply now reads: its
  // shard's file and the line number at its begin offset. nullopt for
  // any other commit (a training one, a repeat, one Commit refuses).
  struct EvalRange {
    std::string path;
    uint64_t first_line = 0;
  };
  std::optional<EvalRange> EvalRangeOf(uint32_t worker,
                                       const proto::CommitProgressRequest& commit) const;
  // Whether an evaluation commit of `worker` was applied in the pass in
  // progress (true when not known: a master restarted while evaluating).
  bool EvaluatedBy(uint32_t worker) const { return evaluation_.CommittedBy(worker); }
  // Starts the evaluation over (while evaluating): its results so far are
  // dropped, `why` goes to the log and the event evaluation_restarted.
  void RestartEvaluation(const std::string& why);

  struct Split {
    bool accepted = false;
    uint64_t new_shard = 0;
  };
  // A worker's split of the shard it was asked to split. Unaccepted when
  // the pass moved on or the split is no longer wanted; a retried split
  // gets the first one's answer. kInvalidArgument for a bad offset or line.
  StatusOr<Split> SplitShard(uint32_t worker, const proto::SplitShardRequest& request);

  // What the master reads to judge a worker's SHARD_UNREADABLE report: the
  // shard's file and its unread part, [committed offset, end).
  struct UnreadRange {
    std::string path;
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t first_line = 0;  // line number at `begin`
    uint64_t lines = 0;       // lines the scan saw in [begin, end)
  };
  // The unread part of the shard `worker` reports, nullopt when the report
  // repeats one whose shard was skipped already.
  //   kFailedPrecondition: a pass that is not the current one, a shard not
  //     held by `worker`, or an offset that is not its committed offset.
  //   kInvalidArgument: an unknown shard.
  StatusOr<std::optional<UnreadRange>> Unread(uint32_t worker,
                                              const proto::ShardUnreadableRequest& report) const;
  // Skips the unread part of the shard `worker` reported (after Unread):
  // its lines count as skipped in the ledger (or the evaluation's count),
  // with `reason`. Errors as Unread.
  Status SkipUnread(uint32_t worker, const proto::ShardUnreadableRequest& report,
                    const std::string& reason);

  // Puts the shards `worker` holds back in the queue (at their committed
  // offsets). `since_last_seen` is the time from the worker's last sign of
  // life, when it died (it feeds max_reassign_delay_ms).
  void ReleaseShardsOf(uint32_t worker, const char* why,
                       std::optional<absl::Duration> since_last_seen);
  // The workers holding a shard of the pass in progress.
  std::set<uint32_t> HoldersOfShardsInProgress() const;

  // --- Passes and the job's end --------------------------------------------

  enum class PassEnd { kNone, kNextEpoch, kEvaluation, kFinished };
  // Moves on when the pass in progress is complete: to the next epoch, to
  // the evaluation (computing nothing yet) or to the end of training with
  // the evaluation's metrics computed. kFinished asks the caller to Finish.
  PassEnd AdvanceIfPassDone();
  // The job is over: finished, or failed with `reason`. Fail is a no-op
  // once over. `stopped`: an operator's stop or a recovery that cannot
  // complete; --resume continues the job.
  void Finish();
  void Fail(const std::string& reason, bool stopped);
  bool over() const { return phase_ == JobPhase::kFinished || phase_ == JobPhase::kFailed; }

  // --- Checkpoints ----------------------------------------------------------

  // Returns the data progress (pass, shards, ledger, counts) to a
  // checkpoint's: its shards in progress go back to the queue from where
  // they were then. kDataLoss when the checkpoint was not taken while
  // training or its records do not add up.
  Status ApplyCheckpoint(const proto::CheckpointRecord& checkpoint);
  // The shards of the pass in progress, as stored.
  void SaveShards(proto::CheckpointRecord* checkpoint) const;

  // --- Accounting -----------------------------------------------------------

  // Records pushed but never committed (a worker died, or was fenced).
  void AddRetrained(uint64_t records) { records_retrained_ += records; }
  // Lines left in the pass in progress; nullopt between passes.
  std::optional<uint64_t> PassLinesLeft() const;
  // Fraction of the pass in progress committed (0 with none).
  double PassFraction() const;
  // Lines left to the end of the job (this pass, later epochs, the
  // evaluation); nullopt when over or between passes.
  std::optional<double> JobLinesLeft() const;
  // Mean loss of the current epoch so far; nullopt outside training.
  std::optional<double> RunningLoss() const;
  // Ledger entry `e` describes a finished epoch.
  bool EpochComplete(size_t e) const;

  // --- Model health ---------------------------------------------------------

  // Why `commit` (a TRAIN commit from `worker`, not applied yet) shows a
  // model that diverged: a non-finite loss. nullopt when it does not.
  std::optional<std::string> NonFiniteLoss(uint32_t worker,
                                           const proto::CommitProgressRequest& commit) const;
  // Why the training loss says the model diverges (LossWatch); nullopt
  // while healthy or off.
  std::optional<std::string> Diverging() const { return loss_watch_.Diverging(epoch_); }
  // The model is suspect: no checkpoint should be taken of it (LossWatch).
  bool LossPastFactor() const { return loss_watch_.past_factor(); }
  // Mean loss of the last records trained (LossWatch); nullopt before any.
  std::optional<double> RecentLoss() const { return loss_watch_.recent(); }

  JobPhase phase() const { return phase_; }
  uint32_t epoch() const { return epoch_; }
  // Training passes completed: the epoch in progress while training, all
  // of them once evaluating or finished; nullopt while scanning or failed.
  std::optional<uint32_t> passes_done() const;
  const std::string& failure() const { return failure_; }
  bool stopped() const { return stopped_; }
  void set_stopped(bool stopped) { stopped_ = stopped; }
  const ShardTracker* tracker() const { return tracker_.get(); }
  const DataSet& train_data() const { return train_data_; }
  const DataSet& eval_data() const { return eval_data_; }
  const std::vector<proto::EpochLedger>& ledger() const { return ledger_; }
  uint64_t records_trained() const { return records_trained_; }
  uint64_t records_retrained() const { return records_retrained_; }
  uint64_t records_malformed() const { return records_malformed_; }
  const std::vector<std::string>& malformed_examples() const { return malformed_examples_; }
  // The evaluation's labels and predictions in the order of the eval data
  // (by file, then offset), malformed lines left out: what eps-predict
  // gives for the same files. Empty before the evaluation pass.
  void EvalInDataOrder(std::vector<float>* labels, std::vector<float>* predictions) const;
  std::optional<double> eval_auc() const { return evaluation_.auc(); }
  std::optional<double> eval_logloss() const { return evaluation_.logloss(); }
  uint64_t eval_records() const { return evaluation_.records(); }
  // Evaluation lines skipped (unreadable files), and the ranges.
  uint64_t eval_lines_skipped() const { return evaluation_.lines_skipped(); }
  const std::vector<std::string>& eval_skipped() const { return evaluation_.skipped(); }
  uint64_t reassignments() const;
  uint64_t splits() const;
  absl::Duration worst_reassign_delay() const { return worst_reassign_delay_; }
  // Records of every applied commit (training and evaluation), never undone.
  uint64_t records_committed_total() const { return records_committed_total_; }

  // --- Persistence ----------------------------------------------------------

  // Moves what changed in the stored pass, data sets and eval results into
  // `update`.
  void TakeChanges(StateUpdate* update);
  // The fields of MasterRecord this unit owns.
  void SaveTo(proto::MasterRecord* record) const;
  // A restarted master: the counts and ledger, then (past scanning) the data
  // sets and the pass in progress. kDataLoss when the records do not add up.
  Status RestoreFrom(const MasterSnapshot& snapshot);
  // --resume: the counts as saved, then the data sets and the phase and
  // epoch of `checkpoint` (its pass is adopted when the job is restored).
  void RestoreForResume(const MasterSnapshot& snapshot, const proto::CheckpointRecord& checkpoint);

 private:
  std::vector<uint32_t> EpochOrder(uint32_t epoch, size_t shards) const;
  proto::EpochLedger& Ledger(uint32_t epoch);
  void StartEvaluation();
  // Ends the pass in progress: its reassignments and splits join the totals.
  void ClosePass();
  // Makes `shards` the pass in progress (see AdoptPass in the .cc).
  Status AdoptPass(const std::vector<proto::ShardRecord>& shards, bool eval, uint32_t epoch,
                   uint64_t saved_splits);
  // A commit, split or report of (`eval`, `epoch`) is for the pass running
  // now.
  bool IsCurrentPass(bool eval, uint32_t epoch) const;
  bool PassIsOver(bool eval, uint32_t epoch) const;
  void MarkAllShards();
  void RestoreCounts(const proto::MasterRecord& record);

  const JobConfig& job_;
  EventSink* const events_;
  JobPhase phase_ = JobPhase::kScanning;
  bool data_ready_ = false;
  std::string failure_;
  bool stopped_ = false;
  uint32_t epoch_ = 0;  // 0-based
  DataSet train_data_;
  DataSet eval_data_;
  std::unique_ptr<ShardTracker> tracker_;

  // Accounting.
  uint64_t records_trained_ = 0;  // every epoch, each record once
  uint64_t records_retrained_ = 0;
  uint64_t records_malformed_ = 0;
  std::vector<std::string> malformed_examples_;
  std::vector<proto::EpochLedger> ledger_;
  Evaluation evaluation_;
  // Totals over finished passes (the current tracker holds its own).
  uint64_t reassignments_ = 0;
  uint64_t splits_ = 0;
  // Worst time from a dead worker's last sign of life to its shards being
  // back in the queue (lease + detection + fencing every server).
  absl::Duration worst_reassign_delay_ = absl::ZeroDuration();
  uint64_t records_committed_total_ = 0;
  LossWatch loss_watch_;

  // Changes for TakeChanges.
  std::set<uint64_t> dirty_shards_;
  bool clear_pass_ = false;
  bool data_dirty_ = false;
};

}  // namespace eps

#endif  // EPS_MASTER_PROGRESS_TRAINING_PROGRESS_H_
