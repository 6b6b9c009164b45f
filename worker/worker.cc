#include "worker/worker.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <utility>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/job_options.h"
#include "cluster/job_progress.h"
#include "cluster/member_session.h"
#include "cluster/placement.h"
#include "core/data_schema.h"
#include "core/failpoint.h"
#include "core/logging.h"
#include "core/metrics.h"
#include "models/batch.h"
#include "models/cuda_model.h"
#include "models/device.h"
#include "models/model.h"
#include "rpc/message.h"
#include "rpc/net.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"
#include "worker/batch_sizer.h"
#include "worker/ps_client.h"
#include "worker/record_parser.h"
#include "worker/shard_loader.h"

namespace eps {

Status WorkerOptions::Validate() const {
  RETURN_IF_ERROR_CTX(ParseTcpEndpoint(master).status(), "--master");
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", device, "' is not one of: auto, cpu, cuda"));
  }
  return job.Validate();
}

namespace {

bool IsFenced(const Status& status) { return ReasonOf(status) == proto::FENCED; }

// The autoscaler's launch id of this process (EPS_LAUNCH_ID, set by its
// launcher); 0 for a worker started by hand or a malformed value.
uint64_t LaunchId() {
  const char* value = std::getenv("EPS_LAUNCH_ID");
  uint64_t id = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &id)) return 0;
  return id;
}


}  // namespace

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
    // The heartbeat thread goes first: its hooks use the loader.
    ~Session() {
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
    std::atomic<bool> over{false};  // fenced, failed or finished: wind down
    absl::Mutex mu;
    // The coordinated checkpoint the master asks to pause for (0: none),
    // from heartbeat and commit replies.
    uint64_t pause_for ABSL_GUARDED_BY(mu) = 0;
    // The trainer is between starting a step (its push) and committing it.
    // A step never starts while pause_for is set, so the worker is paused
    // whenever pause_for is set and no step is running: heartbeats report
    // it, whether the trainer waits to go on or has nothing to train.
    bool stepping ABSL_GUARDED_BY(mu) = false;
    absl::CondVar pause_changed;
    Status failure ABSL_GUARDED_BY(mu);
    // Every pull and push of the session's parameter clients (loader and
    // trainer), reported in heartbeats: a new worker id starts from zero.
    LatencyHistogram pull_latency;
    LatencyHistogram push_latency;
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
  Status Register(Session& session);
  StatusOr<proto::ClusterMap> FetchClusterMap(RpcChannel& master);
  StatusOr<proto::ClusterMap> AwaitClusterMap(RpcChannel& master);
  std::unique_ptr<PsClient> MakePsClient(Session& session, RpcChannel* master);
  // The worker's side of the member session and of the shard loader.
  MemberSession::Hooks MemberHooks(Session& session);
  void FillHeartbeat(Session& session, proto::HeartbeatRequest* request);
  void OnHeartbeatReply(Session& session, const proto::HeartbeatReply& body);
  ShardLoader::Hooks LoaderHooks(Session& session);
  // Pulls into prepared.params the parameters the model wants pulled just
  // before the step (at_step: ParamSpec::pull_each_step) or the others,
  // pulled when the batch is prepared, ahead of its step.
  Status PullParams(Session& session, PsClient& ps, bool at_step, PreparedBatch& prepared);
  Status Train(Session& session, PreparedBatch& prepared, PsClient& ps, double* loss_sum,
               std::vector<float>* predictions);
  // One step of `batch` (all or part of `prepared`'s) with `params`, its
  // push at `lr_scale`: adds its loss to *loss_sum and its predictions to
  // *predictions. A step that runs out of memory shrinks the batch size
  // and is made as two steps of half the records, each pushed at its share
  // of `lr_scale`, so that together they update as the whole would.
  Status Step(Session& session, const PreparedBatch& prepared, const Batch& batch,
              const ParamBuffers& params, float lr_scale, PsClient& ps, double* loss_sum,
              std::vector<float>* predictions);
  Status Commit(Session& session, RpcChannel& master, const PreparedBatch& prepared,
                double loss_sum, const std::vector<float>& predictions);
  // Tells the master that the marker's shard cannot be read from its
  // offset on (SHARD_UNREADABLE). OK when the master skipped it; its
  // refusal otherwise (JOB_OVER when the job stops on it; an error naming
  // the file when the master can read it and this worker cannot).
  Status ReportUnreadable(Session& session, RpcChannel& master, const PreparedBatch& marker);
  // Starts a step (session.stepping), first waiting while the master asks
  // to pause for a coordinated checkpoint. False, without starting one,
  // when the session is over or the worker is stopping meanwhile.
  bool BeginStep(Session& session);
  // Ends the step BeginStep started.
  static void EndStep(Session& session) {
    absl::MutexLock lock(&session.mu);
    session.stepping = false;
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
  bool has_step_params_ = false;  // some ParamSpec::pull_each_step
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

Status Worker::Impl::Register(Session& session) {
  Message request;
  request.header().set_method(proto::REGISTER_WORKER);
  proto::RegisterWorkerRequest* body = request.header().mutable_register_worker_request();
  body->set_hostname(Hostname());
  body->set_pid(static_cast<uint32_t>(getpid()));
  body->set_launch_id(LaunchId());
  body->set_device(device_);
  AddSharedOptions(options_.job.SharedOptions(), body->mutable_job_options());
  MemberSessionOptions member;
  member.master = options_.master;
  member.role = proto::ROLE_WORKER;
  member.master_wait = absl::Seconds(options_.job.worker.master_wait_s);
  session.member = std::make_unique<MemberSession>(&factory_, member);
  ASSIGN_OR_RETURN(Message reply, session.member->Register(std::move(request)));
  const proto::RegisterWorkerReply& registered = reply.header().register_worker_reply();
  session.self.set_role(proto::ROLE_WORKER);
  session.self.set_id(registered.worker_id());
  // Every request from now on proves that this process is that worker.
  session.self.set_credential(registered.credential());
  session.job = registered.job();
  session.heartbeat = absl::Milliseconds(std::max<uint32_t>(1, registered.heartbeat_ms()));
  session.lease = absl::Milliseconds(
      registered.lease_ms() > 0 ? registered.lease_ms() : options_.job.master.lease_ms);
  SetLogNode(absl::StrCat("worker[", session.self.id(), "]"));

  // The master's tables must be this worker's model's parameters.
  const std::vector<ParamSpec>& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    const proto::TableSpec* found = nullptr;
    for (const proto::TableSpec& table : session.job.tables()) {
      if (table.name() == params[i].name) found = &table;
    }
    const bool embedding = params[i].kind == ParamSpec::Kind::kEmbedding;
    if (found == nullptr ||
        (embedding ? found->kind() != proto::EMBEDDING || found->dim() != params[i].size
                   : found->kind() != proto::DENSE || found->dense_size() != params[i].size)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the master's job has no table matching this worker's parameter '", params[i].name,
          "' (do the master and the worker read the same config?)"));
    }
    session.table_ids.push_back(found->id());
    std::vector<uint64_t> keys;
    if (!embedding) {
      for (uint64_t c = 0; c < DenseChunkCount(found->dense_size(), found->dim()); ++c) {
        keys.push_back(DenseChunkKey(found->id(), c));
      }
    }
    session.dense_keys.push_back(std::move(keys));
  }
  LOG(INFO) << "registered with " << options_.master << " (" << device_ << ", model "
            << options_.job.model.type << ")";
  return absl::OkStatus();
}

