#include "master/progress/training_progress.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/hashing.h"
#include "core/logging.h"

namespace eps {

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kScanning:
      return "scanning";
    case JobPhase::kTraining:
      return "training";
    case JobPhase::kEvaluating:
      return "evaluating";
    case JobPhase::kFinished:
      return "finished";
    case JobPhase::kFailed:
      return "failed";
  }
  return "unknown";
}

TrainingProgress::TrainingProgress(const JobConfig& job, EventSink* events)
    : job_(job), events_(events), evaluation_(events), loss_watch_(job) {}

void TrainingProgress::SetData(DataSet train, DataSet eval) {
  train_data_ = std::move(train);
  eval_data_ = std::move(eval);
  data_ready_ = true;
  data_dirty_ = true;
}

std::vector<uint32_t> TrainingProgress::EpochOrder(uint32_t epoch, size_t shards) const {
  std::vector<uint32_t> order(shards);
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(Mix64(static_cast<uint64_t>(job_.job.seed) * 1000003u + epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

proto::EpochLedger& TrainingProgress::Ledger(uint32_t epoch) {
  while (ledger_.size() <= epoch) {
    proto::EpochLedger entry;
    entry.set_epoch(static_cast<uint32_t>(ledger_.size()) + 1);
    entry.set_records_expected(train_data_.lines);
    ledger_.push_back(entry);
  }
  return ledger_[epoch];
}

void TrainingProgress::MarkAllShards() {
  dirty_shards_.clear();
  for (uint64_t id = 0; tracker_ && id < tracker_->num_shards(); ++id) dirty_shards_.insert(id);
}

void TrainingProgress::ClosePass() {
  if (!tracker_) return;
  reassignments_ += tracker_->reassignments();
  splits_ += tracker_->splits();
}

void TrainingProgress::StartEpoch(uint32_t epoch) {
  ClosePass();
  epoch_ = epoch;
  phase_ = JobPhase::kTraining;
  tracker_ =
      std::make_unique<ShardTracker>(train_data_, EpochOrder(epoch, train_data_.shards.size()));
  Ledger(epoch);
  clear_pass_ = true;
  MarkAllShards();
  LOG(INFO) << "epoch " << epoch + 1 << "/" << job_.job.epochs << ": " << train_data_.shards.size()
            << " shards, " << train_data_.lines << " lines";
  events_->Record("epoch_started", {{"epoch", epoch + 1}, {"shards", train_data_.shards.size()}});
}

void TrainingProgress::RestartEvaluation(const std::string& why) {
  if (phase_ != JobPhase::kEvaluating) return;
  LOG(WARNING) << "the evaluation starts over (" << evaluation_.records()
               << " records dropped): " << why;
  events_->Record("evaluation_restarted",
                  {{"records_dropped", evaluation_.records()}, {"reason", why}});
  records_malformed_ -= std::min(records_malformed_, evaluation_.malformed());
  StartEvaluation();
}

void TrainingProgress::StartEvaluation() {
  ClosePass();
  phase_ = JobPhase::kEvaluating;
  std::vector<uint32_t> order(eval_data_.shards.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  tracker_ = std::make_unique<ShardTracker>(eval_data_, order);
  evaluation_.Start();
  clear_pass_ = true;
  MarkAllShards();
  LOG(INFO) << "evaluating on " << eval_data_.lines << " lines (" << eval_data_.shards.size()
            << " shards)";
  events_->Record("evaluation_started", {{"shards", eval_data_.shards.size()}});
}

std::optional<proto::ShardAssignment> TrainingProgress::Assign(uint32_t worker) {
  if (!tracker_) return std::nullopt;
  std::optional<ShardTracker::Assignment> assignment = tracker_->Assign(worker);
  if (!assignment.has_value()) return std::nullopt;
  dirty_shards_.insert(assignment->shard_id);
  const bool eval = phase_ == JobPhase::kEvaluating;
  const DataSet& data = eval ? eval_data_ : train_data_;
  proto::ShardAssignment shard;
  shard.set_shard_id(assignment->shard_id);
  shard.set_epoch(epoch_);
  shard.set_phase(eval ? proto::EVAL : proto::TRAIN);
  shard.set_path(data.files[assignment->spec->file]);
  shard.set_begin(assignment->spec->begin);
  shard.set_end(assignment->spec->end);
  shard.set_start(assignment->committed_offset);
  shard.set_start_line(assignment->committed_line);
  shard.set_records(assignment->lines);
  VLOG(1) << "worker[" << worker << "] takes " << (eval ? "eval" : "train") << " shard "
          << assignment->shard_id << " (" << assignment->lines << " lines from line "
          << assignment->committed_line << " of " << shard.path() << ")";
  return shard;
}

std::optional<uint64_t> TrainingProgress::RequestSplit(uint32_t idle_worker) {
  if (!tracker_ || tracker_->todo() != 0) return std::nullopt;
  std::optional<uint64_t> split =
      tracker_->RequestSplit(2 * static_cast<uint64_t>(job_.worker.largest_batch_size()));
  if (!split.has_value()) return std::nullopt;
  const ShardTracker::Shard& shard = tracker_->shard(*split);
  VLOG(1) << "asking worker[" << shard.holder << "] to split shard " << *split
          << " for idle worker[" << idle_worker << "]";
  events_->Record("split_requested", {{"shard", *split},
                                      {"holder", shard.holder},
                                      {"idle_worker", idle_worker},
                                      {"records_left", shard.spec.lines - shard.committed_lines}});
  return split;
}

std::optional<uint64_t> TrainingProgress::SplitRequestedOf(uint32_t worker) const {
  if (!tracker_) return std::nullopt;
  return tracker_->SplitRequestedOf(worker);
}

bool TrainingProgress::IsCurrentPass(bool eval, uint32_t epoch) const {
  return tracker_ != nullptr && epoch == epoch_ &&
         (eval ? phase_ == JobPhase::kEvaluating : phase_ == JobPhase::kTraining);
}

bool TrainingProgress::PassIsOver(bool eval, uint32_t epoch) const {
  switch (phase_) {
    case JobPhase::kTraining:
      return !eval && epoch < epoch_;
    case JobPhase::kEvaluating:
      return !eval && epoch <= epoch_;
    case JobPhase::kFinished:
      // epoch_ stays at the last epoch, which the evaluation also carries.
      return epoch <= epoch_ && (!eval || evaluation_.auc().has_value());
    case JobPhase::kScanning:
    case JobPhase::kFailed:
      return false;
  }
  return false;
}

StatusOr<TrainingProgress::Committed> TrainingProgress::Commit(
    uint32_t worker, const proto::CommitProgressRequest& commit, std::span<const float> labels,
    std::span<const float> predictions) {
  const bool eval = commit.phase() == proto::EVAL;
  const bool current_pass = IsCurrentPass(eval, commit.epoch());
  if (!current_pass && PassIsOver(eval, commit.epoch())) {
    // Every shard of a finished pass is committed to its end, so a commit
    // for one can only repeat an applied one: typically the pass's last
    // commit, resent because its reply was late. Acknowledge it like the
    // tracker acknowledges any repeat, so the worker carries on.
    const DataSet& data = eval ? eval_data_ : train_data_;
    // Shards split off stragglers have ids past the scan's; their ranges lie
    // within the scan's files, which is all that can be checked now.
    if (commit.shard_id() < data.shards.size()) {
      const ShardSpec& spec = data.shards[commit.shard_id()];
      if (commit.begin_offset() < spec.begin || commit.begin_offset() > commit.end_offset() ||
          commit.end_offset() > spec.end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "commit [", commit.begin_offset(), ", ", commit.end_offset(), ") is outside shard ",
            commit.shard_id(), " [", spec.begin, ", ", spec.end, ")"));
      }
    }
    return Committed{};
  }
  if (!current_pass) {
    return absl::FailedPreconditionError(absl::StrCat(
        "commit for ", eval ? "evaluation" : absl::StrCat("epoch ", commit.epoch() + 1),
        " but the job is ", JobPhaseName(phase_),
        phase_ == JobPhase::kTraining ? absl::StrCat(" epoch ", epoch_ + 1) : ""));
  }
  ASSIGN_OR_RETURN(ShardTracker::CommitResult result,
                   tracker_->Commit(worker, commit.shard_id(), commit.begin_offset(),
                                    commit.end_offset(), commit.lines()));
  if (result != ShardTracker::CommitResult::kApplied) return Committed{.current_pass = true};

  dirty_shards_.insert(commit.shard_id());
  const uint64_t valid = commit.lines() - commit.malformed();
  records_committed_total_ += valid;
  records_malformed_ += commit.malformed();
  for (const std::string& example : commit.malformed_examples()) {
    if (malformed_examples_.size() < 20) malformed_examples_.push_back(example);
  }
  Committed committed{.applied = true, .current_pass = true};
  if (eval) {
    evaluation_.Add(worker, commit.shard_id(), commit.begin_offset(), labels, predictions,
                    commit.malformed());
  } else {
    records_trained_ += valid;
    committed.records_trained = valid;
    std::optional<LossWatch::EpochTotals> epoch1;
    if (!ledger_.empty()) {
      epoch1 = LossWatch::EpochTotals{.loss_sum = ledger_[0].loss_sum(),
                                      .records = ledger_[0].records_committed()};
    }
    loss_watch_.Add(commit.loss_sum(), valid, epoch_, epoch1);
    proto::EpochLedger& entry = Ledger(epoch_);
    entry.set_lines_committed(entry.lines_committed() + commit.lines());
    entry.set_records_committed(entry.records_committed() + valid);
    entry.set_malformed(entry.malformed() + commit.malformed());
    entry.set_loss_sum(entry.loss_sum() + commit.loss_sum());
  }
  return committed;
}

StatusOr<TrainingProgress::Split> TrainingProgress::SplitShard(
    uint32_t worker, const proto::SplitShardRequest& request) {
  const bool eval = request.phase() == proto::EVAL;
  const bool current_pass = IsCurrentPass(eval, request.epoch());
  if (!current_pass) return Split{};
  // A retried split (its reply was lost) gets the first one's answer.
  for (uint64_t id = 0; id < tracker_->num_shards(); ++id) {
    const ShardTracker::Shard& part = tracker_->shard(id);
    if (part.split_from == request.shard_id() && part.spec.begin == request.split_offset() &&
        request.shard_id() < tracker_->num_shards() &&
        tracker_->shard(request.shard_id()).holder == worker) {
      return Split{.accepted = true, .new_shard = id};
    }
  }
  StatusOr<uint64_t> child =
      tracker_->Split(worker, request.shard_id(), request.split_offset(), request.split_line());
  if (!child.ok()) {
    // No longer wanted (or no longer its shard).
    if (absl::IsFailedPrecondition(child.status())) return Split{};
    return child.status();
  }
  dirty_shards_.insert(request.shard_id());
  dirty_shards_.insert(*child);
  const ShardTracker::Shard& part = tracker_->shard(*child);
  LOG(INFO) << "split shard " << request.shard_id() << " of worker[" << worker << "] at line "
            << request.split_line() << ": " << part.spec.lines << " lines go to shard " << *child;
  events_->Record("shard_split", {{"shard", request.shard_id()},
                                  {"new_shard", *child},
                                  {"worker", worker},
                                  {"split_offset", request.split_offset()},
                                  {"split_line", request.split_line()},
                                  {"records_moved", part.spec.lines}});
  return Split{.accepted = true, .new_shard = *child};
}

std::optional<TrainingProgress::EvalRange> TrainingProgress::EvalRangeOf(
    uint32_t worker, const proto::CommitProgressRequest& commit) const {
  if (commit.phase() != proto::EVAL || !IsCurrentPass(/*eval=*/true, commit.epoch())) {
    return std::nullopt;
  }
  // Only what Commit would apply; it answers the rest.
  const StatusOr<ShardTracker::CommitResult> would =
      tracker_->CheckCommit(worker, commit.shard_id(), commit.begin_offset(), commit.end_offset(),
                            commit.lines());
  if (!would.ok() || *would != ShardTracker::CommitResult::kApplied) return std::nullopt;
  const ShardTracker::Shard& shard = tracker_->shard(commit.shard_id());
  return EvalRange{.path = eval_data_.files[shard.spec.file], .first_line = shard.committed_line};
}

StatusOr<std::optional<TrainingProgress::UnreadRange>> TrainingProgress::Unread(
    uint32_t worker, const proto::ShardUnreadableRequest& report) const {
  const bool eval = report.phase() == proto::EVAL;
  const bool current_pass = IsCurrentPass(eval, report.epoch());
  if (!current_pass) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", report.shard_id(), " belongs to a pass that is not the current one"));
  }
  if (report.shard_id() >= tracker_->num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown shard ", report.shard_id()));
  }
  const ShardTracker::Shard& shard = tracker_->shard(report.shard_id());
  if (shard.state == ShardTracker::State::kDone && shard.skipped_lines > 0 &&
      shard.holder == worker && shard.committed_offset == report.offset()) {
    return std::optional<UnreadRange>();
  }
  if (shard.state != ShardTracker::State::kDoing || shard.holder != worker) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", report.shard_id(), " is not held by worker ", worker));
  }
  if (report.offset() != shard.committed_offset) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", report.shard_id(), " is committed up to byte ",
                     shard.committed_offset, ", not ", report.offset()));
  }
  const DataSet& data = eval ? eval_data_ : train_data_;
  return std::optional<UnreadRange>(UnreadRange{.path = data.files[shard.spec.file],
                                                .begin = shard.committed_offset,
                                                .end = shard.spec.end,
                                                .first_line = shard.committed_line,
                                                .lines = shard.spec.lines - shard.committed_lines});
}

