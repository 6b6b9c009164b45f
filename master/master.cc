// The driver: the one mutex, the threads (RPC, HTTP, the job loop), RPC
// decode and encode, the fan-outs to the servers and persistence. What the
// job does is decided by JobControl (master/job_control.h), which holds the
// units and the rules between them; the driver calls it under mu_, does the
// I/O it asks for without mu_, and persists its changes before any reply
// that depends on them leaves.

#include "master/master.h"
#include "master/master_impl.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/call_table.h"
#include "core/clock.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/memory.h"
#include "master/autoscale/autoscaler.h"
#include "master/event_log.h"
#include "master/http/http_service.h"
#include "master/http/status_page.h"
#include "master/http/status_report.h"
#include "master/job_control.h"
#include "master/job_record.h"
#include "master/job_spec.h"
#include "master/model_export.h"
#include "master/progress/data_set.h"
#include "master/server_calls.h"
#include "master/state_store.h"
#include "nlohmann/json.hpp"
#include "rpc/message.h"
#include "rpc/net.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"

namespace eps {

using nlohmann::json;

Status MasterOptions::Validate() const {
  RETURN_IF_ERROR(job.Validate());
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port must be 0..65535 (got ", port, ")"));
  }
  if (http_port < 0 || http_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-port must be 0..65535 (got ", http_port, ")"));
  }
  if (data_dir.empty()) return absl::InvalidArgumentError("--data-dir must not be empty");
  return absl::OkStatus();
}

Status Master::Impl::Start() {
  RETURN_IF_ERROR(options_.Validate());
  const JobConfig& job = options_.job;
  // Refuses (kInvalidArgument) a spec any server would refuse.
  ASSIGN_OR_RETURN(proto::JobSpec spec, BuildJobSpec(job));
  // Fail fast on missing data; the (slow) scan runs in the background.
  ASSIGN_OR_RETURN(train_files_, ExpandDataPaths(job.data.train, "data.train"));
  if (!job.data.eval.empty()) {
    ASSIGN_OR_RETURN(eval_files_, ExpandDataPaths(job.data.eval, "data.eval"));
  }
  std::error_code error;
  std::filesystem::create_directories(options_.data_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("--data-dir: cannot create ", options_.data_dir, ": ", error.message()));
  }
  const std::filesystem::path dir(options_.data_dir);
  ASSIGN_OR_RETURN(store_, StateStore::Open((dir / "state").string()));
  events_ = std::make_unique<EventLog>((dir / "events.jsonl").string(), clock_);
  ASSIGN_OR_RETURN(std::optional<MasterSnapshot> snapshot, store_->Load());
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    control_ = std::make_unique<JobControl>(job, std::move(spec),
                                            JobFingerprint(job, train_files_, eval_files_),
                                            options_.data_dir, events_.get(), now);
    if (snapshot.has_value()) {
      RETURN_IF_ERROR(control_->Restore(*snapshot, options_.resume, now));
    } else if (options_.resume) {
      return absl::FailedPreconditionError(
          absl::StrCat("--resume: --data-dir ", options_.data_dir,
                       " holds no job to resume; start the job without --resume"));
    } else {
      std::random_device random;
      control_->StartNew(
          absl::StrFormat("%08x%08x%08x%08x", random(), random(), random(), random()));
    }
  }
  RETURN_IF_ERROR(StartServing());
  RETURN_IF_ERROR(StartAutoscaler());
  RETURN_IF_ERROR(StartServerScaler());
  job_thread_ = std::thread([this] { JobLoop(); });
  return absl::OkStatus();
}

json Master::Impl::Document() const {
  json doc = StatusDocument(*control_, clock_->Now());
  doc["autoscale"] =
      autoscaler_ != nullptr ? autoscaler_->StatusJson() : json{{"source", "none"}};
  if (server_scaler_ != nullptr) doc["autoscale"]["servers"] = server_scaler_->StatusJson();
  return doc;
}

