// Tests master/job_spec.h: the tables, optimizer and initializers the
// master hands to every server and worker.

#include "master/job_spec.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/job_spec_check.h"
#include "core/flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_config_boundaries.h"

namespace eps {
namespace {

const proto::TableSpec* FindTable(const proto::JobSpec& spec, const std::string& name) {
  for (const proto::TableSpec& table : spec.tables()) {
    if (table.name() == name) return &table;
  }
  return nullptr;
}

TEST(BuildJobSpec, LrTables) {
  JobConfig config;
  config.data.train = "unused";
  config.job.name = "ctr";
  config.job.seed = 42;
  config.ps.partitions = 16;
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "ctr");
  EXPECT_EQ(spec->seed(), 42u);
  EXPECT_EQ(spec->num_partitions(), 16u);
  ASSERT_EQ(spec->tables_size(), 2);
  for (int i = 0; i < spec->tables_size(); ++i) EXPECT_EQ(spec->tables(i).id(), i);

  const proto::TableSpec* w = FindTable(*spec, "lr.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->kind(), proto::EMBEDDING);
  EXPECT_EQ(w->dim(), 1u);

  const proto::TableSpec* dense = FindTable(*spec, "lr.dense");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->kind(), proto::DENSE);
  // 13 Criteo dense features and a bias.
  EXPECT_EQ(dense->dense_size(), 14u);
  EXPECT_EQ(dense->dim(), 14u);  // min(14, ps.dense_chunk_floats = 16384)
}

TEST(BuildJobSpec, DlrmTables) {
  JobConfig config;
  config.data.train = "unused";
  config.model.type = "dlrm";
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // The embedding table, 4 bottom and 3 top layers.
  ASSERT_EQ(spec->tables_size(), 8);
  const proto::TableSpec* emb = FindTable(*spec, "dlrm.emb");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->kind(), proto::EMBEDDING);
  EXPECT_EQ(emb->dim(), 16u);
  EXPECT_EQ(emb->initializer().kind(), proto::InitializerSpec::UNIFORM);
  const proto::TableSpec* top0 = FindTable(*spec, "dlrm.top.0");
  ASSERT_NE(top0, nullptr);
  EXPECT_EQ(top0->kind(), proto::DENSE);
  EXPECT_EQ(top0->dense_size(), 367u * 512 + 512);  // 16 + 351 dots -> 512
  EXPECT_EQ(top0->dim(), 16384u);                   // chunks of ps.dense_chunk_floats
  // PyTorch's nn.Linear distribution: uniform in +-1/sqrt(fan-in).
  EXPECT_EQ(top0->initializer().kind(), proto::InitializerSpec::UNIFORM);
  EXPECT_FLOAT_EQ(top0->initializer().scale(), 1.0f / std::sqrt(367.0f));
}

// Every config in examples/ parses, validates and builds a job.
TEST(BuildJobSpec, EveryExampleConfigBuildsAJob) {
  int examples = 0;
  for (const auto& entry : std::filesystem::directory_iterator(EPS_SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".ini") continue;
    SCOPED_TRACE(entry.path().string());
    ++examples;
    CommandLine command_line("eps-master", "--config JOB.ini");
    const std::string path = entry.path().string();
    const char* argv[] = {"eps-master", "--config", path.c_str()};
    StatusOr<JobConfig> config = command_line.Parse(3, argv);
    ASSERT_TRUE(config.ok()) << config.status();
    StatusOr<proto::JobSpec> spec = BuildJobSpec(*config);
    EXPECT_TRUE(spec.ok()) << spec.status();
  }
  EXPECT_GE(examples, 4);  // local (lr), wdl, deepfm, dlrm
}

// The job files of deploy/ (Slurm, Kubernetes) too, with their autoscalers.
TEST(BuildJobSpec, EveryDeployConfigBuildsAJob) {
  for (const char* name : {"/deploy/slurm/job.ini", "/deploy/kubernetes/job.ini"}) {
    const std::string path = std::string(EPS_SOURCE_DIR) + name;
    SCOPED_TRACE(path);
    CommandLine command_line("eps-master", "--config JOB.ini");
    const char* argv[] = {"eps-master", "--config", path.c_str()};
    StatusOr<JobConfig> config = command_line.Parse(3, argv);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_NE(config->autoscale.source, "none");
    EXPECT_TRUE(BuildJobSpec(*config).ok());
  }
}

TEST(BuildJobSpec, DenseChunksFollowDenseChunkFloats) {
  JobConfig config;
  config.data.train = "unused";
  config.ps.dense_chunk_floats = 4;
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const proto::TableSpec* dense = FindTable(*spec, "lr.dense");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->dense_size(), 14u);
  EXPECT_EQ(dense->dim(), 4u);
}

