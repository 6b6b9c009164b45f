#include "master/wait_bounds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/clock.h"

namespace eps {

WaitBounds::Verdict WaitBounds::Check(const Facts& facts, absl::Time now) {
  Verdict verdict;
  const bool servers_missing =
      facts.scanning && !facts.recovering &&
      (facts.servers_registered < static_cast<size_t>(job_.ps.num_servers) ||
       !facts.all_servers_alive);
  if (!servers_missing) {
    servers_missing_since_ = absl::InfiniteFuture();
  } else if (servers_missing_since_ == absl::InfiniteFuture()) {
    servers_missing_since_ = now;
  } else if (now - servers_missing_since_ > absl::Seconds(job_.master.recovery_timeout_s)) {
    verdict.fail = absl::StrCat(
        "only ", facts.servers_alive, " of ", job_.ps.num_servers,
        " parameter server(s) registered within master.recovery_timeout_s (",
        job_.master.recovery_timeout_s,
        " s): start the missing eps-server processes, then start the job again");
    return verdict;
  }
  if (!facts.training) return verdict;

  if (facts.recovering) held_until_ = now;
  const absl::Duration patience = absl::Seconds(job_.master.progress_timeout_s);
  for (const auto& [holder, last_progress] : facts.holders) {
    const absl::Time since = std::max(last_progress, held_until_);
    if (now - since <= patience) continue;
    verdict.fence.emplace_back(
        holder, absl::StrCat("it holds a shard and made no progress for ",
                             absl::FormatDuration(absl::Trunc(now - since, absl::Milliseconds(100))),
                             " (master.progress_timeout_s = ", job_.master.progress_timeout_s,
                             " s): a hung trainer?"));
  }

  // The holders fenced now are alive no more (each is alive and named
  // once). An export due needs no worker.
  const size_t workers_alive =
      facts.workers_alive - std::min(facts.workers_alive, verdict.fence.size());
  if (workers_alive > 0 || facts.recovering || facts.export_due || facts.workers_coming ||
      job_.master.worker_wait_s == 0) {
    no_workers_since_ = absl::InfiniteFuture();
  } else if (no_workers_since_ == absl::InfiniteFuture()) {
    no_workers_since_ = now;
  } else if (now - no_workers_since_ > absl::Seconds(job_.master.worker_wait_s)) {
    verdict.stop = absl::StrCat("no worker was alive for ", FormatSeconds(now - no_workers_since_),
                                " (master.worker_wait_s = ", job_.master.worker_wait_s,
                                " s): start eps-worker processes, then run eps-master --resume");
    return verdict;
  }

  if (job_.checkpoint.max_failures > 0 &&
      facts.checkpoint_failures >= static_cast<uint64_t>(job_.checkpoint.max_failures)) {
    verdict.stop = absl::StrCat(
        "the last ", facts.checkpoint_failures,
        " checkpoints failed (checkpoint.max_failures = ", job_.checkpoint.max_failures,
        "), the last one: ", facts.last_checkpoint_failure,
        "; fix the cause, then run eps-master --resume");
  }
  return verdict;
}

std::optional<std::string> WaitBounds::ServersWait(size_t servers_registered,
                                                   absl::Time now) const {
  if (servers_missing_since_ == absl::InfiniteFuture()) return std::nullopt;
  return absl::StrCat("parameter servers to register: ", servers_registered, " of ",
                      job_.ps.num_servers, " for ", FormatSeconds(now - servers_missing_since_),
                      " (master.recovery_timeout_s = ", job_.master.recovery_timeout_s, " s)");
}

std::optional<std::string> WaitBounds::WorkersWait(absl::Time now) const {
  if (no_workers_since_ == absl::InfiniteFuture()) return std::nullopt;
  return absl::StrCat("workers: none alive for ", FormatSeconds(now - no_workers_since_),
                      " (master.worker_wait_s = ", job_.master.worker_wait_s, " s)");
}

}  // namespace eps
