#include "models/lr_model.h"

#include <cmath>

#include "Eigen/Core"
#include "core/logging.h"
#include "models/field_embeddings.h"
#include "models/loss.h"

namespace eps {

LrModel::LrModel(const ModelOptions& options)
    : options_(options), pooling_(*ParsePooling(options.pooling)) {
  params_.push_back({.name = "lr.w", .kind = ParamSpec::Kind::kEmbedding, .size = 1});
  params_.push_back({.name = "lr.dense",
                     .kind = ParamSpec::Kind::kDense,
                     .size = static_cast<uint64_t>(options.num_dense) + 1});
}

double LrModel::ForwardBackward(const Batch& batch, const ParamBuffers& params,
                                std::vector<float>* predictions, ParamBuffers* grads) {
  const int n = batch.size();
  const int num_dense = options_.num_dense;
  const int num_fields = options_.num_fields;
  CHECK_EQ(batch.num_dense, num_dense);
  CHECK_EQ(batch.num_fields, num_fields);
  batch.CheckShape();
  CHECK_EQ(params.size(), 2u);
  const std::vector<float>& w = params[0];
  const std::vector<float>& dense_w = params[1];
  CHECK_EQ(w.size(), batch.keys.size());
  CHECK_EQ(dense_w.size(), static_cast<size_t>(num_dense) + 1);

  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const RowMatrix> x(batch.dense.data(), n, num_dense);
  Eigen::Map<const Eigen::VectorXf> v(dense_w.data(), num_dense);
  const float bias = dense_w[num_dense];

  logits_.resize(n);
  Eigen::Map<Eigen::VectorXf> logits(logits_.data(), n);
  logits.noalias() = x * v;
  field_sums_.resize(n);
  SumFieldWeights(batch, w.data(), pooling_, field_sums_.data());
  for (int i = 0; i < n; ++i) logits[i] += field_sums_[i] + bias;

  predictions->resize(n);
  if (grads == nullptr) return SigmoidLogLoss(logits_, batch.labels, *predictions, {});
  // d(mean loss)/d logit_i = (p_i - y_i) / n, into logits_ (no longer needed).
  const double loss_sum = SigmoidLogLoss(logits_, batch.labels, *predictions, logits_);
  grads->resize(2);
  std::vector<float>& gw = (*grads)[0];
  std::vector<float>& gdense = (*grads)[1];
  gw.assign(batch.keys.size(), 0.0f);
  gdense.assign(num_dense + 1, 0.0f);
  ScatterAddFieldWeights(batch, logits_.data(), pooling_, gw.data());
  Eigen::Map<Eigen::VectorXf> gv(gdense.data(), num_dense);
  gv.noalias() = x.transpose() * logits;
  gdense[num_dense] = logits.sum();
  return loss_sum;
}

}  // namespace eps
