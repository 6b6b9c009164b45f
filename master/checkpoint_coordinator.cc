#include "master/checkpoint_coordinator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"

namespace eps {

using nlohmann::json;

CheckpointCoordinator::CheckpointCoordinator(const JobConfig& job, EventSink* events)
    : job_(job), events_(events) {}

std::optional<uint64_t> CheckpointCoordinator::MaybeStart(absl::Time now, bool may_start) {
  if (round_.has_value() || !may_start) return std::nullopt;
  if (next_ == absl::InfiniteFuture()) next_ = now + absl::Seconds(job_.checkpoint.interval_s);
  if (!requested_ && now < next_) return std::nullopt;
  requested_ = false;
  round_ = Round{.id = ++last_id_, .started = now, .patient_since = now};
  VLOG(1) << "checkpoint " << round_->id << ": pausing the workers";
  return round_->id;
}

uint64_t CheckpointCoordinator::Request() {
  if (round_.has_value()) return round_->id;
  requested_ = true;
  return last_id_ + 1;
}

std::vector<uint32_t> CheckpointCoordinator::OverdueToPause(
    absl::Time now, const std::vector<uint32_t>& not_paused) {
  if (!round_.has_value() || round_->writing || round_->overdue_named || not_paused.empty() ||
      now - round_->patient_since <= Patience()) {
    return {};
  }
  round_->overdue_named = true;
  round_->patient_since = now;
  return not_paused;
}

std::optional<CheckpointCoordinator::Write> CheckpointCoordinator::Next(
    absl::Time now, const std::vector<uint32_t>& not_paused, bool fences_pending,
    bool job_over) {
  if (!round_.has_value() || round_->writing) return std::nullopt;
  if (!not_paused.empty() || fences_pending) {
    // A worker finishes the batch in hand first; one that cannot within
    // two leases (a huge batch, a stuck call) makes the round give up.
    const absl::Duration patience = Patience();
    if (job_over || now - round_->patient_since > patience) {
      const std::string why =
          job_over ? "the job is over"
          : not_paused.empty()
              ? absl::StrCat("dead workers were not fenced at every server within ",
                             absl::FormatDuration(patience))
              : absl::StrCat("worker(s) ", absl::StrJoin(not_paused, ", "),
                             " did not pause within ", absl::FormatDuration(patience),
                             " (a batch that takes that long? see their logs)");
      Fail(absl::StrCat("abandoned: ", why), now);
    }
    return std::nullopt;
  }
  round_->writing = true;
  Write write{.id = round_->id, .started = round_->started, .keep = {}};
  // The newest checkpoint.keep - 1 complete ones stay with the new one.
  const size_t keep_others = static_cast<size_t>(job_.checkpoint.keep) - 1;
  for (size_t i = kept_.size() > keep_others ? kept_.size() - keep_others : 0; i < kept_.size();
       ++i) {
    write.keep.push_back(kept_[i]);
  }
  return write;
}

StateUpdate CheckpointCoordinator::CompleteUpdate(const proto::CheckpointRecord& record) const {
  StateUpdate update;
  update.PutCheckpoint(record);
  // The oldest ones beyond checkpoint.keep go with the same write (the list
  // changes in Completed, once the write succeeded).
  const size_t keep = static_cast<size_t>(job_.checkpoint.keep);
  for (size_t i = 0; i + keep < kept_.size() + 1; ++i) update.DeleteCheckpoint(kept_[i]);
  return update;
}

void CheckpointCoordinator::Completed(const proto::CheckpointRecord& record, absl::Time now) {
  kept_.push_back(record.id());
  while (kept_.size() > static_cast<size_t>(job_.checkpoint.keep)) kept_.pop_front();
  ++written_;
  consecutive_failures_ = 0;
  last_ = record;
  pause_s_ += record.pause_ms() / 1000;
  const json result = RecordJson(record);
  SetResult(record.id(), result);
  events_->Record("checkpoint", result);
  LOG(INFO) << "checkpoint " << record.id() << ": " << record.servers_size() << " server(s), "
            << record.bytes() << " bytes, workers paused " << record.pause_ms() << " ms";
  round_.reset();
  next_ = now + absl::Seconds(job_.checkpoint.interval_s);
}

void CheckpointCoordinator::Fail(const std::string& error, absl::Time now, bool counts) {
  const uint64_t id = round_->id;
  if (counts) {
    ++consecutive_failures_;
    last_failure_ = absl::StrCat("checkpoint ", id, ": ", error);
  }
  LOG(WARNING) << "checkpoint " << id << " failed: " << error;
  events_->Record("checkpoint_failed", {{"checkpoint", id}, {"error", error}});
  SetResult(id, {{"checkpoint", id}, {"error", error}});
  ++failed_;
  round_.reset();
  next_ = now + absl::Seconds(job_.checkpoint.interval_s);
}

void CheckpointCoordinator::AbandonPausing(const std::string& why, absl::Time now) {
  if (round_.has_value() && !round_->writing) {
    Fail(absl::StrCat("abandoned: ", why), now, /*counts=*/false);
  }
}

void CheckpointCoordinator::RecordStart(proto::CheckpointRecord start) {
  last_ = start;
  pending_ = std::move(start);
}

std::optional<proto::CheckpointRecord> CheckpointCoordinator::TakePendingRecord() {
  std::optional<proto::CheckpointRecord> pending = std::move(pending_);
  pending_.reset();
  return pending;
}

std::optional<uint64_t> CheckpointCoordinator::round_id() const {
  if (!round_.has_value()) return std::nullopt;
  return round_->id;
}

const json* CheckpointCoordinator::Result(uint64_t id) const {
  auto it = results_.find(id);
  return it == results_.end() ? nullptr : &it->second;
}

json CheckpointCoordinator::LastResult() const {
  for (auto it = results_.rbegin(); it != results_.rend(); ++it) {
    if (!it->second.contains("error")) return it->second;
  }
  return nullptr;
}

void CheckpointCoordinator::SetResult(uint64_t id, json result) {
  results_[id] = std::move(result);
  while (results_.size() > 16) results_.erase(results_.begin());
}

json CheckpointCoordinator::RecordJson(const proto::CheckpointRecord& record) {
  json doc = {{"checkpoint", record.id()},
              {"duration_ms", record.duration_ms()},
              {"pause_ms", record.pause_ms()},
              {"bytes", record.bytes()},
              {"epoch", record.master().epoch() + 1},
              {"records_trained", record.master().records_trained()},
              {"servers", json::array()}};
  for (const proto::ServerCheckpoint& part : record.servers()) {
    doc["servers"].push_back({{"id", part.server_id()},
                              {"path", part.path()},
                              {"bytes", part.bytes()},
                              {"duration_ms", part.duration_ms()}});
  }
  return doc;
}

void CheckpointCoordinator::RestoreFrom(const MasterSnapshot& snapshot) {
  last_id_ = snapshot.master.last_checkpoint_id();
  // Ascending ids: the last one is the newest. A checkpoint interrupted by a
  // crash has no record and is not among them.
  for (const auto& [id, checkpoint] : snapshot.checkpoints) {
    last_ = checkpoint;
    if (id == 0) continue;  // the start of training, not a written one
    kept_.push_back(id);
    last_id_ = std::max(last_id_, id);
    SetResult(id, RecordJson(checkpoint));
  }
  written_ = kept_.size();
}

}  // namespace eps
