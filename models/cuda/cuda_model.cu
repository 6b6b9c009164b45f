#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "models/cuda/cuda_context.h"
#include "models/cuda/cuda_kernels.h"
#include "models/cuda/cuda_mlp.h"
#include "models/cuda/cuda_model.h"
#include "models/device.h"
#include "models/field_embeddings.h"
#include "models/interactions.h"

namespace eps {
namespace cuda {
namespace {

// The device pointers of one step: the batch, the parameters and gradients
// (params() order) and the loss gradient of the logits.
struct Step {
  int n = 0;
  const uint32_t* slots = nullptr;  // [n, F], or [offsets[n*F]] with offsets
  // [n*F + 1] for a multi-value batch (models/batch.h); null when every
  // field has one id, which keeps the kernels' single-value path.
  const uint32_t* offsets = nullptr;
  const float* labels = nullptr;  // [n]
  const float* dense = nullptr;   // [n, D]
  std::vector<const float*> params;
  std::vector<float*> grads;       // empty on a forward-only step
  const float* dlogits = nullptr;  // [n]; null on a forward-only step
};

// The machinery every CUDA model shares: params() from the CPU model of the
// same options (one source of names and shapes), the copies in and out, the
// loss. A subclass issues its forward and backward passes.
//
// Each step packs the batch and parameters into one pinned host buffer and
// copies it to the GPU in one transfer; the predictions, per-example losses
// and gradients come back the same way. The stream is synchronized once, at
// the end of the step.
class CudaModelBase : public Model {
 public:
  const std::vector<ParamSpec>& params() const final { return cpu_->params(); }

  double ForwardBackward(const Batch& batch, const ParamBuffers& params,
                         std::vector<float>* predictions, ParamBuffers* grads) final;

 protected:
  CudaModelBase(const ModelOptions& options, std::unique_ptr<Model> cpu,
                std::unique_ptr<CudaContext> context)
      : options_(options),
        pooling_(*ParsePooling(options.pooling)),
        cpu_(std::move(cpu)),
        context_(std::move(context)) {}

  // Sizes the subclass's device scratch for `n` examples. Called before any
  // work of the step is issued (growing frees memory).
  virtual void Reserve(int n) = 0;
  // Issues the forward pass; returns the logits ([n], device).
  virtual const float* Forward(const Step& step) = 0;
  // Issues the backward pass from step.dlogits into step.grads, whose
  // embedding gradients are zero on entry.
  virtual void Backward(const Step& step) = 0;

  const CudaContext& context() const { return *context_; }
  cudaStream_t stream() const { return context_->stream(); }
  // At least n ones ([n], device), for column sums.
  const float* ones() const { return ones_.as<float>(); }

  // The wide (first-order) part: sum_f w[i,f] + x.v + c, w[i,f] pooled.
  // logits = base + wide; `base` may be null or alias `logits`.
  void WideForward(const Step& step, size_t w_param, size_t dense_param, const float* base,
                   float* logits) const;
  void WideBackward(const Step& step, size_t w_param, size_t dense_param) const;

  const ModelOptions& options() const { return options_; }
  Pooling pooling() const { return pooling_; }