Status Master::Impl::StartAutoscaler() {
  const JobConfig& job = options_.job;
  if (job.autoscale.source == "none") return absl::OkStatus();
  const std::filesystem::path dir(options_.data_dir);
  LauncherContext context{.worker_config = (dir / "worker.ini").string(),
                          .master_endpoint = rpc_endpoint_,
                          .log_dir = (dir / "workers").string()};
  ASSIGN_OR_RETURN(const std::string worker_ini, job.ToIni());
  RETURN_IF_ERROR(WriteFileAtomically(context.worker_config, worker_ini));
  ASSIGN_OR_RETURN(std::unique_ptr<SignalSource> source, MakeSignalSource(job));
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerLauncher> launcher, MakeLauncher(job, context));
  auto autoscaler = std::make_unique<Autoscaler>(
      job, std::move(source), std::move(launcher), [this] { return LaunchedWorkers(); },
      [this] {
        absl::MutexLock lock(&mu_);
        return !control_->over();
      },
      events_.get(), clock_);
  autoscaler->Start();
  // Under mu_: /status and /metrics may be asked for already.
  absl::MutexLock lock(&mu_);
  control_->ExpectWorkersFrom([autoscaler = autoscaler.get()] { return autoscaler->MayLaunch(); });
  autoscaler_ = std::move(autoscaler);
  return absl::OkStatus();
}

std::map<uint64_t, WorkerFleet::Seen> Master::Impl::LaunchedWorkers() const {
  absl::MutexLock lock(&mu_);
  const std::set<uint32_t> holders = control_->progress().HoldersOfShardsInProgress();
  std::map<uint64_t, WorkerFleet::Seen> seen;
  // By id: a launch's newest registration comes last and wins.
  for (const auto& [id, worker] : control_->membership().workers()) {
    if (worker.launch_id == 0) continue;
    WorkerFleet::Seen& view = seen[worker.launch_id];
    view.alive = worker.state == PeerState::kAlive;
    view.stalled = worker.fenced_alive;
    view.gone_since = worker.last_seen;
    view.holds_shard = holders.count(id) > 0;
    view.last_progress = worker.last_progress;
  }
  return seen;
}

