// WideDeepModel: Wide & Deep (model.type = wdl) and DeepFM (deepfm), which
// is Wide & Deep with a factorization-machine term added to the logit.
//
//   wide = sum_f w[id_f] + x.v + c
//   deep = MLP(concat(x, e_1, ..., e_F))
//   fm   = 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2]          (deepfm only)
//   logit = wide + deep (+ fm)
//
// Parameters (docs/models.md): "<type>.wide" or "deepfm.first" (embedding,
// dim 1), "<type>.emb" (embedding, dim d), "<type>.wide_dense" or
// "deepfm.first_dense" (x's weights then c), "<type>.mlp.<l>" (Linear).
// CPU back end (Eigen).
//
// Thread-safety: as Model.

#ifndef EPS_MODELS_WIDE_DEEP_MODEL_H_
#define EPS_MODELS_WIDE_DEEP_MODEL_H_

#include <vector>

#include "models/field_embeddings.h"
#include "models/mlp.h"
#include "models/model.h"

namespace eps {

class WideDeepModel : public Model {
 public:
  // REQUIRES: options.Validate() is OK and options.type is wdl or deepfm.
  explicit WideDeepModel(const ModelOptions& options);

  const std::vector<ParamSpec>& params() const override { return params_; }
  double ForwardBackward(const Batch& batch, const ParamBuffers& params,
                         std::vector<float>* predictions, ParamBuffers* grads) override;

 private:
  const ModelOptions options_;
  const Pooling pooling_;
  const bool fm_;
  Mlp deep_;
  std::vector<ParamSpec> params_;
  // Scratch, reused across batches.
  std::vector<float> input_;   // [n, D + F*d]: x then the field embeddings
  std::vector<float> dinput_;  // its gradient
  std::vector<float> logits_;
  std::vector<float> wide_sum_;  // per example, the dim-1 field weights' sum
  std::vector<float> fm_out_;
  std::vector<float> dlogits_;
};

}  // namespace eps

#endif  // EPS_MODELS_WIDE_DEEP_MODEL_H_
