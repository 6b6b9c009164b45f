// Tests core/job_config.h: option names, Validate and DebugString.

#include "core/job_config.h"

#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_config_boundaries.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

JobConfig ValidConfig() {
  JobConfig config;
  config.data.train = "/data/train";
  return config;
}

// Collects every option name.
class NameCollector : public OptionVisitor {
 public:
  void Visit(absl::string_view name, std::string*, absl::string_view help) override {
    Add(name, help);
  }
  void Visit(absl::string_view name, int64_t*, absl::string_view help) override { Add(name, help); }
  void Visit(absl::string_view name, double*, absl::string_view help) override { Add(name, help); }
  void Visit(absl::string_view name, bool*, absl::string_view help) override { Add(name, help); }
  void Visit(absl::string_view name, IntOrAuto*, absl::string_view help) override {
    Add(name, help);
  }

  std::vector<std::string> names;
  std::vector<std::string> helps;

 private:
  void Add(absl::string_view name, absl::string_view help) {
    names.emplace_back(name);
    helps.emplace_back(help);
  }
};

TEST(JobConfig, DefaultsWithTrainingDataAreValid) {
  EXPECT_TRUE(ValidConfig().Validate().ok()) << ValidConfig().Validate();
}

// Servers and the master each resolve a path from their own directory: the
// model export's paths must be absolute.
TEST(JobConfig, ModelExportPathsMustBeAbsolute) {
  for (const char* option : {"export_dir", "init_from"}) {
    JobConfig config;
    config.data.train = "/data/train";
    (std::string(option) == "export_dir" ? config.job.export_dir : config.job.init_from) =
        "models/day1";
    const Status status = config.Validate();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << option;
    EXPECT_THAT(std::string(status.message()), HasSubstr(std::string("job.") + option));
    EXPECT_THAT(std::string(status.message()), HasSubstr("absolute"));
    (std::string(option) == "export_dir" ? config.job.export_dir : config.job.init_from) =
        "/models/day1";
    EXPECT_TRUE(config.Validate().ok()) << option;
  }
}

TEST(JobConfig, OptionNamesAreUniqueAndSectioned) {
  JobConfig config;
  NameCollector collector;
  config.VisitOptions(collector);
  const std::set<std::string> sections = {"job",       "data",    "model",  "optimizer",
                                          "ps",        "worker",  "master", "checkpoint",
                                          "autoscale", "security"};
  std::set<std::string> seen;
  for (size_t i = 0; i < collector.names.size(); ++i) {
    const std::string& name = collector.names[i];
    SCOPED_TRACE(name);
    EXPECT_TRUE(seen.insert(name).second) << "duplicate option";
    const size_t dot = name.find('.');
    ASSERT_NE(dot, std::string::npos);
    EXPECT_TRUE(sections.count(name.substr(0, dot))) << "unknown section";
    EXPECT_FALSE(collector.helps[i].empty());
  }
  // The keys the user-facing contract (DESIGN.md section 12) promises.
  for (const char* required : {"job.epochs", "job.seed", "data.train", "data.eval", "data.format",
                               "data.shard_records", "model.type", "model.embedding_dim",
                               "worker.batch_size", "ps.memory_budget_mb", "ps.flush_interval_ms",
                               "master.heartbeat_ms", "master.lease_ms", "checkpoint.interval_s"}) {
    EXPECT_TRUE(seen.count(required)) << required;
  }
}

TEST(JobConfig, VisitorPointsAtTheFields) {
  JobConfig config;
  class Setter : public OptionVisitor {
   public:
    void Visit(absl::string_view name, std::string* v, absl::string_view) override {
      if (name == "data.train") *v = "set";
    }
    void Visit(absl::string_view name, int64_t* v, absl::string_view) override {
      if (name == "worker.min_batch_size") *v = 77;
    }
    void Visit(absl::string_view name, double* v, absl::string_view) override {
      if (name == "optimizer.learning_rate") *v = 0.5;
    }
    void Visit(absl::string_view, bool*, absl::string_view) override {}
    void Visit(absl::string_view name, IntOrAuto* v, absl::string_view) override {
      if (name == "worker.batch_size") *v = IntOrAuto{0, true};
    }
  } setter;
  config.VisitOptions(setter);
  EXPECT_EQ(config.data.train, "set");
  EXPECT_EQ(config.worker.min_batch_size, 77);
  EXPECT_TRUE(config.worker.batch_size.automatic);
  EXPECT_DOUBLE_EQ(config.optimizer.learning_rate, 0.5);
}

struct BadCase {
  std::string option;
  std::function<void(JobConfig&)> mutate;
};

