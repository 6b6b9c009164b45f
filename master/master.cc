#include "master/master.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/placement.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/metrics.h"
#include "httplib.h"
#include "master/data_set.h"
#include "master/event_log.h"
#include "master/job_spec.h"
#include "master/shard_tracker.h"
#include "master/state_store.h"
#include "master/status_page.h"
#include "models/metrics.h"
#include "nlohmann/json.hpp"
#include "rpc/message.h"
#include "rpc/net.h"
#include "rpc/rpc_channel.h"
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

namespace {

// Persisted as MasterRecord.phase: never renumber.
enum class Phase { kScanning = 0, kTraining = 1, kEvaluating = 2, kFinished = 3, kFailed = 4 };

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kScanning: return "scanning";
    case Phase::kTraining: return "training";
    case Phase::kEvaluating: return "evaluating";
    case Phase::kFinished: return "finished";
    case Phase::kFailed: return "failed";
  }
  return "unknown";
}

// kFenced: a live worker sent away by a server recovery (it registers again).
enum class PeerState { kAlive, kDead, kLeft, kFenced };

const char* PeerStateName(PeerState state) {
  switch (state) {
    case PeerState::kAlive: return "alive";
    case PeerState::kDead: return "dead";
    case PeerState::kLeft: return "left";
    case PeerState::kFenced: return "fenced";
  }
  return "unknown";
}

struct WorkerEntry {
  std::string host;
  uint32_t pid = 0;
  std::string device;
  PeerState state = PeerState::kAlive;
  absl::Time last_seen;
  absl::Time joined;
  uint64_t records = 0;         // committed by this worker, counted by the master
  uint64_t records_pushed = 0;  // as the worker reports it
  double records_per_s = 0;
  bool told_to_exit = false;
  uint64_t paused_for = 0;  // the checkpoint it reports having paused for
  // As last reported; kept once the worker is gone (/metrics).
  proto::WorkerStats stats;
};

struct ServerEntry {
  std::string endpoint;
  std::string host;
  uint32_t pid = 0;
  PeerState state = PeerState::kAlive;
  absl::Time last_seen;
  proto::ServerStats stats;
  bool told_to_exit = false;
  // Heard from by this master (a restored entry is not, until it heartbeats).
  bool seen = false;
};

// Options that must not change while a job's state lives in --data-dir, as
// "key=value" lines (the master names the ones that differ).
std::string ConfigFingerprint(const JobConfig& config, const std::vector<std::string>& train,
                              const std::vector<std::string>& eval) {
  std::vector<std::string> lines = {
      absl::StrCat("data.train=", absl::StrJoin(train, ",")),
      absl::StrCat("data.eval=", absl::StrJoin(eval, ",")),
      absl::StrCat("data.format=", config.data.format),
      absl::StrCat("data.schema=", config.data.schema),
      absl::StrCat("data.shard_records=", config.data.shard_records),
      absl::StrCat("job.seed=", config.job.seed),
      absl::StrCat("model.type=", config.model.type),
      absl::StrCat("model.embedding_dim=", config.model.embedding_dim),
      absl::StrCat("ps.partitions=", config.ps.partitions),
      absl::StrCat("ps.num_servers=", config.ps.num_servers),
  };
  return absl::StrJoin(lines, "\n");
}

// The options whose values differ between two fingerprints.
std::string FingerprintDifference(const std::string& saved, const std::string& now) {
  std::vector<std::string> a = absl::StrSplit(saved, '\n');
  std::vector<std::string> b = absl::StrSplit(now, '\n');
  std::vector<std::string> differ;
  for (const std::string& line : b) {
    if (std::find(a.begin(), a.end(), line) == a.end()) {
      differ.push_back(line.substr(0, line.find('=')));
    }
  }
  return differ.empty() ? "unknown options" : absl::StrJoin(differ, ", ");
}

proto::DataSetRecord ToRecord(const DataSet& data) {
  proto::DataSetRecord record;
  for (const std::string& file : data.files) record.add_files(file);
  record.set_records(data.records);
  record.set_bytes(data.bytes);
  for (const ShardSpec& spec : data.shards) {
    proto::ShardRecord* shard = record.add_shards();
    shard->set_file(spec.file);
    shard->set_begin(spec.begin);
    shard->set_end(spec.end);
    shard->set_first_line(spec.first_line);
    shard->set_records(spec.records);
  }
  return record;
}

DataSet FromRecord(const proto::DataSetRecord& record) {
  DataSet data;
  data.files.assign(record.files().begin(), record.files().end());
  data.records = record.records();
  data.bytes = record.bytes();
  for (const proto::ShardRecord& shard : record.shards()) {
    data.shards.push_back(ShardSpec{.file = shard.file(),
                                    .begin = shard.begin(),
                                    .end = shard.end(),
                                    .first_line = shard.first_line(),
                                    .records = shard.records()});
  }
  return data;
}

json NullableNumber(const std::optional<double>& value) {
  return value.has_value() ? json(*value) : json(nullptr);
}

// The document as text. Strings in it come from outside (the job name, file
// paths, error messages naming them) and need not be UTF-8; nlohmann::json
// throws on invalid UTF-8 unless told to replace it.
std::string DumpJson(const json& doc) {
  return doc.dump(/*indent=*/2, /*indent_char=*/' ', /*ensure_ascii=*/false,
                  json::error_handler_t::replace);
}

}  // namespace

class Master::Impl {
 public:
  explicit Impl(const MasterOptions& options) : options_(options) {}

  ~Impl() {
    if (rpc_ != nullptr) RequestStop("master shutting down");
    StopThreads();
  }

  Status Start();
  Status Wait();
  void RequestStop(const std::string& reason);
  std::string StatusJson() const {
    absl::MutexLock lock(&mu_);
    return DumpJson(StatusDocument());
  }

  const std::string& rpc_endpoint() const { return rpc_endpoint_; }
  const std::string& http_url() const { return http_url_; }
  bool Resumable() const {
    absl::MutexLock lock(&mu_);
    return stopped_;
  }

