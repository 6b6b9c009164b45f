// Slurm: the autoscaler's signal source and worker launcher on a Slurm
// cluster (autoscale.source = slurm, autoscale.launcher = slurm), through
// Slurm's own commands, found on PATH and talking to the cluster that
// SLURM_CONF (or the machine's default configuration) names.
//
// The signal, read every autoscale.interval_s (three commands, each bounded
// by autoscale.source_timeout_s):
//   - `scontrol show partition P`: the partition exists (an error names it
//     otherwise); a partition that is not UP has no free GPUs;
//   - `sinfo -N -p P`: per node, its GPUs (Gres) less those allocated
//     (GresUsed), on nodes that can run jobs (idle, mixed, allocated,
//     completing, without a not-responding, powered-down, rebooting or
//     maintenance flag); drained and down nodes count nothing;
//   - `squeue -t PENDING -p P`: the GPUs the queue's pending jobs ask for
//     (per node times nodes, per job, per task times tasks), of jobs
//     waiting for the machines (reason Resources or Priority: not held,
//     not waiting on a dependency or a begin time), other than this job's
//     own workers.
//
// The launcher: one batch job per worker, named `eps-<job>-worker-<launch
// id>`, `sbatch --partition=P --gres=gpu:N` running eps-worker with
// EPS_LAUNCH_ID in its environment and its output in the master's
// DATA_DIR/workers/worker-<launch id>.log (a path the nodes must share).
// Stopping is `scancel --full --signal=TERM` (the worker commits its batch
// in hand and leaves, and its job completes); killing is `scancel`. Exits
// are read with squeue, at most every 5 s.
//
// The parsers are free functions, tested on Slurm's own output without a
// cluster.
//
// Thread-safety: the classes are used by the autoscaler's thread only.

#ifndef EPS_MASTER_AUTOSCALE_SLURM_H_
#define EPS_MASTER_AUTOSCALE_SLURM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "core/job_config.h"
#include "core/status.h"
#include "master/autoscale/backends.h"

namespace eps {

// GPUs in a GRES list as sinfo prints it: "gpu:8", "gpu:a100:4(S:0-1)",
// "gpu:2(IDX:0,3),mps:100"; "(null)" or no gpu entry is 0.
int64_t SlurmGresGpus(absl::string_view gres);
// GPUs in a TRES list as squeue prints it: "gres:gpu:2", "gres/gpu:a100=2",
// "cpu=4,gres/gpu=2"; "N/A" or none is 0.
int64_t SlurmTresGpus(absl::string_view tres);
// Whether a node in sinfo's long state ("idle", "mixed", "allocated*",
// "drained", "idle~") takes jobs now.
bool SlurmNodeUsable(absl::string_view state);

// The free GPUs in `sinfo -h -N -O NodeList:|,StateLong:|,Gres:|,GresUsed:|`
// output. kInvalidArgument quoting a line that is not four fields.
StatusOr<int64_t> ParseSlurmFreeGpus(absl::string_view sinfo);
// The GPUs that pending jobs wait for in `squeue -h -O
// JobID:|,Name:|,Reason:|,NumNodes:|,NumTasks:|,tres-per-node:|,tres-per-job:|,tres-per-task:|`
// output, leaving out jobs whose name starts with `own_prefix`.
StatusOr<int64_t> ParseSlurmPendingGpus(absl::string_view squeue, absl::string_view own_prefix);

// A job's end as squeue shows it: nullopt while it may still run (PENDING,
// RUNNING, COMPLETING, ...); 0 for COMPLETED; otherwise its exit code, or
// 1 when that is 0 (CANCELLED, NODE_FAIL, PREEMPTED, ...).
std::optional<int> SlurmJobEnd(absl::string_view state, int exit_code);
// `squeue -h -t all -O JobID:|,State:|,exit_code:|` output: job id ->
// (state, exit code). kInvalidArgument quoting a bad line.
StatusOr<std::map<std::string, std::pair<std::string, int>>> ParseSlurmJobStates(
    absl::string_view squeue);

// The prefix of the job's worker job names: "eps-<job>-worker-".
std::string SlurmWorkerJobPrefix(const JobConfig& job);

// MakeSlurmSource and MakeSlurmLauncher: master/autoscale/backends.h.

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_SLURM_H_
