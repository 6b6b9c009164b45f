// JobControl's recoveries: a lost server starts one (a rollback to the
// last checkpoint, or continuing when nothing was trained), the fence
// rounds it waits for, and the RESTORE calls the driver makes for it
// (Master::Impl::AdvanceRecovery hands the servers' replies back here);
// Recovery is the step-by-step state machine.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "master/job_control.h"

namespace eps {

using nlohmann::json;

void JobControl::StartRecovery(uint32_t server, const std::string& why, absl::Time now) {
  if (over()) return;
  const std::optional<proto::CheckpointRecord>& last = checkpoints_.last();
  if (!last.has_value()) {
    // Training has not started: nothing is lost. A server that takes the
    // slot (MaybeStartTraining waits for one) is all it takes.
    LOG(WARNING) << why << " before training started; waiting for a server to take its place";
    return;
  }
  const bool rollback = job_.checkpoint.on_server_failure == "rollback";
  // A rollback may take the passes back; the export is due again once they
  // are done (Tick), afresh.
  export_due_ = false;
  export_due_since_ = absl::InfiniteFuture();
  export_attempts_ = 0;
  export_error_.clear();
  if (recovery_.Start(why, rollback, server, now)) {
    LOG(WARNING) << why << ": restoring "
                 << (rollback ? "the job" : absl::StrCat("ps[", server, "]"))
                 << " from checkpoint " << last->id() << " (checkpoint.on_server_failure = "
                 << job_.checkpoint.on_server_failure
                 << ") once a server takes its place: restart it on its --data-dir, or start an "
                    "eps-server on a fresh --data-dir"
                 << (job_.checkpoint.dir.empty() ? " that can read its checkpoint path" : "");
    events_->Record("recovery_started", {{"server", server},
                                         {"reason", why},
                                         {"checkpoint", last->id()},
                                         {"mode", job_.checkpoint.on_server_failure}});
    // A move's servers may be the ones restored, and the restore may give
    // partitions back to other owners: the moves are planned again after
    // (drains and a balance go on once the job trains).
    AbandonMoves(why);
    moves_.Clear();
    // No worker may push until the servers are restored: all register again.
    progress_.AddRetrained(membership_.FenceAllAlive(now, why));
    // A round still waiting for workers to pause will not see them again.
    checkpoints_.AbandonPausing(why, now);
    checkpoints_.CancelRequest();
  }
  membership_.Bump();
}

void JobControl::FencesAcknowledged(const Membership::FenceRound& round, absl::Time now) {
  for (const auto& [worker, last_seen] : membership_.FencesAcknowledged(round)) {
    // A rollback replaces the whole pass: its shards need not move now.
    if (recovery_.rollback()) continue;
    auto entry = membership_.workers().find(worker);
    const bool died =
        entry != membership_.workers().end() && entry->second.state == PeerState::kDead;
    progress_.ReleaseShardsOf(worker, "fenced",
                              died ? std::optional(now - entry->second.last_seen) : std::nullopt);
  }
}

void JobControl::FencesRefused(const Membership::FenceRound& round,
                               const std::vector<ServerAddress>& refused, absl::Time now) {
  const absl::Duration patience = absl::Milliseconds(job_.master.lease_ms);
  for (uint32_t slot : membership_.FencesRefused(round, refused, patience, now)) {
    const std::string why = absl::StrCat("did not acknowledge the fence list for more than a lease (",
                                         job_.master.lease_ms, " ms)");
    if (membership_.LoseServer(slot, why, now)) {
      StartRecovery(slot, absl::StrCat("ps[", slot, "] ", why), now);
    }
  }
}

std::optional<Recovery::Step> JobControl::NextRestore(absl::Time now) {
  if (!recovery_.active() || over()) return std::nullopt;
  if (!checkpoints_.last().has_value()) {
    Stop("no complete checkpoint to restore", now);
    return std::nullopt;
  }
  Recovery::Step step = recovery_.Next(membership_, *checkpoints_.last(),
                                       absl::Seconds(job_.job.progress_interval_s),
                                       absl::Seconds(job_.master.recovery_timeout_s), now);
  if (step.waiting_line.has_value()) LOG(WARNING) << *step.waiting_line;
  switch (step.kind) {
    case Recovery::Step::Kind::kWait:
      return std::nullopt;
    case Recovery::Step::Kind::kFail:
      Stop(step.error, now);
      return std::nullopt;
    case Recovery::Step::Kind::kRestore:
      return step;
  }
  return std::nullopt;
}

void JobControl::Restored(const Recovery::Step& step, const std::vector<StatusOr<uint64_t>>& replies,
                          absl::Time restore_started, absl::Time now) {
  if (!recovery_.active() || over()) return;
  const proto::CheckpointRecord checkpoint = *checkpoints_.last();
  std::string error;
  switch (recovery_.Restored(membership_, step, checkpoint.id(), replies, &error)) {
    case Recovery::Verdict::kRetry:
      VLOG(1) << "restoring checkpoint " << checkpoint.id() << ": a server is not ready; trying "
              << "again";
      return;
    case Recovery::Verdict::kFail:
      Stop(error, now);
      return;
    case Recovery::Verdict::kDone:
      break;
  }
  uint64_t bytes = 0;
  for (const StatusOr<uint64_t>& reply : replies) bytes += *reply;
  const uint64_t trained_before = progress_.records_trained();
  const bool rollback = recovery_.rollback();
  if (rollback) {
    Status applied = progress_.ApplyCheckpoint(checkpoint);
    if (!applied.ok()) {
      Stop(
          absl::StrCat("cannot return to checkpoint ", checkpoint.id(), ": ", applied.message()),
          now);
      return;
    }
  }
  std::vector<uint32_t> restored;
  for (const Recovery::RestoreTarget& target : step.targets) restored.push_back(target.slot);
  // A partition moved since the checkpoint lives where it was then.
  membership_.RestoreOwners(checkpoint.master().cluster_map(), restored);
  const uint64_t rolled_back = trained_before - progress_.records_trained();
  json result = {{"reason", recovery_.why()},
                 {"checkpoint", checkpoint.id()},
                 {"mode", rollback ? "rollback" : "continue"},
                 {"servers_restored", restored},
                 {"bytes", bytes},
                 {"records_rolled_back", rolled_back},
                 {"restore_ms", absl::ToDoubleMilliseconds(now - restore_started)},
                 {"took_ms", absl::ToDoubleMilliseconds(now - recovery_.started())}};
  LOG(INFO) << "recovered (" << recovery_.why() << "): ps[" << absl::StrJoin(restored, "], ps[")
            << "] restored to checkpoint " << checkpoint.id() << " in "
            << absl::FormatDuration(absl::Trunc(now - restore_started, absl::Milliseconds(1)))
            << (rollback ? absl::StrCat(", ", rolled_back, " records to train again")
                         : std::string(", the other servers keep their state"))
            << "; "
            << absl::FormatDuration(
                   absl::Trunc(now - recovery_.started(), absl::Milliseconds(100)))
            << " since the failure";
  events_->Record("recovered", result);
  recovery_.Done(std::move(result));
  membership_.Bump();
}

}  // namespace eps
