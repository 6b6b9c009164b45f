#include "master/autoscale/autoscaler.h"

#include <signal.h>
#include <unistd.h>


#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/logging.h"
#include "master/autoscale/subprocess.h"
#include "rpc/security.h"
#include "httplib.h"

namespace eps {
namespace {

using nlohmann::json;

// How often the fleet is brought to the target between readings: a dead
// worker is replaced within this (plus its back-off).
constexpr absl::Duration kReconcileEvery = absl::Seconds(1);

}  // namespace

Autoscaler::Autoscaler(const JobConfig& job, std::unique_ptr<SignalSource> source,
                       std::unique_ptr<WorkerLauncher> launcher, SeenFn seen, RunningFn running,
                       EventSink* events, const Clock* clock)
    : job_(job),
      source_(std::move(source)),
      launcher_(std::move(launcher)),
      seen_(std::move(seen)),
      running_(std::move(running)),
      events_(events),
      clock_(clock),
      policy_(job.autoscale),
      fleet_(job, events, static_cast<uint64_t>(absl::ToUnixMicros(clock->Now()))) {}

Autoscaler::~Autoscaler() { Stop(absl::ZeroDuration()); }

void Autoscaler::Start() {
  LOG(INFO) << "autoscale: " << job_.autoscale.source << " signal every "
            << job_.autoscale.interval_s << " s, " << job_.autoscale.launcher << " launcher, "
            << job_.autoscale.min_workers << " to " << job_.autoscale.max_workers << " workers";
  thread_ = std::thread([this] { Loop(); });
}

void Autoscaler::Stop() {
  absl::Duration grace;
  {
    absl::MutexLock lock(&mu_);
    grace = fleet_.stop_grace();
  }
  Stop(grace);
}

void Autoscaler::Stop(absl::Duration stop_grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  if (!launcher_->ObservesExits()) return;
  // The master told the workers to exit; those that do not are ended.
  const absl::Time deadline = clock_->Now() + stop_grace;
  std::vector<uint64_t> left;
  while (true) {
    const std::vector<std::pair<uint64_t, int>> exits = launcher_->Exits();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, code] : exits) fleet_.Exited(id, code, clock_->Now());
      left = fleet_.launched();
    }
    if (left.empty() || clock_->Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (uint64_t id : left) {
    std::string handle;
    {
      absl::MutexLock lock(&mu_);
      handle = fleet_.handle(id);
    }
    if (stop_grace > absl::ZeroDuration()) {
      LOG(WARNING) << "autoscale: worker launch " << id << " (" << handle << ") still running "
                   << absl::FormatDuration(stop_grace) << " after the job ended; killing it";
    }
    (void)launcher_->Stop(id, handle, /*force=*/true);
  }
  (void)launcher_->Exits();
}

void Autoscaler::Loop() {
  absl::Time next_reading = clock_->Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
    }
    const absl::Time now = clock_->Now();
    if (running_()) {
      // The fleet first learns who started and who ended, so that the
      // reading counts as starting only those still starting; then it acts
      // on the decision at once.
      Reconcile(now);
      if (now >= next_reading) {
        ReadSignal(now);
        next_reading = now + absl::Seconds(job_.autoscale.interval_s);
        Reconcile(clock_->Now());
      }
    }
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    wake_.WaitWithTimeout(&mu_, kReconcileEvery);
  }
}

void Autoscaler::ReadSignal(absl::Time now) {
  const StatusOr<AutoscaleSignal> signal = source_->Read();  // bounded by its timeout
  absl::MutexLock lock(&mu_);
  const AutoscaleDecision decision =
      policy_.Decide(signal,
                     {.starting = fleet_.starting() * job_.autoscale.gpus_per_worker,
                      .stopping = fleet_.stopping() * job_.autoscale.gpus_per_worker},
                     now);
  ++decisions_[ActionName(decision.action)];
  if (!signal.ok()) {
    const std::string error(signal.status().message());
    if (signal_error_.empty()) {
      LOG(WARNING) << "autoscale: " << decision.rule;
      events_->Record("autoscale_signal_failed", {{"error", error}, {"target", decision.target}});
    }
    signal_error_ = error;
    return;
  }
  if (!signal_error_.empty()) {
    LOG(INFO) << "autoscale: the signal is back (free GPUs " << signal->free_gpus << ")";
    events_->Record("autoscale_signal_restored", decision.ToJson());
    signal_error_.clear();
  }
  signal_ = *signal;
  if (decision.action != AutoscaleDecision::Action::kHold) {
    LOG(INFO) << "autoscale: " << ActionName(decision.action) << " " << decision.previous
              << " -> " << decision.target << " workers: " << decision.rule;
    events_->Record(ActionName(decision.action), decision.ToJson());
  } else {
    VLOG(1) << "autoscale: hold at " << decision.target << ": " << decision.rule;
  }
}

