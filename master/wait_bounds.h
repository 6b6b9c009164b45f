// WaitBounds: the bounds on the job's waits for what is outside the master
// (docs/design.md 2.14), as timers and the verdicts they reach:
//   - servers to register before training: past
//     master.recovery_timeout_s the job fails (nothing was trained, there
//     is nothing to resume; once training, a lost server starts a
//     recovery, which bounds itself: Recovery::Next);
//   - a shard's holder that makes no progress (a hung trainer, a dead GPU)
//     for master.progress_timeout_s is fenced. Time the job held workers
//     back does not count: a recovery holds every worker, a checkpoint
//     round only those that paused for it (the caller passes that in);
//   - workers to train: with none alive for master.worker_wait_s (300 s by
//     default) the job stops, resumably (not during a recovery, nor with an
//     export due, nor while an autoscaler may still start workers);
//   - checkpoints that keep failing (checkpoint.max_failures in a row)
//     leave nothing newer to return to: the job stops, resumably.
// The caller describes the job at each tick (Facts) and acts on the
// Verdict; ServersWait() and WorkersWait() word the waits it times for
// /status `waiting_for`.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; JobControl's owner guards it.

#ifndef EPS_MASTER_WAIT_BOUNDS_H_
#define EPS_MASTER_WAIT_BOUNDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"

namespace eps {

class WaitBounds {
 public:
  explicit WaitBounds(const JobConfig& job) : job_(job) {}

  // The job at a tick, as far as its bounds go.
  struct Facts {
    bool scanning = false;  // before training: the data scan, servers to place
    bool training = false;  // training or evaluating
    bool recovering = false;
    bool export_due = false;
    size_t servers_registered = 0;
    size_t servers_alive = 0;
    bool all_servers_alive = true;
    size_t workers_alive = 0;
    // An autoscaler may still start workers: none alive is no verdict.
    bool workers_coming = false;
    // Each alive holder of a shard in progress (once), with its last
    // progress or the end of a checkpoint round that held it back,
    // whichever is later. Those fenced by the verdict count as not alive
    // for the workers' wait.
    std::vector<std::pair<uint32_t, absl::Time>> holders;
    uint64_t checkpoint_failures = 0;
    std::string last_checkpoint_failure;
  };
  // What the bounds decide: at most one of `fail` and `stop` (the job's
  // end, and why: `fail` is not resumable, `stop` is), and the holders to
  // fence, with why, which the caller applies first.
  struct Verdict {
    std::string fail;
    std::string stop;
    std::vector<std::pair<uint32_t, std::string>> fence;
  };
  Verdict Check(const Facts& facts, absl::Time now);

  // The waits it times at `now`, one line each with how long and its
  // bound: servers to register (`servers_registered` of the job's so far)
  // and workers. nullopt when it does not wait for them.
  std::optional<std::string> ServersWait(size_t servers_registered, absl::Time now) const;
  std::optional<std::string> WorkersWait(absl::Time now) const;

 private:
  const JobConfig& job_;
  // Since when each wait has lasted (InfiniteFuture while not waiting),
  // and the last tick a recovery held every worker back.
  absl::Time servers_missing_since_ = absl::InfiniteFuture();
  absl::Time no_workers_since_ = absl::InfiniteFuture();
  absl::Time held_until_ = absl::InfinitePast();
};

}  // namespace eps

#endif  // EPS_MASTER_WAIT_BOUNDS_H_
