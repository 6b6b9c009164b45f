#include "ps/optimizer.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "cluster/job_spec_check.h"
#include "core/logging.h"

namespace eps {
namespace {

// |x| <= FLT_MAX is false for inf and NaN. Rules AND it over every value
// they compute, without an early exit.
inline bool IsFinite(float x) { return std::fabs(x) <= FLT_MAX; }

// `g` clipped to [-clip, clip].
inline float Clip(float g, float clip) { return std::min(std::max(g, -clip), clip); }

class SgdOptimizer final : public Optimizer {
 public:
  SgdOptimizer(float clip, float learning_rate, float l2)
      : Optimizer(clip), learning_rate_(learning_rate), l2_(l2) {}

  int state_floats(int dim) const override { return 0; }
  void InitState(float* state, int dim) const override {}

 private:
  bool Update(const float* weights, const float* state, const float* grad, int dim,
              float lr_scale, float* new_weights, float* new_state) const override {
    const float lr = learning_rate_ * lr_scale;
    const float l2 = l2_;
    const float clip = this->clip();
    int finite = 1;
    for (int i = 0; i < dim; ++i) {
      const float w = weights[i] - lr * (Clip(grad[i], clip) + l2 * weights[i]);
      new_weights[i] = w;
      finite &= IsFinite(w);
    }
    return finite != 0;
  }

  const float learning_rate_;
  const float l2_;
};

// State: one accumulator per weight.
class AdagradOptimizer final : public Optimizer {
 public:
  AdagradOptimizer(float clip, float learning_rate, float l2, float initial_accumulator,
                   float epsilon)
      : Optimizer(clip),
        learning_rate_(learning_rate),
        l2_(l2),
        initial_accumulator_(initial_accumulator),
        epsilon_(epsilon) {}

  int state_floats(int dim) const override { return dim; }

  void InitState(float* state, int dim) const override {
    for (int i = 0; i < dim; ++i) state[i] = initial_accumulator_;
  }

 private:
  bool Update(const float* weights, const float* state, const float* grad, int dim,
              float lr_scale, float* new_weights, float* new_state) const override {
    const float lr = learning_rate_ * lr_scale;
    const float l2 = l2_;
    const float eps = epsilon_;
    const float clip = this->clip();
    int finite = 1;
    for (int i = 0; i < dim; ++i) {
      const float g = Clip(grad[i], clip) + l2 * weights[i];
      const float acc = state[i] + g * g;
      const float w = weights[i] - lr * g / (std::sqrt(acc) + eps);
      new_state[i] = acc;
      new_weights[i] = w;
      finite &= IsFinite(acc) & IsFinite(w);
    }
    return finite != 0;
  }

  const float learning_rate_;
  const float l2_;
  const float initial_accumulator_;
  const float epsilon_;
};

// State: m (dim floats), then v (dim), then the row's step count t (1).
class AdamOptimizer final : public Optimizer {
 public:
  AdamOptimizer(float clip, float learning_rate, float l2, float beta1, float beta2, float epsilon)
      : Optimizer(clip),
        learning_rate_(learning_rate),
        l2_(l2),
        beta1_(beta1),
        beta2_(beta2),
        epsilon_(epsilon) {}

  int state_floats(int dim) const override { return 2 * dim + 1; }

  void InitState(float* state, int dim) const override {
    for (int i = 0; i < 2 * dim + 1; ++i) state[i] = 0.0f;
  }

 private:
  bool Update(const float* weights, const float* state, const float* grad, int dim,
              float lr_scale, float* new_weights, float* new_state) const override {
    const float* m = state;
    const float* v = state + dim;
    float* new_m = new_state;
    float* new_v = new_state + dim;
    const float t = state[2 * dim] + 1.0f;
    new_state[2 * dim] = t;
    // The bias corrections in double: beta2^t is 1 - t * 1e-3 early on, and
    // float would lose most of 1 - beta2^t's digits.
    const double t_d = t;
    const float step_size =
        static_cast<float>(static_cast<double>(learning_rate_) * lr_scale /
                           (1.0 - std::pow(static_cast<double>(beta1_), t_d)));
    const float sqrt_correction2 =
        static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(beta2_), t_d)));
    const float b1 = beta1_;
    const float b2 = beta2_;
    const float l2 = l2_;
    const float eps = epsilon_;
    const float clip = this->clip();
    int finite = 1;
    // The new values are a scratch row apart from the old (Apply). Said so,
    // the loop vectorizes: its seven streams need 15 alias checks, more
    // than GCC versions a loop for (10), and ran 7x slower than Adagrad's.
#pragma GCC ivdep
    for (int i = 0; i < dim; ++i) {
      const float g = Clip(grad[i], clip) + l2 * weights[i];
      const float m_i = b1 * m[i] + (1.0f - b1) * g;
      const float v_i = b2 * v[i] + (1.0f - b2) * g * g;
      const float w = weights[i] - step_size * m_i / (std::sqrt(v_i) / sqrt_correction2 + eps);
      new_m[i] = m_i;
      new_v[i] = v_i;
      new_weights[i] = w;
      finite &= IsFinite(m_i) & IsFinite(v_i) & IsFinite(w);
    }
    return finite != 0;
  }

  const float learning_rate_;
  const float l2_;
  const float beta1_;
  const float beta2_;
  const float epsilon_;
};

