#include "master/master.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/logging.h"
#include "core/message.h"
#include "core/net.h"
#include "core/placement.h"
#include "core/rpc_server.h"
#include "core/socket_factory.h"
#include "httplib.h"
#include "master/data_set.h"
#include "master/job_spec.h"
#include "master/shard_tracker.h"
#include "models/metrics.h"
#include "nlohmann/json.hpp"

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

enum class Phase { kScanning, kTraining, kEvaluating, kFinished, kFailed };

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

enum class PeerState { kAlive, kDead, kLeft };

const char* PeerStateName(PeerState state) {
  switch (state) {
    case PeerState::kAlive: return "alive";
    case PeerState::kDead: return "dead";
    case PeerState::kLeft: return "left";
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
  uint64_t records = 0;  // committed, counted by the master
  double records_per_s = 0;
  bool told_to_exit = false;
};

struct ServerEntry {
  std::string endpoint;
  std::string host;
  uint32_t pid = 0;
  PeerState state = PeerState::kAlive;
  absl::Time last_seen;
  proto::ServerStats stats;
  bool told_to_exit = false;
};

// Writes `text` to `path` atomically (temporary file, then rename).
Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      return absl::UnavailableError(absl::StrCat("cannot write ", temp, ": ", std::strerror(errno)));
    }
  }
  std::error_code error;
  std::filesystem::rename(temp, path, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", temp, " to ", path, ": ",
                                               error.message()));
  }
  return absl::OkStatus();
}

json NullableNumber(const std::optional<double>& value) {
  return value.has_value() ? json(*value) : json(nullptr);
}

// A sample value in the Prometheus text format: the shortest text that
// reads back as `value` (absl::StrCat keeps six digits, which turns
// 1234567 records into 1.23457e+06), and NaN, +Inf, -Inf spelled its way.
std::string PrometheusNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  CHECK(result.ec == std::errc());
  return std::string(buffer, result.ptr);
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

 private:
  Status Handle(Message& request, Message* reply);
  Status HandleRegisterServer(const Message& request, Message* reply);
  Status HandleRegisterWorker(const Message& request, Message* reply);
  Status HandleHeartbeat(const Message& request, Message* reply);
  Status HandleGetClusterMap(const Message& request, Message* reply);
  Status HandleGetShard(const Message& request, Message* reply);
  Status HandleCommit(const Message& request, Message* reply);
  Status HandleDeregister(const Message& request, Message* reply);

  // The worker sending `request`, if it is registered and alive.
  StatusOr<WorkerEntry*> LiveWorker(const Message& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Background: scans the data, then watches leases and progress.
  void JobLoop();
  // Scans data.train and data.eval into `train` and `eval`; kCancelled
  // when RequestStop came first.
  Status ScanData(DataSet* train, DataSet* eval);
  void CheckLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybePlaceServers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartEpoch(uint32_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartEvaluation() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to the next epoch / evaluation / the end when the pass is done.
  void AdvanceIfPassDone() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the pass a commit names (the evaluation, or training epoch
  // `epoch`) is complete: every one of its shards is DONE.
  bool PassIsOver(bool eval, uint32_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogProgress(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool JobOver() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return phase_ == Phase::kFinished || phase_ == Phase::kFailed;
  }
  // True when every live peer has been told to exit.
  bool EveryoneTold() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  // Set by RequestStop: a scan in progress stops.
  std::atomic<bool> stop_scan_{false};
  const absl::Time started_ = absl::Now();

  mutable absl::Mutex mu_;
  absl::CondVar changed_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool threads_done_ ABSL_GUARDED_BY(mu_) = false;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kScanning;
  bool data_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string failure_ ABSL_GUARDED_BY(mu_);
  uint32_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // 0-based
  // Set once the scan is done (data_ready_); trackers point into them.
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

  // Accounting.
  uint64_t records_trained_ ABSL_GUARDED_BY(mu_) = 0;  // every epoch, each record once
  uint64_t records_malformed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> malformed_examples_ ABSL_GUARDED_BY(mu_);
  double epoch_loss_sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_loss_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> train_loss_ ABSL_GUARDED_BY(mu_);
  std::vector<double> epoch_losses_ ABSL_GUARDED_BY(mu_);
  // Eval predictions per eval shard, kept until the pass ends.
  std::vector<std::vector<float>> eval_labels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<float>> eval_predictions_ ABSL_GUARDED_BY(mu_);
  uint64_t eval_records_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> eval_auc_ ABSL_GUARDED_BY(mu_);
  std::optional<double> eval_logloss_ ABSL_GUARDED_BY(mu_);
  uint64_t reassignments_ ABSL_GUARDED_BY(mu_) = 0;
  // Throughput over the last progress interval.
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_) = absl::Now();
  uint64_t records_at_last_progress_ ABSL_GUARDED_BY(mu_) = 0;
  double records_per_s_ ABSL_GUARDED_BY(mu_) = 0;
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

  std::error_code error;
  std::filesystem::create_directories(options_.data_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("--data-dir: cannot create ", options_.data_dir, ": ", error.message()));
  }

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
    std::string body = StatusJson();
    std::string escaped;
    for (char c : body) {
      if (c == '<') escaped += "&lt;";
      else if (c == '&') escaped += "&amp;";
      else escaped += c;
    }
    response.set_content(
        absl::StrCat("<!doctype html><html><head><meta charset=\"utf-8\">"
                     "<meta http-equiv=\"refresh\" content=\"2\"><title>eps: ",
                     options_.job.job.name, "</title></head><body><h1>eps job ",
                     options_.job.job.name, "</h1><pre>", escaped, "</pre></body></html>"),
        "text/html");
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
  job_thread_ = std::thread([this] { JobLoop(); });
  return absl::OkStatus();
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
      MaybePlaceServers();
    }
  }
  const absl::Duration tick =
      std::min(absl::Milliseconds(100), absl::Milliseconds(options_.job.master.heartbeat_ms) / 2);
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    CheckLeases(now);
    LogProgress(now);
    if (JobOver() && (EveryoneTold() || now >= done_at_)) break;
    changed_.WaitWithTimeout(&mu_, tick);
  }
  threads_done_ = true;
  changed_.SignalAll();
}

