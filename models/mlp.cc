#include "models/mlp.h"

#include <cmath>
#include <utility>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using MatrixMap = Eigen::Map<RowMatrix>;

void Activate(Activation activation, float* values, size_t count) {
  Eigen::Map<Eigen::ArrayXf> a(values, static_cast<Eigen::Index>(count));
  switch (activation) {
    case Activation::kRelu:
      a = a.max(0.0f);
      break;
    case Activation::kSigmoid:
      a = 1.0f / (1.0f + (-a).exp());
      break;
    case Activation::kTanh:
      a = a.tanh();
      break;
  }
}

// delta *= activation'(.), written in terms of the activation's output.
void MultiplyByDerivative(Activation activation, const float* output, float* delta, size_t count) {
  Eigen::Map<const Eigen::ArrayXf> y(output, static_cast<Eigen::Index>(count));
  Eigen::Map<Eigen::ArrayXf> d(delta, static_cast<Eigen::Index>(count));
  switch (activation) {
    case Activation::kRelu:
      // A plain loop: Eigen's select compiled to a branch per value here
      // (half of them mispredicted), 7% of a wdl step.
      for (size_t i = 0; i < count; ++i) delta[i] = output[i] > 0.0f ? delta[i] : 0.0f;
      break;
    case Activation::kSigmoid:
      d *= y * (1.0f - y);
      break;
    case Activation::kTanh:
      d *= 1.0f - y * y;
      break;
  }
}

}  // namespace

StatusOr<Activation> ParseActivation(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "tanh") return Activation::kTanh;
  return absl::InvalidArgumentError(
      absl::StrCat("activation '", name, "' is not supported; supported: relu, sigmoid, tanh"));
}

MlpShape::MlpShape(int in, std::vector<int> sizes) : in_(in), sizes_(std::move(sizes)) {
  CHECK_GE(in_, 1);
  CHECK(!sizes_.empty());
  for (int size : sizes_) CHECK_GE(size, 1);
}

uint64_t MlpShape::layer_size(int l) const {
  return static_cast<uint64_t>(layer_out(l)) * layer_in(l) + layer_out(l);
}

Mlp::Mlp(int in, std::vector<int> sizes, Activation activation, bool activate_last)
    : MlpShape(in, std::move(sizes)), activation_(activation), activate_last_(activate_last) {
  outputs_.resize(num_layers());
}

const float* Mlp::Forward(const float* input, int n, std::span<const float* const> weights) {
  CHECK_EQ(weights.size(), static_cast<size_t>(num_layers()));
  input_ = input;
  n_ = n;
  const float* x = input;
  for (int l = 0; l < num_layers(); ++l) {
    const int in = layer_in(l);
    const int out = layer_out(l);
    ConstMatrixMap w(weights[l], out, in);
    Eigen::Map<const Eigen::RowVectorXf> b(weights[l] + static_cast<size_t>(out) * in, out);
    std::vector<float>& y_buffer = outputs_[l];
    y_buffer.resize(static_cast<size_t>(n) * out);
    MatrixMap y(y_buffer.data(), n, out);
    y.noalias() = ConstMatrixMap(x, n, in) * w.transpose();
    y.rowwise() += b;
    if (l + 1 < num_layers() || activate_last_) Activate(activation_, y_buffer.data(), y_buffer.size());
    x = y_buffer.data();
  }
  return x;
}

void Mlp::Backward(const float* dout, std::span<const float* const> weights,
                   std::span<float* const> grads, float* dinput) {
  CHECK_EQ(weights.size(), static_cast<size_t>(num_layers()));
  CHECK_EQ(grads.size(), static_cast<size_t>(num_layers()));
  const int n = n_;
  delta_.assign(dout, dout + static_cast<size_t>(n) * out());
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int in = layer_in(l);
    const int out = layer_out(l);
    if (l + 1 < num_layers() || activate_last_) {
      MultiplyByDerivative(activation_, outputs_[l].data(), delta_.data(), delta_.size());
    }
    const float* x = l == 0 ? input_ : outputs_[l - 1].data();
    ConstMatrixMap delta(delta_.data(), n, out);
    MatrixMap dw(grads[l], out, in);
    dw.noalias() = delta.transpose() * ConstMatrixMap(x, n, in);
    Eigen::Map<Eigen::RowVectorXf> db(grads[l] + static_cast<size_t>(out) * in, out);
    db = delta.colwise().sum();
    if (l == 0 && dinput == nullptr) break;
    float* below = dinput;
    if (l > 0) {
      delta_below_.resize(static_cast<size_t>(n) * in);
      below = delta_below_.data();
    }
    MatrixMap(below, n, in).noalias() = delta * ConstMatrixMap(weights[l], out, in);
    if (l > 0) std::swap(delta_, delta_below_);
  }
}

}  // namespace eps
