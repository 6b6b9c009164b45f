#include "ps/table.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/placement.h"
#include "core/hashing.h"
#include "gtest/gtest.h"
#include "cluster/initializer.h"
#include "ps/admission.h"
#include "ps/optimizer.h"

namespace eps {
namespace {

proto::TableSpec MakeSpec(uint32_t dim, proto::OptimizerSpec::Kind optimizer,
                          proto::InitializerSpec::Kind initializer, float lr = 0.1f) {
  proto::TableSpec spec;
  spec.set_id(5);
  spec.set_name("emb");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(dim);
  spec.mutable_initializer()->set_kind(initializer);
  spec.mutable_initializer()->set_scale(0.1f);
  spec.mutable_optimizer()->set_kind(optimizer);
  spec.mutable_optimizer()->set_learning_rate(lr);
  spec.mutable_optimizer()->set_initial_accumulator(0.1f);
  spec.mutable_optimizer()->set_epsilon(1e-8f);
  spec.mutable_optimizer()->set_l2(0.01f);
  return spec;
}

std::unique_ptr<Table> MustCreate(const proto::TableSpec& spec, uint64_t seed = 42) {
  auto table = Table::Create(spec, seed);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

std::vector<float> PullAll(Table& table, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * table.dim(), -999.0f);
  EXPECT_TRUE(table.Pull(keys, out).ok());
  return out;
}

std::vector<float> InitialRow(const proto::TableSpec& spec, uint64_t seed, uint64_t key) {
  std::vector<float> row(spec.dim());
  InitializeRow(spec.initializer(), seed, spec.id(), key, row.data(), spec.dim());
  return row;
}

// The exact row a table should hold: the initial weights and state, then
// the given gradients applied in order by an independently created
// optimizer.
std::vector<float> ReferenceRow(const proto::TableSpec& spec, uint64_t seed, uint64_t key,
                                const std::vector<std::vector<float>>& grads) {
  auto optimizer = Optimizer::Create(spec.optimizer());
  EXPECT_TRUE(optimizer.ok());
  const int dim = spec.dim();
  std::vector<float> weights = InitialRow(spec, seed, key);
  std::vector<float> state((*optimizer)->state_floats(dim));
  (*optimizer)->InitState(state.data(), dim);
  for (const auto& g : grads) (*optimizer)->Apply(weights.data(), state.data(), g.data(), dim);
  return weights;
}

void ExpectInvalid(const proto::TableSpec& spec, const std::string& needle) {
  auto table = Table::Create(spec, 1);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(table.status().message());
  EXPECT_NE(message.find("emb"), std::string::npos) << message;
  EXPECT_NE(message.find(needle), std::string::npos) << message;
}

TEST(Table, CreateRejectsBadSpecs) {
  const auto good = MakeSpec(4, proto::OptimizerSpec::SGD, proto::InitializerSpec::NORMAL);
  proto::TableSpec spec = good;
  spec.set_dim(0);
  ExpectInvalid(spec, "dim");
  spec = good;
  spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::KIND_UNSPECIFIED);
  ExpectInvalid(spec, "optimizer.kind");
  spec = good;
  spec.mutable_optimizer()->set_learning_rate(0);
  ExpectInvalid(spec, "learning_rate");
  spec = good;
  spec.mutable_initializer()->set_kind(proto::InitializerSpec::KIND_UNSPECIFIED);
  ExpectInvalid(spec, "initializer.kind");
  spec = good;
  spec.mutable_initializer()->set_scale(-1);
  ExpectInvalid(spec, "initializer.scale");
}

TEST(Table, KeepsSpec) {
  const auto spec = MakeSpec(7, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::UNIFORM);
  auto table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->spec().DebugString(), spec.DebugString());
  EXPECT_EQ(table->dim(), 7u);
  EXPECT_EQ(table->num_rows(), 0u);
}

