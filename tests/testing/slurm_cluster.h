// A real Slurm on loopback for tests: Debian's munged, slurmctld and slurmd
// started as root, with every file (keys, sockets, state, spool, logs) in
// one directory and their ports picked free. One node, "localhost", with
// `gpus` GPUs declared in gres.conf on character devices made with mknod
// (c 1 3, /dev/null's numbers: nothing reads them), in partition "gpu",
// and in partition "cpu" for jobs that need no GPU.
// SlurmdParameters=config_overrides lets the node claim the CPUs, memory
// and GPUs the configuration gives it; ProctrackType=proctrack/linuxproc
// and TaskPlugin=task/none need no cgroups.
//
// Start() sets SLURM_CONF in this process's environment, so that Slurm's
// commands, and the processes a test starts (an eps-master with the slurm
// source and launcher), use this cluster. The destructor cancels every job
// and waits for the node to be empty, then stops the daemons.

#ifndef EPS_TESTS_TESTING_SLURM_CLUSTER_H_
#define EPS_TESTS_TESTING_SLURM_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/status.h"
#include "tests/testing/process.h"

namespace eps::testing {

class SlurmCluster {
 public:
  // Why no cluster can be started here (not root, a daemon missing), for
  // GTEST_SKIP; empty when one can.
  static std::string Unavailable();
  // Starts the daemons in `dir` and waits (up to a minute) for the node to
  // be idle.
  static StatusOr<std::unique_ptr<SlurmCluster>> Start(const std::string& dir, int gpus);
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Runs a Slurm command (sbatch, squeue, scancel, ...) against this
  // cluster, bounded to 30 s; its stdout, or an error with its stderr.
  StatusOr<std::string> Command(const std::vector<std::string>& argv) const;
  // Submits `script` (sh) as `user` ("" for this one) asking for `gpus`
  // GPUs, named `name`; its job id.
  StatusOr<std::string> Submit(const std::string& name, int gpus, const std::string& script,
                               const std::string& user = "") const;
  // The job's state as squeue shows it ("PENDING", "RUNNING", ...; "" when
  // squeue no longer knows it).
  std::string JobState(const std::string& job_id) const;
  // Polls JobState until it is one of `states` or `timeout` passes; the
  // last state seen.
  std::string AwaitJobState(const std::string& job_id, const std::vector<std::string>& states,
                            absl::Duration timeout) const;
  // The daemons' logs, for failure messages.
  std::string Logs() const;

 private:
  explicit SlurmCluster(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::unique_ptr<Process> munged_;
  std::unique_ptr<Process> slurmctld_;
  std::unique_ptr<Process> slurmd_;
};

}  // namespace eps::testing

#endif  // EPS_TESTS_TESTING_SLURM_CLUSTER_H_
