#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cluster/job_options.h"
#include "cluster/job_progress.h"
#include "core/cpu_budget.h"
#include "core/data_schema.h"
#include "core/logging.h"
#include "models/cuda/cuda_model.h"
#include "models/device.h"
#include "rpc/message.h"
#include "rpc/net.h"
#include "worker/worker_impl.h"

namespace eps {

Status WorkerOptions::Validate() const {
  RETURN_IF_ERROR_CTX(ParseTcpEndpoint(master).status(), "--master");
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", device, "' is not one of: auto, cpu, cuda"));
  }
  if (workers_on_host < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EPS_WORKERS_ON_HOST must be a whole number >= 1 (read as ", workers_on_host, ")"));
  }
  return job.Validate();
}

Status Worker::Impl::Register(Session& session) {
  const auto registration = [this] {
    Message request;
    request.header().set_method(proto::REGISTER_WORKER);
    proto::RegisterWorkerRequest* body = request.header().mutable_register_worker_request();
    body->set_hostname(Hostname());
    body->set_pid(static_cast<uint32_t>(getpid()));
    body->set_launch_id(options_.launch_id);
    if (options_.launch_id != 0) body->set_launch_secret(options_.launch_secret);
    body->set_device(device_);
    AddSharedOptions(options_.job.SharedOptions(), body->mutable_job_options());
    return request;
  };
  MemberSessionOptions member;
  member.master = options_.master;
  member.role = proto::ROLE_WORKER;
  member.master_wait = absl::Seconds(options_.job.worker.master_wait_s);
  session.member = std::make_unique<MemberSession>(&factory_, member);
  // A master at master.max_workers, or past its registration rate, says
  // SLOW_DOWN: ask again every second, within worker.master_wait_s.
  const absl::Time give_up = absl::Now() + member.master_wait;
  StatusOr<Message> answer = session.member->Register(registration());
  if (!answer.ok() && ReasonOf(answer.status()) == proto::SLOW_DOWN) {
    LOG(WARNING) << answer.status().message() << "; asking again every second";
  }
  while (!answer.ok() && ReasonOf(answer.status()) == proto::SLOW_DOWN && absl::Now() < give_up &&
         !stopping()) {
    absl::SleepFor(absl::Seconds(1));
    answer = session.member->Register(registration());
  }
  ASSIGN_OR_RETURN(Message reply, std::move(answer));
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
  ASSIGN_OR_RETURN(ParamTables tables, MatchParamTables(session.job, model_->params()));
  session.table_ids = std::move(tables.ids);
  session.dense_keys = std::move(tables.dense_keys);
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
  client->set_newest_map([&session] { return session.newest_map.load(); });
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

MemberSession::Hooks Worker::Impl::MemberHooks(Session& session) {
  MemberSession::Hooks hooks;
  hooks.fill_heartbeat = [this, &session](proto::HeartbeatRequest* request) {
    FillHeartbeat(session, request);
  };
  hooks.on_reply = [this, &session](const proto::HeartbeatReply& body) {
    OnHeartbeatReply(session, body);
  };
  // The map is only noted: the parameter clients belong to the loader and
  // the trainer, and each fetches it itself before its next call (or on
  // WRONG_OWNER; see worker.h). Followed so, the next heartbeat says it:
  // no call this worker starts from then on goes by an older map.
  hooks.follow_map = [&session](uint64_t version) {
    VLOG(1) << "cluster map v" << version;
    session.newest_map.store(version);
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
  HistogramToProto(session.staleness.staleness.Snapshot(), stats->mutable_dense_staleness());
  stats->set_dense_staleness_max(session.staleness.max_staleness.load());
  HistogramToProto(session.staleness.waits.Snapshot(), stats->mutable_staleness_wait());
  HistogramToProto(session.batch_wait.Snapshot(), stats->mutable_batch_wait());
  HistogramToProto(session.compute.Snapshot(), stats->mutable_compute());
  HistogramToProto(session.push_wait.Snapshot(), stats->mutable_push_wait());
  absl::MutexLock lock(&session.mu);
  request->set_paused_for_checkpoint(session.steps_in_flight > 0 ? 0 : session.pause_for);
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
      idle_pause = session.pause_for != 0 && session.steps_in_flight == 0;
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
    // The evaluation reads the model as the servers hold it. Its pass
    // starts only once every training push was applied, so the dense
    // tensors pulled with its batches are the final ones; the worker's
    // dense copy may miss the last pushes of other workers.
    const Pulled which = prepared.shard.phase() == proto::EVAL ? Pulled::kAll : Pulled::kWithBatch;
    // Under worker.deterministic the trainer pulls a training batch's rows
    // itself, once the worker's pushes before it are applied.
    if (options_.job.worker.deterministic && which == Pulled::kWithBatch) {
      return absl::OkStatus();
    }
    return PullParams(session, ps, which, prepared.batch.keys, &prepared.params, nullptr);
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

  session.pipeline = std::make_unique<StepPipeline>(options_.job.worker.max_staleness,
                                                    PipelineHooks(session));
  Status status = TrainBatches(session, master);
  // What the trainer handed over is pushed and committed before the worker
  // leaves (unless the session is over: then none of it may land).
  if (status.ok() && !session.over.load()) status = session.pipeline->Drain();
  session.pipeline->Stop();
  if (status.ok()) status = session.pipeline->status();
  // A server that does not answer may be dead: wait for the master's
  // verdict (fenced while it restores the job) before giving up.
  if (!status.ok() && !absl::IsCancelled(status)) status = AwaitVerdict(session, status);
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
  // First in the log: how many threads the model math gets, and why.
  const CpuBudget cpu = ChooseCpuThreads(ReadCpuLimits(), options_.job.worker.compute_threads,
                                         options_.workers_on_host);
  LOG(INFO) << "compute threads: " << cpu.reason;
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
  SetCpuThreads(cpu.threads);
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
