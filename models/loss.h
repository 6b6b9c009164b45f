// The training loss of every model: sigmoid of the logit, log loss.
//
// Thread-safety: stateless; safe for concurrent use.

#ifndef EPS_MODELS_LOSS_H_
#define EPS_MODELS_LOSS_H_

#include <span>

namespace eps {

// predictions[i] = sigmoid(logits[i]); returns the sum over examples of
// -(y log p + (1-y) log(1-p)), computed from the logit so that it stays
// finite. Unless `dlogits` is empty, dlogits[i] = (p_i - y_i) / n: the
// gradient of the mean loss.
// REQUIRES: logits, labels, predictions (and dlogits when given) have the
// same size.
double SigmoidLogLoss(std::span<const float> logits, std::span<const float> labels,
                      std::span<float> predictions, std::span<float> dlogits);

}  // namespace eps

#endif  // EPS_MODELS_LOSS_H_
