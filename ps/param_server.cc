#include "ps/param_server.h"
#include "ps/param_server_impl.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cluster/call_table.h"
#include "cluster/job_options.h"
#include "cluster/placement.h"
#include "core/clock.h"
#include "core/logging.h"
#include "core/metrics.h"
#include "core/status.h"
#include "ps/row_quota.h"
#include "ps/storage.h"
#include "ps/table.h"
#include "rpc/bfloat16.h"
#include "rpc/message.h"
#include "rpc/net.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"

namespace eps {

ParamServerOptions ParamServerOptions::FromConfig(const JobConfig& config) {
  ParamServerOptions options;
  options.threads = static_cast<int>(config.ps.threads);
  options.heartbeat = absl::Milliseconds(config.master.heartbeat_ms);
  options.master_wait = absl::Seconds(config.ps.master_wait_s);
  options.leave_timeout = absl::Seconds(config.ps.leave_timeout_s);
  options.rpc_timeout = absl::Milliseconds(config.ps.rpc_timeout_ms);
  options.progress_interval = absl::Seconds(config.job.progress_interval_s);
  options.storage.memory_budget_mb = config.ps.memory_budget_mb;
  options.storage.admission_memory_mb = config.ps.admission_memory_mb;
  options.max_new_rows_per_worker_s = static_cast<uint64_t>(config.ps.max_new_rows_per_worker_s);
  options.max_new_rows_s = static_cast<uint64_t>(config.ps.max_new_rows_s);
  options.storage.flush_interval = absl::Milliseconds(config.ps.flush_interval_ms);
  options.storage.journal_mb = config.ps.journal_mb;
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

  {
    std::unique_ptr<MemberSession> session = NewSession();
    absl::MutexLock lock(&mu_);
    session_ = std::move(session);
  }
  StatusOr<Message> reply = session_->Register(RegisterRequest(/*rejoin=*/false));
  if (!reply.ok()) {
    return options_.storage.data_dir.empty()
               ? reply.status()
               : Annotate(reply.status(), absl::StrCat("--data-dir ", options_.storage.data_dir));
  }
  id_ = reply->header().register_server_reply().server_id();
  credential_ = reply->header().register_server_reply().slot_credential();
  job_ = reply->header().register_server_reply().job();
  dense_versions_ = std::vector<std::atomic<uint64_t>>(static_cast<size_t>(job_.tables_size()));
  global_batches_.resize(static_cast<size_t>(job_.tables_size()));
  for (const proto::TableSpec& table : job_.tables()) {
    if (table.kind() != proto::DENSE || table.global_batch() == 0 ||
        table.id() >= global_batches_.size()) {
      continue;
    }
    global_batches_[table.id()] = std::make_unique<DenseBatch>(
        GlobalBatch::Options{.records = table.global_batch(), .dim = table.dim()});
  }
  RETURN_IF_ERROR(CheckWorkerCredentials(reply->header().register_server_reply()));
  SetLogNode(absl::StrCat("ps[", id_, "]"));
  // The job comes from a peer: a bad one is refused, not a crash.
  RETURN_IF_ERROR_CTX(storage_->CreateTables(job_), "the master's job");
  // Recorded once the dir is known to be this job's: whatever slot the
  // master gave (a fresh dir may take a dead server's), it is ours now.
  RETURN_IF_ERROR(storage_->SetServerId(id_, credential_));
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
  if (method == proto::MOVE_PARTITION) return HandleMovePartition(request, reply);
  if (method == proto::FETCH_PARTITION) return HandleFetchPartition(request, reply);
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
    absl::ReaderMutexLock lock(&mu_);
    if (placement_ == nullptr) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet",
                             proto::NOT_READY);
    }
    // The caller has a newer map (a partition moved here): the heartbeat
    // that fetches it goes out now, not a heartbeat interval later.
    if (request.header().cluster_map_version() > placement_->version() && session_ != nullptr) {
      session_->HeartbeatNow();
    }
  }
  absl::ReaderMutexLock restore_lock(&restore_mu_);
  switch (method) {
    case proto::PULL: return HandlePull(request, reply);
    case proto::PUSH: return HandlePush(request, reply);
    default: return HandleCheckpoint(request, reply);
  }
}