void Autoscaler::Reconcile(absl::Time now) {
  const std::vector<std::pair<uint64_t, int>> exits = launcher_->Exits();
  const std::map<uint64_t, WorkerFleet::Seen> seen = seen_();  // takes the master's lock
  WorkerFleet::Plan plan;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, code] : exits) fleet_.Exited(id, code, now);
    plan = fleet_.Next(policy_.target(), seen, now);
    may_launch_.store(!fleet_.exhausted(), std::memory_order_relaxed);
  }
  for (uint64_t id : plan.stop) {
    std::string handle;
    {
      absl::MutexLock lock(&mu_);
      handle = fleet_.handle(id);
    }
    LOG(INFO) << "autoscale: stopping worker launch " << id << " (" << handle << ")";
    Status stopped = launcher_->Stop(id, handle, /*force=*/false);
    if (!stopped.ok()) LOG(WARNING) << "autoscale: stopping launch " << id << ": " << stopped;
  }
  for (uint64_t id : plan.kill) {
    std::string handle;
    {
      absl::MutexLock lock(&mu_);
      handle = fleet_.handle(id);
    }
    Status killed = launcher_->Stop(id, handle, /*force=*/true);
    if (!killed.ok()) LOG(WARNING) << "autoscale: killing launch " << id << ": " << killed;
  }
  for (int i = 0; i < plan.launches; ++i) {
    uint64_t id;
    std::string secret;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      id = fleet_.NewLaunchId();
      secret = NewSecret();
      secrets_[id] = secret;
    }
    StatusOr<std::string> handle = launcher_->Start(id, secret);
    absl::MutexLock lock(&mu_);
    if (handle.ok()) {
      LOG(INFO) << "autoscale: launched worker " << id << " (" << *handle << ")";
      fleet_.Launched(id, *handle, clock_->Now());
    } else {
      fleet_.LaunchFailed(id, std::string(handle.status().message()), clock_->Now());
      break;  // the back-off decides when to try again
    }
  }
}

bool Autoscaler::VerifyLaunch(uint64_t launch_id, absl::string_view secret) const {
  absl::MutexLock lock(&mu_);
  auto it = secrets_.find(launch_id);
  return it != secrets_.end() && SameSecret(it->second, secret);
}

json Autoscaler::StatusJson() const {
  absl::MutexLock lock(&mu_);
  const AutoscaleDecision& last = policy_.last();
  json out = {{"source", job_.autoscale.source},
              {"launcher", job_.autoscale.launcher},
              {"min_workers", job_.autoscale.min_workers},
              {"max_workers", job_.autoscale.max_workers},
              {"target_workers", policy_.target()},
              {"last_decision", last.ToJson()},
              {"fleet", fleet_.ToJson(clock_->Now())}};
  out["free_gpus"] = signal_.has_value() ? json(signal_->free_gpus) : json();
  out["pending_gpus"] = signal_.has_value() ? json(signal_->pending_gpus) : json();
  out["signal_error"] = signal_error_.empty() ? json() : json(signal_error_);
  out["live_workers"] = fleet_.live();
  return out;
}

void Autoscaler::WriteMetrics(PrometheusWriter& out) const {
  absl::MutexLock lock(&mu_);
  out.Family("eps_autoscale_free_gpus", MetricType::kGauge,
             "GPUs free in the job's queue at the last reading of the signal.");
  if (signal_.has_value()) out.Sample(static_cast<double>(signal_->free_gpus));
  out.Family("eps_autoscale_pending_gpus", MetricType::kGauge,
             "GPUs other jobs of the queue wait for, at the last reading.");
  if (signal_.has_value()) out.Sample(static_cast<double>(signal_->pending_gpus));
  out.Family("eps_autoscale_target_workers", MetricType::kGauge,
             "Workers the autoscaler wants.");
  out.Sample(static_cast<double>(policy_.target()));
  out.Family("eps_autoscale_live_workers", MetricType::kGauge,
             "Workers the autoscaler launched that are starting or running.");
  out.Sample(static_cast<double>(fleet_.live()));
  out.Family("eps_autoscale_decisions_total", MetricType::kCounter,
             "Readings of the signal, by the action decided (hold, scale_up, scale_down).");
  for (const char* action : {"hold", "scale_up", "scale_down"}) {
    auto it = decisions_.find(action);
    out.Sample({{"action", action}}, it == decisions_.end() ? 0.0 : static_cast<double>(it->second));
  }
  out.Family("eps_autoscale_restarts_total", MetricType::kCounter,
             "Workers that died or were stuck and were replaced.");
  out.Sample(static_cast<double>(fleet_.restarts()));
}

}  // namespace eps