// State: z (dim floats), then n (dim).
class FtrlOptimizer final : public Optimizer {
 public:
  FtrlOptimizer(float clip, float alpha, float beta, float l1, float l2)
      : Optimizer(clip), alpha_(alpha), beta_(beta), l1_(l1), l2_(l2) {}

  int state_floats(int dim) const override { return 2 * dim; }

  void InitState(float* state, int dim) const override {
    for (int i = 0; i < 2 * dim; ++i) state[i] = 0.0f;
  }

 private:
  bool Update(const float* weights, const float* state, const float* grad, int dim,
              float lr_scale, float* new_weights, float* new_state) const override {
    const float* z = state;
    const float* n = state + dim;
    float* new_z = new_state;
    float* new_n = new_state + dim;
    const float alpha = alpha_ * lr_scale;
    const float beta = beta_;
    const float l1 = l1_;
    const float l2 = l2_;
    const float clip = this->clip();
    int finite = 1;
    for (int i = 0; i < dim; ++i) {
      const float g = Clip(grad[i], clip);
      const float n_old = n[i];
      const float n_new = n_old + g * g;
      // No gradient yet: the initial weight stays. This also keeps the
      // denominator below > 0 (sqrt(n) > 0) when beta = l2 = 0.
      if (n_new == 0.0f) {
        new_z[i] = z[i];
        new_n[i] = n_old;
        new_weights[i] = weights[i];
        continue;
      }
      const float sqrt_n_new = std::sqrt(n_new);
      const float sigma = (sqrt_n_new - std::sqrt(n_old)) / alpha;
      const float z_new = z[i] + g - sigma * weights[i];
      const float w = std::fabs(z_new) <= l1 ? 0.0f
                                             : -(z_new - std::copysign(l1, z_new)) /
                                                   ((beta + sqrt_n_new) / alpha + l2);
      new_z[i] = z_new;
      new_n[i] = n_new;
      new_weights[i] = w;
      finite &= IsFinite(z_new) & IsFinite(n_new) & IsFinite(w);
    }
    return finite != 0;
  }

  const float alpha_;
  const float beta_;
  const float l1_;
  const float l2_;
};

// Room for a row's new weights and state while its update is checked.
// Rows of up to kLocalFloats floats (every embedding row of a usual width)
// use the stack; wider ones (dense chunks) the heap.
class ScratchRow {
 public:
  explicit ScratchRow(size_t floats) {
    if (floats > kLocalFloats) {
      heap_ = std::make_unique_for_overwrite<float[]>(floats);
      data_ = heap_.get();
    }
  }
  float* data() { return data_; }

 private:
  static constexpr size_t kLocalFloats = 512;
  float local_[kLocalFloats];
  std::unique_ptr<float[]> heap_;
  float* data_ = local_;
};

}  // namespace

Optimizer::Optimizer(float clip)
    : clip_(clip > 0 ? clip : std::numeric_limits<float>::infinity()) {}

bool Optimizer::Apply(float* weights, float* state, const float* grad, int dim,
                      float lr_scale) const {
  const int state_n = state_floats(dim);
  ScratchRow scratch(static_cast<size_t>(dim) + state_n);
  float* new_weights = scratch.data();
  float* new_state = new_weights + dim;
  if (!Update(weights, state, grad, dim, lr_scale, new_weights, new_state)) return false;
  std::memcpy(weights, new_weights, sizeof(float) * dim);
  if (state_n > 0) std::memcpy(state, new_state, sizeof(float) * state_n);
  return true;
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const proto::OptimizerSpec& spec) {
  RETURN_IF_ERROR(ValidateOptimizerSpec(spec));
  const float clip = spec.clip();
  switch (spec.kind()) {
    case proto::OptimizerSpec::SGD:
      return std::unique_ptr<Optimizer>(
          std::make_unique<SgdOptimizer>(clip, spec.learning_rate(), spec.l2()));
    case proto::OptimizerSpec::ADAGRAD:
      return std::unique_ptr<Optimizer>(std::make_unique<AdagradOptimizer>(
          clip, spec.learning_rate(), spec.l2(), spec.initial_accumulator(), spec.epsilon()));
    case proto::OptimizerSpec::ADAM:
      return std::unique_ptr<Optimizer>(std::make_unique<AdamOptimizer>(
          clip, spec.learning_rate(), spec.l2(), spec.beta1(), spec.beta2(), spec.epsilon()));
    default:
      break;
  }
  // ValidateOptimizerSpec refuses every other kind.
  CHECK_EQ(spec.kind(), proto::OptimizerSpec::FTRL);
  return std::unique_ptr<Optimizer>(std::make_unique<FtrlOptimizer>(
      clip, spec.learning_rate(), spec.ftrl_beta(), spec.l1(), spec.l2()));
}

}  // namespace eps