StatusOr<proto::ClusterMap> Worker::Impl::FetchClusterMap(RpcChannel& master) {
  Message request;
  request.header().set_method(proto::GET_CLUSTER_MAP);
  request.header().mutable_get_cluster_map_request();
  ASSIGN_OR_RETURN(Message reply, master.Call(options_.master, std::move(request),
                                              MasterCallOptions()));
  return reply.header().get_cluster_map_reply().map();
}

StatusOr<proto::ClusterMap> Worker::Impl::AwaitClusterMap(RpcChannel& master) {
  absl::Time last_log = absl::Now();
  while (true) {
    StatusOr<proto::ClusterMap> map = FetchClusterMap(master);
    if (map.ok() || ReasonOf(map.status()) != proto::NOT_READY) return map;
    if (absl::Now() - last_log > absl::Seconds(options_.job.job.progress_interval_s)) {
      LOG(INFO) << map.status().message();
      last_log = absl::Now();
    }
    if (SleepUnlessStopping(absl::Milliseconds(200))) {
      return absl::CancelledError("stopped while waiting for parameter servers");
    }
  }
}

std::unique_ptr<PsClient> Worker::Impl::MakePsClient(Session& session, RpcChannel* master) {
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(options_.job.worker.rpc_timeout_ms);
  call.max_attempts = static_cast<int>(options_.job.worker.rpc_attempts);
  auto client = std::make_unique<PsClient>(&factory_, session.self, session.job, call,
                                           [this, master] { return FetchClusterMap(*master); });
  CHECK_OK(client->SetClusterMap(session.initial_map));
  // Given up when fenced, and once the job is over: every record is
  // committed then, and the servers exit, so a pull or push in flight
  // (the loader prefetching) would only wait out its timeouts (2 attempts
  // x 5 routing rounds: 20 s with 2 s calls) before the worker can exit.
  client->set_abandon([this, &session] { return Fenced(session) || JobFinished(); });
  client->set_latency_histograms(&session.pull_latency, &session.push_latency);
  return client;
}

