// StepPipeline: the network half of a worker's training steps, on a thread
// of its own, so that the trainer computes the next step while the last
// one's gradients are pushed, its batch committed and the dense copy
// renewed.
//
// The trainer hands over each step as a Step: its pushes (none for an
// evaluation batch, a diverged one or one without records; one per half of
// a step trained in halves), its late pushes (the same, for what the copy
// does not hold) and its commit. The pipeline runs steps strictly in
// order, a step's commit only after its pushes were acknowledged, so a
// batch is committed only once its updates are applied. The first failure
// stops the pipeline: nothing queued after it is pushed or committed (those
// records are not committed, so they are trained again).
//
// Dense tensors (when the model has some): the pipeline keeps the worker's
// copy, the values with the versions the servers reported, pulls it first
// and again after every step's pushes of dense gradients (or takes it from
// their replies), before its late pushes (embedding rows, which the copy
// does not hold) and its commit: the next step waits for one round trip of
// the dense tensors only. The
// trainer starts a step from a
// copy only while it misses at most `max_staleness` updates the worker
// knows of: the pushes the servers said they applied since the copy was
// pulled (other workers' among them, by the versions in the replies) and
// this worker's own pushes not acknowledged yet. The servers measure what
// each push really missed (ServerStats.dense_staleness), which includes
// other workers' pushes that no reply had told of yet.
//
// Thread-safety: every method from the trainer's thread; the Lane and the
// steps' functions run on the pipeline's thread.

#ifndef EPS_WORKER_STEP_PIPELINE_H_
#define EPS_WORKER_STEP_PIPELINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/metrics.h"
#include "core/status.h"
#include "models/model.h"
#include "rpc/rpc_channel.h"
#include "worker/ps_client.h"

namespace eps {

class StepPipeline {
 public:
  // The pipeline thread's own connections (both are single-threaded).
  struct Lane {
    std::unique_ptr<RpcChannel> master;
    std::unique_ptr<PsClient> ps;
  };
  // The dense tensors as pulled: values and versions per model parameter
  // (empty for embedding tables), versions per server (PsClient::Versions).
  struct DenseCopy {
    ParamBuffers values;
    PsClient::Versions versions;
    // The cluster map the versions are indexed by (a server's index, and
    // what each server holds, change with it); 0 when the map changed while
    // the copy was read. Set by the pipeline.
    uint64_t map_version = 0;
  };
  struct Step {
    // Each pushes part of the step's gradients and reports the versions
    // the servers answered (PsClient::Push's `versions`). A push of the
    // copy's tensors may also read them back as it left them into `copy`
    // (values and versions, as pull_dense gives them; PsClient::Push's
    // `after`): when the last of a step's pushes did, and the copy misses
    // nothing the replies told of, the pipeline installs it instead of
    // pulling one. `copy` is null where nothing could use it (a late push,
    // a pipeline without pull_dense): then nothing is read back.
    using Push = std::function<Status(Lane&, PsClient::Versions* applied, DenseCopy* copy)>;
    std::vector<Push> pushes;
    // Pushes of the rest of the step's gradients, those that do not change
    // the dense copy (embedding rows): run after the copy is pulled again,
    // while the next step computes from it, and not counted against the
    // bound. The commit still waits for them.
    std::vector<Push> late_pushes;
    // Commits the step's batch; runs once every push is acknowledged.
    std::function<Status(Lane&)> commit;
    // Runs exactly once once the step is over, whatever happened to it:
    // committed, failed, dropped or refused by Enqueue. May be null.
    std::function<void()> on_end;
  };
  // What the trainer's steps trained with, for heartbeats (written by the
  // trainer's AwaitDense only, safe to read from any thread): per step started from a dense copy, the updates the
  // copy missed as the worker knew them, their largest, and the time the
  // step waited for a copy within the bound.
  struct Stats {
    CountHistogram staleness;
    std::atomic<uint64_t> max_staleness{0};
    LatencyHistogram waits;
  };
  struct Hooks {
    // Makes the lane, on the pipeline's thread. Required.
    std::function<Lane()> make_lane;
    // Pulls the dense tensors into a copy; null when the model has none.
    std::function<Status(Lane&, DenseCopy*)> pull_dense;
    // True once the steps are moot (the session ended, the worker is
    // stopping): waits end with kCancelled and queued steps are dropped.
    // Required.
    std::function<bool()> abandoned;
    // Where AwaitDense counts what steps trained with; may be null. Must
    // outlive the pipeline.
    Stats* stats = nullptr;
    // The cluster map version `lane` routes by (PsClient::map_version),
    // which the versions of its replies are indexed by; null: one map for
    // the pipeline's life.
    std::function<uint64_t(Lane&)> map_version;
  };

