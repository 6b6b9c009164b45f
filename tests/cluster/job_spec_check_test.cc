// Tests cluster/job_spec_check.h: what every role refuses in a job spec.

#include "cluster/job_spec_check.h"

#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cluster/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

proto::TableSpec GoodTable() {
  proto::TableSpec spec;
  spec.set_id(3);
  spec.set_name("emb");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(16);
  spec.mutable_initializer()->set_kind(proto::InitializerSpec::NORMAL);
  spec.mutable_initializer()->set_scale(0.01f);
  proto::OptimizerSpec& optimizer = *spec.mutable_optimizer();
  optimizer.set_kind(proto::OptimizerSpec::ADAGRAD);
  optimizer.set_learning_rate(0.05f);
  optimizer.set_epsilon(1e-8f);
  optimizer.set_beta1(0.9f);
  optimizer.set_beta2(0.999f);
  optimizer.set_ftrl_beta(1.0f);
  return spec;
}

proto::JobSpec GoodJob() {
  proto::JobSpec job;
  job.set_num_partitions(8);
  for (uint32_t id : {0u, 1u}) {
    proto::TableSpec& table = *job.add_tables() = GoodTable();
    table.set_id(id);
  }
  job.mutable_tables(1)->set_kind(proto::DENSE);
  job.mutable_tables(1)->set_dense_size(100);
  return job;
}

struct BadTable {
  std::string field;  // expected in the message
  std::function<void(proto::TableSpec&)> mutate;
};

TEST(ValidateTableSpec, AcceptsAGoodSpecOfEveryOptimizerKind) {
  for (auto kind : {proto::OptimizerSpec::SGD, proto::OptimizerSpec::ADAGRAD,
                    proto::OptimizerSpec::ADAM, proto::OptimizerSpec::FTRL}) {
    proto::TableSpec spec = GoodTable();
    spec.mutable_optimizer()->set_kind(kind);
    EXPECT_TRUE(ValidateTableSpec(spec).ok()) << ValidateTableSpec(spec);
  }
}

TEST(ValidateTableSpec, AcceptsTheExtremes) {
  proto::TableSpec spec = GoodTable();
  spec.set_dim(kMaxTableDim);
  spec.mutable_initializer()->set_scale(FLT_MAX / 2);
  proto::OptimizerSpec& optimizer = *spec.mutable_optimizer();
  optimizer.set_learning_rate(FLT_TRUE_MIN);
  optimizer.set_epsilon(FLT_MAX);
  optimizer.set_clip(FLT_MAX);
  optimizer.set_l2(FLT_MAX);
  EXPECT_TRUE(ValidateTableSpec(spec).ok()) << ValidateTableSpec(spec);
  optimizer.set_kind(proto::OptimizerSpec::ADAM);
  optimizer.set_beta1(std::nextafter(1.0f, 0.0f));
  optimizer.set_beta2(0.0f);
  EXPECT_TRUE(ValidateTableSpec(spec).ok()) << ValidateTableSpec(spec);
}