TEST(Table, PullCreatesRowsDeterministically) {
  const auto spec = MakeSpec(8, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::NORMAL);
  auto a = MustCreate(spec, /*seed=*/42);
  auto b = MustCreate(spec, /*seed=*/42);
  auto other_seed = MustCreate(spec, /*seed=*/43);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(other_seed, nullptr);
  const std::vector<uint64_t> keys = {0, 1, 17, ~uint64_t{0}, 0x123456789abcdefULL};
  // b creates the rows in the opposite order.
  const std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  const std::vector<float> from_a = PullAll(*a, keys);
  PullAll(*b, reversed);
  EXPECT_EQ(from_a, PullAll(*b, keys));
  EXPECT_NE(from_a, PullAll(*other_seed, keys));
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> expected = InitialRow(spec, 42, keys[i]);
    EXPECT_EQ(std::vector<float>(from_a.begin() + i * 8, from_a.begin() + (i + 1) * 8), expected)
        << "key " << keys[i];
  }
  // Pulling again neither changes nor adds rows.
  EXPECT_EQ(from_a, PullAll(*a, keys));
  EXPECT_EQ(a->num_rows(), keys.size());
}

TEST(Table, PullOfDuplicateKeysCreatesOneRow) {
  auto table = MustCreate(MakeSpec(3, proto::OptimizerSpec::SGD, proto::InitializerSpec::UNIFORM));
  ASSERT_NE(table, nullptr);
  const std::vector<float> out = PullAll(*table, {9, 9, 4, 9});
  EXPECT_EQ(table->num_rows(), 2u);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(out[e], out[3 + e]);
    EXPECT_EQ(out[e], out[9 + e]);
  }
}

TEST(Table, EmptyRequestsDoNothing) {
  auto table = MustCreate(MakeSpec(3, proto::OptimizerSpec::SGD, proto::InitializerSpec::UNIFORM));
  ASSERT_NE(table, nullptr);
  EXPECT_TRUE(table->Pull({}, {}).ok());
  EXPECT_TRUE(table->Push({}, {}).ok());
  EXPECT_EQ(table->num_rows(), 0u);
  EXPECT_EQ(table->memory_bytes(), 0u);
}

TEST(Table, PushAppliesOptimizer) {
  for (auto kind : {proto::OptimizerSpec::SGD, proto::OptimizerSpec::ADAGRAD}) {
    const auto spec = MakeSpec(4, kind, proto::InitializerSpec::NORMAL);
    auto table = MustCreate(spec);
    ASSERT_NE(table, nullptr);
    const std::vector<uint64_t> keys = {11, 22};
    PullAll(*table, keys);
    const std::vector<float> g1 = {0.5f, -1.0f, 0.25f, 0.0f, 1.0f, 2.0f, -3.0f, 0.125f};
    const std::vector<float> g2 = {-0.5f, 0.75f, 1.5f, 2.0f, 0.0f, 0.5f, 1.0f, -1.0f};
    EXPECT_TRUE(table->Push(keys, g1).ok());
    EXPECT_TRUE(table->Push(keys, g2).ok());
    const std::vector<float> out = PullAll(*table, keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::vector<float> a(g1.begin() + 4 * i, g1.begin() + 4 * (i + 1));
      const std::vector<float> b(g2.begin() + 4 * i, g2.begin() + 4 * (i + 1));
      EXPECT_EQ(std::vector<float>(out.begin() + 4 * i, out.begin() + 4 * (i + 1)),
                ReferenceRow(spec, 42, keys[i], {a, b}))
          << "optimizer " << kind << " key " << keys[i];
    }
  }
}

