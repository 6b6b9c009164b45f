// eps's models against a PyTorch implementation of the same math
// (bench/reference_models.py, docs/models.md): a fixed batch and identical
// parameters go to both; the loss, the predictions and every gradient
// tensor must agree to 1e-5 relative (||eps - torch|| / ||torch||), and
// every entry to 1e-3 of its size or the tensor's RMS. PyTorch computes in
// float64, so the differences are eps's own float32 rounding. Skips when
// /usr/bin/python3 has no torch.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "models/model.h"
#include "nlohmann/json.hpp"
#include "tests/models/gradient_check.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::Process;
using ::eps::testing::TempDir;

constexpr char kPython[] = "/usr/bin/python3";

template <typename T>
void WriteArray(const std::string& path, const std::vector<T>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(T)));
  CHECK(out.good()) << path;
}

std::vector<float> ReadFloats(const std::string& path, size_t count) {
  std::vector<float> values(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(float)));
  EXPECT_TRUE(in.good()) << "cannot read " << count << " floats from " << path;
  return values;
}

// ||a - b|| / ||b|| (Euclidean): the tensor's relative error.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The largest |a - b| relative to max(|b|, rms(b)): catches an error
// confined to a few entries, which the norm would dilute. Entries that
// cancel to near zero are measured against the tensor's typical size.
double MaxElementError(const std::vector<float>& a, const std::vector<float>& b) {
  double squares = 0;
  for (float v : b) squares += static_cast<double>(v) * v;
  const double rms = std::max(std::sqrt(squares / std::max<size_t>(1, b.size())), 1e-30);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(worst, diff / std::max(std::abs(static_cast<double>(b[i])), rms));
  }
  return worst;
}

// Tolerances: each tensor within 1e-5 relative (in norm), every entry
// within 1e-3 of its own size or the tensor's RMS, whichever is larger (the
// worst seen: 1.3e-4, one entry of 188k in dlrm.top.0).
constexpr double kRelativeTolerance = 1e-5;
constexpr double kElementTolerance = 1e-3;

bool HaveTorch(const TempDir& dir) {
  auto process = Process::Start({kPython, "-c", "import torch, numpy"}, dir.Join("probe.log"));
  if (!process.ok()) return false;
  std::optional<int> code = (*process)->Wait(absl::Seconds(60));
  return code.has_value() && *code == 0;
}

