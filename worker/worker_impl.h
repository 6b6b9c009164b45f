// Worker::Impl, shared by worker.cc (sessions: registration, heartbeats,
// the loader, the end of a session) and trainer.cc (the loop over a
// session's batches, and a step: its pulls, its math, its pushes and commit
// through the step pipeline). Private to the worker.

#ifndef EPS_WORKER_WORKER_IMPL_H_
#define EPS_WORKER_WORKER_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/member_session.h"
#include "core/failpoint.h"
#include "core/metrics.h"
#include "core/status.h"
#include "models/model.h"
#include "proto/eps.pb.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"
#include "worker/batch_sizer.h"
#include "worker/ps_client.h"
#include "worker/record_parser.h"
#include "worker/shard_loader.h"
#include "worker/step_pipeline.h"
#include "worker/worker.h"

namespace eps {

inline bool IsFenced(const Status& status) { return ReasonOf(status) == proto::FENCED; }

class Worker::Impl {
 public:
  explicit Impl(const WorkerOptions& options)
      : options_(options),
        batch_size_(options.job),
        oom_above_(FailpointValue("worker.oom_above")) {}

  Status Run();
  void RequestStop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }

 private:
  // What one registration with the master owns. A worker that loses its
  // lease (frozen, partitioned, or the master restarted) drops its session
  // and registers again with a new id.
  struct Session {
    // The pipeline and the heartbeat thread go first: they use the
    // loader and the member session.
    ~Session() {
      if (pipeline) pipeline->Stop();
      if (member) member->Stop();
    }
    proto::NodeId self;
    proto::JobSpec job;
    proto::ClusterMap initial_map;
    absl::Duration heartbeat = absl::Seconds(1);
    absl::Duration lease = absl::Seconds(10);
    // Per model parameter: its table id, and for dense tensors the chunk keys.
    std::vector<uint32_t> table_ids;
    std::vector<std::vector<uint64_t>> dense_keys;
    // Registration, heartbeats and the lease (made by Register).
    std::unique_ptr<MemberSession> member;
    // The loader thread and its queue (made once registered, started once
    // the cluster map is known).
    std::unique_ptr<ShardLoader> loader;
    // Pushes, commits and the dense tensors' copy (made with the loader).
    std::unique_ptr<StepPipeline> pipeline;
    std::atomic<bool> over{false};  // fenced, failed or finished: wind down
    // The newest cluster map version the master announced: each parameter
    // client fetches the map before its next call once it routes by an
    // older one (PsClient::set_newest_map).
    std::atomic<uint64_t> newest_map{0};
    absl::Mutex mu;
    // The coordinated checkpoint the master asks to pause for (0: none),
    // from heartbeat and commit replies.
    uint64_t pause_for ABSL_GUARDED_BY(mu) = 0;
    // Steps started (BeginStep) and not committed yet: the one the trainer
    // computes and those the pipeline pushes and commits. A step never
    // starts while pause_for is set, so the worker is paused whenever
    // pause_for is set and no step is in flight: heartbeats report it,
    // whether the trainer waits to go on or has nothing to train.
    int steps_in_flight ABSL_GUARDED_BY(mu) = 0;
    absl::CondVar pause_changed;
    Status failure ABSL_GUARDED_BY(mu);
    // Every pull and push of the session's parameter clients (loader and
    // trainer), reported in heartbeats: a new worker id starts from zero.
    LatencyHistogram pull_latency;
    LatencyHistogram push_latency;
    // What the session's steps trained with (the step pipeline counts).
    StepPipeline::Stats staleness;
    // Where the trainer's time went, per step (WorkerStats.batch_wait,
    // compute, push_wait; the dense wait is in `staleness`).
    LatencyHistogram batch_wait;
    LatencyHistogram compute;
    LatencyHistogram push_wait;
    // Heartbeat thread only: the committed records per second reported,
    // sampled at least a second apart.
    absl::Time rate_sampled;
    uint64_t rate_records = 0;
    double rate = 0;
    // The worker's counts when the session began: heartbeats report the
    // session's own (what the master counts against this id).
    uint64_t records_before = 0;
    uint64_t pushed_before = 0;
    uint64_t batch_size_seq_before = 0;
  };

