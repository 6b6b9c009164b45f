// DlrmModel: DLRM (model.type = dlrm).
//
//   z = bottom MLP(x)                 (activation after every layer)
//   T = [z, e_1, ..., e_F]
//   logit = top MLP(concat(z, T_a . T_b for a = 1..F, b < a))
//
// Parameters (docs/models.md): "dlrm.emb" (embedding, dim d),
// "dlrm.bottom.<l>" and "dlrm.top.<l>" (Linear). CPU back end (Eigen).
//
// Thread-safety: as Model.

#ifndef EPS_MODELS_DLRM_MODEL_H_
#define EPS_MODELS_DLRM_MODEL_H_

#include <vector>

#include "models/field_embeddings.h"
#include "models/mlp.h"
#include "models/model.h"

namespace eps {

class DlrmModel : public Model {
 public:
  // REQUIRES: options.Validate() is OK and options.type is dlrm.
  explicit DlrmModel(const ModelOptions& options);

  const std::vector<ParamSpec>& params() const override { return params_; }
  double ForwardBackward(const Batch& batch, const ParamBuffers& params,
                         std::vector<float>* predictions, ParamBuffers* grads) override;

 private:
  const ModelOptions options_;
  const Pooling pooling_;
  Mlp bottom_;
  Mlp top_;
  std::vector<ParamSpec> params_;
  // Scratch, reused across batches.
  std::vector<float> fields_;      // [n, F*d]
  std::vector<float> dfields_;
  std::vector<float> top_input_;   // [n, d + (F+1)F/2]: z, then the dots
  std::vector<float> dtop_input_;
  std::vector<float> dz_;          // [n, d]
  std::vector<float> dlogits_;    // [n]
};

}  // namespace eps

#endif  // EPS_MODELS_DLRM_MODEL_H_
