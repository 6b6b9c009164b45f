// CudaMlp: the device counterpart of Mlp (models/mlp.h): the same layers,
// parameters and math, with cuBLAS products on device buffers.
//
// Layer l is Linear(in_l, out_l), one tensor of out_l*in_l + out_l floats
// (W [out_l, in_l] row-major, then b): y = x W^T + b, then the activation
// (every layer but the last, and the last too when `activate_last`).
// All pointers are device memory; all work is issued on the context's
// stream without waiting.
//
// Internal to models/: only .cu files include this header.
//
// Thread-safety: one thread at a time (Forward keeps the activations that
// Backward reads).

#ifndef EPS_MODELS_CUDA_CUDA_MLP_H_
#define EPS_MODELS_CUDA_CUDA_MLP_H_

#include <cstdint>
#include <span>
#include <vector>

#include "models/cuda/cuda_context.h"
#include "models/mlp.h"

namespace eps {
namespace cuda {

class CudaMlp : public MlpShape {
 public:
  // REQUIRES: as MlpShape.
  CudaMlp(int in, std::vector<int> sizes, Activation activation, bool activate_last);

  // Sizes the activations and gradient scratch for `n` examples.
  // REQUIRES: no work using them is in flight (growing frees memory).
  void Reserve(int n);

  // Issues the forward pass of `n` examples; returns the output
  // ([n, out()]), valid until the next Forward. `input` ([n, in()]) must
  // stay valid and unchanged until Backward has run.
  // REQUIRES: Reserve(>= n) since the last work in flight; weights.size() ==
  // num_layers(), weights[l] holds layer_size(l) floats.
  const float* Forward(const CudaContext& context, const float* input, int n,
                       std::span<const float* const> weights);

  // Issues the backward pass from `dout` ([n, out()]), which it does not
  // modify: overwrites grads[l] (layer_size(l) floats each) and, unless
  // `dinput` is null, the input's gradient ([n, in()]). `ones` holds at
  // least n ones (for the bias gradients).
  // REQUIRES: Forward ran last, with the same weights.
  void Backward(const CudaContext& context, const float* dout,
                std::span<const float* const> weights, std::span<float* const> grads, float* dinput,
                const float* ones);

 private:
  bool activated(int l) const { return l + 1 < num_layers() || activate_last_; }

  const Activation activation_;
  const bool activate_last_;
  const float* input_ = nullptr;
  int n_ = 0;
  std::vector<DeviceBuffer> outputs_;  // [l]: [n, out_l], after the activation
  DeviceBuffer delta_[2];              // gradients of the layers in progress
};

}  // namespace cuda
}  // namespace eps

#endif  // EPS_MODELS_CUDA_CUDA_MLP_H_