TEST(JobConfig, ValidateNamesTheOffendingOption) {
  const std::vector<BadCase> cases = {
      {"job.epochs", [](JobConfig& c) { c.job.epochs = 0; }},
      {"job.seed", [](JobConfig& c) { c.job.seed = -1; }},
      {"job.progress_interval_s", [](JobConfig& c) { c.job.progress_interval_s = 0; }},
      {"data.train", [](JobConfig& c) { c.data.train.clear(); }},
      {"data.format", [](JobConfig& c) { c.data.format = "csv"; }},
      {"data.schema", [](JobConfig& c) { c.data.format = "tsv"; }},
      {"data.schema", [](JobConfig& c) { c.data.schema = "label,dense*13"; }},
      {"data.shard_records", [](JobConfig& c) { c.data.shard_records = 0; }},
      {"data.multi_value_separator", [](JobConfig& c) { c.data.multi_value_separator = ""; }},
      {"data.multi_value_separator", [](JobConfig& c) { c.data.multi_value_separator = ",;"; }},
      {"data.multi_value_separator", [](JobConfig& c) { c.data.multi_value_separator = "\t"; }},
      {"model.type", [](JobConfig& c) { c.model.type = "gpt"; }},
      {"model.embedding_dim", [](JobConfig& c) { c.model.embedding_dim = 0; }},
      {"model.embedding_dim", [](JobConfig& c) { c.model.embedding_dim = 4097; }},
      {"model.initializer", [](JobConfig& c) { c.model.initializer = "ones"; }},
      {"model.init_scale", [](JobConfig& c) { c.model.init_scale = -0.1; }},
      {"model.mlp", [](JobConfig& c) { c.model.mlp = "400,x,1"; }},
      {"model.mlp", [](JobConfig& c) { c.model.mlp = ""; }},
      {"model.mlp", [](JobConfig& c) { c.model.mlp = "400,0,1"; }},
      {"model.mlp", [](JobConfig& c) { c.model.mlp = "400,400"; }},
      {"model.top_mlp", [](JobConfig& c) { c.model.top_mlp = "512,256,2"; }},
      {"model.bottom_mlp", [](JobConfig& c) { c.model.bottom_mlp = "512,-3,16"; }},
      {"model.bottom_mlp",
       [](JobConfig& c) {
         c.model.type = "dlrm";
         c.model.bottom_mlp = "512,256,64,32";  // embedding_dim is 16
       }},
      {"model.activation", [](JobConfig& c) { c.model.activation = "gelu"; }},
      {"model.pooling", [](JobConfig& c) { c.model.pooling = "max"; }},
      {"worker.compute_threads", [](JobConfig& c) { c.worker.compute_threads = -1; }},
      {"optimizer.type", [](JobConfig& c) { c.optimizer.type = "rmsprop"; }},
      {"optimizer.learning_rate", [](JobConfig& c) { c.optimizer.learning_rate = 0; }},
      {"optimizer.learning_rate",
       [](JobConfig& c) { c.optimizer.learning_rate = std::numeric_limits<double>::quiet_NaN(); }},
      {"optimizer.initial_accumulator", [](JobConfig& c) { c.optimizer.initial_accumulator = -1; }},
      {"optimizer.epsilon", [](JobConfig& c) { c.optimizer.epsilon = 0; }},
      {"optimizer.l2", [](JobConfig& c) { c.optimizer.l2 = -1; }},
      {"optimizer.learning_rate",
       [](JobConfig& c) { c.optimizer.learning_rate = std::numeric_limits<double>::infinity(); }},
      {"optimizer.beta1", [](JobConfig& c) { c.optimizer.beta1 = 1.0; }},
      {"optimizer.beta1", [](JobConfig& c) { c.optimizer.beta1 = -0.1; }},
      {"optimizer.beta2", [](JobConfig& c) { c.optimizer.beta2 = 1.0; }},
      {"optimizer.beta2",
       [](JobConfig& c) { c.optimizer.beta2 = std::numeric_limits<double>::quiet_NaN(); }},
      {"optimizer.ftrl_beta", [](JobConfig& c) { c.optimizer.ftrl_beta = -1; }},
      {"optimizer.l1", [](JobConfig& c) { c.optimizer.l1 = -0.5; }},
      {"optimizer.per_table", [](JobConfig& c) { c.optimizer.per_table = "lr.w"; }},
      {"optimizer.per_table", [](JobConfig& c) { c.optimizer.per_table = "lr.w:l3=1"; }},
      {"ps.ttl_passes", [](JobConfig& c) { c.ps.ttl_passes = 65536; }},
      {"ps.per_table", [](JobConfig& c) { c.ps.per_table = "wdl.emb"; }},
      {"ps.per_table", [](JobConfig& c) { c.ps.per_table = "wdl.emb:ttl=1"; }},
      {"ps.per_table", [](JobConfig& c) { c.ps.per_table = "wdl.emb:ttl_passes=-1"; }},
      {"ps.per_table", [](JobConfig& c) { c.ps.per_table = "wdl.emb:ttl_passes=1,ttl_passes=2"; }},
      {"ps.per_table",
       [](JobConfig& c) { c.ps.per_table = "wdl.emb:ttl_passes=1;wdl.emb:ttl_passes=2"; }},
      {"ps.num_servers", [](JobConfig& c) { c.ps.num_servers = 0; }},
      {"ps.partitions", [](JobConfig& c) { c.ps.partitions = 0; }},
      {"ps.partitions",
       [](JobConfig& c) {
         c.ps.num_servers = 8;
         c.ps.partitions = 4;
       }},
      {"ps.partitions", [](JobConfig& c) { c.ps.partitions = (1 << 20) + 1; }},
      {"ps.threads", [](JobConfig& c) { c.ps.threads = 0; }},
      {"ps.memory_budget_mb", [](JobConfig& c) { c.ps.memory_budget_mb = -1; }},
      {"ps.flush_interval_ms", [](JobConfig& c) { c.ps.flush_interval_ms = 0; }},
      {"ps.journal_mb", [](JobConfig& c) { c.ps.journal_mb = -1; }},
      {"ps.dense_chunk_floats", [](JobConfig& c) { c.ps.dense_chunk_floats = 0; }},
      {"ps.dense_chunk_floats", [](JobConfig& c) { c.ps.dense_chunk_floats = (1 << 20) + 1; }},
      {"worker.batch_size", [](JobConfig& c) { c.worker.batch_size.value = 0; }},
      {"worker.batch_size", [](JobConfig& c) { c.worker.batch_size.value = (1 << 20) + 1; }},
      {"worker.min_batch_size",
       [](JobConfig& c) {
         c.worker.batch_size = IntOrAuto{0, true};
         c.worker.min_batch_size = 0;
       }},
      {"worker.min_batch_size",
       [](JobConfig& c) {
         c.worker.batch_size = IntOrAuto{0, true};
         c.worker.min_batch_size = 512;
         c.worker.max_batch_size = 256;
       }},
      {"worker.max_batch_size",
       [](JobConfig& c) {
         c.worker.batch_size = IntOrAuto{0, true};
         c.worker.max_batch_size = (1 << 20) + 1;
       }},
      {"optimizer.lr_scaling", [](JobConfig& c) { c.optimizer.lr_scaling = "cubic"; }},
      {"optimizer.lr_warmup_batches", [](JobConfig& c) { c.optimizer.lr_warmup_batches = -1; }},
      {"worker.prefetch_batches", [](JobConfig& c) { c.worker.prefetch_batches = 0; }},
      {"worker.rpc_timeout_ms", [](JobConfig& c) { c.worker.rpc_timeout_ms = 0; }},
      {"worker.rpc_attempts", [](JobConfig& c) { c.worker.rpc_attempts = 0; }},
      {"worker.master_wait_s", [](JobConfig& c) { c.worker.master_wait_s = -1; }},
      {"master.heartbeat_ms", [](JobConfig& c) { c.master.heartbeat_ms = 0; }},
      {"master.lease_ms", [](JobConfig& c) { c.master.lease_ms = c.master.heartbeat_ms; }},
      {"master.bind_host", [](JobConfig& c) { c.master.bind_host.clear(); }},
      {"checkpoint.interval_s", [](JobConfig& c) { c.checkpoint.interval_s = 0; }},
      {"checkpoint.on_server_failure",
       [](JobConfig& c) { c.checkpoint.on_server_failure = "retry"; }},
      {"checkpoint.max_failures", [](JobConfig& c) { c.checkpoint.max_failures = -1; }},
      {"job.divergence_factor", [](JobConfig& c) { c.job.divergence_factor = 1.0; }},
      {"job.divergence_factor", [](JobConfig& c) { c.job.divergence_factor = -2; }},
      {"job.divergence_factor",
       [](JobConfig& c) { c.job.divergence_factor = std::numeric_limits<double>::infinity(); }},
      {"data.on_unreadable", [](JobConfig& c) { c.data.on_unreadable = "ignore"; }},
      {"master.recovery_timeout_s", [](JobConfig& c) { c.master.recovery_timeout_s = 0; }},
      {"master.progress_timeout_s", [](JobConfig& c) { c.master.progress_timeout_s = 0; }},
      {"master.worker_wait_s", [](JobConfig& c) { c.master.worker_wait_s = -1; }},
      // Upper bounds: values that would wrap or overflow where they travel.
      {"job.epochs", [](JobConfig& c) { c.job.epochs = 1'000'001; }},
      {"job.epochs", [](JobConfig& c) { c.job.epochs = 4'294'967'297; }},  // 1 as a uint32
      {"job.progress_interval_s", [](JobConfig& c) { c.job.progress_interval_s = 86'401; }},
      {"job.divergence_factor", [](JobConfig& c) { c.job.divergence_factor = 1e6 * 1.000001; }},
      {"data.shard_records", [](JobConfig& c) { c.data.shard_records = 1'000'000'001; }},
      {"model.init_scale", [](JobConfig& c) { c.model.init_scale = 1.000001e6; }},
      {"model.init_scale",
       [](JobConfig& c) { c.model.init_scale = std::numeric_limits<double>::infinity(); }},
      {"model.init_scale",
       [](JobConfig& c) { c.model.init_scale = std::numeric_limits<double>::quiet_NaN(); }},
      {"ps.num_servers", [](JobConfig& c) { c.ps.num_servers = (1 << 20) + 1; }},
      {"ps.threads", [](JobConfig& c) { c.ps.threads = 1025; }},
      {"ps.memory_budget_mb", [](JobConfig& c) { c.ps.memory_budget_mb = (int64_t{1} << 24) + 1; }},
      {"ps.memory_budget_mb", [](JobConfig& c) { c.ps.memory_budget_mb = 9'000'000'000'000; }},
      {"ps.flush_interval_ms", [](JobConfig& c) { c.ps.flush_interval_ms = 86'400'001; }},
      {"ps.journal_mb", [](JobConfig& c) { c.ps.journal_mb = (int64_t{1} << 20) + 1; }},
      {"worker.prefetch_batches", [](JobConfig& c) { c.worker.prefetch_batches = 1025; }},
      {"worker.rpc_timeout_ms", [](JobConfig& c) { c.worker.rpc_timeout_ms = 86'400'001; }},
      {"worker.rpc_attempts", [](JobConfig& c) { c.worker.rpc_attempts = 1001; }},
      {"worker.rpc_attempts",
       [](JobConfig& c) {
         c.worker.rpc_timeout_ms = 86'401;
         c.worker.rpc_attempts = 1000;  // 1000 x 86401 ms: over a day
       }},
      {"worker.master_wait_s", [](JobConfig& c) { c.worker.master_wait_s = 604'801; }},
      {"ps.leave_timeout_s", [](JobConfig& c) { c.ps.leave_timeout_s = 604'801; }},
      {"ps.leave_timeout_s", [](JobConfig& c) { c.ps.leave_timeout_s = -1; }},
      {"worker.max_records_per_s",
       [](JobConfig& c) { c.worker.max_records_per_s = 1'000'000'001; }},
      {"worker.max_records_per_s", [](JobConfig& c) { c.worker.max_records_per_s = -1; }},
      {"worker.compute_threads", [](JobConfig& c) { c.worker.compute_threads = 1025; }},
      {"master.heartbeat_ms", [](JobConfig& c) { c.master.heartbeat_ms = 4'294'967'296; }},
      {"master.lease_ms", [](JobConfig& c) { c.master.lease_ms = 86'400'001; }},
      {"master.lease_ms", [](JobConfig& c) { c.master.lease_ms = 4'294'967'297; }},
      {"master.recovery_timeout_s", [](JobConfig& c) { c.master.recovery_timeout_s = 604'801; }},
      {"master.progress_timeout_s", [](JobConfig& c) { c.master.progress_timeout_s = 604'801; }},
      {"master.worker_wait_s", [](JobConfig& c) { c.master.worker_wait_s = 604'801; }},
      {"checkpoint.interval_s", [](JobConfig& c) { c.checkpoint.interval_s = 604'801; }},
      {"checkpoint.keep", [](JobConfig& c) { c.checkpoint.keep = 1001; }},
      {"checkpoint.max_failures", [](JobConfig& c) { c.checkpoint.max_failures = 1001; }},
      // Optimizer settings travel as floats.
      {"optimizer.learning_rate", [](JobConfig& c) { c.optimizer.learning_rate = 1e-50; }},
      {"optimizer.learning_rate", [](JobConfig& c) { c.optimizer.learning_rate = 1e39; }},
      {"optimizer.epsilon", [](JobConfig& c) { c.optimizer.epsilon = 1e-46; }},
      {"optimizer.initial_accumulator",
       [](JobConfig& c) { c.optimizer.initial_accumulator = 3.5e38; }},
      {"optimizer.l2", [](JobConfig& c) { c.optimizer.l2 = 1e300; }},
      {"optimizer.beta1", [](JobConfig& c) { c.optimizer.beta1 = 0.99999999; }},  // 1 as a float
      {"optimizer.beta2", [](JobConfig& c) { c.optimizer.beta2 = 1 - 1e-9; }},
      {"optimizer.ftrl_beta", [](JobConfig& c) { c.optimizer.ftrl_beta = 1e39; }},
      {"optimizer.l1", [](JobConfig& c) { c.optimizer.l1 = 1e39; }},
      {"optimizer.clip", [](JobConfig& c) { c.optimizer.clip = -1; }},
      {"optimizer.clip", [](JobConfig& c) { c.optimizer.clip = 1e39; }},
      {"optimizer.clip",
       [](JobConfig& c) { c.optimizer.clip = std::numeric_limits<double>::quiet_NaN(); }},
      {"optimizer.per_table", [](JobConfig& c) { c.optimizer.per_table = "lr.w:clip=-1"; }},
      {"optimizer.per_table",
       [](JobConfig& c) { c.optimizer.per_table = "lr.w:learning_rate=1e-50"; }},
      {"optimizer.per_table",
       [](JobConfig& c) { c.optimizer.per_table = "lr.w:beta1=0.99999999"; }},
      {"autoscale.max_servers", [](JobConfig& c) { c.autoscale.max_servers = -1; }},
      {"autoscale.max_servers", [](JobConfig& c) { c.autoscale.max_servers = 5000; }},
      {"autoscale.min_servers",
       [](JobConfig& c) {
         c.autoscale.max_servers = 2;
         c.autoscale.min_servers = 3;
       }},
      {"autoscale.min_servers",
       [](JobConfig& c) {
         c.autoscale.max_servers = 2;
         c.autoscale.min_servers = 0;
       }},
      {"autoscale.servers_memory_high", [](JobConfig& c) { c.autoscale.servers_memory_high = 0; }},
      {"autoscale.servers_memory_high",
       [](JobConfig& c) { c.autoscale.servers_memory_high = 1.5; }},
      {"autoscale.servers_min_hit_rate",
       [](JobConfig& c) { c.autoscale.servers_min_hit_rate = -0.1; }},
      {"autoscale.servers_max_push_ms",
       [](JobConfig& c) {
         c.autoscale.servers_max_push_ms = std::numeric_limits<double>::quiet_NaN();
       }},
      {"autoscale.source", [](JobConfig& c) { c.autoscale.source = "kubernetes"; }},
      {"autoscale.launcher", [](JobConfig& c) { c.autoscale.launcher = "ssh"; }},
      {"autoscale.command", [](JobConfig& c) { c.autoscale.source = "command"; }},
      {"autoscale.prometheus_url",
       [](JobConfig& c) {
         c.autoscale.source = "prometheus";
         c.autoscale.prometheus_url = "localhost:9090";
         c.autoscale.query = "up";
       }},
      {"autoscale.query",
       [](JobConfig& c) {
         c.autoscale.source = "prometheus";
         c.autoscale.prometheus_url = "http://localhost:9090";
       }},
      {"autoscale.partition", [](JobConfig& c) { c.autoscale.source = "slurm"; }},
      {"autoscale.partition",
       [](JobConfig& c) {
         c.autoscale.source = "command";
         c.autoscale.command = "echo 1";
         c.autoscale.launcher = "slurm";
       }},
      {"autoscale.start_command",
       [](JobConfig& c) {
         c.autoscale.source = "command";
         c.autoscale.command = "echo 1";
         c.autoscale.launcher = "command";
         c.autoscale.stop_command = "true";
       }},
      {"autoscale.stop_command",
       [](JobConfig& c) {
         c.autoscale.source = "command";
         c.autoscale.command = "echo 1";
         c.autoscale.launcher = "command";
         c.autoscale.start_command = "true";
       }},
      {"autoscale.min_workers", [](JobConfig& c) { c.autoscale.min_workers = -1; }},
      {"autoscale.max_workers", [](JobConfig& c) { c.autoscale.max_workers = 0; }},
      {"autoscale.max_workers",
       [](JobConfig& c) {
         c.autoscale.min_workers = 5;
         c.autoscale.max_workers = 4;
       }},
      {"autoscale.gpus_per_worker", [](JobConfig& c) { c.autoscale.gpus_per_worker = 0; }},
      {"autoscale.scale_up_free_gpus", [](JobConfig& c) { c.autoscale.scale_up_free_gpus = 0; }},
      {"autoscale.scale_down_free_gpus",
       [](JobConfig& c) { c.autoscale.scale_down_free_gpus = 2; }},  // above scale_up's 1
      {"autoscale.interval_s", [](JobConfig& c) { c.autoscale.interval_s = 0; }},
      {"autoscale.cooldown_s", [](JobConfig& c) { c.autoscale.cooldown_s = 86'401; }},
      {"autoscale.source_timeout_s", [](JobConfig& c) { c.autoscale.source_timeout_s = 0; }},
      {"autoscale.scale_up_stabilization_s",
       [](JobConfig& c) { c.autoscale.scale_up_stabilization_s = -1; }},
      {"autoscale.scale_down_stabilization_s",
       [](JobConfig& c) { c.autoscale.scale_down_stabilization_s = 86'401; }},
      {"autoscale.max_restarts", [](JobConfig& c) { c.autoscale.max_restarts = -1; }},
      {"autoscale.restart_backoff_s", [](JobConfig& c) { c.autoscale.restart_backoff_s = 3601; }},
  };
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(bad.option);
    JobConfig config = ValidConfig();
    bad.mutate(config);
    const Status status = config.Validate();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.option));
    absl::optional<absl::Cord> payload = status.GetPayload(kOptionPayload);
    ASSERT_TRUE(payload.has_value());
    EXPECT_EQ(std::string(payload->Flatten()), bad.option);
  }
}

TEST(JobConfig, BoundaryValuesAreValid) {
  const std::vector<testing::BoundaryCase> cases = testing::JobConfigBoundaries();
  ASSERT_GT(cases.size(), 80u);
  for (const testing::BoundaryCase& boundary : cases) {
    SCOPED_TRACE(boundary.name);
    JobConfig config = ValidConfig();
    boundary.set(config);
    EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  }
}

TEST(JobConfig, BoundMessagesNameTheBound) {
  JobConfig config = ValidConfig();
  config.master.heartbeat_ms = 4'294'967'296;
  EXPECT_THAT(std::string(config.Validate().message()),
              HasSubstr("must be in [1, 86400000] (a day) (got 4294967296)"));
  config = ValidConfig();
  config.optimizer.epsilon = 1e-50;
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("a float's range"));
  config = ValidConfig();
  config.optimizer.per_table = "lr.w:clip=1e39";
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("clip must be finite and >= 0"));
}

// A global batch reserves one read per step (ps/global_batch.h): a step
// started from a copy already pushed on would have none.
TEST(JobConfig, AGlobalBatchNeedsEveryStepToReadItsDenseTensors) {
  JobConfig config = ValidConfig();
  config.optimizer.dense_global_batch = 4096;
  EXPECT_TRUE(config.Validate().ok());
  config.worker.max_staleness = 1;
  EXPECT_THAT(std::string(config.Validate().message()),
              HasSubstr("option 'worker.max_staleness': must be 0 with optimizer.dense_global_batch"));
}

TEST(JobConfig, EveryModelTypeIsValid) {
  for (const std::string type : {"lr", "wdl", "deepfm", "dlrm"}) {
    JobConfig config = ValidConfig();
    config.model.type = type;
    EXPECT_TRUE(config.Validate().ok()) << type << ": " << config.Validate();
  }
}

TEST(JobConfig, ParsesLayerSizes) {
  StatusOr<std::vector<int>> sizes = ParseLayerSizes("model.mlp", " 512, 256 ,1");
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, (std::vector<int>{512, 256, 1}));
  EXPECT_EQ(ParseLayerSizes("model.mlp", "512,,1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLayerSizes("model.mlp", "70000").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JobConfig, AutoBatchSizeReadsPrintsAndSetsTheReference) {
  IntOrAuto parsed;
  ASSERT_TRUE(IntOrAuto::Parse(" auto ", &parsed));
  EXPECT_TRUE(parsed.automatic);
  EXPECT_EQ(parsed.ToString(), "auto");
  ASSERT_TRUE(IntOrAuto::Parse("512", &parsed));
  EXPECT_FALSE(parsed.automatic);
  EXPECT_EQ(parsed.value, 512);
  EXPECT_EQ(parsed.ToString(), "512");
  EXPECT_FALSE(IntOrAuto::Parse("automatic", &parsed));
  EXPECT_FALSE(IntOrAuto::Parse("12x", &parsed));

  JobConfig config = ValidConfig();
  EXPECT_EQ(config.worker.reference_batch_size(), 1024);
  EXPECT_EQ(config.worker.largest_batch_size(), 1024);
  config.worker.batch_size = IntOrAuto{0, true};
  config.worker.min_batch_size = 128;
  config.worker.max_batch_size = 4096;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.worker.reference_batch_size(), 128);
  EXPECT_EQ(config.worker.largest_batch_size(), 4096);
  EXPECT_THAT(config.DebugString(), HasSubstr("worker.batch_size = auto\n"));
}

TEST(JobConfig, TsvWithSchemaIsValid) {
  JobConfig config = ValidConfig();
  config.data.format = "tsv";
  config.data.schema = "label,dense*13,cat*26";
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
}

TEST(JobConfig, ValidateMessageShowsTheValue) {
  JobConfig config = ValidConfig();
  config.worker.batch_size.value = -5;
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("-5"));
  config = ValidConfig();
  config.optimizer.type = "rmsprop";
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("rmsprop"));
}

TEST(JobConfig, EveryOptimizerTypeIsValid) {
  for (const char* type : {"sgd", "adagrad", "adam", "ftrl"}) {
    JobConfig config = ValidConfig();
    config.optimizer.type = type;
    EXPECT_TRUE(config.Validate().ok()) << type << ": " << config.Validate();
  }
}

TEST(JobConfig, OptimizerDefaults) {
  const JobConfig config;
  EXPECT_EQ(config.optimizer.type, "adagrad");
  EXPECT_DOUBLE_EQ(config.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(config.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(config.optimizer.ftrl_beta, 1.0);
  EXPECT_DOUBLE_EQ(config.optimizer.l1, 0.0);
  EXPECT_DOUBLE_EQ(config.optimizer.clip, 0.0);
  EXPECT_EQ(config.optimizer.per_table, "");
  StatusOr<std::map<std::string, JobConfig::Optimizer>> overrides = config.OptimizerOverrides();
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  EXPECT_TRUE(overrides->empty());
  // MLP layers: Adam at 0.001 with beta1 0.5 over the section's other settings.
  StatusOr<JobConfig::Optimizer> mlp = config.MlpOptimizer();
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->type, "adam");
  EXPECT_DOUBLE_EQ(mlp->learning_rate, 0.001);
  EXPECT_DOUBLE_EQ(mlp->beta1, 0.5);
  EXPECT_DOUBLE_EQ(mlp->beta2, config.optimizer.beta2);
  EXPECT_DOUBLE_EQ(mlp->epsilon, config.optimizer.epsilon);
  EXPECT_EQ(mlp->mlp, "");
}

TEST(JobConfig, MlpSettingsApplyOverTheSection) {
  JobConfig config = ValidConfig();
  config.optimizer.l2 = 0.25;
  config.optimizer.mlp = " type = sgd , learning_rate = 0.3 ";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<JobConfig::Optimizer> mlp = config.MlpOptimizer();
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->type, "sgd");
  EXPECT_DOUBLE_EQ(mlp->learning_rate, 0.3);
  EXPECT_DOUBLE_EQ(mlp->l2, 0.25);

  config.optimizer.mlp = "";
  mlp = config.MlpOptimizer();
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->type, config.optimizer.type);
  EXPECT_DOUBLE_EQ(mlp->learning_rate, config.optimizer.learning_rate);

  // A per_table entry for a table said to be an MLP layer applies over them.
  config.optimizer.mlp = "type=adam,learning_rate=0.002";
  config.optimizer.per_table = "mlp.w:beta1=0.5;emb:learning_rate=0.1";
  StatusOr<std::map<std::string, JobConfig::Optimizer>> overrides =
      config.OptimizerOverrides([](absl::string_view name) { return name == "mlp.w"; });
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  EXPECT_EQ(overrides->at("mlp.w").type, "adam");
  EXPECT_DOUBLE_EQ(overrides->at("mlp.w").learning_rate, 0.002);
  EXPECT_DOUBLE_EQ(overrides->at("mlp.w").beta1, 0.5);
  EXPECT_EQ(overrides->at("emb").type, config.optimizer.type);
  EXPECT_DOUBLE_EQ(overrides->at("emb").learning_rate, 0.1);
}

TEST(JobConfig, BadMlpSettingsNameTheOption) {
  for (const std::string bad : {"type=rmsprop", "learning_rate=0", "momentum=0.9", "adam",
                                "learning_rate=1,learning_rate=2"}) {
    SCOPED_TRACE(bad);
    JobConfig config = ValidConfig();
    config.optimizer.mlp = bad;
    const Status status = config.Validate();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("optimizer.mlp"));
    absl::optional<absl::Cord> payload = status.GetPayload(kOptionPayload);
    ASSERT_TRUE(payload.has_value());
    EXPECT_EQ(std::string(payload->Flatten()), "optimizer.mlp");
    EXPECT_EQ(config.MlpOptimizer().status(), status);
  }
}

TEST(JobConfig, DenseWireIsFloat32OrBfloat16) {
  JobConfig config = ValidConfig();
  EXPECT_EQ(config.worker.dense_wire, "bfloat16");
  config.worker.dense_wire = "float32";
  EXPECT_TRUE(config.Validate().ok());
  config.worker.dense_wire = "fp16";
  const Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("worker.dense_wire"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("float32, bfloat16"));
}

TEST(JobConfig, PerTableOverridesApplyOverTheSection) {
  JobConfig config = ValidConfig();
  config.optimizer.type = "adam";
  config.optimizer.learning_rate = 0.01;
  config.optimizer.l2 = 0.5;
  config.optimizer.per_table =
      " lr.dense : type=sgd, learning_rate=0.1 ;lr.w:type=ftrl,l1=1,ftrl_beta=0.5,"
      "learning_rate=2e-2,l2=0,clip=5;"
      "emb:beta1=0.5,beta2=0.75,epsilon=1e-6,initial_accumulator=0.1;";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<std::map<std::string, JobConfig::Optimizer>> overrides = config.OptimizerOverrides();
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  ASSERT_EQ(overrides->size(), 3u);

  const JobConfig::Optimizer& dense = overrides->at("lr.dense");
  EXPECT_EQ(dense.type, "sgd");
  EXPECT_DOUBLE_EQ(dense.learning_rate, 0.1);
  EXPECT_DOUBLE_EQ(dense.l2, 0.5);  // from the section
  EXPECT_EQ(dense.per_table, "");

  const JobConfig::Optimizer& w = overrides->at("lr.w");
  EXPECT_EQ(w.type, "ftrl");
  EXPECT_DOUBLE_EQ(w.l1, 1.0);
  EXPECT_DOUBLE_EQ(w.ftrl_beta, 0.5);
  EXPECT_DOUBLE_EQ(w.learning_rate, 0.02);
  EXPECT_DOUBLE_EQ(w.l2, 0.0);
  EXPECT_DOUBLE_EQ(w.clip, 5.0);

  const JobConfig::Optimizer& emb = overrides->at("emb");
  EXPECT_EQ(emb.type, "adam");
  EXPECT_DOUBLE_EQ(emb.learning_rate, 0.01);
  EXPECT_DOUBLE_EQ(emb.beta1, 0.5);
  EXPECT_DOUBLE_EQ(emb.beta2, 0.75);
  EXPECT_DOUBLE_EQ(emb.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(emb.initial_accumulator, 0.1);
}

TEST(JobConfig, BadPerTableEntriesNameTheOptionAndThePiece) {
  struct Case {
    std::string per_table;
    std::string piece;  // expected in the message
  };
  const std::vector<Case> cases = {
      {"lr.w", "entry 'lr.w'"},
      {"lr.w:", "sets nothing"},
      {":type=sgd", "no table name"},
      {"lr.w:type", "'type' is not key=value"},
      {"lr.w:type=sgd,,learning_rate=1", "'' is not key=value"},
      {"lr.w:momentum=0.9", "unknown key 'momentum'"},
      {"lr.w:optimizer.l1=1", "unknown key 'optimizer.l1'"},
      {"lr.w:type=rmsprop", "'rmsprop' is not one of"},
      {"lr.w:learning_rate=fast", "learning_rate = 'fast' is not a number"},
      {"lr.w:learning_rate=", "learning_rate = '' is not a number"},
      {"lr.w:learning_rate=0", "learning_rate must be finite and > 0"},
      {"lr.w:beta1=1", "beta1 must be in [0, 1)"},
      {"lr.w:beta2=nan", "beta2 must be in [0, 1)"},
      {"lr.w:l1=-1", "l1 must be finite and >= 0"},
      {"lr.w:ftrl_beta=-2", "ftrl_beta must be finite and >= 0"},
      {"lr.w:l2=inf", "l2 must be finite and >= 0"},
      {"lr.w:l1=1,l1=2", "key 'l1' is set twice"},
      {"lr.w:l1=1;lr.w:l2=1", "table 'lr.w' is named in more than one entry"},
      {"lr.dense:type=sgd;lr.w:l1=-1", "entry 'lr.w:l1=-1'"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.per_table);
    JobConfig config = ValidConfig();
    config.optimizer.per_table = bad.per_table;
    const Status status = config.OptimizerOverrides().status();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("optimizer.per_table"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.piece));
    absl::optional<absl::Cord> payload = status.GetPayload(kOptionPayload);
    ASSERT_TRUE(payload.has_value());
    EXPECT_EQ(std::string(payload->Flatten()), "optimizer.per_table");
    // Validate reports the same error.
    EXPECT_EQ(config.Validate(), status);
  }
}

TEST(JobConfig, PerTableInheritsABadSectionValue) {
  // A per-table entry starts from the [optimizer] section; Validate names the
  // section's option first.
  JobConfig config = ValidConfig();
  config.optimizer.beta1 = 2;
  config.optimizer.per_table = "lr.w:type=adam";
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("optimizer.beta1"));
  // An entry may fix it for its own table only.
  config.optimizer.beta1 = 0.9;
  config.optimizer.per_table = "lr.w:type=adam,beta1=0";
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
}

TEST(JobConfig, DebugStringListsEveryOption) {
  JobConfig config = ValidConfig();
  config.worker.batch_size.value = 333;
  const std::string text = config.DebugString();
  NameCollector collector;
  config.VisitOptions(collector);
  for (const std::string& name : collector.names) {
    EXPECT_THAT(text, HasSubstr(name + " = ")) << name;
  }
  EXPECT_THAT(text, HasSubstr("worker.batch_size = 333\n"));
  EXPECT_THAT(text, HasSubstr("data.train = /data/train\n"));
}

TEST(JobConfig, SharedOptionsAreTheOnesEveryProcessMustAgreeOn) {
  JobConfig config = ValidConfig();
  std::map<std::string, std::string> shared;
  for (const auto& [name, value] : config.SharedOptions()) shared[name] = value;
  for (const char* name : {"job.seed", "data.format", "data.schema", "model.type",
                           "model.embedding_dim", "model.init_scale", "optimizer.type",
                           "optimizer.learning_rate", "optimizer.per_table", "ps.partitions",
                           "ps.num_servers", "ps.dense_chunk_floats", "ps.durability",
                           "master.heartbeat_ms", "master.lease_ms", "worker.max_staleness"}) {
    EXPECT_TRUE(shared.contains(name)) << name;
  }
  // A process's own settings, and the master's alone.
  for (const char* name : {"worker.batch_size", "worker.max_records_per_s", "ps.threads",
                           "ps.memory_budget_mb", "checkpoint.dir", "checkpoint.restore",
                           "data.train", "job.epochs", "master.bind_host"}) {
    EXPECT_FALSE(shared.contains(name)) << name;
  }
  EXPECT_EQ(shared["optimizer.learning_rate"], "0.05");
  EXPECT_EQ(shared["model.embedding_dim"], "16");
}

TEST(JobConfig, OptionDifferencesNameEachOptionAndBothValues) {
  JobConfig master = ValidConfig();
  JobConfig member = master;
  EXPECT_EQ(DescribeOptionDifferences(member.SharedOptions(), master.SharedOptions()), "");
  // Differences a process may have on its own do not count.
  member.worker.batch_size.value = 7;
  member.ps.threads = 9;
  EXPECT_EQ(DescribeOptionDifferences(member.SharedOptions(), master.SharedOptions()), "");
  member.optimizer.learning_rate = 0.1;
  member.model.embedding_dim = 8;
  member.ps.partitions = 64;
  EXPECT_EQ(DescribeOptionDifferences(member.SharedOptions(), master.SharedOptions()),
            "model.embedding_dim = 8 (the master has 16); optimizer.learning_rate = 0.1 (the "
            "master has 0.05); ps.partitions = 64 (the master has 256)");
  // A value the last digit tells apart is a difference.
  member = master;
  member.optimizer.learning_rate = 0.05000000000000001;
  EXPECT_THAT(DescribeOptionDifferences(member.SharedOptions(), master.SharedOptions()),
              HasSubstr("optimizer.learning_rate = 0.05000000000000001 (the master has 0.05)"));
  // An option only one side knows (an older or newer peer).
  EXPECT_EQ(DescribeOptionDifferences({{"a.b", "1"}}, {{"c.d", "2"}}),
            "a.b = 1 (the master has (not set)); c.d = (not set) (the master has 2)");
}

}  // namespace
}  // namespace eps
