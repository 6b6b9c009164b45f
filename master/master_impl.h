// Master::Impl: the master's driver (master.cc), with its model-file steps
// in master_export.cc. Private to master/.

#ifndef EPS_MASTER_MASTER_IMPL_H_
#define EPS_MASTER_MASTER_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/logging.h"
#include "master/autoscale/autoscaler.h"
#include "master/autoscale/server_scaler.h"
#include "master/event_log.h"
#include "master/http/http_service.h"
#include "master/http/status_report.h"
#include "master/job_control.h"
#include "master/master.h"
#include "master/model_export.h"
#include "master/progress/data_set.h"
#include "master/server_calls.h"
#include "master/state_store.h"
#include "master/trust/eval_check.h"
#include "nlohmann/json.hpp"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"
#include "worker/ps_client.h"

namespace eps {

class Master::Impl {
 public:
  explicit Impl(const MasterOptions& options) : options_(options) {}

  ~Impl() {
    if (rpc_ != nullptr) RequestStop("master shutting down");
    StopThreads();
    if (disk_failed_.load()) {
      // RocksDB (Debian's build keeps its assertions) aborts closing a WAL
      // whose write failed; what it acknowledged is in the WAL already.
      LOG(WARNING) << "not closing the master's state store after a failed write";
      (void)store_.release();
    }
  }

  Status Start();
  Status Wait();
  void RequestStop(const std::string& reason);
  std::string StatusJson() const {
    absl::MutexLock lock(&mu_);
    return DumpJson(Document());
  }
  const std::string& rpc_endpoint() const { return rpc_endpoint_; }
  const std::string& http_url() const { return http_url_; }
  bool Resumable() const {
    absl::MutexLock lock(&mu_);
    return control_->progress().stopped();
  }

 private:
  Status StartServing();
  // The /status document: JobControl's, and the autoscaler's section.
  nlohmann::json Document() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With [autoscale] on: DATA_DIR/worker.ini for the workers it starts,
  // its source and launcher, and its thread.
  Status StartAutoscaler();
  // The autoscaler's view of the workers it launched.
  std::map<uint64_t, WorkerFleet::Seen> LaunchedWorkers() const ABSL_LOCKS_EXCLUDED(mu_);
  // With autoscale.max_servers > 0 (master_moves.cc): DATA_DIR/server.ini
  // for the servers it starts, and its thread.
  Status StartServerScaler();
  // The server autoscaler's view of the servers.
  ServerScaler::View ServerView() const ABSL_LOCKS_EXCLUDED(mu_);
  Status Handle(Message& request, Message* reply);
  // SHARD_UNREADABLE: JobControl judges the report around the master's own
  // read of the file, done without mu_ (one shard: a few MiB; the RPC
  // thread waits for it).
  Status HandleShardUnreadable(const Message& request, Message* reply);
  // COMMIT_PROGRESS of an evaluation, under CURVE: checked against the
  // file and the model (master/trust/eval_check.h) before JobControl applies
  // it, without mu_ (one batch read, one pull, on the RPC thread that took
  // the commit; the master's other RPC thread serves meanwhile). One check
  // at a time: a commit that finds another being checked is not waited
  // for. A false one fences its worker (JobControl::RefuseEvaluation) and
  // the FENCED error is returned; kUnavailable with SLOW_DOWN when it could
  // not be checked now (the worker sends it again).
  Status CheckEvaluation(const proto::NodeId& sender, const proto::CommitProgressRequest& commit,
                         std::span<const float> labels, std::span<const float> predictions)
      ABSL_LOCKS_EXCLUDED(mu_, eval_check_mu_);
  // The parameters of `batch` from the servers, for eval_check_.
  Status PullForCheck(const Batch& batch, ParamBuffers* params)
      ABSL_LOCKS_EXCLUDED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(eval_check_mu_);
  // POST /checkpoint: a coordinated round now (or the one in progress);
  // answers when it is complete or has failed.
  std::pair<int, std::string> PostCheckpoint();