TEST(ValidateTableSpec, RefusesWhatAServerCannotUseNamingTableAndField) {
  const std::vector<BadTable> cases = {
      {"dim", [](proto::TableSpec& t) { t.set_dim(0); }},
      {"dim", [](proto::TableSpec& t) { t.set_dim(kMaxTableDim + 1); }},
      {"kind", [](proto::TableSpec& t) { t.set_kind(proto::TableKind(7)); }},
      {"dense_size",
       [](proto::TableSpec& t) {
         t.set_kind(proto::DENSE);
         t.set_dense_size(0);
       }},
      {"dense_size",
       [](proto::TableSpec& t) {
         t.set_kind(proto::DENSE);
         t.set_dim(1);
         t.set_dense_size((uint64_t{1} << kDenseChunkBits) + 1);
       }},
      {"id",
       [](proto::TableSpec& t) {
         t.set_kind(proto::DENSE);
         t.set_dense_size(10);
         t.set_id(1u << (64 - kDenseChunkBits));
       }},
      {"initializer.kind",
       [](proto::TableSpec& t) {
         t.mutable_initializer()->set_kind(proto::InitializerSpec::KIND_UNSPECIFIED);
       }},
      {"initializer.scale", [](proto::TableSpec& t) { t.mutable_initializer()->set_scale(-1); }},
      {"initializer.scale", [](proto::TableSpec& t) { t.mutable_initializer()->set_scale(kInf); }},
      {"initializer.scale", [](proto::TableSpec& t) { t.mutable_initializer()->set_scale(kNan); }},
      // A draw reaches 2 * scale, which must be a finite float.
      {"initializer.scale",
       [](proto::TableSpec& t) {
         t.mutable_initializer()->set_kind(proto::InitializerSpec::UNIFORM);
         t.mutable_initializer()->set_scale(FLT_MAX);
       }},
      {"optimizer.kind",
       [](proto::TableSpec& t) {
         t.mutable_optimizer()->set_kind(proto::OptimizerSpec::KIND_UNSPECIFIED);
       }},
      {"optimizer.learning_rate",
       [](proto::TableSpec& t) { t.mutable_optimizer()->set_learning_rate(0); }},
      {"optimizer.learning_rate",
       [](proto::TableSpec& t) { t.mutable_optimizer()->set_learning_rate(kInf); }},
      {"optimizer.l2", [](proto::TableSpec& t) { t.mutable_optimizer()->set_l2(-1); }},
      {"optimizer.clip", [](proto::TableSpec& t) { t.mutable_optimizer()->set_clip(-0.5f); }},
      {"optimizer.clip", [](proto::TableSpec& t) { t.mutable_optimizer()->set_clip(kInf); }},
      {"optimizer.clip", [](proto::TableSpec& t) { t.mutable_optimizer()->set_clip(kNan); }},
      {"optimizer.epsilon", [](proto::TableSpec& t) { t.mutable_optimizer()->set_epsilon(0); }},
      {"optimizer.initial_accumulator",
       [](proto::TableSpec& t) { t.mutable_optimizer()->set_initial_accumulator(-1); }},
      {"optimizer.beta1",
       [](proto::TableSpec& t) {
         t.mutable_optimizer()->set_kind(proto::OptimizerSpec::ADAM);
         t.mutable_optimizer()->set_beta1(1);
       }},
      {"optimizer.beta2",
       [](proto::TableSpec& t) {
         t.mutable_optimizer()->set_kind(proto::OptimizerSpec::ADAM);
         t.mutable_optimizer()->set_beta2(kNan);
       }},
      {"optimizer.ftrl_beta",
       [](proto::TableSpec& t) {
         t.mutable_optimizer()->set_kind(proto::OptimizerSpec::FTRL);
         t.mutable_optimizer()->set_ftrl_beta(-1);
       }},
      {"optimizer.l1",
       [](proto::TableSpec& t) {
         t.mutable_optimizer()->set_kind(proto::OptimizerSpec::FTRL);
         t.mutable_optimizer()->set_l1(kInf);
       }},
  };
  for (const BadTable& bad : cases) {
    SCOPED_TRACE(bad.field);
    proto::TableSpec spec = GoodTable();
    bad.mutate(spec);
    const Status status = ValidateTableSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("table 'emb'"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.field));
  }
}

TEST(ValidateOptimizerSpec, IgnoresFieldsTheKindDoesNotUse) {
  proto::OptimizerSpec spec = GoodTable().optimizer();
  spec.set_kind(proto::OptimizerSpec::SGD);
  spec.set_epsilon(0);
  spec.set_beta1(2);
  spec.set_l1(-1);
  EXPECT_TRUE(ValidateOptimizerSpec(spec).ok()) << ValidateOptimizerSpec(spec);
  spec.set_kind(proto::OptimizerSpec::ADAM);
  EXPECT_EQ(ValidateOptimizerSpec(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateJobSpec, AcceptsAGoodJob) {
  EXPECT_TRUE(ValidateJobSpec(GoodJob()).ok()) << ValidateJobSpec(GoodJob());
}

TEST(ValidateJobSpec, RefusesBadPartitionsTableIdsAndTables) {
  proto::JobSpec job = GoodJob();
  job.set_num_partitions(0);
  EXPECT_EQ(ValidateJobSpec(job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateJobSpec(job).message()), HasSubstr("num_partitions"));
  job.set_num_partitions(kMaxJobPartitions + 1);
  EXPECT_EQ(ValidateJobSpec(job).code(), absl::StatusCode::kInvalidArgument);

  job = GoodJob();
  job.clear_tables();
  EXPECT_EQ(ValidateJobSpec(job).code(), absl::StatusCode::kInvalidArgument);

  job = GoodJob();
  job.mutable_tables(1)->set_id(5);
  EXPECT_EQ(ValidateJobSpec(job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateJobSpec(job).message()), HasSubstr("0..n-1"));

  job = GoodJob();
  job.mutable_tables(1)->mutable_optimizer()->set_learning_rate(0);
  EXPECT_EQ(ValidateJobSpec(job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateJobSpec(job).message()), HasSubstr("optimizer.learning_rate"));
}

}  // namespace
}  // namespace eps
