// Mlp: a stack of fully connected layers on the CPU (Eigen), forward and
// backward over a batch, with its parameters supplied per call.
//
// Layer l is Linear(in_l, out_l): one tensor of out_l*in_l + out_l floats,
// W ([out_l, in_l], row-major) then b, y = x W^T + b (docs/models.md). The
// activation follows every layer but the last, and the last too when
// `activate_last`. Activations and inputs are row-major [n, width].
//
// Thread-safety: one thread at a time (Forward keeps the activations that
// Backward reads). The matrix products use the Eigen threads of
// SetCpuThreads (models/model.h).

#ifndef EPS_MODELS_MLP_H_
#define EPS_MODELS_MLP_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace eps {

enum class Activation { kRelu, kSigmoid, kTanh };

// "relu", "sigmoid" or "tanh"; kInvalidArgument for another name.
StatusOr<Activation> ParseActivation(const std::string& name);

// The layer sizes of an MLP: `in` inputs, then Linear layers of `sizes`.
// Shared by the CPU Mlp and the CUDA one (models/cuda/cuda_mlp.h).
class MlpShape {
 public:
  // REQUIRES: in >= 1, sizes non-empty, every size >= 1.
  MlpShape(int in, std::vector<int> sizes);

  int in() const { return in_; }
  int out() const { return sizes_.back(); }
  int num_layers() const { return static_cast<int>(sizes_.size()); }
  int layer_in(int l) const { return l == 0 ? in_ : sizes_[l - 1]; }
  int layer_out(int l) const { return sizes_[l]; }
  // Floats of layer l's tensor: out*in + out.
  uint64_t layer_size(int l) const;

 private:
  const int in_;
  const std::vector<int> sizes_;
};

class Mlp : public MlpShape {
 public:
  // REQUIRES: as MlpShape.
  Mlp(int in, std::vector<int> sizes, Activation activation, bool activate_last);

  // Computes the output of `n` examples, row-major [n, out()], which stays
  // valid until the next Forward. `input` ([n, in()]) must stay valid and
  // unchanged until Backward. REQUIRES: weights.size() == num_layers(),
  // weights[l] holds layer_size(l) floats.
  const float* Forward(const float* input, int n, std::span<const float* const> weights);

  // Back-propagates `dout` ([n, out()], the loss gradient of Forward's
  // output): writes grads[l] (layer_size(l) floats each) and, unless
  // `dinput` is null, the gradient of the input ([n, in()]).
  // REQUIRES: Forward ran last, with the same weights.
  void Backward(const float* dout, std::span<const float* const> weights,
                std::span<float* const> grads, float* dinput);

 private:
  const Activation activation_;
  const bool activate_last_;
  const float* input_ = nullptr;
  int n_ = 0;
  std::vector<std::vector<float>> outputs_;  // [l]: [n, out_l], after the activation
  std::vector<float> delta_;                 // [n, out_l] of the layer in progress
  std::vector<float> delta_below_;
};

}  // namespace eps

#endif  // EPS_MODELS_MLP_H_
