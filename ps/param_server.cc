#include "ps/param_server.h"
#include "ps/param_server_impl.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cluster/call_table.h"
#include "cluster/job_options.h"
#include "cluster/job_progress.h"
#include "cluster/member_session.h"
#include "cluster/placement.h"
#include "core/clock.h"
#include "core/logging.h"
#include "core/metrics.h"
#include "core/status.h"
#include "ps/push_deduplicator.h"
#include "ps/row_quota.h"
#include "ps/storage.h"
#include "ps/table.h"
#include "rpc/message.h"
#include "rpc/net.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"

namespace eps {

ParamServerOptions ParamServerOptions::FromConfig(const JobConfig& config) {
  ParamServerOptions options;
  options.threads = static_cast<int>(config.ps.threads);
  options.heartbeat = absl::Milliseconds(config.master.heartbeat_ms);
  options.master_wait = absl::Seconds(config.worker.master_wait_s);
  options.rpc_timeout = absl::Milliseconds(config.worker.rpc_timeout_ms);
  options.progress_interval = absl::Seconds(config.job.progress_interval_s);
  options.storage.memory_budget_mb = config.ps.memory_budget_mb;
  options.storage.admission_memory_mb = config.ps.admission_memory_mb;
  options.max_new_rows_per_worker_s = static_cast<uint64_t>(config.ps.max_new_rows_per_worker_s);
  options.max_new_rows_s = static_cast<uint64_t>(config.ps.max_new_rows_s);
  options.storage.flush_interval = absl::Milliseconds(config.ps.flush_interval_ms);
  options.storage.every_push = config.ps.durability == "every_push";
  options.storage.keep_checkpoints = static_cast<int>(config.checkpoint.keep);
  options.storage.checkpoint_dir = config.checkpoint.dir;
  options.storage.restore_checkpoint = config.checkpoint.restore;
  options.shared_options = config.SharedOptions();
  return options;
}

Status ParamServerOptions::Validate() const {
  RETURN_IF_ERROR_CTX(ParseTcpEndpoint(master).status(), "--master");
  RETURN_IF_ERROR(storage.Validate());
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port must be 0..65535 (got ", port, ")"));
  }
  if (threads < 1) return absl::InvalidArgumentError("ps.threads must be >= 1");
  if (heartbeat <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat interval must be > 0");
  }
  return absl::OkStatus();
}

namespace {

// Most keys one request may carry per table (bounds the reply too).
constexpr size_t kMaxKeysPerTable = size_t{1} << 22;

Status FencedError(uint32_t worker) {
  return ErrorWithReason(
      absl::StatusCode::kFailedPrecondition,
      absl::StrCat("worker ", worker, " is fenced (its lease expired); it must register again"),
      proto::FENCED);
}

}  // namespace

Status ParamServer::Impl::Start() {
  RETURN_IF_ERROR(options_.Validate());
  // The store first: a bad data dir fails before anything is announced.
  ASSIGN_OR_RETURN(storage_, ServerStorage::Open(options_.storage));
  std::string host = options_.host;
  if (host.empty()) {
    ASSIGN_OR_RETURN(host, LocalAddressFor(options_.master));
  }
  RpcServerOptions rpc_options;
  rpc_options.endpoint = absl::StrCat("tcp://", host, ":", options_.port);
  rpc_options.num_threads = options_.threads;
  rpc_options.authorize = AuthorizeCall;
  rpc_options.max_frames = 2 * 64;
  rpc_options.name = "ps";
  ASSIGN_OR_RETURN(rpc_, RpcServer::Start(&factory_, rpc_options,
                                          [this](Message& request, Message* reply) {
                                            return Handle(request, reply);
                                          }));
  endpoint_ = rpc_->endpoint();

  session_ = NewSession();
  StatusOr<Message> reply = session_->Register(RegisterRequest(/*rejoin=*/false));
  if (!reply.ok()) {
    return options_.storage.data_dir.empty()
               ? reply.status()
               : Annotate(reply.status(), absl::StrCat("--data-dir ", options_.storage.data_dir));
  }
  id_ = reply->header().register_server_reply().server_id();
  job_ = reply->header().register_server_reply().job();
  dense_versions_ = std::vector<std::atomic<uint64_t>>(static_cast<size_t>(job_.tables_size()));
  RETURN_IF_ERROR(CheckWorkerCredentials(reply->header().register_server_reply()));
  SetLogNode(absl::StrCat("ps[", id_, "]"));
  // The job comes from a peer: a bad one is refused, not a crash.
  RETURN_IF_ERROR_CTX(storage_->CreateTables(job_), "the master's job");
  // Recorded once the dir is known to be this job's: whatever slot the
  // master gave (a fresh dir may take a dead server's), it is ours now.
  RETURN_IF_ERROR(storage_->SetServerId(id_));
  {
    absl::MutexLock lock(&mu_);
    tables_ready_ = true;
  }
  LOG(INFO) << "serving " << storage_->num_tables() << " table(s) of job '" << job_.name() << "' on "
            << endpoint_ << " with " << options_.threads << " thread(s)";
  last_progress_ = absl::Now();
  StartHeartbeats();
  started_ = true;
  return absl::OkStatus();
}