 private:
  // Restores the job saved in --data-dir, if any. kFailedPrecondition when
  // it belongs to another configuration or is over.
  Status Restore(const MasterSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status StartServing();

  Status Handle(Message& request, Message* reply);
  Status HandleRegisterServer(const Message& request, Message* reply);
  Status HandleRegisterWorker(const Message& request, Message* reply);
  Status HandleHeartbeat(const Message& request, Message* reply);
  Status HandleGetClusterMap(const Message& request, Message* reply);
  Status HandleGetShard(const Message& request, Message* reply);
  Status HandleCommit(const Message& request, Message* reply);
  Status HandleSplitShard(const Message& request, Message* reply);
  Status HandleDeregister(const Message& request, Message* reply);

  // The worker sending `request`, if it is registered and alive; FENCED
  // otherwise.
  StatusOr<WorkerEntry*> LiveWorker(const Message& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Background: scans the data, then watches leases, fences and progress.
  void JobLoop();
  Status ScanData(DataSet* train, DataSet* eval);
  void CheckLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops accepting anything from `id` and queues its shards for release
  // once every server refuses its pushes too.
  void FenceWorker(uint32_t id, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the fence list to every live server; when all acknowledge,
  // releases the shards of the workers waiting for it. Never holds mu_
  // across the calls.
  void PropagateFences(RpcChannel& channel);
  void ReleaseShardsOf(uint32_t id, const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybePlaceServers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<uint32_t> EpochOrder(uint32_t epoch, size_t shards) const;
  void StartEpoch(uint32_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartEvaluation() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to the next epoch / evaluation / the end when the pass is done.
  void AdvanceIfPassDone() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the pass a commit names (the evaluation, or training epoch
  // `epoch`) is complete: every one of its shards is DONE.
  bool PassIsOver(bool eval, uint32_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteFinalStatus() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every job.progress_interval_s: the rate, a progress line, a sample in
  // history_ and a "progress" event.
  void LogProgress(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seconds to the end of the job (every pass left and the evaluation) at
  // the last interval's rate; nullopt when unknown.
  std::optional<double> EtaSeconds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Mean loss of the current epoch so far; nullopt outside training.
  std::optional<double> RunningLoss() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Coordinated checkpoints. A round pauses every worker after its batch in
  // hand is committed, has every server write checkpoint N once no push is
  // in flight, records the job's state with it (one CheckpointRecord) and
  // lets the workers go on.
  void MaybeStartCheckpoint(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the round's next step: aborts it when workers did not pause in
  // time, or writes it when all have. Never holds mu_ across the calls.
  void AdvanceCheckpoint(RpcChannel& channel);
  // Has every server in `servers` write checkpoint `id`; one result each.
  std::vector<StatusOr<proto::ServerCheckpoint>> WriteServerCheckpoints(
      RpcChannel& channel, uint64_t id, const std::vector<uint64_t>& keep,
      const std::vector<std::pair<uint32_t, std::string>>& servers);
  // Sends make(id) to every server in `servers` and waits for all replies,
  // watching leases meanwhile: the call to a server that dies (or restarts)
  // is given up. Never holds mu_ across the calls.
  std::vector<StatusOr<Message>> CallServers(
      RpcChannel& channel, const std::vector<std::pair<uint32_t, std::string>>& servers,
      const std::function<Message(uint32_t)>& make, absl::Duration timeout);

  // Server recovery. A server's death (or restart) fences every worker and
  // waits until its slot is filled again (the server restarted on its
  // --data-dir, or a fresh one); then every server (rollback) or the lost
  // ones (continue) restore the last complete checkpoint, with rollback the
  // data progress returns to it, and the workers register again.
  void StartRecovery(uint32_t server, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceRecovery(RpcChannel& channel);
  // Ends a recovery that cannot complete. The job stops resumable: its
  // checkpoints stand, and --resume tries again once the cause is fixed
  // (shared storage mounted, say).
  void FailRecovery(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stopped_ = true;
    Fail(reason);
  }
  // Returns the data progress (pass, shards, ledger, counts) to the
  // checkpoint's.
  Status ApplyCheckpoint(const proto::CheckpointRecord& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `shards` (in shard id order) the pass in progress: training epoch
  // `epoch`, or the evaluation. `saved_splits` is the saved total of splits,
  // which counts this pass's split-off shards too. kDataLoss when the
  // records do not add up.
  Status AdoptPass(const std::vector<proto::ShardRecord>& shards, bool eval, uint32_t epoch,
                   uint64_t saved_splits) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers holding a shard of the pass in progress.
  std::set<uint32_t> HoldersOfShardsInProgress() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resume (--resume): every server slot must be filled again and restored.
  Status ResumeFromCheckpoint(const MasterSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  json CheckpointJson(const proto::CheckpointRecord& record) const;
  // Ends the round in progress as failed with `error` (log, event, result
  // for POST /checkpoint); the next one is due an interval later.
  void FailRound(const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool JobOver() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return phase_ == Phase::kFinished || phase_ == Phase::kFailed;
  }
  // True when every live peer has been told to exit.
  bool EveryoneTold() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  proto::EpochLedger& Ledger(uint32_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t RetryAfterMs() const;
  absl::Time ShutdownDeadline() const;

  // Persistence: state changes mark what they touched; Persist() writes it
  // (outside mu_, in the order the changes were made) before replies go out.
  void MarkShard(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { dirty_shards_.insert(id); }
  void MarkAllShards() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  proto::MasterRecord MasterRecordNow() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist() ABSL_LOCKS_EXCLUDED(mu_);

  json StatusDocument() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MetricsText() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopThreads();

  const MasterOptions options_;
  SocketFactory factory_;
  std::unique_ptr<RpcServer> rpc_;
  httplib::Server http_;
  std::thread http_thread_;
  // Set by http_thread_ when listen_after_bind returns.
  std::atomic<bool> http_returned_{false};
  std::thread job_thread_;
  std::string rpc_endpoint_;
  std::string http_url_;
  proto::JobSpec job_spec_;
  // The expanded data.train and data.eval; set by Start, then read-only.
  std::vector<std::string> train_files_;
  std::vector<std::string> eval_files_;
  std::string fingerprint_;
  // Set by RequestStop: a scan in progress stops.
  std::atomic<bool> stop_scan_{false};
  const absl::Time started_ = absl::Now();
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<EventLog> events_;
  // Orders whole Persist() calls, so writes land in the order of changes.
  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar changed_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool threads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool resumed_ ABSL_GUARDED_BY(mu_) = false;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kScanning;
  bool data_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string failure_ ABSL_GUARDED_BY(mu_);
  uint32_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // 0-based
  DataSet train_data_ ABSL_GUARDED_BY(mu_);
  DataSet eval_data_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ShardTracker> tracker_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, ServerEntry> servers_ ABSL_GUARDED_BY(mu_);
  uint32_t next_worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_server_id_ ABSL_GUARDED_BY(mu_) = 0;
  proto::ClusterMap cluster_map_ ABSL_GUARDED_BY(mu_);
  uint64_t membership_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time done_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Every worker id ever fenced (sorted); ids are never reused.
  std::vector<uint32_t> fenced_ ABSL_GUARDED_BY(mu_);
  // Fenced workers whose shards wait until every server refuses them.
  std::map<uint32_t, absl::Time> awaiting_fence_ ABSL_GUARDED_BY(mu_);
  // Size of fenced_ every live server has acknowledged.
  size_t fences_acknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  // Dirty state for Persist().
  std::set<uint64_t> dirty_shards_ ABSL_GUARDED_BY(mu_);
  bool clear_pass_ ABSL_GUARDED_BY(mu_) = false;
  bool data_dirty_ ABSL_GUARDED_BY(mu_) = false;
  // Something in MasterRecord changed that no shard change implies.
  bool master_dirty_ ABSL_GUARDED_BY(mu_) = false;
  StateUpdate pending_eval_ ABSL_GUARDED_BY(mu_);

  // Accounting.
  uint64_t records_trained_ ABSL_GUARDED_BY(mu_) = 0;  // every epoch, each record once
  uint64_t records_retrained_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t records_malformed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> malformed_examples_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::EpochLedger> ledger_ ABSL_GUARDED_BY(mu_);
  // Eval commits by (shard, begin offset): labels, predictions.
  std::map<std::pair<uint64_t, uint64_t>, std::pair<std::vector<float>, std::vector<float>>>
      eval_results_ ABSL_GUARDED_BY(mu_);
  uint64_t eval_records_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> eval_auc_ ABSL_GUARDED_BY(mu_);
  std::optional<double> eval_logloss_ ABSL_GUARDED_BY(mu_);
  // Totals over finished passes (the current tracker holds its own).
  uint64_t reassignments_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t splits_ ABSL_GUARDED_BY(mu_) = 0;
  // Worst time from a dead worker's last sign of life to its shards being
  // back in the queue (lease + detection + fencing every server).
  absl::Duration worst_reassign_delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // Throughput over the last progress interval.
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_) = absl::Now();
  uint64_t records_at_last_progress_ ABSL_GUARDED_BY(mu_) = 0;
  double records_per_s_ ABSL_GUARDED_BY(mu_) = 0;
  // Records of every applied commit (training and evaluation), never undone.
  uint64_t records_committed_total_ ABSL_GUARDED_BY(mu_) = 0;
  // The last progress samples, oldest first.
  static constexpr size_t kHistorySamples = 720;
  std::deque<json> history_ ABSL_GUARDED_BY(mu_);

  // Coordinated checkpoints.
  struct CheckpointRound {
    uint64_t id = 0;
    absl::Time started;
    bool writing = false;  // every worker has paused; the servers write
  };
  std::optional<CheckpointRound> round_ ABSL_GUARDED_BY(mu_);
  absl::Time next_checkpoint_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool checkpoint_requested_ ABSL_GUARDED_BY(mu_) = false;  // POST /checkpoint
  uint64_t last_checkpoint_id_ ABSL_GUARDED_BY(mu_) = 0;    // started, complete or not
  std::deque<uint64_t> kept_checkpoints_ ABSL_GUARDED_BY(mu_);  // complete, oldest first
  uint64_t checkpoints_written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checkpoints_failed_ ABSL_GUARDED_BY(mu_) = 0;
  double checkpoint_pause_s_ ABSL_GUARDED_BY(mu_) = 0;  // total, over every round
  // Outcome of recent rounds by id: the record's JSON, or {"error": ...}.
  std::map<uint64_t, json> checkpoint_results_ ABSL_GUARDED_BY(mu_);
  // The newest complete checkpoint: what a recovery restores. Checkpoint 0
  // is the job as training starts: no server holds a row yet, so it needs
  // no server's part (restoring it empties a server) and no pause.
  std::optional<proto::CheckpointRecord> last_checkpoint_ ABSL_GUARDED_BY(mu_);
  // A checkpoint record for the next Persist().
  std::optional<proto::CheckpointRecord> pending_checkpoint_ ABSL_GUARDED_BY(mu_);
  // Stopped by RequestStop: resumable with --resume.
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;

  // Server recovery in progress.
  struct Recovery {
    std::string why;
    absl::Time started;
    bool rollback = true;         // every server restores, and the data progress
    std::set<uint32_t> restore;   // the slots whose server was lost
    absl::Time last_log;
  };
  std::optional<Recovery> recovery_ ABSL_GUARDED_BY(mu_);
  uint64_t recoveries_ ABSL_GUARDED_BY(mu_) = 0;
  json last_recovery_ ABSL_GUARDED_BY(mu_);
};

Status Master::Impl::Start() {
  RETURN_IF_ERROR(options_.Validate());
  const JobConfig& job = options_.job;
  ASSIGN_OR_RETURN(job_spec_, BuildJobSpec(job));
  // Fail fast on missing data; the (slow) scan runs in the background.
  ASSIGN_OR_RETURN(train_files_, ExpandDataPaths(job.data.train, "data.train"));
  if (!job.data.eval.empty()) {
    ASSIGN_OR_RETURN(eval_files_, ExpandDataPaths(job.data.eval, "data.eval"));
  }
  fingerprint_ = ConfigFingerprint(job, train_files_, eval_files_);

  std::error_code error;
  std::filesystem::create_directories(options_.data_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("--data-dir: cannot create ", options_.data_dir, ": ", error.message()));
  }
  const std::filesystem::path dir(options_.data_dir);
  ASSIGN_OR_RETURN(store_, StateStore::Open((dir / "state").string()));
  events_ = std::make_unique<EventLog>((dir / "events.jsonl").string());
  ASSIGN_OR_RETURN(std::optional<MasterSnapshot> snapshot, store_->Load());
  {
    absl::MutexLock lock(&mu_);
    if (snapshot.has_value()) {
      RETURN_IF_ERROR(Restore(*snapshot));
    } else if (options_.resume) {
      return absl::FailedPreconditionError(
          absl::StrCat("--resume: --data-dir ", options_.data_dir,
                       " holds no job to resume; start the job without --resume"));
    } else {
      std::random_device random;
      job_spec_.set_job_id(absl::StrFormat("%08x%08x%08x%08x", random(), random(), random(),
                                           random()));
      master_dirty_ = true;
      events_->Record("job_started", {{"job", job.job.name}, {"job_id", job_spec_.job_id()}});
    }
  }
  RETURN_IF_ERROR(StartServing());
  job_thread_ = std::thread([this] { JobLoop(); });
  return absl::OkStatus();
}

Status Master::Impl::Restore(const MasterSnapshot& snapshot) {
  const proto::MasterRecord& record = snapshot.master;
  if (record.format_version() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data-dir ", options_.data_dir, " holds state of format ", record.format_version(),
        ", which this version cannot read"));
  }
  if (record.config_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data-dir ", options_.data_dir, " holds a job whose ",
        FingerprintDifference(record.config_fingerprint(), fingerprint_),
        " differ from this config; resume it with the same config, or use a fresh --data-dir"));
  }
  last_checkpoint_id_ = record.last_checkpoint_id();
  // Ascending ids: the last one is the newest. A checkpoint interrupted by a
  // crash has no record and is not among them.
  for (const auto& [id, checkpoint] : snapshot.checkpoints) {
    last_checkpoint_ = checkpoint;
    if (id == 0) continue;  // the start of training, not a written one
    kept_checkpoints_.push_back(id);
    last_checkpoint_id_ = std::max(last_checkpoint_id_, id);
    checkpoint_results_[id] = CheckpointJson(checkpoint);
  }
  checkpoints_written_ = kept_checkpoints_.size();
  const Phase phase = static_cast<Phase>(record.phase());
  if (phase == Phase::kFinished || (phase == Phase::kFailed && !record.stopped())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job in --data-dir ", options_.data_dir, " is over (",
        phase == Phase::kFinished ? "finished" : absl::StrCat("failed: ", record.failure()),
        "); see ", (std::filesystem::path(options_.data_dir) / "final_status.json").string(),
        ", or use a fresh --data-dir to train again"));
  }
  if (record.stopped() && !options_.resume) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job in --data-dir ", options_.data_dir, " was stopped (", record.failure(),
        "); continue it from its last checkpoint with eps-master --resume, or use a fresh "
        "--data-dir to train again"));
  }
  resumed_ = true;
  job_spec_.set_job_id(record.job_id());
  next_worker_id_ = record.next_worker_id();
  next_server_id_ = record.next_server_id();
  membership_epoch_ = record.membership_epoch() + 1;
  cluster_map_ = record.cluster_map();
  const absl::Time now = absl::Now();
  for (const proto::ServerInfo& info : record.servers()) {
    ServerEntry& server = servers_[info.id()];
    server.endpoint = info.endpoint();
    // Servers keep running while the master is away: give them a lease.
    server.last_seen = now;
  }
  fenced_.assign(record.fenced_workers().begin(), record.fenced_workers().end());
  records_trained_ = record.records_trained();
  records_retrained_ = record.records_retrained();
  records_malformed_ = record.records_malformed();
  reassignments_ = record.reassignments();
  splits_ = record.splits();
  ledger_.assign(record.ledger().begin(), record.ledger().end());
  if (record.has_eval_auc()) eval_auc_ = record.eval_auc();
  if (record.has_eval_logloss()) eval_logloss_ = record.eval_logloss();
  malformed_examples_.assign(record.malformed_examples().begin(),
                             record.malformed_examples().end());
  epoch_ = record.epoch();
  if (options_.resume) return ResumeFromCheckpoint(snapshot);
  if (phase == Phase::kScanning) {
    // Nothing was handed out yet: scan again.
    LOG(INFO) << "resuming the job in " << options_.data_dir << " before its data was scanned";
    events_->Record("master_resumed", {{"phase", "scanning"}});
    return absl::OkStatus();
  }
  train_data_ = FromRecord(snapshot.train);
  eval_data_ = FromRecord(snapshot.eval);
  data_ready_ = true;
  phase_ = phase;
  std::vector<proto::ShardRecord> shards;
  for (const auto& [id, shard] : snapshot.shards) {
    if (id != shards.size()) return absl::DataLossError("the saved shard ids have a gap");
    shards.push_back(shard);
  }
  const bool eval = phase == Phase::kEvaluating;
  RETURN_IF_ERROR(AdoptPass(shards, eval, epoch_, splits_));
  for (const auto& [key, result] : snapshot.eval_results) {
    eval_results_[key] = result;
    eval_records_ += result.first.size();
  }
  // Workers of the previous master's life are gone for it: fence them
  // before their shards move (their pushes must stop first).
  const std::set<uint32_t> holders = HoldersOfShardsInProgress();
  for (uint32_t holder : holders) FenceWorker(holder, "the master restarted");
  LOG(INFO) << "resuming the job in " << options_.data_dir << ": " << PhaseName(phase_)
            << (eval ? std::string() : absl::StrCat(" epoch ", epoch_ + 1)) << ", "
            << tracker_->done() << "/" << tracker_->num_shards() << " shards done, "
            << records_trained_ << " records trained; " << holders.size()
            << " worker(s) of the previous run must register again";
  events_->Record("master_resumed", {{"phase", PhaseName(phase_)},
                                     {"epoch", epoch_ + 1},
                                     {"shards_done", tracker_->done()},
                                     {"records_trained", records_trained_}});
  if (record.recovering()) {
    // The servers may hold a checkpoint's state already, the saved progress
    // not: restore both again.
    LOG(WARNING) << "the previous master was restoring the job from a checkpoint; doing it again";
    recovery_ = Recovery{.why = "the master restarted during a recovery",
                         .started = absl::Now(),
                         .rollback = true,
                         .restore = {},
                         .last_log = absl::Now()};
    ++recoveries_;
  }
  return absl::OkStatus();
}

Status Master::Impl::ResumeFromCheckpoint(const MasterSnapshot& snapshot) {
  if (!last_checkpoint_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume: the job in --data-dir ", options_.data_dir,
        " has no checkpoint to continue from: it stopped before training started; start it "
        "again without --resume (a fresh --data-dir)"));
  }
  stopped_ = false;
  failure_.clear();
  master_dirty_ = true;
  train_data_ = FromRecord(snapshot.train);
  eval_data_ = FromRecord(snapshot.eval);
  data_ready_ = true;
  phase_ = static_cast<Phase>(last_checkpoint_->master().phase());
  epoch_ = last_checkpoint_->master().epoch();
  // Every worker of the earlier run is fenced: none of its pushes may land
  // on a restored server.
  for (uint32_t id = 0; id < next_worker_id_; ++id) {
    if (!std::binary_search(fenced_.begin(), fenced_.end(), id)) FenceWorker(id, "resumed");
  }
  recovery_ = Recovery{.why = snapshot.master.stopped() ? "resuming the stopped job"
                                                       : "resuming the job (it was not stopped: "
                                                         "a crash or a machine restart)",
                       .started = absl::Now(),
                       .rollback = true,
                       .restore = {},
                       .last_log = absl::Now()};
  ++recoveries_;
  LOG(INFO) << "resuming the job in " << options_.data_dir << " from checkpoint "
            << last_checkpoint_->id() << " (epoch " << epoch_ + 1 << ", "
            << last_checkpoint_->master().records_trained() << " records trained); waiting for its "
            << servers_.size() << " server(s) to register again";
  events_->Record("job_resuming", {{"checkpoint", last_checkpoint_->id()},
                                   {"epoch", epoch_ + 1},
                                   {"records_trained",
                                    last_checkpoint_->master().records_trained()}});
  return absl::OkStatus();
}

Status Master::Impl::StartServing() {
  const JobConfig& job = options_.job;
  RpcServerOptions rpc_options;
  rpc_options.endpoint = absl::StrCat("tcp://", job.master.bind_host, ":", options_.port);
  rpc_options.num_threads = 1;
  rpc_options.max_frames = 2;
  rpc_options.name = "master";
  ASSIGN_OR_RETURN(rpc_, RpcServer::Start(&factory_, rpc_options,
                                          [this](Message& request, Message* reply) {
                                            return Handle(request, reply);
                                          }));
  rpc_endpoint_ = rpc_->endpoint();
  // A wildcard bind is not an address peers can dial: advertise the host name.
  const std::string advertised_host =
      job.master.bind_host == "0.0.0.0" ? Hostname() : job.master.bind_host;
  if (job.master.bind_host == "0.0.0.0") {
    rpc_endpoint_ = absl::StrCat("tcp://", advertised_host, ":",
                                 rpc_endpoint_.substr(rpc_endpoint_.rfind(':') + 1));
  }

  http_.Get("/status", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(StatusJson(), "application/json");
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    absl::MutexLock lock(&mu_);
    response.set_content(MetricsText(), "text/plain; version=0.0.4");
  });
  http_.Get("/", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(StatusPage(options_.job.job.name), "text/html; charset=utf-8");
  });
  // An operator's checkpoint: a coordinated round now (or the one in
  // progress); answers when it is complete or has failed.
  http_.Post("/checkpoint", [this](const httplib::Request&, httplib::Response& response) {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kTraining || JobOver() || recovery_.has_value()) {
      response.status = 409;
      response.set_content(
          DumpJson({{"error", recovery_.has_value() && !JobOver()
                                  ? absl::StrCat("the job is being restored (", recovery_->why,
                                                 "); ask again once it trains")
                                  : absl::StrCat("checkpoints are taken while the job trains; "
                                                 "it is ",
                                                 PhaseName(phase_))}}),
          "application/json");
      return;
    }
    const uint64_t id = round_.has_value() ? round_->id : last_checkpoint_id_ + 1;
    if (!round_.has_value()) checkpoint_requested_ = true;
    changed_.SignalAll();
    const absl::Time deadline = absl::Now() + absl::Minutes(10);
    // A recovery starting meanwhile abandons a round in progress (its
    // result says so) and keeps a requested one from starting.
    while (!checkpoint_results_.contains(id) && !JobOver() &&
           !(recovery_.has_value() && !round_.has_value()) && absl::Now() < deadline) {
      changed_.WaitWithDeadline(&mu_, deadline);
    }
    auto it = checkpoint_results_.find(id);
    json result = it != checkpoint_results_.end() ? it->second
                  : JobOver() ? json{{"checkpoint", id}, {"error", "the job ended first"}}
                  : recovery_.has_value()
                      ? json{{"checkpoint", id},
                             {"error", absl::StrCat("not taken: the job is being restored (",
                                                    recovery_->why, ")")}}
                      : json{{"checkpoint", id},
                             {"error", "not complete after 10 minutes; see the master's log"}};
    response.status = result.contains("error") ? 500 : 200;
    response.set_content(DumpJson(result), "application/json");
  });
  int http_port = static_cast<int>(options_.http_port);
  if (http_port == 0) {
    http_port = http_.bind_to_any_port(job.master.bind_host);
    if (http_port < 0) {
      return absl::UnavailableError(
          absl::StrCat("--http-port: cannot bind an HTTP port on ", job.master.bind_host));
    }
  } else if (!http_.bind_to_port(job.master.bind_host, http_port)) {
    return absl::UnavailableError(absl::StrCat("--http-port: cannot bind ", job.master.bind_host,
                                               ":", http_port, " (in use?)"));
  }
  http_url_ = absl::StrCat("http://", advertised_host, ":", http_port);
  http_thread_ = std::thread([this] {
    http_.listen_after_bind();
    http_returned_.store(true);
  });

