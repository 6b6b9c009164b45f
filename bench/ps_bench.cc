// Parameter-server storage: pull and push throughput of one table on one
// core, in memory and with a table ten times the memory budget (RocksDB
// cold tier) under Zipf(1.1) access; and resident bytes per row.
//
//   build/bench/ps_bench [--benchmark_filter=...]
//
// Counters: rows_per_s (items), bytes_per_s (weights moved), hit_rate,
// bytes_per_row and raw_bytes_per_row (key + weights + optimizer state).
// BM_PushReceipt: what proving a push costs (a receipt made and checked).
// BM_JournalReplay: a server's restart, replaying a journal of 1M row images
// into RocksDB (and, as counters, the rate its flushes appended them at).

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/hashing.h"
#include "core/logging.h"
#include "datagen/zipf.h"
#include "absl/time/clock.h"
#include "ps/journal.h"
#include "ps/kv_store.h"
#include "ps/optimizer.h"
#include "ps/storage.h"
#include "ps/table.h"
#include "rpc/security.h"

namespace eps {
namespace {

constexpr int kKeysPerRequest = 4096;
constexpr int kRequests = 1024;       // 4M keys
constexpr int kWarmupRequests = 128;

proto::TableSpec Spec(int dim) {
  proto::TableSpec spec;
  spec.set_id(0);
  spec.set_name("bench");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(static_cast<uint32_t>(dim));
  spec.mutable_initializer()->set_kind(proto::InitializerSpec::UNIFORM);
  spec.mutable_initializer()->set_scale(0.01f);
  spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.05f);
  spec.mutable_optimizer()->set_epsilon(1e-8f);
  return spec;
}

uint64_t RawBytesPerRow(int dim) { return 8 + 4 * (dim + dim); }  // key, weights, Adagrad state

// A table of `rows` rows (all pushed once), in memory or over a budget of
// a tenth of its raw size.
struct Fixture {
  Fixture(int dim, uint64_t rows, bool tiered) : dim(dim), rows(rows) {
    StorageOptions options;
    if (tiered) {
      dir = std::filesystem::temp_directory_path() /
            ("eps-ps-bench-" + std::to_string(::getpid()) + "-" + std::to_string(dim));
      std::filesystem::remove_all(dir);
      options.data_dir = dir.string();
      options.memory_budget_mb =
          std::max<int64_t>(1, static_cast<int64_t>(rows * RawBytesPerRow(dim) / 10) >> 20);
    }
    storage = *ServerStorage::Open(options);
    proto::JobSpec job;
    job.set_seed(1);
    *job.add_tables() = Spec(dim);
    CHECK_OK(storage->CreateTables(job));
    table = storage->table(0);
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    for (uint64_t start = 0; start < rows; start += kKeysPerRequest) {
      keys.clear();
      for (uint64_t k = start; k < std::min(rows, start + kKeysPerRequest); ++k) {
        keys.push_back(Mix64(k));
      }
      grads.assign(keys.size() * dim, 0.001f);
      CHECK_OK(table->Push(keys, grads));
    }
    CHECK_OK(storage->Flush());
    // Requests of Zipf(1.1)-distributed keys, drawn once: a stream long
    // enough that its distinct keys far exceed the hot tier (a short one,
    // cycled, would fit in memory and overstate the hit rate).
    datagen::ZipfSampler zipf(rows, 1.1);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> uniform(0, 1);
    requests.resize(kRequests);
    for (auto& request : requests) {
      for (int i = 0; i < kKeysPerRequest; ++i) {
        request.push_back(Mix64(zipf.Sample([&] { return uniform(rng); }) - 1));
      }
    }
    // Warm the hot tier with the first requests; timing starts after them.
    std::vector<float> out(size_t{kKeysPerRequest} * dim);
    for (int r = 0; r < kWarmupRequests; ++r) CHECK_OK(table->Pull(requests[r], out));
  }

