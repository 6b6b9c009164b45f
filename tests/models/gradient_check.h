// Finite-difference checks of analytic gradients, for model and layer tests.
//
// Thread-safety: one thread only.

#ifndef EPS_TESTS_MODELS_GRADIENT_CHECK_H_
#define EPS_TESTS_MODELS_GRADIENT_CHECK_H_

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "models/batch.h"
#include "models/model.h"

namespace eps {

struct GradientCheckOptions {
  // Central-difference step. With a float forward pass, 1e-2 keeps rounding
  // (~1e-7 / h) and truncation (~h^2 / 6 * |f'''|) errors near 1e-5.
  float step = 1e-2f;
  double abs_tolerance = 1e-4;
  double rel_tolerance = 1e-3;
  // Elements checked per tensor, spread evenly over it (all when smaller).
  size_t max_elements = 48;
};

// A batch of `n` random examples: dense features in [0, 2), labels 0/1,
// field f's ids drawn from `vocabulary` values (so ids repeat across
// examples), 1 to `max_values` of them per field (a multi-value batch when
// max_values > 1).
Batch RandomBatch(int n, int num_dense, int num_fields, int vocabulary, uint64_t seed,
                  int max_values = 1);

// Parameters for `model` on `batch`: uniform in +-scale.
ParamBuffers RandomParams(const Model& model, const Batch& batch, uint64_t seed,
                          float scale = 0.5f);

// Checks `analytic` against central differences of `f` with respect to
// *x: f() must evaluate the function at the current contents of *x.
void ExpectMatchesCentralDifferences(const std::function<double()>& f, std::vector<float>* x,
                                     std::span<const float> analytic, const std::string& what,
                                     const GradientCheckOptions& options = {});

// Checks every gradient of model.ForwardBackward (of the mean loss) on
// `batch` at `params`.
void ExpectModelGradientsMatchFiniteDifferences(Model& model, const Batch& batch,
                                                const ParamBuffers& params,
                                                const GradientCheckOptions& options = {});

}  // namespace eps

#endif  // EPS_TESTS_MODELS_GRADIENT_CHECK_H_
