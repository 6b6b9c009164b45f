#include "ps/optimizer.h"

#include <cmath>
#include <memory>
#include <utility>

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

// State: m (dim floats), then v (dim), then the row's step count t (1).
class AdamOptimizer final : public Optimizer {
 public:
  AdamOptimizer(float learning_rate, float l2, float beta1, float beta2, float epsilon)
      : learning_rate_(learning_rate), l2_(l2), beta1_(beta1), beta2_(beta2), epsilon_(epsilon) {}

  int state_floats(int dim) const override { return 2 * dim + 1; }

  void InitState(float* state, int dim) const override {
    for (int i = 0; i < 2 * dim + 1; ++i) state[i] = 0.0f;
  }

  void Apply(float* weights, float* state, const float* grad, int dim) const override {
    float* m = state;
    float* v = state + dim;
    float& t = state[2 * dim];
    t += 1.0f;
    // The bias corrections in double: beta2^t is 1 - t * 1e-3 early on, and
    // float would lose most of 1 - beta2^t's digits.
    const double t_d = t;
    const float step_size =
        static_cast<float>(learning_rate_ / (1.0 - std::pow(static_cast<double>(beta1_), t_d)));
    const float sqrt_correction2 =
        static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(beta2_), t_d)));
    const float b1 = beta1_;
    const float b2 = beta2_;
    const float l2 = l2_;
    const float eps = epsilon_;
    for (int i = 0; i < dim; ++i) {
      const float g = grad[i] + l2 * weights[i];
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      weights[i] -= step_size * m[i] / (std::sqrt(v[i]) / sqrt_correction2 + eps);
    }
  }

 private:
  const float learning_rate_;
  const float l2_;
  const float beta1_;
  const float beta2_;
  const float epsilon_;
};

// State: z (dim floats), then n (dim).
class FtrlOptimizer final : public Optimizer {
 public:
  FtrlOptimizer(float alpha, float beta, float l1, float l2)
      : alpha_(alpha), beta_(beta), l1_(l1), l2_(l2) {}

  int state_floats(int dim) const override { return 2 * dim; }

  void InitState(float* state, int dim) const override {
    for (int i = 0; i < 2 * dim; ++i) state[i] = 0.0f;
  }

  void Apply(float* weights, float* state, const float* grad, int dim) const override {
    float* z = state;
    float* n = state + dim;
    const float alpha = alpha_;
    const float beta = beta_;
    const float l1 = l1_;
    const float l2 = l2_;
    for (int i = 0; i < dim; ++i) {
      const float g = grad[i];
      const float n_old = n[i];
      const float n_new = n_old + g * g;
      // No gradient yet: the initial weight stays. This also keeps the
      // denominator below > 0 (sqrt(n) > 0) when beta = l2 = 0.
      if (n_new == 0.0f) continue;
      const float sqrt_n_new = std::sqrt(n_new);
      const float sigma = (sqrt_n_new - std::sqrt(n_old)) / alpha;
      const float z_new = z[i] + g - sigma * weights[i];
      z[i] = z_new;
      n[i] = n_new;
      if (std::fabs(z_new) <= l1) {
        weights[i] = 0.0f;
      } else {
        weights[i] = -(z_new - std::copysign(l1, z_new)) / ((beta + sqrt_n_new) / alpha + l2);
      }
    }
  }

 private:
  const float alpha_;
  const float beta_;
  const float l1_;
  const float l2_;
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
    case proto::OptimizerSpec::ADAM:
      for (const auto& [field, value] :
           {std::pair<absl::string_view, float>{"beta1", spec.beta1()}, {"beta2", spec.beta2()}}) {
        if (!(value >= 0 && value < 1)) return FieldError(field, value, "must be in [0, 1)");
      }
      if (!(spec.epsilon() > 0) || !std::isfinite(spec.epsilon())) {
        return FieldError("epsilon", spec.epsilon(), "must be finite and > 0 for adam");
      }
      return std::unique_ptr<Optimizer>(std::make_unique<AdamOptimizer>(
          spec.learning_rate(), spec.l2(), spec.beta1(), spec.beta2(), spec.epsilon()));
    case proto::OptimizerSpec::FTRL:
      if (!(spec.ftrl_beta() >= 0) || !std::isfinite(spec.ftrl_beta())) {
        return FieldError("ftrl_beta", spec.ftrl_beta(), "must be finite and >= 0");
      }
      if (!(spec.l1() >= 0) || !std::isfinite(spec.l1())) {
        return FieldError("l1", spec.l1(), "must be finite and >= 0");
      }
      return std::unique_ptr<Optimizer>(std::make_unique<FtrlOptimizer>(
          spec.learning_rate(), spec.ftrl_beta(), spec.l1(), spec.l2()));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.kind: unknown optimizer kind ", static_cast<int>(spec.kind())));
  }
}

}  // namespace eps
