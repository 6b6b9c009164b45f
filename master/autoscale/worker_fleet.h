// WorkerFleet: the workers the autoscaler launched, and the steps that
// bring them to the policy's target.
//
// A launched worker is known by its launch id (handed to it as
// EPS_LAUNCH_ID, sent back when it registers) and by the launcher's handle
// (a pid, or what start_command printed). Its life:
//
//   starting --registers--> running --asked to stop--> stopping --exits--> gone
//   starting --not registered within start_timeout--> killed (a failed start)
//   running --the master fenced it for making no progress, or it has been
//     dead (no heartbeat) for a lease--> killed (stuck), then replaced
//   starting/running --exits unasked--> gone (died), then replaced
//   stopping --still there after stop_grace--> killed
//
// Every wait has a bound: start_timeout (autoscale.source_timeout_s plus
// the worker's own master_wait_s, at least 2 minutes), stop_grace (the lease plus one RPC budget of the
// worker, at least 30 s).
//
// Growing launches new workers; shrinking stops (gracefully: SIGTERM, so
// the worker commits its batch in hand and leaves) the ones that lose the
// least uncommitted work: those still starting, then those holding no
// shard, then those that committed last. A worker that died or was stuck
// is replaced: each replacement counts against autoscale.max_restarts, and
// one that follows an early death (within a minute of its launch) waits
// restart_backoff_s, doubling with each early death in a row (at most 64
// times). Past max_restarts the fleet replaces no more and says so; the
// job's own bound (master.worker_wait_s) then ends it if no worker is left.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; its owner guards it.

#ifndef EPS_MASTER_AUTOSCALE_WORKER_FLEET_H_
#define EPS_MASTER_AUTOSCALE_WORKER_FLEET_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "master/event_log.h"
#include "nlohmann/json.hpp"

namespace eps {

class WorkerFleet {
 public:
  // What the master knows of the newest registration of one launch id.
  struct Seen {
    bool alive = false;
    // Fenced by the master for making no progress while holding a shard.
    bool stalled = false;
    // When it stopped being alive (meaningful when !alive).
    absl::Time gone_since;
    bool holds_shard = false;
    // Its last commit or shard taken.
    absl::Time last_progress;
  };

  struct Plan {
    // Workers to launch now: for each, NewLaunchId(), start it, then
    // Launched() or LaunchFailed().
    int launches = 0;
    // Launch ids to stop gracefully, and to kill at once.
    std::vector<uint64_t> stop;
    std::vector<uint64_t> kill;
    bool empty() const { return launches == 0 && stop.empty() && kill.empty(); }
  };

  // `events` is not owned and must outlive the unit. Launch ids count up
  // from `first_launch_id`: the autoscaler starts from the time in
  // microseconds, so that a restarted master never reuses the id of a
  // worker an earlier one launched (and which may still run).
  WorkerFleet(const JobConfig& job, EventSink* events, uint64_t first_launch_id = 1);

  // The steps toward `target` workers, given what the master sees of
  // each launch id (ids it has not seen registered are absent).
  Plan Next(int64_t target, const std::map<uint64_t, Seen>& seen, absl::Time now);

  uint64_t NewLaunchId() { return next_launch_id_++; }
  // The launcher started `launch_id` (its handle for stopping it).
  void Launched(uint64_t launch_id, const std::string& handle, absl::Time now);
  // The launcher could not start it: counts as an early death.
  void LaunchFailed(uint64_t launch_id, const std::string& error, absl::Time now);
  // The launcher saw it end (exit code, or -1 when unknown).
  void Exited(uint64_t launch_id, int exit_code, absl::Time now);

  // Launched and not yet registered: their GPUs are taken, not free.
  int64_t starting() const;
  // Asked to stop, not yet gone.
  int64_t stopping() const;
  // Launched and not being stopped.
  int64_t live() const;
  // Past autoscale.max_restarts: the fleet replaces no more workers.
  bool exhausted() const { return limit_reported_; }
  // The launcher's handle of `launch_id`; empty when unknown.
  std::string handle(uint64_t launch_id) const;
  // Launch ids the launcher should watch for exits.
  std::vector<uint64_t> launched() const;
  int64_t restarts() const { return restarts_; }
  // How long a worker asked to stop may take before it is killed.
  absl::Duration stop_grace() const { return stop_grace_; }

  // {"live", "starting", "stopping", "restarts", "restarts_left",
  //  "backoff_until" (when waiting), "workers": [{"launch_id", "state",
  //  "handle"}]}
  nlohmann::json ToJson(absl::Time now) const;

 private:
  enum class State { kStarting, kRunning, kStopping, kKilled };
  struct Member {
    std::string handle;
    State state = State::kStarting;
    absl::Time launched;
    absl::Time stop_sent;  // asked to stop, or killed
  };
  static const char* StateName(State state);
  void Kill(uint64_t launch_id, Member& member, bool replace, const std::string& why,
            absl::Time now, Plan* plan);
  // A worker died or was killed as stuck at `now`, `lived` after its launch.
  void Lost(absl::Duration lived, absl::Time now);

  const JobConfig::Autoscale options_;
  const absl::Duration start_timeout_;
  const absl::Duration stop_grace_;
  const absl::Duration lease_;
  EventSink* const events_;
  std::map<uint64_t, Member> members_;
  uint64_t next_launch_id_ = 1;
  // Replacements owed for workers that died or were killed as stuck.
  int64_t owed_ = 0;
  int64_t restarts_ = 0;
  bool limit_reported_ = false;
  int early_deaths_in_a_row_ = 0;
  absl::Time backoff_until_ = absl::InfinitePast();
};

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_WORKER_FLEET_H_