  CallOptions MasterCallOptions() const {
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(options_.job.worker.rpc_timeout_ms);
    call.max_attempts = static_cast<int>(options_.job.worker.rpc_attempts);
    return call;
  }
  // Calls the master with the message `make` builds, riding out short
  // outages (MemberSession::CallMaster); stops early when the session is
  // over or the worker stopping.
  StatusOr<Message> CallMaster(Session& session, RpcChannel& master,
                               const std::function<Message()>& make) {
    return session.member->CallMaster(master, make, MasterCallOptions(),
                                      [this, &session] { return StoppingOrOver(session); });
  }
  // One registration: trains until the job ends (OK), the worker is asked to
  // stop (OK), it is fenced (FENCED) or something fails.
  Status RunSession();
  // The trainer (trainer.cc): trains the session's batches as the loader
  // hands them over, one step each through the pipeline, pausing for
  // checkpoints, reporting unreadable shards and logging progress lines,
  // until the loader runs dry, the session is over or a step fails.
  Status TrainBatches(Session& session, RpcChannel& master);
  Status Register(Session& session);
  StatusOr<proto::ClusterMap> FetchClusterMap(RpcChannel& master);
  StatusOr<proto::ClusterMap> AwaitClusterMap(RpcChannel& master);
  std::unique_ptr<PsClient> MakePsClient(Session& session, RpcChannel* master);
  // The step pipeline's connections and its dense pulls.
  StepPipeline::Hooks PipelineHooks(Session& session);
  // The worker's side of the member session and of the shard loader.
  MemberSession::Hooks MemberHooks(Session& session);
  void FillHeartbeat(Session& session, proto::HeartbeatRequest* request);
  void OnHeartbeatReply(Session& session, const proto::HeartbeatReply& body);
  ShardLoader::Hooks LoaderHooks(Session& session);
  // Which parameters a pull asks for: those the model wants pulled with the
  // rows of a batch's keys when it is prepared, ahead of its step; those
  // pulled before each step instead (ParamSpec::pull_each_step: the step
  // pipeline's dense copy); or both (an evaluation batch, which reads the
  // model as the servers hold it).
  enum class Pulled { kWithBatch, kAtStep, kAll };
  // Pulls `which` parameters into *params (and *versions, when given), in
  // one round of requests.
  Status PullParams(Session& session, PsClient& ps, Pulled which,
                    std::span<const uint64_t> keys, ParamBuffers* params,
                    PsClient::Versions* versions);
  static bool Wanted(Pulled which, const ParamSpec& spec);
  // Moves the rows of `which` parameters a pull or a push read (per model
  // parameter) into *params, each dense tensor's chunks cut to its size.
  void TakeRows(Pulled which, std::vector<std::vector<float>>* rows, ParamBuffers* params) const;
  // What a step computed: its pushes, for the pipeline, its loss and its
  // predictions.
  struct StepResult {
    std::vector<StepPipeline::Step::Push> pushes;
    std::vector<StepPipeline::Step::Push> late_pushes;
    double loss_sum = 0;
    std::vector<float> predictions;
    // The servers' receipts for the pushes, filled as they are applied
    // (before the commit, which carries them).
    std::shared_ptr<std::vector<proto::WorkReceipt>> receipts =
        std::make_shared<std::vector<proto::WorkReceipt>>();
  };
  // Trains `prepared` from the dense copy the pipeline allows.
  Status Train(Session& session, const std::shared_ptr<PreparedBatch>& prepared,
               StepResult* result);
  // One step of `batch` (all or part of `prepared`'s) with `params` (its
  // dense tensors from `copy`), its push at `lr_scale`: adds its loss,
  // predictions and push to *result. A step that runs out of memory shrinks
  // the batch size and is made as two steps of half the records, each
  // pushed at its share of `lr_scale`, so that together they update as the
  // whole would.
  Status Step(Session& session, const PreparedBatch& prepared,
              std::shared_ptr<const Batch> batch, const ParamBuffers& params,
              const std::shared_ptr<const StepPipeline::DenseCopy>& copy, float lr_scale,
              StepResult* result);
  Status Commit(Session& session, RpcChannel& master, const PreparedBatch& prepared,
                double loss_sum, const std::vector<float>& predictions,
                const std::vector<proto::WorkReceipt>& receipts);
  // The pipeline's commit of a step: the batch, then the counts, then the
  // end of the step.
  StepPipeline::Step MakeStep(Session& session, std::shared_ptr<PreparedBatch> prepared,
                              StepResult result);
  // Tells the master that the marker's shard cannot be read from its
  // offset on (SHARD_UNREADABLE). OK when the master skipped it; its
  // refusal otherwise (JOB_OVER when the job stops on it; an error naming
  // the file when the master can read it and this worker cannot).
  Status ReportUnreadable(Session& session, RpcChannel& master, const PreparedBatch& marker);
  // Starts a step (session.steps_in_flight), first waiting while the
  // master asks to pause for a coordinated checkpoint. False, without
  // starting one, when the session is over or the worker is stopping
  // meanwhile.
  bool BeginStep(Session& session);
  // Ends a step BeginStep started (committed, or never queued); the last
  // one in flight during a pause tells the master at once.
  static void EndStep(Session& session) {
    bool paused;
    {
      absl::MutexLock lock(&session.mu);
      paused = --session.steps_in_flight == 0 && session.pause_for != 0;
    }
    if (paused) session.member->HeartbeatNow();
  }
  Status Deregister(RpcChannel& master);
  // kFailedPrecondition/FENCED when the session's lease may have run out:
  // nothing may be pushed or committed then.
  static Status CheckLease(Session& session) { return session.member->CheckLease(); }
  // A parameter server that does not answer may be dead; the master then
  // fences every worker while it restores the job. Waits (up to two
  // leases) for that verdict: the session's FENCED failure, on which the
  // worker registers again, or `error` when none comes.
  Status AwaitVerdict(Session& session, Status error);
  // True once the session ended fenced: calls still in flight are moot.
  static bool Fenced(Session& session);
  void EndSession(Session& session, const Status& status);
  void Throttle(absl::Time started, uint64_t records);

  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stop_ || finished_;
  }
  bool JobFinished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  bool StoppingOrOver(const Session& session) const {
    return session.over.load() || stopping();
  }
  // Sleeps up to `duration`, waking early on RequestStop. True if stopping.
  bool SleepUnlessStopping(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || finished_; };
    return mu_.AwaitWithTimeout(absl::Condition(&stop), duration);
  }

  const WorkerOptions options_;
  SocketFactory factory_{TransportOptions{.security = options_.security}};
  std::unique_ptr<RecordParser> parser_;
  std::unique_ptr<Model> model_;
  bool has_step_params_ = false;  // some ParamSpec::pull_each_step: a dense copy
  std::string device_ = "cpu";

  // Across sessions: the batch size (worker.batch_size = auto) and the
  // learning-rate factor that follows it; the failpoint worker.oom_above.
  WorkerBatchSize batch_size_;
  const std::optional<uint64_t> oom_above_;

  // Across sessions.
  std::atomic<uint64_t> records_committed_{0};
  // The job's rate and ETA from the last heartbeat reply, for progress lines.
  std::string job_progress_ ABSL_GUARDED_BY(mu_) = "job ETA ?";
  std::atomic<uint64_t> records_pushed_{0};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> batches_{0};
  std::atomic<int> malformed_logged_{0};
  std::atomic<uint64_t> fenced_sessions_{0};

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // the master said the job is over
};

}  // namespace eps

#endif  // EPS_WORKER_WORKER_IMPL_H_
