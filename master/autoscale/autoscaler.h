// Autoscaler: the driver of the master's [autoscale] section. Every
// autoscale.interval_s it reads the signal (SignalSource: the GPUs free in
// the job's queue and those other jobs wait for), lets AutoscalePolicy
// decide the number of workers, and every second brings the launched
// workers (WorkerFleet) to it through a WorkerLauncher: starting them,
// stopping them gracefully, replacing the dead and the stuck.
//
// It runs on a thread of its own, so that a slow source or launcher never
// holds up the job loop or an RPC; every command and query it runs is
// bounded by autoscale.source_timeout_s. It reads the master's view of the
// workers through a callback (which takes the master's lock; the
// autoscaler never holds its own lock while calling it).
//
// Decisions other than "hold" are events (scale_up, scale_down, with the
// signal's values and the rule that fired) and log lines; a source that
// starts or stops failing is one too (autoscale_signal_failed,
// autoscale_signal_restored). /status "autoscale" and the eps_autoscale_*
// metrics show the rest.
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_MASTER_AUTOSCALE_AUTOSCALER_H_
#define EPS_MASTER_AUTOSCALE_AUTOSCALER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/job_config.h"
#include "core/metrics.h"
#include "core/status.h"
#include "master/autoscale/autoscale_policy.h"
#include "master/autoscale/backends.h"
#include "master/event_log.h"
#include "master/autoscale/worker_fleet.h"
#include "nlohmann/json.hpp"

namespace eps {


class Autoscaler {
 public:
  // What the master sees of each launch id's newest registration.
  using SeenFn = std::function<std::map<uint64_t, WorkerFleet::Seen>()>;
  // Whether the job still wants workers (false once it is over).
  using RunningFn = std::function<bool()>;

  // Not started: Start() starts the thread. `events` and `clock` are not
  // owned and must outlive it.
  Autoscaler(const JobConfig& job, std::unique_ptr<SignalSource> source,
             std::unique_ptr<WorkerLauncher> launcher, SeenFn seen, RunningFn running,
             EventSink* events, const Clock* clock);
  ~Autoscaler();
  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;

  void Start();
  // Ends the thread, then waits up to the fleet's stop grace for the
  // launched workers to exit (the master has told them the job is over)
  // and kills those still running; a launcher that cannot see its workers
  // end leaves them to exit as told. Idempotent; the destructor kills them
  // at once.
  void Stop();

  // Whether `secret` is the one launch `launch_id` was handed (compared in
  // constant time). False for a launch id this autoscaler never made.
  bool VerifyLaunch(uint64_t launch_id, absl::string_view secret) const;
  // Whether it may still start workers: false once its fleet reached
  // autoscale.max_restarts (master.worker_wait_s then bounds a job left
  // with none). Lock-free: the master asks under its own lock, which the
  // autoscaler's thread takes while it holds mu_.
  bool MayLaunch() const { return may_launch_.load(std::memory_order_relaxed); }

  // /status "autoscale" (no secret in it).
  nlohmann::json StatusJson() const;
  // The eps_autoscale_* families.
  void WriteMetrics(PrometheusWriter& out) const;

 private:
  void Stop(absl::Duration stop_grace);
  void Loop();
  // One reading of the signal and its decision.
  void ReadSignal(absl::Time now);
  // The fleet's steps toward the target, carried out.
  void Reconcile(absl::Time now);

  const JobConfig job_;
  const std::unique_ptr<SignalSource> source_;
  const std::unique_ptr<WorkerLauncher> launcher_;
  const SeenFn seen_;
  const RunningFn running_;
  EventSink* const events_;
  const Clock* const clock_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::atomic<bool> may_launch_{true};
  absl::CondVar wake_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  AutoscalePolicy policy_ ABSL_GUARDED_BY(mu_);
  WorkerFleet fleet_ ABSL_GUARDED_BY(mu_);
  std::optional<AutoscaleSignal> signal_ ABSL_GUARDED_BY(mu_);
  std::string signal_error_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> decisions_ ABSL_GUARDED_BY(mu_);  // by action
  // Each launch's secret (never shown).
  std::map<uint64_t, std::string> secrets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_AUTOSCALER_H_