Status ParamServer::Impl::CheckNotFenced(const proto::NodeId& sender, proto::Method method) {
  Status fenced = gate_.CheckNotFenced(sender);
  if (!fenced.ok() && method == proto::PUSH) {
    pushes_fenced_.fetch_add(1, std::memory_order_relaxed);
  }
  return fenced;
}

Status ParamServer::Impl::HandleFenceWorkers(const Message& request, Message* reply) {
  if (!request.header().has_fence_workers_request()) {
    return absl::InvalidArgumentError("FENCE_WORKERS without its body");
  }
  const proto::FenceWorkersRequest& body = request.header().fence_workers_request();
  const WorkerGate::Fenced fenced =
      gate_.Fence(std::span(body.worker_ids().data(), body.worker_ids().size()));
  if (!fenced.added.empty()) {
    LOG(INFO) << "fenced worker(s) " << absl::StrJoin(fenced.added, ", ") << " (membership epoch "
              << body.membership_epoch() << "); " << fenced.total << " fenced in all";
  }
  reply->header().mutable_fence_workers_reply()->set_fenced(fenced.total);
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

Status ParamServer::Impl::CheckKeys(const Table& table, std::span<const uint64_t> keys,
                                    bool ownership) {
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
  if (!ownership) return absl::OkStatus();
  // Shared: request threads check keys side by side; only a new map writes.
  absl::ReaderMutexLock lock(&mu_);
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
  const proto::PullRequest& pull = request.header().pull_request();
  bool reserved = false;
  if (pull.reserve()) {
    ASSIGN_OR_RETURN(reserved, ReserveGlobalBatches(sender, tables, pull.holds_reservations()));
  }
  uint64_t rows = 0;
  uint64_t created = 0;
  Status pulled;
  proto::PullReply* answer = reply->header().mutable_pull_reply();
  if (reserved) answer->set_reserved(true);
  const bool dense_bf16 = request.header().pull_request().dense_bf16();
  for (size_t i = 0; i < tables.size() && pulled.ok(); ++i) {
    // Read before the rows: they hold at least this many pushes.
    answer->add_versions(DenseVersion(*tables[i]).load(std::memory_order_acquire));
    uint64_t table_created = 0;
    pulled = AddRows(*tables[i], keys[i], dense_bf16, reply, &table_created);
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
  const proto::PushRequest& push = request.header().push_request();
  const proto::NodeId& sender = request.header().sender();
  // A repeat of a push this server applied whose keys it no longer owns
  // (their partition moved since): answered as applied, not WRONG_OWNER. A
  // worker sends a push elsewhere only when it was not applied, so none is
  // applied twice (docs/design.md 2.20).
  bool moved_repeat = false;
  std::vector<Table*> tables;
  std::vector<std::span<const uint64_t>> keys;
  std::vector<std::span<const float>> grads;
  // Gradients that came as bfloat16, widened (PushRequest.dense_bf16).
  std::vector<std::unique_ptr<float[]>> widened;
  for (int i = 0; i < table_ids.size(); ++i) {
    ASSIGN_OR_RETURN(Table * table, FindTable(table_ids[i]));
    ASSIGN_OR_RETURN(std::span<const uint64_t> table_keys, request.Array<uint64_t>(2 * i));
    const size_t want = table_keys.size() * table->dim();
    const bool bf16 = push.dense_bf16() && table->spec().kind() == proto::DENSE;
    std::span<const uint16_t> narrow;
    std::span<const float> table_grads;
    if (bf16) {
      ASSIGN_OR_RETURN(narrow, request.Array<uint16_t>(2 * i + 1));
    } else {
      ASSIGN_OR_RETURN(table_grads, request.Array<float>(2 * i + 1));
    }
    if (const size_t got = bf16 ? narrow.size() : table_grads.size(); got != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PUSH to table '", table->spec().name(), "': ", table_keys.size(), " keys x dim ",
          table->dim(), " need ", want, " gradient values, got ", got));
    }
    if (bf16) {
      float* wide = widened.emplace_back(std::make_unique_for_overwrite<float[]>(want)).get();
      FromBfloat16(narrow, std::span<float>(wide, want));
      table_grads = std::span<const float>(wide, want);
    }
    for (float g : table_grads) {
      if (!std::isfinite(g)) {
        return absl::InvalidArgumentError(
            absl::StrCat("PUSH to table '", table->spec().name(), "' carries a non-finite gradient"));
      }
    }
    Status checked = CheckKeys(*table, table_keys, /*ownership=*/!moved_repeat);
    if (ReasonOf(checked) == proto::WRONG_OWNER &&
        gate_.PeekPush(sender, push.client_seq()) == WorkerGate::Push::kRepeat) {
      moved_repeat = true;
      checked = absl::OkStatus();
    }
    RETURN_IF_ERROR(checked);
    if (push.records() == 0 && GlobalBatchOf(*table) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PUSH to table '", table->spec().name(),
          "' names no records: its steps count them (a global batch of ",
          table->spec().global_batch(), "); is the worker the same eps build?"));
    }
    tables.push_back(table);
    keys.push_back(table_keys);
    grads.push_back(table_grads);
  }
  // Valid: now the worker's quota of new rows, the fence (again, it may
  // have arrived meanwhile) and whether this is a retry of a push already
  // applied.
  WorkerGate::Push admitted = WorkerGate::Push::kRepeat;
  if (!moved_repeat) {
    RETURN_IF_ERROR(AdmitRows(sender));
    admitted = gate_.AdmitPush(sender, push.client_seq());
  }
  if (admitted == WorkerGate::Push::kFenced) {
    pushes_fenced_.fetch_add(1, std::memory_order_relaxed);
    return WorkerGate::FencedError(sender.id());
  }
  const bool first_time = admitted == WorkerGate::Push::kFirstTime;
  proto::PushReply* answer = reply->header().mutable_push_reply();
  // Receipts exist under CURVE only (no key otherwise): no lock on the way.
  // A receipt says the push was applied: given once it was (below), and
  // to a repeat of the push that was.
  const bool receipted =
      options_.security.curve && push.has_batch() && sender.role() == proto::ROLE_WORKER;
  if (!first_time) {
    if (receipted) {
      answer->set_receipt(gate_.ReceiptFor(sender.id(), push.client_seq(), push.batch(), false));
    }
    VLOG(2) << "push " << request.header().push_request().client_seq() << " of worker "
            << sender.id() << " repeats one already applied";
    answer->set_applied(false);
    for (Table* table : tables) answer->add_versions(DenseVersion(*table).load());
    pushes_deduplicated_.fetch_add(1, std::memory_order_relaxed);
    // Rows only of keys still here (a worker pulls what a reply lacks).
    return push.reply_rows() && !moved_repeat
               ? ReplyRows(tables, keys, push.dense_bf16(), reply)
               : absl::OkStatus();
  }
  NoteMovingKeys(tables, keys);
  uint64_t rows = 0;
  uint64_t created = 0;
  Status pushed;
  const auto& based_on = request.header().push_request().based_on();
  const bool measured = based_on.size() == table_ids.size();
  // 1 + the version table i's gradients were computed on; 0: not known.
  const auto based_on_of = [&](size_t i) -> uint64_t {
    return measured ? based_on[static_cast<int>(i)] : 0;
  };
  for (size_t i = 0; i < tables.size() && pushed.ok(); ++i) {
    uint64_t table_created = 0;
    if (DenseBatch* batch = GlobalBatchOf(*tables[i]); batch != nullptr) {
      pushed = AddToGlobalBatch(*tables[i], *batch, keys[i], grads[i], push.records(),
                                based_on_of(i),
                                sender.role() == proto::ROLE_WORKER
                                    ? std::optional<uint64_t>(sender.id())
                                    : std::nullopt);
    } else {
      pushed = tables[i]->Push(keys[i], grads[i], lr_scale, &table_created,
                               request.header().push_request().pass());
    }
    created += table_created;
    rows += keys[i].size();
  }
  ChargeRows(sender, created);
  RETURN_IF_ERROR(pushed);
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables[i]->spec().kind() != proto::DENSE) {
      answer->add_versions(0);
      continue;
    }
    uint64_t before = 0;
    if (GlobalBatchOf(*tables[i]) != nullptr) {
      // Its global steps: this push may have made one, or be in the next.
      before = DenseVersion(*tables[i]).load(std::memory_order_acquire);
      answer->add_versions(before);
    } else {
      // Released after the rows: a pull that reads this version sees them.
      before = DenseVersion(*tables[i]).fetch_add(1, std::memory_order_release);
      answer->add_versions(before + 1);
    }
    // A version from before a restore of this server may be ahead of it.
    if (!measured || based_on[static_cast<int>(i)] == 0) continue;  // not known
    const uint64_t from = based_on[static_cast<int>(i)] - 1;
    if (from <= before) dense_staleness_.Observe(before - from);
  }
  if (receipted) {
    answer->set_receipt(gate_.ReceiptFor(sender.id(), push.client_seq(), push.batch(), true));
  }
  answer->set_applied(true);
  pushes_.fetch_add(1, std::memory_order_relaxed);
  rows_pushed_.fetch_add(rows, std::memory_order_relaxed);
  if (!push.reply_rows()) return absl::OkStatus();
  // The rows read back are a read of the version being filled: a full
  // global batch holds them back, and the worker's pull waits for the next.
  StatusOr<bool> reserved = ReserveGlobalBatches(sender, tables, /*holds_elsewhere=*/false);
  if (!reserved.ok()) {
    if (ReasonOf(reserved.status()) != proto::BATCH_FULL) return reserved.status();
    answer->set_rows_withheld(true);
    return absl::OkStatus();
  }
  if (*reserved) {
    // A step may have gone since the versions above were read (another
    // push, or a reservation that expired): the rows are of the version
    // reserved, which no step passes while this worker holds it.
    for (size_t i = 0; i < tables.size(); ++i) {
      if (GlobalBatchOf(*tables[i]) != nullptr) {
        answer->set_versions(static_cast<int>(i),
                             DenseVersion(*tables[i]).load(std::memory_order_acquire));
      }
    }
  }
  return ReplyRows(tables, keys, push.dense_bf16(), reply);
}