TEST(Table, RefusedRowKeepsItsWeightsAndStateAndIsCounted) {
  const auto spec = MakeSpec(2, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::NORMAL);
  auto table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  const std::vector<uint64_t> keys = {5, 6};
  EXPECT_TRUE(table->Push(keys, std::vector<float>{0.5f, -0.5f, 1.0f, 1.0f}).ok());
  const std::vector<float> before = PullAll(*table, {5});
  // 3e38^2 would make key 5's accumulator inf; key 6's update is sane.
  EXPECT_TRUE(table->Push(keys, std::vector<float>{3e38f, 0.25f, 0.5f, 0.5f}).ok());
  EXPECT_EQ(table->stats().updates_refused, 1u);
  EXPECT_EQ(PullAll(*table, {5}), before);
  EXPECT_EQ(PullAll(*table, {6}), ReferenceRow(spec, 42, 6, {{1.0f, 1.0f}, {0.5f, 0.5f}}));
  // Its accumulator kept its value too: the next step is the one it would
  // have been without the refused gradient.
  EXPECT_TRUE(table->Push(std::vector<uint64_t>{5}, std::vector<float>{0.25f, 0.25f}).ok());
  EXPECT_EQ(PullAll(*table, {5}), ReferenceRow(spec, 42, 5, {{0.5f, -0.5f}, {0.25f, 0.25f}}));
  // A key pushed twice in one request counts each refused update.
  EXPECT_TRUE(
      table->Push(std::vector<uint64_t>{5, 5}, std::vector<float>{3e38f, 0, 0, -3e38f}).ok());
  EXPECT_EQ(table->stats().updates_refused, 3u);
  for (float value : PullAll(*table, keys)) EXPECT_TRUE(std::isfinite(value));
}

TEST(Table, PushCreatesMissingRows) {
  const auto spec = MakeSpec(2, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::UNIFORM);
  auto table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  const std::vector<float> g = {0.5f, -0.5f};
  EXPECT_TRUE(table->Push(std::vector<uint64_t>{77}, g).ok());
  EXPECT_EQ(table->num_rows(), 1u);
  EXPECT_EQ(PullAll(*table, {77}), ReferenceRow(spec, 42, 77, {g}));
}

TEST(Table, DuplicateKeysInPushAreAppliedInOrder) {
  // Adagrad is not commutative over steps, so order matters as well.
  const auto spec = MakeSpec(2, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::NORMAL);
  auto table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  const std::vector<uint64_t> keys = {5, 6, 5, 5};
  const std::vector<float> g = {1.0f, 0.0f, 2.0f, 2.0f, -0.5f, 0.25f, 3.0f, -1.0f};
  EXPECT_TRUE(table->Push(keys, g).ok());
  EXPECT_EQ(table->num_rows(), 2u);
  EXPECT_EQ(PullAll(*table, {5}),
            ReferenceRow(spec, 42, 5, {{1.0f, 0.0f}, {-0.5f, 0.25f}, {3.0f, -1.0f}}));
  EXPECT_EQ(PullAll(*table, {6}), ReferenceRow(spec, 42, 6, {{2.0f, 2.0f}}));
}

TEST(Table, ManyKeysGrowIndexAndArena) {
  // 300k rows: ~4.7k per stripe, past the doubling blocks (16..2048 rows,
  // 4080 in all) into the fixed 4096-row ones, with many index growths.
  constexpr uint64_t kNumKeys = 300000;
  constexpr int kDim = 4;
  auto table = MustCreate(
      MakeSpec(kDim, proto::OptimizerSpec::SGD, proto::InitializerSpec::ZEROS, /*lr=*/1.0f));
  ASSERT_NE(table, nullptr);
  // Keys with regular bit patterns: sequential ids and dense chunk keys.
  auto key_of = [](uint64_t i) { return i % 2 == 0 ? i / 2 : DenseChunkKey(3, i / 2); };
  constexpr size_t kBatch = 1000;
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (uint64_t start = 0; start < kNumKeys; start += kBatch) {
    keys.clear();
    grads.clear();
    for (uint64_t i = start; i < start + kBatch; ++i) {
      keys.push_back(key_of(i));
      for (int e = 0; e < kDim; ++e) grads.push_back(static_cast<float>(i % 1000 + e));
    }
    EXPECT_TRUE(table->Push(keys, grads).ok());
  }
  ASSERT_EQ(table->num_rows(), kNumKeys);

  // lr 1, l2 0.01 and zero init: w = -g exactly.
  for (uint64_t start = 0; start < kNumKeys; start += kBatch) {
    keys.clear();
    for (uint64_t i = start; i < start + kBatch; ++i) keys.push_back(key_of(i));
    const std::vector<float> out = PullAll(*table, keys);
    for (uint64_t i = start; i < start + kBatch; ++i) {
      for (int e = 0; e < kDim; ++e) {
        ASSERT_EQ(out[(i - start) * kDim + e], -static_cast<float>(i % 1000 + e)) << "key #" << i;
      }
    }
  }
  EXPECT_EQ(table->num_rows(), kNumKeys);

  // Arena plus index, each within a small factor of its payload.
  const uint64_t row_bytes = kNumKeys * kDim * sizeof(float);
  EXPECT_GE(table->memory_bytes(), row_bytes + kNumKeys * 16 * 10 / 7);
  EXPECT_LE(table->memory_bytes(), 2 * row_bytes + kNumKeys * 16 * 4);
}