  json endpoints = {{"rpc", rpc_endpoint_}, {"http", http_url_}, {"pid", getpid()}};
  RETURN_IF_ERROR(WriteFileAtomically(
      (std::filesystem::path(options_.data_dir) / "master.json").string(), DumpJson(endpoints)));
  LOG(INFO) << "serving RPC on " << rpc_endpoint_ << " and HTTP on " << http_url_
            << "; waiting for " << job.ps.num_servers << " server(s)";
  VLOG(1) << "effective options:\n" << job.DebugString();
  return absl::OkStatus();
}

void Master::Impl::MarkAllShards() {
  if (!tracker_) return;
  for (uint64_t id = 0; id < tracker_->num_shards(); ++id) dirty_shards_.insert(id);
}

proto::MasterRecord Master::Impl::MasterRecordNow() const {
  proto::MasterRecord record;
  record.set_format_version(1);
  record.set_config_fingerprint(fingerprint_);
  record.set_job_id(job_spec_.job_id());
  record.set_phase(static_cast<uint32_t>(phase_));
  record.set_epoch(epoch_);
  record.set_failure(failure_);
  record.set_next_worker_id(next_worker_id_);
  record.set_next_server_id(next_server_id_);
  record.set_membership_epoch(membership_epoch_);
  *record.mutable_cluster_map() = cluster_map_;
  for (const auto& [id, server] : servers_) {
    proto::ServerInfo* info = record.add_servers();
    info->set_id(id);
    info->set_endpoint(server.endpoint);
  }
  for (uint32_t id : fenced_) record.add_fenced_workers(id);
  // A worker alive now is a worker to fence after a restart: its shards'
  // records name it as holder, which is what Restore looks at.
  record.set_records_trained(records_trained_);
  record.set_records_retrained(records_retrained_);
  record.set_records_malformed(records_malformed_);
  record.set_reassignments(reassignments_ + (tracker_ ? tracker_->reassignments() : 0));
  record.set_splits(splits_ + (tracker_ ? tracker_->splits() : 0));
  for (const proto::EpochLedger& entry : ledger_) *record.add_ledger() = entry;
  if (eval_auc_) record.set_eval_auc(*eval_auc_);
  if (eval_logloss_) record.set_eval_logloss(*eval_logloss_);
  record.set_eval_records(eval_records_);
  for (const std::string& example : malformed_examples_) record.add_malformed_examples(example);
  if (tracker_) record.set_shards_in_pass(tracker_->num_shards());
  record.set_last_checkpoint_id(last_checkpoint_id_);
  record.set_stopped(stopped_);
  record.set_recovering(recovery_.has_value());
  return record;
}

void Master::Impl::Persist() {
  absl::MutexLock persist_lock(&persist_mu_);
  StateUpdate update;
  {
    absl::MutexLock lock(&mu_);
    if (!master_dirty_ && dirty_shards_.empty() && !clear_pass_ && !data_dirty_ &&
        pending_eval_.empty() && !pending_checkpoint_.has_value()) {
      return;
    }
    if (pending_checkpoint_.has_value()) update.PutCheckpoint(*std::move(pending_checkpoint_));
    pending_checkpoint_.reset();
    master_dirty_ = false;
    if (clear_pass_) update.ClearPass();
    clear_pass_ = false;
    if (data_dirty_) {
      update.PutDataSet(/*eval=*/false, ToRecord(train_data_));
      update.PutDataSet(/*eval=*/true, ToRecord(eval_data_));
      data_dirty_ = false;
    }
    if (tracker_) {
      for (uint64_t id : dirty_shards_) update.PutShard(id, tracker_->ToRecord(id));
    }
    dirty_shards_.clear();
    update.Append(std::move(pending_eval_));
    pending_eval_ = StateUpdate();
    update.PutMaster(MasterRecordNow());
  }
  // Written before any reply that depends on it goes out.
  Status written = store_->Write(update);
  if (!written.ok()) {
    absl::MutexLock lock(&mu_);
    Fail(absl::StrCat("cannot save the job's state, so acknowledged progress could be lost: ",
                      written.message()));
  }
}

Status Master::Impl::ScanData(DataSet* train, DataSet* eval) {
  const uint64_t shard_records = static_cast<uint64_t>(options_.job.data.shard_records);
  absl::Time last_report = absl::Now();
  auto progress = [&](const char* what, uint64_t done, uint64_t total) {
    const absl::Time now = absl::Now();
    if (now - last_report >= absl::Seconds(options_.job.job.progress_interval_s)) {
      last_report = now;
      LOG(INFO) << "scanning " << what << ": " << absl::StrFormat("%.1f", 100.0 * done / total)
                << "% of " << total / (1 << 20) << " MiB";
    }
    return !stop_scan_.load();
  };
  ASSIGN_OR_RETURN(*train,
                   CutIntoShards(train_files_, shard_records, [&](uint64_t done, uint64_t total) {
                     return progress("data.train", done, total);
                   }));
  if (train->records == 0) {
    return absl::InvalidArgumentError("data.train: the files hold no records");
  }
  LOG(INFO) << "data.train: " << train->records << " records in " << train->files.size()
            << " file(s), " << train->shards.size() << " shards";
  if (!eval_files_.empty()) {
    ASSIGN_OR_RETURN(*eval,
                     CutIntoShards(eval_files_, shard_records, [&](uint64_t done, uint64_t total) {
                       return progress("data.eval", done, total);
                     }));
    LOG(INFO) << "data.eval: " << eval->records << " records in " << eval->files.size()
              << " file(s), " << eval->shards.size() << " shards";
  }
  return absl::OkStatus();
}

void Master::Impl::JobLoop() {
  bool ready;
  {
    absl::MutexLock lock(&mu_);
    ready = data_ready_;
  }
  if (!ready) {
    DataSet train;
    DataSet eval;
    // Into locals, without the lock: the scan may take minutes.
    Status scanned = ScanData(&train, &eval);
    {
      absl::MutexLock lock(&mu_);
      if (!scanned.ok()) {
        Fail(std::string(scanned.message()));  // a no-op after RequestStop
      } else if (!JobOver()) {
        train_data_ = std::move(train);
        eval_data_ = std::move(eval);
        data_ready_ = true;
        data_dirty_ = true;
        MaybePlaceServers();
      }
    }
    Persist();
  }
  RpcChannel fence_channel(&factory_, [] {
    proto::NodeId self;
    self.set_role(proto::ROLE_MASTER);
    return self;
  }());
  // Leases are checked 4 times a heartbeat, so a dead worker's shards are
  // back in the queue within lease + a quarter heartbeat + one fencing call.
  const absl::Duration tick =
      std::min(absl::Milliseconds(100), absl::Milliseconds(options_.job.master.heartbeat_ms) / 4);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      CheckLeases(now);
      LogProgress(now);
      MaybeStartCheckpoint(now);
      if (JobOver() && (EveryoneTold() || now >= done_at_)) break;
    }
    PropagateFences(fence_channel);
    AdvanceCheckpoint(fence_channel);
    AdvanceRecovery(fence_channel);
    Persist();
    Status flushed = events_->Flush();
    if (!flushed.ok()) LOG(WARNING) << flushed;
    absl::MutexLock lock(&mu_);
    changed_.WaitWithTimeout(&mu_, tick);
  }
  Persist();
  Status flushed = events_->Flush();
  if (!flushed.ok()) LOG(WARNING) << flushed;
  absl::MutexLock lock(&mu_);
  threads_done_ = true;
  changed_.SignalAll();
}

void Master::Impl::CheckLeases(absl::Time now) {
  const absl::Duration lease = absl::Milliseconds(options_.job.master.lease_ms);
  for (auto& [id, worker] : workers_) {
    if (worker.state != PeerState::kAlive || now - worker.last_seen <= lease) continue;
    worker.state = PeerState::kDead;
    LOG(WARNING) << "worker[" << id << "] (" << worker.host << " pid " << worker.pid
                 << ") missed its lease (" << options_.job.master.lease_ms << " ms): dead";
    events_->Record("worker_dead", {{"worker", id},
                                    {"host", worker.host},
                                    {"pid", worker.pid},
                                    {"silent_ms", absl::ToInt64Milliseconds(now - worker.last_seen)}});
    // What it pushed but never committed is trained again by others.
    if (worker.records_pushed > worker.records) {
      records_retrained_ += worker.records_pushed - worker.records;
    }
    if (!JobOver()) FenceWorker(id, "lease expired");
  }
  std::vector<uint32_t> lost;
  for (auto& [id, server] : servers_) {
    if (server.state != PeerState::kAlive || now - server.last_seen <= lease) continue;
    server.state = PeerState::kDead;
    ++membership_epoch_;
    master_dirty_ = true;
    LOG(ERROR) << "ps[" << id << "] at " << server.endpoint << " missed its lease ("
               << options_.job.master.lease_ms << " ms): dead";
    events_->Record("server_dead", {{"server", id},
                                    {"endpoint", server.endpoint},
                                    {"silent_ms", absl::ToInt64Milliseconds(now - server.last_seen)}});
    lost.push_back(id);
  }
  for (uint32_t id : lost) {
    if (cluster_map_.version() == 0) {
      // Nothing placed on it yet: another server may simply take its place.
      servers_.erase(id);
      continue;
    }
    StartRecovery(id, absl::StrCat("ps[", id, "] stopped heartbeating"));
  }
}

void Master::Impl::StartRecovery(uint32_t server, const std::string& why) {
  if (JobOver()) return;
  if (!last_checkpoint_.has_value()) {
    // Training has not started: nothing is lost. A server that takes the
    // slot (MaybePlaceServers waits for one) is all it takes.
    LOG(WARNING) << why << " before training started; waiting for a server to take its place";
    return;
  }
  const absl::Time now = absl::Now();
  if (!recovery_.has_value()) {
    recovery_ = Recovery{.why = why,
                         .started = now,
                         .rollback = options_.job.checkpoint.on_server_failure == "rollback",
                         .restore = {},
                         .last_log = now};
    ++recoveries_;
    LOG(WARNING) << why << ": restoring "
                 << (recovery_->rollback ? "the job" : absl::StrCat("ps[", server, "]"))
                 << " from checkpoint " << last_checkpoint_->id() << " (checkpoint.on_server_failure = "
                 << options_.job.checkpoint.on_server_failure
                 << ") once a server takes its place: restart it on its --data-dir, or start an "
                    "eps-server on a fresh --data-dir"
                 << (options_.job.checkpoint.dir.empty() ? " that can read its checkpoint path"
                                                         : "");
    events_->Record("recovery_started", {{"server", server},
                                         {"reason", why},
                                         {"checkpoint", last_checkpoint_->id()},
                                         {"mode", options_.job.checkpoint.on_server_failure}});
    // No worker may push until the servers are restored: all register again.
    for (auto& [id, worker] : workers_) {
      if (worker.state != PeerState::kAlive) continue;
      worker.state = PeerState::kFenced;
      if (worker.records_pushed > worker.records) {
        records_retrained_ += worker.records_pushed - worker.records;
      }
      FenceWorker(id, why);
    }
    // A round still waiting for workers to pause will not see them again.
    if (round_.has_value() && !round_->writing) FailRound(absl::StrCat("abandoned: ", why));
    checkpoint_requested_ = false;
  }
  recovery_->restore.insert(server);
  ++membership_epoch_;
  master_dirty_ = true;
  changed_.SignalAll();
}

void Master::Impl::FenceWorker(uint32_t id, const std::string& why) {
  auto it = std::lower_bound(fenced_.begin(), fenced_.end(), id);
  if (it == fenced_.end() || *it != id) fenced_.insert(it, id);
  ++membership_epoch_;
  master_dirty_ = true;
  auto worker = workers_.find(id);
  awaiting_fence_.emplace(id, worker != workers_.end() ? worker->second.last_seen : absl::Now());
  VLOG(1) << "fencing worker[" << id << "]: " << why;
}

void Master::Impl::PropagateFences(RpcChannel& channel) {
  std::vector<uint32_t> fenced;
  std::vector<std::string> endpoints;
  {
    absl::MutexLock lock(&mu_);
    if (awaiting_fence_.empty() && fences_acknowledged_ == fenced_.size()) return;
    fenced = fenced_;
    for (const auto& [id, server] : servers_) {
      if (server.state == PeerState::kAlive) endpoints.push_back(server.endpoint);
    }
  }
  // No server has seen a push before the cluster map exists; with none
  // alive there is nobody to tell.
  bool all_acknowledged = true;
  if (!endpoints.empty()) {
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(std::max<int64_t>(200, options_.job.master.heartbeat_ms));
    call.max_attempts = 1;
    std::vector<uint64_t> calls;
    for (const std::string& endpoint : endpoints) {
      Message request;
      request.header().set_method(proto::FENCE_WORKERS);
      proto::FenceWorkersRequest* body = request.header().mutable_fence_workers_request();
      for (uint32_t id : fenced) body->add_worker_ids(id);
      calls.push_back(channel.Start(endpoint, std::move(request), call));
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      StatusOr<Message> reply = channel.Wait(calls[i]);
      if (!reply.ok()) {
        all_acknowledged = false;
        VLOG(1) << "fencing at " << endpoints[i] << ": " << reply.status();
      }
    }
  }
  if (!all_acknowledged) return;  // again next tick
  absl::MutexLock lock(&mu_);
  fences_acknowledged_ = std::max(fences_acknowledged_, fenced.size());
  for (auto it = awaiting_fence_.begin(); it != awaiting_fence_.end();) {
    if (!std::binary_search(fenced.begin(), fenced.end(), it->first)) {
      ++it;
      continue;
    }
    events_->Record("worker_fenced", {{"worker", it->first}});
    // A rollback replaces the whole pass: its shards need not move now.
    if (!recovery_.has_value() || !recovery_->rollback) ReleaseShardsOf(it->first, "fenced");
    it = awaiting_fence_.erase(it);
  }
  changed_.SignalAll();
}

void Master::Impl::ReleaseShardsOf(uint32_t id, const char* why) {
  if (!tracker_) return;
  auto worker = workers_.find(id);
  const bool died = worker != workers_.end() && worker->second.state == PeerState::kDead;
  const absl::Duration delay =
      worker != workers_.end() ? absl::Now() - worker->second.last_seen : absl::ZeroDuration();
  for (uint64_t shard : tracker_->Release(id)) {
    MarkShard(shard);
    if (died) worst_reassign_delay_ = std::max(worst_reassign_delay_, delay);
    const ShardTracker::Shard& state = tracker_->shard(shard);
    LOG(INFO) << "shard " << shard << " back to the queue from worker[" << id << "] (" << why
              << "), resuming at line " << state.committed_line;
    events_->Record("shard_reassigned", {{"shard", shard},
                                         {"from_worker", id},
                                         {"reason", why},
                                         {"resume_offset", state.committed},
                                         {"resume_line", state.committed_line},
                                         {"since_last_seen_ms",
                                          died ? absl::ToDoubleMilliseconds(delay) : 0.0}});
  }
}

