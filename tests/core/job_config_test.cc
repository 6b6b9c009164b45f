// Tests core/job_config.h: option names, Validate and DebugString.

#include "core/job_config.h"

#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
      if (name == "worker.batch_size") *v = 77;
    }
    void Visit(absl::string_view name, double* v, absl::string_view) override {
      if (name == "optimizer.learning_rate") *v = 0.5;
    }
    void Visit(absl::string_view, bool*, absl::string_view) override {}
  } setter;
  config.VisitOptions(setter);
  EXPECT_EQ(config.data.train, "set");
  EXPECT_EQ(config.worker.batch_size, 77);
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
      {"model.type", [](JobConfig& c) { c.model.type = "gpt"; }},
      {"model.embedding_dim", [](JobConfig& c) { c.model.embedding_dim = 0; }},
      {"model.embedding_dim", [](JobConfig& c) { c.model.embedding_dim = 4097; }},
      {"model.initializer", [](JobConfig& c) { c.model.initializer = "ones"; }},
      {"model.init_scale", [](JobConfig& c) { c.model.init_scale = -0.1; }},
      {"optimizer.type", [](JobConfig& c) { c.optimizer.type = "adam"; }},
      {"optimizer.learning_rate", [](JobConfig& c) { c.optimizer.learning_rate = 0; }},
      {"optimizer.learning_rate",
       [](JobConfig& c) { c.optimizer.learning_rate = std::numeric_limits<double>::quiet_NaN(); }},
      {"optimizer.initial_accumulator", [](JobConfig& c) { c.optimizer.initial_accumulator = -1; }},
      {"optimizer.epsilon", [](JobConfig& c) { c.optimizer.epsilon = 0; }},
      {"optimizer.l2", [](JobConfig& c) { c.optimizer.l2 = -1; }},
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
      {"ps.dense_chunk_floats", [](JobConfig& c) { c.ps.dense_chunk_floats = 0; }},
      {"ps.dense_chunk_floats", [](JobConfig& c) { c.ps.dense_chunk_floats = (1 << 20) + 1; }},
      {"worker.batch_size", [](JobConfig& c) { c.worker.batch_size = 0; }},
      {"worker.batch_size", [](JobConfig& c) { c.worker.batch_size = (1 << 20) + 1; }},
      {"worker.prefetch_batches", [](JobConfig& c) { c.worker.prefetch_batches = 0; }},
      {"worker.rpc_timeout_ms", [](JobConfig& c) { c.worker.rpc_timeout_ms = 0; }},
      {"worker.rpc_attempts", [](JobConfig& c) { c.worker.rpc_attempts = 0; }},
      {"worker.master_wait_s", [](JobConfig& c) { c.worker.master_wait_s = -1; }},
      {"master.heartbeat_ms", [](JobConfig& c) { c.master.heartbeat_ms = 0; }},
      {"master.lease_ms", [](JobConfig& c) { c.master.lease_ms = c.master.heartbeat_ms; }},
      {"master.bind_host", [](JobConfig& c) { c.master.bind_host.clear(); }},
      {"checkpoint.interval_s", [](JobConfig& c) { c.checkpoint.interval_s = 0; }},
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

TEST(JobConfig, TsvWithSchemaIsValid) {
  JobConfig config = ValidConfig();
  config.data.format = "tsv";
  config.data.schema = "label,dense*13,cat*26";
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
}

TEST(JobConfig, ValidateMessageShowsTheValue) {
  JobConfig config = ValidConfig();
  config.worker.batch_size = -5;
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("-5"));
  config = ValidConfig();
  config.optimizer.type = "adam";
  EXPECT_THAT(std::string(config.Validate().message()), HasSubstr("adam"));
}

TEST(JobConfig, DebugStringListsEveryOption) {
  JobConfig config = ValidConfig();
  config.worker.batch_size = 333;
  const std::string text = config.DebugString();
  NameCollector collector;
  config.VisitOptions(collector);
  for (const std::string& name : collector.names) {
    EXPECT_THAT(text, HasSubstr(name + " = ")) << name;
  }
  EXPECT_THAT(text, HasSubstr("worker.batch_size = 333\n"));
  EXPECT_THAT(text, HasSubstr("data.train = /data/train\n"));
}

}  // namespace
}  // namespace eps