Status Master::Impl::StartServing() {
  const JobConfig& job = options_.job;
  RpcServerOptions rpc_options;
  rpc_options.endpoint = absl::StrCat("tcp://", job.master.bind_host, ":", options_.port);
  // Two: an evaluation commit's check pulls from the servers (seconds at
  // worst) on the thread that took it, and heartbeats must not wait for it
  // (one check at a time: CheckEvaluation). Each request holds mu_ only
  // briefly, so two threads change nothing else.
  rpc_options.num_threads = 2;
  rpc_options.max_frames = 2;
  rpc_options.name = "master";
  rpc_options.track_waiting = true;  // leases are judged on arrivals
  // Registrations per connection, besides the job's rate (Membership::
  // TakeRegistration): one peer cannot spend the job's rate alone.
  rpc_options.rate_limited = proto::REGISTER_WORKER;
  rpc_options.rate_limited_burst = 4;
  rpc_options.rate_limited_per_s = 1;
  rpc_options.authorize = AuthorizeCall;
  ASSIGN_OR_RETURN(rpc_, RpcServer::Start(&factory_, rpc_options,
                                          [this](Message& request, Message* reply) {
                                            return Handle(request, reply);
                                          }));
  if (options_.security.curve) {
    ASSIGN_OR_RETURN(WorkerCredentials credentials, WorkerCredentials::ForMaster(options_.security));
    worker_credentials_ = credentials;
    rpc_->SetWorkerCredentials(std::move(credentials));
    {
      absl::MutexLock lock(&mu_);
      control_->CheckWorkWith(&*worker_credentials_);
      control_->admission() =
          ServerAdmission(&*worker_credentials_, options_.security.http_token);
    }
    if (!eval_files_.empty()) {
      ASSIGN_OR_RETURN(eval_check_,
                       EvalCheck::Create(job, static_cast<int>(job.master.eval_check_records),
                                         std::random_device()()));
    }
  }
  rpc_endpoint_ = rpc_->endpoint();
  // A wildcard bind is not an address peers can dial: advertise the host name.
  const std::string advertised_host =
      job.master.bind_host == "0.0.0.0" ? Hostname() : job.master.bind_host;
  if (job.master.bind_host == "0.0.0.0") {
    rpc_endpoint_ = absl::StrCat("tcp://", advertised_host, ":",
                                 rpc_endpoint_.substr(rpc_endpoint_.rfind(':') + 1));
  }
  HttpRoutes routes{
      .status_json = [this] { return StatusJson(); },
      .metrics_text =
          [this] {
            std::string text;
            const Autoscaler* autoscaler;
            const ServerScaler* server_scaler;
            uint64_t deregisters_refused = 0;
            uint64_t servers_refused = 0;
            {
              absl::MutexLock lock(&mu_);
              text = MetricsText(*control_);
              deregisters_refused = control_->deregisters_refused();
              servers_refused = control_->servers_refused();
              autoscaler = autoscaler_.get();  // set once, lives as long as the server
              server_scaler = server_scaler_.get();
            }
            PrometheusWriter autoscale;
            if (autoscaler != nullptr) autoscaler->WriteMetrics(autoscale);
            if (server_scaler != nullptr) server_scaler->WriteMetrics(autoscale);
            text += autoscale.text();
            PrometheusWriter refusals;
            refusals.Family("eps_master_requests_refused_total", MetricType::kCounter,
                            "Requests the master refused: for their sender's role (reason "
                            "permission_denied), for carrying no key the job trusts "
                            "(unauthenticated; refused CURVE handshakes included), for a "
                            "limit (limit: requests in flight, message size), a server's "
                            "DEREGISTER naming another slot or no endpoint (deregister), or a "
                            "server registration claiming a slot without its credential or "
                            "joining without a grant (server_admission).");
            refusals.Sample({{"reason", "permission_denied"}},
                            static_cast<double>(rpc_->refused()));
            refusals.Sample({{"reason", "unauthenticated"}},
                            static_cast<double>(rpc_->unauthenticated() +
                                                factory_.handshakes_refused()));
            refusals.Sample({{"reason", "limit"}}, static_cast<double>(rpc_->limited()));
            refusals.Sample({{"reason", "deregister"}}, static_cast<double>(deregisters_refused));
            refusals.Sample({{"reason", "server_admission"}},
                            static_cast<double>(servers_refused));
            http_.WriteMetrics(refusals);
            return text + refusals.text();
          },
      .page = StatusPage(job.job.name),
      .checkpoint = [this] { return PostCheckpoint(); },
      .export_model = [this](const std::string& dir) { return PostExport(dir); },
      .drain = [this](uint32_t server) { return PostDrain(server); },
      .bearer_token = options_.security.http_token,
  };
  if (options_.security.http_token.empty()) {
    LOG(WARNING) << "POST /checkpoint needs no token (security.mode = off and no "
                    "security.http_token_file): anyone who reaches the HTTP port can order one";
  }
  ASSIGN_OR_RETURN(int http_port, http_.Start(job.master.bind_host,
                                              static_cast<int>(options_.http_port),
                                              std::move(routes)));
  http_url_ = absl::StrCat("http://", advertised_host, ":", http_port);

  json endpoints = {{"rpc", rpc_endpoint_}, {"http", http_url_}, {"pid", getpid()}};
  RETURN_IF_ERROR(WriteFileAtomically(
      (std::filesystem::path(options_.data_dir) / "master.json").string(), DumpJson(endpoints)));
  LOG(INFO) << "serving RPC on " << rpc_endpoint_ << " and HTTP on " << http_url_
            << "; waiting for " << job.ps.num_servers << " server(s)";
  VLOG(1) << "effective options:\n" << job.DebugString();
  return absl::OkStatus();
}

