// Model: forward and backward of a CTR model over one Batch.
//
// A model declares its parameters: embedding tables (one row of `dim`
// floats per feature id, shared by all categorical fields: ids are already
// distinct per field) and dense tensors. For a step the caller supplies, in
// params() order, each embedding table's rows for batch.keys (keys x dim)
// and each dense tensor whole; the model returns predictions and the
// gradients of the batch's mean log loss in the same layout.
//
// Thread-safety: const methods are safe for concurrent use; ForwardBackward
// may keep scratch space, so one thread at a time per Model.

#ifndef EPS_MODELS_MODEL_H_
#define EPS_MODELS_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/job_config.h"
#include "core/status.h"
#include "models/batch.h"

namespace eps {

// The models and their exact math: docs/models.md.
struct ModelOptions {
  // lr, wdl, deepfm or dlrm. Default lr.
  std::string type = "lr";
  // Dense and categorical features per example. Defaults: Criteo's 13, 26.
  int num_dense = 13;
  int num_fields = 26;
  // Floats per embedding row, for models with embeddings. Default 16.
  int embedding_dim = 16;
  // Layer sizes of wdl's and deepfm's deep MLP; the last must be 1.
  std::vector<int> mlp = {400, 400, 400, 1};
  // dlrm's bottom MLP (the last size must be embedding_dim) and top MLP
  // (the last must be 1): the reference Criteo DLRM by default.
  std::vector<int> bottom_mlp = {512, 256, 64, 16};
  std::vector<int> top_mlp = {512, 256, 1};
  // Hidden-layer activation: relu, sigmoid or tanh. Default relu.
  std::string activation = "relu";
  // How a multi-value field's rows combine: sum or mean (docs/models.md).
  // Default sum.
  std::string pooling = "sum";

  Status Validate() const;
  // The model of a job config: the [model] options and the feature counts
  // of the data schema. kInvalidArgument as Validate.
  static StatusOr<ModelOptions> FromConfig(const JobConfig& config);
};

struct ParamSpec {
  enum class Kind { kEmbedding, kDense };
  // Never renamed: servers and checkpoints know parameters by name.
  std::string name;
  Kind kind = Kind::kEmbedding;
  // Embedding: floats per row. Dense: the tensor's size in floats.
  uint64_t size = 0;
  // The initialiser the model wants by default ("zeros", "normal",
  // "uniform") and its scale.
  std::string default_initializer = "zeros";
  float default_init_scale = 0.0f;
  // Pull this dense tensor just before each step rather than when the
  // batch is prepared (a few batches ahead): an MLP trained on tensors a
  // few of its own updates old converges far worse, while the round trip
  // would dominate the step of a model with only a tiny dense tensor (lr).
  bool pull_each_step = false;
  // A layer of an MLP (its weights and bias): trained with optimizer.mlp's
  // settings by default (docs/models.md, "Optimizers").
  bool mlp_layer = false;
};

// One buffer per parameter, in params() order.
using ParamBuffers = std::vector<std::vector<float>>;

// True when every value of every buffer is finite (a diverged step's
// gradients are not).
bool AllFinite(const ParamBuffers& buffers);

// Sets the threads the CPU model math (Eigen products, OpenMP loops) uses
// in this process; 0 = every core it may run on. Process-wide: call once at
// startup.
void SetCpuThreads(int threads);

class Model {
 public:
  // kInvalidArgument for an unknown type or bad sizes.
  static StatusOr<std::unique_ptr<Model>> Create(const ModelOptions& options);
  virtual ~Model() = default;

  virtual const std::vector<ParamSpec>& params() const = 0;

  // Floats buffer `i` must hold for `batch`.
  size_t BufferSize(size_t i, const Batch& batch) const;

  // The buffers for a slice of the batch `params` were pulled for
  // (SliceBatch, models/batch.h): each embedding table's rows of the
  // slice's keys, whose rows in `params` `from` gives, and every dense
  // tensor whole.
  ParamBuffers SliceParams(const ParamBuffers& params, const std::vector<uint32_t>& from) const;

  // Computes predictions (probabilities, one per example) and returns the
  // sum of the examples' log losses. When `grads` is non-null, also fills it
  // with the gradients of the mean loss (resized to the params' shapes).
  // REQUIRES: params[i].size() == BufferSize(i, batch) for every i.
  virtual double ForwardBackward(const Batch& batch, const ParamBuffers& params,
                                 std::vector<float>* predictions, ParamBuffers* grads) = 0;
};

class Mlp;

// The parameters of `mlp`'s layers, "<prefix>.<l>" for layer l: dense, each
// a Linear tensor, initialised uniform in +-1/sqrt(fan-in).
std::vector<ParamSpec> MlpParams(const std::string& prefix, const Mlp& mlp);

}  // namespace eps

#endif  // EPS_MODELS_MODEL_H_