  // Background: scans the data, then runs the job loop until the job is
  // over and every peer has heard.
  void JobLoop();
  StatusOr<std::pair<DataSet, DataSet>> ScanData();
  // The job loop's fan-outs, each without mu_ across the calls.
  void PropagateFences(ServerCalls& calls);
  void AdvanceCheckpoint(ServerCalls& calls);
  void AdvanceRecovery(ServerCalls& calls);
  // The model export (job.export_dir) once the last pass is done.
  void AdvanceExport(ServerCalls& calls);
  // POST /export?dir=DIR: a checkpoint round whose servers also export
  // their rows while the workers are paused; the master then writes the
  // manifest. Waits up to 10 minutes for the result.
  std::pair<int, std::string> PostExport(std::string dir) ABSL_LOCKS_EXCLUDED(mu_);
  // POST /export's part of a checkpoint round (master_export.cc): the
  // export, once every server wrote its checkpoint and before the workers
  // go on; the manifest (under mu_, the job as the checkpoint has it) or
  // the round's failure; the manifest written after the record, and the
  // result PostExport waits for.
  struct CheckpointExport {
    uint64_t id = 0;
    std::string dir;
    std::vector<uint32_t> slots;
    Status status;
    uint64_t rows = 0;
    StatusOr<ExportManifest> manifest = absl::UnknownError("no manifest yet");
  };
  CheckpointExport ExportAtCheckpoint(ServerCalls& calls, const JobControl::CheckpointWrite& write,
                                      const std::string& dir,
                                      const std::vector<StatusOr<proto::ServerCheckpoint>>& parts);
  void TakeCheckpointExport(bool recorded, CheckpointExport* exported)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishCheckpointExport(const Status& written, CheckpointExport exported)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes DIR/manifest.json, then has `servers` write their rows into
  // DIR; the rows written, or the errors naming the servers.
  StatusOr<uint64_t> ExportRows(ServerCalls& calls, const std::string& dir,
                                const std::vector<ServerAddress>& servers);
  // The steps of the partition move in progress, back to back until it
  // is committed or given up (master_moves.cc).
  void AdvanceMoves(ServerCalls& calls);
  // POST /servers/N/drain.
  std::pair<int, std::string> PostDrain(uint32_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // JobControl::Drain, then persisted (POST /servers/N/drain and the server
  // autoscaler): its reply, its refusal, or Persist's error (kUnavailable).
  StatusOr<nlohmann::json> DrainServer(uint32_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // The warm start (job.init_from) before training starts.
  void AdvanceImport(ServerCalls& calls);
  // While servers work, leases run on: a server that dies meanwhile is not
  // waited for.
  bool Serving(const ServerAddress& server) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes what changed (and final_status.json once the job ended) before
  // any reply that depends on it goes out. A failed write fails the job and
  // is returned (kUnavailable): the reply must not acknowledge what is not
  // on disk.
  Status Persist() ABSL_LOCKS_EXCLUDED(mu_);
  // The master could not write its own files (final_status.json, the
  // events log): the job stops resumably, and even a finished one makes
  // Wait return the first such error (the master exits non-zero).
  void NoteFilesError(const Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  void StopThreads();

  const MasterOptions options_;
  const Clock* const clock_ = Clock::Real();
  // Nothing the master takes or sends is large: an evaluation commit of the
  // largest batch (2^20 records) is 8 MiB, the cluster map of 2^20
  // partitions about 5 MiB. A smaller bound keeps what one peer can make it
  // read (and parse) small.
  static constexpr int64_t kMaxMessageBytes = int64_t{16} << 20;
  SocketFactory factory_{
      TransportOptions{.max_message_bytes = kMaxMessageBytes, .security = options_.security}};
  std::unique_ptr<RpcServer> rpc_;
  // Under CURVE: what the master issues workers and hands servers; set by
  // StartServing, then read-only.
  std::optional<WorkerCredentials> worker_credentials_;
  // Under CURVE with data.eval set (set by StartServing); used by one
  // check at a time (eval_check_mu_), as is its PsClient (made at the first
  // check).
  std::unique_ptr<EvalCheck> eval_check_;
  absl::Mutex eval_check_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<PsClient> check_ps_ ABSL_GUARDED_BY(eval_check_mu_);
  // Of eval_check_'s model, with check_ps_.
  ParamTables check_tables_ ABSL_GUARDED_BY(eval_check_mu_);
  // The membership generation the dense tensors in eval_check_'s buffers
  // were pulled in (none yet: nullopt): the evaluation pushes nothing, and
  // a restore of the servers starts a new generation.
  std::optional<uint64_t> check_dense_generation_ ABSL_GUARDED_BY(eval_check_mu_);
  HttpService http_{clock_};
  std::thread job_thread_;
  std::string rpc_endpoint_;
  std::string http_url_;
  // The expanded data.train and data.eval; set by Start, then read-only.
  std::vector<std::string> train_files_;
  std::vector<std::string> eval_files_;
  // Set by RequestStop: a scan in progress stops.
  std::atomic<bool> stop_scan_{false};
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<EventLog> events_;
  // POST /export: the export directory of each checkpoint round asked for
  // one, and each one's result once written (or failed).
  std::map<uint64_t, std::string> export_requests_ ABSL_GUARDED_BY(mu_);
  // The rounds whose write took up an export request and whose export
  // result is not in export_results_ yet.
  std::set<uint64_t> exports_taken_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, nlohmann::json> export_results_ ABSL_GUARDED_BY(mu_);
  // Set by Start when [autoscale] is on; stopped before the RPC server.
  std::unique_ptr<Autoscaler> autoscaler_;
  // Set by Start when autoscale.max_servers > 0; stopped with it.
  std::unique_ptr<ServerScaler> server_scaler_;
  // Orders whole Persist() calls, so writes land in the order of changes.
  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::unique_ptr<JobControl> control_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool threads_done_ ABSL_GUARDED_BY(mu_) = false;
  Status files_error_ ABSL_GUARDED_BY(mu_);  // see NoteFilesError
  // A write to the master's dir failed (files or state store).
  std::atomic<bool> disk_failed_{false};
};


}  // namespace eps

#endif  // EPS_MASTER_MASTER_IMPL_H_