std::unique_ptr<MemberSession> ParamServer::Impl::NewSession() {
  MemberSessionOptions session_options;
  session_options.master = options_.master;
  session_options.role = proto::ROLE_SERVER;
  session_options.master_wait = options_.master_wait;
  return std::make_unique<MemberSession>(&factory_, session_options);
}

Status ParamServer::Impl::CheckWorkerCredentials(const proto::RegisterServerReply& reply) {
  if (!options_.security.curve) return absl::OkStatus();
  StatusOr<WorkerCredentials> credentials = WorkerCredentials::FromKey(reply.worker_credential_key());
  if (!credentials.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the master's registration answer carries no valid key of workers' credentials (",
        credentials.status().message(), "): are the master and this server the same eps build?"));
  }
  {
    absl::MutexLock lock(&receipts_mu_);
    receipt_key_ = *credentials;
  }
  rpc_->SetWorkerCredentials(*std::move(credentials));
  return absl::OkStatus();
}

std::string ParamServer::Impl::ReceiptFor(uint32_t sender, uint64_t seq,
                                          const proto::WorkBatch& batch, bool first_time) {
  absl::MutexLock lock(&receipts_mu_);
  if (!receipt_key_.has_value()) return std::string();
  std::string tag = receipt_key_->Receipt(sender, batch);
  if (first_time) {
    last_receipts_[sender] = LastReceipt{.seq = seq, .tag = tag};
    return tag;
  }
  const auto last = last_receipts_.find(sender);
  if (last == last_receipts_.end() || last->second.seq != seq || last->second.tag != tag) {
    return std::string();
  }
  return tag;
}

Message ParamServer::Impl::RegisterRequest(bool rejoin) const {
  Message request;
  request.header().set_method(proto::REGISTER_SERVER);
  proto::RegisterServerRequest* body = request.header().mutable_register_server_request();
  body->set_endpoint(endpoint_);
  body->set_hostname(Hostname());
  body->set_pid(static_cast<uint32_t>(getpid()));
  body->set_stored_job(storage_->stored_job());
  if (rejoin) {
    // The slot this process holds (a memory-only server has no SERVER file).
    body->set_stored_server_id(id_);
    body->set_rejoin(true);
  } else if (const std::optional<uint32_t> stored = storage_->stored_server_id();
             stored.has_value()) {
    body->set_stored_server_id(*stored);
  }
  AddSharedOptions(options_.shared_options, body->mutable_job_options());
  return request;
}

void ParamServer::Impl::StartHeartbeats() {
  proto::NodeId self;
  self.set_role(proto::ROLE_SERVER);
  self.set_id(id_);
  // A server never checks its lease (it pushes nothing); the master wait
  // stands in for it.
  session_->Start(self, options_.heartbeat, options_.master_wait, SessionHooks());
}

