#include "worker/step_pipeline.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/logging.h"

namespace eps {
namespace {

// How often waits look at `abandoned`.
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
// How often a step waiting for the dense tensors says so.
constexpr absl::Duration kWaitWarning = absl::Seconds(10);

// Raises `known` to at least `seen`, entry by entry.
void RaiseTo(const PsClient::Versions& seen, PsClient::Versions* known) {
  if (known->size() < seen.size()) known->resize(seen.size());
  for (size_t t = 0; t < seen.size(); ++t) {
    std::vector<uint64_t>& per_server = (*known)[t];
    if (per_server.size() < seen[t].size()) per_server.resize(seen[t].size(), 0);
    for (size_t s = 0; s < seen[t].size(); ++s) {
      per_server[s] = std::max(per_server[s], seen[t][s]);
    }
  }
}

}  // namespace

StepPipeline::StepPipeline(int64_t max_staleness, Hooks hooks)
    : max_staleness_(static_cast<uint64_t>(max_staleness)), hooks_(std::move(hooks)) {
  CHECK_GE(max_staleness, 0);
  CHECK(hooks_.make_lane && hooks_.abandoned);
  thread_ = std::thread([this] { Run(); });
}

StepPipeline::~StepPipeline() { Stop(); }

uint64_t StepPipeline::Lag(const DenseCopy& copy) const { return Behind(copy) + pushes_pending_; }

void StepPipeline::Know(const PsClient::Versions& seen, uint64_t map_version) {
  if (map_version != 0 && map_version == known_map_) {
    RaiseTo(seen, &known_);
    return;
  }
  known_map_ = map_version;
  known_.clear();
  if (map_version != 0) RaiseTo(seen, &known_);
}

uint64_t StepPipeline::Behind(const DenseCopy& copy) const {
  // A copy read under another map than the versions known: they do not
  // compare, and the copy is the newest there is (the next step's push
  // brings one under the current map).
  if (copy.map_version != known_map_) return 0;
  uint64_t behind = 0;
  // Only the tensors the copy holds: pushes also answer for dense tensors
  // pulled with the batches instead (ParamSpec::pull_each_step false).
  for (size_t t = 0; t < known_.size() && t < copy.versions.size(); ++t) {
    for (size_t s = 0; s < known_[t].size() && s < copy.versions[t].size(); ++s) {
      if (known_[t][s] > copy.versions[t][s]) {
        behind = std::max(behind, known_[t][s] - copy.versions[t][s]);
      }
    }
  }
  return behind;
}

Status StepPipeline::AwaitLocked(const std::function<bool()>& ready,
                                 const std::function<void()>& on_poll) {
  while (true) {
    if (!failure_.ok()) return failure_;
    if (ready()) return absl::OkStatus();
    if (stop_ || hooks_.abandoned()) return absl::CancelledError("the worker's session ended");
    changed_.WaitWithTimeout(&mu_, kPollInterval);
    if (on_poll) on_poll();
  }
}

StatusOr<std::shared_ptr<const StepPipeline::DenseCopy>> StepPipeline::AwaitDense() {
  if (!hooks_.pull_dense) return std::shared_ptr<const DenseCopy>();
  const absl::Time started = absl::Now();
  std::shared_ptr<const DenseCopy> copy;
  uint64_t lag = 0;
  std::string why;  // what held the step back, when it had to wait
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return copy_ != nullptr && !renew_ && Lag(*copy_) <= max_staleness_;
    };
    if (!failure_.ok()) return failure_;
    if (!ready()) {
      why = copy_ == nullptr ? std::string("no copy pulled yet")
            : renew_         ? std::string("the servers applied their global batches")
                             : absl::StrCat("the copy missed ", Lag(*copy_), " updates");
      // A long wait says so while it lasts, not only once it is over.
      absl::Time say_at = started + kWaitWarning;
      RETURN_IF_ERROR(AwaitLocked(ready, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (absl::Now() < say_at) return;
        say_at += kWaitWarning;
        LOG(WARNING) << "a step has waited " << absl::FormatDuration(absl::Now() - started)
                     << " for the dense tensors (worker.max_staleness = " << max_staleness_
                     << "; the copy misses " << (copy_ == nullptr ? 0 : Lag(*copy_))
                     << " updates, " << pushes_pending_ << " of this worker's pushes pending)";
      }));
    }
    copy = copy_;
    lag = Lag(*copy_);
  }
  const absl::Duration waited = absl::Now() - started;
  if (waited > absl::Seconds(1)) {
    LOG(WARNING) << "a step waited " << absl::FormatDuration(waited)
                 << " for the dense tensors (worker.max_staleness = " << max_staleness_ << "; "
                 << why << ")";
  }
  if (hooks_.stats != nullptr) {
    hooks_.stats->staleness.Observe(lag);
    // The trainer is the only writer; heartbeats read it.
    if (lag > hooks_.stats->max_staleness.load(std::memory_order_relaxed)) {
      hooks_.stats->max_staleness.store(lag, std::memory_order_relaxed);
    }
    hooks_.stats->waits.Observe(waited);
  }
  return copy;
}

