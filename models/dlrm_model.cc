#include "models/dlrm_model.h"

#include <cstring>

#include "core/logging.h"
#include "models/field_embeddings.h"
#include "models/interactions.h"
#include "models/loss.h"

namespace eps {

DlrmModel::DlrmModel(const ModelOptions& options)
    : options_(options),
      pooling_(*ParsePooling(options.pooling)),
      bottom_(options.num_dense, options.bottom_mlp, *ParseActivation(options.activation),
              /*activate_last=*/true),
      top_(options.embedding_dim + DotInteractionCount(options.num_fields), options.top_mlp,
           *ParseActivation(options.activation), /*activate_last=*/false) {
  CHECK_EQ(options.type, "dlrm");
  CHECK_EQ(bottom_.out(), options.embedding_dim);
  params_.push_back({.name = "dlrm.emb",
                     .kind = ParamSpec::Kind::kEmbedding,
                     .size = static_cast<uint64_t>(options.embedding_dim),
                     .default_initializer = "uniform",
                     .default_init_scale = 0.05f});
  for (ParamSpec& spec : MlpParams("dlrm.bottom", bottom_)) params_.push_back(std::move(spec));
  for (ParamSpec& spec : MlpParams("dlrm.top", top_)) params_.push_back(std::move(spec));
}

double DlrmModel::ForwardBackward(const Batch& batch, const ParamBuffers& params,
                                  std::vector<float>* predictions, ParamBuffers* grads) {
  const int n = batch.size();
  const int num_fields = options_.num_fields;
  const int dim = options_.embedding_dim;
  const int field_width = num_fields * dim;
  const int top_width = top_.in();
  CHECK_EQ(batch.num_dense, options_.num_dense);
  CHECK_EQ(batch.num_fields, num_fields);
  batch.CheckShape();
  CHECK_EQ(params.size(), params_.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK_EQ(params[i].size(), BufferSize(i, batch));

  const size_t bottom_first = 1;
  const size_t top_first = bottom_first + bottom_.num_layers();
  std::vector<const float*> bottom_weights;
  std::vector<const float*> top_weights;
  for (size_t l = bottom_first; l < top_first; ++l) bottom_weights.push_back(params[l].data());
  for (size_t l = top_first; l < params.size(); ++l) top_weights.push_back(params[l].data());

  fields_.resize(static_cast<size_t>(n) * field_width);
  GatherFields(batch, params[0].data(), dim, pooling_, fields_.data(), field_width, /*offset=*/0);
  const float* z = bottom_.Forward(batch.dense.data(), n, bottom_weights);

  top_input_.resize(static_cast<size_t>(n) * top_width);
  for (int i = 0; i < n; ++i) {
    std::memcpy(&top_input_[static_cast<size_t>(i) * top_width], z + static_cast<size_t>(i) * dim,
                sizeof(float) * dim);
  }
  DotForward(z, fields_.data(), n, field_width, /*offset=*/0, num_fields, dim, top_input_.data(),
             top_width, /*out_offset=*/dim);
  const float* logits = top_.Forward(top_input_.data(), n, top_weights);

  predictions->resize(n);
  const std::span<const float> logit_span(logits, n);
  if (grads == nullptr) return SigmoidLogLoss(logit_span, batch.labels, *predictions, {});
  dlogits_.resize(n);
  const double loss = SigmoidLogLoss(logit_span, batch.labels, *predictions, dlogits_);

  grads->resize(params.size());
  std::vector<float*> bottom_grads;
  std::vector<float*> top_grads;
  for (size_t l = 1; l < params.size(); ++l) {
    (*grads)[l].resize(params[l].size());
    (l < top_first ? bottom_grads : top_grads).push_back((*grads)[l].data());
  }
  dtop_input_.resize(top_input_.size());
  top_.Backward(dlogits_.data(), top_weights, top_grads, dtop_input_.data());

  // z feeds the top MLP directly and through the dots.
  dz_.resize(static_cast<size_t>(n) * dim);
  for (int i = 0; i < n; ++i) {
    std::memcpy(&dz_[static_cast<size_t>(i) * dim], &dtop_input_[static_cast<size_t>(i) * top_width],
                sizeof(float) * dim);
  }
  dfields_.assign(fields_.size(), 0.0f);
  DotBackward(z, fields_.data(), n, field_width, /*offset=*/0, num_fields, dim,
              dtop_input_.data(), top_width, /*out_offset=*/dim, dz_.data(), dfields_.data());
  bottom_.Backward(dz_.data(), bottom_weights, bottom_grads, /*dinput=*/nullptr);

  std::vector<float>& g_emb = (*grads)[0];
  g_emb.assign(params[0].size(), 0.0f);
  ScatterAddFields(batch, dfields_.data(), field_width, /*offset=*/0, dim, pooling_,
                   g_emb.data());
  return loss;
}

}  // namespace eps