Status ParamServer::Impl::Rejoin(const Status& why) {
  if (rejoined_ && !answered_.load()) {
    // It took the slot back and was refused again before any heartbeat
    // went through: registering once more would only loop.
    return absl::FailedPreconditionError(absl::StrCat(
        "the master refuses ps[", id_, "]'s heartbeats right after it took its slot back: ",
        why.message()));
  }
  LOG(WARNING) << "the master no longer counts this server (" << why.message()
               << "); registering again as ps[" << id_ << "]";
  session_->Stop();
  rejoined_ = true;
  answered_.store(false);
  session_ = NewSession();
  StatusOr<Message> reply = session_->Register(RegisterRequest(/*rejoin=*/true));
  if (ReasonOf(reply.status()) == proto::JOB_OVER) {
    LOG(INFO) << "the job is over; exiting";
    Stop(absl::OkStatus());
    return absl::OkStatus();
  }
  if (!reply.ok()) {
    return Annotate(reply.status(), absl::StrCat("ps[", id_, "] cannot take its slot back"));
  }
  const uint32_t slot = reply->header().register_server_reply().server_id();
  RETURN_IF_ERROR(CheckWorkerCredentials(reply->header().register_server_reply()));
  if (slot != id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ps[", id_, "] registered again but the master answered slot ", slot));
  }
  LOG(INFO) << "back in the job as ps[" << id_ << "]: the master restores what it needs";
  StartHeartbeats();
  return absl::OkStatus();
}

Status ParamServer::Impl::Wait() {
  if (!started_) return absl::FailedPreconditionError("Wait without a successful Start");
  while (true) {
    Status why;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || rejoin_; };
      mu_.Await(absl::Condition(&wake));
      if (stop_) break;
      rejoin_ = false;
      why = rejoin_why_;
    }
    if (Status rejoined = Rejoin(why); !rejoined.ok()) Stop(rejoined);
  }
  session_->Stop();
  if (!summarized_) {
    summarized_ = true;
    const proto::ServerStats stats = Stats();
    LOG(INFO) << "summary: " << stats.rows() << " rows, " << stats.pulls() << " pulls ("
              << rows_pulled_.load() << " rows), " << stats.pushes() << " pushes ("
              << rows_pushed_.load() << " rows), " << stats.pushes_fenced() << " pushes fenced, "
              << stats.pushes_deduplicated() << " pushes deduplicated";
  }
  absl::MutexLock lock(&mu_);
  return stop_reason_;
}

MemberSession::Hooks ParamServer::Impl::SessionHooks() {
  MemberSession::Hooks hooks;
  hooks.fill_heartbeat = [this](proto::HeartbeatRequest* request) {
    *request->mutable_server() = Stats();
    request->set_endpoint(endpoint_);
    const std::string write_error = storage_->write_error();
    if (!write_error.empty() && !write_error_reported_) {
      write_error_reported_ = true;
      LOG(ERROR) << "cannot write: " << write_error << "; telling the master";
    }
    request->set_storage_error(write_error);
  };
  hooks.on_reply = [this](const proto::HeartbeatReply& body) {
    answered_.store(true);
    OnHeartbeatReply(body);
  };
  // The first heartbeat's reply brings the map: PULL and PUSH are served
  // from then on.
  hooks.follow_map = [this](uint64_t) { return RefreshClusterMap(); };
  hooks.on_end = [this](MemberSession::State state, const Status& status) {
    if (state == MemberSession::State::kFenced) {
      // Cut off past its lease (or replaced): Wait registers again, and the
      // master says whether the slot is still this process's.
      absl::MutexLock lock(&mu_);
      rejoin_ = true;
      rejoin_why_ = status;
    } else {
      Stop(status);  // OK when the job is over
    }
  };
  return hooks;
}

Status ParamServer::Impl::RefreshClusterMap() {
  Message request;
  request.header().set_method(proto::GET_CLUSTER_MAP);
  request.header().mutable_get_cluster_map_request();
  CallOptions call;
  call.attempt_timeout = options_.rpc_timeout;
  call.max_attempts = 1;
  ASSIGN_OR_RETURN(Message reply, session_->Call(std::move(request), call));
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::FromProto(reply.header().get_cluster_map_reply().map()));
  std::vector<bool> owned(placement.num_partitions(), false);
  for (uint32_t p : placement.PartitionsOf(id_)) owned[p] = true;
  const size_t count = placement.PartitionsOf(id_).size();
  absl::MutexLock lock(&mu_);
  LOG(INFO) << "cluster map v" << placement.version() << ": " << count << " of "
            << placement.num_partitions() << " partitions are here";
  placement_ = std::make_shared<const Placement>(std::move(placement));
  owned_ = std::move(owned);
  return absl::OkStatus();
}