std::pair<int, std::string> Master::Impl::PostCheckpoint() {
  absl::MutexLock lock(&mu_);
  StatusOr<uint64_t> requested = control_->RequestCheckpoint();
  if (!requested.ok()) {
    return {409, DumpJson({{"error", std::string(requested.status().message())}})};
  }
  const uint64_t id = *requested;
  changed_.SignalAll();
  const absl::Time deadline = clock_->Now() + absl::Minutes(10);
  const JobControl& control = *control_;
  // A recovery starting meanwhile abandons a round in progress (its result
  // says so) and keeps a requested one from starting.
  auto waiting = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return control.checkpoints().Result(id) == nullptr && !control.over() &&
           !(control.recovery().active() && !control.checkpoints().round_id().has_value()) &&
           clock_->Now() < deadline;
  };
  while (waiting()) changed_.WaitWithDeadline(&mu_, deadline);
  const json* done = control.checkpoints().Result(id);
  json result = done != nullptr ? *done
                : control.over() ? json{{"checkpoint", id}, {"error", "the job ended first"}}
                : control.recovery().active()
                    ? json{{"checkpoint", id},
                           {"error", absl::StrCat("not taken: the job is being restored (",
                                                  control.recovery().why(), ")")}}
                    : json{{"checkpoint", id},
                           {"error", "not complete after 10 minutes; see the master's log"}};
  return {result.contains("error") ? 500 : 200, DumpJson(result)};
}

Status Master::Impl::Persist() {
  absl::MutexLock persist_lock(&persist_mu_);
  StateUpdate update;
  std::optional<std::string> final_status;
  Status result;
  {
    absl::MutexLock lock(&mu_);
    // Built under mu_: a peer told to exit must find the file in place, and
    // every reply that tells one waits for this Persist.
    if (control_->TakeChanges(&update)) {
      final_status = DumpJson(Document());
    }
  }
  if (!update.empty()) {
    Status written = store_->Write(update);
    if (!written.ok()) {
      result = absl::UnavailableError(
          absl::StrCat("the master cannot save the job's state: ", written.message()));
      disk_failed_.store(true);
      absl::MutexLock lock(&mu_);
      // What was saved before is whole: the job can go on from it.
      control_->Fail(absl::StrCat("the master cannot save the job's state in ",
                                  options_.data_dir, ": ", written.message(),
                                  "; free space (or fix the disk), then run eps-master --resume"),
                     /*stopped=*/true, clock_->Now());
      final_status = DumpJson(Document());
    }
  }
  if (final_status.has_value()) {
    Status written = WriteFileAtomically(
        (std::filesystem::path(options_.data_dir) / "final_status.json").string(), *final_status);
    if (!written.ok()) NoteFilesError(written);
  }
  return result;
}

void Master::Impl::NoteFilesError(const Status& error) {
  LOG(ERROR) << error;
  disk_failed_.store(true);
  absl::MutexLock lock(&mu_);
  if (files_error_.ok()) files_error_ = error;
  control_->Fail(absl::StrCat("the master cannot write its files in ", options_.data_dir, ": ",
                              error.message(),
                              "; free space (or fix the disk), then run eps-master --resume"),
                 /*stopped=*/true, clock_->Now());
  changed_.SignalAll();
}

StatusOr<std::pair<DataSet, DataSet>> Master::Impl::ScanData() {
  const uint64_t shard_lines = static_cast<uint64_t>(options_.job.data.shard_records);
  absl::Time last_report = clock_->Now();
  auto progress = [&](const char* what, uint64_t done, uint64_t total) {
    const absl::Time now = clock_->Now();
    if (now - last_report >= absl::Seconds(options_.job.job.progress_interval_s)) {
      last_report = now;
      LOG(INFO) << "scanning " << what << ": " << absl::StrFormat("%.1f", 100.0 * done / total)
                << "% of " << total / (1 << 20) << " MiB";
    }
    return !stop_scan_.load();
  };
  std::pair<DataSet, DataSet> data;
  auto& [train, eval] = data;
  ASSIGN_OR_RETURN(train,
                   CutIntoShards(train_files_, shard_lines, [&](uint64_t done, uint64_t total) {
                     return progress("data.train", done, total);
                   }));
  if (train.lines == 0) {
    return absl::InvalidArgumentError("data.train: the files hold no records");
  }
  LOG(INFO) << "data.train: " << train.lines << " lines in " << train.files.size() << " file(s), "
            << train.shards.size() << " shards";
  if (!eval_files_.empty()) {
    ASSIGN_OR_RETURN(eval,
                     CutIntoShards(eval_files_, shard_lines, [&](uint64_t done, uint64_t total) {
                       return progress("data.eval", done, total);
                     }));
    LOG(INFO) << "data.eval: " << eval.lines << " lines in " << eval.files.size() << " file(s), "
              << eval.shards.size() << " shards";
  }
  return data;
}

