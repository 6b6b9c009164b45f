#include "core/job_config.h"

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/data_schema.h"

namespace eps {
namespace {

Status OptionError(absl::string_view option, absl::string_view message) {
  Status status = absl::InvalidArgumentError(absl::StrCat("option '", option, "': ", message));
  status.SetPayload(kOptionPayload, absl::Cord(option));
  return status;
}

// Upper bounds of times, chosen so that every one (and rpc_timeout_ms times
// rpc_attempts) fits the uint32 milliseconds and the int counts it travels
// as.
constexpr int64_t kDayMs = 86'400'000;
constexpr int64_t kDayS = 86'400;
constexpr int64_t kWeekS = 7 * kDayS;

// `value` in [min, max]; `what` names the bound when there is one worth
// naming ("a day").
Status CheckRange(absl::string_view option, int64_t value, int64_t min, int64_t max,
                  absl::string_view what = "") {
  if (value >= min && value <= max) return absl::OkStatus();
  return OptionError(option, absl::StrCat("must be in [", min, ", ", max, "]",
                                          what.empty() ? "" : absl::StrCat(" (", what, ")"),
                                          " (got ", value, ")"));
}

Status CheckOneOf(absl::string_view option, const std::string& value,
                  std::initializer_list<absl::string_view> allowed) {
  for (absl::string_view a : allowed) {
    if (value == a) return absl::OkStatus();
  }
  return OptionError(option, absl::StrCat("'", value, "' is not one of: ",
                                          absl::StrJoin(allowed, ", ")));
}

constexpr char kPerTableOption[] = "optimizer.per_table";
constexpr char kMlpOption[] = "optimizer.mlp";

// The numeric settings of JobConfig::Optimizer, by key (the option name
// without "optimizer."), with the values each accepts.
// The values travel to the servers as floats (OptimizerSpec), so each must
// be one: at most FLT_MAX, a positive one at least the smallest positive
// float (1e-50 would become 0), one below 1 below 1 as a float.
struct OptimizerField {
  enum class Range { kPositive, kNonNegative, kUnitInterval };
  const char* key;
  double JobConfig::Optimizer::*member;
  Range range;
};

constexpr OptimizerField kOptimizerFields[] = {
    {"learning_rate", &JobConfig::Optimizer::learning_rate, OptimizerField::Range::kPositive},
    {"initial_accumulator", &JobConfig::Optimizer::initial_accumulator,
     OptimizerField::Range::kNonNegative},
    {"epsilon", &JobConfig::Optimizer::epsilon, OptimizerField::Range::kPositive},
    {"l2", &JobConfig::Optimizer::l2, OptimizerField::Range::kNonNegative},
    {"beta1", &JobConfig::Optimizer::beta1, OptimizerField::Range::kUnitInterval},
    {"beta2", &JobConfig::Optimizer::beta2, OptimizerField::Range::kUnitInterval},
    {"ftrl_beta", &JobConfig::Optimizer::ftrl_beta, OptimizerField::Range::kNonNegative},
    {"l1", &JobConfig::Optimizer::l1, OptimizerField::Range::kNonNegative},
    {"clip", &JobConfig::Optimizer::clip, OptimizerField::Range::kNonNegative},
};

constexpr absl::string_view kOptimizerTypes[] = {"sgd", "adagrad", "adam", "ftrl"};

// Checks one set of optimizer settings. `error(key, message)` makes the
// Status, naming where the setting came from.
Status CheckOptimizer(const JobConfig::Optimizer& optimizer,
                      const std::function<Status(absl::string_view, absl::string_view)>& error) {
  bool known_type = false;
  for (absl::string_view type : kOptimizerTypes) known_type |= optimizer.type == type;
  if (!known_type) {
    return error("type", absl::StrCat("'", optimizer.type,
                                      "' is not one of: ", absl::StrJoin(kOptimizerTypes, ", ")));
  }
  // Comparisons are written so that NaN fails them.
  for (const OptimizerField& field : kOptimizerFields) {
    const double value = optimizer.*field.member;
    std::string requirement;
    switch (field.range) {
      case OptimizerField::Range::kPositive:
        if (!(value >= FLT_TRUE_MIN && value <= FLT_MAX)) {
          requirement = absl::StrCat("must be finite and > 0, in [", FLT_TRUE_MIN, ", ", FLT_MAX,
                                     "] (a float's range)");
        }
        break;
      case OptimizerField::Range::kNonNegative:
        if (!(value >= 0 && value <= FLT_MAX)) {
          requirement =
              absl::StrCat("must be finite and >= 0, at most ", FLT_MAX, " (a float's largest)");
        }
        break;
      case OptimizerField::Range::kUnitInterval:
        if (!(value >= 0 && value < 1 && static_cast<float>(value) < 1.0f)) {
          requirement = absl::StrCat("must be in [0, 1), and below 1 as a float (at most ",
                                     std::nextafter(1.0f, 0.0f), ")");
        }
        break;
    }
    if (!requirement.empty()) {
      return error(field.key, absl::StrCat(requirement, " (got ", value, ")"));
    }
  }
  return absl::OkStatus();
}

// Whether every process of a job must have the master's value of option
// `name` (JobConfig::SharedOptions): what defines the model and its update
// rule, how data is parsed, where keys live, what an acknowledged push
// promises, and the heartbeat and lease every member keeps.
bool IsSharedOption(absl::string_view name) {
  static constexpr absl::string_view kShared[] = {
      "job.seed",          "data.format",          "data.schema",
      "data.multi_value_separator", "ps.num_servers", "ps.partitions",
      "ps.dense_chunk_floats", "ps.durability",    "master.heartbeat_ms",
      "master.lease_ms",   "worker.max_staleness"};
  if (absl::StartsWith(name, "model.") || absl::StartsWith(name, "optimizer.")) return true;
  for (absl::string_view shared : kShared) {
    if (name == shared) return true;
  }
  return false;
}

// The shortest text that reads back as the same double: exact, and "0.05"
// rather than "0.050000000000000003".
std::string ExactText(double value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

// Sees every option's value as text (doubles exact); subclasses Take each.
class TextVisitor : public OptionVisitor {
 public:
  void Visit(absl::string_view name, std::string* value, absl::string_view) override {
    Take(name, *value);
  }
  void Visit(absl::string_view name, int64_t* value, absl::string_view) override {
    Take(name, absl::StrCat(*value));
  }
  void Visit(absl::string_view name, double* value, absl::string_view) override {
    Take(name, ExactText(*value));
  }
  void Visit(absl::string_view name, bool* value, absl::string_view) override {
    Take(name, *value ? "true" : "false");
  }
  void Visit(absl::string_view name, IntOrAuto* value, absl::string_view) override {
    Take(name, value->ToString());
  }

 protected:
  virtual void Take(absl::string_view name, std::string value) = 0;
};

// Collects the shared options.
class SharedOptionsVisitor : public TextVisitor {
 public:
  std::vector<std::pair<std::string, std::string>> options() const { return options_; }

 private:
  void Take(absl::string_view name, std::string value) override {
    if (IsSharedOption(name)) options_.emplace_back(std::string(name), std::move(value));
  }
  std::vector<std::pair<std::string, std::string>> options_;
};

// "section.key = value" lines.
class PrintVisitor : public TextVisitor {
 public:
  const std::string& str() const { return out_; }

 private:
  void Take(absl::string_view name, std::string value) override {
    absl::StrAppend(&out_, name, " = ", value, "\n");
  }
  std::string out_;
};

// An INI file, a [section] before its first key; the first option whose
// value a job file cannot hold is kept in status().
class IniVisitor : public TextVisitor {
 public:
  const std::string& text() const { return out_; }
  const Status& status() const { return status_; }

 private:
  void Take(absl::string_view name, std::string value) override {
    if (status_.ok() && value.find_first_of("#\n") != std::string::npos) {
      status_ = OptionError(name, absl::StrCat("'", value,
                                               "' cannot be written to a job file (a '#' starts "
                                               "a comment there): give it without '#'"));
    }
    const size_t dot = name.find('.');
    const absl::string_view section = name.substr(0, dot);
    if (section != section_) {
      absl::StrAppend(&out_, out_.empty() ? "" : "\n", "[", section, "]\n");
      section_ = std::string(section);
    }
    absl::StrAppend(&out_, name.substr(dot + 1), " = ", value, "\n");
  }
  std::string out_;
  std::string section_;
  Status status_;
};

// [autoscale]: off (source none) needs nothing more; each source and
// launcher needs its own settings.
Status ValidateAutoscale(const JobConfig::Autoscale& a) {
  RETURN_IF_ERROR(CheckOneOf("autoscale.source", a.source, {"none", "slurm", "prometheus", "command"}));
  RETURN_IF_ERROR(CheckOneOf("autoscale.launcher", a.launcher, {"local", "slurm", "command"}));
  RETURN_IF_ERROR(CheckRange("autoscale.source_timeout_s", a.source_timeout_s, 1, 3600));
  RETURN_IF_ERROR(CheckRange("autoscale.min_workers", a.min_workers, 0, 10000));
  RETURN_IF_ERROR(CheckRange("autoscale.max_workers", a.max_workers,
                             std::max<int64_t>(1, a.min_workers), 10000,
                             "at least autoscale.min_workers"));
  RETURN_IF_ERROR(CheckRange("autoscale.gpus_per_worker", a.gpus_per_worker, 1, 1024));
  RETURN_IF_ERROR(CheckRange("autoscale.scale_up_free_gpus", a.scale_up_free_gpus, 1, 1'000'000));
  RETURN_IF_ERROR(CheckRange("autoscale.scale_down_free_gpus", a.scale_down_free_gpus, 0,
                             a.scale_up_free_gpus, "autoscale.scale_up_free_gpus"));
  RETURN_IF_ERROR(CheckRange("autoscale.interval_s", a.interval_s, 1, kDayS, "a day"));
  RETURN_IF_ERROR(CheckRange("autoscale.cooldown_s", a.cooldown_s, 0, kDayS, "a day"));
  RETURN_IF_ERROR(CheckRange("autoscale.scale_up_stabilization_s", a.scale_up_stabilization_s, 0,
                             kDayS, "a day"));
  RETURN_IF_ERROR(CheckRange("autoscale.scale_down_stabilization_s",
                             a.scale_down_stabilization_s, 0, kDayS, "a day"));
  RETURN_IF_ERROR(CheckRange("autoscale.max_restarts", a.max_restarts, 0, 1'000'000));
  RETURN_IF_ERROR(CheckRange("autoscale.restart_backoff_s", a.restart_backoff_s, 0, 3600));
  RETURN_IF_ERROR(CheckRange("autoscale.max_servers", a.max_servers, 0, 4096));
  if (a.max_servers > 0) {
    RETURN_IF_ERROR(CheckRange("autoscale.min_servers", a.min_servers, 1, a.max_servers,
                               "autoscale.max_servers"));
  }
  if (!(a.servers_memory_high > 0 && a.servers_memory_high <= 1)) {
    return OptionError("autoscale.servers_memory_high",
                       absl::StrCat("must be in (0, 1], a fraction of ps.memory_budget_mb (got ",
                                    a.servers_memory_high, ")"));
  }
  if (!(a.servers_min_hit_rate >= 0 && a.servers_min_hit_rate <= 1)) {
    return OptionError("autoscale.servers_min_hit_rate",
                       absl::StrCat("must be in [0, 1] (got ", a.servers_min_hit_rate, ")"));
  }
  if (!(a.servers_max_push_ms >= 0 && std::isfinite(a.servers_max_push_ms))) {
    return OptionError("autoscale.servers_max_push_ms",
                       absl::StrCat("must be a number of ms >= 0 (got ", a.servers_max_push_ms,
                                    ")"));
  }
  if (a.source == "none") return absl::OkStatus();
  if ((a.source == "slurm" || a.launcher == "slurm") && a.partition.empty()) {
    return OptionError("autoscale.partition",
                       absl::StrCat("is required when autoscale.",
                                    a.source == "slurm" ? "source" : "launcher",
                                    " = slurm: the Slurm partition the workers run in"));
  }
  if (a.source == "command" && a.command.empty()) {
    return OptionError("autoscale.command", "is required when autoscale.source = command");
  }
  if (a.source == "prometheus") {
    if (!absl::StartsWith(a.prometheus_url, "http://")) {
      return OptionError("autoscale.prometheus_url",
                         absl::StrCat("must be http://HOST:PORT when autoscale.source = "
                                      "prometheus (got '",
                                      a.prometheus_url, "')"));
    }
    if (a.query.empty()) {
      return OptionError("autoscale.query", "is required when autoscale.source = prometheus");
    }
  }
  if (a.launcher == "command") {
    if (a.start_command.empty()) {
      return OptionError("autoscale.start_command",
                         "is required when autoscale.launcher = command");
    }
    if (a.stop_command.empty()) {
      return OptionError("autoscale.stop_command", "is required when autoscale.launcher = command");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string IntOrAuto::ToString() const { return automatic ? "auto" : absl::StrCat(value); }

bool IntOrAuto::Parse(absl::string_view text, IntOrAuto* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text == "auto") {
    *out = IntOrAuto{0, true};
    return true;
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return false;
  *out = IntOrAuto{value, false};
  return true;
}

StatusOr<std::vector<int>> ParseLayerSizes(absl::string_view option, const std::string& value) {
  std::vector<int> sizes;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int size = 0;
    if (!absl::SimpleAtoi(item, &size) || size < 1 || size > 65536) {
      return OptionError(option, absl::StrCat("'", item,
                                              "' is not a layer size (an integer in [1, 65536]); "
                                              "expected sizes like 512,256,1"));
    }
    sizes.push_back(size);
  }
  return sizes;
}

Status JobConfig::Validate() const {
  // Every numeric option has both bounds, so that no value that passes can
  // wrap or overflow where it travels (uint32 epochs and milliseconds on
  // the wire, int counts, MiB << 20, floats in the job spec).
  RETURN_IF_ERROR(CheckRange("job.epochs", job.epochs, 1, 1'000'000));
  RETURN_IF_ERROR(CheckRange("job.seed", job.seed, 0, std::numeric_limits<int64_t>::max()));
  RETURN_IF_ERROR(
      CheckRange("job.progress_interval_s", job.progress_interval_s, 1, kDayS, "a day"));
  if (!(job.divergence_factor == 0 ||
        (job.divergence_factor > 1 && job.divergence_factor <= 1e6))) {
    return OptionError("job.divergence_factor", absl::StrCat("must be 0 (off) or in (1, 1e6] (got ",
                                                             job.divergence_factor, ")"));
  }

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
  if (data.multi_value_separator.size() != 1 || data.multi_value_separator == "\t") {
    return OptionError("data.multi_value_separator", "must be one character other than a tab");
  }
  RETURN_IF_ERROR(CheckRange("data.shard_records", data.shard_records, 1, 1'000'000'000));
  RETURN_IF_ERROR(CheckOneOf("data.on_unreadable", data.on_unreadable, {"fail", "skip"}));

  RETURN_IF_ERROR(CheckOneOf("model.type", model.type, {"lr", "wdl", "deepfm", "dlrm"}));
  RETURN_IF_ERROR(CheckRange("model.embedding_dim", model.embedding_dim, 1, 4096));
  RETURN_IF_ERROR(
      CheckOneOf("model.initializer", model.initializer, {"auto", "zeros", "normal", "uniform"}));
  // Also keeps every draw (up to 2 * init_scale) a finite float.
  if (!(model.init_scale >= 0 && model.init_scale <= 1e6)) {
    return OptionError("model.init_scale",
                       absl::StrCat("must be in [0, 1e6] (got ", model.init_scale, ")"));
  }
  RETURN_IF_ERROR(CheckOneOf("model.activation", model.activation, {"relu", "sigmoid", "tanh"}));
  RETURN_IF_ERROR(CheckOneOf("model.pooling", model.pooling, {"sum", "mean"}));
  ASSIGN_OR_RETURN(std::vector<int> mlp, ParseLayerSizes("model.mlp", model.mlp));
  ASSIGN_OR_RETURN(std::vector<int> bottom, ParseLayerSizes("model.bottom_mlp", model.bottom_mlp));
  ASSIGN_OR_RETURN(std::vector<int> top, ParseLayerSizes("model.top_mlp", model.top_mlp));
  if (mlp.back() != 1) {
    return OptionError("model.mlp", absl::StrCat("the last layer must have size 1 (the logit), got ",
                                                 mlp.back()));
  }
  if (top.back() != 1) {
    return OptionError("model.top_mlp",
                       absl::StrCat("the last layer must have size 1 (the logit), got ", top.back()));
  }
  if (model.type == "dlrm" && bottom.back() != model.embedding_dim) {
    return OptionError("model.bottom_mlp",
                       absl::StrCat("the last layer must have size model.embedding_dim = ",
                                    model.embedding_dim, " (its output meets the embeddings), got ",
                                    bottom.back()));
  }

  RETURN_IF_ERROR(CheckOptimizer(optimizer, [](absl::string_view key, absl::string_view message) {
    return OptionError(absl::StrCat("optimizer.", key), message);
  }));
  RETURN_IF_ERROR(MlpOptimizer().status());
  RETURN_IF_ERROR(OptimizerOverrides().status());
  RETURN_IF_ERROR(CheckOneOf("optimizer.lr_scaling", optimizer.lr_scaling, {"none", "linear", "sqrt"}));
  RETURN_IF_ERROR(
      CheckRange("optimizer.lr_warmup_batches", optimizer.lr_warmup_batches, 0, 1'000'000));
  RETURN_IF_ERROR(
      CheckRange("optimizer.dense_global_batch", optimizer.dense_global_batch, 0, 1 << 30));

  RETURN_IF_ERROR(CheckRange("ps.num_servers", ps.num_servers, 1, 1 << 20));
  RETURN_IF_ERROR(CheckRange("ps.partitions", ps.partitions, ps.num_servers, 1 << 20,
                             "at least ps.num_servers"));
  RETURN_IF_ERROR(CheckRange("ps.threads", ps.threads, 1, 1024));
  RETURN_IF_ERROR(
      CheckRange("ps.memory_budget_mb", ps.memory_budget_mb, 0, int64_t{1} << 24, "16 TiB"));
  RETURN_IF_ERROR(CheckRange("ps.flush_interval_ms", ps.flush_interval_ms, 1, kDayMs, "a day"));
  RETURN_IF_ERROR(CheckRange("ps.journal_mb", ps.journal_mb, 0, int64_t{1} << 20, "1 TiB"));
  RETURN_IF_ERROR(CheckRange("ps.master_wait_s", ps.master_wait_s, 0, kWeekS, "a week"));
  RETURN_IF_ERROR(CheckRange("ps.leave_timeout_s", ps.leave_timeout_s, 0, kWeekS, "a week"));
  RETURN_IF_ERROR(CheckRange("ps.rpc_timeout_ms", ps.rpc_timeout_ms, 1, kDayMs, "a day"));
  RETURN_IF_ERROR(
      CheckRange("ps.dense_chunk_floats", ps.dense_chunk_floats, 1, 1 << 20, "4 MiB chunks"));
  RETURN_IF_ERROR(CheckRange("ps.max_new_rows_s", ps.max_new_rows_s, 0, int64_t{1} << 40));
  RETURN_IF_ERROR(CheckRange("ps.max_new_rows_per_worker_s", ps.max_new_rows_per_worker_s, 0,
                             int64_t{1} << 40));
  RETURN_IF_ERROR(CheckRange("ps.admission_min_count", ps.admission_min_count, 0, 65535));
  for (const auto& [option, path] : {std::pair<const char*, const std::string*>{"job.export_dir",
                                                                               &job.export_dir},
                                     {"job.init_from", &job.init_from}}) {
    if (!path->empty() && (*path)[0] != '/') {
      return OptionError(option, absl::StrCat("'", *path,
                                              "' is not an absolute path: the servers and the "
                                              "master each read it from their own directory"));
    }
  }
  RETURN_IF_ERROR(CheckRange("ps.admission_memory_mb", ps.admission_memory_mb, 1, 65536));
  RETURN_IF_ERROR(CheckRange("ps.ttl_passes", ps.ttl_passes, 0, 65535));
  RETURN_IF_ERROR(RowPolicies().status());

  if (worker.batch_size.automatic) {
    RETURN_IF_ERROR(CheckRange("worker.max_batch_size", worker.max_batch_size, 1, 1 << 20));
    RETURN_IF_ERROR(CheckRange("worker.min_batch_size", worker.min_batch_size, 1,
                               worker.max_batch_size, "worker.max_batch_size"));
  } else {
    RETURN_IF_ERROR(CheckRange("worker.batch_size", worker.batch_size.value, 1, 1 << 20));
  }
  RETURN_IF_ERROR(CheckRange("worker.prefetch_batches", worker.prefetch_batches, 1, 1024));
  RETURN_IF_ERROR(CheckRange("worker.max_staleness", worker.max_staleness, 0, 1024));
  if (optimizer.dense_global_batch > 0 && worker.max_staleness > 0) {
    // A step started from a copy already pushed on has no reservation of
    // its own in the global batch (ps/global_batch.h): its push would be
    // dropped whenever the batch stepped in between.
    return OptionError("worker.max_staleness",
                       absl::StrCat("must be 0 with optimizer.dense_global_batch (got ",
                                    worker.max_staleness,
                                    "): each step reads its own version of the dense tensors"));
  }
  RETURN_IF_ERROR(CheckRange("worker.rpc_timeout_ms", worker.rpc_timeout_ms, 1, kDayMs, "a day"));
  RETURN_IF_ERROR(CheckRange("worker.rpc_attempts", worker.rpc_attempts, 1, 1000));
  // A worker's whole call gives up within a day too.
  if (worker.rpc_timeout_ms * worker.rpc_attempts > kDayMs) {
    return OptionError(
        "worker.rpc_attempts",
        absl::StrCat("times worker.rpc_timeout_ms must be at most ", kDayMs, " ms, a day (got ",
                     worker.rpc_attempts, " x ", worker.rpc_timeout_ms, " ms)"));
  }
  RETURN_IF_ERROR(CheckRange("worker.master_wait_s", worker.master_wait_s, 0, kWeekS, "a week"));
  RETURN_IF_ERROR(
      CheckRange("worker.max_records_per_s", worker.max_records_per_s, 0, 1'000'000'000));
  RETURN_IF_ERROR(CheckRange("worker.compute_threads", worker.compute_threads, 0, 1024));

  RETURN_IF_ERROR(CheckRange("master.heartbeat_ms", master.heartbeat_ms, 1, kDayMs, "a day"));
  if (master.lease_ms <= master.heartbeat_ms) {
    return OptionError("master.lease_ms",
                       absl::StrCat("must be greater than master.heartbeat_ms (", master.lease_ms,
                                    " <= ", master.heartbeat_ms, ")"));
  }
  RETURN_IF_ERROR(CheckRange("master.lease_ms", master.lease_ms, 2, kDayMs, "a day"));
  if (master.bind_host.empty()) return OptionError("master.bind_host", "must not be empty");
  RETURN_IF_ERROR(
      CheckRange("master.recovery_timeout_s", master.recovery_timeout_s, 1, kWeekS, "a week"));
  RETURN_IF_ERROR(
      CheckRange("master.progress_timeout_s", master.progress_timeout_s, 1, kWeekS, "a week"));
  RETURN_IF_ERROR(CheckRange("master.worker_wait_s", master.worker_wait_s, 0, kWeekS, "a week"));
  RETURN_IF_ERROR(CheckRange("master.max_workers", master.max_workers, 0, 65536));
  RETURN_IF_ERROR(CheckRange("master.eval_check_records", master.eval_check_records, 0, 4096));

  RETURN_IF_ERROR(CheckRange("checkpoint.interval_s", checkpoint.interval_s, 1, kWeekS, "a week"));
  RETURN_IF_ERROR(CheckRange("checkpoint.keep", checkpoint.keep, 1, 1000));
  RETURN_IF_ERROR(CheckRange("checkpoint.max_failures", checkpoint.max_failures, 0, 1000));
  RETURN_IF_ERROR(CheckOneOf("checkpoint.on_server_failure", checkpoint.on_server_failure,
                             {"rollback", "continue"}));
  RETURN_IF_ERROR(CheckOneOf("ps.durability", ps.durability, {"flush", "every_push"}));
  RETURN_IF_ERROR(CheckOneOf("worker.dense_wire", worker.dense_wire, {"float32", "bfloat16"}));
  RETURN_IF_ERROR(CheckOneOf("security.mode", security.mode, {"curve", "off"}));
  return ValidateAutoscale(autoscale);
}


namespace {

using BadFn = std::function<Status(absl::string_view why)>;

// Calls visit(key, value) for each "key=value" of "key=value[,key=value...]"
// (whitespace trimmed); `bad(why)` makes the error for a piece that is not
// key=value and for a key set twice. *keys (when given) gets the keys.
Status ForEachSetting(absl::string_view settings, const BadFn& bad,
                      const std::function<Status(const std::string&, absl::string_view)>& visit,
                      std::set<std::string>* keys = nullptr) {
  std::set<std::string> seen;
  for (absl::string_view setting : absl::StrSplit(settings, ',')) {
    setting = absl::StripAsciiWhitespace(setting);
    const size_t eq = setting.find('=');
    if (eq == absl::string_view::npos) {
      return bad(absl::StrCat("'", setting, "' is not key=value"));
    }
    const std::string key(absl::StripAsciiWhitespace(setting.substr(0, eq)));
    if (!seen.insert(key).second) return bad(absl::StrCat("key '", key, "' is set twice"));
    RETURN_IF_ERROR(visit(key, absl::StripAsciiWhitespace(setting.substr(eq + 1))));
  }
  if (keys != nullptr) *keys = std::move(seen);
  return absl::OkStatus();
}

// Calls visit(table, settings, bad) for each "TABLE:settings" entry of a
// per-table option's `text` ("TABLE:...[;TABLE:...]"; empty entries, as in
// "a:...;" or "a:...;;b:...", skipped). `bad(why)` names `option` and the
// entry; so do the errors for an entry without ':', without a table name,
// with nothing after ':', or naming a table named before.
Status ForEachTableEntry(
    const char* option, absl::string_view text,
    const std::function<Status(const std::string&, absl::string_view, const BadFn&)>& visit) {
  std::set<std::string> tables;
  for (absl::string_view entry : absl::StrSplit(text, ';')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    const BadFn bad = [option, entry](absl::string_view why) {
      return OptionError(option, absl::StrCat("entry '", entry, "': ", why));
    };
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) return bad("expected TABLE:key=value[,key=value...]");
    const std::string table(absl::StripAsciiWhitespace(entry.substr(0, colon)));
    if (table.empty()) return bad("no table name before ':'");
    if (!tables.insert(table).second) {
      return bad(absl::StrCat("table '", table, "' is named in more than one entry"));
    }
    const absl::string_view settings = absl::StripAsciiWhitespace(entry.substr(colon + 1));
    if (settings.empty()) return bad("sets nothing after ':'");
    RETURN_IF_ERROR(visit(table, settings, bad));
  }
  return absl::OkStatus();
}

// Applies "key=value[,key=value...]" (keys as in optimizer.per_table) over
// *optimizer and checks the result; `bad(why)` makes the error, naming
// where the settings came from (a bad value they did not set is named as
// its [optimizer] option).
Status ApplyOptimizerSettings(absl::string_view settings, const BadFn& bad,
                              JobConfig::Optimizer* optimizer) {
  std::set<std::string> keys_seen;
  RETURN_IF_ERROR(ForEachSetting(
      settings, bad,
      [&](const std::string& key, absl::string_view value) -> Status {
        if (key == "type") {
          optimizer->type = std::string(value);
          return absl::OkStatus();
        }
        const OptimizerField* field = nullptr;
        for (const OptimizerField& f : kOptimizerFields) {
          if (key == f.key) field = &f;
        }
        if (field == nullptr) {
          std::vector<std::string> known = {"type"};
          for (const OptimizerField& f : kOptimizerFields) known.emplace_back(f.key);
          return bad(
              absl::StrCat("unknown key '", key, "' (known: ", absl::StrJoin(known, ", "), ")"));
        }
        if (!absl::SimpleAtod(value, &(optimizer->*field->member))) {
          return bad(absl::StrCat(key, " = '", value, "' is not a number"));
        }
        return absl::OkStatus();
      },
      &keys_seen));
  // A bad value the settings did not set came from the section.
  return CheckOptimizer(*optimizer, [&](absl::string_view key, absl::string_view message) {
    if (!keys_seen.contains(std::string(key))) {
      return OptionError(absl::StrCat("optimizer.", key), message);
    }
    return bad(absl::StrCat(key, " ", message));
  });
}

}  // namespace

int64_t JobConfig::MaxWorkers() const {
  if (master.max_workers > 0) return master.max_workers;
  if (autoscale.source == "none") return 256;
  return autoscale.max_workers + std::max<int64_t>(8, autoscale.max_workers / 4);
}

StatusOr<std::map<std::string, JobConfig::RowPolicy>> JobConfig::RowPolicies() const {
  std::map<std::string, RowPolicy> policies;
  RETURN_IF_ERROR(ForEachTableEntry(
      "ps.per_table", ps.per_table,
      [&](const std::string& table, absl::string_view settings, const BadFn& bad) {
        RowPolicy policy{.admission_min_count = ps.admission_min_count,
                         .ttl_passes = ps.ttl_passes};
        RETURN_IF_ERROR(ForEachSetting(
            settings, bad, [&](const std::string& key, absl::string_view value) -> Status {
              int64_t* field = key == "admission_min_count" ? &policy.admission_min_count
                               : key == "ttl_passes"        ? &policy.ttl_passes
                                                            : nullptr;
              if (field == nullptr) {
                return bad(absl::StrCat("unknown key '", key,
                                        "' (known: admission_min_count, ttl_passes)"));
              }
              if (!absl::SimpleAtoi(value, field) || *field < 0 || *field > 65535) {
                return bad(absl::StrCat(key, " = '", value, "' is not an integer in [0, 65535]"));
              }
              return absl::OkStatus();
            }));
        policies.emplace(table, policy);
        return absl::OkStatus();
      }));
  return policies;
}

StatusOr<JobConfig::Optimizer> JobConfig::MlpOptimizer() const {
  Optimizer mlp = optimizer;
  mlp.per_table.clear();
  mlp.mlp.clear();
  const absl::string_view settings = absl::StripAsciiWhitespace(optimizer.mlp);
  if (settings.empty()) return mlp;
  RETURN_IF_ERROR(ApplyOptimizerSettings(
      settings,
      [settings](absl::string_view why) {
        return OptionError(kMlpOption, absl::StrCat("'", settings, "': ", why));
      },
      &mlp));
  return mlp;
}

StatusOr<std::map<std::string, JobConfig::Optimizer>> JobConfig::OptimizerOverrides(
    const std::function<bool(absl::string_view)>& is_mlp) const {
  std::map<std::string, Optimizer> overrides;
  Optimizer section = optimizer;
  section.per_table.clear();
  section.mlp.clear();
  ASSIGN_OR_RETURN(const Optimizer mlp_base, MlpOptimizer());
  RETURN_IF_ERROR(ForEachTableEntry(
      kPerTableOption, optimizer.per_table,
      [&](const std::string& table, absl::string_view settings, const BadFn& bad) {
        Optimizer table_optimizer = is_mlp && is_mlp(table) ? mlp_base : section;
        RETURN_IF_ERROR(ApplyOptimizerSettings(settings, bad, &table_optimizer));
        overrides.emplace(table, std::move(table_optimizer));
        return absl::OkStatus();
      }));
  return overrides;
}

std::string JobConfig::DebugString() const {
  PrintVisitor printer;
  const_cast<JobConfig*>(this)->VisitOptions(printer);
  return printer.str();
}

StatusOr<std::string> JobConfig::ToIni() const {
  IniVisitor writer;
  const_cast<JobConfig*>(this)->VisitOptions(writer);
  RETURN_IF_ERROR(writer.status());
  return writer.text();
}

std::vector<std::pair<std::string, std::string>> JobConfig::SharedOptions() const {
  SharedOptionsVisitor collector;
  const_cast<JobConfig*>(this)->VisitOptions(collector);
  return collector.options();
}

std::string DescribeOptionDifferences(
    const std::vector<std::pair<std::string, std::string>>& member,
    const std::vector<std::pair<std::string, std::string>>& master) {
  const std::map<std::string, std::string> theirs(master.begin(), master.end());
  std::vector<std::string> differences;
  std::set<std::string> named;
  for (const auto& [name, value] : member) {
    named.insert(name);
    auto it = theirs.find(name);
    const std::string master_value = it == theirs.end() ? "(not set)" : it->second;
    if (master_value != value) {
      differences.push_back(absl::StrCat(name, " = ", value, " (the master has ", master_value, ")"));
    }
  }
  for (const auto& [name, value] : master) {
    if (!named.contains(name)) {
      differences.push_back(absl::StrCat(name, " = (not set) (the master has ", value, ")"));
    }
  }
  return absl::StrJoin(differences, "; ");
}

}  // namespace eps
