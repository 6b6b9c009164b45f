// EventLog: the job's history as JSON lines in DATA_DIR/events.jsonl.
//
// One object per line: {"time": <unix seconds>, "event": "<name>", ...}.
// Events:
//   the job       job_started, master_resumed, job_resuming, job_finished,
//                 job_failed, progress (every job.progress_interval_s: rate,
//                 loss so far, live workers, pass fraction, ETA)
//   membership    server_registered, server_dead, worker_joined, worker_left,
//                 worker_dead, worker_fenced
//   data          epoch_started, epoch_finished, shard_reassigned,
//                 split_requested, shard_split, evaluation_started,
//                 evaluation_finished
//   checkpoints   checkpoint, checkpoint_failed, recovery_started, recovered
//   autoscaling   scale_up, scale_down, autoscale_signal_failed,
//                 autoscale_signal_restored, worker_launched,
//                 worker_launch_failed, worker_exited, worker_stopped,
//                 worker_stuck, worker_replaced, restart_limit_reached
// scripts/plot_run.py draws a run from them.
//
// Record() only queues (no I/O, so it may be called under other locks);
// Flush() appends the queue to the file.
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_MASTER_EVENT_LOG_H_
#define EPS_MASTER_EVENT_LOG_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace eps {

// Where the master's units report events: they only queue, never write.
// Thread-safety: implementations say.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Queues `event` with `fields` (an object).
  virtual void Record(const std::string& event,
                      nlohmann::json fields = nlohmann::json::object()) = 0;
};

class EventLog : public EventSink {
 public:
  // Appends to `path` (created if missing); events are stamped with
  // `clock`'s time (not owned; must outlive this).
  explicit EventLog(std::string path, const Clock* clock = Clock::Real());

  // Queues `event` with `fields` (an object) and the current time.
  void Record(const std::string& event,
              nlohmann::json fields = nlohmann::json::object()) override;

  // Appends every queued event to the file. kUnavailable on write errors
  // (the events stay queued).
  Status Flush();

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  const Clock* const clock_;
  absl::Mutex queue_mu_;
  std::vector<std::string> queue_ ABSL_GUARDED_BY(queue_mu_);
  // Orders whole flushes so lines land in record order.
  absl::Mutex file_mu_ ABSL_ACQUIRED_BEFORE(queue_mu_);
};

}  // namespace eps

#endif  // EPS_MASTER_EVENT_LOG_H_
