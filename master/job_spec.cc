#include "master/job_spec.h"

#include <algorithm>

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

}  // namespace

StatusOr<proto::JobSpec> BuildJobSpec(const JobConfig& config) {
  ASSIGN_OR_RETURN(ModelOptions model_options, ModelOptions::FromConfig(config));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(model_options));

  proto::OptimizerSpec optimizer;
  optimizer.set_kind(config.optimizer.type == "sgd" ? proto::OptimizerSpec::SGD
                                                    : proto::OptimizerSpec::ADAGRAD);
  optimizer.set_learning_rate(static_cast<float>(config.optimizer.learning_rate));
  optimizer.set_initial_accumulator(static_cast<float>(config.optimizer.initial_accumulator));
  optimizer.set_epsilon(static_cast<float>(config.optimizer.epsilon));
  optimizer.set_l2(static_cast<float>(config.optimizer.l2));

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
    } else {
      table->set_kind(proto::DENSE);
      table->set_dim(static_cast<uint32_t>(
          std::min<uint64_t>(param.size, static_cast<uint64_t>(config.ps.dense_chunk_floats))));
      table->set_dense_size(param.size);
      *table->mutable_initializer() =
          MakeInitializer(param.default_initializer, param.default_init_scale);
    }
    *table->mutable_optimizer() = optimizer;
  }
  return spec;
}

}  // namespace eps