Status TrainingProgress::SkipUnread(uint32_t worker, const proto::ShardUnreadableRequest& report,
                                    const std::string& reason) {
  ASSIGN_OR_RETURN(std::optional<UnreadRange> range, Unread(worker, report));
  if (!range.has_value()) return absl::OkStatus();  // skipped already
  ASSIGN_OR_RETURN(uint64_t skipped,
                   tracker_->Skip(worker, report.shard_id(), report.offset(), reason));
  dirty_shards_.insert(report.shard_id());
  const std::string where = absl::StrCat(range->path, " lines ", range->first_line, "-",
                                         range->first_line + range->lines - 1, ": ", reason);
  if (phase_ == JobPhase::kEvaluating) {
    evaluation_.Skip(skipped, where);
  } else {
    // The reasons are samples; the counts are exact.
    constexpr size_t kMaxSkipReasons = 20;
    proto::EpochLedger& entry = Ledger(epoch_);
    entry.set_lines_skipped(entry.lines_skipped() + skipped);
    if (static_cast<size_t>(entry.skipped_size()) < kMaxSkipReasons) entry.add_skipped(where);
  }
  LOG(WARNING) << "skipping " << skipped << " lines of shard " << report.shard_id() << " (" << where
               << "): data.on_unreadable = skip";
  events_->Record("shard_skipped", {{"shard", report.shard_id()},
                                    {"worker", worker},
                                    {"file", range->path},
                                    {"first_line", range->first_line},
                                    {"lines", skipped},
                                    {"reason", reason}});
  return absl::OkStatus();
}