proto::ServerStats ParamServer::Impl::Stats() const {
  proto::ServerStats stats;
  const StorageStats storage = storage_->stats();
  stats.set_rows(storage.rows_in_memory);
  stats.set_bytes(storage.memory_bytes);
  stats.set_rows_on_disk(storage.rows_on_disk);
  stats.set_disk_bytes(storage.disk_bytes);
  stats.set_store_memory_bytes(storage.store_memory_bytes);
  stats.set_hits(storage.hits);
  stats.set_misses(storage.misses);
  stats.set_evictions(storage.evictions);
  stats.set_last_flush_ms(storage.last_flush_ms);
  stats.set_memory_budget_bytes(options_.storage.memory_budget_mb << 20);
  stats.set_pulls(pulls_.load());
  stats.set_pushes(pushes_.load());
  stats.set_pushes_fenced(pushes_fenced_.load());
  stats.set_pushes_deduplicated(pushes_deduplicated_.load());
  stats.set_updates_refused(storage.updates_refused);
  stats.set_rows_admitted(storage.rows_admitted);
  stats.set_updates_rejected(storage.updates_rejected);
  stats.set_admission_candidates(storage.admission_candidates);
  stats.set_rows_expired(storage.rows_expired);
  if (rpc_ != nullptr) {
    stats.set_requests_refused(rpc_->refused());
    stats.set_requests_unauthenticated(rpc_->unauthenticated() + factory_.handshakes_refused());
    stats.set_requests_limited(rpc_->limited() + rows_limited_.load());
  }
  HistogramToProto(pull_latency_.Snapshot(), stats.mutable_pull_latency());
  HistogramToProto(push_latency_.Snapshot(), stats.mutable_push_latency());
  HistogramToProto(dense_staleness_.Snapshot(), stats.mutable_dense_staleness());
  return stats;
}

void ParamServer::Impl::OnHeartbeatReply(const proto::HeartbeatReply& body) {
  if (body.shutdown()) {
    LOG(INFO) << "the master says the job is "
              << (body.state() == proto::JOB_FINISHED ? "finished" : "over") << "; exiting";
    return;
  }
  if (body.has_training_passes_done()) storage_->NotePassesDone(body.training_passes_done());
  const absl::Time now = absl::Now();
  if (now - last_progress_ < options_.progress_interval) return;
  const double seconds = absl::ToDoubleSeconds(now - last_progress_);
  const uint64_t pulled = rows_pulled_.load();
  const uint64_t pushed = rows_pushed_.load();
  const proto::ServerStats stats = Stats();
  LOG(INFO) << stats.rows() << " rows (" << stats.bytes() / (1 << 20) << " MiB), "
            << absl::StrFormat("%.0f", (pulled - rows_pulled_before_) / seconds)
            << " rows pulled/s, "
            << absl::StrFormat("%.0f", (pushed - rows_pushed_before_) / seconds)
            << " rows pushed/s; " << JobProgress(body);
  rows_pulled_before_ = pulled;
  rows_pushed_before_ = pushed;
  last_progress_ = now;
}

void ParamServer::Impl::Stop(const Status& result) {
  absl::MutexLock lock(&mu_);
  if (stop_reason_.ok()) stop_reason_ = result;
  stop_ = true;
}

Status ParamServer::Impl::Handle(Message& request, Message* reply) {
  const proto::Method method = request.header().method();
  // Refusals too (fenced, not ready): the worker waited for them as well.
  const ScopedLatency timer(method == proto::PULL   ? &pull_latency_
                            : method == proto::PUSH ? &push_latency_
                                                    : nullptr);
  // Need no map: served from the first moment (RESTORE once the tables are
  // made).
  if (method == proto::FENCE_WORKERS) return HandleFenceWorkers(request, reply);
  if (method == proto::RESTORE) return HandleRestore(request, reply);
  if (method == proto::EXPORT) return HandleExport(request, reply);
  if (method != proto::PULL && method != proto::PUSH && method != proto::CHECKPOINT) {
    return absl::UnimplementedError(
        absl::StrCat("a parameter server does not serve ", proto::Method_Name(method)));
  }
  // A fenced worker learns that first: nothing else it could fix matters.
  RETURN_IF_ERROR(CheckNotFenced(request.header().sender(), method));
  {
    // Requests can arrive as soon as the port is bound, while Start still
    // fills in id_ and tables_. Only the heartbeat thread, started after
    // that, installs the map; so with a map both are complete and visible.
    absl::MutexLock lock(&mu_);
    if (placement_ == nullptr) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet",
                             proto::NOT_READY);
    }
  }
  absl::ReaderMutexLock restore_lock(&restore_mu_);
  switch (method) {
    case proto::PULL: return HandlePull(request, reply);
    case proto::PUSH: return HandlePush(request, reply);
    default: return HandleCheckpoint(request, reply);
  }
}

