// Evaluation metrics over a whole set of predictions: ROC AUC and log loss.
//
// Both are exact over every record given (no sampling, no histogram): AUC
// is the Mann-Whitney statistic with tied predictions counted as one half.
//
// Thread-safety: pure functions, safe for concurrent use.

#ifndef EPS_MODELS_METRICS_H_
#define EPS_MODELS_METRICS_H_

#include <cstdint>
#include <span>

namespace eps {

// Probability that a random positive is ranked above a random negative.
// Labels >= 0.5 count as positive. Returns 0.5 when either class is empty.
// REQUIRES: predictions.size() == labels.size().
double ComputeAuc(std::span<const float> predictions, std::span<const float> labels);

// Mean binary log loss, with predictions clipped to [1e-7, 1 - 1e-7].
// Returns 0 for empty input.
double ComputeLogLoss(std::span<const float> predictions, std::span<const float> labels);

// The log loss of one prediction (clipped as above).
double LogLoss(double prediction, double label);

}  // namespace eps

#endif  // EPS_MODELS_METRICS_H_
