// JobControl's bounds on every wait outside the master (docs/design.md
// 2.14): servers to register, a holder's progress, workers to train,
// checkpoints that keep failing; and what /status says it waits for.
// Recovery and fence rounds bound themselves (Recovery::Next,
// FencesRefused).

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "master/job_control.h"

namespace eps {
void JobControl::EnforceBounds(absl::Time now) {
  if (over()) return;
  const JobPhase phase = progress_.phase();
  // Servers to register: before training, a missing server fails the job
  // (nothing was trained, there is nothing to resume); once training, a
  // lost one starts a recovery, which has its own bound.
  const bool servers_missing =
      phase == JobPhase::kScanning && !recovery_.active() &&
      (membership_.servers().size() < static_cast<size_t>(job_.ps.num_servers) ||
       !membership_.all_servers_alive());
  if (!servers_missing) {
    servers_missing_since_ = absl::InfiniteFuture();
  } else if (servers_missing_since_ == absl::InfiniteFuture()) {
    servers_missing_since_ = now;
  } else if (now - servers_missing_since_ > absl::Seconds(job_.master.recovery_timeout_s)) {
    Fail(absl::StrCat("only ", membership_.alive_servers(), " of ", job_.ps.num_servers,
                      " parameter server(s) registered within master.recovery_timeout_s (",
                      job_.master.recovery_timeout_s,
                      " s): start the missing eps-server processes, then start the job again"),
         /*stopped=*/false, now);
    return;
  }
  const bool training = phase == JobPhase::kTraining || phase == JobPhase::kEvaluating;
  if (!training) return;

  // A shard's holder that makes no progress (a hung trainer, a dead GPU)
  // is fenced; its shards move once every server refuses it. Time the
  // job held workers back does not count: a recovery holds every worker,
  // a checkpoint round only those that paused for it (a hung trainer never
  // pauses: the round waits for it, not it for the round).
  if (recovery_.active()) held_until_ = now;
  const absl::Duration patience = absl::Seconds(job_.master.progress_timeout_s);
  for (uint32_t holder : progress_.HoldersOfShardsInProgress()) {
    auto it = membership_.workers().find(holder);
    if (it == membership_.workers().end() || it->second.state != PeerState::kAlive) continue;
    const absl::Time since =
        std::max({it->second.last_progress, held_until_, it->second.held_until});
    if (now - since <= patience) continue;
    progress_.AddRetrained(membership_.FenceAlive(
        holder, now,
        absl::StrCat("it holds a shard and made no progress for ",
                     absl::FormatDuration(absl::Trunc(now - since, absl::Milliseconds(100))),
                     " (master.progress_timeout_s = ", job_.master.progress_timeout_s,
                     " s): a hung trainer?")));
  }

  // Workers to train: the job stops (resumably) when none came for long.
  // (An export due needs no worker.)
  if (membership_.alive_workers() > 0 || recovery_.active() || export_due_ ||
      job_.master.worker_wait_s == 0) {
    no_workers_since_ = absl::InfiniteFuture();
  } else if (no_workers_since_ == absl::InfiniteFuture()) {
    no_workers_since_ = now;
  } else if (now - no_workers_since_ > absl::Seconds(job_.master.worker_wait_s)) {
    Stop(absl::StrCat("no worker was alive for ", FormatSeconds(now - no_workers_since_),
                      " (master.worker_wait_s = ", job_.master.worker_wait_s,
                      " s): start eps-worker processes, then run eps-master --resume"),
         now);
    return;
  }

  // Checkpoints that keep failing leave nothing newer to return to.
  if (job_.checkpoint.max_failures > 0 &&
      checkpoints_.consecutive_failures() >= static_cast<uint64_t>(job_.checkpoint.max_failures)) {
    Stop(absl::StrCat(
             "the last ", checkpoints_.consecutive_failures(),
             " checkpoints failed (checkpoint.max_failures = ", job_.checkpoint.max_failures,
             "), the last one: ", checkpoints_.last_failure(),
             "; fix the cause, then run eps-master --resume"),
         now);
  }
}

std::vector<std::string> JobControl::Waits(absl::Time now) const {
  std::vector<std::string> waits;
  if (over()) return waits;
  if (servers_missing_since_ != absl::InfiniteFuture()) {
    waits.push_back(
        absl::StrCat("parameter servers to register: ", membership_.servers().size(), " of ",
                     job_.ps.num_servers, " for ", FormatSeconds(now - servers_missing_since_),
                     " (master.recovery_timeout_s = ", job_.master.recovery_timeout_s, " s)"));
  }
  if (recovery_.active()) {
    const std::vector<uint32_t> missing = membership_.MissingServers();
    waits.push_back(absl::StrCat(
        "recovery (", recovery_.why(), ") for ", FormatSeconds(now - recovery_.started()), ": ",
        !missing.empty() ? absl::StrCat("ps[", absl::StrJoin(missing, "], ps["), "] to come back")
        : membership_.fencing() ? std::string("the servers to acknowledge the fence list")
                                : std::string("the servers to restore"),
        " (master.recovery_timeout_s = ", job_.master.recovery_timeout_s, " s)"));
  }
  if (const std::optional<uint64_t> round = checkpoints_.round_id(); round.has_value()) {
    waits.push_back(
        absl::StrCat("checkpoint ", *round, ": ",
                     checkpoints_.writing() ? "the servers to write it" : "the workers to pause"));
  }
  if (import_due_) {
    waits.push_back(absl::StrCat(
        "the servers to load the model in ", job_.job.init_from, " (attempt ",
        import_attempts_ + 1, " of ", kMaxExportAttempts,
        import_error_.empty() ? std::string() : absl::StrCat("; the last failed: ", import_error_),
        ")"));
  }
  if (export_due_) {
    waits.push_back(absl::StrCat(
        "the servers to export the model to ", job_.job.export_dir, " for ",
        FormatSeconds(now - export_due_since_), " (attempt ", export_attempts_ + 1, " of ",
        kMaxExportAttempts,
        export_error_.empty() ? std::string() : absl::StrCat("; the last failed: ", export_error_),
        ")"));
  }
  if (no_workers_since_ != absl::InfiniteFuture()) {
    waits.push_back(absl::StrCat("workers: none alive for ", FormatSeconds(now - no_workers_since_),
                                 " (master.worker_wait_s = ", job_.master.worker_wait_s, " s)"));
  }
  return waits;
}

}  // namespace eps