bool ParamServer::Impl::IsFenced(const proto::NodeId& sender) const {
  return sender.role() == proto::ROLE_WORKER && fenced_.contains(sender.id());
}

Status ParamServer::Impl::CheckNotFenced(const proto::NodeId& sender, proto::Method method) {
  absl::ReaderMutexLock lock(&fence_mu_);
  if (!IsFenced(sender)) return absl::OkStatus();
  if (method == proto::PUSH) pushes_fenced_.fetch_add(1, std::memory_order_relaxed);
  return FencedError(sender.id());
}

Status ParamServer::Impl::HandleFenceWorkers(const Message& request, Message* reply) {
  if (!request.header().has_fence_workers_request()) {
    return absl::InvalidArgumentError("FENCE_WORKERS without its body");
  }
  const proto::FenceWorkersRequest& body = request.header().fence_workers_request();
  std::vector<uint32_t> added;
  size_t fenced = 0;
  {
    absl::MutexLock lock(&fence_mu_);
    for (uint32_t worker : body.worker_ids()) {
      if (fenced_.insert(worker).second) {
        // Under fence_mu_: no push of this worker is between its fence
        // check and its record in dedup_ now, and none will be again.
        dedup_->Forget(worker);
        added.push_back(worker);
      }
    }
    fenced = fenced_.size();
  }
  {
    absl::MutexLock lock(&receipts_mu_);
    for (uint32_t worker : added) last_receipts_.erase(worker);
  }
  if (!added.empty()) {
    LOG(INFO) << "fenced worker(s) " << absl::StrJoin(added, ", ") << " (membership epoch "
              << body.membership_epoch() << "); " << fenced << " fenced in all";
  }
  reply->header().mutable_fence_workers_reply()->set_fenced(fenced);
  return absl::OkStatus();
}

StatusOr<Table*> ParamServer::Impl::FindTable(uint32_t table_id) {
  Table* table = storage_->table(table_id);
  if (table == nullptr) {
    RETURN_IF_ERROR(storage_->status());
    return absl::InvalidArgumentError(
        absl::StrCat("unknown table ", table_id, " (the job has ", storage_->num_tables(), ")"));
  }
  return table;
}