bool Worker::Impl::Fenced(Session& session) {
  if (!session.over.load()) return false;
  absl::MutexLock lock(&session.mu);
  return IsFenced(session.failure);
}

Status Worker::Impl::AwaitVerdict(Session& session, Status error) {
  if (error.ok() || IsFenced(error)) return error;
  const bool server_silent = absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error) ||
                             absl::IsAborted(error);
  const absl::Time give_up = absl::Now() + (server_silent ? 2 * session.lease : absl::ZeroDuration());
  while (true) {
    {
      absl::MutexLock lock(&session.mu);
      if (IsFenced(session.failure)) return session.failure;
    }
    if (absl::Now() >= give_up || stopping()) return error;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Worker::Impl::EndSession(Session& session, const Status& status) {
  {
    absl::MutexLock lock(&session.mu);
    if (session.failure.ok()) session.failure = status;
  }
  session.over.store(true);
}

void Worker::Impl::Throttle(absl::Time started, uint64_t records) {
  const int64_t cap = options_.job.worker.max_records_per_s;
  if (cap <= 0) return;
  const absl::Time due = started + absl::Seconds(static_cast<double>(records) / cap);
  const absl::Duration wait = due - absl::Now();
  if (wait > absl::ZeroDuration()) SleepUnlessStopping(wait);
}

Status Worker::Impl::PullParams(Session& session, PsClient& ps, bool at_step,
                                PreparedBatch& prepared) {
  const std::vector<ParamSpec>& params = model_->params();
  std::vector<PsClient::Keys> keys(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    keys[i].table_id = session.table_ids[i];
    if (params[i].pull_each_step != at_step) continue;  // no keys: nothing pulled
    keys[i].keys = params[i].kind == ParamSpec::Kind::kEmbedding
                       ? std::span<const uint64_t>(prepared.batch.keys)
                       : std::span<const uint64_t>(session.dense_keys[i]);
  }
  std::vector<std::vector<float>> pulled;
  RETURN_IF_ERROR_CTX(ps.Pull(keys, &pulled), at_step ? "pull of the step's dense tensors" : "pull");
  prepared.params.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].pull_each_step != at_step) continue;
    prepared.params[i] = std::move(pulled[i]);
    // Dense tensors arrive as whole chunks; the model sees the tensor.
    if (params[i].kind == ParamSpec::Kind::kDense) prepared.params[i].resize(params[i].size);
  }
  return absl::OkStatus();
}

Status Worker::Impl::Train(Session& session, PreparedBatch& prepared, PsClient& ps,
                           double* loss_sum, std::vector<float>* predictions) {
  if (has_step_params_) RETURN_IF_ERROR(PullParams(session, ps, /*at_step=*/true, prepared));
  const float lr_scale =
      prepared.shard.phase() == proto::EVAL ? 1.0f : batch_size_.LrScale(prepared.batch.size());
  return Step(session, prepared, prepared.batch, prepared.params, lr_scale, ps, loss_sum,
              predictions);
}

