#include "master/autoscale/worker_fleet.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/logging.h"

namespace eps {
namespace {

// A worker that dies sooner than this after its launch is in a crash loop.
constexpr absl::Duration kEarlyDeath = absl::Minutes(1);
constexpr int kMaxBackoffDoublings = 6;  // 64 times restart_backoff_s

}  // namespace

WorkerFleet::WorkerFleet(const JobConfig& job, EventSink* events, uint64_t first_launch_id)
    : options_(job.autoscale),
      start_timeout_(std::max(absl::Minutes(2), absl::Seconds(job.autoscale.source_timeout_s +
                                                              job.worker.master_wait_s))),
      stop_grace_(std::max(absl::Seconds(30),
                           absl::Milliseconds(job.master.lease_ms +
                                              job.worker.rpc_timeout_ms * job.worker.rpc_attempts))),
      lease_(absl::Milliseconds(job.master.lease_ms)),
      events_(events),
      next_launch_id_(first_launch_id) {}

const char* WorkerFleet::StateName(State state) {
  switch (state) {
    case State::kStarting:
      return "starting";
    case State::kRunning:
      return "running";
    case State::kStopping:
      return "stopping";
    case State::kKilled:
      return "killed";
  }
  return "unknown";
}

void WorkerFleet::Lost(absl::Duration lived, absl::Time now) {
  ++owed_;
  if (lived >= kEarlyDeath) {
    early_deaths_in_a_row_ = 0;
    return;
  }
  ++early_deaths_in_a_row_;
  const int doublings = std::min(early_deaths_in_a_row_ - 1, kMaxBackoffDoublings);
  backoff_until_ = now + absl::Seconds(options_.restart_backoff_s) * (1 << doublings);
}

void WorkerFleet::Kill(uint64_t launch_id, Member& member, bool replace, const std::string& why,
                       absl::Time now, Plan* plan) {
  LOG(WARNING) << "autoscale: killing worker launch " << launch_id << " (" << member.handle
               << "): " << why;
  if (replace) {
    events_->Record("worker_stuck", {{"launch_id", launch_id}, {"reason", why}});
    Lost(member.state == State::kStarting ? absl::ZeroDuration() : now - member.launched, now);
  }
  member.state = State::kKilled;
  member.stop_sent = now;
  plan->kill.push_back(launch_id);
}

WorkerFleet::Plan WorkerFleet::Next(int64_t target, const std::map<uint64_t, Seen>& seen,
                                    absl::Time now) {
  Plan plan;
  for (auto it = members_.begin(); it != members_.end();) {
    const uint64_t id = it->first;
    Member& member = it->second;
    auto found = seen.find(id);
    const Seen* view = found == seen.end() ? nullptr : &found->second;
    switch (member.state) {
      case State::kStarting:
        if (view != nullptr && view->alive) {
          member.state = State::kRunning;
        } else if (now - member.launched > start_timeout_) {
          // A start that never got to training is an early death.
          Kill(id, member, /*replace=*/true,
               absl::StrCat("not registered ", FormatSeconds(now - member.launched),
                            " after its launch"),
               now, &plan);
        }
        break;
      case State::kRunning:
        if (view == nullptr || view->alive) break;
        if (view->stalled) {
          Kill(id, member, /*replace=*/true,
               std::string("the master fenced it for making no progress (master.progress_timeout_s)"),
               now, &plan);
        } else if (now - view->gone_since > lease_) {
          Kill(id, member, /*replace=*/true,
               absl::StrCat("no heartbeat and no new registration for ",
                            FormatSeconds(now - view->gone_since), " (a frozen process?)"),
               now, &plan);
        }
        break;
      case State::kStopping:
        if (now - member.stop_sent > stop_grace_) {
          Kill(id, member, /*replace=*/false,
               absl::StrCat("still running ", FormatSeconds(now - member.stop_sent),
                            " after it was asked to stop"),
               now, &plan);
        }
        break;
      case State::kKilled:
        if (now - member.stop_sent > stop_grace_) {
          LOG(WARNING) << "autoscale: worker launch " << id << " (" << member.handle
                       << ") was killed " << FormatSeconds(now - member.stop_sent)
                       << " ago and its end was never seen; forgetting it";
          it = members_.erase(it);
          continue;
        }
        break;
    }
    ++it;
  }

  const int64_t live_now = live();
  if (live_now >= target) owed_ = 0;  // nothing to replace beyond the target
  if (live_now > target) {
    // Those that lose the least uncommitted work first.
    std::vector<std::tuple<int, absl::Time, uint64_t>> order;  // (class, recency, id)
    for (const auto& [id, member] : members_) {
      if (member.state == State::kStarting) {
        order.emplace_back(0, member.launched, id);
      } else if (member.state == State::kRunning) {
        auto found = seen.find(id);
        const bool holds = found != seen.end() && found->second.holds_shard;
        const absl::Time last = found != seen.end() ? found->second.last_progress : member.launched;
        order.emplace_back(holds ? 2 : 1, last, id);
      }
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
      if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) > std::get<1>(b);  // newest
      return std::get<2>(a) > std::get<2>(b);  // launched last
    });
    for (int64_t i = 0; i < live_now - target && i < static_cast<int64_t>(order.size()); ++i) {
      const uint64_t id = std::get<2>(order[i]);
      Member& member = members_[id];
      member.state = State::kStopping;
      member.stop_sent = now;
      plan.stop.push_back(id);
    }
  } else if (live_now < target) {
    const int64_t wanted = target - live_now;
    const int64_t replacing = std::min(wanted, owed_);
    if (replacing > 0 && restarts_ + replacing > options_.max_restarts) {
      if (!limit_reported_) {
        limit_reported_ = true;
        const std::string why =
            absl::StrCat(restarts_, " workers were replaced already (autoscale.max_restarts = ",
                         options_.max_restarts, "): launching no more; see the workers' logs");
        LOG(ERROR) << "autoscale: " << why;
        events_->Record("restart_limit_reached", {{"restarts", restarts_}, {"reason", why}});
      }
    } else if (now >= backoff_until_) {
      plan.launches = static_cast<int>(wanted);
      if (replacing > 0) {
        restarts_ += replacing;
        owed_ -= replacing;
        events_->Record("worker_replaced", {{"workers", replacing}, {"restarts", restarts_}});
      }
    }
  }
  return plan;
}