void Master::Impl::CheckLeases(absl::Time now) {
  const absl::Duration lease = absl::Milliseconds(options_.job.master.lease_ms);
  for (auto& [id, worker] : workers_) {
    if (worker.state != PeerState::kAlive || now - worker.last_seen <= lease) continue;
    worker.state = PeerState::kDead;
    ++membership_epoch_;
    const int released = tracker_ ? tracker_->Release(id) : 0;
    LOG(WARNING) << "worker[" << id << "] (" << worker.host << " pid " << worker.pid
                 << ") missed its lease (" << options_.job.master.lease_ms
                 << " ms): dead; " << released << " shard(s) back to the queue";
  }
  for (auto& [id, server] : servers_) {
    if (server.state != PeerState::kAlive || now - server.last_seen <= lease) continue;
    server.state = PeerState::kDead;
    ++membership_epoch_;
    LOG(ERROR) << "ps[" << id << "] at " << server.endpoint << " missed its lease";
    if (!JobOver()) {
      Fail(absl::StrCat("parameter server ps[", id, "] at ", server.endpoint,
                        " stopped heartbeating; its parameters are lost (server recovery "
                        "needs checkpoints, not available in this version)"));
    }
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
    LOG(INFO) << "placed " << job_spec_.num_partitions() << " partitions on " << infos.size()
              << " server(s) (cluster map v1)";
  }
  // Placement and the data scan finish in either order (servers usually
  // register while a large data set is still being scanned); training
  // starts on whichever comes second.
  if (data_ready_ && phase_ == Phase::kScanning) StartEpoch(0);
}

