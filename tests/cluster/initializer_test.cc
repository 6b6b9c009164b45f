#include "cluster/initializer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

proto::InitializerSpec Spec(proto::InitializerSpec::Kind kind, float scale) {
  proto::InitializerSpec spec;
  spec.set_kind(kind);
  spec.set_scale(scale);
  return spec;
}

std::vector<float> Row(const proto::InitializerSpec& spec, uint64_t seed, uint32_t table,
                       uint64_t key, int dim) {
  std::vector<float> row(dim, -123.0f);
  InitializeRow(spec, seed, table, key, row.data(), dim);
  return row;
}

struct Moments {
  double mean;
  double stddev;
  float min;
  float max;
};

// Moments of element 0..dim-1 of rows 0..num_keys-1.
Moments Sample(const proto::InitializerSpec& spec, int num_keys, int dim) {
  double sum = 0;
  double sum_sq = 0;
  float lo = INFINITY;
  float hi = -INFINITY;
  std::vector<float> row(dim);
  for (int k = 0; k < num_keys; ++k) {
    InitializeRow(spec, /*seed=*/7, /*table_id=*/1, /*key=*/k, row.data(), dim);
    for (float x : row) {
      sum += x;
      sum_sq += double{x} * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  const double n = double{1} * num_keys * dim;
  const double mean = sum / n;
  return Moments{mean, std::sqrt(sum_sq / n - mean * mean), lo, hi};
}

TEST(Initializer, ZerosWritesZeros) {
  for (float x : Row(Spec(proto::InitializerSpec::ZEROS, 1.0f), 1, 2, 3, 16)) EXPECT_EQ(x, 0.0f);
}

TEST(Initializer, IsDeterministic) {
  for (auto kind : {proto::InitializerSpec::NORMAL, proto::InitializerSpec::UNIFORM}) {
    const auto spec = Spec(kind, 0.5f);
    for (uint64_t key : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
      EXPECT_EQ(Row(spec, 42, 3, key, 8), Row(spec, 42, 3, key, 8)) << kind;
    }
    // A longer row starts with the shorter one: element i depends on i only.
    std::vector<float> short_row = Row(spec, 42, 3, 99, 4);
    std::vector<float> long_row = Row(spec, 42, 3, 99, 16);
    EXPECT_EQ(short_row, std::vector<float>(long_row.begin(), long_row.begin() + 4));
  }
}

TEST(Initializer, DiffersByKeyTableSeedAndElement) {
  for (auto kind : {proto::InitializerSpec::NORMAL, proto::InitializerSpec::UNIFORM}) {
    const auto spec = Spec(kind, 1.0f);
    const std::vector<float> base = Row(spec, 42, 3, 1000, 8);
    EXPECT_NE(base, Row(spec, 42, 3, 1001, 8)) << "key";
    EXPECT_NE(base, Row(spec, 42, 4, 1000, 8)) << "table";
    EXPECT_NE(base, Row(spec, 43, 3, 1000, 8)) << "seed";
    int distinct = 0;
    for (int i = 1; i < 8; ++i) distinct += base[i] != base[0];
    EXPECT_EQ(distinct, 7) << "elements";
  }
}

TEST(Initializer, UniformStaysInRange) {
  const float scale = 0.25f;
  const Moments m = Sample(Spec(proto::InitializerSpec::UNIFORM, scale), 20000, 8);
  EXPECT_GE(m.min, -scale);
  EXPECT_LE(m.max, scale);
  // Covers the range, centred, std scale/sqrt(3).
  EXPECT_LT(m.min, -0.99f * scale);
  EXPECT_GT(m.max, 0.99f * scale);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * scale);
  EXPECT_NEAR(m.stddev, scale / std::sqrt(3.0), 0.01 * scale);
}

TEST(Initializer, NormalIsTruncatedAtTwoScale) {
  const float scale = 0.5f;
  const Moments m = Sample(Spec(proto::InitializerSpec::NORMAL, scale), 50000, 4);
  EXPECT_GE(m.min, -2 * scale);
  EXPECT_LE(m.max, 2 * scale);
  // The tails are reached, not clipped away...
  EXPECT_LT(m.min, -1.9f * scale);
  EXPECT_GT(m.max, 1.9f * scale);
  // ...and the moments are those of N(0, 1) truncated to [-2, 2]:
  // variance 1 - 4 phi(2) / (2 Phi(2) - 1) = 0.7737, std 0.8796.
  EXPECT_NEAR(m.mean, 0.0, 0.01 * scale);
  EXPECT_NEAR(m.stddev, 0.8796 * scale, 0.01 * scale);
}

TEST(Initializer, ScaleZeroGivesZeros) {
  for (auto kind : {proto::InitializerSpec::NORMAL, proto::InitializerSpec::UNIFORM}) {
    for (float x : Row(Spec(kind, 0.0f), 1, 2, 3, 8)) EXPECT_EQ(x, 0.0f) << kind;
  }
}

}  // namespace
}  // namespace eps