void Master::Impl::MaybePlaceServers() {
  if (cluster_map_.version() == 0) {
    if (servers_.size() < static_cast<size_t>(options_.job.ps.num_servers)) return;
    std::vector<proto::ServerInfo> infos;
    for (const auto& [id, server] : servers_) {
      proto::ServerInfo info;
      info.set_id(id);
      info.set_endpoint(server.endpoint);
      infos.push_back(info);
    }
    cluster_map_ = MakeClusterMap(/*version=*/1, job_spec_.num_partitions(), infos);
    master_dirty_ = true;
    LOG(INFO) << "placed " << job_spec_.num_partitions() << " partitions on " << infos.size()
              << " server(s) (cluster map v1)";
  }
  // Placement and the data scan finish in either order (servers usually
  // register while a large data set is still being scanned); training
  // starts on whichever comes second.
  bool all_alive = true;
  for (const auto& [id, server] : servers_) all_alive &= server.state == PeerState::kAlive;
  if (data_ready_ && phase_ == Phase::kScanning && all_alive) StartEpoch(0);
}

std::vector<uint32_t> Master::Impl::EpochOrder(uint32_t epoch, size_t shards) const {
  std::vector<uint32_t> order(shards);
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(Mix64(static_cast<uint64_t>(options_.job.job.seed) * 1000003u + epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

proto::EpochLedger& Master::Impl::Ledger(uint32_t epoch) {
  while (ledger_.size() <= epoch) {
    proto::EpochLedger entry;
    entry.set_epoch(static_cast<uint32_t>(ledger_.size()) + 1);
    entry.set_records_expected(train_data_.records);
    ledger_.push_back(entry);
  }
  return ledger_[epoch];
}

void Master::Impl::StartEpoch(uint32_t epoch) {
  if (tracker_) {
    reassignments_ += tracker_->reassignments();
    splits_ += tracker_->splits();
  }
  epoch_ = epoch;
  phase_ = Phase::kTraining;
  tracker_ = std::make_unique<ShardTracker>(train_data_, EpochOrder(epoch, train_data_.shards.size()));
  Ledger(epoch);
  clear_pass_ = true;
  dirty_shards_.clear();
  MarkAllShards();
  if (epoch == 0 && !last_checkpoint_.has_value()) {
    // Checkpoint 0: nothing trained, every server empty.
    proto::CheckpointRecord start;
    start.set_id(0);
    *start.mutable_master() = MasterRecordNow();
    for (uint64_t shard = 0; shard < tracker_->num_shards(); ++shard) {
      *start.add_shards() = tracker_->ToRecord(shard);
    }
    start.set_unix_ms(absl::ToUnixMillis(absl::Now()));
    last_checkpoint_ = start;
    pending_checkpoint_ = std::move(start);
  }
  LOG(INFO) << "epoch " << epoch + 1 << "/" << options_.job.job.epochs << ": "
            << train_data_.shards.size() << " shards, " << train_data_.records << " records";
  events_->Record("epoch_started", {{"epoch", epoch + 1}, {"shards", train_data_.shards.size()}});
}

void Master::Impl::StartEvaluation() {
  reassignments_ += tracker_->reassignments();
  splits_ += tracker_->splits();
  phase_ = Phase::kEvaluating;
  std::vector<uint32_t> order(eval_data_.shards.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  tracker_ = std::make_unique<ShardTracker>(eval_data_, order);
  eval_results_.clear();
  clear_pass_ = true;
  dirty_shards_.clear();
  MarkAllShards();
  LOG(INFO) << "evaluating on " << eval_data_.records << " records (" << eval_data_.shards.size()
            << " shards)";
  events_->Record("evaluation_started", {{"shards", eval_data_.shards.size()}});
}

bool Master::Impl::PassIsOver(bool eval, uint32_t epoch) const {
  switch (phase_) {
    case Phase::kTraining:
      return !eval && epoch < epoch_;
    case Phase::kEvaluating:
      return !eval && epoch <= epoch_;
    case Phase::kFinished:
      // epoch_ stays at the last epoch, which the evaluation also carries.
      return epoch <= epoch_ && (!eval || eval_auc_.has_value());
    case Phase::kScanning:
    case Phase::kFailed:
      return false;
  }
  return false;
}

void Master::Impl::AdvanceIfPassDone() {
  if (!tracker_ || !tracker_->finished()) return;
  if (phase_ == Phase::kTraining) {
    const proto::EpochLedger& entry = Ledger(epoch_);
    const double loss = entry.records_committed() > 0
                            ? entry.loss_sum() / static_cast<double>(entry.records_committed())
                            : 0.0;
    LOG(INFO) << "epoch " << epoch_ + 1 << " done: " << entry.lines_committed() << " of "
              << entry.records_expected() << " lines committed once each, train loss "
              << absl::StrFormat("%.5f", loss);
    events_->Record("epoch_finished", {{"epoch", epoch_ + 1},
                                       {"lines_committed", entry.lines_committed()},
                                       {"lines_expected", entry.records_expected()},
                                       {"train_loss", loss}});
    if (epoch_ + 1 < static_cast<uint32_t>(options_.job.job.epochs)) {
      StartEpoch(epoch_ + 1);
    } else if (!eval_data_.shards.empty()) {
      StartEvaluation();
    } else {
      Finish();
    }
    return;
  }
  if (phase_ == Phase::kEvaluating) {
    std::vector<float> labels;
    std::vector<float> predictions;
    labels.reserve(eval_records_);
    predictions.reserve(eval_records_);
    for (const auto& [key, result] : eval_results_) {
      labels.insert(labels.end(), result.first.begin(), result.first.end());
      predictions.insert(predictions.end(), result.second.begin(), result.second.end());
    }
    eval_auc_ = ComputeAuc(predictions, labels);
    eval_logloss_ = ComputeLogLoss(predictions, labels);
    LOG(INFO) << "evaluation over " << labels.size() << " records: AUC "
              << absl::StrFormat("%.5f", *eval_auc_) << ", log loss "
              << absl::StrFormat("%.5f", *eval_logloss_);
    events_->Record("evaluation_finished", {{"records", labels.size()},
                                            {"eval_auc", *eval_auc_},
                                            {"eval_logloss", *eval_logloss_}});
    Finish();
  }
}

void Master::Impl::WriteFinalStatus() {
  // Under mu_: a peer told to exit must find the file in place.
  const std::string path =
      (std::filesystem::path(options_.data_dir) / "final_status.json").string();
  Status written = WriteFileAtomically(path, DumpJson(StatusDocument()));
  if (!written.ok()) LOG(ERROR) << written;
}

void Master::Impl::Finish() {
  if (tracker_) {
    reassignments_ += tracker_->reassignments();
    splits_ += tracker_->splits();
  }
  phase_ = Phase::kFinished;
  master_dirty_ = true;
  tracker_.reset();
  done_at_ = ShutdownDeadline();
  WriteFinalStatus();
  LOG(INFO) << "job finished in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - started_, absl::Milliseconds(100)))
            << ": " << records_trained_ << " records trained"
            << (eval_auc_ ? absl::StrFormat(", eval AUC %.5f, eval log loss %.5f", *eval_auc_,
                                            *eval_logloss_)
                          : std::string())
            << "; final status in "
            << (std::filesystem::path(options_.data_dir) / "final_status.json").string();
  events_->Record("job_finished", {{"records_trained", records_trained_}});
  changed_.SignalAll();
}

void Master::Impl::Fail(const std::string& reason) {
  if (JobOver()) return;
  if (tracker_) {
    reassignments_ += tracker_->reassignments();
    splits_ += tracker_->splits();
  }
  phase_ = Phase::kFailed;
  master_dirty_ = true;
  failure_ = reason;
  tracker_.reset();
  done_at_ = ShutdownDeadline();
  LOG(ERROR) << "job failed: " << reason;
  events_->Record("job_failed", {{"error", reason}});
  WriteFinalStatus();
  changed_.SignalAll();
}

bool Master::Impl::EveryoneTold() const {
  for (const auto& [id, worker] : workers_) {
    if (worker.state == PeerState::kAlive && !worker.told_to_exit) return false;
  }
  for (const auto& [id, server] : servers_) {
    if (server.state == PeerState::kAlive && !server.told_to_exit) return false;
  }
  return true;
}

absl::Time Master::Impl::ShutdownDeadline() const {
  // The job loop ends once every live peer heard that the job is over; a
  // peer that stops heartbeating instead loses its lease and no longer
  // counts. This bound only guards against a peer that heartbeats without
  // ever hearing (which should not happen).
  return absl::Now() + 3 * absl::Milliseconds(options_.job.master.lease_ms) + absl::Seconds(10);
}

uint32_t Master::Impl::RetryAfterMs() const {
  // Well within a heartbeat, so a shard freed by a death is picked up
  // within lease + one heartbeat.
  return static_cast<uint32_t>(
      std::clamp<int64_t>(options_.job.master.heartbeat_ms / 4, 5, 200));
}

std::optional<double> Master::Impl::EtaSeconds() const {
  if (!tracker_ || records_per_s_ <= 0 || JobOver()) return std::nullopt;
  const bool eval = phase_ == Phase::kEvaluating;
  const DataSet& data = eval ? eval_data_ : train_data_;
  double left = static_cast<double>(data.records - std::min(data.records, tracker_->committed_records()));
  if (!eval) {
    const uint32_t later_epochs = static_cast<uint32_t>(options_.job.job.epochs) - epoch_ - 1;
    left += static_cast<double>(later_epochs) * static_cast<double>(train_data_.records) +
            static_cast<double>(eval_data_.records);
  }
  return left / records_per_s_;
}

std::optional<double> Master::Impl::RunningLoss() const {
  if (phase_ != Phase::kTraining || epoch_ >= ledger_.size() ||
      ledger_[epoch_].records_committed() == 0) {
    return std::nullopt;
  }
  return ledger_[epoch_].loss_sum() / static_cast<double>(ledger_[epoch_].records_committed());
}

void Master::Impl::LogProgress(absl::Time now) {
  const absl::Duration interval = absl::Seconds(options_.job.job.progress_interval_s);
  if (now - last_progress_ < interval) return;
  const double seconds = absl::ToDoubleSeconds(now - last_progress_);
  // Every commit applied (training and evaluation; a rollback undoes none).
  records_per_s_ =
      static_cast<double>(records_committed_total_ - records_at_last_progress_) / seconds;
  last_progress_ = now;
  records_at_last_progress_ = records_committed_total_;
  if (JobOver()) return;
  int alive_workers = 0;
  for (const auto& [id, worker] : workers_) alive_workers += worker.state == PeerState::kAlive;
  const DataSet& data = phase_ == Phase::kEvaluating ? eval_data_ : train_data_;
  const double fraction =
      tracker_ ? static_cast<double>(tracker_->committed_records()) /
                     static_cast<double>(std::max<uint64_t>(1, data.records))
               : 0.0;
  const std::optional<double> eta = EtaSeconds();
  const std::optional<double> loss = RunningLoss();
  // The history behind the status page's chart and scripts/plot_run.py.
  json sample = {{"time", absl::ToDoubleSeconds(now - absl::UnixEpoch())},
                 {"elapsed_s", absl::ToDoubleSeconds(now - started_)},
                 {"phase", PhaseName(phase_)},
                 {"epoch", epoch_ + 1},
                 {"records_trained", records_trained_},
                 {"records_per_s", records_per_s_},
                 {"train_loss", NullableNumber(loss)},
                 {"workers", alive_workers},
                 {"pass_fraction", fraction},
                 {"eta_s", NullableNumber(eta)}};
  history_.push_back(sample);
  while (history_.size() > kHistorySamples) history_.pop_front();
  events_->Record("progress", std::move(sample));
  if (!tracker_) {
    LOG(INFO) << PhaseName(phase_) << ": " << servers_.size() << "/"
              << options_.job.ps.num_servers << " server(s), " << alive_workers
              << " worker(s)";
    return;
  }
  LOG(INFO) << (phase_ == Phase::kEvaluating
                    ? std::string("eval")
                    : absl::StrCat("epoch ", epoch_ + 1, "/", options_.job.job.epochs))
            << ": " << absl::StrFormat("%.1f", 100 * fraction) << "% (" << tracker_->done()
            << "/" << tracker_->num_shards() << " shards done, " << tracker_->doing()
            << " in progress), " << absl::StrFormat("%.0f", records_per_s_) << " records/s, "
            << alive_workers << " worker(s), loss "
            << (loss ? absl::StrFormat("%.5f", *loss) : std::string("n/a")) << ", ETA "
            << (eta ? absl::FormatDuration(absl::Seconds(static_cast<int64_t>(*eta)))
                    : std::string("?"));
}

StatusOr<WorkerEntry*> Master::Impl::LiveWorker(const Message& request) {
  const proto::NodeId& sender = request.header().sender();
  if (sender.role() != proto::ROLE_WORKER) {
    return absl::InvalidArgumentError("only workers may call this");
  }
  auto it = workers_.find(sender.id());
  if (it != workers_.end() && it->second.state == PeerState::kFenced) {
    return ErrorWithReason(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("worker ", sender.id(), " is fenced: a parameter server was lost",
                     recovery_.has_value() ? absl::StrCat(" (", recovery_->why, ")") : "",
                     " and the job is restored from a checkpoint; it must register again"),
        proto::FENCED);
  }
  if (it == workers_.end() || it->second.state != PeerState::kAlive) {
    return ErrorWithReason(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("worker ", sender.id(),
                     " is fenced (its lease expired, it left, or the master restarted); "
                     "it must register again"),
        proto::FENCED);
  }
  return &it->second;
}

Status Master::Impl::Handle(Message& request, Message* reply) {
  if (request.num_frames() > 0 && request.header().method() != proto::COMMIT_PROGRESS) {
    return absl::InvalidArgumentError(absl::StrCat(proto::Method_Name(request.header().method()),
                                                   " takes no bulk frames"));
  }
  Status status;
  switch (request.header().method()) {
    case proto::REGISTER_SERVER: status = HandleRegisterServer(request, reply); break;
    case proto::REGISTER_WORKER: status = HandleRegisterWorker(request, reply); break;
    case proto::HEARTBEAT: status = HandleHeartbeat(request, reply); break;
    case proto::GET_CLUSTER_MAP: status = HandleGetClusterMap(request, reply); break;
    case proto::GET_SHARD: status = HandleGetShard(request, reply); break;
    case proto::COMMIT_PROGRESS: status = HandleCommit(request, reply); break;
    case proto::SPLIT_SHARD: status = HandleSplitShard(request, reply); break;
    case proto::DEREGISTER: status = HandleDeregister(request, reply); break;
    default:
      return absl::UnimplementedError(absl::StrCat(
          "the master does not serve ", proto::Method_Name(request.header().method())));
  }
  // What the reply acknowledges is on disk before the reply leaves.
  Persist();
  return status;
}

Status Master::Impl::HandleRegisterServer(const Message& request, Message* reply) {
  if (!request.header().has_register_server_request()) {
    return absl::InvalidArgumentError("REGISTER_SERVER without its body");
  }
  const proto::RegisterServerRequest& body = request.header().register_server_request();
  if (!ParseTcpEndpoint(body.endpoint()).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad server endpoint '", body.endpoint(), "'"));
  }
  const std::string this_job = absl::StrCat(job_spec_.job_id(), " ", job_spec_.name());
  if (!body.stored_job().empty() && body.stored_job() != this_job) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the server's --data-dir holds the parameters of job ", body.stored_job(),
        ", not of this job (", this_job, "); give it a fresh --data-dir"));
  }
  absl::MutexLock lock(&mu_);
  if (JobOver()) {
    return absl::FailedPreconditionError("the job is over");
  }
  auto answer = [&](uint32_t id) {
    reply->header().mutable_register_server_reply()->set_server_id(id);
    *reply->header().mutable_register_server_reply()->mutable_job() = job_spec_;
    return absl::OkStatus();
  };
  for (auto& [id, server] : servers_) {
    if (server.endpoint == body.endpoint() && server.pid == body.pid() &&
        server.state == PeerState::kAlive && server.seen) {
      return answer(id);  // a retried registration: answer the same
    }
  }
  const absl::Time now = absl::Now();
  std::optional<uint32_t> slot;
  bool restarted = false;
  if (body.has_stored_server_id()) {
    // A server restarted on its --data-dir takes its own slot back.
    slot = body.stored_server_id();
    auto it = servers_.find(*slot);
    if (it == servers_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the server's --data-dir says it was ps[", *slot, "] of this job, which has no such "
          "server; give it a fresh --data-dir"));
    }
    if (it->second.state == PeerState::kAlive) {
      // A new process (a running server never registers again), back
      // before its lease ran out or after a master restart: what it held
      // since its last flush is gone all the same.
      it->second.state = PeerState::kDead;
      restarted = true;
      LOG(ERROR) << "ps[" << *slot << "] restarted (pid " << it->second.pid << " -> " << body.pid()
                 << "): its parameters since the last checkpoint are lost";
      events_->Record("server_dead", {{"server", *slot},
                                      {"endpoint", it->second.endpoint},
                                      {"reason", "restarted"}});
      StartRecovery(*slot, absl::StrCat("ps[", *slot, "] restarted"));
      if (JobOver()) return absl::FailedPreconditionError(absl::StrCat("the job failed: ", failure_));
    }
  } else if (cluster_map_.version() == 0 &&
             servers_.size() < static_cast<size_t>(options_.job.ps.num_servers)) {
    slot = next_server_id_++;
  } else {
    // A fresh server takes the place of a dead one.
    for (const auto& [id, server] : servers_) {
      if (server.state != PeerState::kAlive) {
        slot = id;
        break;
      }
    }
    if (!slot.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job already has its ", options_.job.ps.num_servers,
          " server(s) (ps.num_servers), all alive; adding servers to a running job is not "
          "supported yet"));
    }
  }
  const bool replaces = servers_.contains(*slot);
  master_dirty_ = true;
  ServerEntry& server = servers_[*slot];
  server = ServerEntry();
  server.endpoint = body.endpoint();
  server.host = body.hostname();
  server.pid = body.pid();
  server.last_seen = now;
  server.seen = true;
  ++membership_epoch_;
  if (replaces) {
    // The slot's partitions now live at the new endpoint; the new process
    // has not heard of any fenced worker yet.
    for (proto::ServerInfo& info : *cluster_map_.mutable_servers()) {
      if (info.id() == *slot) info.set_endpoint(body.endpoint());
    }
    if (cluster_map_.version() != 0) cluster_map_.set_version(cluster_map_.version() + 1);
    fences_acknowledged_ = 0;
    if (recovery_.has_value()) recovery_->restore.insert(*slot);
    LOG(INFO) << "ps[" << *slot << "] is back: " << body.endpoint() << " (" << body.hostname()
              << " pid " << body.pid() << ", "
              << (body.has_stored_server_id() ? "its own --data-dir" : "a fresh --data-dir") << ")";
  } else {
    LOG(INFO) << "ps[" << *slot << "] registered: " << body.endpoint() << " (" << body.hostname()
              << " pid " << body.pid() << "), " << servers_.size() << "/"
              << options_.job.ps.num_servers;
  }
  events_->Record("server_registered", {{"server", *slot},
                                        {"endpoint", body.endpoint()},
                                        {"host", body.hostname()},
                                        {"replaces", replaces},
                                        {"restarted", restarted},
                                        {"fresh_data_dir", !body.has_stored_server_id()}});
  MaybePlaceServers();
  return answer(*slot);
}

