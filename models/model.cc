#include "models/model.h"

#include <algorithm>
#include <cmath>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "core/data_schema.h"
#include "core/logging.h"
#include "models/dlrm_model.h"
#include "models/field_embeddings.h"
#include "models/lr_model.h"
#include "models/mlp.h"
#include "models/wide_deep_model.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace eps {

void SetCpuThreads(int threads) {
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_num_procs();
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads > 0 ? threads : 1);
}

Status ModelOptions::Validate() const {
  if (type != "lr" && type != "wdl" && type != "deepfm" && type != "dlrm") {
    return absl::InvalidArgumentError(
        absl::StrCat("model type '", type, "' is not supported; supported: lr, wdl, deepfm, dlrm"));
  }
  if (num_dense < 0 || num_fields < 0) {
    return absl::InvalidArgumentError("model: feature counts must be >= 0");
  }
  if (embedding_dim < 1) return absl::InvalidArgumentError("model: embedding_dim must be >= 1");
  RETURN_IF_ERROR(ParseActivation(activation).status());
  RETURN_IF_ERROR(ParsePooling(pooling).status());
  auto check_sizes = [](const char* name, const std::vector<int>& sizes, int last) -> Status {
    if (sizes.empty()) return absl::InvalidArgumentError(absl::StrCat("model: ", name, " is empty"));
    for (int size : sizes) {
      if (size < 1) return absl::InvalidArgumentError(absl::StrCat("model: ", name, " sizes must be >= 1"));
    }
    if (sizes.back() != last) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: the last layer of ", name, " must have size ", last));
    }
    return absl::OkStatus();
  };
  if (type == "wdl" || type == "deepfm") RETURN_IF_ERROR(check_sizes("mlp", mlp, 1));
  if (type == "dlrm") {
    if (num_dense < 1) {
      return absl::InvalidArgumentError("model: dlrm needs dense features for its bottom MLP");
    }
    RETURN_IF_ERROR(check_sizes("bottom_mlp", bottom_mlp, embedding_dim));
    RETURN_IF_ERROR(check_sizes("top_mlp", top_mlp, 1));
  }
  return absl::OkStatus();
}

StatusOr<ModelOptions> ModelOptions::FromConfig(const JobConfig& config) {
  ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(config));
  ModelOptions options;
  options.type = config.model.type;
  options.embedding_dim = static_cast<int>(config.model.embedding_dim);
  options.num_dense = schema.num_dense;
  options.num_fields = schema.num_cat;
  ASSIGN_OR_RETURN(options.mlp, ParseLayerSizes("model.mlp", config.model.mlp));
  ASSIGN_OR_RETURN(options.bottom_mlp, ParseLayerSizes("model.bottom_mlp", config.model.bottom_mlp));
  ASSIGN_OR_RETURN(options.top_mlp, ParseLayerSizes("model.top_mlp", config.model.top_mlp));
  options.activation = config.model.activation;
  options.pooling = config.model.pooling;
  RETURN_IF_ERROR(options.Validate());
  return options;
}

StatusOr<std::unique_ptr<Model>> Model::Create(const ModelOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (options.type == "wdl" || options.type == "deepfm") {
    return std::unique_ptr<Model>(new WideDeepModel(options));
  }
  if (options.type == "dlrm") return std::unique_ptr<Model>(new DlrmModel(options));
  return std::unique_ptr<Model>(new LrModel(options));
}

size_t Model::BufferSize(size_t i, const Batch& batch) const {
  const ParamSpec& spec = params()[i];
  return spec.kind == ParamSpec::Kind::kEmbedding ? batch.keys.size() * spec.size : spec.size;
}

bool AllFinite(const ParamBuffers& buffers) {
  for (const std::vector<float>& values : buffers) {
    // Eight independent lanes, so the loop vectorizes without
    // reassociating: inf * 0 and NaN * 0 are NaN.
    float lanes[8] = {};
    size_t i = 0;
    for (; i + 8 <= values.size(); i += 8) {
      for (int lane = 0; lane < 8; ++lane) lanes[lane] += values[i + lane] * 0.0f;
    }
    float rest = 0;
    for (; i < values.size(); ++i) rest += values[i] * 0.0f;
    for (float lane : lanes) rest += lane;
    if (rest != 0.0f) return false;
  }
  return true;
}

ParamBuffers Model::SliceParams(const ParamBuffers& params,
                                const std::vector<uint32_t>& from) const {
  const std::vector<ParamSpec>& specs = this->params();
  ParamBuffers sliced(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind != ParamSpec::Kind::kEmbedding) {
      sliced[i] = params[i];
      continue;
    }
    const size_t dim = specs[i].size;
    sliced[i].resize(from.size() * dim);
    for (size_t k = 0; k < from.size(); ++k) {
      std::copy_n(params[i].begin() + from[k] * dim, dim, sliced[i].begin() + k * dim);
    }
  }
  return sliced;
}

std::vector<ParamSpec> MlpParams(const std::string& prefix, const Mlp& mlp) {
  std::vector<ParamSpec> specs;
  for (int l = 0; l < mlp.num_layers(); ++l) {
    specs.push_back({.name = absl::StrCat(prefix, ".", l),
                     .kind = ParamSpec::Kind::kDense,
                     .size = mlp.layer_size(l),
                     .default_initializer = "uniform",
                     .default_init_scale = 1.0f / std::sqrt(static_cast<float>(mlp.layer_in(l))),
                     .pull_each_step = true,
                     .mlp_layer = true});
  }
  return specs;
}

}  // namespace eps
