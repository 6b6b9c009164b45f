#include "worker/worker.h"

#include <unistd.h>

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/data_schema.h"
#include "core/logging.h"
#include "core/message.h"
#include "core/net.h"
#include "core/placement.h"
#include "core/rpc_channel.h"
#include "core/socket_factory.h"
#include "models/batch.h"
#include "models/device.h"
#include "models/model.h"
#include "worker/line_reader.h"
#include "worker/ps_client.h"
#include "worker/record_parser.h"

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

// Malformed lines logged per worker before only counting them.
constexpr int kMalformedLogLimit = 10;
// Malformed-line samples sent to the master per commit.
constexpr int kMalformedSamplesPerCommit = 3;

// One batch, parsed and with its parameters pulled, ready to train.
struct PreparedBatch {
  proto::ShardAssignment shard;
  uint64_t begin = 0;  // byte range of the shard this batch covers
  uint64_t end = 0;
  uint64_t lines = 0;
  uint64_t malformed = 0;
  std::vector<std::string> malformed_examples;
  Batch batch;
  ParamBuffers params;
};

// A bounded queue between the loader and the trainer. Close() ends it with
// a status; Pop then drains what is left and returns null.
class BatchQueue {
 public:
  explicit BatchQueue(size_t capacity) : capacity_(capacity) {}

  // Blocks while full. False if the queue was closed (the item is dropped).
  bool Push(std::unique_ptr<PreparedBatch> item) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || items_.size() < capacity_;
    };
    mu_.Await(absl::Condition(&room));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Blocks until an item or the end. Null at the end.
  std::unique_ptr<PreparedBatch> Pop() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || !items_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (items_.empty()) return nullptr;
    std::unique_ptr<PreparedBatch> item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  // Ends the queue; the first status given is kept.
  void Close(const Status& status) {
    absl::MutexLock lock(&mu_);
    if (!closed_) status_ = status;
    closed_ = true;
  }

  Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<PreparedBatch>> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

class Worker::Impl {
 public:
  explicit Impl(const WorkerOptions& options)
      : options_(options), queue_(static_cast<size_t>(options.job.worker.prefetch_batches)) {}

  Status Run();
  void RequestStop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }

 private:
  CallOptions MasterCallOptions() const {
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(options_.job.worker.rpc_timeout_ms);
    call.max_attempts = static_cast<int>(options_.job.worker.rpc_attempts);
    return call;
  }
  Status Register(RpcChannel& master);
  StatusOr<proto::ClusterMap> FetchClusterMap(RpcChannel& master);
  // Waits for the parameter servers to be placed.
  StatusOr<proto::ClusterMap> AwaitClusterMap(RpcChannel& master);
  std::unique_ptr<PsClient> MakePsClient(RpcChannel* master);

  void LoaderLoop();
  Status LoadShards(RpcChannel& master, PsClient& ps);
  Status LoadShard(const proto::ShardAssignment& shard, PsClient& ps);
  Status PullParams(PsClient& ps, PreparedBatch& prepared);
  Status Train(PreparedBatch& prepared, PsClient& ps, double* loss_sum,
               std::vector<float>* predictions);
  Status Commit(RpcChannel& master, const PreparedBatch& prepared, double loss_sum,
                const std::vector<float>& predictions);
  void HeartbeatLoop();
  Status Deregister(RpcChannel& master);

  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stop_;
  }
  // Sleeps up to `duration`, waking early on RequestStop. True if stopping.
  bool SleepUnlessStopping(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&stop_), duration);
  }
  void Fail(const Status& status) {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
    stop_ = true;
  }

  const WorkerOptions options_;
  SocketFactory factory_;
  std::unique_ptr<RecordParser> parser_;
  std::unique_ptr<Model> model_;
  proto::NodeId self_;
  proto::JobSpec job_;
  proto::ClusterMap initial_map_;
  std::string device_ = "cpu";
  uint32_t heartbeat_ms_ = 1000;
  // Per model parameter: its table id, and for dense tensors the chunk keys.
  std::vector<uint32_t> table_ids_;
  std::vector<std::vector<uint64_t>> dense_keys_;
  BatchQueue queue_;
  std::thread loader_;
  std::thread heartbeat_;

  std::atomic<uint64_t> records_committed_{0};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> batches_{0};
  std::atomic<int> malformed_logged_{0};

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // the master said the job is over
  Status failure_ ABSL_GUARDED_BY(mu_);
};

