#include "master/job_spec.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/job_spec_check.h"
#include "models/model.h"

namespace eps {
namespace {

proto::InitializerSpec MakeInitializer(const std::string& kind, double scale) {
  proto::InitializerSpec spec;
  if (kind == "normal") {
    spec.set_kind(proto::InitializerSpec::NORMAL);
  } else if (kind == "uniform") {
    spec.set_kind(proto::InitializerSpec::UNIFORM);
  } else {
    spec.set_kind(proto::InitializerSpec::ZEROS);
  }
  spec.set_scale(static_cast<float>(scale));
  return spec;
}

// An unknown type (a config that skipped Validate) stays KIND_UNSPECIFIED,
// which the servers reject.
proto::OptimizerSpec MakeOptimizer(const JobConfig::Optimizer& config) {
  proto::OptimizerSpec spec;
  if (config.type == "sgd") {
    spec.set_kind(proto::OptimizerSpec::SGD);
  } else if (config.type == "adagrad") {
    spec.set_kind(proto::OptimizerSpec::ADAGRAD);
  } else if (config.type == "adam") {
    spec.set_kind(proto::OptimizerSpec::ADAM);
  } else if (config.type == "ftrl") {
    spec.set_kind(proto::OptimizerSpec::FTRL);
  }
  spec.set_learning_rate(static_cast<float>(config.learning_rate));
  spec.set_initial_accumulator(static_cast<float>(config.initial_accumulator));
  spec.set_epsilon(static_cast<float>(config.epsilon));
  spec.set_l2(static_cast<float>(config.l2));
  spec.set_beta1(static_cast<float>(config.beta1));
  spec.set_beta2(static_cast<float>(config.beta2));
  spec.set_ftrl_beta(static_cast<float>(config.ftrl_beta));
  spec.set_l1(static_cast<float>(config.l1));
  spec.set_clip(static_cast<float>(config.clip));
  return spec;
}

}  // namespace

StatusOr<proto::JobSpec> BuildJobSpec(const JobConfig& config) {
  ASSIGN_OR_RETURN(ModelOptions model_options, ModelOptions::FromConfig(config));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(model_options));
  std::vector<std::string> table_names;
  std::vector<std::string> mlp_names;
  for (const ParamSpec& param : model->params()) {
    table_names.push_back(param.name);
    if (param.mlp_layer) mlp_names.push_back(param.name);
  }
  ASSIGN_OR_RETURN(auto overrides, config.OptimizerOverrides([&mlp_names](absl::string_view name) {
    return std::find(mlp_names.begin(), mlp_names.end(), name) != mlp_names.end();
  }));
  ASSIGN_OR_RETURN(const JobConfig::Optimizer mlp_config, config.MlpOptimizer());
  for (const auto& entry : overrides) {
    if (std::find(table_names.begin(), table_names.end(), entry.first) == table_names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.per_table names table '", entry.first,
                       "'; the model's tables are: ", absl::StrJoin(table_names, ", ")));
    }
  }
  ASSIGN_OR_RETURN(const auto row_policies, config.RowPolicies());
  for (const auto& [name, policy] : row_policies) {
    const auto param = std::find_if(model->params().begin(), model->params().end(),
                                    [&](const ParamSpec& p) { return p.name == name; });
    if (param == model->params().end() || param->kind != ParamSpec::Kind::kEmbedding) {
      std::vector<std::string> embeddings;
      for (const ParamSpec& p : model->params()) {
        if (p.kind == ParamSpec::Kind::kEmbedding) embeddings.push_back(p.name);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "option 'ps.per_table': names table '", name, "'; the model's embedding tables are: ",
          absl::StrJoin(embeddings, ", ")));
    }
  }
  const proto::OptimizerSpec section_optimizer = MakeOptimizer(config.optimizer);
  const proto::OptimizerSpec mlp_optimizer = MakeOptimizer(mlp_config);

  proto::JobSpec spec;
  spec.set_name(config.job.name);
  spec.set_seed(static_cast<uint64_t>(config.job.seed));
  spec.set_num_partitions(static_cast<uint32_t>(config.ps.partitions));
  uint32_t id = 0;
  for (const ParamSpec& param : model->params()) {
    proto::TableSpec* table = spec.add_tables();
    table->set_id(id++);
    table->set_name(param.name);
    if (param.kind == ParamSpec::Kind::kEmbedding) {
      table->set_kind(proto::EMBEDDING);
      table->set_dim(static_cast<uint32_t>(param.size));
      const bool automatic = config.model.initializer == "auto";
      *table->mutable_initializer() = MakeInitializer(
          automatic ? param.default_initializer : config.model.initializer,
          automatic ? param.default_init_scale : config.model.init_scale);
      JobConfig::RowPolicy policy{.admission_min_count = config.ps.admission_min_count,
                                  .ttl_passes = config.ps.ttl_passes};
      if (auto it = row_policies.find(param.name); it != row_policies.end()) policy = it->second;
      table->set_admission_min_count(static_cast<uint32_t>(policy.admission_min_count));
      table->set_ttl_passes(static_cast<uint32_t>(policy.ttl_passes));
    } else {
      table->set_kind(proto::DENSE);
      table->set_dim(static_cast<uint32_t>(
          std::min<uint64_t>(param.size, static_cast<uint64_t>(config.ps.dense_chunk_floats))));
      table->set_dense_size(param.size);
      table->set_global_batch(static_cast<uint64_t>(config.optimizer.dense_global_batch));
      *table->mutable_initializer() =
          MakeInitializer(param.default_initializer, param.default_init_scale);
    }
    auto override_it = overrides.find(param.name);
    if (override_it != overrides.end()) {
      *table->mutable_optimizer() = MakeOptimizer(override_it->second);
    } else {
      *table->mutable_optimizer() = param.mlp_layer ? mlp_optimizer : section_optimizer;
    }
  }
  // What a server would refuse, the master refuses before it starts.
  RETURN_IF_ERROR_CTX(ValidateJobSpec(spec), "the job spec made from the config is invalid");
  return spec;
}

}  // namespace eps