void CrossCheck(const ModelOptions& options, int n, uint64_t seed, int max_values = 1) {
  TempDir dir;
  if (!HaveTorch(dir)) {
    GTEST_SKIP() << kPython << " has no torch/numpy (Debian's python3-torch, python3-numpy): "
                 << "skipping the PyTorch cross-check";
  }
  StatusOr<std::unique_ptr<Model>> created = Model::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  Model& model = **created;
  const Batch batch =
      RandomBatch(n, options.num_dense, options.num_fields, /*vocabulary=*/40, seed, max_values);
  ASSERT_EQ(batch.multi_value(), max_values > 1);
  // Parameters at their initialisers' scale (embeddings and dim-1 weights
  // at 0.1), so that activations are in their working range.
  ParamBuffers params = RandomParams(model, batch, seed + 1, /*scale=*/1.0f);
  for (size_t i = 0; i < params.size(); ++i) {
    const float scale = model.params()[i].default_init_scale > 0 ? model.params()[i].default_init_scale : 0.1f;
    for (float& v : params[i]) v *= scale;
  }
  std::vector<float> predictions;
  ParamBuffers grads;
  const double loss = model.ForwardBackward(batch, params, &predictions, &grads);

  nlohmann::json meta = {{"model", options.type},
                         {"num_dense", options.num_dense},
                         {"num_fields", options.num_fields},
                         {"embedding_dim", options.embedding_dim},
                         {"mlp", options.mlp},
                         {"bottom_mlp", options.bottom_mlp},
                         {"top_mlp", options.top_mlp},
                         {"activation", options.activation},
                         {"pooling", options.pooling},
                         {"batch", n},
                         {"num_keys", batch.keys.size()},
                         {"params", nlohmann::json::array()}};
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& spec = model.params()[i];
    meta["params"].push_back({{"name", spec.name},
                              {"kind", spec.kind == ParamSpec::Kind::kEmbedding ? "embedding" : "dense"},
                              {"size", spec.size}});
    WriteArray(dir.Join(absl::StrCat("param_", i, ".f32")), params[i]);
  }
  std::ofstream(dir.Join("meta.json")) << meta.dump();
  WriteArray(dir.Join("labels.f32"), batch.labels);
  WriteArray(dir.Join("dense.f32"), batch.dense);
  WriteArray(dir.Join("slots.u32"), batch.slots);
  if (batch.multi_value()) WriteArray(dir.Join("offsets.u32"), batch.offsets);

  auto process = Process::Start(
      {kPython, std::string(EPS_SOURCE_DIR) + "/bench/reference_models.py", "crosscheck", dir.path()},
      dir.Join("torch.log"));
  ASSERT_TRUE(process.ok()) << process.status();
  std::optional<int> code = (*process)->Wait(absl::Seconds(120));
  ASSERT_EQ(code.value_or(-1), 0) << (*process)->Log();

  std::ifstream loss_file(dir.Join("torch_loss.json"));
  const double torch_loss = nlohmann::json::parse(loss_file)["loss_sum"].get<double>();
  EXPECT_NEAR(loss, torch_loss, 1e-5 * std::abs(torch_loss)) << "loss sum";
  const std::vector<float> torch_predictions = ReadFloats(dir.Join("torch_predictions.f32"), n);
  const double prediction_error = RelativeError(predictions, torch_predictions);
  EXPECT_LE(prediction_error, kRelativeTolerance) << "predictions";
  EXPECT_LE(MaxElementError(predictions, torch_predictions), kElementTolerance) << "predictions";
  std::string report = absl::StrCat(options.type, " (", options.activation, "): loss ", loss,
                                    " vs ", torch_loss, "; predictions ", prediction_error);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> expected =
        ReadFloats(dir.Join(absl::StrCat("torch_grad_", i, ".f32")), params[i].size());
    const double error = RelativeError(grads[i], expected);
    const double element_error = MaxElementError(grads[i], expected);
    EXPECT_LE(error, kRelativeTolerance) << "gradient of " << model.params()[i].name;
    EXPECT_LE(element_error, kElementTolerance) << "gradient of " << model.params()[i].name;
    absl::StrAppend(&report, "; ", model.params()[i].name, " ", error, " (entry ", element_error,
                    ")");
  }
  std::cout << "relative errors against PyTorch (float64): " << report << "\n";
}

ModelOptions Criteo(const std::string& type, const std::string& activation = "relu",
                    const std::string& pooling = "sum") {
  ModelOptions options;
  options.type = type;
  options.activation = activation;
  options.pooling = pooling;
  return options;
}

TEST(TorchCrossCheck, Lr) { CrossCheck(Criteo("lr"), /*n=*/64, /*seed=*/1); }
TEST(TorchCrossCheck, Wdl) { CrossCheck(Criteo("wdl"), /*n=*/64, /*seed=*/2); }
TEST(TorchCrossCheck, DeepFm) { CrossCheck(Criteo("deepfm"), /*n=*/64, /*seed=*/3); }
TEST(TorchCrossCheck, Dlrm) { CrossCheck(Criteo("dlrm"), /*n=*/64, /*seed=*/4); }
TEST(TorchCrossCheck, DlrmTanh) { CrossCheck(Criteo("dlrm", "tanh"), /*n=*/64, /*seed=*/5); }
TEST(TorchCrossCheck, WdlSigmoid) { CrossCheck(Criteo("wdl", "sigmoid"), /*n=*/64, /*seed=*/6); }
// Multi-value fields, 1 to 3 ids each.
TEST(TorchCrossCheck, LrMeanPooling) {
  CrossCheck(Criteo("lr", "relu", "mean"), /*n=*/64, /*seed=*/7, /*max_values=*/3);
}
TEST(TorchCrossCheck, DeepFmSumPooling) {
  CrossCheck(Criteo("deepfm", "relu", "sum"), /*n=*/64, /*seed=*/8, /*max_values=*/3);
}
TEST(TorchCrossCheck, DlrmMeanPooling) {
  CrossCheck(Criteo("dlrm", "relu", "mean"), /*n=*/64, /*seed=*/9, /*max_values=*/3);
}

}  // namespace
}  // namespace eps
