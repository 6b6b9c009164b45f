#include <algorithm>
#include <utility>

#include "models/cuda/cuda_kernels.h"
#include "models/cuda/cuda_mlp.h"

namespace eps {
namespace cuda {
namespace {

// cuBLAS is column-major; our matrices are row-major. A row-major [r, c]
// matrix is the column-major [c, r] one with leading dimension c, so each
// product below is written on the transposes.
constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

// y [n, out] = x [n, in] W^T, with W [out, in]: y^T = W x^T.
void LinearForward(cublasHandle_t cublas, const float* x, const float* w, int n, int in, int out,
                   float* y) {
  EPS_CUBLAS_CHECK(Cublas().Sgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &kOne, w, in, x, in,
                               &kZero, y, out));
}

// dW [out, in] = delta^T [out, n] x [n, in]: dW^T = x^T delta.
void WeightGrad(cublasHandle_t cublas, const float* x, const float* delta, int n, int in, int out,
                float* dw) {
  EPS_CUBLAS_CHECK(Cublas().Sgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &kOne, x, in, delta,
                               out, &kZero, dw, in));
}

// dx [n, in] = delta [n, out] W [out, in]: dx^T = W^T delta^T.
void InputGrad(cublasHandle_t cublas, const float* w, const float* delta, int n, int in, int out,
               float* dx) {
  EPS_CUBLAS_CHECK(Cublas().Sgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &kOne, w, in, delta,
                               out, &kZero, dx, in));
}

}  // namespace

CudaMlp::CudaMlp(int in, std::vector<int> sizes, Activation activation, bool activate_last)
    : MlpShape(in, std::move(sizes)), activation_(activation), activate_last_(activate_last) {
  outputs_ = std::vector<DeviceBuffer>(num_layers());
}

void CudaMlp::Reserve(int n) {
  // A delta holds a layer's output gradient or (below the top layer) its
  // input gradient: any width but the MLP's own input.
  int widest = 0;
  for (int l = 0; l < num_layers(); ++l) {
    outputs_[l].Reserve(sizeof(float) * n * layer_out(l));
    widest = std::max(widest, layer_out(l));
  }
  for (DeviceBuffer& delta : delta_) delta.Reserve(sizeof(float) * n * widest);
}

const float* CudaMlp::Forward(const CudaContext& context, const float* input, int n,
                              std::span<const float* const> weights) {
  CHECK_EQ(weights.size(), static_cast<size_t>(num_layers()));
  input_ = input;
  n_ = n;
  const float* x = input;
  for (int l = 0; l < num_layers(); ++l) {
    const int in = layer_in(l);
    const int out = layer_out(l);
    CHECK_GE(outputs_[l].capacity(), sizeof(float) * n * out) << "Reserve(n) first";
    float* y = outputs_[l].as<float>();
    LinearForward(context.cublas(), x, weights[l], n, in, out, y);
    AddBiasActivate(y, n, out, weights[l] + static_cast<size_t>(out) * in, activation_,
                    activated(l), context.stream());
    x = y;
  }
  return x;
}

void CudaMlp::Backward(const CudaContext& context, const float* dout,
                       std::span<const float* const> weights, std::span<float* const> grads,
                       float* dinput, const float* ones) {
  CHECK_EQ(weights.size(), static_cast<size_t>(num_layers()));
  CHECK_EQ(grads.size(), static_cast<size_t>(num_layers()));
  const int n = n_;
  // `delta` is the gradient of layer l's output, then (after the activation
  // derivative) of its pre-activation. It never lives in delta_[next], so
  // each step writes there and flips `next`.
  const float* delta = dout;
  int next = 0;
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int in = layer_in(l);
    const int out = layer_out(l);
    if (activated(l)) {
      float* d = delta_[next].as<float>();
      ActivationGrad(activation_, outputs_[l].as<float>(), delta, d, static_cast<size_t>(n) * out,
                     context.stream());
      delta = d;
      next ^= 1;
    }
    const float* x = l == 0 ? input_ : outputs_[l - 1].as<float>();
    WeightGrad(context.cublas(), x, delta, n, in, out, grads[l]);
    WeightedColumnSums(context.cublas(), delta, n, out, ones,
                       grads[l] + static_cast<size_t>(out) * in);
    if (l == 0 && dinput == nullptr) break;
    float* below = l == 0 ? dinput : delta_[next].as<float>();
    InputGrad(context.cublas(), weights[l], delta, n, in, out, below);
    delta = below;
    next ^= 1;
  }
}

}  // namespace cuda
}  // namespace eps