void TrainingProgress::ReleaseShardsOf(uint32_t worker, const char* why,
                                       std::optional<absl::Duration> since_last_seen) {
  if (!tracker_) return;
  for (uint64_t shard : tracker_->Release(worker)) {
    dirty_shards_.insert(shard);
    if (since_last_seen.has_value()) {
      worst_reassign_delay_ = std::max(worst_reassign_delay_, *since_last_seen);
    }
    const ShardTracker::Shard& state = tracker_->shard(shard);
    LOG(INFO) << "shard " << shard << " back to the queue from worker[" << worker << "] (" << why
              << "), resuming at line " << state.committed_line;
    events_->Record(
        "shard_reassigned",
        {{"shard", shard},
         {"from_worker", worker},
         {"reason", why},
         {"resume_offset", state.committed_offset},
         {"resume_line", state.committed_line},
         {"since_last_seen_ms",
          since_last_seen.has_value() ? absl::ToDoubleMilliseconds(*since_last_seen) : 0.0}});
  }
}

std::set<uint32_t> TrainingProgress::HoldersOfShardsInProgress() const {
  std::set<uint32_t> holders;
  for (uint64_t id = 0; tracker_ && id < tracker_->num_shards(); ++id) {
    const ShardTracker::Shard& shard = tracker_->shard(id);
    if (shard.state == ShardTracker::State::kDoing) holders.insert(shard.holder);
  }
  return holders;
}