Status Worker::Impl::Step(Session& session, const PreparedBatch& prepared, const Batch& batch,
                          const ParamBuffers& params, float lr_scale, PsClient& ps,
                          double* loss_sum, std::vector<float>* predictions) {
  const bool eval = prepared.shard.phase() == proto::EVAL;
  ParamBuffers grads;
  std::vector<float> batch_predictions;
  double loss = 0;
  // The failpoint worker.oom_above stands for a device that holds fewer.
  bool out_of_memory = oom_above_.has_value() && static_cast<uint64_t>(batch.size()) > *oom_above_;
  try {
    if (!out_of_memory) {
      loss = model_->ForwardBackward(batch, params, &batch_predictions, eval ? nullptr : &grads);
    }
  } catch (const std::bad_alloc&) {
    out_of_memory = true;
  }
  if (out_of_memory) {
    if (batch.size() <= 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a step of one record of ", prepared.shard.path(), " from byte ",
                       prepared.begin, " ran out of memory: the model does not fit"));
    }
    LOG(WARNING) << "a step of " << batch.size() << " records ran out of memory; training it "
                 << "in two halves";
    if (std::optional<BatchSizer::Change> change = batch_size_.OutOfMemory(batch.size())) {
      session.loader->SetBatchSize(change->to);
    }
    const int half = batch.size() / 2;
    for (const auto& [begin, end] : {std::pair{0, half}, std::pair{half, batch.size()}}) {
      std::vector<uint32_t> from;
      const Batch piece = SliceBatch(batch, begin, end, &from);
      const float share = lr_scale * static_cast<float>(end - begin) / batch.size();
      RETURN_IF_ERROR(Step(session, prepared, piece, model_->SliceParams(params, from), share, ps,
                           loss_sum, predictions));
      if (!std::isfinite(*loss_sum)) break;  // diverged: nothing more of it is pushed
    }
    return absl::OkStatus();
  }
  *loss_sum += loss;
  predictions->insert(predictions->end(), batch_predictions.begin(), batch_predictions.end());
  if (eval) return absl::OkStatus();
  // A diverged model: push nothing of it. The commit carries the
  // non-finite loss, and the master stops the job (resumably) on it.
  const bool loss_finite = std::isfinite(loss);
  if (!loss_finite || !AllFinite(grads)) {
    LOG(ERROR) << "the model diverged: "
               << (loss_finite ? std::string("a non-finite gradient") : absl::StrCat("loss ", loss))
               << " on the batch of " << prepared.shard.path() << " from byte " << prepared.begin
               << "; pushing nothing of it, telling the master";
    *loss_sum = std::numeric_limits<double>::quiet_NaN();
    return absl::OkStatus();
  }
  const std::vector<ParamSpec>& specs = model_->params();
  std::vector<PsClient::Keys> keys(specs.size());
  std::vector<std::span<const float>> values(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    keys[i].table_id = session.table_ids[i];
    if (specs[i].kind == ParamSpec::Kind::kEmbedding) {
      keys[i].keys = batch.keys;
    } else {
      keys[i].keys = session.dense_keys[i];
      // Pad the gradient to whole chunks.
      grads[i].resize(session.dense_keys[i].size() * ps.table(session.table_ids[i]).dim(), 0.0f);
    }
    values[i] = grads[i];
  }
  // A worker that was frozen past its lease must not push: its shard may
  // be another worker's by now.
  RETURN_IF_ERROR(CheckLease(session));
  RETURN_IF_ERROR(Annotate(ps.Push(keys, values, lr_scale), "push"));
  records_pushed_.fetch_add(static_cast<uint64_t>(batch.size()));
  return absl::OkStatus();
}