TEST(BuildJobSpec, OptimizerComesFromTheOptimizerSection) {
  JobConfig config;
  config.data.train = "unused";
  config.optimizer.type = "adagrad";
  config.optimizer.learning_rate = 0.25;
  config.optimizer.initial_accumulator = 0.5;
  config.optimizer.epsilon = 1e-6;
  config.optimizer.l2 = 0.125;
  config.optimizer.mlp = "";  // dense tensors too
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const proto::TableSpec& table : spec->tables()) {
    SCOPED_TRACE(table.name());
    EXPECT_EQ(table.optimizer().kind(), proto::OptimizerSpec::ADAGRAD);
    EXPECT_FLOAT_EQ(table.optimizer().learning_rate(), 0.25f);
    EXPECT_FLOAT_EQ(table.optimizer().initial_accumulator(), 0.5f);
    EXPECT_FLOAT_EQ(table.optimizer().epsilon(), 1e-6f);
    EXPECT_FLOAT_EQ(table.optimizer().l2(), 0.125f);
  }

  config.optimizer.type = "sgd";
  spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const proto::TableSpec& table : spec->tables()) {
    EXPECT_EQ(table.optimizer().kind(), proto::OptimizerSpec::SGD);
  }
}

TEST(BuildJobSpec, EveryOptimizerFieldReachesTheSpec) {
  JobConfig config;
  config.data.train = "unused";
  config.optimizer.type = "adam";
  config.optimizer.learning_rate = 0.01;
  config.optimizer.epsilon = 1e-7;
  config.optimizer.l2 = 0.25;
  config.optimizer.beta1 = 0.5;
  config.optimizer.beta2 = 0.75;
  config.optimizer.ftrl_beta = 2.0;
  config.optimizer.l1 = 0.125;
  config.optimizer.clip = 4.5;
  config.optimizer.mlp = "";  // dense tensors too
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const proto::TableSpec& table : spec->tables()) {
    SCOPED_TRACE(table.name());
    const proto::OptimizerSpec& optimizer = table.optimizer();
    EXPECT_EQ(optimizer.kind(), proto::OptimizerSpec::ADAM);
    EXPECT_FLOAT_EQ(optimizer.learning_rate(), 0.01f);
    EXPECT_FLOAT_EQ(optimizer.epsilon(), 1e-7f);
    EXPECT_FLOAT_EQ(optimizer.l2(), 0.25f);
    EXPECT_FLOAT_EQ(optimizer.beta1(), 0.5f);
    EXPECT_FLOAT_EQ(optimizer.beta2(), 0.75f);
    EXPECT_FLOAT_EQ(optimizer.ftrl_beta(), 2.0f);
    EXPECT_FLOAT_EQ(optimizer.l1(), 0.125f);
    EXPECT_FLOAT_EQ(optimizer.clip(), 4.5f);
  }

  config.optimizer.type = "ftrl";
  spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const proto::TableSpec& table : spec->tables()) {
    EXPECT_EQ(table.optimizer().kind(), proto::OptimizerSpec::FTRL);
  }
}