TrainingProgress::PassEnd TrainingProgress::AdvanceIfPassDone() {
  if (!tracker_ || !tracker_->finished()) return PassEnd::kNone;
  if (phase_ == JobPhase::kTraining) {
    const proto::EpochLedger& entry = Ledger(epoch_);
    const double loss = entry.records_committed() > 0
                            ? entry.loss_sum() / static_cast<double>(entry.records_committed())
                            : 0.0;
    LOG(INFO) << "epoch " << epoch_ + 1 << " done: " << entry.lines_committed() << " of "
              << entry.records_expected() << " lines committed once each"
              << (entry.lines_skipped() > 0
                      ? absl::StrCat(", ", entry.lines_skipped(), " skipped (unreadable)")
                      : std::string())
              << ", train loss " << absl::StrFormat("%.5f", loss);
    events_->Record("epoch_finished", {{"epoch", epoch_ + 1},
                                       {"lines_committed", entry.lines_committed()},
                                       {"lines_skipped", entry.lines_skipped()},
                                       {"lines_expected", entry.records_expected()},
                                       {"train_loss", loss}});
    if (epoch_ + 1 < static_cast<uint32_t>(job_.job.epochs)) {
      StartEpoch(epoch_ + 1);
      return PassEnd::kNextEpoch;
    }
    if (!eval_data_.shards.empty()) {
      StartEvaluation();
      return PassEnd::kEvaluation;
    }
    return PassEnd::kFinished;
  }
  if (phase_ != JobPhase::kEvaluating) return PassEnd::kNone;
  evaluation_.Finish();
  return PassEnd::kFinished;
}