Status Worker::Impl::ReportUnreadable(Session& session, RpcChannel& master,
                                      const PreparedBatch& marker) {
  // The master decides for the whole job once; a repeat gets the same answer.
  StatusOr<Message> reply = CallMaster(session, master, [&] {
    Message request;
    request.header().set_method(proto::SHARD_UNREADABLE);
    proto::ShardUnreadableRequest* body = request.header().mutable_shard_unreadable_request();
    body->set_shard_id(marker.shard.shard_id());
    body->set_epoch(marker.shard.epoch());
    body->set_phase(marker.shard.phase());
    body->set_offset(marker.begin);
    body->set_line(marker.unreadable_line);
    body->set_error(marker.unreadable);
    return request;
  });
  if (!reply.ok()) {
    return Annotate(reply.status(), absl::StrCat("cannot read ", marker.shard.path(), " (",
                                                 marker.unreadable, ")"));
  }
  if (reply->header().shard_unreadable_reply().skipped()) {
    LOG(WARNING) << "the master skipped the rest of shard " << marker.shard.shard_id() << " ("
                 << marker.shard.path() << " from line " << marker.unreadable_line
                 << "): data.on_unreadable = skip";
  }
  return absl::OkStatus();
}

Status Worker::Impl::Commit(Session& session, RpcChannel& master, const PreparedBatch& prepared,
                            double loss_sum, const std::vector<float>& predictions) {
  // A repeated commit is acknowledged without effect, so retrying is safe.
  StatusOr<Message> reply = CallMaster(session, master, [&] {
    Message request;
    request.header().set_method(proto::COMMIT_PROGRESS);
    proto::CommitProgressRequest* body = request.header().mutable_commit_progress_request();
    body->set_shard_id(prepared.shard.shard_id());
    body->set_epoch(prepared.shard.epoch());
    body->set_phase(prepared.shard.phase());
    body->set_begin_offset(prepared.begin);
    body->set_end_offset(prepared.end);
    body->set_lines(prepared.lines);
    body->set_malformed(prepared.malformed);
    body->set_loss_sum(loss_sum);
    for (const std::string& example : prepared.malformed_examples) {
      body->add_malformed_examples(example);
    }
    if (prepared.shard.phase() == proto::EVAL) {
      request.AddArray(prepared.batch.labels);
      request.AddArray(predictions);
    }
    return request;
  });
  RETURN_IF_ERROR_CTX(reply.status(), absl::StrCat("commit of shard ", prepared.shard.shard_id()));
  const proto::CommitProgressReply& answer = reply->header().commit_progress_reply();
  if (answer.has_split_shard()) session.loader->RequestSplit(answer.split_shard());
  if (answer.pause_for_checkpoint() != 0) {
    absl::MutexLock lock(&session.mu);
    session.pause_for = answer.pause_for_checkpoint();
  }
  return absl::OkStatus();
}

bool Worker::Impl::BeginStep(Session& session) {
  absl::Time paused;
  uint64_t checkpoint = 0;  // the pause in progress, once seen
  while (true) {
    bool newly_paused = false;
    {
      absl::MutexLock lock(&session.mu);
      if (session.pause_for == 0) {
        session.stepping = true;
        if (checkpoint != 0) {
          VLOG(1) << "checkpoint " << checkpoint << ": resumed after "
                  << absl::FormatDuration(absl::Now() - paused);
        }
        return true;
      }
      if (checkpoint == 0) {
        checkpoint = session.pause_for;
        paused = absl::Now();
        newly_paused = true;
      }
    }
    if (newly_paused) {
      VLOG(1) << "paused for checkpoint " << checkpoint;
      session.member->HeartbeatNow();  // tell the master without waiting for the next beat
    }
    if (StoppingOrOver(session)) return false;
    // Timed: a stop or the end of the session does not signal pause_changed.
    absl::MutexLock lock(&session.mu);
    if (session.pause_for != 0) {
      session.pause_changed.WaitWithTimeout(&session.mu, absl::Milliseconds(50));
    }
  }
}