Status Master::Impl::HandleRegisterWorker(const Message& request, Message* reply) {
  if (!request.header().has_register_worker_request()) {
    return absl::InvalidArgumentError("REGISTER_WORKER without its body");
  }
  const proto::RegisterWorkerRequest& body = request.header().register_worker_request();
  absl::MutexLock lock(&mu_);
  if (JobOver()) return absl::FailedPreconditionError("the job is over");
  const uint32_t id = next_worker_id_++;
  master_dirty_ = true;
  WorkerEntry& worker = workers_[id];
  worker.host = body.hostname();
  worker.pid = body.pid();
  worker.device = body.device();
  worker.last_seen = worker.joined = absl::Now();
  ++membership_epoch_;
  LOG(INFO) << "worker[" << id << "] joined (" << body.hostname() << " pid " << body.pid() << ", "
            << body.device() << ")";
  events_->Record("worker_joined", {{"worker", id},
                                    {"host", body.hostname()},
                                    {"pid", body.pid()},
                                    {"device", body.device()}});
  proto::RegisterWorkerReply* out = reply->header().mutable_register_worker_reply();
  out->set_worker_id(id);
  *out->mutable_job() = job_spec_;
  out->set_heartbeat_ms(static_cast<uint32_t>(options_.job.master.heartbeat_ms));
  out->set_lease_ms(static_cast<uint32_t>(options_.job.master.lease_ms));
  return absl::OkStatus();
}

void Master::Impl::MaybeStartCheckpoint(absl::Time now) {
  if (round_.has_value() || recovery_.has_value() || JobOver() || phase_ != Phase::kTraining ||
      cluster_map_.version() == 0) {
    return;
  }
  const absl::Duration interval = absl::Seconds(options_.job.checkpoint.interval_s);
  if (next_checkpoint_ == absl::InfiniteFuture()) next_checkpoint_ = now + interval;
  if (!checkpoint_requested_ && now < next_checkpoint_) return;
  checkpoint_requested_ = false;
  round_ = CheckpointRound{.id = ++last_checkpoint_id_, .started = now};
  master_dirty_ = true;  // last_checkpoint_id_ is in no record yet: see Restore
  VLOG(1) << "checkpoint " << round_->id << ": pausing the workers";
  changed_.SignalAll();
}

std::vector<StatusOr<Message>> Master::Impl::CallServers(
    RpcChannel& channel, const std::vector<std::pair<uint32_t, std::string>>& servers,
    const std::function<Message(uint32_t)>& make, absl::Duration timeout) {
  CallOptions call;
  call.attempt_timeout = timeout;
  call.max_attempts = 1;
  std::vector<uint64_t> calls;
  for (const auto& [id, endpoint] : servers) calls.push_back(channel.Start(endpoint, make(id), call));
  std::vector<std::optional<StatusOr<Message>>> results(servers.size());
  size_t left = servers.size();
  while (left > 0) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (results[i].has_value()) continue;
      results[i] = channel.WaitUntil(calls[i], absl::Now() + absl::Milliseconds(20));
      if (results[i].has_value()) --left;
    }
    if (left == 0) break;
    // Leases run on while servers work (a checkpoint of a large table takes
    // a while): a server that dies meanwhile is not waited for.
    absl::MutexLock lock(&mu_);
    CheckLeases(absl::Now());
    for (size_t i = 0; i < calls.size(); ++i) {
      if (results[i].has_value()) continue;
      auto server = servers_.find(servers[i].first);
      if (server != servers_.end() && server->second.state == PeerState::kAlive &&
          server->second.endpoint == servers[i].second) {
        continue;
      }
      channel.Cancel(calls[i]);
      results[i] = absl::UnavailableError(
          absl::StrCat("ps[", servers[i].first, "] at ", servers[i].second, " died before it answered"));
      --left;
    }
  }
  std::vector<StatusOr<Message>> out;
  for (auto& result : results) out.push_back(*std::move(result));
  return out;
}

std::vector<StatusOr<proto::ServerCheckpoint>> Master::Impl::WriteServerCheckpoints(
    RpcChannel& channel, uint64_t id, const std::vector<uint64_t>& keep,
    const std::vector<std::pair<uint32_t, std::string>>& servers) {
  std::vector<StatusOr<Message>> replies = CallServers(
      channel, servers,
      [&](uint32_t) {
        Message request;
        request.header().set_method(proto::CHECKPOINT);
        proto::CheckpointRequest* body = request.header().mutable_checkpoint_request();
        body->set_checkpoint_id(id);
        for (uint64_t kept : keep) body->add_keep_ids(kept);
        return request;
      },
      absl::Seconds(600));
  std::vector<StatusOr<proto::ServerCheckpoint>> results;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].ok()) {
      results.push_back(Annotate(replies[i].status(), absl::StrCat("ps[", servers[i].first, "]")));
      continue;
    }
    const proto::CheckpointReply& body = replies[i]->header().checkpoint_reply();
    proto::ServerCheckpoint part;
    part.set_server_id(servers[i].first);
    part.set_path(body.path());
    part.set_bytes(body.bytes());
    part.set_duration_ms(body.duration_ms());
    results.push_back(part);
  }
  return results;
}

json Master::Impl::CheckpointJson(const proto::CheckpointRecord& record) const {
  json doc = {{"checkpoint", record.id()},
              {"duration_ms", record.duration_ms()},
              {"pause_ms", record.pause_ms()},
              {"bytes", record.bytes()},
              {"epoch", record.master().epoch() + 1},
              {"records_trained", record.master().records_trained()},
              {"servers", json::array()}};
  for (const proto::ServerCheckpoint& part : record.servers()) {
    doc["servers"].push_back({{"id", part.server_id()},
                              {"path", part.path()},
                              {"bytes", part.bytes()},
                              {"duration_ms", part.duration_ms()}});
  }
  return doc;
}

void Master::Impl::AdvanceCheckpoint(RpcChannel& channel) {
  uint64_t id = 0;
  absl::Time started;
  const absl::Time writing = absl::Now();
  std::vector<std::pair<uint32_t, std::string>> servers;
  std::vector<uint64_t> keep;  // what the servers keep besides this one
  {
    absl::MutexLock lock(&mu_);
    if (!round_.has_value() || round_->writing) return;
    const absl::Time now = absl::Now();
    std::vector<uint32_t> running;  // live workers not paused yet
    for (const auto& [worker_id, worker] : workers_) {
      if (worker.state == PeerState::kAlive && worker.paused_for != round_->id) {
        running.push_back(worker_id);
      }
    }
    if (!running.empty() || !awaiting_fence_.empty()) {
      // A worker finishes the batch in hand first; one that cannot within
      // a lease (a huge batch, a stuck call) makes the round give up.
      const absl::Duration patience = absl::Milliseconds(2 * options_.job.master.lease_ms);
      if (JobOver() || now - round_->started > patience) {
        const std::string why =
            JobOver() ? "the job is over"
            : running.empty()
                ? absl::StrCat("dead workers were not fenced at every server within ",
                               absl::FormatDuration(patience))
                : absl::StrCat("worker(s) ", absl::StrJoin(running, ", "),
                               " did not pause within ", absl::FormatDuration(patience),
                               " (a batch that takes that long? see their logs)");
        FailRound(absl::StrCat("abandoned: ", why));
      }
      return;
    }
    round_->writing = true;
    id = round_->id;
    started = round_->started;
    // The newest checkpoint.keep - 1 complete ones stay with the new one.
    const size_t keep_others = static_cast<size_t>(options_.job.checkpoint.keep) - 1;
    for (size_t i = kept_checkpoints_.size() > keep_others ? kept_checkpoints_.size() - keep_others : 0;
         i < kept_checkpoints_.size(); ++i) {
      keep.push_back(kept_checkpoints_[i]);
    }
    for (const auto& [server_id, server] : servers_) {
      if (server.state == PeerState::kAlive) servers.emplace_back(server_id, server.endpoint);
    }
  }

  // The id is saved before any server uses it, so that a restarted master
  // never starts a round of an id a server may hold a partial copy of.
  Persist();
  // No push is in flight: the servers' state is the ledger's.
  std::vector<StatusOr<proto::ServerCheckpoint>> parts = WriteServerCheckpoints(channel, id, keep, servers);

  StateUpdate update;
  std::string error = servers.empty() ? "no live server" : "";
  proto::CheckpointRecord record;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    record.set_id(id);
    *record.mutable_master() = MasterRecordNow();
    if (tracker_) {
      for (uint64_t shard = 0; shard < tracker_->num_shards(); ++shard) {
        *record.add_shards() = tracker_->ToRecord(shard);
      }
    }
    for (auto& part : parts) {
      if (!part.ok()) {
        absl::StrAppend(&error, error.empty() ? "" : "; ", part.status().message());
        continue;
      }
      record.set_bytes(record.bytes() + part->bytes());
      *record.add_servers() = *std::move(part);
    }
    record.set_unix_ms(absl::ToUnixMillis(now));
    record.set_duration_ms(absl::ToDoubleMilliseconds(now - writing));
    record.set_pause_ms(absl::ToDoubleMilliseconds(now - started));
    if (error.empty()) {
      update.PutCheckpoint(record);
      // The oldest ones beyond checkpoint.keep go with the same write (the
      // list changes below, once the write succeeded).
      const size_t keep = static_cast<size_t>(options_.job.checkpoint.keep);
      for (size_t i = 0; i + keep < kept_checkpoints_.size() + 1; ++i) {
        update.DeleteCheckpoint(kept_checkpoints_[i]);
      }
    }
  }
  // The record makes the checkpoint complete; written before the workers
  // go on, so that what they train next is never part of it.
  if (error.empty()) {
    Status written = store_->Write(update);
    if (!written.ok()) error = absl::StrCat("recording it: ", written.message());
  }

  absl::MutexLock lock(&mu_);
  const json result = CheckpointJson(record);
  if (error.empty()) {
    kept_checkpoints_.push_back(id);
    while (kept_checkpoints_.size() > static_cast<size_t>(options_.job.checkpoint.keep)) {
      kept_checkpoints_.pop_front();
    }
    ++checkpoints_written_;
    last_checkpoint_ = record;
    checkpoint_pause_s_ += record.pause_ms() / 1000;
    checkpoint_results_[id] = result;
    events_->Record("checkpoint", result);
    LOG(INFO) << "checkpoint " << id << ": " << record.servers_size() << " server(s), "
              << record.bytes() << " bytes, workers paused " << record.pause_ms() << " ms";
    round_.reset();
    next_checkpoint_ = absl::Now() + absl::Seconds(options_.job.checkpoint.interval_s);
    changed_.SignalAll();
  } else {
    FailRound(absl::StrCat(error, "; the previous checkpoint stands"));
  }
  while (checkpoint_results_.size() > 16) checkpoint_results_.erase(checkpoint_results_.begin());
}

