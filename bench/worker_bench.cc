// The worker's CPU path, step by step: parsing Criteo lines, building
// batches (unique keys), and LR forward/backward. Items are records.
//
//   build/bench/worker_bench

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "models/batch.h"
#include "models/model.h"
#include "worker/record_parser.h"

namespace eps {
namespace {

// Criteo-like lines: small integers, ids drawn from a skewed range.
std::vector<std::string> MakeLines(int n) {
  std::mt19937_64 rng(1);
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    std::string line = absl::StrCat(rng() % 4 == 0 ? 1 : 0);
    for (int d = 0; d < 13; ++d) {
      absl::StrAppend(&line, "\t");
      if (rng() % 5) absl::StrAppend(&line, rng() % 100);
    }
    for (int c = 0; c < 26; ++c) {
      const uint64_t rank = static_cast<uint64_t>(std::exp(std::uniform_real_distribution<>(0, 12)(rng)));
      absl::StrAppend(&line, "\t", absl::StrFormat("%08x", (rank * 2654435761u) & 0xffffffff));
    }
    lines.push_back(line);
  }
  return lines;
}

void BM_ParseCriteoLine(benchmark::State& state) {
  const std::vector<std::string> lines = MakeLines(4096);
  RecordParser parser(Schema::Criteo());
  std::vector<float> dense(13);
  std::vector<uint64_t> ids(26);
  float label = 0;
  size_t i = 0;
  int64_t bytes = 0;
  for (auto _ : state) {
    const std::string& line = lines[i++ % lines.size()];
    benchmark::DoNotOptimize(parser.Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids)));
    bytes += static_cast<int64_t>(line.size());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_ParseCriteoLine);

Batch MakeBatch(int size) {
  const std::vector<std::string> lines = MakeLines(size);
  RecordParser parser(Schema::Criteo());
  BatchBuilder builder(13, 26);
  std::vector<float> dense(13);
  std::vector<uint64_t> ids(26);
  float label = 0;
  for (const std::string& line : lines) {
    if (parser.Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids)).ok()) {
      builder.Add(label, dense, ids);
    }
  }
  return builder.Finish();
}

void BM_BuildBatch(benchmark::State& state) {
  const std::vector<std::string> lines = MakeLines(static_cast<int>(state.range(0)));
  RecordParser parser(Schema::Criteo());
  BatchBuilder builder(13, 26);
  std::vector<float> dense(13);
  std::vector<uint64_t> ids(26);
  float label = 0;
  std::vector<std::vector<float>> parsed_dense;
  std::vector<std::vector<uint64_t>> parsed_ids;
  std::vector<float> labels;
  for (const std::string& line : lines) {
    (void)parser.Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids));
    parsed_dense.push_back(dense);
    parsed_ids.push_back(ids);
    labels.push_back(label);
  }
  for (auto _ : state) {
    for (size_t i = 0; i < lines.size(); ++i) builder.Add(labels[i], parsed_dense[i], parsed_ids[i]);
    benchmark::DoNotOptimize(builder.Finish());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_BuildBatch)->Arg(1024);

void BM_LrForwardBackward(benchmark::State& state) {
  const Batch batch = MakeBatch(static_cast<int>(state.range(0)));
  std::unique_ptr<Model> model = *Model::Create(ModelOptions{});
  ParamBuffers params(model->params().size());
  for (size_t i = 0; i < params.size(); ++i) params[i].assign(model->BufferSize(i, batch), 0.01f);
  std::vector<float> predictions;
  ParamBuffers grads;
  for (auto _ : state) {
    benchmark::DoNotOptimize(model->ForwardBackward(batch, params, &predictions, &grads));
  }
  state.SetItemsProcessed(state.iterations() * batch.size());
}
BENCHMARK(BM_LrForwardBackward)->Arg(1024);

}  // namespace
}  // namespace eps

BENCHMARK_MAIN();