MemberSession::Hooks Worker::Impl::MemberHooks(Session& session) {
  MemberSession::Hooks hooks;
  hooks.fill_heartbeat = [this, &session](proto::HeartbeatRequest* request) {
    FillHeartbeat(session, request);
  };
  hooks.on_reply = [this, &session](const proto::HeartbeatReply& body) {
    OnHeartbeatReply(session, body);
  };
  // The map is only noted: the parameter clients belong to the loader and
  // the trainer, and each fetches the map itself on WRONG_OWNER (see
  // worker.h).
  hooks.follow_map = [](uint64_t version) {
    VLOG(1) << "cluster map v" << version;
    return absl::OkStatus();
  };
  hooks.on_end = [this, &session](MemberSession::State state, const Status& status) {
    if (state != MemberSession::State::kFinished) {
      EndSession(session, status);
      return;
    }
    // Usually the loader hears it from GET_SHARD first; a worker waiting
    // for work hears it here.
    VLOG(1) << "the master says the job is over";
    absl::MutexLock lock(&mu_);
    finished_ = true;
  };
  return hooks;
}

void Worker::Impl::FillHeartbeat(Session& session, proto::HeartbeatRequest* request) {
  const absl::Time now = absl::Now();
  const uint64_t records = records_committed_.load();
  const double seconds = absl::ToDoubleSeconds(now - session.rate_sampled);
  if (seconds >= 1.0) {
    session.rate = static_cast<double>(records - session.rate_records) / seconds;
    session.rate_records = records;
    session.rate_sampled = now;
  }
  proto::WorkerStats* stats = request->mutable_worker();
  // Since this registration, as the master counts them per worker id: a
  // lifetime count would make the master take the pushes of earlier
  // sessions for this one's uncommitted work.
  stats->set_records(records - session.records_before);
  stats->set_records_per_s(session.rate);
  stats->set_batches(batches_.load());
  stats->set_malformed(malformed_.load());
  stats->set_records_pushed(records_pushed_.load() - session.pushed_before);
  // This registration's changes: a new worker id starts from none.
  batch_size_.Report(session.batch_size_seq_before, stats);
  HistogramToProto(session.pull_latency.Snapshot(), stats->mutable_pull_latency());
  HistogramToProto(session.push_latency.Snapshot(), stats->mutable_push_latency());
  absl::MutexLock lock(&session.mu);
  request->set_paused_for_checkpoint(session.stepping ? 0 : session.pause_for);
}

void Worker::Impl::OnHeartbeatReply(Session& session, const proto::HeartbeatReply& body) {
  {
    absl::MutexLock lock(&mu_);
    job_progress_ = JobProgress(body);
  }
  bool idle_pause = false;
  {
    absl::MutexLock lock(&session.mu);
    if (session.pause_for != body.pause_for_checkpoint()) {
      session.pause_for = body.pause_for_checkpoint();
      session.pause_changed.SignalAll();
      idle_pause = session.pause_for != 0 && !session.stepping;
    }
  }
  // Paused already when no step runs (nothing to train, say): say so at
  // once.
  if (idle_pause) session.member->HeartbeatNow();
  if (body.has_split_shard()) session.loader->RequestSplit(body.split_shard());
}

ShardLoader::Hooks Worker::Impl::LoaderHooks(Session& session) {
  ShardLoader::Hooks hooks;
  hooks.make_ps_client = [this, &session](RpcChannel* master) {
    return MakePsClient(session, master);
  };
  hooks.call_master = [this, &session](RpcChannel& master, const std::function<Message()>& make) {
    return CallMaster(session, master, make);
  };
  hooks.prepare = [this, &session](PsClient& ps, PreparedBatch& prepared) {
    return PullParams(session, ps, /*at_step=*/false, prepared);
  };
  hooks.stopping = [this, &session] { return StoppingOrOver(session); };
  hooks.sleep = [this](absl::Duration duration) { SleepUnlessStopping(duration); };
  hooks.finished = [this] {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  };
  hooks.failed = [this, &session](Status error) {
    const Status verdict = AwaitVerdict(session, std::move(error));
    if (!verdict.ok()) EndSession(session, verdict);
    return verdict;
  };
  return hooks;
}

Status Worker::Impl::Deregister(RpcChannel& master) {
  Message request;
  request.header().set_method(proto::DEREGISTER);
  request.header().mutable_deregister_request();
  CallOptions call = MasterCallOptions();
  call.max_attempts = 1;
  return master.Call(options_.master, std::move(request), call).status();
}