Status StepPipeline::Enqueue(Step step) {
  Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = AwaitLocked([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.size() < std::min(max_staleness_ + 1, kMaxQueuedSteps);
    });
    if (refused.ok()) {
      pushes_pending_ += step.pushes.size();
      queue_.push_back(std::move(step));
      changed_.SignalAll();
      return absl::OkStatus();
    }
  }
  if (step.on_end) step.on_end();
  return refused;
}

Status StepPipeline::Drain() {
  absl::MutexLock lock(&mu_);
  return AwaitLocked(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !running_step_; });
}

void StepPipeline::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

Status StepPipeline::status() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

Status StepPipeline::Refresh(Lane& lane) {
  auto copy = std::make_shared<DenseCopy>();
  const uint64_t map_before = MapOf(lane);
  RETURN_IF_ERROR(hooks_.pull_dense(lane, copy.get()));
  copy->map_version = MapOf(lane) == map_before ? map_before : 0;
  Install(std::move(copy));
  return absl::OkStatus();
}

void StepPipeline::RenewDense() {
  if (!hooks_.pull_dense) return;
  absl::MutexLock lock(&mu_);
  renew_ = true;
  changed_.SignalAll();
}

void StepPipeline::Install(std::shared_ptr<const DenseCopy> copy) {
  absl::MutexLock lock(&mu_);
  Know(copy->versions, copy->map_version);
  copy_ = std::move(copy);
  changed_.SignalAll();
}

Status StepPipeline::RunStep(Lane& lane, Step& step) {
  const auto abandoned = [this] {
    return hooks_.abandoned() ? absl::CancelledError("the worker's session ended")
                              : absl::OkStatus();
  };
  std::shared_ptr<DenseCopy> read_back;  // what the last push read back
  const auto run = [&](Step::Push& push, bool counted) -> Status {
    // A fenced session pushes nothing more, not even a step's second half.
    RETURN_IF_ERROR(abandoned());
    PsClient::Versions applied;
    // Only a counted push may renew the copy, and only a pipeline that
    // pulls one would install it: no copy (and no rows read back) otherwise.
    auto copy = counted && hooks_.pull_dense ? std::make_shared<DenseCopy>() : nullptr;
    const uint64_t map_before = MapOf(lane);
    RETURN_IF_ERROR(push(lane, &applied, copy.get()));
    const uint64_t map = MapOf(lane) == map_before ? map_before : 0;
    if (copy != nullptr) copy->map_version = map;
    absl::MutexLock lock(&mu_);
    Know(applied, map);
    if (counted) {
      --pushes_pending_;
      read_back = copy == nullptr || copy->values.empty() ? nullptr : std::move(copy);
    }
    return absl::OkStatus();
  };
  for (Step::Push& push : step.pushes) RETURN_IF_ERROR(run(push, true));
  RETURN_IF_ERROR(abandoned());
  // The step changed the dense tensors: the next steps want them back. Its
  // pushes are applied, so it is committed even when that pull fails (the
  // pipeline stops on the failure after the commit): otherwise its records
  // would be trained and pushed again.
  Status refreshed;
  if (!step.pushes.empty() && hooks_.pull_dense) {
    // A copy read back in several messages of one server holds the rows
    // of the first at its version only: behind what the last one said.
    // Installing it could leave every step waiting for a copy that only a
    // step would refresh; such a copy is pulled again instead.
    bool current = false;
    if (read_back != nullptr) {
      absl::MutexLock lock(&mu_);
      current = Behind(*read_back) == 0;
    }
    if (current) {
      Install(std::move(read_back));
    } else {
      refreshed = Refresh(lane);
    }
  }
  for (Step::Push& push : step.late_pushes) RETURN_IF_ERROR(run(push, false));
  RETURN_IF_ERROR(step.commit(lane));
  return refreshed;
}

void StepPipeline::Run() {
  Lane lane = hooks_.make_lane();
  Status status = hooks_.pull_dense ? Refresh(lane) : absl::OkStatus();
  while (status.ok()) {
    Step step;
    bool renew = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || renew_ || !queue_.empty();
      };
      while (!ready()) changed_.WaitWithTimeout(&mu_, kPollInterval);
      if (stop_) break;
      renew = renew_;
      if (!renew) {
        step = std::move(queue_.front());
        queue_.pop_front();
        running_step_ = true;
      }
    }
    if (renew) {
      status = Refresh(lane);
      absl::MutexLock lock(&mu_);
      if (!status.ok() && failure_.ok()) failure_ = status;  // before AwaitDense sees !renew_
      renew_ = false;
      changed_.SignalAll();
      continue;
    }
    status = RunStep(lane, step);
    if (step.on_end) step.on_end();
    absl::MutexLock lock(&mu_);
    // The failure shows before the step ends: a Drain that sees no step
    // running must see it too.
    if (!status.ok() && failure_.ok()) failure_ = status;
    running_step_ = false;
    changed_.SignalAll();
  }
  std::deque<Step> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && failure_.ok()) failure_ = status;
    // Whatever is queued is never pushed nor committed. The loop ended on
    // a failure or stop_, so Enqueue refuses from now on.
    dropped.swap(queue_);
    changed_.SignalAll();
  }
  for (Step& step : dropped) {
    if (step.on_end) step.on_end();
  }
}

}  // namespace eps
