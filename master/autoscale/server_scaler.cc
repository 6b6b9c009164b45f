#include "master/autoscale/server_scaler.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "rpc/security.h"

namespace eps {
namespace {

using nlohmann::json;

// How often launches are checked between readings.
constexpr absl::Duration kTrackEvery = absl::Seconds(1);
// How long a started server may take to register.
constexpr absl::Duration kStartTimeout = absl::Minutes(2);

}  // namespace

ServerScaler::ServerScaler(const JobConfig& job, Options options, ViewFn view, DrainFn drain,
                           EventSink* events, const Clock* clock)
    : job_(job),
      options_(std::move(options)),
      view_(std::move(view)),
      drain_(std::move(drain)),
      events_(events),
      clock_(clock),
      // By the time in microseconds: a restarted master never reuses the
      // data dir of a server an earlier one started.
      next_launch_id_(static_cast<uint64_t>(absl::ToUnixMicros(clock->Now()))) {}

ServerScaler::~ServerScaler() { Stop(absl::ZeroDuration()); }

void ServerScaler::Start() {
  LOG(INFO) << "autoscale: " << job_.autoscale.min_servers << " to "
            << job_.autoscale.max_servers << " parameter servers, read every "
            << job_.autoscale.interval_s << " s (" << options_.server_binary << ")";
  thread_ = std::thread([this] { Loop(); });
}

void ServerScaler::Stop(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ && !thread_.joinable() && launches_.empty()) return;
    stopped_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  // Reaps the exited until none is left or `until`, releasing the lock
  // between polls (/status reads under it).
  const auto reap = [&](absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      std::erase_if(launches_,
                    [](auto& entry) { return entry.second.process->Poll().has_value(); });
      if (launches_.empty() || clock_->Now() >= until) return;
      mu_.Unlock();
      absl::SleepFor(absl::Milliseconds(20));
      mu_.Lock();
    }
  };
  reap(clock_->Now() + grace);  // the master told them the job is over
  for (auto& [id, launch] : launches_) {
    if (grace > absl::ZeroDuration() && !launch.killed) {
      LOG(WARNING) << "autoscale: server launch " << id << " (pid " << launch.process->pid()
                   << ") still running " << absl::FormatDuration(grace)
                   << " after the job ended; killing it";
    }
    launch.process->Signal(SIGKILL);
  }
  reap(clock_->Now() + absl::Seconds(5));
  launches_.clear();
}

void ServerScaler::Loop() {
  absl::Time next_reading = clock_->Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
    }
    const absl::Time now = clock_->Now();
    const bool read = now >= next_reading;
    if (read) next_reading = now + absl::Seconds(job_.autoscale.interval_s);
    Step(now, read);
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    wake_.WaitWithTimeout(&mu_, kTrackEvery);
  }
}

void ServerScaler::Track(const View& view, absl::Time now) {
  for (auto it = launches_.begin(); it != launches_.end();) {
    Launch& launch = it->second;
    if (!launch.slot.has_value()) {
      for (const auto& [slot, pid] : view.pids) {
        if (pid == static_cast<uint32_t>(launch.process->pid())) launch.slot = slot;
      }
    }
    if (launch.slot.has_value() && view.draining.contains(*launch.slot)) launch.draining = true;
    if (const std::optional<int> code = launch.process->Poll(); code.has_value()) {
      if (!launch.draining && !launch.killed && *code != 0) {
        ++failures_;
        last_error_ = absl::StrCat("server launch ", it->first, " exited with ", *code,
                                   " unasked; its log: ", options_.dir, "/server-", it->first,
                                   ".log");
        LOG(WARNING) << "autoscale: " << last_error_;
        events_->Record("server_launch_exited",
                        {{"launch_id", it->first}, {"exit_code", *code}});
      }
      it = launches_.erase(it);
      continue;
    }
    if (!launch.slot.has_value() && !launch.killed && now - launch.started > kStartTimeout) {
      ++failures_;
      last_error_ = absl::StrCat("server launch ", it->first, " did not join the job within ",
                                 absl::FormatDuration(kStartTimeout), "; killed. Its log: ",
                                 options_.dir, "/server-", it->first, ".log");
      LOG(WARNING) << "autoscale: " << last_error_;
      events_->Record("server_launch_failed", {{"launch_id", it->first}});
      launch.process->Signal(SIGKILL);  // reaped by a later Track
      launch.killed = true;
    }
    ++it;
  }
}

bool ServerScaler::LaunchOne(absl::Time now) {
  const uint64_t id = next_launch_id_++;
  const std::string data_dir = absl::StrCat(options_.dir, "/server-", id);
  if (failures_ > job_.autoscale.max_restarts) {
    last_error_ = absl::StrCat(failures_, " servers failed to start or exited unasked, more than "
                               "autoscale.max_restarts = ", job_.autoscale.max_restarts,
                               ": starting no more");
    LOG(WARNING) << "autoscale: " << last_error_;
    return false;
  }
  std::error_code error;
  std::filesystem::create_directories(options_.dir, error);
  const std::string& secret = secrets_[id] = NewSecret();
  // The environment of a process is readable by its user alone.
  StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(
      {options_.server_binary, "--config", options_.config, "--master", options_.master_endpoint,
       "--data-dir", data_dir},
      {absl::StrCat("EPS_LAUNCH_ID=", id), absl::StrCat("EPS_LAUNCH_SECRET=", secret)},
      absl::StrCat(data_dir, ".log"));
  if (!process.ok()) {
    ++failures_;
    last_error_ = absl::StrCat("starting a server: ", process.status().message());
    LOG(WARNING) << "autoscale: " << last_error_;
    events_->Record("server_launch_failed", {{"launch_id", id}, {"error", last_error_}});
    return false;
  }
  LOG(INFO) << "autoscale: started server launch " << id << " (pid " << (*process)->pid()
            << ") on " << data_dir;
  launches_[id] = Launch{.process = std::move(*process), .started = now, .slot = std::nullopt};
  return true;
}

