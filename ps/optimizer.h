// Optimizer: the update rule a table applies to a row on the server.
//
// Each row stores its weights followed by the optimizer's state
// (state_floats(dim) floats). Workers send the gradient of the batch's mean
// loss, already summed over every occurrence of the key in the batch.
//
//   SGD:      w -= lr * (g + l2 * w)
//   Adagrad:  g' = g + l2 * w;  acc += g'^2;  w -= lr * g' / (sqrt(acc) + eps)
//             (acc starts at initial_accumulator; PyTorch's torch.optim.Adagrad
//              with lr_decay = 0 and weight_decay = l2 computes the same)
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
  // kInvalidArgument for an unknown kind or nonsense hyperparameters
  // (learning_rate <= 0, negative l2/initial_accumulator, epsilon <= 0 for
  // Adagrad), naming the field.
  static StatusOr<std::unique_ptr<Optimizer>> Create(const proto::OptimizerSpec& spec);
  virtual ~Optimizer() = default;

  // Floats of state per row of `dim` weights.
  virtual int state_floats(int dim) const = 0;
  // Writes the initial state of a new row.
  virtual void InitState(float* state, int dim) const = 0;
  // Applies one gradient to one row. `weights` has dim floats, `state`
  // state_floats(dim), `grad` dim.
  virtual void Apply(float* weights, float* state, const float* grad, int dim) const = 0;
};

}  // namespace eps

#endif  // EPS_PS_OPTIMIZER_H_