TEST(Table, SmallTableStaysSmall) {
  auto table =
      MustCreate(MakeSpec(16, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::NORMAL));
  ASSERT_NE(table, nullptr);
  PullAll(*table, {1, 2, 3});
  EXPECT_GT(table->memory_bytes(), 3u * 32 * sizeof(float));
  EXPECT_LT(table->memory_bytes(), 16u * 1024);
}

TEST(Table, WideRowsStayApart) {
  // Rows of 2 * 70000 floats: arena blocks of a single row or two.
  constexpr int kDim = 70000;
  const auto spec = MakeSpec(kDim, proto::OptimizerSpec::ADAGRAD, proto::InitializerSpec::UNIFORM);
  auto table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 40; ++k) keys.push_back(k * 1000003);
  std::vector<float> g(kDim, 0.0f);
  g[kDim - 1] = 1.0f;
  EXPECT_TRUE(table->Push(std::vector<uint64_t>{keys[7]}, g).ok());
  const std::vector<float> out = PullAll(*table, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> row(out.begin() + i * kDim, out.begin() + (i + 1) * kDim);
    if (i == 7) {
      EXPECT_EQ(row, ReferenceRow(spec, 42, keys[i], {g}));
    } else {
      EXPECT_EQ(row, InitialRow(spec, 42, keys[i])) << "key " << keys[i];
    }
  }
}

