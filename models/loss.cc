#include "models/loss.h"

#include <cmath>

#include "core/logging.h"

namespace eps {

double SigmoidLogLoss(std::span<const float> logits, std::span<const float> labels,
                      std::span<float> predictions, std::span<float> dlogits) {
  const size_t n = logits.size();
  CHECK_EQ(labels.size(), n);
  CHECK_EQ(predictions.size(), n);
  CHECK(dlogits.empty() || dlogits.size() == n);
  const float inv_n = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
  double loss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double z = logits[i];
    const double y = labels[i];
    // log(1 + e^z) - y z, without overflow for large |z|.
    loss += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - y * z;
    const float p = 1.0f / (1.0f + std::exp(-logits[i]));
    predictions[i] = p;
    if (!dlogits.empty()) dlogits[i] = (p - labels[i]) * inv_n;
  }
  return loss;
}

}  // namespace eps
