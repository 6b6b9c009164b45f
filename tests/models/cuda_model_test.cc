// GPU tests (CTest label `gpu`) of the CUDA models: every model, on realistic
// batches, against the CPU model of the same options. Tests that need a GPU
// skip, saying why, where none is visible.

#include "models/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "models/device.h"
#include "tests/models/gradient_check.h"

namespace eps {
namespace {

#define SKIP_WITHOUT_GPU()                                                 \
  do {                                                                     \
    const CudaProbe probe = ProbeCuda();                                   \
    if (probe.device_count == 0) {                                         \
      GTEST_SKIP() << "no GPU visible (" << probe.reason << "): skipping"; \
    }                                                                      \
  } while (0)

// Criteo's shape: 13 dense features, 26 fields, dim 16.
constexpr int kDense = 13;
constexpr int kFields = 26;
constexpr int kDim = 16;
// Ids per field: small enough that ids repeat across a batch's examples,
// so the gradient scatter adds several uses into one row.
constexpr int kVocabulary = 50;

// `cuda` matches `cpu` when every element satisfies
//   |cuda - cpu| <= 1e-4 * max(|cpu|, rms(cpu)),
// rms being the root mean square of the CPU tensor: 1e-4 relative for
// every element at least as large as the tensor's typical one. Smaller
// elements are sums (over examples, over a row's uses) that mostly cancel;
// the devices round their terms differently (other summation orders, other
// exp/tanh), and that difference scales with the terms, not with the small
// result, so they are held to 1e-4 of the typical element instead. On the
// CPU, the same model run with its inputs moved by one ulp and its examples
// shuffled stays within 0.35 of this tolerance on these tests' batches (the
// worst: the hidden layers' weights, dlrm's bottom ones under tanh, whose
// all-positive inputs make every element a cancellation); most tensors stay
// within 0.1.
constexpr double kRelative = 1e-4;

void ExpectClose(std::span<const float> cuda, std::span<const float> cpu, const std::string& what) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  double sum_squares = 0;
  for (float v : cpu) sum_squares += static_cast<double>(v) * v;
  const double rms = cpu.empty() ? 0 : std::sqrt(sum_squares / cpu.size());
  size_t failures = 0;
  size_t worst = 0;
  double worst_ratio = 0;  // |difference| / tolerance
  for (size_t j = 0; j < cpu.size(); ++j) {
    const double difference = std::abs(static_cast<double>(cuda[j]) - cpu[j]);
    const double tolerance = kRelative * std::max(std::abs(static_cast<double>(cpu[j])), rms);
    double ratio = tolerance > 0 ? difference / tolerance : (difference > 0 ? INFINITY : 0);
    if (std::isnan(ratio)) ratio = INFINITY;  // a NaN on either side
    if (ratio > 1.0) ++failures;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = j;
    }
  }
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << cpu.size()
                          << " elements differ; worst at " << worst << ": cuda " << cuda[worst]
                          << " vs cpu " << cpu[worst] << " (" << worst_ratio << " x tolerance; rms "
                          << rms << ")";
  // The margin, for whoever tunes the tolerance.
  testing::Test::RecordProperty(absl::StrCat(what, ".worst_ratio"), absl::StrCat(worst_ratio));
}

void ExpectLossClose(double cuda, double cpu) {
  EXPECT_LE(std::abs(cuda - cpu), kRelative * std::abs(cpu))
      << "loss: cuda " << cuda << " vs cpu " << cpu;
}

ModelOptions Options(const std::string& type, const std::string& activation) {
  ModelOptions options;
  options.type = type;
  options.num_dense = kDense;
  options.num_fields = kFields;
  options.embedding_dim = kDim;
  options.activation = activation;
  return options;
}

// Parameters at the scale training sees: each tensor uniform in +- its
// default init scale (1/sqrt(fan-in) for Linear layers, 0.05 for the
// embeddings), and +-0.1 for those that start at zero.
ParamBuffers RealisticParams(const Model& model, const Batch& batch, uint64_t seed) {
  ParamBuffers params = RandomParams(model, batch, seed, /*scale=*/1.0f);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& spec = model.params()[i];
    const float scale = spec.default_init_scale > 0 ? spec.default_init_scale : 0.1f;
    for (float& v : params[i]) v *= scale;
  }
  return params;
}

struct Models {
  std::unique_ptr<Model> cpu;
  std::unique_ptr<Model> cuda;
};

Models Create(const ModelOptions& options) {
  StatusOr<std::unique_ptr<Model>> cpu = Model::Create(options);
  CHECK_OK(cpu.status());
  StatusOr<std::unique_ptr<Model>> cuda = CreateCudaModel(options);
  CHECK_OK(cuda.status());
  return {*std::move(cpu), *std::move(cuda)};
}