TEST(BuildJobSpec, PerTableOptimizersOverrideTheSection) {
  JobConfig config;
  config.data.train = "unused";
  config.optimizer.type = "adagrad";
  config.optimizer.learning_rate = 0.05;
  config.optimizer.l2 = 0.5;
  config.optimizer.per_table = "lr.dense:type=sgd,learning_rate=0.1;lr.w:type=ftrl,l1=1";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();

  const proto::TableSpec* dense = FindTable(*spec, "lr.dense");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->optimizer().kind(), proto::OptimizerSpec::SGD);
  EXPECT_FLOAT_EQ(dense->optimizer().learning_rate(), 0.1f);
  EXPECT_FLOAT_EQ(dense->optimizer().l2(), 0.5f);

  const proto::TableSpec* w = FindTable(*spec, "lr.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->optimizer().kind(), proto::OptimizerSpec::FTRL);
  EXPECT_FLOAT_EQ(w->optimizer().learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(w->optimizer().l1(), 1.0f);
  EXPECT_FLOAT_EQ(w->optimizer().ftrl_beta(), 1.0f);

  // A table without an entry keeps the section: lr has no MLP.
  config.optimizer.per_table = "lr.w:type=sgd";
  spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(FindTable(*spec, "lr.w")->optimizer().kind(), proto::OptimizerSpec::SGD);
  EXPECT_EQ(FindTable(*spec, "lr.dense")->optimizer().kind(), proto::OptimizerSpec::ADAGRAD);
  EXPECT_FLOAT_EQ(FindTable(*spec, "lr.dense")->optimizer().learning_rate(), 0.05f);
}

TEST(BuildJobSpec, PerTableEntriesForMlpLayersApplyOverOptimizerMlp) {
  JobConfig config;
  config.data.train = "unused";
  config.model.type = "wdl";
  config.model.mlp = "8,1";
  config.optimizer.l2 = 0.5;
  config.optimizer.per_table = "wdl.mlp.0:learning_rate=0.01";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const proto::OptimizerSpec& named = FindTable(*spec, "wdl.mlp.0")->optimizer();
  EXPECT_EQ(named.kind(), proto::OptimizerSpec::ADAM);
  EXPECT_FLOAT_EQ(named.learning_rate(), 0.01f);
  EXPECT_FLOAT_EQ(named.l2(), 0.5f);  // the section's, under both
  const proto::OptimizerSpec& other = FindTable(*spec, "wdl.mlp.1")->optimizer();
  EXPECT_EQ(other.kind(), proto::OptimizerSpec::ADAM);
  EXPECT_FLOAT_EQ(other.learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(other.l2(), 0.5f);
}

// The split a PyTorch user trains with: Adagrad at 0.05 for the embedding
// tables and the linear weights of the dense features, Adam at 0.001 for
// every MLP layer (beta1 0.5: asynchronous workers add momentum).
TEST(BuildJobSpec, MlpLayersGetAdamAndEverythingElseAdagradByDefault) {
  for (const std::string type : {"lr", "wdl", "deepfm", "dlrm"}) {
    SCOPED_TRACE(type);
    JobConfig config;
    config.data.train = "unused";
    config.model.type = type;
    ASSERT_TRUE(config.Validate().ok()) << config.Validate();
    StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
    ASSERT_TRUE(spec.ok()) << spec.status();
    int mlp_layers = 0;
    for (const proto::TableSpec& table : spec->tables()) {
      SCOPED_TRACE(table.name());
      const bool mlp = absl::StrContains(table.name(), ".mlp.") ||
                       absl::StrContains(table.name(), ".bottom.") ||
                       absl::StrContains(table.name(), ".top.");
      if (mlp) {
        ++mlp_layers;
        EXPECT_EQ(table.kind(), proto::DENSE);
        EXPECT_EQ(table.optimizer().kind(), proto::OptimizerSpec::ADAM);
        EXPECT_FLOAT_EQ(table.optimizer().learning_rate(), 0.001f);
        EXPECT_FLOAT_EQ(table.optimizer().beta1(), 0.5f);
        EXPECT_FLOAT_EQ(table.optimizer().beta2(), 0.999f);
      } else {
        EXPECT_EQ(table.optimizer().kind(), proto::OptimizerSpec::ADAGRAD);
        EXPECT_FLOAT_EQ(table.optimizer().learning_rate(), 0.05f);
      }
    }
    EXPECT_EQ(mlp_layers > 0, type != "lr");
  }
}

TEST(BuildJobSpec, EmptyMlpSettingsGiveMlpLayersTheSection) {
  JobConfig config;
  config.data.train = "unused";
  config.model.type = "wdl";
  config.optimizer.type = "sgd";
  config.optimizer.learning_rate = 0.2;
  config.optimizer.mlp = "";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const proto::TableSpec& table : spec->tables()) {
    SCOPED_TRACE(table.name());
    EXPECT_EQ(table.optimizer().kind(), proto::OptimizerSpec::SGD);
    EXPECT_FLOAT_EQ(table.optimizer().learning_rate(), 0.2f);
  }
}

TEST(BuildJobSpec, PerTableNamingAnUnknownTableListsTheModelsTables) {
  JobConfig config;
  config.data.train = "unused";
  config.optimizer.per_table = "lr.w:type=sgd;lr.bias:type=sgd";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "optimizer.per_table names table 'lr.bias'; the model's tables are: lr.w, lr.dense");
}

TEST(BuildJobSpec, MalformedPerTableIsInvalid) {
  JobConfig config;
  config.data.train = "unused";
  config.optimizer.per_table = "lr.w:l1=-1";
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), ::testing::HasSubstr("optimizer.per_table"));
}

TEST(BuildJobSpec, RowPoliciesApplyPerEmbeddingTable) {
  JobConfig config;
  config.data.train = "unused";
  config.model.type = "wdl";
  config.ps.admission_min_count = 2;
  config.ps.ttl_passes = 3;
  config.ps.per_table = "wdl.wide:ttl_passes=1;wdl.emb:admission_min_count=0";
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(FindTable(*spec, "wdl.wide")->ttl_passes(), 1u);
  EXPECT_EQ(FindTable(*spec, "wdl.wide")->admission_min_count(), 2u);
  EXPECT_EQ(FindTable(*spec, "wdl.emb")->ttl_passes(), 3u);
  EXPECT_EQ(FindTable(*spec, "wdl.emb")->admission_min_count(), 0u);
  EXPECT_EQ(FindTable(*spec, "wdl.wide_dense")->ttl_passes(), 0u);

  // Only embedding tables, named by the model.
  config.ps.per_table = "wdl.wide_dense:ttl_passes=1";
  spec = BuildJobSpec(config);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            "option 'ps.per_table': names table 'wdl.wide_dense'; the model's embedding tables "
            "are: wdl.wide, wdl.emb");
}

