// Evaluation metrics over a whole set of predictions: ROC AUC and log loss.
//
// Both are exact over every record given (no sampling, no histogram): AUC
// is the Mann-Whitney statistic with tied predictions counted as one half.
// A prediction that is NaN makes both NaN (it ranks nowhere); callers that
// must name the record find it with FirstNonFinite first.
//
// Thread-safety: pure functions, safe for concurrent use.

#ifndef EPS_MODELS_METRICS_H_
#define EPS_MODELS_METRICS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace eps {

// The index of the first prediction that is NaN or infinite; nullopt when
// every one is finite.
std::optional<size_t> FirstNonFinite(std::span<const float> predictions);

// Probability that a random positive is ranked above a random negative.
// Labels >= 0.5 count as positive. Returns 0.5 when either class is empty,
// NaN when a prediction is NaN; infinite predictions rank first or last.
// Always returns (O(n log n)), whatever the values.
// REQUIRES: predictions.size() == labels.size().
double ComputeAuc(std::span<const float> predictions, std::span<const float> labels);

// Mean binary log loss, with predictions clipped to [1e-7, 1 - 1e-7]
// (infinities too). Returns 0 for empty input, NaN when a prediction is NaN.
double ComputeLogLoss(std::span<const float> predictions, std::span<const float> labels);

// The log loss of one prediction (clipped as above).
double LogLoss(double prediction, double label);

}  // namespace eps

#endif  // EPS_MODELS_METRICS_H_