Status Worker::Impl::RunSession() {
  Session session;
  RETURN_IF_ERROR(Register(session));
  ShardLoaderOptions loader_options;
  loader_options.batch_size = batch_size_.size();
  loader_options.prefetch_batches = static_cast<size_t>(options_.job.worker.prefetch_batches);
  session.loader = std::make_unique<ShardLoader>(loader_options, &factory_, session.self,
                                                 parser_.get(), &malformed_logged_,
                                                 LoaderHooks(session));
  session.rate_sampled = absl::Now();
  session.rate_records = records_committed_.load();
  session.records_before = session.rate_records;
  session.pushed_before = records_pushed_.load();
  session.batch_size_seq_before = batch_size_.last_change();
  session.member->Start(session.self, session.heartbeat, session.lease, MemberHooks(session));
  RpcChannel master(&factory_, session.self);
  StatusOr<proto::ClusterMap> map = AwaitClusterMap(master);
  if (!map.ok()) {
    EndSession(session, absl::OkStatus());
    session.member->Stop();
    if (absl::IsCancelled(map.status())) return Deregister(master);
    return Annotate(map.status(), "cannot get the cluster map");
  }
  session.initial_map = *map;
  session.loader->Start();

  std::unique_ptr<PsClient> ps = MakePsClient(session, &master);
  const absl::Time started = absl::Now();
  absl::Time last_progress = started;
  uint64_t records_at_progress = records_committed_.load();
  uint64_t session_records = 0;
  double loss_sum_since = 0;
  uint64_t loss_count_since = 0;
  Status status;
  std::vector<float> predictions;
  // Looked up once a session, not once a batch.
  const bool hang_trainer = FailpointArmed("worker.hang_trainer", session.self.id());
  // The batch sizer times whole steps: from one commit to the next.
  absl::Time step_ended = absl::Now();
  while (std::unique_ptr<PreparedBatch> prepared = session.loader->Pop()) {
    if (session.over.load()) break;  // fenced: nothing queued may land
    if (!prepared->unreadable.empty()) {
      // Every batch of the shard before it is committed: the master checks
      // the file from there and skips the rest, or stops the job.
      status = ReportUnreadable(session, master, *prepared);
      if (!status.ok()) break;
      continue;
    }
    // The batch before this one is committed and nothing is in flight: the
    // moment to pause for a coordinated checkpoint.
    if (!BeginStep(session)) break;
    const absl::Cleanup end_step = [&session] { EndStep(session); };
    double loss_sum = 0;
    predictions.clear();
    if (prepared->batch.size() > 0) {
      status = Train(session, *prepared, *ps, &loss_sum, &predictions);
      if (!status.ok()) {
        status = AwaitVerdict(session, status);
        break;
      }
    }
    status = CheckLease(session);
    if (!status.ok()) break;
    status = Commit(session, master, *prepared, loss_sum, predictions);
    if (!status.ok()) break;
    if (hang_trainer) {
      // As a trainer stuck in a device call: in its step, holding its
      // shard, heartbeating, until the process is asked to stop.
      LOG(WARNING) << "failpoint worker.hang_trainer=" << session.self.id()
                   << ": the trainer hangs";
      while (!SleepUnlessStopping(absl::Hours(1))) {
      }
      break;
    }
    batches_.fetch_add(1);
    malformed_.fetch_add(prepared->malformed);
    const absl::Time now = absl::Now();
    if (prepared->shard.phase() == proto::TRAIN) {
      const uint64_t records = static_cast<uint64_t>(prepared->batch.size());
      records_committed_.fetch_add(records);
      session_records += records;
      loss_sum_since += loss_sum;
      loss_count_since += records;
      if (std::optional<BatchSizer::Change> change =
              batch_size_.StepDone(prepared->batch.size(), now - step_ended)) {
        session.loader->SetBatchSize(change->to);
      }
      Throttle(started, session_records);
    }
    step_ended = now;
    if (now - last_progress >= absl::Seconds(options_.job.job.progress_interval_s)) {
      const uint64_t records = records_committed_.load();
      std::string job;
      {
        absl::MutexLock lock(&mu_);
        job = job_progress_;
      }
      LOG(INFO) << records << " records trained, "
                << absl::StrFormat("%.0f", (records - records_at_progress) /
                                               absl::ToDoubleSeconds(now - last_progress))
                << " records/s, loss "
                << (loss_count_since ? absl::StrFormat("%.5f", loss_sum_since / loss_count_since)
                                     : std::string("n/a"))
                << (prepared->shard.phase() == proto::EVAL ? " (evaluating)" : "") << "; " << job;
      last_progress = now;
      records_at_progress = records;
      loss_sum_since = 0;
      loss_count_since = 0;
    }
  }
  // Stop the loader and collect it; batches still queued were never pushed
  // and are simply dropped.
  EndSession(session, absl::OkStatus());
  session.loader->Stop();
  session.member->Stop();
  if (status.ok()) status = session.loader->status();
  if (absl::IsCancelled(status)) status = absl::OkStatus();
  {
    absl::MutexLock lock(&session.mu);
    // Fenced wins: whatever failed meanwhile, the worker registers again.
    if (status.ok() || IsFenced(session.failure)) status = session.failure;
  }
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = finished_;
  }
  // Leaving hands any shard still held back to the master at its committed
  // offset; a fenced worker's shards move anyway, and after the job
  // finished the master may be gone already.
  if (!finished && !IsFenced(status)) {
    Status left = Deregister(master);
    if (!left.ok()) VLOG(1) << "deregistering: " << left;
  }
  return status;
}