 private:
  const ModelOptions options_;
  const Pooling pooling_;
  const std::unique_ptr<Model> cpu_;
  const std::unique_ptr<CudaContext> context_;
  PinnedBuffer host_in_;  // params, labels, dense, slots, offsets
  DeviceBuffer device_in_;
  PinnedBuffer host_out_;  // predictions, losses, grads
  DeviceBuffer device_out_;
  DeviceBuffer dlogits_;
  DeviceBuffer ones_;
  size_t ones_count_ = 0;  // ones_ holds this many ones
};

double CudaModelBase::ForwardBackward(const Batch& batch, const ParamBuffers& params,
                                      std::vector<float>* predictions, ParamBuffers* grads) {
  const int n = batch.size();
  const int num_dense = options_.num_dense;
  const int num_fields = options_.num_fields;
  const std::vector<ParamSpec>& specs = this->params();
  CHECK_EQ(batch.num_dense, num_dense);
  CHECK_EQ(batch.num_fields, num_fields);
  batch.CheckShape();
  const bool multi_value = batch.multi_value();
  CHECK_EQ(params.size(), specs.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK_EQ(params[i].size(), BufferSize(i, batch));
  // An empty batch has nothing to compute (and zero-sized products are
  // BLAS corner cases): the CPU model answers it.
  if (n == 0) return cpu_->ForwardBackward(batch, params, predictions, grads);
  const bool backward = grads != nullptr;

  // Where everything lives in the packed buffers (byte offsets, each
  // aligned for cudaMalloc's guarantee).
  std::vector<size_t> param_at(params.size());
  size_t in_bytes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    param_at[i] = in_bytes;
    in_bytes += AlignBytes(sizeof(float) * params[i].size());
  }
  const size_t labels_at = in_bytes;
  in_bytes += AlignBytes(sizeof(float) * n);
  const size_t dense_at = in_bytes;
  in_bytes += AlignBytes(sizeof(float) * batch.dense.size());
  const size_t slots_at = in_bytes;
  in_bytes += AlignBytes(sizeof(uint32_t) * batch.slots.size());
  const size_t offsets_at = in_bytes;
  in_bytes += AlignBytes(sizeof(uint32_t) * batch.offsets.size());

  size_t out_bytes = 0;
  const size_t predictions_at = out_bytes;
  out_bytes += AlignBytes(sizeof(float) * n);
  const size_t losses_at = out_bytes;
  out_bytes += AlignBytes(sizeof(double) * n);
  std::vector<size_t> grad_at(params.size());
  if (backward) {
    for (size_t i = 0; i < params.size(); ++i) {
      grad_at[i] = out_bytes;
      out_bytes += AlignBytes(sizeof(float) * params[i].size());
    }
  }

  context_->Activate();
  // The previous step ended with a synchronize, so nothing is in flight and
  // every buffer may grow.
  host_in_.Reserve(in_bytes);
  device_in_.Reserve(in_bytes);
  host_out_.Reserve(out_bytes);
  device_out_.Reserve(out_bytes);
  dlogits_.Reserve(sizeof(float) * n);
  if (ones_.Reserve(sizeof(float) * n)) ones_count_ = 0;
  Reserve(n);

  for (size_t i = 0; i < params.size(); ++i) {
    std::memcpy(host_in_.as<char>(param_at[i]), params[i].data(), sizeof(float) * params[i].size());
  }
  std::memcpy(host_in_.as<char>(labels_at), batch.labels.data(), sizeof(float) * n);
  std::memcpy(host_in_.as<char>(dense_at), batch.dense.data(), sizeof(float) * batch.dense.size());
  std::memcpy(host_in_.as<char>(slots_at), batch.slots.data(),
              sizeof(uint32_t) * batch.slots.size());
  if (multi_value) {
    std::memcpy(host_in_.as<char>(offsets_at), batch.offsets.data(),
                sizeof(uint32_t) * batch.offsets.size());
  }
  EPS_CUDA_CHECK(cudaMemcpyAsync(device_in_.data(), host_in_.data(), in_bytes,
                                 cudaMemcpyHostToDevice, stream()));
  if (ones_count_ < static_cast<size_t>(n)) {
    ones_count_ = ones_.capacity() / sizeof(float);
    Fill(ones_.as<float>(), ones_count_, 1.0f, stream());
  }

  Step step;
  step.n = n;
  step.slots = device_in_.as<uint32_t>(slots_at);
  if (multi_value) step.offsets = device_in_.as<uint32_t>(offsets_at);
  step.labels = device_in_.as<float>(labels_at);
  step.dense = device_in_.as<float>(dense_at);
  for (size_t i = 0; i < params.size(); ++i) {
    step.params.push_back(device_in_.as<float>(param_at[i]));
  }
  if (backward) {
    for (size_t i = 0; i < params.size(); ++i) {
      step.grads.push_back(device_out_.as<float>(grad_at[i]));
      // Embedding gradients are scatter-added; dense ones are overwritten.
      if (specs[i].kind == ParamSpec::Kind::kEmbedding && !params[i].empty()) {
        EPS_CUDA_CHECK(
            cudaMemsetAsync(step.grads[i], 0, sizeof(float) * params[i].size(), stream()));
      }
    }
    step.dlogits = dlogits_.as<float>();
  }

  const float* logits = Forward(step);
  SigmoidLogLoss(logits, step.labels, n, device_out_.as<float>(predictions_at),
                 device_out_.as<double>(losses_at), backward ? dlogits_.as<float>() : nullptr,
                 stream());
  if (backward) Backward(step);
  EPS_CUDA_CHECK(cudaMemcpyAsync(host_out_.data(), device_out_.data(), out_bytes,
                                 cudaMemcpyDeviceToHost, stream()));
  context_->Synchronize();

  const float* host_predictions = host_out_.as<float>(predictions_at);
  predictions->assign(host_predictions, host_predictions + n);
  // Summed here, in example order, as the CPU loss is.
  const double* losses = host_out_.as<double>(losses_at);
  double loss = 0;
  for (int i = 0; i < n; ++i) loss += losses[i];
  if (backward) {
    grads->resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const float* grad = host_out_.as<float>(grad_at[i]);
      (*grads)[i].assign(grad, grad + params[i].size());
    }
  }
  return loss;
}

void CudaModelBase::WideForward(const Step& step, size_t w_param, size_t dense_param,
                                const float* base, float* logits) const {
  WideLogits(step.slots, step.offsets, step.n, options_.num_fields, pooling_, step.params[w_param],
             step.dense, options_.num_dense, step.params[dense_param], base, logits, stream());
}

void CudaModelBase::WideBackward(const Step& step, size_t w_param, size_t dense_param) const {
  const int num_dense = options_.num_dense;
  ScatterAddFieldWeights(step.slots, step.offsets, step.n, options_.num_fields, pooling_,
                         step.dlogits, step.grads[w_param], stream());
  float* g_dense = step.grads[dense_param];
  WeightedColumnSums(context().cublas(), step.dense, step.n, num_dense, step.dlogits, g_dense);
  WeightedColumnSums(context().cublas(), step.dlogits, step.n, /*cols=*/1, ones(),
                     g_dense + num_dense);
}

// lr: logit = sum_f w[i,f] + x.v + c. Params: lr.w, lr.dense.
class CudaLrModel final : public CudaModelBase {
 public:
  CudaLrModel(const ModelOptions& options, std::unique_ptr<Model> cpu,
              std::unique_ptr<CudaContext> context)
      : CudaModelBase(options, std::move(cpu), std::move(context)) {
    CHECK_EQ(params().size(), 2u);
  }