void TrainingProgress::EvalInDataOrder(std::vector<float>* labels,
                                       std::vector<float>* predictions) const {
  labels->clear();
  predictions->clear();
  if (phase_ != JobPhase::kEvaluating && phase_ != JobPhase::kFinished) return;
  if (tracker_) evaluation_.InDataOrder(*tracker_, labels, predictions);
}

std::optional<uint32_t> TrainingProgress::passes_done() const {
  switch (phase_) {
    case JobPhase::kTraining: return epoch_;
    case JobPhase::kEvaluating:
    case JobPhase::kFinished: return epoch_ + 1;
    default: return std::nullopt;
  }
}

void TrainingProgress::Finish() {
  ClosePass();
  phase_ = JobPhase::kFinished;
  tracker_.reset();
}

void TrainingProgress::Fail(const std::string& reason, bool stopped) {
  if (over()) return;
  ClosePass();
  phase_ = JobPhase::kFailed;
  failure_ = reason;
  stopped_ = stopped;
  tracker_.reset();
}

Status TrainingProgress::AdoptPass(const std::vector<proto::ShardRecord>& shards, bool eval,
                                   uint32_t epoch, uint64_t saved_splits) {
  const DataSet& data = eval ? eval_data_ : train_data_;
  std::vector<uint32_t> order(data.shards.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!eval) order = EpochOrder(epoch, data.shards.size());
  ASSIGN_OR_RETURN(ShardTracker tracker, ShardTracker::FromRecords(shards, order));
  // The saved total includes this pass's splits, which the tracker counts
  // again from its split-off shards: keep only the earlier passes' here.
  if (saved_splits < tracker.splits()) {
    return absl::DataLossError(absl::StrCat("the saved state counts ", saved_splits,
                                            " splits but its pass holds ", tracker.splits(),
                                            " split-off shards"));
  }
  splits_ = saved_splits - tracker.splits();
  tracker_ = std::make_unique<ShardTracker>(std::move(tracker));
  return absl::OkStatus();
}