Status Worker::Impl::Register(RpcChannel& master) {
  Message request;
  request.header().set_method(proto::REGISTER_WORKER);
  proto::RegisterWorkerRequest* body = request.header().mutable_register_worker_request();
  body->set_hostname(Hostname());
  body->set_pid(static_cast<uint32_t>(getpid()));
  body->set_device(device_);
  // Keep trying for worker.master_wait_s: the master may still be starting.
  CallOptions call;
  call.attempt_timeout = absl::Seconds(1);
  call.max_attempts = std::max<int>(1, static_cast<int>(options_.job.worker.master_wait_s));
  StatusOr<Message> reply = master.Call(options_.master, std::move(request), call);
  if (!reply.ok()) {
    return Annotate(reply.status(),
                    absl::StrCat("cannot register with the master at ", options_.master));
  }
  const proto::RegisterWorkerReply& registered = reply->header().register_worker_reply();
  self_.set_role(proto::ROLE_WORKER);
  self_.set_id(registered.worker_id());
  job_ = registered.job();
  heartbeat_ms_ = std::max<uint32_t>(1, registered.heartbeat_ms());
  master.set_self(self_);
  SetLogNode(absl::StrCat("worker[", self_.id(), "]"));

  // The master's tables must be this worker's model's parameters.
  const std::vector<ParamSpec>& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    const proto::TableSpec* found = nullptr;
    for (const proto::TableSpec& table : job_.tables()) {
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
    table_ids_.push_back(found->id());
    std::vector<uint64_t> keys;
    if (!embedding) {
      for (uint64_t c = 0; c < DenseChunkCount(found->dense_size(), found->dim()); ++c) {
        keys.push_back(DenseChunkKey(found->id(), c));
      }
    }
    dense_keys_.push_back(std::move(keys));
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

std::unique_ptr<PsClient> Worker::Impl::MakePsClient(RpcChannel* master) {
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(options_.job.worker.rpc_timeout_ms);
  call.max_attempts = static_cast<int>(options_.job.worker.rpc_attempts);
  auto client = std::make_unique<PsClient>(&factory_, self_, job_, call,
                                           [this, master] { return FetchClusterMap(*master); });
  CHECK_OK(client->SetClusterMap(initial_map_));
  return client;
}

void Worker::Impl::LoaderLoop() {
  RpcChannel master(&factory_, self_);
  std::unique_ptr<PsClient> ps = MakePsClient(&master);
  Status status = LoadShards(master, *ps);
  if (!status.ok()) {
    // Unblock the trainer right away; it reports the failure.
    Fail(status);
  }
  queue_.Close(status);
}

Status Worker::Impl::LoadShards(RpcChannel& master, PsClient& ps) {
  while (!stopping()) {
    Message request;
    request.header().set_method(proto::GET_SHARD);
    request.header().mutable_get_shard_request();
    ASSIGN_OR_RETURN(Message reply,
                     master.Call(options_.master, std::move(request), MasterCallOptions()));
    const proto::GetShardReply& body = reply.header().get_shard_reply();
    switch (body.action()) {
      case proto::GetShardReply::FINISHED: {
        absl::MutexLock lock(&mu_);
        finished_ = true;
        return absl::OkStatus();
      }
      case proto::GetShardReply::WAIT:
        SleepUnlessStopping(absl::Milliseconds(std::max<uint32_t>(10, body.retry_after_ms())));
        break;
      case proto::GetShardReply::ASSIGNED:
        RETURN_IF_ERROR(LoadShard(body.shard(), ps));
        break;
      default:
        return absl::DataLossError("GET_SHARD reply without an action");
    }
  }
  return absl::OkStatus();
}

Status Worker::Impl::LoadShard(const proto::ShardAssignment& shard, PsClient& ps) {
  VLOG(1) << (shard.phase() == proto::EVAL ? "eval" : "train") << " shard " << shard.shard_id()
          << ": " << shard.path() << " from line " << shard.start_line() << " ("
          << shard.records() << " records)";
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> reader,
                   LineReader::Open(shard.path(), shard.start(), shard.end(), shard.start_line()));
  const Schema& schema = parser_->schema();
  BatchBuilder builder(schema.num_dense, schema.num_cat);
  std::vector<float> dense(schema.num_dense);
  std::vector<uint64_t> ids(schema.num_cat);
  const int64_t batch_size = options_.job.worker.batch_size;
  uint64_t offset = shard.start();
  while (offset < shard.end()) {
    auto prepared = std::make_unique<PreparedBatch>();
    prepared->shard = shard;
    prepared->begin = offset;
    absl::string_view line;
    while (builder.size() < batch_size && reader->Next(&line)) {
      ++prepared->lines;
      float label = 0;
      Status parsed = parser_->Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids));
      if (parsed.ok()) {
        builder.Add(label, dense, ids);
        continue;
      }
      ++prepared->malformed;
      const std::string where =
          absl::StrCat(shard.path(), ":", reader->line_number(), ": ", parsed.message());
      if (malformed_logged_.fetch_add(1) < kMalformedLogLimit) {
        LOG(WARNING) << "skipping malformed line " << where;
      }
      if (prepared->malformed_examples.size() < kMalformedSamplesPerCommit) {
        prepared->malformed_examples.push_back(where);
      }
    }
    RETURN_IF_ERROR(reader->status());
    prepared->end = reader->offset();
    if (prepared->lines == 0) {
      return absl::DataLossError(absl::StrCat(shard.path(), ": no record at byte ", offset,
                                              " although the shard ends at ", shard.end()));
    }
    prepared->batch = builder.Finish();
    if (prepared->batch.size() > 0) RETURN_IF_ERROR(PullParams(ps, *prepared));
    offset = prepared->end;
    if (!queue_.Push(std::move(prepared))) return absl::OkStatus();
    if (stopping()) return absl::OkStatus();  // the rest of the shard goes back
  }
  return absl::OkStatus();
}