bool ServerScaler::VerifyLaunch(uint64_t launch_id, absl::string_view secret) const {
  absl::MutexLock lock(&mu_);
  auto it = secrets_.find(launch_id);
  return it != secrets_.end() && SameSecret(it->second, secret);
}

void ServerScaler::Step(absl::Time now, bool read) {
  const View view = view_();  // takes the master's lock
  std::vector<uint32_t> drains;
  {
    absl::MutexLock lock(&mu_);
    const int64_t exits_before = failures_;
    Track(view, now);
    if (!view.running || stopped_) return;
    live_ = static_cast<int64_t>(view.servers.size());
    // A server it started that exited unasked is started again (within
    // autoscale.max_restarts): the job had it for a reason.
    const int64_t lost = failures_ - exits_before;
    for (int64_t i = 0; i < lost; ++i) {
      if (!LaunchOne(now)) break;
    }
    if (!read) return;
    std::string changing = view.changing;
    for (const auto& [id, launch] : launches_) {
      if (changing.empty() && !launch.slot.has_value()) {
        changing = absl::StrCat("server launch ", id, " has not joined yet");
      }
    }
    // Made once the servers first settle, from as many as the job has then.
    if (!policy_.has_value()) {
      if (!changing.empty()) return;
      policy_.emplace(job_.autoscale, std::max<int64_t>(1, live_));
    }
    const AutoscaleDecision decision = policy_->Decide(view.servers, changing, now);
    ++decisions_[ActionName(decision.action)];
    if (decision.action == AutoscaleDecision::Action::kHold) {
      VLOG(1) << "autoscale: servers hold at " << decision.target << ": " << decision.rule;
      return;
    }
    LOG(INFO) << "autoscale: " << ActionName(decision.action) << " " << decision.previous
              << " -> " << decision.target << " servers: " << decision.rule;
    events_->Record(absl::StrCat("servers_", ActionName(decision.action)), decision.ToJson());
    for (int64_t i = decision.previous; i < decision.target; ++i) {
      if (!LaunchOne(now)) break;
    }
    // Shrinking: the newest live servers this scaler started, then the
    // highest live slots. (The drain shows in the next view, which holds
    // decisions until it ends; Track marks the launch.)
    std::vector<uint32_t> live;
    for (const ServerReading& server : view.servers) live.push_back(server.slot);
    std::sort(live.rbegin(), live.rend());
    std::vector<uint32_t> order;
    for (auto it = launches_.rbegin(); it != launches_.rend(); ++it) {
      if (it->second.slot.has_value() && absl::c_linear_search(live, *it->second.slot)) {
        order.push_back(*it->second.slot);
      }
    }
    for (uint32_t slot : live) {
      if (!absl::c_linear_search(order, slot)) order.push_back(slot);
    }
    const size_t fewer =
        static_cast<size_t>(std::max<int64_t>(0, decision.previous - decision.target));
    order.resize(std::min(fewer, order.size()));
    drains = std::move(order);
  }
  for (uint32_t slot : drains) {
    StatusOr<json> drained = drain_(slot);  // takes the master's lock
    absl::MutexLock lock(&mu_);
    if (drained.ok()) {
      LOG(INFO) << "autoscale: draining ps[" << slot << "]: " << drained->dump();
    } else {
      last_error_ = absl::StrCat("draining ps[", slot, "]: ", drained.status().message());
      LOG(WARNING) << "autoscale: " << last_error_;
    }
  }
}

json ServerScaler::StatusJson() const {
  absl::MutexLock lock(&mu_);
  json launched = json::array();
  for (const auto& [id, launch] : launches_) {
    launched.push_back({{"launch_id", id},
                        {"pid", launch.process->pid()},
                        {"server", launch.slot.has_value() ? json(*launch.slot) : json()},
                        {"draining", launch.draining}});
  }
  json out = {{"min_servers", job_.autoscale.min_servers},
              {"max_servers", job_.autoscale.max_servers},
              {"target_servers", policy_.has_value() ? json(policy_->target()) : json()},
              {"live_servers", live_},
              {"launched", launched},
              {"failures", failures_}};
  out["last_decision"] = policy_.has_value() ? policy_->last().ToJson() : json();
  out["last_error"] = last_error_.empty() ? json() : json(last_error_);
  return out;
}

void ServerScaler::WriteMetrics(PrometheusWriter& out) const {
  absl::MutexLock lock(&mu_);
  out.Family("eps_autoscale_target_servers", MetricType::kGauge,
             "Parameter servers the autoscaler wants.");
  if (policy_.has_value()) out.Sample(static_cast<double>(policy_->target()));
  out.Family("eps_autoscale_launched_servers", MetricType::kGauge,
             "Parameter servers the autoscaler started that are still running.");
  out.Sample(static_cast<double>(launches_.size()));
  out.Family("eps_autoscale_server_decisions_total", MetricType::kCounter,
             "Readings of the servers' figures, by the action decided.");
  for (const char* action : {"hold", "scale_up", "scale_down"}) {
    auto it = decisions_.find(action);
    out.Sample({{"action", action}},
               it == decisions_.end() ? 0.0 : static_cast<double>(it->second));
  }
}

}  // namespace eps
