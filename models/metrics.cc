#include "models/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/logging.h"

namespace eps {

std::optional<size_t> FirstNonFinite(std::span<const float> predictions) {
  for (size_t i = 0; i < predictions.size(); ++i) {
    if (!std::isfinite(predictions[i])) return i;
  }
  return std::nullopt;
}

double ComputeAuc(std::span<const float> predictions, std::span<const float> labels) {
  CHECK_EQ(predictions.size(), labels.size());
  // A NaN breaks the strict weak order std::sort needs (undefined behavior,
  // reads past the end) and equals nothing, not even itself.
  if (std::any_of(predictions.begin(), predictions.end(), [](float p) { return std::isnan(p); })) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const size_t n = predictions.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return predictions[a] < predictions[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  uint64_t positives = 0;
  for (size_t i = 0; i < n;) {
    // The first of a run of ties is counted outside the comparison, so each
    // pass moves on by at least one record.
    const float value = predictions[order[i]];
    uint64_t tied_positives = labels[order[i]] >= 0.5f;
    size_t j = i + 1;
    while (j < n && predictions[order[j]] == value) {
      tied_positives += labels[order[j]] >= 0.5f;
      ++j;
    }
    const double average_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    positive_rank_sum += average_rank * static_cast<double>(tied_positives);
    positives += tied_positives;
    i = j;
  }
  const uint64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
}

double LogLoss(double prediction, double label) {
  const double p = std::clamp(prediction, 1e-7, 1 - 1e-7);
  return -(label * std::log(p) + (1 - label) * std::log(1 - p));
}

double ComputeLogLoss(std::span<const float> predictions, std::span<const float> labels) {
  CHECK_EQ(predictions.size(), labels.size());
  if (predictions.empty()) return 0;
  double sum = 0;
  for (size_t i = 0; i < predictions.size(); ++i) sum += LogLoss(predictions[i], labels[i]);
  return sum / static_cast<double>(predictions.size());
}

}  // namespace eps