void Master::Impl::StartEpoch(uint32_t epoch) {
  epoch_ = epoch;
  phase_ = Phase::kTraining;
  std::vector<uint32_t> order(train_data_.shards.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(Mix64(static_cast<uint64_t>(options_.job.job.seed) * 1000003u + epoch));
  std::shuffle(order.begin(), order.end(), rng);
  tracker_ = std::make_unique<ShardTracker>(&train_data_, order);
  epoch_loss_sum_ = 0;
  epoch_loss_count_ = 0;
  LOG(INFO) << "epoch " << epoch + 1 << "/" << options_.job.job.epochs << ": "
            << train_data_.shards.size() << " shards, " << train_data_.records << " records";
}

void Master::Impl::StartEvaluation() {
  phase_ = Phase::kEvaluating;
  std::vector<uint32_t> order(eval_data_.shards.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  tracker_ = std::make_unique<ShardTracker>(&eval_data_, order);
  eval_labels_.assign(eval_data_.shards.size(), {});
  eval_predictions_.assign(eval_data_.shards.size(), {});
  LOG(INFO) << "evaluating on " << eval_data_.records << " records (" << eval_data_.shards.size()
            << " shards)";
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
  reassignments_ += tracker_->reassignments();
  if (phase_ == Phase::kTraining) {
    if (epoch_loss_count_ > 0) {
      train_loss_ = epoch_loss_sum_ / static_cast<double>(epoch_loss_count_);
      epoch_losses_.push_back(*train_loss_);
    }
    LOG(INFO) << "epoch " << epoch_ + 1 << " done: train loss "
              << (train_loss_ ? absl::StrFormat("%.5f", *train_loss_) : "n/a");
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
    for (size_t i = 0; i < eval_labels_.size(); ++i) {
      labels.insert(labels.end(), eval_labels_[i].begin(), eval_labels_[i].end());
      predictions.insert(predictions.end(), eval_predictions_[i].begin(),
                         eval_predictions_[i].end());
    }
    eval_auc_ = ComputeAuc(predictions, labels);
    eval_logloss_ = ComputeLogLoss(predictions, labels);
    eval_labels_.clear();
    eval_predictions_.clear();
    LOG(INFO) << "evaluation over " << labels.size() << " records: AUC "
              << absl::StrFormat("%.5f", *eval_auc_) << ", log loss "
              << absl::StrFormat("%.5f", *eval_logloss_);
    Finish();
  }
}

void Master::Impl::Finish() {
  phase_ = Phase::kFinished;
  tracker_.reset();
  done_at_ = absl::Now() + absl::Milliseconds(options_.job.master.lease_ms);
  const std::string path =
      (std::filesystem::path(options_.data_dir) / "final_status.json").string();
  Status written = WriteFileAtomically(path, DumpJson(StatusDocument()));
  if (!written.ok()) LOG(ERROR) << written;
  LOG(INFO) << "job finished in " << absl::FormatDuration(absl::Trunc(absl::Now() - started_, absl::Milliseconds(100)))
            << ": " << records_trained_ << " records trained"
            << (eval_auc_ ? absl::StrFormat(", eval AUC %.5f, eval log loss %.5f", *eval_auc_,
                                            *eval_logloss_)
                          : std::string())
            << "; final status in " << path;
  changed_.SignalAll();
}

void Master::Impl::Fail(const std::string& reason) {
  if (JobOver()) return;
  phase_ = Phase::kFailed;
  failure_ = reason;
  tracker_.reset();
  done_at_ = absl::Now() + absl::Milliseconds(options_.job.master.lease_ms);
  LOG(ERROR) << "job failed: " << reason;
  const std::string path =
      (std::filesystem::path(options_.data_dir) / "final_status.json").string();
  Status written = WriteFileAtomically(path, DumpJson(StatusDocument()));
  if (!written.ok()) LOG(ERROR) << written;
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

void Master::Impl::LogProgress(absl::Time now) {
  const absl::Duration interval = absl::Seconds(options_.job.job.progress_interval_s);
  if (now - last_progress_ < interval) return;
  const double seconds = absl::ToDoubleSeconds(now - last_progress_);
  records_per_s_ = static_cast<double>(records_trained_ - records_at_last_progress_) / seconds;
  last_progress_ = now;
  records_at_last_progress_ = records_trained_;
  if (JobOver()) return;
  int alive_workers = 0;
  for (const auto& [id, worker] : workers_) alive_workers += worker.state == PeerState::kAlive;
  if (!tracker_) {
    LOG(INFO) << PhaseName(phase_) << ": " << servers_.size() << "/"
              << options_.job.ps.num_servers << " server(s), " << alive_workers
              << " worker(s)";
    return;
  }
  const DataSet& data = phase_ == Phase::kEvaluating ? eval_data_ : train_data_;
  const double fraction =
      static_cast<double>(tracker_->committed_records()) / std::max<uint64_t>(1, data.records);
  std::string eta = "?";
  if (records_per_s_ > 0) {
    const double left = static_cast<double>(data.records - tracker_->committed_records()) /
                        records_per_s_;
    eta = absl::FormatDuration(absl::Seconds(static_cast<int64_t>(left)));
  }
  LOG(INFO) << (phase_ == Phase::kEvaluating
                    ? std::string("eval")
                    : absl::StrCat("epoch ", epoch_ + 1, "/", options_.job.job.epochs))
            << ": " << absl::StrFormat("%.1f", 100 * fraction) << "% (" << tracker_->done()
            << "/" << tracker_->num_shards() << " shards done, " << tracker_->doing()
            << " in progress), " << absl::StrFormat("%.0f", records_per_s_) << " records/s, "
            << alive_workers << " worker(s), loss "
            << (epoch_loss_count_ ? absl::StrFormat("%.5f", epoch_loss_sum_ / epoch_loss_count_)
                                  : std::string("n/a"))
            << ", ETA " << eta;
}

StatusOr<WorkerEntry*> Master::Impl::LiveWorker(const Message& request) {
  const proto::NodeId& sender = request.header().sender();
  if (sender.role() != proto::ROLE_WORKER) {
    return absl::InvalidArgumentError("only workers may call this");
  }
  auto it = workers_.find(sender.id());
  if (it == workers_.end() || it->second.state != PeerState::kAlive) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           absl::StrCat("worker ", sender.id(),
                                        " is not registered (lease expired?); register again"),
                           proto::FENCED);
  }
  return &it->second;
}

Status Master::Impl::Handle(Message& request, Message* reply) {
  if (request.num_frames() > 0 && request.header().method() != proto::COMMIT_PROGRESS) {
    return absl::InvalidArgumentError(absl::StrCat(proto::Method_Name(request.header().method()),
                                                   " takes no bulk frames"));
  }
  switch (request.header().method()) {
    case proto::REGISTER_SERVER: return HandleRegisterServer(request, reply);
    case proto::REGISTER_WORKER: return HandleRegisterWorker(request, reply);
    case proto::HEARTBEAT: return HandleHeartbeat(request, reply);
    case proto::GET_CLUSTER_MAP: return HandleGetClusterMap(request, reply);
    case proto::GET_SHARD: return HandleGetShard(request, reply);
    case proto::COMMIT_PROGRESS: return HandleCommit(request, reply);
    case proto::DEREGISTER: return HandleDeregister(request, reply);
    default:
      return absl::UnimplementedError(absl::StrCat(
          "the master does not serve ", proto::Method_Name(request.header().method())));
  }
}

Status Master::Impl::HandleRegisterServer(const Message& request, Message* reply) {
  if (!request.header().has_register_server_request()) {
    return absl::InvalidArgumentError("REGISTER_SERVER without its body");
  }
  const proto::RegisterServerRequest& body = request.header().register_server_request();
  if (!ParseTcpEndpoint(body.endpoint()).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad server endpoint '", body.endpoint(), "'"));
  }
  absl::MutexLock lock(&mu_);
  if (JobOver()) {
    return absl::FailedPreconditionError("the job is over");
  }
  for (auto& [id, server] : servers_) {
    if (server.endpoint == body.endpoint() && server.state == PeerState::kAlive) {
      // A retried registration: answer the same.
      reply->header().mutable_register_server_reply()->set_server_id(id);
      *reply->header().mutable_register_server_reply()->mutable_job() = job_spec_;
      return absl::OkStatus();
    }
  }
  if (servers_.size() >= static_cast<size_t>(options_.job.ps.num_servers)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job already has its ", options_.job.ps.num_servers,
        " server(s) (ps.num_servers); adding servers to a running job is not supported yet"));
  }
  const uint32_t id = next_server_id_++;
  ServerEntry& server = servers_[id];
  server.endpoint = body.endpoint();
  server.host = body.hostname();
  server.pid = body.pid();
  server.last_seen = absl::Now();
  ++membership_epoch_;
  LOG(INFO) << "ps[" << id << "] registered: " << body.endpoint() << " (" << body.hostname()
            << " pid " << body.pid() << "), " << servers_.size() << "/"
            << options_.job.ps.num_servers;
  reply->header().mutable_register_server_reply()->set_server_id(id);
  *reply->header().mutable_register_server_reply()->mutable_job() = job_spec_;
  MaybePlaceServers();
  return absl::OkStatus();
}