void Master::Impl::JobLoop() {
  bool ready;
  {
    absl::MutexLock lock(&mu_);
    ready = control_->data_ready();
  }
  if (!ready) {
    // Without the lock: the scan may take minutes.
    StatusOr<std::pair<DataSet, DataSet>> data = ScanData();
    absl::MutexLock lock(&mu_);
    control_->DataScanned(std::move(data), clock_->Now());
  }
  (void)Persist();  // a failure fails the job, which the loop sees
  ServerCalls calls(&factory_, clock_);
  // Leases are checked 4 times a heartbeat, so a dead worker's shards are
  // back in the queue within lease + a quarter heartbeat + one fencing call.
  const absl::Duration tick =
      std::min(absl::Milliseconds(100), absl::Milliseconds(options_.job.master.heartbeat_ms) / 4);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = clock_->Now();
      control_->NoteUnhandledSince(rpc_->OldestWaiting());
      control_->Tick(now);
      changed_.SignalAll();
      if (control_->Done(now)) break;
    }
    PropagateFences(calls);
    AdvanceCheckpoint(calls);
    AdvanceRecovery(calls);
    AdvanceMoves(calls);
    AdvanceExport(calls);
    AdvanceImport(calls);
    // A failed write fails the job (Persist says why): the loop winds down.
    (void)Persist();
    if (Status flushed = events_->Flush(); !flushed.ok()) NoteFilesError(flushed);
    TrimFreeMemory(clock_->Now());
    absl::MutexLock lock(&mu_);
    changed_.WaitWithTimeout(&mu_, tick);
  }
  (void)Persist();
  if (Status flushed = events_->Flush(); !flushed.ok()) NoteFilesError(flushed);
  absl::MutexLock lock(&mu_);
  threads_done_ = true;
  changed_.SignalAll();
}

bool Master::Impl::Serving(const ServerAddress& server) {
  absl::MutexLock lock(&mu_);
  control_->NoteUnhandledSince(rpc_->OldestWaiting());
  control_->ExpireLeases(clock_->Now());
  changed_.SignalAll();
  return control_->membership().Serving(server);
}

void Master::Impl::PropagateFences(ServerCalls& calls) {
  std::optional<Membership::FenceRound> round;
  {
    absl::MutexLock lock(&mu_);
    round = control_->PendingFences();
  }
  if (!round.has_value()) return;
  const absl::Duration timeout =
      absl::Milliseconds(std::max<int64_t>(200, options_.job.master.heartbeat_ms));
  const std::vector<ServerAddress> refused = calls.SendFences(*round, timeout);
  absl::MutexLock lock(&mu_);
  if (refused.empty()) {
    control_->FencesAcknowledged(*round, clock_->Now());
  } else {
    control_->FencesRefused(*round, refused, clock_->Now());  // again next tick
  }
  changed_.SignalAll();
}