Status Worker::Impl::PullParams(PsClient& ps, PreparedBatch& prepared) {
  const std::vector<ParamSpec>& params = model_->params();
  std::vector<PsClient::Keys> keys(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    keys[i].table_id = table_ids_[i];
    keys[i].keys = params[i].kind == ParamSpec::Kind::kEmbedding
                       ? std::span<const uint64_t>(prepared.batch.keys)
                       : std::span<const uint64_t>(dense_keys_[i]);
  }
  RETURN_IF_ERROR_CTX(ps.Pull(keys, &prepared.params), "pull");
  // Dense tensors arrive as whole chunks; the model sees the tensor.
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind == ParamSpec::Kind::kDense) prepared.params[i].resize(params[i].size);
  }
  return absl::OkStatus();
}

Status Worker::Impl::Train(PreparedBatch& prepared, PsClient& ps, double* loss_sum,
                           std::vector<float>* predictions) {
  const bool eval = prepared.shard.phase() == proto::EVAL;
  ParamBuffers grads;
  *loss_sum = model_->ForwardBackward(prepared.batch, prepared.params, predictions,
                                      eval ? nullptr : &grads);
  if (eval) return absl::OkStatus();
  const std::vector<ParamSpec>& params = model_->params();
  std::vector<PsClient::Keys> keys(params.size());
  std::vector<std::span<const float>> values(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    keys[i].table_id = table_ids_[i];
    if (params[i].kind == ParamSpec::Kind::kEmbedding) {
      keys[i].keys = prepared.batch.keys;
    } else {
      keys[i].keys = dense_keys_[i];
      // Pad the gradient to whole chunks.
      grads[i].resize(dense_keys_[i].size() * ps.table(table_ids_[i]).dim(), 0.0f);
    }
    values[i] = grads[i];
  }
  return Annotate(ps.Push(keys, values), "push");
}