Status TrainingProgress::ApplyCheckpoint(const proto::CheckpointRecord& checkpoint) {
  const proto::MasterRecord& saved = checkpoint.master();
  std::vector<proto::ShardRecord> shards(checkpoint.shards().begin(), checkpoint.shards().end());
  const JobPhase phase = static_cast<JobPhase>(saved.phase());
  if (phase != JobPhase::kTraining) {
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint.id(), " was taken while ",
                                            JobPhaseName(phase), ", not training"));
  }
  if (tracker_) reassignments_ += tracker_->reassignments();
  RETURN_IF_ERROR(AdoptPass(shards, /*eval=*/false, saved.epoch(), saved.splits()));
  if (records_trained_ > saved.records_trained()) {
    records_retrained_ += records_trained_ - saved.records_trained();
  }
  phase_ = phase;
  epoch_ = saved.epoch();
  records_trained_ = saved.records_trained();
  records_malformed_ = saved.records_malformed();
  malformed_examples_.assign(saved.malformed_examples().begin(), saved.malformed_examples().end());
  ledger_.assign(saved.ledger().begin(), saved.ledger().end());
  evaluation_.Reset();
  loss_watch_.Reset();
  clear_pass_ = true;
  MarkAllShards();
  // The shards in progress at the checkpoint go back to the queue from
  // where they were then; their holders are fenced everywhere by now.
  for (uint32_t holder : HoldersOfShardsInProgress()) {
    ReleaseShardsOf(holder, "rolled back", std::nullopt);
  }
  return absl::OkStatus();
}

void TrainingProgress::SaveShards(proto::CheckpointRecord* checkpoint) const {
  for (uint64_t shard = 0; tracker_ && shard < tracker_->num_shards(); ++shard) {
    *checkpoint->add_shards() = tracker_->ToRecord(shard);
  }
}

std::optional<uint64_t> TrainingProgress::PassLinesLeft() const {
  if (!tracker_) return std::nullopt;
  const DataSet& data = phase_ == JobPhase::kEvaluating ? eval_data_ : train_data_;
  return data.lines - std::min(data.lines, tracker_->committed_lines() + tracker_->skipped_lines());
}

double TrainingProgress::PassFraction() const {
  if (!tracker_) return phase_ == JobPhase::kFinished ? 1.0 : 0.0;
  const DataSet& data = phase_ == JobPhase::kEvaluating ? eval_data_ : train_data_;
  return static_cast<double>(tracker_->committed_lines() + tracker_->skipped_lines()) /
         static_cast<double>(std::max<uint64_t>(1, data.lines));
}

std::optional<double> TrainingProgress::JobLinesLeft() const {
  const std::optional<uint64_t> pass_left = PassLinesLeft();
  if (!pass_left.has_value() || over()) return std::nullopt;
  double left = static_cast<double>(*pass_left);
  if (phase_ != JobPhase::kEvaluating) {
    const uint32_t later_epochs = static_cast<uint32_t>(job_.job.epochs) - epoch_ - 1;
    left += static_cast<double>(later_epochs) * static_cast<double>(train_data_.lines) +
            static_cast<double>(eval_data_.lines);
  }
  return left;
}

std::optional<double> TrainingProgress::RunningLoss() const {
  if (phase_ != JobPhase::kTraining || epoch_ >= ledger_.size() ||
      ledger_[epoch_].records_committed() == 0) {
    return std::nullopt;
  }
  return ledger_[epoch_].loss_sum() / static_cast<double>(ledger_[epoch_].records_committed());
}

std::optional<std::string> TrainingProgress::NonFiniteLoss(
    uint32_t worker, const proto::CommitProgressRequest& commit) const {
  if (std::isfinite(commit.loss_sum())) return std::nullopt;
  std::string where = absl::StrCat("shard ", commit.shard_id());
  if (tracker_ != nullptr && commit.shard_id() < tracker_->num_shards()) {
    const ShardTracker::Shard& shard = tracker_->shard(commit.shard_id());
    absl::StrAppend(&where, " (", train_data_.files[shard.spec.file], " from line ",
                    shard.committed_line, ")");
  }
  return absl::StrCat("training diverged in epoch ", epoch_ + 1, ": worker[", worker,
                      "] computed a non-finite loss (", commit.loss_sum(), ") on ", commit.lines(),
                      " lines of ", where);
}

