#include "models/model.h"

#include "absl/strings/str_cat.h"
#include "core/data_schema.h"
#include "core/logging.h"
#include "models/lr_model.h"

namespace eps {

Status ModelOptions::Validate() const {
  if (type != "lr") {
    return absl::InvalidArgumentError(
        absl::StrCat("model type '", type, "' is not supported; supported: lr"));
  }
  if (num_dense < 0 || num_fields < 0) {
    return absl::InvalidArgumentError("model: feature counts must be >= 0");
  }
  if (embedding_dim < 1) return absl::InvalidArgumentError("model: embedding_dim must be >= 1");
  return absl::OkStatus();
}

StatusOr<ModelOptions> ModelOptions::FromConfig(const JobConfig& config) {
  ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(config));
  ModelOptions options;
  options.type = config.model.type;
  options.embedding_dim = static_cast<int>(config.model.embedding_dim);
  options.num_dense = schema.num_dense;
  options.num_fields = schema.num_cat;
  RETURN_IF_ERROR(options.Validate());
  return options;
}

StatusOr<std::unique_ptr<Model>> Model::Create(const ModelOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Model>(new LrModel(options));
}

size_t Model::BufferSize(size_t i, const Batch& batch) const {
  const ParamSpec& spec = params()[i];
  return spec.kind == ParamSpec::Kind::kEmbedding ? batch.keys.size() * spec.size : spec.size;
}

}  // namespace eps