Status Worker::Impl::Run() {
  RETURN_IF_ERROR(options_.Validate());
  ASSIGN_OR_RETURN(Device device, ResolveDevice(options_.device));
  ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(options_.job));
  parser_ = std::make_unique<RecordParser>(schema);
  ASSIGN_OR_RETURN(ModelOptions model_options, ModelOptions::FromConfig(options_.job));
  // Every model type has a CUDA back end: the resolved device decides.
  if (device == Device::kCuda) {
    ASSIGN_OR_RETURN(model_, CreateCudaModel(model_options));
  } else {
    ASSIGN_OR_RETURN(model_, Model::Create(model_options));
  }
  device_ = DeviceName(device);
  LOG(INFO) << "model '" << model_options.type << "' trains on the " << device_
            << " (--device " << options_.device << ")";
  SetCpuThreads(static_cast<int>(options_.job.worker.compute_threads));
  for (const ParamSpec& param : model_->params()) has_step_params_ |= param.pull_each_step;

  const absl::Time started = absl::Now();
  Status status;
  while (true) {
    status = RunSession();
    if (ReasonOf(status) == proto::JOB_OVER) {
      // The master stopped the job (a diverged model, a full disk, ...):
      // its final status says why; this worker did its part.
      LOG(WARNING) << "the master ended the job: " << status.message();
      status = absl::OkStatus();
      break;
    }
    if (!status.ok() && !IsFenced(status)) {
      absl::MutexLock lock(&mu_);
      if (finished_) {
        // The job ended first (its servers may be gone already): what
        // failed after that changes nothing.
        LOG(INFO) << "after the master ended the job: " << status.message();
        status = absl::OkStatus();
      }
    }
    if (!IsFenced(status) || stopping()) break;
    fenced_sessions_.fetch_add(1);
    LOG(WARNING) << "fenced: " << status.message()
                 << "; dropping uncommitted work and registering again";
    status = absl::OkStatus();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LOG(INFO) << "summary: " << records_committed_.load() << " records trained ("
            << malformed_.load() << " malformed lines skipped) in "
            << absl::StrFormat("%.1f", seconds) << " s, "
            << absl::StrFormat("%.0f", records_committed_.load() / std::max(seconds, 1e-9))
            << " records/s, fenced " << fenced_sessions_.load() << " time(s)";
  return status;
}

Worker::Worker(const WorkerOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Worker::~Worker() = default;
Status Worker::Run() { return impl_->Run(); }
void Worker::RequestStop() { impl_->RequestStop(); }

}  // namespace eps