void Master::Impl::AdvanceCheckpoint(ServerCalls& calls) {
  const absl::Time writing = clock_->Now();
  std::optional<JobControl::CheckpointWrite> write;
  std::string export_dir;
  {
    absl::MutexLock lock(&mu_);
    write = control_->NextCheckpointWrite(clock_->Now());
    if (write.has_value()) {
      if (auto it = export_requests_.find(write->write.id); it != export_requests_.end()) {
        export_dir = it->second;
        exports_taken_.insert(write->write.id);
      }
    }
    changed_.SignalAll();
  }
  if (!write.has_value()) return;
  // The id is saved before any server uses it, so that a restarted master
  // never starts a round of an id a server may hold a partial copy of.
  if (!Persist().ok()) return;
  // No push is in flight: the servers' state is the ledger's.
  std::vector<StatusOr<proto::ServerCheckpoint>> parts =
      calls.WriteCheckpoint(write->write.id, write->write.keep, write->servers,
                            [this](const ServerAddress& server) { return Serving(server); });
  // POST /export: written while the workers are still paused.
  std::optional<CheckpointExport> exported;
  if (!export_dir.empty()) exported = ExportAtCheckpoint(calls, *write, export_dir, parts);
  StateUpdate update;
  std::optional<proto::CheckpointRecord> record;
  {
    absl::MutexLock lock(&mu_);
    record = control_->CheckpointWritten(*write, std::move(parts), writing, clock_->Now(), &update);
    if (exported.has_value()) TakeCheckpointExport(record.has_value(), &*exported);
    changed_.SignalAll();
  }
  if (!record.has_value()) return;
  // The record makes the checkpoint complete; written before the workers
  // go on, so that what they train next is never part of it.
  Status written = store_->Write(update);
  {
    absl::MutexLock lock(&mu_);
    control_->CheckpointRecorded(*record, written, clock_->Now());
    changed_.SignalAll();
  }
  if (exported.has_value()) FinishCheckpointExport(written, std::move(*exported));
}

void Master::Impl::AdvanceRecovery(ServerCalls& calls) {
  std::optional<Recovery::Step> step;
  uint64_t checkpoint = 0;
  {
    absl::MutexLock lock(&mu_);
    step = control_->NextRestore(clock_->Now());
    if (step.has_value()) checkpoint = control_->checkpoints().last()->id();
  }
  if (!step.has_value()) return;
  // The recovery is on record before any server changes.
  if (!Persist().ok()) return;
  const absl::Time restoring = clock_->Now();
  std::vector<StatusOr<uint64_t>> replies = calls.Restore(
      checkpoint, step->targets, [this](const ServerAddress& server) { return Serving(server); },
      options_.job.job.init_from, options_.job.job.init_optimizer_state);
  {
    absl::MutexLock lock(&mu_);
    control_->Restored(*step, replies, restoring, clock_->Now());
    changed_.SignalAll();
  }
  (void)Persist();  // a failure fails the job
}