void Master::Impl::FailRound(const std::string& error) {
  const uint64_t id = round_->id;
  LOG(WARNING) << "checkpoint " << id << " failed: " << error;
  events_->Record("checkpoint_failed", {{"checkpoint", id}, {"error", error}});
  checkpoint_results_[id] = {{"checkpoint", id}, {"error", error}};
  ++checkpoints_failed_;
  round_.reset();
  next_checkpoint_ = absl::Now() + absl::Seconds(options_.job.checkpoint.interval_s);
  changed_.SignalAll();
}

void Master::Impl::AdvanceRecovery(RpcChannel& channel) {
  std::vector<std::pair<uint32_t, std::string>> targets;
  proto::CheckpointRecord checkpoint;
  bool rollback = true;
  {
    absl::MutexLock lock(&mu_);
    if (!recovery_.has_value() || JobOver()) return;
    const absl::Time now = absl::Now();
    std::vector<uint32_t> missing;
    for (const auto& [id, server] : servers_) {
      if (server.state != PeerState::kAlive || !server.seen) missing.push_back(id);
    }
    const bool fencing = !awaiting_fence_.empty() || fences_acknowledged_ < fenced_.size();
    if (!missing.empty() || fencing) {
      if (now - recovery_->last_log >= absl::Seconds(options_.job.job.progress_interval_s)) {
        recovery_->last_log = now;
        LOG(WARNING) << recovery_->why << " "
                     << absl::FormatDuration(absl::Trunc(now - recovery_->started, absl::Seconds(1)))
                     << " ago; "
                     << (missing.empty()
                             ? std::string("fencing the workers at every server")
                             : absl::StrCat("waiting for ps[", absl::StrJoin(missing, "], ps["),
                                            "] (restart each on its --data-dir, or start an "
                                            "eps-server on a fresh --data-dir in its place)"));
      }
      return;
    }
    checkpoint = *last_checkpoint_;
    rollback = recovery_->rollback;
    for (const auto& [id, server] : servers_) {
      if (rollback || recovery_->restore.contains(id)) targets.emplace_back(id, server.endpoint);
    }
  }
  Persist();  // the recovery is on record before any server changes

  std::map<uint32_t, std::string> paths;  // none for checkpoint 0: empty servers
  for (const proto::ServerCheckpoint& part : checkpoint.servers()) {
    paths[part.server_id()] = part.path();
  }
  for (const auto& [id, endpoint] : targets) {
    if (checkpoint.id() != 0 && !paths.contains(id)) {
      absl::MutexLock lock(&mu_);
      FailRecovery(absl::StrCat("checkpoint ", checkpoint.id(), " has no part of ps[", id, "]"));
      return;
    }
  }
  const absl::Time restoring = absl::Now();
  std::vector<StatusOr<Message>> replies = CallServers(
      channel, targets,
      [&](uint32_t id) {
        Message request;
        request.header().set_method(proto::RESTORE);
        proto::RestoreRequest* body = request.header().mutable_restore_request();
        body->set_checkpoint_id(checkpoint.id());
        body->set_path(paths[id]);
        return request;
      },
      absl::Seconds(600));

  {
    absl::MutexLock lock(&mu_);
    if (!recovery_.has_value() || JobOver()) return;
    uint64_t bytes = 0;
    for (size_t i = 0; i < replies.size(); ++i) {
      if (replies[i].ok()) {
        bytes += replies[i]->header().restore_reply().bytes();
        continue;
      }
      const Status& error = replies[i].status();
      auto server = servers_.find(targets[i].first);
      const bool gone = server == servers_.end() || server->second.state != PeerState::kAlive ||
                        server->second.endpoint != targets[i].second;
      // A server still starting, one that died meanwhile or a lost reply:
      // the recovery goes on (restoring again is harmless).
      if (gone || ReasonOf(error) == proto::NOT_READY || absl::IsDeadlineExceeded(error)) {
        VLOG(1) << "restoring ps[" << targets[i].first << "]: " << error << "; trying again";
        return;
      }
      FailRecovery(absl::StrCat("cannot restore ps[", targets[i].first, "] to checkpoint ",
                        checkpoint.id(), ": ", error.message(),
                        paths[targets[i].first].empty()
                            ? ""
                            : absl::StrCat(" (its part is at ", paths[targets[i].first],
                                           "; a replacement server must be able to read it: "
                                           "set checkpoint.dir to shared storage)")));
      return;
    }
    const uint64_t trained_before = records_trained_;
    if (rollback) {
      Status applied = ApplyCheckpoint(checkpoint);
      if (!applied.ok()) {
        FailRecovery(
            absl::StrCat("cannot return to checkpoint ", checkpoint.id(), ": ", applied.message()));
        return;
      }
    }
    const absl::Time now = absl::Now();
    std::vector<uint32_t> restored;
    for (const auto& [id, endpoint] : targets) restored.push_back(id);
    last_recovery_ = {{"reason", recovery_->why},
                      {"checkpoint", checkpoint.id()},
                      {"mode", rollback ? "rollback" : "continue"},
                      {"servers_restored", restored},
                      {"bytes", bytes},
                      {"records_rolled_back", trained_before - records_trained_},
                      {"restore_ms", absl::ToDoubleMilliseconds(now - restoring)},
                      {"took_ms", absl::ToDoubleMilliseconds(now - recovery_->started)}};
    LOG(INFO) << "recovered (" << recovery_->why << "): ps[" << absl::StrJoin(restored, "], ps[")
              << "] restored to checkpoint " << checkpoint.id() << " in "
              << absl::FormatDuration(absl::Trunc(now - restoring, absl::Milliseconds(1)))
              << (rollback ? absl::StrCat(", ", trained_before - records_trained_,
                                          " records to train again")
                           : std::string(", the other servers keep their state"))
              << "; " << absl::FormatDuration(absl::Trunc(now - recovery_->started,
                                                          absl::Milliseconds(100)))
              << " since the failure";
    events_->Record("recovered", last_recovery_);
    recovery_.reset();
    ++membership_epoch_;
    master_dirty_ = true;
    changed_.SignalAll();
  }
  Persist();
}

Status Master::Impl::ApplyCheckpoint(const proto::CheckpointRecord& checkpoint) {
  const proto::MasterRecord& saved = checkpoint.master();
  std::vector<proto::ShardRecord> shards(checkpoint.shards().begin(), checkpoint.shards().end());
  const Phase phase = static_cast<Phase>(saved.phase());
  if (phase != Phase::kTraining) {
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint.id(), " was taken while ",
                                            PhaseName(phase), ", not training"));
  }
  if (tracker_) reassignments_ += tracker_->reassignments();
  RETURN_IF_ERROR(AdoptPass(shards, /*eval=*/false, saved.epoch(), saved.splits()));
  if (records_trained_ > saved.records_trained()) {
    records_retrained_ += records_trained_ - saved.records_trained();
  }
  phase_ = phase;
  epoch_ = saved.epoch();
  records_trained_ = saved.records_trained();
  records_malformed_ = saved.records_malformed();
  malformed_examples_.assign(saved.malformed_examples().begin(), saved.malformed_examples().end());
  ledger_.assign(saved.ledger().begin(), saved.ledger().end());
  eval_auc_.reset();
  eval_logloss_.reset();
  eval_results_.clear();
  eval_records_ = 0;
  pending_eval_ = StateUpdate();
  clear_pass_ = true;
  dirty_shards_.clear();
  MarkAllShards();
  master_dirty_ = true;
  // The shards in progress at the checkpoint go back to the queue from
  // where they were then; their holders are fenced everywhere by now.
  for (uint32_t holder : HoldersOfShardsInProgress()) ReleaseShardsOf(holder, "rolled back");
  return absl::OkStatus();
}

Status Master::Impl::AdoptPass(const std::vector<proto::ShardRecord>& shards, bool eval,
                               uint32_t epoch, uint64_t saved_splits) {
  const DataSet& data = eval ? eval_data_ : train_data_;
  std::vector<uint32_t> order(data.shards.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!eval) order = EpochOrder(epoch, data.shards.size());
  ASSIGN_OR_RETURN(ShardTracker tracker, ShardTracker::FromRecords(shards, order));
  // The saved total includes this pass's splits, which the tracker counts
  // again from its split-off shards: keep only the earlier passes' here.
  if (saved_splits < tracker.splits()) {
    return absl::DataLossError(absl::StrCat("the saved state counts ", saved_splits,
                                            " splits but its pass holds ", tracker.splits(),
                                            " split-off shards"));
  }
  splits_ = saved_splits - tracker.splits();
  tracker_ = std::make_unique<ShardTracker>(std::move(tracker));
  return absl::OkStatus();
}

std::set<uint32_t> Master::Impl::HoldersOfShardsInProgress() const {
  std::set<uint32_t> holders;
  for (uint64_t id = 0; tracker_ && id < tracker_->num_shards(); ++id) {
    const ShardTracker::Shard& shard = tracker_->shard(id);
    if (shard.state == ShardTracker::State::kDoing) holders.insert(shard.holder);
  }
  return holders;
}

Status Master::Impl::HandleHeartbeat(const Message& request, Message* reply) {
  if (!request.header().has_heartbeat_request()) {
    return absl::InvalidArgumentError("HEARTBEAT without its body");
  }
  const proto::NodeId& sender = request.header().sender();
  absl::MutexLock lock(&mu_);
  bool* told = nullptr;
  proto::HeartbeatReply* out = reply->header().mutable_heartbeat_reply();
  if (sender.role() == proto::ROLE_WORKER) {
    ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorker(request));
    const proto::WorkerStats& stats = request.header().heartbeat_request().worker();
    worker->last_seen = absl::Now();
    worker->records_per_s = stats.records_per_s();
    worker->records_pushed = std::max(worker->records_pushed, stats.records_pushed());
    worker->stats = stats;
    const uint64_t paused_for = request.header().heartbeat_request().paused_for_checkpoint();
    if (paused_for != worker->paused_for) {
      worker->paused_for = paused_for;
      changed_.SignalAll();  // the round may proceed
    }
    if (round_.has_value()) out->set_pause_for_checkpoint(round_->id);
    told = &worker->told_to_exit;
    if (tracker_) {
      std::optional<uint64_t> split = tracker_->SplitRequestedOf(sender.id());
      if (split.has_value()) out->set_split_shard(*split);
    }
  } else if (sender.role() == proto::ROLE_SERVER) {
    auto it = servers_.find(sender.id());
    if (it == servers_.end() || it->second.state != PeerState::kAlive) {
      return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                             absl::StrCat("server ", sender.id(), " is not registered"),
                             proto::FENCED);
    }
    const std::string& endpoint = request.header().heartbeat_request().endpoint();
    if (!endpoint.empty() && endpoint != it->second.endpoint) {
      return ErrorWithReason(
          absl::StatusCode::kFailedPrecondition,
          absl::StrCat("ps[", sender.id(), "] is now served at ", it->second.endpoint,
                       "; this server at ", endpoint, " was replaced"),
          proto::FENCED);
    }
    it->second.last_seen = absl::Now();
    if (!it->second.seen) changed_.SignalAll();  // a recovery may proceed
    it->second.seen = true;
    it->second.stats = request.header().heartbeat_request().server();
    told = &it->second.told_to_exit;
  } else {
    return absl::InvalidArgumentError("heartbeat from an unknown role");
  }
  out->set_state(phase_ == Phase::kFinished ? proto::JOB_FINISHED
                 : phase_ == Phase::kFailed ? proto::JOB_FAILED
                                            : proto::JOB_RUNNING);
  out->set_cluster_map_version(cluster_map_.version());
  out->set_membership_epoch(membership_epoch_);
  if (tracker_) {
    const DataSet& data = phase_ == Phase::kEvaluating ? eval_data_ : train_data_;
    out->set_pass_records_left(data.records - std::min(data.records, tracker_->committed_records()));
  }
  out->set_job_records_per_s(records_per_s_);
  if (const std::optional<double> eta = EtaSeconds(); eta.has_value()) out->set_eta_s(*eta);
  if (JobOver()) {
    out->set_shutdown(true);
    *told = true;
    changed_.SignalAll();
  }
  return absl::OkStatus();
}

Status Master::Impl::HandleGetClusterMap(const Message& request, Message* reply) {
  absl::MutexLock lock(&mu_);
  if (recovery_.has_value() && request.header().sender().role() == proto::ROLE_WORKER) {
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           absl::StrCat("the job is being restored (", recovery_->why,
                                        "); training goes on once every server is back"),
                           proto::NOT_READY);
  }
  if (cluster_map_.version() == 0) {
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           absl::StrCat("waiting for parameter servers: ", servers_.size(), " of ",
                                        options_.job.ps.num_servers, " registered"),
                           proto::NOT_READY);
  }
  *reply->header().mutable_get_cluster_map_reply()->mutable_map() = cluster_map_;
  return absl::OkStatus();
}

