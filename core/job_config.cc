#include "core/job_config.h"

#include "core/data_schema.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace eps {
namespace {

Status OptionError(absl::string_view option, absl::string_view message) {
  Status status = absl::InvalidArgumentError(absl::StrCat("option '", option, "': ", message));
  status.SetPayload(kOptionPayload, absl::Cord(option));
  return status;
}

Status CheckAtLeast(absl::string_view option, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return OptionError(option, absl::StrCat("must be >= ", min, " (got ", value, ")"));
}

Status CheckOneOf(absl::string_view option, const std::string& value,
                  std::initializer_list<absl::string_view> allowed) {
  for (absl::string_view a : allowed) {
    if (value == a) return absl::OkStatus();
  }
  return OptionError(option, absl::StrCat("'", value, "' is not one of: ",
                                          absl::StrJoin(allowed, ", ")));
}

class PrintVisitor : public OptionVisitor {
 public:
  void Visit(absl::string_view name, std::string* value, absl::string_view) override {
    out_ << name << " = " << *value << "\n";
  }
  void Visit(absl::string_view name, int64_t* value, absl::string_view) override {
    out_ << name << " = " << *value << "\n";
  }
  void Visit(absl::string_view name, double* value, absl::string_view) override {
    out_ << name << " = " << *value << "\n";
  }
  void Visit(absl::string_view name, bool* value, absl::string_view) override {
    out_ << name << " = " << (*value ? "true" : "false") << "\n";
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

void JobConfig::VisitOptions(OptionVisitor& v) {
  v.Visit("job.name", &job.name, "job name shown in logs and /status");
  v.Visit("job.epochs", &job.epochs, "passes over data.train");
  v.Visit("job.seed", &job.seed, "seed of shard shuffling and initialisation");
  v.Visit("job.progress_interval_s", &job.progress_interval_s,
          "seconds between progress lines in the logs");

  v.Visit("data.train", &data.train, "training files, globs or directories, comma-separated");
  v.Visit("data.eval", &data.eval, "evaluation files, globs or directories; empty: no eval");
  v.Visit("data.format", &data.format, "criteo or tsv");
  v.Visit("data.schema", &data.schema, "tsv column kinds, e.g. label,dense*13,cat*26");
  v.Visit("data.shard_records", &data.shard_records, "records per data shard");

  v.Visit("model.type", &model.type, "model: lr");
  v.Visit("model.embedding_dim", &model.embedding_dim, "floats per embedding row");
  v.Visit("model.initializer", &model.initializer, "auto, zeros, normal or uniform");
  v.Visit("model.init_scale", &model.init_scale, "stddev (normal) or half-width (uniform)");

  v.Visit("optimizer.type", &optimizer.type, "sgd or adagrad");
  v.Visit("optimizer.learning_rate", &optimizer.learning_rate, "step size");
  v.Visit("optimizer.initial_accumulator", &optimizer.initial_accumulator,
          "adagrad accumulator start value");
  v.Visit("optimizer.epsilon", &optimizer.epsilon, "adagrad denominator epsilon");
  v.Visit("optimizer.l2", &optimizer.l2, "L2 penalty");

  v.Visit("ps.num_servers", &ps.num_servers, "servers the master waits for");
  v.Visit("ps.partitions", &ps.partitions, "virtual partitions of the key space");
  v.Visit("ps.threads", &ps.threads, "request threads per server");
  v.Visit("ps.memory_budget_mb", &ps.memory_budget_mb, "hot-tier budget in MiB, 0 unlimited");
  v.Visit("ps.flush_interval_ms", &ps.flush_interval_ms, "longest time rows stay unflushed");
  v.Visit("ps.dense_chunk_floats", &ps.dense_chunk_floats, "floats per dense-tensor chunk");

  v.Visit("worker.batch_size", &worker.batch_size, "records per batch");
  v.Visit("worker.prefetch_batches", &worker.prefetch_batches, "batches prepared ahead");
  v.Visit("worker.rpc_timeout_ms", &worker.rpc_timeout_ms, "time per attempt of a call");
  v.Visit("worker.rpc_attempts", &worker.rpc_attempts, "attempts per call");
  v.Visit("worker.master_wait_s", &worker.master_wait_s,
          "seconds to keep trying to reach the master at startup");
  v.Visit("worker.max_records_per_s", &worker.max_records_per_s,
          "cap on a worker's records/s, 0 none (demos, tests)");

  v.Visit("master.heartbeat_ms", &master.heartbeat_ms, "heartbeat interval");
  v.Visit("master.lease_ms", &master.lease_ms, "heartbeat silence after which a peer is dead");
  v.Visit("master.bind_host", &master.bind_host, "address the master binds to");

  v.Visit("checkpoint.interval_s", &checkpoint.interval_s, "seconds between checkpoints");
}

Status JobConfig::Validate() const {
  RETURN_IF_ERROR(CheckAtLeast("job.epochs", job.epochs, 1));
  RETURN_IF_ERROR(CheckAtLeast("job.seed", job.seed, 0));
  RETURN_IF_ERROR(CheckAtLeast("job.progress_interval_s", job.progress_interval_s, 1));

  if (data.train.empty()) return OptionError("data.train", "is required (training data path)");
  RETURN_IF_ERROR(CheckOneOf("data.format", data.format, {"criteo", "tsv"}));
  if (data.format == "tsv" && data.schema.empty()) {
    return OptionError("data.schema", "is required when data.format = tsv");
  }
  if (data.format == "tsv") {
    StatusOr<Schema> schema = Schema::Parse(data.schema);
    if (!schema.ok()) return OptionError("data.schema", schema.status().message());
  }
  if (data.format == "criteo" && !data.schema.empty()) {
    return OptionError("data.schema", "applies to data.format = tsv only");
  }
  RETURN_IF_ERROR(CheckAtLeast("data.shard_records", data.shard_records, 1));

  RETURN_IF_ERROR(CheckOneOf("model.type", model.type, {"lr"}));
  RETURN_IF_ERROR(CheckAtLeast("model.embedding_dim", model.embedding_dim, 1));
  if (model.embedding_dim > 4096) {
    return OptionError("model.embedding_dim", "must be <= 4096");
  }
  RETURN_IF_ERROR(
      CheckOneOf("model.initializer", model.initializer, {"auto", "zeros", "normal", "uniform"}));
  if (!(model.init_scale >= 0)) return OptionError("model.init_scale", "must be >= 0");

  RETURN_IF_ERROR(CheckOneOf("optimizer.type", optimizer.type, {"sgd", "adagrad"}));
  if (!(optimizer.learning_rate > 0)) {
    return OptionError("optimizer.learning_rate", "must be > 0");
  }
  if (!(optimizer.initial_accumulator >= 0)) {
    return OptionError("optimizer.initial_accumulator", "must be >= 0");
  }
  if (!(optimizer.epsilon > 0)) return OptionError("optimizer.epsilon", "must be > 0");
  if (!(optimizer.l2 >= 0)) return OptionError("optimizer.l2", "must be >= 0");

  RETURN_IF_ERROR(CheckAtLeast("ps.num_servers", ps.num_servers, 1));
  RETURN_IF_ERROR(CheckAtLeast("ps.partitions", ps.partitions, ps.num_servers));
  if (ps.partitions > (1 << 20)) return OptionError("ps.partitions", "must be <= 1048576");
  RETURN_IF_ERROR(CheckAtLeast("ps.threads", ps.threads, 1));
  RETURN_IF_ERROR(CheckAtLeast("ps.memory_budget_mb", ps.memory_budget_mb, 0));
  RETURN_IF_ERROR(CheckAtLeast("ps.flush_interval_ms", ps.flush_interval_ms, 1));
  RETURN_IF_ERROR(CheckAtLeast("ps.dense_chunk_floats", ps.dense_chunk_floats, 1));
  if (ps.dense_chunk_floats > (1 << 20)) {
    return OptionError("ps.dense_chunk_floats", "must be <= 1048576 (4 MiB chunks)");
  }

  RETURN_IF_ERROR(CheckAtLeast("worker.batch_size", worker.batch_size, 1));
  if (worker.batch_size > (1 << 20)) {
    return OptionError("worker.batch_size", "must be <= 1048576");
  }
  RETURN_IF_ERROR(CheckAtLeast("worker.prefetch_batches", worker.prefetch_batches, 1));
  RETURN_IF_ERROR(CheckAtLeast("worker.rpc_timeout_ms", worker.rpc_timeout_ms, 1));
  RETURN_IF_ERROR(CheckAtLeast("worker.rpc_attempts", worker.rpc_attempts, 1));
  RETURN_IF_ERROR(CheckAtLeast("worker.master_wait_s", worker.master_wait_s, 0));
  RETURN_IF_ERROR(CheckAtLeast("worker.max_records_per_s", worker.max_records_per_s, 0));

  RETURN_IF_ERROR(CheckAtLeast("master.heartbeat_ms", master.heartbeat_ms, 1));
  if (master.lease_ms <= master.heartbeat_ms) {
    return OptionError("master.lease_ms",
                       absl::StrCat("must be greater than master.heartbeat_ms (", master.lease_ms,
                                    " <= ", master.heartbeat_ms, ")"));
  }
  if (master.bind_host.empty()) return OptionError("master.bind_host", "must not be empty");

  RETURN_IF_ERROR(CheckAtLeast("checkpoint.interval_s", checkpoint.interval_s, 1));
  return absl::OkStatus();
}

std::string JobConfig::DebugString() const {
  PrintVisitor printer;
  const_cast<JobConfig*>(this)->VisitOptions(printer);
  return printer.str();
}

}  // namespace eps
