// PlantedModel: the ground-truth click model behind eps-datagen's data.
//
// Every row is a pure function of (seed, split, row index): each random draw
// is a counter-based hash (eps::Hash3) of the seed, the row and the column,
// and every model parameter (per-id weight, latent vector, dense weight) is a
// hash of the seed and its coordinates, so nothing is stored per id and rows
// can be generated in any order, by any number of threads, with identical
// results.
//
// A row has Criteo's shape: a label, 13 integer columns (heavy-tailed
// counts; I2 occasionally -1..-3) and 26 categorical columns (Zipf-ranked
// ids with Criteo's per-field cardinalities, written as 8 hex digits), with
// Criteo-like per-column missing rates. Its click probability is
//
//   p = sigmoid(bias + id + dense + interaction + nonlinear), where
//   id          = id_scale * sum_f sigma_f * z(f, rank_f)       z ~ N(0, 1)
//   dense       = dense_scale * sum_j a_j * t_j                 a_j ~ N(0, 1)
//   interaction = interaction_scale * sum_(f,g) <v(f, r_f), v(g, r_g)>
//                                                 over 8 field pairs, v ~ N(0, I_4)
//   nonlinear   = -nonlinear_scale * (t_I6 - 3)^2               (a bump)
//   t_j = log1p(max(x_j, 0)); a missing field contributes 0 to every term.
//
// The four scales are set at construction so that each term has its target
// variance over the data (PlantedModelOptions), measured on a calibration
// sample, and the bias so that the mean of p is the target positive rate.
// p depends only on what a row shows, so p is the Bayes-optimal prediction
// and its AUC on the eval rows is the best any model can reach.
//
// Thread-safety: immutable after construction; const methods are safe for
// concurrent use.

#ifndef EPS_DATAGEN_PLANTED_MODEL_H_
#define EPS_DATAGEN_PLANTED_MODEL_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "datagen/zipf.h"
#include "nlohmann/json.hpp"

namespace eps::datagen {

inline constexpr int kNumIntColumns = 13;
inline constexpr int kNumCatColumns = 26;
// Label + integer + categorical columns.
inline constexpr int kNumColumns = 1 + kNumIntColumns + kNumCatColumns;

// Which independent row sequence a row belongs to. Training and eval rows
// with the same index differ. Values are hashed into every draw: never
// renumber.
enum class Split : uint32_t {
  kTrain = 0,
  kEval = 1,
  kCalibration = 2,  // internal: fixes the scales and the bias
};

// The shape of the planted model. The defaults give an optimal eval AUC of
// about 0.80 with a 25% positive rate; truth.json's "generator" section
// records the effective parameters.
struct PlantedModelOptions {
  // Target variance (over rows) of the per-id weight term of the logit.
  // Default 1.5: the dominant, logistic-regression-learnable signal.
  double id_variance = 1.5;
  // Target variance of the linear term in log1p of the integer columns.
  // Default 0.3.
  double dense_variance = 0.3;
  // Target variance of the pairwise field-interaction term (learnable only by
  // models with crosses: FM, DeepFM, DLRM). Default 0.45.
  double interaction_variance = 0.45;
  // Target variance of the nonlinear (quadratic bump) term in I6. Default 0.1.
  double nonlinear_variance = 0.1;
  // Target mean click probability. Default 0.25 (Criteo's is about 0.256).
  double positive_rate = 0.25;
  // Rows drawn (from their own split) to fix the scales and the bias.
  // Default 20000.
  int calibration_rows = 20000;
  // Drift, in radians per day, in [0, pi/2]: on day d an id's weight is
  // cos(d * drift) z0(f, id) + sin(d * drift) z1(f, id) (still N(0, 1)), so
  // days d and d + k share cos(k * drift) of their id signal. Day 0 is the
  // model without drift. eps-datagen makes training file i day i and the
  // eval rows the day after the last file. Default 0.
  double drift = 0;

  // kInvalidArgument naming the field when a variance is negative or not
  // finite, positive_rate is outside (0, 1) or calibration_rows < 100.
  Status Validate() const;
};

// One generated row.
struct Row {
  int label = 0;           // 0 or 1
  double probability = 0;  // true P(label = 1 | features)
  std::array<bool, kNumIntColumns> int_present{};
  std::array<int64_t, kNumIntColumns> ints{};    // valid where int_present
  std::array<uint64_t, kNumCatColumns> ranks{};  // Zipf rank >= 1; 0 = missing
  std::array<uint32_t, kNumCatColumns> cats{};   // the hex id; valid where rank > 0
  int day = 0;  // which day's weights (PlantedModelOptions.drift)
};

class PlantedModel {
 public:
  // Builds the model of `seed`, calibrating its scales and bias (about 20k
  // rows of work). kInvalidArgument when `options` does not validate.
  static StatusOr<PlantedModel> Create(uint64_t seed, const PlantedModelOptions& options);

  // Fills *row with row `index` of `split`. Pure: the same arguments give the
  // same row on every call, thread and run.
  void GenerateRow(Split split, uint64_t index, Row* row, int day = 0) const;

  // Appends `row` as one Criteo line (40 tab-separated fields and '\n').
  void AppendCriteoLine(const Row& row, std::string* out) const;

  // The logit of a row's features (what GenerateRow's probability is the
  // sigmoid of).
  double Logit(const Row& row) const;

  // The model's parameters and calibration, for truth.json.
  nlohmann::json Describe() const;

  uint64_t seed() const { return seed_; }
  double bias() const { return bias_; }

 private:
  // The logit's terms, unscaled and without the bias.
  struct Terms {
    double id = 0;
    double dense = 0;
    double interaction = 0;
    double nonlinear = 0;
  };

  PlantedModel(uint64_t seed, const PlantedModelOptions& options);
  // Draws the features of a row (no label, no probability).
  void DrawFeatures(Split split, uint64_t index, Row* row) const;
  Terms ComputeTerms(const Row& row) const;
  double Combine(const Terms& terms) const;
  // Sets the scales and the bias from a calibration sample.
  void Calibrate();

  uint64_t seed_;
  PlantedModelOptions options_;
  uint64_t weight_key_;                              // keys the per-id weights
  uint64_t drift_key_;                               // keys the weights they drift to
  uint64_t latent_key_;                              // keys the latent vectors
  std::array<uint64_t, kNumCatColumns> hex_keys_{};  // keys rank -> hex maps
  std::vector<ZipfSampler> samplers_;                // one per categorical field
  std::array<double, kNumIntColumns> dense_weights_{};
  double id_scale_ = 1;
  double dense_scale_ = 1;
  double interaction_scale_ = 1;
  double nonlinear_scale_ = 1;
  double bias_ = 0;
};

}  // namespace eps::datagen

#endif  // EPS_DATAGEN_PLANTED_MODEL_H_