Status ParamServer::Impl::CheckKeys(const Table& table, std::span<const uint64_t> keys) {
  if (keys.size() > kMaxKeysPerTable) {
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys in one request; at most ",
                                                   kMaxKeysPerTable));
  }
  const proto::TableSpec& spec = table.spec();
  if (spec.kind() == proto::DENSE) {
    const uint64_t chunks = DenseChunkCount(spec.dense_size(), spec.dim());
    for (uint64_t key : keys) {
      const DenseChunkId id = DecodeDenseChunkKey(key);
      if (id.table_id != spec.id() || id.chunk >= chunks) {
        return absl::InvalidArgumentError(
            absl::StrCat("key ", key, " is not a chunk of dense tensor '", spec.name(), "'"));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  if (placement_ == nullptr) {
    return ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet",
                           proto::NOT_READY);
  }
  const uint32_t partitions = placement_->num_partitions();
  for (uint64_t key : keys) {
    if (!owned_[PartitionOf(key, partitions)]) {
      return ErrorWithReason(
          absl::StatusCode::kFailedPrecondition,
          absl::StrCat("key ", key, " of partition ", PartitionOf(key, partitions),
                       " is not on ps[", id_, "] (cluster map v", placement_->version(), ")"),
          proto::WRONG_OWNER);
    }
  }
  return absl::OkStatus();
}

Status ParamServer::Impl::AdmitRows(const proto::NodeId& sender) {
  if (sender.role() != proto::ROLE_WORKER) return absl::OkStatus();
  Status admitted = row_quota_.Admit(sender.id());
  if (!admitted.ok()) rows_limited_.fetch_add(1, std::memory_order_relaxed);
  return admitted;
}

void ParamServer::Impl::ChargeRows(const proto::NodeId& sender, uint64_t created) {
  if (sender.role() == proto::ROLE_WORKER) row_quota_.Charge(sender.id(), created);
}

Status ParamServer::Impl::HandlePull(const Message& request, Message* reply) {
  if (!request.header().has_pull_request()) {
    return absl::InvalidArgumentError("PULL without its body");
  }
  const auto& table_ids = request.header().pull_request().table_ids();
  if (static_cast<size_t>(table_ids.size()) != request.num_frames() || table_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("PULL names ", table_ids.size(),
                                                   " tables but carries ", request.num_frames(),
                                                   " key frames"));
  }
  // Validate everything before touching any table.
  std::vector<Table*> tables;
  std::vector<std::span<const uint64_t>> keys;
  for (int i = 0; i < table_ids.size(); ++i) {
    ASSIGN_OR_RETURN(Table * table, FindTable(table_ids[i]));
    ASSIGN_OR_RETURN(std::span<const uint64_t> table_keys, request.Array<uint64_t>(i));
    RETURN_IF_ERROR(CheckKeys(*table, table_keys));
    tables.push_back(table);
    keys.push_back(table_keys);
  }
  const proto::NodeId& sender = request.header().sender();
  RETURN_IF_ERROR(AdmitRows(sender));
  uint64_t rows = 0;
  uint64_t created = 0;
  Status pulled;
  proto::PullReply* answer = reply->header().mutable_pull_reply();
  for (size_t i = 0; i < tables.size() && pulled.ok(); ++i) {
    // Read before the rows: they hold at least this many pushes.
    answer->add_versions(DenseVersion(*tables[i]).load(std::memory_order_acquire));
    std::span<float> out = reply->AddUninitializedArray<float>(keys[i].size() * tables[i]->dim());
    uint64_t table_created = 0;
    pulled = tables[i]->Pull(keys[i], out, &table_created);
    created += table_created;
    rows += keys[i].size();
  }
  ChargeRows(sender, created);
  RETURN_IF_ERROR(pulled);
  pulls_.fetch_add(1, std::memory_order_relaxed);
  rows_pulled_.fetch_add(rows, std::memory_order_relaxed);
  return absl::OkStatus();
}

