// ServerScaler: the autoscaler's parameter servers (autoscale.max_servers >
// 0; docs/design.md 2.20). Every autoscale.interval_s it reads the live
// servers' figures from the master, lets ServerScalePolicy decide how many
// the job should have, and brings them to it:
//   - growing starts eps-server processes on the master's machine
//     (`eps-server --config DATA_DIR/server.ini --master ENDPOINT
//     --data-dir DATA_DIR/servers/server-<launch id>`, logging to
//     DATA_DIR/servers/server-<launch id>.log), each with its launch id and
//     a secret of its own in its environment (EPS_LAUNCH_ID,
//     EPS_LAUNCH_SECRET): the master admits a join only so
//     (master/trust/server_admission.h, VerifyLaunch). A fresh data dir joins the
//     running job in a new slot, or takes a dead one's place, and the master
//     balances the partitions onto it;
//   - shrinking drains one server (as POST /servers/N/drain): the newest
//     one it started, else the highest slot; its partitions move live and
//     it leaves the job (a server it started then exits).
// A launched server that has not registered within 2 minutes is killed;
// one that exits unasked (not drained, and with a code other than 0, which
// a server told the job is over or drained exits with), or is killed so, is
// started again at once (on a fresh data dir: it takes the dead one's slot).
// Once such failures number more than autoscale.max_restarts it starts no
// server at all, and says so. Data dirs of servers that left stay (nothing
// is deleted). Servers started or drained by hand count
// from the next reading on (ServerScalePolicy follows the job's size).
//
// The decisions are events (servers_scale_up, servers_scale_down, with the
// rule) and log lines; /status "autoscale"."servers" and the
// eps_autoscale_*_servers metrics show the rest.
//
// Runs on a thread of its own; reads the master through callbacks that
// take the master's lock (never while holding its own).
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_MASTER_AUTOSCALE_SERVER_SCALER_H_
#define EPS_MASTER_AUTOSCALE_SERVER_SCALER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/job_config.h"
#include "core/metrics.h"
#include "core/status.h"
#include "master/autoscale/server_policy.h"
#include "master/autoscale/subprocess.h"
#include "master/event_log.h"
#include "nlohmann/json.hpp"

namespace eps {

class ServerScaler {
 public:
  // What the master sees of its servers at one moment.
  struct View {
    // The live servers that hold (or may take) partitions: not draining.
    std::vector<ServerReading> servers;
    // The process ids of the live servers on this machine, by slot (to
    // tell which launch took which slot).
    std::map<uint32_t, uint32_t> pids;
    // Slots being drained or drained (JobControl::draining): a server of
    // them that exits was asked to.
    std::set<uint32_t> draining;
    // Why the servers are changing now (ServerScalePolicy); empty if not.
    std::string changing;
    bool running = true;  // false once the job is over
  };
  using ViewFn = std::function<View()>;
  // Drains server `slot` (JobControl::Drain, persisted): the reply or why not.
  using DrainFn = std::function<StatusOr<nlohmann::json>(uint32_t slot)>;

  struct Options {
    std::string server_binary;  // eps-server
    std::string config;         // DATA_DIR/server.ini
    std::string master_endpoint;
    std::string dir;  // DATA_DIR/servers: data dirs and logs
  };

  // Not started: Start() starts the thread. `events` and `clock` are not
  // owned and must outlive it.
  ServerScaler(const JobConfig& job, Options options, ViewFn view, DrainFn drain,
               EventSink* events, const Clock* clock);
  ~ServerScaler();
  ServerScaler(const ServerScaler&) = delete;
  ServerScaler& operator=(const ServerScaler&) = delete;

  void Start();
  // Ends the thread, then waits up to `grace` for the servers it started
  // to exit (the master tells them the job is over) and kills the rest.
  void Stop(absl::Duration grace);

  // Whether `secret` is the one launch `launch_id` was started with (in
  // constant time).
  bool VerifyLaunch(uint64_t launch_id, absl::string_view secret) const;

  // /status "autoscale"."servers".
  nlohmann::json StatusJson() const;
  // eps_autoscale_target_servers, eps_autoscale_launched_servers.
  void WriteMetrics(PrometheusWriter& out) const;

 private:
  struct Launch {
    std::unique_ptr<Subprocess> process;
    absl::Time started;
    std::optional<uint32_t> slot;  // once registered
    bool draining = false;  // its slot was seen draining (View.draining)
    bool killed = false;  // SIGKILL sent (a failed start): reaped by Track
  };
  void Loop();
  // One reading, its decision, and the steps toward the target.
  void Step(absl::Time now, bool read);
  // Reaps exits and ties launches to the slots they registered in.
  void Track(const View& view, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts one server; false when it could not.
  bool LaunchOne(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobConfig job_;
  const Options options_;
  const ViewFn view_;
  const DrainFn drain_;
  EventSink* const events_;
  const Clock* const clock_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Made at the first reading, from the servers the job has then.
  std::optional<ServerScalePolicy> policy_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Launch> launches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_launch_id_ ABSL_GUARDED_BY(mu_);
  // Each launch's secret (EPS_LAUNCH_SECRET), kept after it ends: a
  // server it started may register again (a rejoin) as long as the job runs.
  std::map<uint64_t, std::string> secrets_ ABSL_GUARDED_BY(mu_);
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;  // failed starts and unasked exits
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;      // at the last reading
  std::map<std::string, uint64_t> decisions_ ABSL_GUARDED_BY(mu_);  // by action
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_SERVER_SCALER_H_
