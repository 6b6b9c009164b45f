// What the tests of ps/storage.h share: a job of two tables, a storage
// opened with them, and pushes and pulls of every weight of many keys.
//
// Updates are SGD with learning rate 0.5 on zero-initialised rows and
// gradients that are powers of two, so every expected weight is exact.

#ifndef EPS_TESTS_PS_STORAGE_TESTING_H_
#define EPS_TESTS_PS_STORAGE_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ps/storage.h"
#include "tests/testing/temp_dir.h"

namespace eps {

// Two tables: 0 "emb" (dim 4), 1 "wide" (dim 16).
inline proto::JobSpec TwoTables() {
  proto::JobSpec job;
  job.set_name("storage-test");
  job.set_seed(3);
  for (uint32_t id : {0u, 1u}) {
    proto::TableSpec& spec = *job.add_tables();
    spec.set_id(id);
    spec.set_name(id == 0 ? "emb" : "wide");
    spec.set_kind(proto::EMBEDDING);
    spec.set_dim(id == 0 ? 4 : 16);
    spec.mutable_initializer()->set_kind(proto::InitializerSpec::ZEROS);
    spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_learning_rate(0.5f);
  }
  return job;
}

inline std::unique_ptr<ServerStorage> MustOpen(const StorageOptions& options,
                                               const proto::JobSpec& job = TwoTables()) {
  StatusOr<std::unique_ptr<ServerStorage>> storage = ServerStorage::Open(options);
  EXPECT_TRUE(storage.ok()) << storage.status();
  if (!storage.ok()) return nullptr;
  Status created = (*storage)->CreateTables(job);
  EXPECT_TRUE(created.ok()) << created;
  return created.ok() ? *std::move(storage) : nullptr;
}

// Options of a storage in `data_dir` with a hot tier of 1 MiB, which a few
// tens of thousands of rows overflow.
inline StorageOptions OverBudget(const std::string& data_dir) {
  StorageOptions options;
  options.data_dir = data_dir;
  options.memory_budget_mb = 1;
  return options;
}

// A storage of `options` whose table 1 ("wide") deletes rows untrained for
// a pass, as server 4.
inline std::unique_ptr<ServerStorage> OpenExpiring(const StorageOptions& options) {
  proto::JobSpec job = TwoTables();
  job.mutable_tables(1)->set_ttl_passes(1);
  std::unique_ptr<ServerStorage> storage = MustOpen(options, job);
  if (storage != nullptr) {
    EXPECT_TRUE(storage->SetServerId(4).ok());
  }
  return storage;
}

// A storage in `dir` that flushes every 10 ms.
inline std::unique_ptr<ServerStorage> OpenFlushingOften(const std::string& dir) {
  StorageOptions options;
  options.data_dir = dir;
  options.flush_interval = absl::Milliseconds(10);
  return MustOpen(options);
}

inline std::vector<uint64_t> Keys(uint64_t first, size_t n) {
  std::vector<uint64_t> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(first + i * 7919);
  return keys;
}

// Pushes gradient `g` to every weight of `keys` in `table`: each weight
// moves by -g / 2.
inline void PushAll(ServerStorage& storage, uint32_t table, const std::vector<uint64_t>& keys, float g) {
  Table* t = storage.table(table);
  ASSERT_NE(t, nullptr);
  const std::vector<float> grads(keys.size() * t->dim(), g);
  for (size_t pos = 0; pos < keys.size(); pos += 1000) {
    const size_t n = std::min<size_t>(1000, keys.size() - pos);
    Status pushed =
        t->Push(std::span(keys).subspan(pos, n), std::span(grads).subspan(0, n * t->dim()));
    ASSERT_TRUE(pushed.ok()) << pushed;
  }
}

// Expects every weight of `keys` in `table` to be `want`.
inline void ExpectAll(ServerStorage& storage, uint32_t table, const std::vector<uint64_t>& keys,
               float want, const std::string& context) {
  Table* t = storage.table(table);
  ASSERT_NE(t, nullptr);
  std::vector<float> out(keys.size() * t->dim(), -1e9f);
  Status pulled = t->Pull(keys, out);
  ASSERT_TRUE(pulled.ok()) << pulled;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], want) << context << ": table " << table << " key " << keys[i / t->dim()];
  }
}

}  // namespace eps

#endif  // EPS_TESTS_PS_STORAGE_TESTING_H_