Status Master::Impl::Handle(Message& request, Message* reply) {
  const proto::Method method = request.header().method();
  const proto::NodeId& sender = request.header().sender();
  proto::Envelope& out = reply->header();
  if (request.num_frames() > 0 && method != proto::COMMIT_PROGRESS) {
    return absl::InvalidArgumentError(
        absl::StrCat(proto::Method_Name(method), " takes no bulk frames"));
  }
  // Decoded before the lock: bodies and bulk frames.
  std::span<const float> labels;
  std::span<const float> predictions;
  switch (method) {
    case proto::REGISTER_SERVER:
      if (!request.header().has_register_server_request()) {
        return absl::InvalidArgumentError("REGISTER_SERVER without its body");
      }
      break;
    case proto::REGISTER_WORKER: {
      if (!request.header().has_register_worker_request()) {
        return absl::InvalidArgumentError("REGISTER_WORKER without its body");
      }
      // A launch id is the autoscaler's to give: claimed without its launch's
      // secret it could make the fleet take a real worker for frozen.
      const proto::RegisterWorkerRequest& body = request.header().register_worker_request();
      const Autoscaler* autoscaler = nullptr;
      {
        absl::MutexLock lock(&mu_);  // set by Start; lives as long as the RPC server
        autoscaler = autoscaler_.get();
      }
      if (body.launch_id() != 0 &&
          (autoscaler == nullptr ||
           !autoscaler->VerifyLaunch(body.launch_id(), body.launch_secret()))) {
        LOG(WARNING) << "refused a worker (" << body.hostname() << " pid " << body.pid()
                     << ") claiming launch id " << body.launch_id() << " without its secret";
        return absl::PermissionDeniedError(absl::StrCat(
            "launch id ", body.launch_id(),
            " is not one this master launched with that launch secret (EPS_LAUNCH_SECRET, handed by "
            "the autoscaler's launcher): a launch of an earlier master, or EPS_LAUNCH_ID set by "
            "hand, which a worker started by hand must not set"));
      }
      break;
    }
    case proto::HEARTBEAT:
      if (!request.header().has_heartbeat_request()) {
        return absl::InvalidArgumentError("HEARTBEAT without its body");
      }
      break;
    case proto::COMMIT_PROGRESS:
      if (!request.header().has_commit_progress_request()) {
        return absl::InvalidArgumentError("COMMIT_PROGRESS without its body");
      }
      if (request.header().commit_progress_request().phase() == proto::EVAL) {
        ASSIGN_OR_RETURN(labels, request.Array<float>(0));
        ASSIGN_OR_RETURN(predictions, request.Array<float>(1));
        RETURN_IF_ERROR(CheckEvaluation(request.header().sender(),
                                        request.header().commit_progress_request(), labels,
                                        predictions));
      } else if (request.num_frames() != 0) {
        return absl::InvalidArgumentError("a TRAIN commit carries no frames");
      }
      break;
    case proto::SPLIT_SHARD:
      if (!request.header().has_split_shard_request()) {
        return absl::InvalidArgumentError("SPLIT_SHARD without its body");
      }
      break;
    case proto::SHARD_UNREADABLE:
      if (!request.header().has_shard_unreadable_request()) {
        return absl::InvalidArgumentError("SHARD_UNREADABLE without its body");
      }
      return HandleShardUnreadable(request, reply);
    case proto::GET_CLUSTER_MAP:
    case proto::GET_SHARD:
    case proto::DEREGISTER:
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("the master does not serve ", proto::Method_Name(method)));
  }
  Status status;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    JobControl& control = *control_;
    switch (method) {
      case proto::REGISTER_SERVER: {
        proto::RegisterServerReply body;
        status = control.RegisterServer(request.header().register_server_request(), now, &body);
        if (worker_credentials_.has_value()) {
          body.set_worker_credential_key(worker_credentials_->key());
        }
        if (status.ok()) *out.mutable_register_server_reply() = std::move(body);
        break;
      }
      case proto::REGISTER_WORKER: {
        proto::RegisterWorkerReply body;
        status = control.RegisterWorker(request.header().register_worker_request(), now, &body);
        if (worker_credentials_.has_value()) {
          body.set_credential(worker_credentials_->Issue(body.worker_id()));
        }
        if (status.ok()) *out.mutable_register_worker_reply() = std::move(body);
        break;
      }
      case proto::HEARTBEAT: {
        proto::HeartbeatReply body;
        status = control.Heartbeat(sender, request.header().heartbeat_request(),
                                   request.header().cluster_map_version(), now, &body);
        if (status.ok()) *out.mutable_heartbeat_reply() = std::move(body);
        break;
      }
      case proto::GET_CLUSTER_MAP: {
        proto::GetClusterMapReply body;
        status = control.GetClusterMap(sender, &body);
        if (status.ok()) *out.mutable_get_cluster_map_reply() = std::move(body);
        break;
      }
      case proto::GET_SHARD: {
        proto::GetShardReply body;
        status = control.GetShard(sender, now, &body);
        if (status.ok()) *out.mutable_get_shard_reply() = std::move(body);
        break;
      }
      case proto::COMMIT_PROGRESS: {
        proto::CommitProgressReply body;
        status = control.Commit(sender, request.header().commit_progress_request(), labels,
                                predictions, now, &body);
        if (status.ok()) *out.mutable_commit_progress_reply() = std::move(body);
        break;
      }
      case proto::SPLIT_SHARD: {
        proto::SplitShardReply body;
        status = control.SplitShard(sender, request.header().split_shard_request(), now, &body);
        if (status.ok()) *out.mutable_split_shard_reply() = std::move(body);
        break;
      }
      case proto::DEREGISTER:
        status = control.Deregister(sender, request.header().deregister_request());
        if (status.ok()) out.mutable_deregister_reply();
        break;
      default:
        break;
    }
    // The job loop may proceed (a pause reported, a server back, a peer
    // told to exit).
    changed_.SignalAll();
  }
  // What the reply acknowledges is on disk before the reply leaves.
  Status persisted = Persist();
  return persisted.ok() ? status : persisted;
}