Status Master::Impl::HandleGetShard(const Message& request, Message* reply) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorker(request));
  const uint32_t worker_id = request.header().sender().id();
  const absl::Time now = absl::Now();
  worker->last_seen = now;
  proto::GetShardReply* out = reply->header().mutable_get_shard_reply();
  if (JobOver()) {
    out->set_action(proto::GetShardReply::FINISHED);
    worker->told_to_exit = true;
    changed_.SignalAll();
    return absl::OkStatus();
  }
  std::optional<ShardTracker::Assignment> assignment;
  // Nothing new starts while the job is restored, or while the servers
  // write a checkpoint (a worker that joined after the pause would push
  // into it).
  const bool hold = recovery_.has_value() || (round_.has_value() && round_->writing);
  if (tracker_ && !hold) assignment = tracker_->Assign(worker_id);
  if (!assignment.has_value()) {
    out->set_action(proto::GetShardReply::WAIT);
    out->set_retry_after_ms(RetryAfterMs());
    if (tracker_ && !hold && tracker_->todo() == 0) {
      // An idle worker and nothing queued: ask the slowest holder to share.
      std::optional<uint64_t> split =
          tracker_->RequestSplit(2 * static_cast<uint64_t>(options_.job.worker.batch_size));
      if (split.has_value()) {
        const ShardTracker::Shard& shard = tracker_->shard(*split);
        VLOG(1) << "asking worker[" << shard.holder << "] to split shard " << *split
                << " for idle worker[" << worker_id << "]";
        events_->Record("split_requested", {{"shard", *split},
                                            {"holder", shard.holder},
                                            {"idle_worker", worker_id},
                                            {"records_left", shard.spec.records -
                                                                 shard.committed_records}});
      }
    }
    return absl::OkStatus();
  }
  MarkShard(assignment->shard_id);
  const bool eval = phase_ == Phase::kEvaluating;
  const DataSet& data = eval ? eval_data_ : train_data_;
  out->set_action(proto::GetShardReply::ASSIGNED);
  proto::ShardAssignment* shard = out->mutable_shard();
  shard->set_shard_id(assignment->shard_id);
  shard->set_epoch(epoch_);
  shard->set_phase(eval ? proto::EVAL : proto::TRAIN);
  shard->set_path(data.files[assignment->spec->file]);
  shard->set_begin(assignment->spec->begin);
  shard->set_end(assignment->spec->end);
  shard->set_start(assignment->start);
  shard->set_start_line(assignment->start_line);
  shard->set_records(assignment->records);
  VLOG(1) << "worker[" << worker_id << "] takes " << (eval ? "eval" : "train") << " shard "
          << assignment->shard_id << " (" << assignment->records << " records from line "
          << assignment->start_line << " of " << shard->path() << ")";
  return absl::OkStatus();
}

Status Master::Impl::HandleCommit(const Message& request, Message* reply) {
  if (!request.header().has_commit_progress_request()) {
    return absl::InvalidArgumentError("COMMIT_PROGRESS without its body");
  }
  const proto::CommitProgressRequest& body = request.header().commit_progress_request();
  const bool eval = body.phase() == proto::EVAL;
  std::span<const float> labels;
  std::span<const float> predictions;
  if (eval) {
    ASSIGN_OR_RETURN(labels, request.Array<float>(0));
    ASSIGN_OR_RETURN(predictions, request.Array<float>(1));
    if (labels.size() != predictions.size() || labels.size() + body.malformed() != body.lines()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval commit carries ", labels.size(), " labels and ", predictions.size(),
                       " predictions for ", body.lines(), " lines (", body.malformed(),
                       " malformed)"));
    }
    // The metrics sort by prediction: NaN would break them, not just skew.
    for (size_t i = 0; i < labels.size(); ++i) {
      if (!(predictions[i] >= 0.0f && predictions[i] <= 1.0f) || !std::isfinite(labels[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "eval commit record ", i, " has prediction ", predictions[i], " and label ", labels[i],
            "; predictions must be probabilities in [0, 1], labels finite"));
      }
    }
  } else if (request.num_frames() != 0) {
    return absl::InvalidArgumentError("a TRAIN commit carries no frames");
  }
  if (body.malformed() > body.lines()) {
    return absl::InvalidArgumentError("more malformed lines than lines");
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorker(request));
  worker->last_seen = absl::Now();
  const bool current_pass = tracker_ != nullptr && body.epoch() == epoch_ &&
                            (eval ? phase_ == Phase::kEvaluating : phase_ == Phase::kTraining);
  if (!current_pass && PassIsOver(eval, body.epoch())) {
    // Every shard of a finished pass is committed to its end, so a commit
    // for one can only repeat an applied one: typically the pass's last
    // commit, resent because its reply was late. Acknowledge it like the
    // tracker acknowledges any repeat, so the worker carries on.
    const DataSet& data = eval ? eval_data_ : train_data_;
    // Shards split off stragglers have ids past the scan's; their ranges lie
    // within the scan's files, which is all that can be checked now.
    if (body.shard_id() < data.shards.size()) {
      const ShardSpec& spec = data.shards[body.shard_id()];
      if (body.begin_offset() < spec.begin || body.begin_offset() > body.end_offset() ||
          body.end_offset() > spec.end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "commit [", body.begin_offset(), ", ", body.end_offset(), ") is outside shard ",
            body.shard_id(), " [", spec.begin, ", ", spec.end, ")"));
      }
    }
    reply->header().mutable_commit_progress_reply()->set_applied(false);
    return absl::OkStatus();
  }
  if (!current_pass) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit for ", eval ? "evaluation" : absl::StrCat("epoch ", body.epoch() + 1),
                     " but the job is ", PhaseName(phase_),
                     phase_ == Phase::kTraining ? absl::StrCat(" epoch ", epoch_ + 1) : ""));
  }
  const uint32_t worker_id = request.header().sender().id();
  ASSIGN_OR_RETURN(ShardTracker::CommitResult result,
                   tracker_->Commit(worker_id, body.shard_id(), body.begin_offset(),
                                    body.end_offset(), body.lines()));
  const bool applied = result == ShardTracker::CommitResult::kApplied;
  proto::CommitProgressReply* out = reply->header().mutable_commit_progress_reply();
  out->set_applied(applied);
  if (round_.has_value()) out->set_pause_for_checkpoint(round_->id);
  std::optional<uint64_t> split = tracker_->SplitRequestedOf(worker_id);
  if (split.has_value()) out->set_split_shard(*split);
  if (!applied) return absl::OkStatus();

  MarkShard(body.shard_id());
  const uint64_t valid = body.lines() - body.malformed();
  records_committed_total_ += valid;
  records_malformed_ += body.malformed();
  for (const std::string& example : body.malformed_examples()) {
    if (malformed_examples_.size() < 20) malformed_examples_.push_back(example);
  }
  if (eval) {
    auto& [saved_labels, saved_predictions] =
        eval_results_[{body.shard_id(), body.begin_offset()}];
    saved_labels.assign(labels.begin(), labels.end());
    saved_predictions.assign(predictions.begin(), predictions.end());
    pending_eval_.PutEvalResult(body.shard_id(), body.begin_offset(), saved_labels,
                                saved_predictions);
    eval_records_ += valid;
  } else {
    records_trained_ += valid;
    worker->records += valid;
    proto::EpochLedger& entry = Ledger(epoch_);
    entry.set_lines_committed(entry.lines_committed() + body.lines());
    entry.set_records_committed(entry.records_committed() + valid);
    entry.set_malformed(entry.malformed() + body.malformed());
    entry.set_loss_sum(entry.loss_sum() + body.loss_sum());
  }
  AdvanceIfPassDone();
  return absl::OkStatus();
}

Status Master::Impl::HandleSplitShard(const Message& request, Message* reply) {
  if (!request.header().has_split_shard_request()) {
    return absl::InvalidArgumentError("SPLIT_SHARD without its body");
  }
  const proto::SplitShardRequest& body = request.header().split_shard_request();
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorker(request));
  worker->last_seen = absl::Now();
  const bool eval = body.phase() == proto::EVAL;
  proto::SplitShardReply* out = reply->header().mutable_split_shard_reply();
  const bool current_pass = tracker_ != nullptr && body.epoch() == epoch_ &&
                            (eval ? phase_ == Phase::kEvaluating : phase_ == Phase::kTraining);
  if (!current_pass) {
    out->set_accepted(false);
    return absl::OkStatus();
  }
  const uint32_t worker_id = request.header().sender().id();
  // A retried split (its reply was lost) gets the first one's answer.
  for (uint64_t id = 0; id < tracker_->num_shards(); ++id) {
    const ShardTracker::Shard& part = tracker_->shard(id);
    if (part.split_from == body.shard_id() && part.spec.begin == body.split_offset() &&
        body.shard_id() < tracker_->num_shards() &&
        tracker_->shard(body.shard_id()).holder == worker_id) {
      out->set_accepted(true);
      out->set_new_shard_id(id);
      return absl::OkStatus();
    }
  }
  StatusOr<uint64_t> child =
      tracker_->Split(worker_id, body.shard_id(), body.split_offset(), body.split_line());
  if (!child.ok()) {
    if (absl::IsFailedPrecondition(child.status())) {
      out->set_accepted(false);  // no longer wanted (or no longer its shard)
      return absl::OkStatus();
    }
    return child.status();
  }
  MarkShard(body.shard_id());
  MarkShard(*child);
  const ShardTracker::Shard& part = tracker_->shard(*child);
  LOG(INFO) << "split shard " << body.shard_id() << " of worker[" << worker_id << "] at line "
            << body.split_line() << ": " << part.spec.records << " records go to shard " << *child;
  events_->Record("shard_split", {{"shard", body.shard_id()},
                                  {"new_shard", *child},
                                  {"worker", worker_id},
                                  {"split_offset", body.split_offset()},
                                  {"split_line", body.split_line()},
                                  {"records_moved", part.spec.records}});
  out->set_accepted(true);
  out->set_new_shard_id(*child);
  changed_.SignalAll();
  return absl::OkStatus();
}

Status Master::Impl::HandleDeregister(const Message& request, Message* reply) {
  absl::MutexLock lock(&mu_);
  const proto::NodeId& sender = request.header().sender();
  if (sender.role() != proto::ROLE_WORKER) {
    return absl::InvalidArgumentError("only workers deregister");
  }
  auto it = workers_.find(sender.id());
  if (it == workers_.end()) return absl::NotFoundError("unknown worker");
  if (it->second.state == PeerState::kAlive) {
    it->second.state = PeerState::kLeft;
    master_dirty_ = true;
    LOG(INFO) << "worker[" << sender.id() << "] left";
    events_->Record("worker_left", {{"worker", sender.id()}, {"records", it->second.records}});
    // It committed what it pushed and stops pushing: its shards move now.
    // Its id is still fenced, so nothing it might send later lands.
    auto fenced = std::lower_bound(fenced_.begin(), fenced_.end(), sender.id());
    if (fenced == fenced_.end() || *fenced != sender.id()) fenced_.insert(fenced, sender.id());
    ++membership_epoch_;
    ReleaseShardsOf(sender.id(), "left");
  }
  reply->header().mutable_deregister_reply();
  changed_.SignalAll();
  return absl::OkStatus();
}

json Master::Impl::StatusDocument() const {
  json doc;
  doc["job"] = options_.job.job.name;
  doc["state"] = phase_ == Phase::kFinished ? "finished"
                 : phase_ == Phase::kFailed ? "failed"
                                            : "running";
  doc["phase"] = PhaseName(phase_);
  if (!failure_.empty()) doc["error"] = failure_;
  doc["epoch"] = epoch_ + 1;
  doc["epochs"] = options_.job.job.epochs;
  doc["elapsed_s"] = absl::ToDoubleSeconds(absl::Now() - started_);
  doc["resumed"] = resumed_;
  json shards = {{"total", 0}, {"todo", 0}, {"doing", 0}, {"done", 0}};
  if (tracker_) {
    shards = {{"total", tracker_->num_shards()},
              {"todo", tracker_->todo()},
              {"doing", tracker_->doing()},
              {"done", tracker_->done()}};
  } else if (phase_ == Phase::kFinished) {
    const uint64_t total = train_data_.shards.size();
    shards = {{"total", total}, {"todo", 0}, {"doing", 0}, {"done", total}};
  }
  doc["shards"] = shards;
  doc["records_trained"] = records_trained_;
  doc["records_retrained"] = records_retrained_;
  doc["records_per_epoch"] = train_data_.records;
  doc["records_per_s"] = records_per_s_;
  doc["eta_s"] = NullableNumber(EtaSeconds());
  doc["history"] = json(std::vector<json>(history_.begin(), history_.end()));
  doc["records_malformed"] = records_malformed_;
  doc["malformed_examples"] = malformed_examples_;
  doc["membership_epoch"] = membership_epoch_;
  doc["reassignments"] = reassignments_ + (tracker_ ? tracker_->reassignments() : 0);
  json checkpoints = {{"written", checkpoints_written_},
                      {"failed", checkpoints_failed_},
                      {"interval_s", options_.job.checkpoint.interval_s},
                      {"pause_s", checkpoint_pause_s_},
                      {"in_progress", round_.has_value() ? json(round_->id) : json(nullptr)},
                      {"last", nullptr}};
  for (auto it = checkpoint_results_.rbegin(); it != checkpoint_results_.rend(); ++it) {
    if (it->second.contains("error")) continue;
    checkpoints["last"] = it->second;
    break;
  }
  doc["checkpoints"] = checkpoints;
  json recovery = {{"in_progress", nullptr},
                   {"recoveries", recoveries_},
                   {"on_server_failure", options_.job.checkpoint.on_server_failure},
                   {"last", last_recovery_.is_null() ? json(nullptr) : last_recovery_}};
  if (recovery_.has_value()) {
    std::vector<uint32_t> waiting_for;
    for (const auto& [id, server] : servers_) {
      if (server.state != PeerState::kAlive || !server.seen) waiting_for.push_back(id);
    }
    recovery["in_progress"] = {
        {"reason", recovery_->why},
        {"checkpoint", last_checkpoint_.has_value() ? json(last_checkpoint_->id()) : json(nullptr)},
        {"waiting_for_servers", waiting_for},
        {"since_s", absl::ToDoubleSeconds(absl::Now() - recovery_->started)}};
  }
  doc["recovery"] = recovery;
  if (stopped_) doc["resumable"] = true;
  doc["splits"] = splits_ + (tracker_ ? tracker_->splits() : 0);
  doc["workers_fenced"] = fenced_.size();
  doc["max_reassign_delay_ms"] = absl::ToDoubleMilliseconds(worst_reassign_delay_);
  doc["cluster_map_version"] = cluster_map_.version();
  json ledger = json::array();
  for (size_t e = 0; e < ledger_.size(); ++e) {
    const proto::EpochLedger& entry = ledger_[e];
    const bool complete = e < epoch_ || phase_ == Phase::kEvaluating || phase_ == Phase::kFinished;
    ledger.push_back({{"epoch", entry.epoch()},
                      {"lines_expected", entry.records_expected()},
                      {"lines_committed", entry.lines_committed()},
                      {"records_committed", entry.records_committed()},
                      {"malformed", entry.malformed()},
                      {"complete", complete},
                      {"exactly_once", complete && entry.lines_committed() == entry.records_expected()}});
  }
  doc["ledger"] = ledger;
  json workers = json::array();
  for (const auto& [id, worker] : workers_) {
    workers.push_back({{"id", id},
                       {"state", PeerStateName(worker.state)},
                       {"host", worker.host},
                       {"pid", worker.pid},
                       {"device", worker.device},
                       {"records", worker.records},
                       {"records_per_s",
                        worker.state == PeerState::kAlive ? worker.records_per_s : 0.0}});
  }
  doc["workers"] = workers;
  json servers = json::array();
  for (const auto& [id, server] : servers_) {
    uint64_t partitions = 0;
    for (uint32_t owner : cluster_map_.partition_owner()) partitions += owner == id;
    servers.push_back({{"id", id},
                       {"state", PeerStateName(server.state)},
                       {"endpoint", server.endpoint},
                       {"partitions", partitions},
                       {"rows", server.stats.rows()},
                       {"memory_bytes", server.stats.bytes()},
                       {"rows_on_disk", server.stats.rows_on_disk()},
                       {"disk_bytes", server.stats.disk_bytes()},
                       {"hit_rate", server.stats.hits() + server.stats.misses() > 0
                                        ? static_cast<double>(server.stats.hits()) /
                                              static_cast<double>(server.stats.hits() +
                                                                  server.stats.misses())
                                        : 1.0},
                       {"evictions", server.stats.evictions()},
                       {"last_flush_ms", server.stats.last_flush_ms()},
                       {"pushes_fenced", server.stats.pushes_fenced()},
                       {"pushes_deduplicated", server.stats.pushes_deduplicated()}});
  }
  doc["servers"] = servers;
  std::optional<double> train_loss;
  json epoch_losses = json::array();
  for (size_t e = 0; e < ledger_.size(); ++e) {
    const bool complete = e < epoch_ || phase_ == Phase::kEvaluating || phase_ == Phase::kFinished;
    if (!complete || ledger_[e].records_committed() == 0) continue;
    train_loss = ledger_[e].loss_sum() / static_cast<double>(ledger_[e].records_committed());
    epoch_losses.push_back(*train_loss);
  }
  doc["metrics"] = {{"train_loss", NullableNumber(train_loss)},
                    {"epoch_loss_so_far", NullableNumber(RunningLoss())},
                    {"epoch_train_loss", epoch_losses},
                    {"eval_auc", NullableNumber(eval_auc_)},
                    {"eval_logloss", NullableNumber(eval_logloss_)},
                    {"eval_records", eval_records_}};
  return doc;
}