Status Master::Impl::HandleRegisterWorker(const Message& request, Message* reply) {
  if (!request.header().has_register_worker_request()) {
    return absl::InvalidArgumentError("REGISTER_WORKER without its body");
  }
  const proto::RegisterWorkerRequest& body = request.header().register_worker_request();
  absl::MutexLock lock(&mu_);
  if (JobOver()) return absl::FailedPreconditionError("the job is over");
  const uint32_t id = next_worker_id_++;
  WorkerEntry& worker = workers_[id];
  worker.host = body.hostname();
  worker.pid = body.pid();
  worker.device = body.device();
  worker.last_seen = worker.joined = absl::Now();
  ++membership_epoch_;
  LOG(INFO) << "worker[" << id << "] joined (" << body.hostname() << " pid " << body.pid() << ", "
            << body.device() << ")";
  proto::RegisterWorkerReply* out = reply->header().mutable_register_worker_reply();
  out->set_worker_id(id);
  *out->mutable_job() = job_spec_;
  out->set_heartbeat_ms(static_cast<uint32_t>(options_.job.master.heartbeat_ms));
  return absl::OkStatus();
}

Status Master::Impl::HandleHeartbeat(const Message& request, Message* reply) {
  if (!request.header().has_heartbeat_request()) {
    return absl::InvalidArgumentError("HEARTBEAT without its body");
  }
  const proto::NodeId& sender = request.header().sender();
  absl::MutexLock lock(&mu_);
  bool* told = nullptr;
  if (sender.role() == proto::ROLE_WORKER) {
    ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorker(request));
    worker->last_seen = absl::Now();
    worker->records_per_s = request.header().heartbeat_request().worker().records_per_s();
    told = &worker->told_to_exit;
  } else if (sender.role() == proto::ROLE_SERVER) {
    auto it = servers_.find(sender.id());
    if (it == servers_.end() || it->second.state != PeerState::kAlive) {
      return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                             absl::StrCat("server ", sender.id(), " is not registered"),
                             proto::FENCED);
    }
    it->second.last_seen = absl::Now();
    it->second.stats = request.header().heartbeat_request().server();
    told = &it->second.told_to_exit;
  } else {
    return absl::InvalidArgumentError("heartbeat from an unknown role");
  }
  proto::HeartbeatReply* out = reply->header().mutable_heartbeat_reply();
  out->set_state(phase_ == Phase::kFinished ? proto::JOB_FINISHED
                 : phase_ == Phase::kFailed ? proto::JOB_FAILED
                                            : proto::JOB_RUNNING);
  out->set_cluster_map_version(cluster_map_.version());
  if (JobOver()) {
    out->set_shutdown(true);
    *told = true;
    changed_.SignalAll();
  }
  return absl::OkStatus();
}