namespace {

// Reservations' time: steady, in ms.
int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status ParamServer::Impl::AddToGlobalBatch(Table& table, DenseBatch& batch,
                                           std::span<const uint64_t> keys,
                                           std::span<const float> grads, uint32_t records,
                                           uint64_t based_on,
                                           std::optional<uint64_t> worker) {
  absl::MutexLock lock(&batch.mu);
  // Not known (0): taken as computed on the version being filled.
  const uint64_t from = based_on == 0 ? batch.batch.version() : based_on - 1;
  const int64_t now_ms = SteadyMs();
  ASSIGN_OR_RETURN(GlobalBatch::Outcome outcome,
                   batch.batch.Add({.keys = keys,
                                    .grads = grads,
                                    .records = records,
                                    .based_on = from,
                                    .worker = worker,
                                    .at_ms = now_ms}));
  if (outcome == GlobalBatch::Outcome::kDropped) {
    VLOG(1) << "table '" << table.spec().name() << "': a push of " << records
            << " records computed on version " << from << " is dropped at version "
            << batch.batch.version();
  }
  if (!batch.batch.ready(now_ms)) return absl::OkStatus();
  return ApplyGlobalStep(table, batch);
}

StatusOr<bool> ParamServer::Impl::ReserveGlobalBatches(const proto::NodeId& sender,
                                                       std::span<Table* const> tables,
                                                       bool holds_elsewhere) {
  if (sender.role() != proto::ROLE_WORKER) return false;
  // Locked in table order (the only place holding two), so that a read is
  // granted by all of this request's batches or none.
  std::vector<std::pair<uint32_t, Table*>> batched;
  for (Table* table : tables) {
    if (GlobalBatchOf(*table) != nullptr) batched.emplace_back(table->spec().id(), table);
  }
  if (batched.empty()) return false;
  std::sort(batched.begin(), batched.end());
  batched.erase(std::unique(batched.begin(), batched.end()), batched.end());
  std::deque<absl::MutexLock> locks;  // MutexLock does not move
  for (const auto& [id, table] : batched) locks.emplace_back(&GlobalBatchOf(*table)->mu);
  const int64_t now_ms = SteadyMs();
  const Table* full = nullptr;
  for (const auto& [id, table] : batched) {
    DenseBatch& batch = *GlobalBatchOf(*table);
    // A reservation that expired may have let the step go.
    if (batch.batch.ready(now_ms)) RETURN_IF_ERROR(ApplyGlobalStep(*table, batch));
    if (!batch.batch.MayRead(sender.id(), now_ms, holds_elsewhere) && full == nullptr) {
      full = table;
    }
  }
  if (full != nullptr) {
    const GlobalBatch& batch = GlobalBatchOf(*full)->batch;
    return ErrorWithReason(
        absl::StatusCode::kUnavailable,
        absl::StrCat("dense tensor '", full->spec().name(), "': its global batch at version ",
                     batch.version(), " is full (", batch.records_in_hand(), " of ",
                     full->spec().global_batch(), " records in, ", batch.holders(),
                     " workers computing on it); pull again once it steps"),
        proto::BATCH_FULL);
  }
  for (const auto& [id, table] : batched) GlobalBatchOf(*table)->batch.Hold(sender.id(), now_ms);
  return true;
}

Status ParamServer::Impl::ApplyGlobalStep(Table& table, DenseBatch& batch) {
  GlobalBatch::Step step = batch.batch.Take();
  Table* one[] = {&table};
  const std::span<const uint64_t> keys[] = {step.keys};
  NoteMovingKeys(one, keys);
  // The global batch is the learning rate's reference: no scaling.
  RETURN_IF_ERROR(table.Push(step.keys, step.grads, /*lr_scale=*/1.0f, /*created=*/nullptr,
                             /*pass=*/0));
  // Released after the rows: a pull that reads this version sees them.
  DenseVersion(table).store(step.version, std::memory_order_release);
  return absl::OkStatus();
}

Status ParamServer::Impl::FlushGlobalBatches() {
  for (size_t id = 0; id < global_batches_.size(); ++id) {
    DenseBatch* batch = global_batches_[id].get();
    if (batch == nullptr) continue;
    absl::MutexLock lock(&batch->mu);
    // The workers are paused (a checkpoint) or the rows leave (a hand-off):
    // they read again.
    batch->batch.DropReservations();
    if (batch->batch.records_in_hand() == 0) continue;
    ASSIGN_OR_RETURN(Table * table, FindTable(static_cast<uint32_t>(id)));
    RETURN_IF_ERROR(ApplyGlobalStep(*table, *batch));
  }
  return absl::OkStatus();
}

void ParamServer::Impl::ResetGlobalBatches() {
  for (std::unique_ptr<DenseBatch>& batch : global_batches_) {
    if (batch == nullptr) continue;
    absl::MutexLock lock(&batch->mu);
    batch->batch.Reset();
  }
}

Status ParamServer::Impl::ReplyRows(std::span<Table* const> tables,
                                    std::span<const std::span<const uint64_t>> keys,
                                    bool dense_bf16, Message* reply) {
  // Read after the versions the reply carries were raised: the rows hold
  // at least that many pushes. Rows made again here (expired since a
  // repeated push) are not the worker's to be charged for.
  for (size_t i = 0; i < tables.size(); ++i) {
    RETURN_IF_ERROR(AddRows(*tables[i], keys[i], dense_bf16, reply, /*created=*/nullptr));
  }
  return absl::OkStatus();
}

Status ParamServer::Impl::AddRows(Table& table, std::span<const uint64_t> keys, bool dense_bf16,
                                  Message* reply, uint64_t* created) {
  const size_t values = keys.size() * table.dim();
  if (!dense_bf16 || table.spec().kind() != proto::DENSE) {
    return table.Pull(keys, reply->AddUninitializedArray<float>(values), created);
  }
  const std::unique_ptr<float[]> rows = std::make_unique_for_overwrite<float[]>(values);
  RETURN_IF_ERROR(table.Pull(keys, std::span<float>(rows.get(), values), created));
  ToBfloat16(std::span<const float>(rows.get(), values),
             reply->AddUninitializedArray<uint16_t>(values));
  return absl::OkStatus();
}

ParamServer::ParamServer(const ParamServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
ParamServer::~ParamServer() = default;
Status ParamServer::Start() { return impl_->Start(); }
Status ParamServer::Wait() { return impl_->Wait(); }
void ParamServer::RequestStop() { impl_->RequestStop(); }
void ParamServer::RequestLeave() { impl_->RequestLeave(); }
const std::string& ParamServer::endpoint() const { return impl_->endpoint(); }
uint32_t ParamServer::id() const { return impl_->id(); }

}  // namespace eps
