#include "models/wide_deep_model.h"

#include <cstring>

#include "Eigen/Core"
#include "core/logging.h"
#include "models/field_embeddings.h"
#include "models/interactions.h"
#include "models/loss.h"

namespace eps {
namespace {

// Parameter positions in params().
constexpr size_t kWide = 0;
constexpr size_t kEmb = 1;
constexpr size_t kWideDense = 2;
constexpr size_t kFirstLayer = 3;

}  // namespace

WideDeepModel::WideDeepModel(const ModelOptions& options)
    : options_(options),
      pooling_(*ParsePooling(options.pooling)),
      fm_(options.type == "deepfm"),
      deep_(options.num_dense + options.num_fields * options.embedding_dim, options.mlp,
            *ParseActivation(options.activation), /*activate_last=*/false) {
  CHECK(options.type == "wdl" || options.type == "deepfm") << options.type;
  const std::string& prefix = options.type;
  params_.push_back({.name = prefix + (fm_ ? ".first" : ".wide"),
                     .kind = ParamSpec::Kind::kEmbedding,
                     .size = 1});
  params_.push_back({.name = prefix + ".emb",
                     .kind = ParamSpec::Kind::kEmbedding,
                     .size = static_cast<uint64_t>(options.embedding_dim),
                     .default_initializer = "uniform",
                     .default_init_scale = 0.05f});
  params_.push_back({.name = prefix + (fm_ ? ".first_dense" : ".wide_dense"),
                     .kind = ParamSpec::Kind::kDense,
                     .size = static_cast<uint64_t>(options.num_dense) + 1});
  for (ParamSpec& spec : MlpParams(prefix + ".mlp", deep_)) params_.push_back(std::move(spec));
}

double WideDeepModel::ForwardBackward(const Batch& batch, const ParamBuffers& params,
                                      std::vector<float>* predictions, ParamBuffers* grads) {
  const int n = batch.size();
  const int num_dense = options_.num_dense;
  const int num_fields = options_.num_fields;
  const int dim = options_.embedding_dim;
  const int width = num_dense + num_fields * dim;
  CHECK_EQ(batch.num_dense, num_dense);
  CHECK_EQ(batch.num_fields, num_fields);
  batch.CheckShape();
  CHECK_EQ(params.size(), params_.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK_EQ(params[i].size(), BufferSize(i, batch));

  // The deep input: x, then the field embeddings.
  input_.resize(static_cast<size_t>(n) * width);
  for (int i = 0; i < n; ++i) {
    std::memcpy(&input_[static_cast<size_t>(i) * width], &batch.dense[static_cast<size_t>(i) * num_dense],
                sizeof(float) * num_dense);
  }
  GatherFields(batch, params[kEmb].data(), dim, pooling_, input_.data(), width, num_dense);

  std::vector<const float*> weights;
  for (size_t l = kFirstLayer; l < params.size(); ++l) weights.push_back(params[l].data());
  const float* deep = deep_.Forward(input_.data(), n, weights);

  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMatrix> x(batch.dense.data(), n, num_dense);
  const std::vector<float>& wide_dense = params[kWideDense];
  logits_.resize(n);
  Eigen::Map<Eigen::VectorXf> logits(logits_.data(), n);
  logits.noalias() = x * Eigen::Map<const Eigen::VectorXf>(wide_dense.data(), num_dense);
  wide_sum_.resize(n);
  SumFieldWeights(batch, params[kWide].data(), pooling_, wide_sum_.data());
  if (fm_) {
    fm_out_.resize(n);
    FmForward(input_.data(), n, width, num_dense, num_fields, dim, fm_out_.data());
  }
  for (int i = 0; i < n; ++i) {
    logits[i] += wide_sum_[i] + wide_dense[num_dense] + deep[i] + (fm_ ? fm_out_[i] : 0.0f);
  }

  predictions->resize(n);
  if (grads == nullptr) return SigmoidLogLoss(logits_, batch.labels, *predictions, {});
  dlogits_.resize(n);
  const double loss = SigmoidLogLoss(logits_, batch.labels, *predictions, dlogits_);

  grads->resize(params.size());
  std::vector<float>& g_wide = (*grads)[kWide];
  std::vector<float>& g_emb = (*grads)[kEmb];
  std::vector<float>& g_wide_dense = (*grads)[kWideDense];
  g_wide.assign(params[kWide].size(), 0.0f);
  g_emb.assign(params[kEmb].size(), 0.0f);
  g_wide_dense.resize(num_dense + 1);
  ScatterAddFieldWeights(batch, dlogits_.data(), pooling_, g_wide.data());
  Eigen::Map<const Eigen::VectorXf> dl(dlogits_.data(), n);
  Eigen::Map<Eigen::VectorXf>(g_wide_dense.data(), num_dense).noalias() = x.transpose() * dl;
  g_wide_dense[num_dense] = dl.sum();

  std::vector<float*> layer_grads;
  for (size_t l = kFirstLayer; l < params.size(); ++l) {
    (*grads)[l].resize(params[l].size());
    layer_grads.push_back((*grads)[l].data());
  }
  dinput_.resize(input_.size());
  deep_.Backward(dlogits_.data(), weights, layer_grads, dinput_.data());
  if (fm_) FmBackward(input_.data(), n, width, num_dense, num_fields, dim, dlogits_.data(), dinput_.data());
  ScatterAddFields(batch, dinput_.data(), width, num_dense, dim, pooling_, g_emb.data());
  return loss;
}

}  // namespace eps