bool TrainingProgress::EpochComplete(size_t e) const {
  return e < epoch_ || phase_ == JobPhase::kEvaluating || phase_ == JobPhase::kFinished;
}

uint64_t TrainingProgress::reassignments() const {
  return reassignments_ + (tracker_ ? tracker_->reassignments() : 0);
}

uint64_t TrainingProgress::splits() const { return splits_ + (tracker_ ? tracker_->splits() : 0); }

void TrainingProgress::TakeChanges(StateUpdate* update) {
  if (clear_pass_) update->ClearPass();
  clear_pass_ = false;
  if (data_dirty_) {
    update->PutDataSet(/*eval=*/false, DataSetToRecord(train_data_));
    update->PutDataSet(/*eval=*/true, DataSetToRecord(eval_data_));
    data_dirty_ = false;
  }
  if (tracker_) {
    for (uint64_t id : dirty_shards_) update->PutShard(id, tracker_->ToRecord(id));
  }
  dirty_shards_.clear();
  evaluation_.TakeChanges(update);
}

void TrainingProgress::SaveTo(proto::MasterRecord* record) const {
  record->set_phase(static_cast<uint32_t>(phase_));
  record->set_epoch(epoch_);
  record->set_failure(failure_);
  record->set_stopped(stopped_);
  record->set_records_trained(records_trained_);
  record->set_records_retrained(records_retrained_);
  record->set_records_malformed(records_malformed_);
  record->set_reassignments(reassignments());
  record->set_splits(splits());
  for (const proto::EpochLedger& entry : ledger_) *record->add_ledger() = entry;
  evaluation_.SaveTo(record);
  for (const std::string& example : malformed_examples_) record->add_malformed_examples(example);
  if (tracker_) record->set_shards_in_pass(tracker_->num_shards());
}

void TrainingProgress::RestoreCounts(const proto::MasterRecord& record) {
  records_trained_ = record.records_trained();
  records_retrained_ = record.records_retrained();
  records_malformed_ = record.records_malformed();
  reassignments_ = record.reassignments();
  splits_ = record.splits();
  ledger_.assign(record.ledger().begin(), record.ledger().end());
  evaluation_.RestoreFrom(record);
  malformed_examples_.assign(record.malformed_examples().begin(),
                             record.malformed_examples().end());
  epoch_ = record.epoch();
}

Status TrainingProgress::RestoreFrom(const MasterSnapshot& snapshot) {
  const proto::MasterRecord& record = snapshot.master;
  RestoreCounts(record);
  const JobPhase phase = static_cast<JobPhase>(record.phase());
  if (phase == JobPhase::kScanning) return absl::OkStatus();  // nothing handed out: scan again
  train_data_ = DataSetFromRecord(snapshot.train);
  eval_data_ = DataSetFromRecord(snapshot.eval);
  data_ready_ = true;
  phase_ = phase;
  std::vector<proto::ShardRecord> shards;
  for (const auto& [id, shard] : snapshot.shards) {
    if (id != shards.size()) return absl::DataLossError("the saved shard ids have a gap");
    shards.push_back(shard);
  }
  RETURN_IF_ERROR(AdoptPass(shards, phase == JobPhase::kEvaluating, epoch_, splits_));
  evaluation_.RestoreResults(snapshot);
  return absl::OkStatus();
}

void TrainingProgress::RestoreForResume(const MasterSnapshot& snapshot,
                                        const proto::CheckpointRecord& checkpoint) {
  RestoreCounts(snapshot.master);
  train_data_ = DataSetFromRecord(snapshot.train);
  eval_data_ = DataSetFromRecord(snapshot.eval);
  data_ready_ = true;
  phase_ = static_cast<JobPhase>(checkpoint.master().phase());
  epoch_ = checkpoint.master().epoch();
}

}  // namespace eps