// Runs one batch through both models and compares everything they return.
void ExpectSameStep(Model& cpu, Model& cuda, const Batch& batch, const ParamBuffers& params,
                    bool backward = true) {
  std::vector<float> cpu_predictions;
  std::vector<float> cuda_predictions;
  ParamBuffers cpu_grads;
  ParamBuffers cuda_grads;
  const double cpu_loss =
      cpu.ForwardBackward(batch, params, &cpu_predictions, backward ? &cpu_grads : nullptr);
  const double cuda_loss =
      cuda.ForwardBackward(batch, params, &cuda_predictions, backward ? &cuda_grads : nullptr);
  ExpectLossClose(cuda_loss, cpu_loss);
  ASSERT_EQ(cuda_predictions.size(), static_cast<size_t>(batch.size()));
  ExpectClose(cuda_predictions, cpu_predictions, "predictions");
  if (!backward) return;
  ASSERT_EQ(cuda_grads.size(), cpu.params().size());
  for (size_t i = 0; i < cpu_grads.size(); ++i) {
    ExpectClose(cuda_grads[i], cpu_grads[i], cpu.params()[i].name);
  }
}

TEST(CudaModel, WithoutAGpuFailsWithTheReason) {
  // Runs everywhere: the error contract of a machine without a GPU.
  const CudaProbe probe = ProbeCuda();
  StatusOr<std::unique_ptr<Model>> model = CreateCudaModel(ModelOptions{.type = "dlrm"});
  if (probe.device_count > 0) {
    ASSERT_TRUE(model.ok()) << model.status();
    return;
  }
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  if (probe.compiled) {
    EXPECT_NE(model.status().message().find(probe.reason), absl::string_view::npos)
        << model.status();
  }
}

