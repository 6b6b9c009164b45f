#include "datagen/planted_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/hashing.h"
#include "gtest/gtest.h"
#include "models/metrics.h"

namespace eps::datagen {
namespace {

PlantedModel MakeModel(uint64_t seed) {
  StatusOr<PlantedModel> model = PlantedModel::Create(seed, PlantedModelOptions());
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

bool IsLowerHex8(absl::string_view s) {
  if (s.size() != 8) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

TEST(PlantedModel, LinesHaveCriteoShape) {
  const PlantedModel model = MakeModel(/*seed=*/1);
  constexpr int kRows = 5000;
  std::vector<int> missing(kNumColumns, 0);
  std::vector<int> negative(kNumColumns, 0);
  Row row;
  for (int i = 0; i < kRows; ++i) {
    std::string line;
    model.GenerateRow(Split::kTrain, i, &row);
    model.AppendCriteoLine(row, &line);
    ASSERT_FALSE(line.empty());
    ASSERT_EQ(line.back(), '\n');
    line.pop_back();
    const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
    ASSERT_EQ(fields.size(), static_cast<size_t>(kNumColumns)) << line;
    ASSERT_TRUE(fields[0] == "0" || fields[0] == "1") << line;
    EXPECT_EQ(fields[0] == "1", row.label == 1);
    for (int c = 1; c <= kNumIntColumns; ++c) {
      if (fields[c].empty()) {
        ++missing[c];
        continue;
      }
      int64_t value;
      ASSERT_TRUE(absl::SimpleAtoi(fields[c], &value)) << "I" << c << " '" << fields[c] << "'";
      if (value < 0) {
        ++negative[c];
        ASSERT_GE(value, -3) << "I" << c;
      }
    }
    for (int c = 1 + kNumIntColumns; c < kNumColumns; ++c) {
      if (fields[c].empty()) {
        ++missing[c];
        continue;
      }
      ASSERT_TRUE(IsLowerHex8(fields[c])) << "C" << c - kNumIntColumns << " '" << fields[c] << "'";
    }
  }
  // Missing values occur, at Criteo-like rates: I1 ~40%, C22 ~45%, I2 never.
  EXPECT_NEAR(missing[1] / static_cast<double>(kRows), 0.40, 0.04);
  EXPECT_EQ(missing[2], 0);
  EXPECT_NEAR(missing[1 + kNumIntColumns + 21] / static_cast<double>(kRows), 0.45, 0.04);
  EXPECT_EQ(missing[1 + kNumIntColumns + 0], 0);  // C1 is always present
  // Only I2 goes negative, about 5% of the time.
  for (int c = 1; c <= kNumIntColumns; ++c) {
    if (c == 2) {
      EXPECT_NEAR(negative[c] / static_cast<double>(kRows), 0.05, 0.015);
    } else {
      EXPECT_EQ(negative[c], 0) << "I" << c;
    }
  }
}

TEST(PlantedModel, RowsArePureFunctionsOfSeedSplitAndIndex) {
  const PlantedModel a = MakeModel(/*seed=*/7);
  const PlantedModel b = MakeModel(/*seed=*/7);
  const PlantedModel other = MakeModel(/*seed=*/8);
  int differing_seed = 0;
  int differing_split = 0;
  for (uint64_t i : {0ULL, 1ULL, 2ULL, 999ULL, 123456789ULL}) {
    std::string line_a, line_b, line_other, line_eval;
    Row row;
    a.GenerateRow(Split::kTrain, i, &row);
    a.AppendCriteoLine(row, &line_a);
    const double probability = row.probability;
    b.GenerateRow(Split::kTrain, i, &row);
    b.AppendCriteoLine(row, &line_b);
    EXPECT_EQ(line_a, line_b);
    EXPECT_EQ(probability, row.probability);
    other.GenerateRow(Split::kTrain, i, &row);
    other.AppendCriteoLine(row, &line_other);
    differing_seed += line_a != line_other;
    a.GenerateRow(Split::kEval, i, &row);
    a.AppendCriteoLine(row, &line_eval);
    differing_split += line_a != line_eval;
  }
  EXPECT_EQ(differing_seed, 5);
  EXPECT_EQ(differing_split, 5);
  EXPECT_EQ(a.bias(), b.bias());
  EXPECT_NE(a.bias(), other.bias());
}

TEST(PlantedModel, ProbabilityIsSigmoidOfLogit) {
  const PlantedModel model = MakeModel(/*seed=*/3);
  Row row;
  for (int i = 0; i < 100; ++i) {
    model.GenerateRow(Split::kEval, i, &row);
    EXPECT_DOUBLE_EQ(row.probability, 1 / (1 + std::exp(-model.Logit(row))));
    EXPECT_GT(row.probability, 0);
    EXPECT_LT(row.probability, 1);
  }
}

// Drift turns the per-id weights from day to day: day 0 is the model
// without drift, the features of a row stay, and its logit moves more the
// further the day.
TEST(PlantedModel, DriftChangesTheWeightsDayByDay) {
  PlantedModelOptions options;
  options.drift = 0.3;
  StatusOr<PlantedModel> drifting = PlantedModel::Create(3, options);
  ASSERT_TRUE(drifting.ok()) << drifting.status();
  const PlantedModel still = MakeModel(/*seed=*/3);
  double moved_1 = 0;
  double moved_3 = 0;
  Row row;
  Row base;
  for (int i = 0; i < 2000; ++i) {
    still.GenerateRow(Split::kTrain, i, &base);
    drifting->GenerateRow(Split::kTrain, i, &row, /*day=*/0);
    ASSERT_EQ(row.probability, base.probability) << "day 0 is the model without drift";
    ASSERT_EQ(row.ranks, base.ranks);
    const double logit_0 = drifting->Logit(row);
    row.day = 1;
    moved_1 += std::abs(drifting->Logit(row) - logit_0);
    row.day = 3;
    moved_3 += std::abs(drifting->Logit(row) - logit_0);
  }
  EXPECT_GT(moved_1, 0.1 * 2000);
  EXPECT_GT(moved_3, 2 * moved_1);
  options.drift = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(options.Validate()));
}

TEST(PlantedModel, CalibratesThePositiveRate) {
  for (uint64_t seed : {1ULL, 2ULL}) {
    const PlantedModel model = MakeModel(seed);
    constexpr int kRows = 20000;
    double mean_probability = 0;
    int positives = 0;
    Row row;
    for (int i = 0; i < kRows; ++i) {
      model.GenerateRow(Split::kTrain, i, &row);
      mean_probability += row.probability;
      positives += row.label;
    }
    EXPECT_NEAR(mean_probability / kRows, 0.25, 0.01) << "seed " << seed;
    EXPECT_NEAR(positives / static_cast<double>(kRows), 0.25, 0.015) << "seed " << seed;
  }
}

TEST(PlantedModel, EachHexIdIsOneRank) {
  // Rank -> hex is a bijection per field: the same id never stands for two
  // ranks (which would make the planted probability unlearnable).
  const PlantedModel model = MakeModel(/*seed=*/5);
  std::vector<std::map<uint32_t, uint64_t>> rank_of(kNumCatColumns);
  Row row;
  for (int i = 0; i < 20000; ++i) {
    model.GenerateRow(Split::kTrain, i, &row);
    for (int f = 0; f < kNumCatColumns; ++f) {
      if (row.ranks[f] == 0) continue;
      const auto [it, inserted] = rank_of[f].emplace(row.cats[f], row.ranks[f]);
      ASSERT_EQ(it->second, row.ranks[f]) << "C" << f + 1;
    }
  }
  EXPECT_EQ(rank_of[8].size(), 3u);  // C9 has 3 values, all seen
}

// The planted model is tuned so that logistic regression on per-id weights
// and log1p of the integers learns a good part of it, but not all: the
// interactions, the nonlinear term and rare ids stay out of its reach.
TEST(PlantedModel, LogisticRegressionLearnsMuchButNotAll) {
  const PlantedModel model = MakeModel(/*seed=*/1);
  struct Weight {
    double w = 0;
    double g2 = 0;  // Adagrad's sum of squared gradients
  };
  std::unordered_map<uint64_t, Weight> ids;
  std::array<Weight, kNumIntColumns + 1> dense;  // the last is the bias
  const auto dense_value = [](const Row& row, int j) {
    if (j == kNumIntColumns) return 1.0;
    return row.int_present[j] ? std::log1p(static_cast<double>(std::max<int64_t>(row.ints[j], 0)))
                              : 0.0;
  };
  const auto id_key = [](const Row& row, int f) { return Hash3(f, row.cats[f], 0); };
  const auto predict = [&](const Row& row) {
    double z = 0;
    for (int f = 0; f < kNumCatColumns; ++f) {
      if (row.ranks[f] == 0) continue;
      const auto it = ids.find(id_key(row, f));
      if (it != ids.end()) z += it->second.w;
    }
    for (int j = 0; j <= kNumIntColumns; ++j) z += dense[j].w * dense_value(row, j);
    return 1 / (1 + std::exp(-z));
  };
  const auto update = [](Weight& weight, double gradient) {
    constexpr double kLearningRate = 0.05;
    weight.g2 += gradient * gradient;
    weight.w -= kLearningRate * gradient / std::sqrt(weight.g2 + 1e-8);
  };
  Row row;
  for (int i = 0; i < 100000; ++i) {  // one pass of SGD
    model.GenerateRow(Split::kTrain, i, &row);
    const double gradient = predict(row) - row.label;
    for (int f = 0; f < kNumCatColumns; ++f) {
      if (row.ranks[f] != 0) update(ids[id_key(row, f)], gradient);
    }
    for (int j = 0; j <= kNumIntColumns; ++j) update(dense[j], gradient * dense_value(row, j));
  }
  std::vector<float> lr, optimal, labels;
  for (int i = 0; i < 20000; ++i) {
    model.GenerateRow(Split::kEval, i, &row);
    lr.push_back(static_cast<float>(predict(row)));
    optimal.push_back(static_cast<float>(row.probability));
    labels.push_back(static_cast<float>(row.label));
  }
  const double lr_auc = ComputeAuc(lr, labels);
  const double optimal_auc = ComputeAuc(optimal, labels);
  EXPECT_GT(optimal_auc, 0.78);
  EXPECT_LT(optimal_auc, 0.86);
  EXPECT_GT(lr_auc, 0.70);
  EXPECT_LT(lr_auc, optimal_auc - 0.03);
}

TEST(PlantedModel, DescribeNamesTheParameters) {
  const nlohmann::json d = MakeModel(/*seed=*/1).Describe();
  EXPECT_EQ(d["categorical"].size(), static_cast<size_t>(kNumCatColumns));
  EXPECT_EQ(d["integer"].size(), static_cast<size_t>(kNumIntColumns));
  EXPECT_EQ(d["categorical"][2]["cardinality"], 10131227);
  EXPECT_GE(d["interactions"]["pairs"].size(), 6u);
  EXPECT_TRUE(d.contains("bias"));
}

TEST(PlantedModelOptions, RejectsNonsense) {
  EXPECT_TRUE(PlantedModelOptions().Validate().ok());
  PlantedModelOptions options;
  options.id_variance = -1;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = PlantedModelOptions();
  options.interaction_variance = NAN;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = PlantedModelOptions();
  options.positive_rate = 1;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = PlantedModelOptions();
  options.calibration_rows = 10;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlantedModel::Create(1, options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps::datagen