Status ParamServer::Impl::HandlePush(const Message& request, Message* reply) {
  if (!request.header().has_push_request()) {
    return absl::InvalidArgumentError("PUSH without its body");
  }
  const auto& table_ids = request.header().push_request().table_ids();
  if (static_cast<size_t>(table_ids.size()) * 2 != request.num_frames() || table_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("PUSH names ", table_ids.size(),
                                                   " tables but carries ", request.num_frames(),
                                                   " frames (want keys and gradients each)"));
  }
  // Unset is 1; a scale a worker computed is in (0, 2^20] (linear scaling
  // of a batch of 2^20 against a reference of 1).
  const float lr_scale = request.header().push_request().lr_scale() == 0.0f
                             ? 1.0f
                             : request.header().push_request().lr_scale();
  if (!(lr_scale > 0.0f && lr_scale <= static_cast<float>(1 << 20))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PUSH with learning-rate scale ", lr_scale, ": it must be finite and in (0, 2^20]"));
  }
  std::vector<Table*> tables;
  std::vector<std::span<const uint64_t>> keys;
  std::vector<std::span<const float>> grads;
  for (int i = 0; i < table_ids.size(); ++i) {
    ASSIGN_OR_RETURN(Table * table, FindTable(table_ids[i]));
    ASSIGN_OR_RETURN(std::span<const uint64_t> table_keys, request.Array<uint64_t>(2 * i));
    ASSIGN_OR_RETURN(std::span<const float> table_grads, request.Array<float>(2 * i + 1));
    if (table_grads.size() != table_keys.size() * table->dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PUSH to table '", table->spec().name(), "': ", table_keys.size(), " keys x dim ",
          table->dim(), " need ", table_keys.size() * table->dim(), " gradient values, got ",
          table_grads.size()));
    }
    for (float g : table_grads) {
      if (!std::isfinite(g)) {
        return absl::InvalidArgumentError(
            absl::StrCat("PUSH to table '", table->spec().name(), "' carries a non-finite gradient"));
      }
    }
    RETURN_IF_ERROR(CheckKeys(*table, table_keys));
    tables.push_back(table);
    keys.push_back(table_keys);
    grads.push_back(table_grads);
  }
  // Valid: now the worker's quota of new rows, the fence (again, it may
  // have arrived meanwhile) and whether this is a retry of a push already
  // applied.
  const proto::NodeId& sender = request.header().sender();
  RETURN_IF_ERROR(AdmitRows(sender));
  bool first_time = true;
  {
    absl::ReaderMutexLock lock(&fence_mu_);
    if (IsFenced(sender)) {
      pushes_fenced_.fetch_add(1, std::memory_order_relaxed);
      return FencedError(sender.id());
    }
    // Sequence numbers are per worker; other senders have no id space of
    // their own to key them by.
    if (sender.role() == proto::ROLE_WORKER) {
      first_time = dedup_->FirstTime(sender.id(), request.header().push_request().client_seq());
    }
  }
  proto::PushReply* answer = reply->header().mutable_push_reply();
  const proto::PushRequest& push = request.header().push_request();
  // Receipts exist under CURVE only (no key otherwise): no lock on the way.
  // A receipt says the push was applied: given once it was (below), and
  // to a repeat of the push that was.
  const bool receipted =
      options_.security.curve && push.has_batch() && sender.role() == proto::ROLE_WORKER;
  if (!first_time) {
    if (receipted) {
      answer->set_receipt(ReceiptFor(sender.id(), push.client_seq(), push.batch(), false));
    }
    VLOG(2) << "push " << request.header().push_request().client_seq() << " of worker "
            << sender.id() << " repeats one already applied";
    answer->set_applied(false);
    for (Table* table : tables) answer->add_versions(DenseVersion(*table).load());
    pushes_deduplicated_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  uint64_t rows = 0;
  uint64_t created = 0;
  Status pushed;
  for (size_t i = 0; i < tables.size() && pushed.ok(); ++i) {
    uint64_t table_created = 0;
    pushed = tables[i]->Push(keys[i], grads[i], lr_scale, &table_created,
                             request.header().push_request().pass());
    created += table_created;
    rows += keys[i].size();
  }
  ChargeRows(sender, created);
  RETURN_IF_ERROR(pushed);
  const auto& based_on = request.header().push_request().based_on();
  const bool measured = based_on.size() == table_ids.size();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables[i]->spec().kind() != proto::DENSE) {
      answer->add_versions(0);
      continue;
    }
    // Released after the rows: a pull that reads this version sees them.
    const uint64_t before = DenseVersion(*tables[i]).fetch_add(1, std::memory_order_release);
    answer->add_versions(before + 1);
    // A version from before a restore of this server may be ahead of it.
    if (!measured || based_on[static_cast<int>(i)] == 0) continue;  // not known
    const uint64_t from = based_on[static_cast<int>(i)] - 1;
    if (from <= before) dense_staleness_.Observe(before - from);
  }
  if (receipted) {
    answer->set_receipt(ReceiptFor(sender.id(), push.client_seq(), push.batch(), true));
  }
  answer->set_applied(true);
  pushes_.fetch_add(1, std::memory_order_relaxed);
  rows_pushed_.fetch_add(rows, std::memory_order_relaxed);
  return absl::OkStatus();
}

ParamServer::ParamServer(const ParamServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
ParamServer::~ParamServer() = default;
Status ParamServer::Start() { return impl_->Start(); }
Status ParamServer::Wait() { return impl_->Wait(); }
void ParamServer::RequestStop() { impl_->RequestStop(); }
const std::string& ParamServer::endpoint() const { return impl_->endpoint(); }
uint32_t ParamServer::id() const { return impl_->id(); }

}  // namespace eps
