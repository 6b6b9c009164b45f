// LrModel: logistic regression, the wide linear baseline of CTR models.
//
//   logit = sum_f w[id_f] + sum_d v_d * x_d + b,   p = sigmoid(logit)
//
// Parameters: "lr.w" (embedding, dim 1: one weight per feature id) and
// "lr.dense" (num_dense weights then the bias). CPU back end (Eigen).
//
// Thread-safety: as Model.

#ifndef EPS_MODELS_LR_MODEL_H_
#define EPS_MODELS_LR_MODEL_H_

#include <vector>

#include "models/field_embeddings.h"
#include "models/model.h"

namespace eps {

class LrModel : public Model {
 public:
  explicit LrModel(const ModelOptions& options);

  const std::vector<ParamSpec>& params() const override { return params_; }
  double ForwardBackward(const Batch& batch, const ParamBuffers& params,
                         std::vector<float>* predictions, ParamBuffers* grads) override;

 private:
  const ModelOptions options_;
  const Pooling pooling_;
  std::vector<ParamSpec> params_;
  std::vector<float> logits_;
  std::vector<float> field_sums_;
};

}  // namespace eps

#endif  // EPS_MODELS_LR_MODEL_H_