void WorkerFleet::Launched(uint64_t launch_id, const std::string& handle, absl::Time now) {
  Member& member = members_[launch_id];
  member.handle = handle;
  member.state = State::kStarting;
  member.launched = now;
  events_->Record("worker_launched", {{"launch_id", launch_id}, {"handle", handle}});
}

void WorkerFleet::LaunchFailed(uint64_t launch_id, const std::string& error, absl::Time now) {
  LOG(ERROR) << "autoscale: cannot launch worker " << launch_id << ": " << error;
  events_->Record("worker_launch_failed", {{"launch_id", launch_id}, {"error", error}});
  Lost(absl::ZeroDuration(), now);
}

void WorkerFleet::Exited(uint64_t launch_id, int exit_code, absl::Time now) {
  auto it = members_.find(launch_id);
  if (it == members_.end()) return;
  const Member& member = it->second;
  if (member.state == State::kStopping) {
    events_->Record("worker_stopped", {{"launch_id", launch_id}, {"exit_code", exit_code}});
  } else if (member.state != State::kKilled) {
    LOG(WARNING) << "autoscale: worker launch " << launch_id << " (" << member.handle
                 << ") exited with " << exit_code << " after " << FormatSeconds(now - member.launched);
    events_->Record("worker_exited", {{"launch_id", launch_id}, {"exit_code", exit_code}});
    Lost(now - member.launched, now);
  }
  members_.erase(it);
}

int64_t WorkerFleet::starting() const {
  int64_t count = 0;
  for (const auto& [id, member] : members_) count += member.state == State::kStarting;
  return count;
}

int64_t WorkerFleet::stopping() const {
  int64_t count = 0;
  for (const auto& [id, member] : members_) count += member.state == State::kStopping;
  return count;
}

int64_t WorkerFleet::live() const {
  int64_t count = 0;
  for (const auto& [id, member] : members_) {
    count += member.state == State::kStarting || member.state == State::kRunning;
  }
  return count;
}

std::string WorkerFleet::handle(uint64_t launch_id) const {
  auto it = members_.find(launch_id);
  return it == members_.end() ? std::string() : it->second.handle;
}

std::vector<uint64_t> WorkerFleet::launched() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, member] : members_) ids.push_back(id);
  return ids;
}

nlohmann::json WorkerFleet::ToJson(absl::Time now) const {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& [id, member] : members_) {
    workers.push_back({{"launch_id", id}, {"state", StateName(member.state)},
                       {"handle", member.handle}});
  }
  nlohmann::json out = {{"live", live()},
                        {"starting", starting()},
                        {"stopping", stopping()},
                        {"restarts", restarts_},
                        {"restarts_left", std::max<int64_t>(0, options_.max_restarts - restarts_)},
                        {"workers", workers}};
  if (backoff_until_ > now) out["backoff_s"] = absl::ToDoubleSeconds(backoff_until_ - now);
  return out;
}

}  // namespace eps