  // The next request of the stream (cycling after the warm-up ones).
  const std::vector<uint64_t>& Next() {
    const auto& request = requests[next];
    next = next + 1 == requests.size() ? kWarmupRequests : next + 1;
    return request;
  }
  ~Fixture() {
    storage.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  int dim;
  uint64_t rows;
  std::filesystem::path dir;
  std::unique_ptr<ServerStorage> storage;
  Table* table = nullptr;
  std::vector<std::vector<uint64_t>> requests;
  size_t next = kWarmupRequests;
};

// Rows per table: enough that the in-memory table is far beyond the CPU
// caches; the tiered one is 10x its budget.
uint64_t RowsFor(int dim) { return dim <= 16 ? 1000000 : 250000; }

void Report(benchmark::State& state, const Fixture& fixture, const TableStats& before) {
  const TableStats after = fixture.table->stats();
  const double lookups = static_cast<double>(after.hits + after.misses - before.hits - before.misses);
  state.SetItemsProcessed(state.iterations() * kKeysPerRequest);
  state.SetBytesProcessed(state.iterations() * kKeysPerRequest * fixture.dim * sizeof(float));
  state.counters["hit_rate"] =
      lookups > 0 ? static_cast<double>(after.hits - before.hits) / lookups : 1.0;
  state.counters["rows_in_memory"] = static_cast<double>(after.rows_in_memory);
}

void BM_Pull(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const bool tiered = state.range(1) != 0;
  Fixture fixture(dim, RowsFor(dim), tiered);
  std::vector<float> out(kKeysPerRequest * dim);
  const TableStats before = fixture.table->stats();
  for (auto _ : state) {
    CHECK_OK(fixture.table->Pull(fixture.Next(), out));
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, fixture, before);
}

void BM_Push(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const bool tiered = state.range(1) != 0;
  Fixture fixture(dim, RowsFor(dim), tiered);
  std::vector<float> grads(kKeysPerRequest * dim, 0.001f);
  const TableStats before = fixture.table->stats();
  for (auto _ : state) {
    CHECK_OK(fixture.table->Push(fixture.Next(), grads));
  }
  Report(state, fixture, before);
}

// Proven work's cost per push: the server's receipt and the master's check
// of it (master/trust/work_proof.h), against BM_Push's time for a request of
// kKeysPerRequest keys in the same run.
void BM_PushReceipt(benchmark::State& state) {
  const WorkerCredentials key = WorkerCredentials::FromKey(std::string(32, 'k')).value();
  proto::WorkBatch batch;
  batch.set_shard_id(12);
  batch.set_epoch(1);
  batch.set_begin_offset(1 << 20);
  batch.set_end_offset(1 << 21);
  batch.set_records(512);
  for (auto _ : state) {
    batch.set_begin_offset(batch.begin_offset() + 1);
    const std::string receipt = key.Receipt(7, batch);
    CHECK(key.VerifyReceipt(7, batch, receipt));
  }
  state.SetItemsProcessed(state.iterations());
}

// Resident bytes per row of a full in-memory table against the raw size.
void BM_MemoryPerRow(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  for (auto _ : state) {
    Fixture fixture(dim, RowsFor(dim), /*tiered=*/false);
    const TableStats stats = fixture.table->stats();
    state.counters["bytes_per_row"] =
        static_cast<double>(stats.memory_bytes) / static_cast<double>(stats.rows_in_memory);
    state.counters["raw_bytes_per_row"] = static_cast<double>(RawBytesPerRow(dim));
    state.counters["ratio"] = state.counters["bytes_per_row"] / state.counters["raw_bytes_per_row"];
  }
}

// One optimizer update of a row of `dim` weights (a dense tensor's chunk
// is a row of job.dense_chunk_floats = 16,384): what a push of an MLP costs
// the server per chunk, before any table work.
void BM_OptimizerApply(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(1));
  proto::OptimizerSpec spec;
  spec.set_kind(static_cast<proto::OptimizerSpec::Kind>(state.range(0)));
  spec.set_learning_rate(0.001f);
  spec.set_epsilon(1e-8f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_ftrl_beta(1.0f);
  std::unique_ptr<Optimizer> optimizer = *Optimizer::Create(spec);
  std::vector<float> weights(dim, 0.01f);
  std::vector<float> row_state(optimizer->state_floats(dim));
  optimizer->InitState(row_state.data(), dim);
  std::vector<float> grads(dim);
  for (int i = 0; i < dim; ++i) grads[i] = 0.001f * static_cast<float>(i % 7 - 3);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        optimizer->Apply(weights.data(), row_state.data(), grads.data(), dim));
  }
  state.SetItemsProcessed(state.iterations() * dim);
  state.SetLabel(proto::OptimizerSpec::Kind_Name(spec.kind()));
}

// A restart after a kill: the journal of 1M row images (dim weights and
// their Adagrad state, appended in flush-sized batches of 64k rows) replayed
// into a fresh RocksDB store. Timed: the replay; counter append_rows_per_s:
// the appends.
void BM_JournalReplay(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  constexpr uint64_t kRows = 1000000;
  constexpr uint64_t kBatch = 65536;
  const std::string value(sizeof(float) * 2 * dim, 'x');
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("eps-journal-bench-" + std::to_string(::getpid()));
  const auto store_options = [&] {
    RocksKvStoreOptions options;
    options.dir = (dir / "db").string();
    return options;
  };
  double append_s = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::filesystem::remove_all(dir);
    {
      std::unique_ptr<KvStore> store = *OpenRocksKvStore(store_options());
      std::unique_ptr<Journal> journal = *Journal::Open((dir / "journal").string(), store.get(), 1);
      std::vector<KvWrite> writes;
      const absl::Time start = absl::Now();
      for (uint64_t first = 0; first < kRows; first += kBatch) {
        writes.clear();
        for (uint64_t k = first; k < std::min(kRows, first + kBatch); ++k) {
          writes.push_back(KvWrite{0, Mix64(k), value, false});
        }
        CHECK_OK(journal->Append(writes));
      }
      append_s += absl::ToDoubleSeconds(absl::Now() - start);
    }
    std::unique_ptr<KvStore> store = *OpenRocksKvStore(store_options());
    state.ResumeTiming();
    CHECK_OK(Journal::Apply((dir / "journal").string(), store.get()));
  }
  std::filesystem::remove_all(dir);
  state.SetItemsProcessed(state.iterations() * kRows);
  state.SetBytesProcessed(state.iterations() * kRows * (value.size() + 20));
  state.counters["append_rows_per_s"] = static_cast<double>(state.iterations() * kRows) / append_s;
}

// Wall-clock rates: a tiered request also waits for the store's reads.
BENCHMARK(BM_Pull)->ArgNames({"dim", "tiered"})->ArgsProduct({{16, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Push)->ArgNames({"dim", "tiered"})->ArgsProduct({{16, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_PushReceipt)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_OptimizerApply)->ArgNames({"kind", "dim"})
    ->ArgsProduct({{proto::OptimizerSpec::SGD, proto::OptimizerSpec::ADAGRAD,
                    proto::OptimizerSpec::ADAM, proto::OptimizerSpec::FTRL},
                   {16, 16384}})
    ->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_JournalReplay)->ArgNames({"dim"})->Arg(16)->Arg(64)->Iterations(2)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MemoryPerRow)->ArgNames({"dim"})->Arg(16)->Arg(64)->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace eps

BENCHMARK_MAIN();