Status Master::Impl::HandleShardUnreadable(const Message& request, Message* reply) {
  const proto::NodeId& sender = request.header().sender();
  const proto::ShardUnreadableRequest& body = request.header().shard_unreadable_request();
  proto::ShardUnreadableReply answer;
  Status status;
  std::optional<TrainingProgress::UnreadRange> range;
  {
    absl::MutexLock lock(&mu_);
    StatusOr<std::optional<TrainingProgress::UnreadRange>> found =
        control_->UnreadableShard(sender, body, clock_->Now(), &answer);
    if (found.ok()) {
      range = *std::move(found);
    } else {
      status = found.status();
    }
  }
  if (range.has_value()) {
    const Status readable = CheckShardRange(range->path, range->begin, range->end, range->lines);
    absl::MutexLock lock(&mu_);
    status = control_->ShardUnreadable(sender, body, *range, readable, clock_->Now(), &answer);
    changed_.SignalAll();
  }
  if (status.ok()) *reply->header().mutable_shard_unreadable_reply() = answer;
  // What the reply acknowledges (a skipped shard, a stopped job) is on
  // disk before it leaves.
  Status persisted = Persist();
  return persisted.ok() ? status : persisted;
}

Status Master::Impl::Wait() {
  {
    absl::MutexLock lock(&mu_);
    while (!threads_done_) changed_.Wait(&mu_);
  }
  StopThreads();
  absl::MutexLock lock(&mu_);
  if (control_->progress().phase() == JobPhase::kFinished) {
    if (files_error_.ok()) return absl::OkStatus();
    // Trained and saved, but not all of it reported: never a silent success.
    return Annotate(files_error_,
                    absl::StrCat("the job finished (its state is saved in ", options_.data_dir,
                                 "), but the master could not write its files"));
  }
  return absl::AbortedError(control_->progress().failure());
}

void Master::Impl::RequestStop(const std::string& reason) {
  stop_scan_.store(true);
  {
    absl::MutexLock lock(&mu_);
    if (stop_requested_) return;
    stop_requested_ = true;
    // A job ended by an operator can go on later (--resume); one that is
    // over stays as it ended.
    control_->Fail(reason, /*stopped=*/true, clock_->Now());
    changed_.SignalAll();
  }
  // The stop and final_status.json.
  if (Status persisted = Persist(); !persisted.ok()) LOG(ERROR) << persisted;
}

void Master::Impl::StopThreads() {
  if (job_thread_.joinable()) job_thread_.join();
  // The workers it launched heard the job is over: it waits for them (a
  // bounded grace) while the RPC server still answers their last calls.
  if (autoscaler_ != nullptr) autoscaler_->Stop();
  if (server_scaler_ != nullptr) server_scaler_->Stop(absl::Seconds(30));
  http_.Stop();
  if (rpc_) rpc_->Stop();
}

Master::Master(const MasterOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Master::~Master() = default;
Status Master::Start() { return impl_->Start(); }
Status Master::Wait() { return impl_->Wait(); }
void Master::RequestStop(const std::string& reason) { impl_->RequestStop(reason); }
const std::string& Master::rpc_endpoint() const { return impl_->rpc_endpoint(); }
const std::string& Master::http_url() const { return impl_->http_url(); }
std::string Master::StatusJson() const { return impl_->StatusJson(); }
bool Master::Resumable() const { return impl_->Resumable(); }

}  // namespace eps
