// Optimizer: the update rule a table applies to a row on the server.
//
// Each row stores its weights followed by the optimizer's state
// (state_floats(dim) floats). Workers send the gradient of the batch's mean
// loss, already summed over every occurrence of the key in the batch.
//
// In every rule below, g is the gradient value after clipping
// (optimizer.clip, OptimizerSpec.clip): with clip > 0,
// g = min(max(g, -clip), clip) before anything else (before l2 * w is
// added); clip = 0 (the default) leaves g as it is.
//
// Learning-rate scale: every rule's learning rate (FTRL's alpha) is
// multiplied by the push's lr_scale (optimizer.lr_scaling: the worker's
// batch against the reference; 1 by default). For FTRL, whose state
// assumes one alpha, a changing scale is an approximation (the per-step
// alpha enters sigma and the weight of that step only).
//
// Refused updates: an update that would make any weight or state value of
// the row non-finite (inf or NaN) is not applied; the row keeps all its
// values and Apply says so. A finite but huge result is applied (clipping
// and the master's divergence check are for that).
//
//   SGD:      w -= lr * (g + l2 * w)
//   Adagrad:  g' = g + l2 * w;  acc += g'^2;  w -= lr * g' / (sqrt(acc) + eps)
//             (acc starts at initial_accumulator; PyTorch's torch.optim.Adagrad
//              with lr_decay = 0 and weight_decay = l2 computes the same)
//   Adam:     g' = g + l2 * w;  t += 1;
//             m = beta1 * m + (1 - beta1) * g';  v = beta2 * v + (1 - beta2) * g'^2;
//             w -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//             (m, v start at 0; per step this is torch.optim.Adam with
//              weight_decay = l2, amsgrad off. The step count t is kept per
//              row, not per table: a row is updated only when a batch touches
//              it, so under a table-wide count a rare row's first update
//              would get the bias correction of a late step (about 1) while
//              its m and v are still near 0, and move by about
//              lr * (1 - beta1) / sqrt(1 - beta2) (3.2 lr for the usual
//              0.9 / 0.999) instead of lr. Per row, every row's first step
//              moves each weight by about lr, as Adam's first step does.
//              TF's LazyAdam and PyTorch's SparseAdam keep one count per
//              tensor instead. t is a float and stops
//              rising at 2^24 updates of a row, where 1 - beta^t is 1 to
//              float precision for any beta <= 0.999999.)
//   FTRL:     FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from
//             the Trenches", KDD 2013, Algorithm 1), per coordinate, with
//             alpha = learning_rate, beta = ftrl_beta, lambda1 = l1,
//             lambda2 = l2:
//             sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;
//             z += g - sigma * w;  n += g^2;
//             w = 0                                           if |z| <= l1
//             w = -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)  else
//             (z, n start at 0. The paper starts from w = 0; here a
//              coordinate keeps the initializer's weight until its first
//              nonzero gradient, and that weight enters z through sigma * w.
//              A coordinate with n = 0 is left untouched. With l1 > 0 many
//              weights become exactly 0. For ftrl_beta = 0 this is TF's
//              Ftrl with learning_rate_power = -0.5,
//              initial_accumulator_value = 0 and its
//              l2_regularization_strength = l2 / 2, except that TF zeroes a
//              weight whose gradients so far were all 0.)
//
// Thread-safety: immutable after Create; Apply is safe for concurrent use on
// different rows.

#ifndef EPS_PS_OPTIMIZER_H_
#define EPS_PS_OPTIMIZER_H_

#include <memory>

#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

class Optimizer {
 public:
  // kInvalidArgument for an unknown kind or nonsense hyperparameters, naming
  // the field: the errors of ValidateOptimizerSpec (cluster/job_spec_check.h).
  static StatusOr<std::unique_ptr<Optimizer>> Create(const proto::OptimizerSpec& spec);
  virtual ~Optimizer() = default;

  // Floats of state per row of `dim` weights.
  virtual int state_floats(int dim) const = 0;
  // Writes the initial state of a new row.
  virtual void InitState(float* state, int dim) const = 0;
  // Applies one gradient (clipped, see above) to one row. `weights` has dim
  // floats, `state` state_floats(dim), `grad` dim. Returns false, leaving
  // every weight and state value as it was, when the update would make one
  // of them non-finite; the caller counts the refusal.
  // `lr_scale` (> 0, finite) multiplies the learning rate of this update.
  bool Apply(float* weights, float* state, const float* grad, int dim,
             float lr_scale = 1.0f) const;

 protected:
  // `clip` is OptimizerSpec.clip; 0 = off.
  explicit Optimizer(float clip);
  // The bound gradient values are clipped to; +inf when clipping is off,
  // so that clipping needs no branch.
  float clip() const { return clip_; }

 private:
  // The update rule: writes the row's new weights (dim floats) and state
  // (state_floats(dim)) to `new_weights` and `new_state`, which do not
  // overlap the inputs, and returns whether every value written is finite.
  virtual bool Update(const float* weights, const float* state, const float* grad, int dim,
                      float lr_scale, float* new_weights, float* new_state) const = 0;

  const float clip_;
};

}  // namespace eps

#endif  // EPS_PS_OPTIMIZER_H_
