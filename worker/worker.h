// Worker: one training process.
//
//   register -> loop { get shard -> parse -> batch -> unique keys -> pull
//   from all servers in parallel -> forward/backward -> push -> commit }
//
// Three threads share the loop. A loader thread reads, parses and pulls the
// next batches' embedding rows (worker.prefetch_batches ahead); the calling
// thread computes steps; the step pipeline's thread (worker/step_pipeline.h)
// pushes each step's gradients (the dense ones first, their reply bringing
// the new dense copy back), then the embedding rows', and commits the
// batch, while the next step computes from a copy of the dense tensors
// at most worker.max_staleness updates old. A batch's progress is committed
// to the master only after its pushes were acknowledged, so a worker dying
// at any moment loses no committed record.
// Malformed lines are counted, skipped and reported as FILE:LINE; they never
// stop the job. A file that cannot be read is reported to the master
// (SHARD_UNREADABLE), which skips the shard or stops the job. A batch
// whose loss or gradients are not finite is not pushed: its commit carries
// the non-finite loss and the master stops the job (a diverged model). After the last epoch the master hands out evaluation shards:
// the worker sends back a prediction per record.
//
// Membership (cluster/member_session.h): the worker registers, heartbeats
// and checks its lease before every push and commit through a
// MemberSession; fenced, it drops the session and registers again.
// Cluster map versions announced in heartbeat replies are followed by
// noting them only: the parameter clients belong to the loader and the
// trainer threads (one thread each), and each fetches the map itself when
// a server answers WRONG_OWNER, or does not answer at all (a drained server
// that has left: worker/ps_client.h). The map changes only when a replacement
// server takes a dead one's slot, and the master fences every worker
// during that recovery, so the next session starts from the new map
// anyway; an eager fetch would add a master call per change and a hand-off
// into both clients for no request saved.
//
// Thread-safety: Run from one thread; RequestStop from any.

#ifndef EPS_WORKER_WORKER_H_
#define EPS_WORKER_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/status.h"
#include "rpc/security.h"

namespace eps {

struct WorkerOptions {
  // The master, "tcp://HOST:PORT". Required.
  std::string master;
  // auto, cpu or cuda. Default auto.
  std::string device = "auto";
  // The job's config (model, data format, batch size, timeouts).
  JobConfig job;
  // CURVE and the job's keys, from [security] (LoadSecurity); off when
  // default-made (in-process tests).
  SecurityOptions security;
  // The autoscaler's launch of this process and the secret its launcher
  // handed it (eps-worker reads them from EPS_LAUNCH_ID and
  // EPS_LAUNCH_SECRET or EPS_LAUNCH_SECRET_FILE); 0 for a worker started
  // by hand.
  uint64_t launch_id = 0;
  std::string launch_secret;
  // eps workers on this host, this one included, as its launcher says
  // (eps-worker reads EPS_WORKERS_ON_HOST; scripts/run_local.sh and the
  // autoscaler's local launcher set it): they share the host's CPUs, so
  // with worker.compute_threads 0 each takes its part (core/cpu_budget.h).
  // At least 1. Default 1.
  int64_t workers_on_host = 1;

  Status Validate() const;
};

class Worker {
 public:
  explicit Worker(const WorkerOptions& options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Trains until the master says the job is over (OK, also when it failed
  // or stopped: its final status says why) or RequestStop is called (OK,
  // after committing the batch in hand and handing its shard back).
  // Errors: kDeadlineExceeded/kUnavailable when the master or a server
  // cannot be reached; kFailedPrecondition when a data file the master can
  // read cannot be read here (an unreadable file is the master's to judge:
  // it skips the shard or stops the job); kInvalidArgument when the
  // master refuses this worker's job options.
  Status Run();

  // Asks Run to stop at the next batch boundary. Safe from any thread.
  void RequestStop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace eps

#endif  // EPS_WORKER_WORKER_H_