 private:
  void Reserve(int n) override { logits_.Reserve(sizeof(float) * n); }

  const float* Forward(const Step& step) override {
    WideForward(step, /*w_param=*/0, /*dense_param=*/1, /*base=*/nullptr, logits_.as<float>());
    return logits_.as<float>();
  }

  void Backward(const Step& step) override { WideBackward(step, /*w_param=*/0, /*dense_param=*/1); }

  DeviceBuffer logits_;
};

// wdl and deepfm (models/wide_deep_model.h). Params: wide (dim 1), emb,
// wide_dense, then the deep MLP's layers.
class CudaWideDeepModel final : public CudaModelBase {
 public:
  CudaWideDeepModel(const ModelOptions& options, std::unique_ptr<Model> cpu,
                    std::unique_ptr<CudaContext> context)
      : CudaModelBase(options, std::move(cpu), std::move(context)),
        fm_(options.type == "deepfm"),
        width_(options.num_dense + options.num_fields * options.embedding_dim),
        deep_(width_, options.mlp, *ParseActivation(options.activation),
              /*activate_last=*/false) {
    CHECK_EQ(params().size(), kFirstLayer + deep_.num_layers());
    for (int l = 0; l < deep_.num_layers(); ++l) {
      CHECK_EQ(params()[kFirstLayer + l].size, deep_.layer_size(l))
          << params()[kFirstLayer + l].name;
    }
  }

 private:
  // Parameter positions in params().
  static constexpr size_t kWide = 0;
  static constexpr size_t kEmb = 1;
  static constexpr size_t kWideDense = 2;
  static constexpr size_t kFirstLayer = 3;

  void Reserve(int n) override {
    input_.Reserve(sizeof(float) * n * width_);
    dinput_.Reserve(sizeof(float) * n * width_);
    logits_.Reserve(sizeof(float) * n);
    deep_.Reserve(n);
  }