Status Worker::Impl::Commit(RpcChannel& master, const PreparedBatch& prepared, double loss_sum,
                            const std::vector<float>& predictions) {
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
  StatusOr<Message> reply = master.Call(options_.master, std::move(request), MasterCallOptions());
  RETURN_IF_ERROR_CTX(reply.status(), absl::StrCat("commit of shard ", prepared.shard.shard_id()));
  return absl::OkStatus();
}

void Worker::Impl::HeartbeatLoop() {
  RpcChannel master(&factory_, self_);
  absl::Time last_contact = absl::Now();
  absl::Time last_sample = absl::Now();
  uint64_t records_before = 0;
  double rate = 0;
  const absl::Duration interval = absl::Milliseconds(heartbeat_ms_);
  const absl::Duration master_wait = absl::Seconds(options_.job.worker.master_wait_s);
  while (!SleepUnlessStopping(interval)) {
    const absl::Time now = absl::Now();
    const uint64_t records = records_committed_.load();
    const double seconds = absl::ToDoubleSeconds(now - last_sample);
    if (seconds >= 1.0) {
      rate = static_cast<double>(records - records_before) / seconds;
      records_before = records;
      last_sample = now;
    }
    Message request;
    request.header().set_method(proto::HEARTBEAT);
    proto::WorkerStats* stats = request.header().mutable_heartbeat_request()->mutable_worker();
    stats->set_records(records);
    stats->set_records_per_s(rate);
    stats->set_batches(batches_.load());
    stats->set_malformed(malformed_.load());
    CallOptions call;
    call.attempt_timeout = std::max(interval, absl::Seconds(1));
    call.max_attempts = 1;
    StatusOr<Message> reply = master.Call(options_.master, std::move(request), call);
    if (!reply.ok()) {
      if (ReasonOf(reply.status()) == proto::FENCED) {
        Fail(absl::FailedPreconditionError(absl::StrCat(
            "the master fenced this worker (its lease expired): ", reply.status().message())));
        return;
      }
      if (absl::Now() - last_contact > master_wait) {
        Fail(absl::UnavailableError(absl::StrCat("lost the master at ", options_.master,
                                                 " for ", absl::FormatDuration(master_wait), ": ",
                                                 reply.status().message())));
        return;
      }
      VLOG(1) << "heartbeat failed: " << reply.status();
      continue;
    }
    last_contact = absl::Now();
    if (reply->header().heartbeat_reply().shutdown()) {
      // Usually the loader hears it from GET_SHARD first; a worker waiting
      // for work hears it here.
      VLOG(1) << "the master says the job is over";
      absl::MutexLock lock(&mu_);
      finished_ = true;
      stop_ = true;
      return;
    }
  }
}

Status Worker::Impl::Deregister(RpcChannel& master) {
  Message request;
  request.header().set_method(proto::DEREGISTER);
  request.header().mutable_deregister_request();
  CallOptions call = MasterCallOptions();
  call.max_attempts = 1;
  return master.Call(options_.master, std::move(request), call).status();
}