TEST(CudaModel, OpensCublasAtRunTime) {
  // Runs everywhere (no GPU needed): cuBLAS is opened, not linked, and
  // every function the models call resolves.
  const Status loaded = LoadCudaLibraries();
  if (!ProbeCuda().compiled) {
    EXPECT_EQ(loaded.code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  EXPECT_TRUE(loaded.ok()) << loaded;
}

TEST(CudaModel, RejectsInvalidOptionsFirst) {
  // Runs everywhere: bad options are kInvalidArgument, GPU or not.
  EXPECT_EQ(CreateCudaModel(ModelOptions{.type = "svm"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaModel, DeclaresTheCpuModelsParams) {
  SKIP_WITHOUT_GPU();
  for (const std::string type : {"lr", "wdl", "deepfm", "dlrm"}) {
    SCOPED_TRACE(type);
    Models models = Create(Options(type, "relu"));
    const std::vector<ParamSpec>& want = models.cpu->params();
    const std::vector<ParamSpec>& got = models.cuda->params();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].name, want[i].name);
      EXPECT_EQ(got[i].kind, want[i].kind);
      EXPECT_EQ(got[i].size, want[i].size);
      EXPECT_EQ(got[i].default_initializer, want[i].default_initializer);
      EXPECT_EQ(got[i].default_init_scale, want[i].default_init_scale);
      EXPECT_EQ(got[i].pull_each_step, want[i].pull_each_step);
    }
  }
}

class CudaModelMatchesCpu : public testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaModelMatchesCpu, OnACriteoSizedBatch) {
  SKIP_WITHOUT_GPU();
  const auto& [type, activation] = GetParam();
  ModelOptions options = Options(type, activation);
  if (activation == "relu") {
    // relu' jumps at 0: a pre-activation within float rounding of 0 may take
    // either side on either device and change a gradient row by a whole
    // term. The odds grow with the number of activations; narrower MLPs
    // keep them negligible. The smooth activations run the default sizes.
    options.mlp = {64, 32, 1};
    options.bottom_mlp = {64, kDim};
    options.top_mlp = {64, 1};
  }
  Models models = Create(options);
  const Batch batch = RandomBatch(/*n=*/256, kDense, kFields, kVocabulary, /*seed=*/21);
  const ParamBuffers params = RealisticParams(*models.cpu, batch, /*seed=*/22);
  ExpectSameStep(*models.cpu, *models.cuda, batch, params);
  // Forward only: the same predictions and loss, no gradients.
  ExpectSameStep(*models.cpu, *models.cuda, batch, params, /*backward=*/false);
}

INSTANTIATE_TEST_SUITE_P(AllModels, CudaModelMatchesCpu,
                         testing::Combine(testing::Values("lr", "wdl", "deepfm", "dlrm"),
                                          testing::Values("relu", "tanh", "sigmoid")),
                         [](const testing::TestParamInfo<CudaModelMatchesCpu::ParamType>& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

TEST(CudaModel, ReusesItsBuffersAsBatchesGrowAndShrink) {
  SKIP_WITHOUT_GPU();
  for (const std::string type : {"lr", "wdl", "deepfm", "dlrm"}) {
    SCOPED_TRACE(type);
    Models models = Create(Options(type, "tanh"));
    uint64_t seed = 31;
    // Up, down below the first size, up past the largest, down again: a
    // stale size or a missed reallocation shows up as a mismatch.
    for (int n : {64, 512, 16, 256, 1024, 1, 128}) {
      SCOPED_TRACE(absl::StrCat("n = ", n));
      const Batch batch = RandomBatch(n, kDense, kFields, kVocabulary, seed++);
      const ParamBuffers params = RealisticParams(*models.cpu, batch, seed++);
      ExpectSameStep(*models.cpu, *models.cuda, batch, params, /*backward=*/n != 16);
    }
  }
}

class CudaModelPoolsLikeCpu : public testing::TestWithParam<std::tuple<std::string, std::string>> {
};

TEST_P(CudaModelPoolsLikeCpu, OnAMultiValueBatch) {
  SKIP_WITHOUT_GPU();
  const auto& [type, pooling] = GetParam();
  ModelOptions options = Options(type, "tanh");
  options.pooling = pooling;
  Models models = Create(options);
  const Batch batch =
      RandomBatch(/*n=*/256, kDense, kFields, kVocabulary, /*seed=*/51, /*max_values=*/3);
  ASSERT_TRUE(batch.multi_value());
  const ParamBuffers params = RealisticParams(*models.cpu, batch, /*seed=*/52);
  ExpectSameStep(*models.cpu, *models.cuda, batch, params);
  ExpectSameStep(*models.cpu, *models.cuda, batch, params, /*backward=*/false);
  // Single-value batches between multi-value ones take the other kernels
  // with the same buffers.
  const Batch single = RandomBatch(/*n=*/300, kDense, kFields, kVocabulary, /*seed=*/53);
  ExpectSameStep(*models.cpu, *models.cuda, single,
                 RealisticParams(*models.cpu, single, /*seed=*/54));
  const Batch larger =
      RandomBatch(/*n=*/512, kDense, kFields, kVocabulary, /*seed=*/55, /*max_values=*/3);
  ExpectSameStep(*models.cpu, *models.cuda, larger,
                 RealisticParams(*models.cpu, larger, /*seed=*/56));
}

INSTANTIATE_TEST_SUITE_P(AllModels, CudaModelPoolsLikeCpu,
                         testing::Combine(testing::Values("lr", "wdl", "deepfm", "dlrm"),
                                          testing::Values("sum", "mean")),
                         [](const testing::TestParamInfo<CudaModelPoolsLikeCpu::ParamType>& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

TEST(CudaModel, OffsetsOfOneIdPerFieldMatchTheSingleValuePath) {
  // GPU against GPU: the pooled kernels, given offsets that spell out one
  // id per field, compute what the single-value kernels do.
  SKIP_WITHOUT_GPU();
  for (const std::string type : {"lr", "wdl", "deepfm", "dlrm"}) {
    SCOPED_TRACE(type);
    ModelOptions options = Options(type, "tanh");
    options.pooling = "mean";
    StatusOr<std::unique_ptr<Model>> model = CreateCudaModel(options);
    ASSERT_TRUE(model.ok()) << model.status();
    const Batch single = RandomBatch(/*n=*/128, kDense, kFields, kVocabulary, /*seed=*/61);
    Batch spelled_out = single;
    spelled_out.offsets.resize(spelled_out.slots.size() + 1);
    for (size_t j = 0; j < spelled_out.offsets.size(); ++j) {
      spelled_out.offsets[j] = static_cast<uint32_t>(j);
    }
    ASSERT_TRUE(spelled_out.multi_value());
    const ParamBuffers params = RealisticParams(**model, single, /*seed=*/62);
    std::vector<float> single_predictions;
    std::vector<float> spelled_predictions;
    ParamBuffers single_grads;
    ParamBuffers spelled_grads;
    const double single_loss =
        (*model)->ForwardBackward(single, params, &single_predictions, &single_grads);
    const double spelled_loss =
        (*model)->ForwardBackward(spelled_out, params, &spelled_predictions, &spelled_grads);
    // The forward pass reads the same rows in the same order: bit for bit.
    EXPECT_EQ(spelled_loss, single_loss);
    EXPECT_EQ(spelled_predictions, single_predictions);
    // The gradients differ at most in the order of their atomic adds.
    ASSERT_EQ(spelled_grads.size(), single_grads.size());
    for (size_t i = 0; i < single_grads.size(); ++i) {
      ExpectClose(spelled_grads[i], single_grads[i], (*model)->params()[i].name);
    }
  }
}

TEST(CudaModel, AnEmptyBatchHasNoLossAndZeroGradients) {
  SKIP_WITHOUT_GPU();
  for (const std::string type : {"lr", "wdl", "deepfm", "dlrm"}) {
    SCOPED_TRACE(type);
    Models models = Create(Options(type, "relu"));
    const Batch batch = RandomBatch(/*n=*/0, kDense, kFields, kVocabulary, /*seed=*/41);
    const ParamBuffers params = RealisticParams(*models.cpu, batch, /*seed=*/42);
    std::vector<float> predictions;
    ParamBuffers grads;
    EXPECT_EQ(models.cuda->ForwardBackward(batch, params, &predictions, &grads), 0.0);
    EXPECT_TRUE(predictions.empty());
    ASSERT_EQ(grads.size(), params.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(grads[i].size(), params[i].size());
      for (float g : grads[i]) EXPECT_EQ(g, 0.0f) << models.cuda->params()[i].name;
    }
  }
}

}  // namespace
}  // namespace eps