  const float* Forward(const Step& step) override {
    const int n = step.n;
    const int num_dense = options().num_dense;
    const int num_fields = options().num_fields;
    const int dim = options().embedding_dim;
    // The deep input: x, then the field embeddings.
    float* input = input_.as<float>();
    if (num_dense > 0) {
      EPS_CUDA_CHECK(cudaMemcpy2DAsync(input, sizeof(float) * width_, step.dense,
                                       sizeof(float) * num_dense, sizeof(float) * num_dense, n,
                                       cudaMemcpyDeviceToDevice, stream()));
    }
    GatherFields(step.slots, step.offsets, n, num_fields, step.params[kEmb], dim, pooling(), input,
                 width_, num_dense, stream());
    const float* deep = deep_.Forward(context(), input, n, LayerWeights(step));
    float* logits = logits_.as<float>();
    WideForward(step, kWide, kWideDense, /*base=*/deep, logits);
    if (fm_) FmForward(input, n, width_, num_dense, num_fields, dim, logits, stream());
    return logits;
  }

  void Backward(const Step& step) override {
    const int n = step.n;
    const int num_dense = options().num_dense;
    const int num_fields = options().num_fields;
    const int dim = options().embedding_dim;
    WideBackward(step, kWide, kWideDense);
    const std::span<float* const> layer_grads(step.grads.data() + kFirstLayer, deep_.num_layers());
    float* dinput = dinput_.as<float>();
    deep_.Backward(context(), step.dlogits, LayerWeights(step), layer_grads, dinput, ones());
    if (fm_) {
      FmBackward(input_.as<float>(), n, width_, num_dense, num_fields, dim, step.dlogits, dinput,
                 stream());
    }
    ScatterAddFields(step.slots, step.offsets, n, num_fields, dinput, width_, num_dense, dim,
                     pooling(), step.grads[kEmb], stream());
  }

  std::span<const float* const> LayerWeights(const Step& step) const {
    return {step.params.data() + kFirstLayer, static_cast<size_t>(deep_.num_layers())};
  }

  const bool fm_;
  const int width_;  // of the deep input: D + F*d
  CudaMlp deep_;
  DeviceBuffer input_;   // [n, width_]
  DeviceBuffer dinput_;  // its gradient
  DeviceBuffer logits_;
};

// dlrm (models/dlrm_model.h). Params: emb, the bottom MLP's layers, the top
// MLP's layers.
class CudaDlrmModel final : public CudaModelBase {
 public:
  CudaDlrmModel(const ModelOptions& options, std::unique_ptr<Model> cpu,
                std::unique_ptr<CudaContext> context)
      : CudaModelBase(options, std::move(cpu), std::move(context)),
        field_width_(options.num_fields * options.embedding_dim),
        top_width_(options.embedding_dim + DotInteractionCount(options.num_fields)),
        bottom_(options.num_dense, options.bottom_mlp, *ParseActivation(options.activation),
                /*activate_last=*/true),
        top_(top_width_, options.top_mlp, *ParseActivation(options.activation),
             /*activate_last=*/false) {
    CHECK_EQ(bottom_.out(), options.embedding_dim);
    CHECK_EQ(params().size(), 1u + bottom_.num_layers() + top_.num_layers());
    for (int l = 0; l < bottom_.num_layers(); ++l) {
      CHECK_EQ(params()[BottomFirst() + l].size, bottom_.layer_size(l));
    }
    for (int l = 0; l < top_.num_layers(); ++l) {
      CHECK_EQ(params()[TopFirst() + l].size, top_.layer_size(l));
    }
  }

 private:
  static constexpr size_t kEmb = 0;
  size_t BottomFirst() const { return 1; }
  size_t TopFirst() const { return 1 + bottom_.num_layers(); }

  void Reserve(int n) override {
    fields_.Reserve(sizeof(float) * n * field_width_);
    dfields_.Reserve(sizeof(float) * n * field_width_);
    top_input_.Reserve(sizeof(float) * n * top_width_);
    dtop_input_.Reserve(sizeof(float) * n * top_width_);
    dz_.Reserve(sizeof(float) * n * options().embedding_dim);
    bottom_.Reserve(n);
    top_.Reserve(n);
  }