Status Worker::Impl::Run() {
  RETURN_IF_ERROR(options_.Validate());
  ASSIGN_OR_RETURN(Device device, ResolveDevice(options_.device));
  if (device == Device::kCuda) {
    if (options_.device == "cuda") {
      return absl::FailedPreconditionError(absl::StrCat(
          "--device cuda: model '", options_.job.model.type,
          "' has no CUDA back end in this version; use --device cpu or auto"));
    }
    LOG(INFO) << "a GPU is visible, but model '" << options_.job.model.type
              << "' has no CUDA back end in this version; training on the CPU";
  }
  ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(options_.job));
  parser_ = std::make_unique<RecordParser>(schema);
  ASSIGN_OR_RETURN(ModelOptions model_options, ModelOptions::FromConfig(options_.job));
  ASSIGN_OR_RETURN(model_, Model::Create(model_options));

  RpcChannel master(&factory_, proto::NodeId());
  RETURN_IF_ERROR(Register(master));
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  StatusOr<proto::ClusterMap> map = AwaitClusterMap(master);
  if (!map.ok()) {
    RequestStop();
    heartbeat_.join();
    if (absl::IsCancelled(map.status())) return Deregister(master);
    return Annotate(map.status(), "cannot get the cluster map");
  }
  initial_map_ = *map;
  loader_ = std::thread([this] { LoaderLoop(); });

  std::unique_ptr<PsClient> ps = MakePsClient(&master);
  const absl::Time started = absl::Now();
  absl::Time last_progress = started;
  uint64_t records_at_progress = 0;
  double loss_sum_since = 0;
  uint64_t loss_count_since = 0;
  Status status;
  std::vector<float> predictions;
  while (std::unique_ptr<PreparedBatch> prepared = queue_.Pop()) {
    double loss_sum = 0;
    predictions.clear();
    if (prepared->batch.size() > 0) {
      status = Train(*prepared, *ps, &loss_sum, &predictions);
      if (!status.ok()) break;
    }
    status = Commit(master, *prepared, loss_sum, predictions);
    if (!status.ok()) break;
    batches_.fetch_add(1);
    malformed_.fetch_add(prepared->malformed);
    if (prepared->shard.phase() == proto::TRAIN) {
      records_committed_.fetch_add(static_cast<uint64_t>(prepared->batch.size()));
      loss_sum_since += loss_sum;
      loss_count_since += static_cast<uint64_t>(prepared->batch.size());
    }
    const absl::Time now = absl::Now();
    if (now - last_progress >= absl::Seconds(options_.job.job.progress_interval_s)) {
      const uint64_t records = records_committed_.load();
      LOG(INFO) << records << " records trained, "
                << absl::StrFormat("%.0f", (records - records_at_progress) /
                                               absl::ToDoubleSeconds(now - last_progress))
                << " records/s, loss "
                << (loss_count_since ? absl::StrFormat("%.5f", loss_sum_since / loss_count_since)
                                     : std::string("n/a"))
                << (prepared->shard.phase() == proto::EVAL ? " (evaluating)" : "");
      last_progress = now;
      records_at_progress = records;
      loss_sum_since = 0;
      loss_count_since = 0;
    }
  }
  // Stop the loader (it may be blocked on a full queue) and collect it.
  RequestStop();
  queue_.Close(absl::CancelledError("worker stopping"));
  while (queue_.Pop() != nullptr) {
  }
  loader_.join();
  heartbeat_.join();
  if (status.ok()) status = queue_.status();
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) status = failure_;
  }
  // Leaving hands any shard still held back to the master at its committed
  // offset; after the job finished the master may be gone already.
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = finished_;
  }
  if (!finished) {
    Status left = Deregister(master);
    if (!left.ok()) VLOG(1) << "deregistering: " << left;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LOG(INFO) << "summary: " << records_committed_.load() << " records trained ("
            << malformed_.load() << " malformed lines skipped) in "
            << absl::StrFormat("%.1f", seconds) << " s, "
            << absl::StrFormat("%.0f", records_committed_.load() / std::max(seconds, 1e-9))
            << " records/s";
  return status;
}

Worker::Worker(const WorkerOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Worker::~Worker() = default;
Status Worker::Run() { return impl_->Run(); }
void Worker::RequestStop() { impl_->RequestStop(); }

}  // namespace eps
