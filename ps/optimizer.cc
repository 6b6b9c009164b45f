#include "ps/optimizer.h"

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"

namespace eps {
namespace {

class SgdOptimizer final : public Optimizer {
 public:
  SgdOptimizer(float learning_rate, float l2) : learning_rate_(learning_rate), l2_(l2) {}

  int state_floats(int dim) const override { return 0; }
  void InitState(float* state, int dim) const override {}

  void Apply(float* weights, float* state, const float* grad, int dim) const override {
    const float lr = learning_rate_;
    const float l2 = l2_;
    for (int i = 0; i < dim; ++i) {
      weights[i] -= lr * (grad[i] + l2 * weights[i]);
    }
  }

 private:
  const float learning_rate_;
  const float l2_;
};

// State: one accumulator per weight.
class AdagradOptimizer final : public Optimizer {
 public:
  AdagradOptimizer(float learning_rate, float l2, float initial_accumulator, float epsilon)
      : learning_rate_(learning_rate),
        l2_(l2),
        initial_accumulator_(initial_accumulator),
        epsilon_(epsilon) {}

  int state_floats(int dim) const override { return dim; }

  void InitState(float* state, int dim) const override {
    for (int i = 0; i < dim; ++i) state[i] = initial_accumulator_;
  }

  void Apply(float* weights, float* state, const float* grad, int dim) const override {
    const float lr = learning_rate_;
    const float l2 = l2_;
    const float eps = epsilon_;
    for (int i = 0; i < dim; ++i) {
      const float g = grad[i] + l2 * weights[i];
      const float acc = state[i] + g * g;
      state[i] = acc;
      weights[i] -= lr * g / (std::sqrt(acc) + eps);
    }
  }

 private:
  const float learning_rate_;
  const float l2_;
  const float initial_accumulator_;
  const float epsilon_;
};

Status FieldError(absl::string_view field, float value, absl::string_view requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, " = ", value, ": ", requirement));
}

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const proto::OptimizerSpec& spec) {
  // Comparisons are written so that NaN fails them.
  if (!(spec.learning_rate() > 0) || !std::isfinite(spec.learning_rate())) {
    return FieldError("learning_rate", spec.learning_rate(), "must be finite and > 0");
  }
  if (!(spec.l2() >= 0) || !std::isfinite(spec.l2())) {
    return FieldError("l2", spec.l2(), "must be finite and >= 0");
  }
  switch (spec.kind()) {
    case proto::OptimizerSpec::SGD:
      return std::unique_ptr<Optimizer>(
          std::make_unique<SgdOptimizer>(spec.learning_rate(), spec.l2()));
    case proto::OptimizerSpec::ADAGRAD:
      if (!(spec.initial_accumulator() >= 0) || !std::isfinite(spec.initial_accumulator())) {
        return FieldError("initial_accumulator", spec.initial_accumulator(),
                          "must be finite and >= 0");
      }
      if (!(spec.epsilon() > 0) || !std::isfinite(spec.epsilon())) {
        return FieldError("epsilon", spec.epsilon(), "must be finite and > 0 for adagrad");
      }
      return std::unique_ptr<Optimizer>(std::make_unique<AdagradOptimizer>(
          spec.learning_rate(), spec.l2(), spec.initial_accumulator(), spec.epsilon()));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.kind: unknown optimizer kind ", static_cast<int>(spec.kind())));
  }
}

}  // namespace eps