  const float* Forward(const Step& step) override {
    const int n = step.n;
    const int num_fields = options().num_fields;
    const int dim = options().embedding_dim;
    float* fields = fields_.as<float>();
    GatherFields(step.slots, step.offsets, n, num_fields, step.params[kEmb], dim, pooling(), fields,
                 field_width_, /*offset=*/0, stream());
    z_ = bottom_.Forward(
        context(), step.dense, n,
        {step.params.data() + BottomFirst(), static_cast<size_t>(bottom_.num_layers())});
    // The top input: z, then the dots.
    float* top_input = top_input_.as<float>();
    EPS_CUDA_CHECK(cudaMemcpy2DAsync(top_input, sizeof(float) * top_width_, z_, sizeof(float) * dim,
                                     sizeof(float) * dim, n, cudaMemcpyDeviceToDevice, stream()));
    DotForward(z_, fields, n, field_width_, /*offset=*/0, num_fields, dim, top_input, top_width_,
               /*out_offset=*/dim, stream());
    return top_.Forward(context(), top_input, n, TopWeights(step));
  }

  void Backward(const Step& step) override {
    const int n = step.n;
    const int num_fields = options().num_fields;
    const int dim = options().embedding_dim;
    float* dtop_input = dtop_input_.as<float>();
    top_.Backward(context(), step.dlogits, TopWeights(step),
                  {step.grads.data() + TopFirst(), static_cast<size_t>(top_.num_layers())},
                  dtop_input, ones());
    // z feeds the top MLP directly and through the dots.
    float* dz = dz_.as<float>();
    EPS_CUDA_CHECK(cudaMemcpy2DAsync(dz, sizeof(float) * dim, dtop_input,
                                     sizeof(float) * top_width_, sizeof(float) * dim, n,
                                     cudaMemcpyDeviceToDevice, stream()));
    float* dfields = dfields_.as<float>();
    DotBackward(z_, fields_.as<float>(), n, field_width_, /*offset=*/0, num_fields, dim, dtop_input,
                top_width_, /*out_offset=*/dim, dz, dfields, stream());
    bottom_.Backward(
        context(), dz,
        {step.params.data() + BottomFirst(), static_cast<size_t>(bottom_.num_layers())},
        {step.grads.data() + BottomFirst(), static_cast<size_t>(bottom_.num_layers())},
        /*dinput=*/nullptr, ones());
    ScatterAddFields(step.slots, step.offsets, n, num_fields, dfields, field_width_, /*offset=*/0,
                     dim, pooling(), step.grads[kEmb], stream());
  }

  std::span<const float* const> TopWeights(const Step& step) const {
    return {step.params.data() + TopFirst(), static_cast<size_t>(top_.num_layers())};
  }

  const int field_width_;  // F*d
  const int top_width_;    // d + (F+1)F/2
  CudaMlp bottom_;
  CudaMlp top_;
  DeviceBuffer fields_;  // [n, F*d]
  DeviceBuffer dfields_;
  DeviceBuffer top_input_;  // [n, top_width_]: z, then the dots
  DeviceBuffer dtop_input_;
  DeviceBuffer dz_;           // [n, d]
  const float* z_ = nullptr;  // bottom_'s output of the step in progress
};

}  // namespace
}  // namespace cuda

Status LoadCudaLibraries() { return cuda::LoadCublas().status(); }

StatusOr<std::unique_ptr<Model>> CreateCudaModel(const ModelOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const CudaProbe probe = ProbeCuda();
  if (probe.device_count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU for the CUDA model (", probe.reason, ")"));
  }
  // The CPU model of the same options names and shapes the parameters.
  ASSIGN_OR_RETURN(std::unique_ptr<Model> cpu, Model::Create(options));
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaContext> context, cuda::CudaContext::Create());
  if (options.type == "wdl" || options.type == "deepfm") {
    return std::unique_ptr<Model>(
        new cuda::CudaWideDeepModel(options, std::move(cpu), std::move(context)));
  }
  if (options.type == "dlrm") {
    return std::unique_ptr<Model>(
        new cuda::CudaDlrmModel(options, std::move(cpu), std::move(context)));
  }
  return std::unique_ptr<Model>(new cuda::CudaLrModel(options, std::move(cpu), std::move(context)));
}

}  // namespace eps