  // Starts the thread (it pulls the first dense copy at once).
  // REQUIRES: max_staleness >= 0.
  StepPipeline(int64_t max_staleness, Hooks hooks);
  // Stop().
  ~StepPipeline();
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // The dense copy to start the next step from: the newest one, once it
  // misses at most max_staleness updates (waiting for a pull otherwise;
  // a wait over a second is logged with the updates the copy missed).
  // Counted into hooks.stats.
  // Null when the model has no dense tensors. The pipeline's failure, or
  // kCancelled when abandoned meanwhile.
  StatusOr<std::shared_ptr<const DenseCopy>> AwaitDense();

  // At most this many steps wait in the queue whatever the bound: each
  // holds a batch and its gradients.
  static constexpr uint64_t kMaxQueuedSteps = 16;

  // Queues `step`, waiting while min(max_staleness + 1, kMaxQueuedSteps)
  // steps are queued already. The pipeline's failure (the step is not queued: its on_end
  // has run), kCancelled when abandoned.
  Status Enqueue(Step step);

  // The servers changed the dense tensors without a push of this worker or
  // a reply telling of it (a checkpoint applied their global batches'
  // partial sums, ps/global_batch.h): the pipeline pulls the copy again,
  // and AwaitDense returns none pulled before (steps queued meanwhile run
  // after that pull). No-op without dense tensors.
  void RenewDense();

  // Waits until every queued step is committed. The pipeline's failure,
  // kCancelled when abandoned first.
  Status Drain();

  // Drops what is queued, waits for the step in hand to end and joins the
  // thread. Idempotent.
  void Stop();

  // The first failure of a step (OK while none).
  Status status() const;

 private:
  // Updates a copy misses: what the worker knows was applied since it was
  // pulled, plus its own pushes not acknowledged yet.
  uint64_t Lag(const DenseCopy& copy) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The updates the servers' replies told of that `copy` misses.
  uint64_t Behind(const DenseCopy& copy) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  // Runs one step (its pushes, a dense pull when it pushed, its late
  // pushes, its commit).
  Status RunStep(Lane& lane, Step& step);
  // Pulls a new dense copy and installs it.
  Status Refresh(Lane& lane);
  void Install(std::shared_ptr<const DenseCopy> copy);
  // Takes `seen` (versions read under cluster map `map_version`; 0: the
  // map changed meanwhile) into known_: raised under the same map, and in
  // place of it under another (versions of two maps do not compare: a
  // partition that moved takes its tensors' count to another server).
  void Know(const PsClient::Versions& seen, uint64_t map_version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // hooks_.map_version, or 1 without it.
  uint64_t MapOf(Lane& lane) const { return hooks_.map_version ? hooks_.map_version(lane) : 1; }
  // Waits (in slices, to see `abandoned`; `on_poll` after each) until
  // `ready` holds; the failure or kCancelled otherwise.
  Status AwaitLocked(const std::function<bool()>& ready,
                     const std::function<void()>& on_poll = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t max_staleness_;
  const Hooks hooks_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::deque<Step> queue_ ABSL_GUARDED_BY(mu_);
  bool running_step_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // RenewDense asked for a pull the thread has not finished yet.
  bool renew_ ABSL_GUARDED_BY(mu_) = false;
  Status failure_ ABSL_GUARDED_BY(mu_);
  // Pushes queued or in flight, not acknowledged yet.
  uint64_t pushes_pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const DenseCopy> copy_ ABSL_GUARDED_BY(mu_);
  // The highest version of each dense tensor on each server any reply
  // reported, under cluster map known_map_ (Know).
  PsClient::Versions known_ ABSL_GUARDED_BY(mu_);
  uint64_t known_map_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace eps

#endif  // EPS_WORKER_STEP_PIPELINE_H_
