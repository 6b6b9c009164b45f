// Model math on the CPU: forward + backward of each model over one
// Criteo-shaped batch (13 dense features, 26 fields, embedding dim 16, the
// default MLPs), as a worker runs it between pull and push. Items are
// training samples; the FLOP counter counts the dense products
// (2 * multiply-adds, forward and both backward products).
//
//   build/bench/model_bench [--benchmark_filter=dlrm] [--threads=N] [--batch=B]
//
// bench/models_vs_pytorch.sh runs this beside PyTorch on the same batch
// shape and threads and prints the ratios.

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/logging.h"
#include "models/mlp.h"
#include "models/model.h"

namespace eps {
namespace {

int g_threads = 1;
int g_batch = 1024;

// n examples; K = n*F/2 unique rows, slots uniform over them (the shape
// bench/reference_models.py's speed command uses).
Batch MakeBatch(int n, int num_dense, int num_fields, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0, 2);
  Batch batch;
  batch.num_dense = num_dense;
  batch.num_fields = num_fields;
  const int keys = std::max(1, n * num_fields / 2);
  for (int k = 0; k < keys; ++k) batch.keys.push_back(static_cast<uint64_t>(k));
  for (int i = 0; i < n; ++i) {
    batch.labels.push_back(static_cast<float>(rng() % 4 == 0));
    for (int d = 0; d < num_dense; ++d) batch.dense.push_back(uniform(rng));
    for (int f = 0; f < num_fields; ++f) {
      batch.slots.push_back(static_cast<uint32_t>(rng() % static_cast<uint64_t>(keys)));
    }
  }
  return batch;
}

// Multiply-adds of one sample's forward pass through the dense layers.
double ForwardMacs(const Model& model) {
  double macs = 0;
  for (const ParamSpec& spec : model.params()) {
    if (spec.kind == ParamSpec::Kind::kDense && spec.pull_each_step) macs += static_cast<double>(spec.size);
  }
  return macs;  // out*in + out: the weights plus the bias adds
}

void BM_ForwardBackward(benchmark::State& state, const std::string& type) {
  SetCpuThreads(g_threads);
  const int n = static_cast<int>(state.range(0));
  ModelOptions options;
  options.type = type;
  StatusOr<std::unique_ptr<Model>> created = Model::Create(options);
  CHECK_OK(created.status());
  Model& model = **created;
  const Batch batch = MakeBatch(n, options.num_dense, options.num_fields, 1);
  std::mt19937_64 rng(2);
  ParamBuffers params(model.params().size());
  for (size_t i = 0; i < params.size(); ++i) {
    const float scale = model.params()[i].default_init_scale > 0 ? model.params()[i].default_init_scale : 0.05f;
    std::uniform_real_distribution<float> uniform(-scale, scale);
    params[i].resize(model.BufferSize(i, batch));
    for (float& v : params[i]) v = uniform(rng);
  }
  std::vector<float> predictions;
  ParamBuffers grads;
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.ForwardBackward(batch, params, &predictions, &grads));
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["threads"] = g_threads;
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * 3.0 * ForwardMacs(model) * n * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace eps

int main(int argc, char** argv) {
  // --threads=N and --batch=B (ours) before Google Benchmark's flags.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      eps::g_threads = std::atoi(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--batch=", 8) == 0) {
      eps::g_batch = std::max(1, std::atoi(argv[i] + 8));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  for (const char* type : {"lr", "wdl", "deepfm", "dlrm"}) {
    benchmark::RegisterBenchmark(type, [type](benchmark::State& state) {
      eps::BM_ForwardBackward(state, type);
    })->Arg(eps::g_batch)->ArgName("batch")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  }
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