Status Master::Impl::HandleGetClusterMap(const Message& request, Message* reply) {
  absl::MutexLock lock(&mu_);
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
  worker->last_seen = absl::Now();
  proto::GetShardReply* out = reply->header().mutable_get_shard_reply();
  if (JobOver()) {
    out->set_action(proto::GetShardReply::FINISHED);
    worker->told_to_exit = true;
    changed_.SignalAll();
    return absl::OkStatus();
  }
  std::optional<ShardTracker::Assignment> assignment;
  if (tracker_) assignment = tracker_->Assign(request.header().sender().id());
  if (!assignment.has_value()) {
    out->set_action(proto::GetShardReply::WAIT);
    out->set_retry_after_ms(200);
    return absl::OkStatus();
  }
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
  VLOG(1) << "worker[" << request.header().sender().id() << "] takes "
          << (eval ? "eval" : "train") << " shard " << assignment->shard_id << " ("
          << assignment->records << " records from line " << assignment->start_line << " of "
          << shard->path() << ")";
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
    if (body.shard_id() >= data.shards.size()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown shard ", body.shard_id()));
    }
    const ShardSpec& spec = data.shards[body.shard_id()];
    if (body.begin_offset() < spec.begin || body.begin_offset() > body.end_offset() ||
        body.end_offset() > spec.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "commit [", body.begin_offset(), ", ", body.end_offset(), ") is outside shard ",
          body.shard_id(), " [", spec.begin, ", ", spec.end, ")"));
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
  ASSIGN_OR_RETURN(ShardTracker::CommitResult result,
                   tracker_->Commit(request.header().sender().id(), body.shard_id(),
                                    body.begin_offset(), body.end_offset(), body.lines()));
  const bool applied = result == ShardTracker::CommitResult::kApplied;
  reply->header().mutable_commit_progress_reply()->set_applied(applied);
  if (!applied) return absl::OkStatus();

  const uint64_t valid = body.lines() - body.malformed();
  records_malformed_ += body.malformed();
  for (const std::string& example : body.malformed_examples()) {
    if (malformed_examples_.size() < 20) malformed_examples_.push_back(example);
  }
  if (eval) {
    eval_labels_[body.shard_id()].insert(eval_labels_[body.shard_id()].end(), labels.begin(),
                                         labels.end());
    eval_predictions_[body.shard_id()].insert(eval_predictions_[body.shard_id()].end(),
                                              predictions.begin(), predictions.end());
    eval_records_ += valid;
  } else {
    records_trained_ += valid;
    worker->records += valid;
    epoch_loss_sum_ += body.loss_sum();
    epoch_loss_count_ += valid;
  }
  AdvanceIfPassDone();
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
    ++membership_epoch_;
    const int released = tracker_ ? tracker_->Release(sender.id()) : 0;
    LOG(INFO) << "worker[" << sender.id() << "] left"
              << (released ? absl::StrCat("; ", released, " shard(s) back to the queue") : "");
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
  doc["records_per_epoch"] = train_data_.records;
  doc["records_per_s"] = records_per_s_;
  doc["records_malformed"] = records_malformed_;
  doc["malformed_examples"] = malformed_examples_;
  doc["membership_epoch"] = membership_epoch_;
  doc["reassignments"] = reassignments_ + (tracker_ ? tracker_->reassignments() : 0);
  doc["cluster_map_version"] = cluster_map_.version();
  json workers = json::array();
  for (const auto& [id, worker] : workers_) {
    workers.push_back({{"id", id},
                       {"state", PeerStateName(worker.state)},
                       {"host", worker.host},
                       {"pid", worker.pid},
                       {"device", worker.device},
                       {"records", worker.records},
                       {"records_per_s", worker.state == PeerState::kAlive ? worker.records_per_s : 0.0}});
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
                       {"memory_bytes", server.stats.bytes()}});
  }
  doc["servers"] = servers;
  doc["metrics"] = {{"train_loss", NullableNumber(train_loss_)},
                    {"epoch_train_loss", epoch_losses_},
                    {"eval_auc", NullableNumber(eval_auc_)},
                    {"eval_logloss", NullableNumber(eval_logloss_)},
                    {"eval_records", eval_records_}};
  return doc;
}

std::string Master::Impl::MetricsText() const {
  std::string out;
  auto gauge = [&out](const char* name, const char* help, double value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ",
                    PrometheusNumber(value), "\n");
  };
  gauge("eps_records_trained", "Records committed, each once, over all epochs.",
        static_cast<double>(records_trained_));
  gauge("eps_records_per_second", "Records committed per second, last interval.", records_per_s_);
  gauge("eps_epoch", "Current epoch (1-based).", epoch_ + 1);
  int alive = 0;
  for (const auto& [id, worker] : workers_) alive += worker.state == PeerState::kAlive;
  gauge("eps_workers_alive", "Workers holding a lease.", alive);
  gauge("eps_membership_epoch", "Membership changes so far.", static_cast<double>(membership_epoch_));
  if (train_loss_) gauge("eps_train_loss", "Mean train loss of the last epoch.", *train_loss_);
  if (eval_auc_) gauge("eps_eval_auc", "Final evaluation AUC.", *eval_auc_);
  if (eval_logloss_) gauge("eps_eval_logloss", "Final evaluation log loss.", *eval_logloss_);
  return out;
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
  absl::MutexLock lock(&mu_);
  if (stop_requested_) return;
  stop_requested_ = true;
  Fail(reason);
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

}  // namespace eps