TEST(BuildJobSpec, AutoInitializerIsTheModelsDefault) {
  JobConfig config;
  config.data.train = "unused";
  ASSERT_EQ(config.model.initializer, "auto");
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // LR starts from zeros.
  for (const proto::TableSpec& table : spec->tables()) {
    EXPECT_EQ(table.initializer().kind(), proto::InitializerSpec::ZEROS) << table.name();
  }
}

TEST(BuildJobSpec, ExplicitInitializerAppliesToEmbeddings) {
  JobConfig config;
  config.data.train = "unused";
  config.model.initializer = "normal";
  config.model.init_scale = 0.5;
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const proto::TableSpec* w = FindTable(*spec, "lr.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->initializer().kind(), proto::InitializerSpec::NORMAL);
  EXPECT_FLOAT_EQ(w->initializer().scale(), 0.5f);
  // Dense tensors keep the model's initializer.
  EXPECT_EQ(FindTable(*spec, "lr.dense")->initializer().kind(), proto::InitializerSpec::ZEROS);

  config.model.initializer = "uniform";
  config.model.init_scale = 0.25;
  spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  w = FindTable(*spec, "lr.w");
  EXPECT_EQ(w->initializer().kind(), proto::InitializerSpec::UNIFORM);
  EXPECT_FLOAT_EQ(w->initializer().scale(), 0.25f);

  config.model.initializer = "zeros";
  spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(FindTable(*spec, "lr.w")->initializer().kind(), proto::InitializerSpec::ZEROS);
}

TEST(BuildJobSpec, TsvSchemaSetsTheDenseSize) {
  JobConfig config;
  config.data.train = "unused";
  config.data.format = "tsv";
  config.data.schema = "label,dense*3,cat*5";
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const proto::TableSpec* dense = FindTable(*spec, "lr.dense");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->dense_size(), 4u);
  EXPECT_EQ(dense->dim(), 4u);
}

TEST(BuildJobSpec, BadModelConfigIsInvalid) {
  JobConfig config;
  config.data.train = "unused";
  config.model.type = "transformer";
  EXPECT_EQ(BuildJobSpec(config).status().code(), absl::StatusCode::kInvalidArgument);

  config.model.type = "lr";
  config.data.format = "tsv";
  config.data.schema = "dense*3";  // no label
  EXPECT_EQ(BuildJobSpec(config).status().code(), absl::StatusCode::kInvalidArgument);
}

// What the master accepts, no server refuses: every boundary value
// JobConfig::Validate accepts, with every optimizer type, builds a spec
// ValidateJobSpec (the servers' checks) accepts.
TEST(BuildJobSpec, EveryBoundaryValueValidateAcceptsBuildsASpecServersAccept) {
  const std::vector<testing::BoundaryCase> cases = testing::JobConfigBoundaries();
  for (const char* type : {"sgd", "adagrad", "adam", "ftrl"}) {
    for (const testing::BoundaryCase& boundary : cases) {
      SCOPED_TRACE(absl::StrCat("optimizer.type = ", type, ", ", boundary.name));
      JobConfig config;
      config.data.train = "unused";
      config.optimizer.type = type;
      boundary.set(config);
      ASSERT_TRUE(config.Validate().ok()) << config.Validate();
      StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
    }
  }
}

TEST(BuildJobSpec, RefusesASpecServersWouldRefuse) {
  // Configs that skipped Validate: values a float cannot carry.
  JobConfig config;
  config.data.train = "unused";
  config.optimizer.epsilon = 1e-50;  // 0 as a float
  StatusOr<proto::JobSpec> spec = BuildJobSpec(config);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), ::testing::HasSubstr("optimizer.epsilon"));

  config = JobConfig();
  config.data.train = "unused";
  config.model.initializer = "normal";
  config.model.init_scale = std::numeric_limits<double>::infinity();
  spec = BuildJobSpec(config);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), ::testing::HasSubstr("initializer.scale"));
  // Validate names the option first.
  EXPECT_THAT(std::string(config.Validate().message()), ::testing::HasSubstr("model.init_scale"));
}

}  // namespace
}  // namespace eps