std::string Master::Impl::MetricsText() const {
  // Families in a fixed order, each with every series it has: job progress,
  // training quality, membership and shards, per worker, per server,
  // checkpoints and recoveries. README.md "### Metrics" lists them.
  PrometheusWriter out;
  auto gauge = [&out](const char* name, const char* help, double value) {
    out.Family(name, MetricType::kGauge, help);
    out.Sample(value);
  };
  auto counter = [&out](const char* name, const char* help, double value) {
    out.Family(name, MetricType::kCounter, help);
    out.Sample(value);
  };

  // Not "job": Prometheus gives every target a job label of its own.
  out.Family("eps_job_info", MetricType::kGauge, "The job's name and id; always 1.");
  out.Sample({{"name", options_.job.job.name}, {"job_id", job_spec_.job_id()}}, 1);
  out.Family("eps_job_phase", MetricType::kGauge,
             "1 for the job's current phase, 0 for the others.");
  for (Phase phase :
       {Phase::kScanning, Phase::kTraining, Phase::kEvaluating, Phase::kFinished, Phase::kFailed}) {
    out.Sample({{"phase", PhaseName(phase)}}, phase == phase_ ? 1 : 0);
  }
  gauge("eps_job_epoch", "Current training epoch, 1-based.", epoch_ + 1);
  gauge("eps_job_epochs", "Training epochs of the job.",
        static_cast<double>(options_.job.job.epochs));
  double pass_done = phase_ == Phase::kFinished ? 1 : 0;
  if (tracker_) {
    const DataSet& data = phase_ == Phase::kEvaluating ? eval_data_ : train_data_;
    pass_done = static_cast<double>(tracker_->committed_records()) /
                static_cast<double>(std::max<uint64_t>(1, data.records));
  }
  gauge("eps_job_pass_done_ratio",
        "Fraction of the current pass (training epoch or evaluation) committed.", pass_done);
  gauge("eps_job_records_trained",
        "The job's progress: training records committed, each once per epoch, over all epochs. "
        "Falls back when a recovery rolls the job back.",
        static_cast<double>(records_trained_));
  // Counted from the workers' entries, which are never removed: unlike
  // records_trained_, no rollback lowers it.
  uint64_t committed = 0;
  for (const auto& [id, worker] : workers_) committed += worker.records;
  counter("eps_records_trained_total",
          "Training records committed by workers since this master started, including those a "
          "recovery rolled back.",
          static_cast<double>(committed));
  counter("eps_records_retrained_total",
          "Records trained again: pushed by a worker that died before committing them, or rolled "
          "back by a recovery.",
          static_cast<double>(records_retrained_));
  gauge("eps_records_per_second", "Records committed per second over the last progress interval.",
        records_per_s_);

  for (size_t e = ledger_.size(); e-- > 0;) {
    const bool complete = e < epoch_ || phase_ == Phase::kEvaluating || phase_ == Phase::kFinished;
    if (!complete || ledger_[e].records_committed() == 0) continue;
    gauge("eps_train_loss", "Mean train loss of the last finished epoch.",
          ledger_[e].loss_sum() / static_cast<double>(ledger_[e].records_committed()));
    break;
  }
  if (const std::optional<double> loss = RunningLoss(); loss.has_value()) {
    gauge("eps_train_loss_current_epoch", "Mean train loss of the current epoch so far.", *loss);
  }
  if (eval_auc_) gauge("eps_eval_auc", "Final evaluation AUC.", *eval_auc_);
  if (eval_logloss_) gauge("eps_eval_logloss", "Final evaluation log loss.", *eval_logloss_);

  gauge("eps_membership_epoch", "Membership changes so far.",
        static_cast<double>(membership_epoch_));
  uint64_t todo = 0, doing = 0, done = 0;
  if (tracker_) {
    todo = tracker_->todo();
    doing = tracker_->doing();
    done = tracker_->done();
  } else if (phase_ == Phase::kFinished) {
    done = train_data_.shards.size();
  }
  out.Family("eps_shards", MetricType::kGauge, "Shards of the current pass by state.");
  out.Sample({{"state", "todo"}}, static_cast<double>(todo));
  out.Sample({{"state", "doing"}}, static_cast<double>(doing));
  out.Sample({{"state", "done"}}, static_cast<double>(done));
  counter("eps_reassignments_total", "Shards handed back after their worker died or left.",
          static_cast<double>(reassignments_ + (tracker_ ? tracker_->reassignments() : 0)));
  counter("eps_splits_total", "Shards split off a straggler for an idle worker.",
          static_cast<double>(splits_ + (tracker_ ? tracker_->splits() : 0)));
  const PeerState kStates[] = {PeerState::kAlive, PeerState::kDead, PeerState::kLeft,
                               PeerState::kFenced};
  out.Family("eps_workers", MetricType::kGauge, "Workers by state.");
  for (PeerState state : kStates) {
    int n = 0;
    for (const auto& [id, worker] : workers_) n += worker.state == state;
    out.Sample({{"state", PeerStateName(state)}}, n);
  }
  out.Family("eps_servers", MetricType::kGauge, "Parameter servers by state.");
  for (PeerState state : kStates) {
    int n = 0;
    for (const auto& [id, server] : servers_) n += server.state == state;
    out.Sample({{"state", PeerStateName(state)}}, n);
  }

  // Per peer. A gone worker's or server's series keep its last values (its
  // entry stays), so counters and histograms never go back; a server that
  // takes over a slot starts them again, as any restarted process does.
  std::vector<std::pair<std::string, const WorkerEntry*>> workers;
  for (const auto& [id, worker] : workers_) workers.emplace_back(absl::StrCat(id), &worker);
  std::vector<std::pair<std::string, const ServerEntry*>> servers;
  std::map<std::string, uint64_t> partitions;
  for (const auto& [id, server] : servers_) {
    servers.emplace_back(absl::StrCat(id), &server);
    uint64_t owned = 0;
    for (uint32_t owner : cluster_map_.partition_owner()) owned += owner == id;
    partitions[absl::StrCat(id)] = owned;
  }
  // A histogram a peer has not reported (or reported malformed) has no
  // series.
  auto histogram = [&out](const std::string& label, const std::string& id,
                          const proto::Histogram& wire) {
    StatusOr<HistogramSnapshot> snapshot = HistogramFromProto(wire);
    if (snapshot.ok()) out.Histogram({{label, id}}, *snapshot);
  };
  out.Family("eps_worker_records_per_second", MetricType::kGauge,
             "Records a worker trains per second, as it reports; 0 once it is gone.");
  for (const auto& [id, worker] : workers) {
    out.Sample({{"worker", id}}, worker->state == PeerState::kAlive ? worker->records_per_s : 0);
  }
  out.Family("eps_worker_records_committed_total", MetricType::kCounter,
             "Training records the master accepted from a worker.");
  for (const auto& [id, worker] : workers) {
    out.Sample({{"worker", id}}, static_cast<double>(worker->records));
  }
  out.Family("eps_worker_pull_seconds", MetricType::kHistogram,
             "Duration of a worker's pulls as its trainer sees them (all servers, network, "
             "retries).");
  for (const auto& [id, worker] : workers) histogram("worker", id, worker->stats.pull_latency());
  out.Family("eps_worker_push_seconds", MetricType::kHistogram,
             "Duration of a worker's pushes as its trainer sees them (all servers, network, "
             "retries).");
  for (const auto& [id, worker] : workers) histogram("worker", id, worker->stats.push_latency());

  auto per_server = [&out, &servers](const char* name, MetricType type, const char* help,
                                     const std::function<double(const ServerEntry&)>& value) {
    out.Family(name, type, help);
    for (const auto& [id, server] : servers) out.Sample({{"server", id}}, value(*server));
  };
  out.Family("eps_server_partitions", MetricType::kGauge, "Partitions a server owns.");
  for (const auto& [id, owned] : partitions) {
    out.Sample({{"server", id}}, static_cast<double>(owned));
  }
  per_server("eps_server_rows", MetricType::kGauge, "Rows a server holds in memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.rows()); });
  per_server("eps_server_rows_on_disk", MetricType::kGauge,
             "Rows in a server's on-disk store (approximate).",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.rows_on_disk()); });
  per_server("eps_server_memory_bytes", MetricType::kGauge, "Bytes of a server's rows in memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.bytes()); });
  per_server(
      "eps_server_memory_budget_bytes", MetricType::kGauge,
      "A server's memory budget for rows (ps.memory_budget_mb; 0: unlimited).",
      [](const ServerEntry& s) { return static_cast<double>(s.stats.memory_budget_bytes()); });
  per_server("eps_server_disk_bytes", MetricType::kGauge,
             "Bytes of a server's on-disk store (approximate).",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.disk_bytes()); });
  per_server("eps_server_hit_ratio", MetricType::kGauge,
             "Fraction of a server's row lookups served from memory since it started (1 before "
             "any).",
             [](const ServerEntry& s) {
               const uint64_t lookups = s.stats.hits() + s.stats.misses();
               return lookups > 0
                          ? static_cast<double>(s.stats.hits()) / static_cast<double>(lookups)
                          : 1.0;
             });
  per_server("eps_server_row_hits_total", MetricType::kCounter,
             "Row lookups a server served from memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.hits()); });
  per_server("eps_server_row_misses_total", MetricType::kCounter,
             "Row lookups a server read from its store.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.misses()); });
  per_server("eps_server_evictions_total", MetricType::kCounter,
             "Rows a server evicted from memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.evictions()); });
  per_server("eps_server_last_flush_seconds", MetricType::kGauge,
             "Duration of a server's last flush of changed rows to its store.",
             [](const ServerEntry& s) { return s.stats.last_flush_ms() / 1000; });
  per_server("eps_server_pulls_total", MetricType::kCounter, "PULL requests a server applied.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.pulls()); });
  per_server("eps_server_pushes_total", MetricType::kCounter, "PUSH requests a server applied.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.pushes()); });
  per_server("eps_server_pushes_fenced_total", MetricType::kCounter,
             "Pushes a server refused because their worker was fenced.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.pushes_fenced()); });
  per_server(
      "eps_server_pushes_deduplicated_total", MetricType::kCounter,
      "Retried pushes a server acknowledged without applying them again.",
      [](const ServerEntry& s) { return static_cast<double>(s.stats.pushes_deduplicated()); });
  out.Family("eps_server_pull_seconds", MetricType::kHistogram,
             "Time a server takes to answer a PULL, from its arrival to the reply.");
  for (const auto& [id, server] : servers) histogram("server", id, server->stats.pull_latency());
  out.Family("eps_server_push_seconds", MetricType::kHistogram,
             "Time a server takes to answer a PUSH, from its arrival to the reply.");
  for (const auto& [id, server] : servers) histogram("server", id, server->stats.push_latency());

  counter("eps_checkpoints_written_total", "Coordinated checkpoints completed.",
          static_cast<double>(checkpoints_written_));
  counter("eps_checkpoints_failed_total", "Coordinated checkpoints abandoned or failed.",
          static_cast<double>(checkpoints_failed_));
  counter("eps_checkpoint_pause_seconds_total",
          "Time workers spent paused for checkpoints, summed over rounds.", checkpoint_pause_s_);
  // Checkpoint 0 (training starting) is written by nobody: no durations.
  if (last_checkpoint_.has_value() && last_checkpoint_->id() > 0) {
    gauge("eps_checkpoint_last_pause_seconds",
          "How long the last complete checkpoint paused the workers.",
          last_checkpoint_->pause_ms() / 1000);
    gauge("eps_checkpoint_last_duration_seconds",
          "How long the servers took to write the last complete checkpoint.",
          last_checkpoint_->duration_ms() / 1000);
    gauge("eps_checkpoint_last_bytes", "Bytes of the last complete checkpoint.",
          static_cast<double>(last_checkpoint_->bytes()));
    gauge("eps_checkpoint_last_timestamp_seconds",
          "Unix time at which the last complete checkpoint was recorded.",
          static_cast<double>(last_checkpoint_->unix_ms()) / 1000);
  }
  counter("eps_recoveries_total",
          "Recoveries started: restores from the last complete checkpoint after a parameter "
          "server was lost, or to resume a stopped job.",
          static_cast<double>(recoveries_));
  gauge("eps_recovery_in_progress", "1 while the job is being restored after losing a server.",
        recovery_.has_value() ? 1 : 0);
  return out.text();
}

Status Master::Impl::Wait() {
  {
    absl::MutexLock lock(&mu_);
    while (!threads_done_) changed_.Wait(&mu_);
  }
  StopThreads();
  absl::MutexLock lock(&mu_);
  if (phase_ == Phase::kFinished) return absl::OkStatus();
  return absl::AbortedError(failure_);
}

void Master::Impl::RequestStop(const std::string& reason) {
  stop_scan_.store(true);
  {
    absl::MutexLock lock(&mu_);
    if (stop_requested_) return;
    stop_requested_ = true;
    // A job ended by an operator can go on later (--resume); one that is
    // over cannot.
    if (!JobOver()) stopped_ = true;
    Fail(reason);
  }
}

void Master::Impl::StopThreads() {
  if (job_thread_.joinable()) job_thread_.join();
  if (http_thread_.joinable()) {
    // cpp-httplib's stop() does nothing until the listening thread is in its
    // accept loop (is_running()), so a stop right after Start would leave
    // that thread listening forever. The library offers nothing to wait on:
    // poll until the thread is listening or has returned.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!http_.is_running() && !http_returned_.load() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    http_.stop();
    http_thread_.join();
  }
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