TEST(Table, ConcurrentPushAndPull) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 50;
  constexpr uint64_t kOwnKeys = 2000;
  constexpr uint64_t kSharedKeys = 100;
  constexpr int kDim = 4;
  // lr 1, no l2, zero init, gradient 1: every push lowers a weight by
  // exactly 1, so final values are exact integers whatever the interleaving.
  auto spec = MakeSpec(kDim, proto::OptimizerSpec::SGD, proto::InitializerSpec::ZEROS, 1.0f);
  spec.mutable_optimizer()->set_l2(0);
  auto table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  auto own_key = [](int t, uint64_t i) { return (uint64_t{1} << 40) + t * kOwnKeys + i; };

  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint64_t> keys;
      for (uint64_t i = 0; i < kOwnKeys; ++i) keys.push_back(own_key(t, i));
      for (uint64_t i = 0; i < kSharedKeys; ++i) keys.push_back(i);
      const std::vector<float> ones(keys.size() * kDim, 1.0f);
      std::vector<float> out(keys.size() * kDim);
      for (int round = 0; round < kRounds; ++round) {
        EXPECT_TRUE(table->Pull(keys, out).ok());
        // Only this thread writes its own keys.
        for (size_t j = 0; j < kOwnKeys * kDim; ++j) {
          if (out[j] != -static_cast<float>(round)) mismatches.fetch_add(1);
        }
        EXPECT_TRUE(table->Push(keys, ones).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(table->num_rows(), kThreads * kOwnKeys + kSharedKeys);

  std::vector<uint64_t> shared;
  for (uint64_t i = 0; i < kSharedKeys; ++i) shared.push_back(i);
  for (float w : PullAll(*table, shared)) EXPECT_EQ(w, -static_cast<float>(kThreads * kRounds));
  for (int t = 0; t < kThreads; ++t) {
    std::vector<uint64_t> own;
    for (uint64_t i = 0; i < kOwnKeys; ++i) own.push_back(own_key(t, i));
    for (float w : PullAll(*table, own)) ASSERT_EQ(w, -static_cast<float>(kRounds));
  }
  EXPECT_EQ(table->num_rows(), kThreads * kOwnKeys + kSharedKeys);
}

// Admission (TableSpec.admission_min_count): no row until an id's
// min_count-th push, which makes it and applies its gradient; before that
// pulls read the initializer's values and pushes are dropped.
TEST(TableAdmission, AnIdGetsARowOnlyAtItsMinCountthPush) {
  proto::TableSpec spec = MakeSpec(4, proto::OptimizerSpec::SGD, proto::InitializerSpec::NORMAL);
  spec.set_admission_min_count(3);
  std::unique_ptr<Table> table = MustCreate(spec);
  ASSERT_NE(table, nullptr);
  const std::vector<uint64_t> keys = {11, 12};
  EXPECT_EQ(PullAll(*table, keys), [&] {
    std::vector<float> both = InitialRow(spec, 42, 11);
    const std::vector<float> second = InitialRow(spec, 42, 12);
    both.insert(both.end(), second.begin(), second.end());
    return both;
  }());
  EXPECT_EQ(table->num_rows(), 0u) << "a pull makes no row";
  const std::vector<float> grad = {1, 2, 3, 4};
  const std::vector<uint64_t> key = {11};
  for (int push = 1; push <= 2; ++push) {
    ASSERT_TRUE(table->Push(key, grad).ok());
    EXPECT_EQ(table->num_rows(), 0u) << "push " << push;
    EXPECT_EQ(PullAll(*table, {11}), InitialRow(spec, 42, 11)) << "dropped push " << push;
  }
  uint64_t created = 0;
  ASSERT_TRUE(table->Push(key, grad, 1.0f, &created, 0).ok());
  EXPECT_EQ(created, 1u);
  EXPECT_EQ(table->num_rows(), 1u);
  // Made by the initializer, then the admitting push's gradient applied.
  EXPECT_EQ(PullAll(*table, {11}), ReferenceRow(spec, 42, 11, {grad}));
  ASSERT_TRUE(table->Push(key, grad).ok());
  EXPECT_EQ(PullAll(*table, {11}), ReferenceRow(spec, 42, 11, {grad, grad}));
  const TableStats stats = table->stats();
  EXPECT_EQ(stats.rows_admitted, 1u);
  EXPECT_EQ(stats.updates_rejected, 2u);
  EXPECT_EQ(stats.admission_candidates, 0u) << "an admitted id is no longer counted";
}

TEST(TableAdmission, DenseTablesCannotUseIt) {
  proto::TableSpec spec = MakeSpec(4, proto::OptimizerSpec::SGD, proto::InitializerSpec::ZEROS);
  spec.set_kind(proto::DENSE);
  spec.set_dense_size(8);
  spec.set_admission_min_count(2);
  EXPECT_TRUE(absl::IsInvalidArgument(Table::Create(spec, 1).status()));
}

TEST(AdmissionFilter, CountsExactlyAndForgetsAFullShard) {
  AdmissionFilter filter(/*min_count=*/2, /*max_candidates=*/64 * 4);
  EXPECT_FALSE(filter.Sight(7));
  EXPECT_EQ(filter.candidates(), 1u);
  EXPECT_TRUE(filter.Sight(7));
  EXPECT_EQ(filter.candidates(), 0u);
  EXPECT_FALSE(filter.Sight(7)) << "counting starts again (the table made its row meanwhile)";
  // Far more candidates than fit: shards forget, none is admitted early.
  for (uint64_t key = 1000; key < 11000; ++key) EXPECT_FALSE(filter.Sight(key));
  EXPECT_LE(filter.candidates(), 64u * 5);
  EXPECT_GT(filter.forgotten(), 9000u);
}

}  // namespace
}  // namespace eps
