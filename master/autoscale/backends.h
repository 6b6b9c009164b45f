// The autoscaler's backends (master/autoscale/autoscaler.h): where its
// signal comes from (SignalSource: a command, a Prometheus query, or Slurm's
// queue, master/autoscale/slurm.h) and what starts and stops workers
// (WorkerLauncher: this host, a command, or sbatch/scancel), chosen by
// autoscale.source and autoscale.launcher.
//
// Thread-safety: each source and launcher is used by the autoscaler's
// thread only.

#ifndef EPS_MASTER_AUTOSCALE_BACKENDS_H_
#define EPS_MASTER_AUTOSCALE_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/job_config.h"
#include "core/status.h"
#include "master/autoscale/autoscale_policy.h"

namespace eps {

// Where the signal comes from. Read() may block up to the source's timeout.
class SignalSource {
 public:
  virtual ~SignalSource() = default;
  virtual StatusOr<AutoscaleSignal> Read() = 0;
};

// autoscale.source = command: "FREE [PENDING]" (non-negative integers; the
// first line counts). kInvalidArgument quoting what it got otherwise.
StatusOr<AutoscaleSignal> ParseSignalLine(absl::string_view output);
// A Prometheus /api/v1/query answer: the sum of a vector's samples, or a
// scalar. kInvalidArgument for an error answer, an empty vector (naming
// `query`), a value that is not a finite number >= 0.
StatusOr<double> ParsePrometheusAnswer(absl::string_view body, absl::string_view query);

StatusOr<std::unique_ptr<SignalSource>> MakeSignalSource(const JobConfig& job);

// Starts and stops workers. Calls may block up to the launcher's timeout.
class WorkerLauncher {
 public:
  virtual ~WorkerLauncher() = default;
  // Starts worker `launch_id`, handing it `secret` (its proof of the
  // launch id when it registers; see Autoscaler::VerifyLaunch) where no
  // other process can read it; its handle (for Stop).
  virtual StatusOr<std::string> Start(uint64_t launch_id, const std::string& secret) = 0;
  // Asks it to stop: SIGTERM (it commits its batch in hand and leaves), or
  // at once when `force`.
  virtual Status Stop(uint64_t launch_id, const std::string& handle, bool force) = 0;
  // The launches that ended since the last call, with exit codes. A
  // launcher that cannot see its workers end (ObservesExits false) reports
  // a forced Stop's as ended (-1) and nothing else.
  virtual std::vector<std::pair<uint64_t, int>> Exits() = 0;
  virtual bool ObservesExits() const { return true; }
};

struct LauncherContext {
  // The job file the workers read (DATA_DIR/worker.ini) and the master's
  // RPC endpoint.
  std::string worker_config;
  std::string master_endpoint;
  // Where launch logs go (DATA_DIR/workers/worker-<launch id>.log).
  std::string log_dir;

  // The log of worker `launch_id`.
  std::string LogPath(uint64_t launch_id) const {
    return absl::StrCat(log_dir, "/worker-", launch_id, ".log");
  }
};

// The program `name` in the directory of the running eps-master (`name`
// alone when that cannot be read).
std::string NextToMaster(const std::string& name);

StatusOr<std::unique_ptr<WorkerLauncher>> MakeLauncher(const JobConfig& job,
                                                       const LauncherContext& context);

// The Slurm backends (master/autoscale/slurm.h: squeue, sbatch, scancel).
std::unique_ptr<SignalSource> MakeSlurmSource(const JobConfig& job);
// `worker_binary`: the eps-worker path the nodes run.
std::unique_ptr<WorkerLauncher> MakeSlurmLauncher(const JobConfig& job,
                                                  const LauncherContext& context,
                                                  const std::string& worker_binary);

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_BACKENDS_H_
