#include "datagen/planted_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/hashing.h"

namespace eps::datagen {
namespace {

// clang-format off
// Criteo's (Kaggle display-advertising) per-field cardinalities.
constexpr std::array<uint64_t, kNumCatColumns> kCardinality = {
    1460,    583,     10131227, 2202608, 305,   24,      12517, 633,  3,    93145,  // C1-C10
    5683,    8351593, 3194,     27,      14992, 5461306, 10,    5652, 2173, 4,      // C11-C20
    7046547, 18,      15,       286181,  105,   142572};                          // C21-C26

// Relative per-id weight scale of each field: some fields matter more.
constexpr std::array<double, kNumCatColumns> kFieldSigma = {
    0.8, 1.0, 0.6, 0.6, 0.7, 0.5, 0.8, 0.4, 0.3, 0.7,  // C1-C10
    0.8, 0.5, 0.5, 0.6, 0.7, 0.5, 0.4, 0.6, 0.4, 0.3,  // C11-C20
    0.5, 0.3, 0.6, 0.6, 0.4, 0.5};                     // C21-C26

// Criteo-like missing rates (C19, C20, C22, C25 and C26 are the sparse
// ones; C22 is 76% missing in Criteo, capped here at 45%).
constexpr std::array<double, kNumCatColumns> kCatMissing = {
    0,     0,    0.034, 0.034, 0,    0,     0, 0,     0,    0,     // C1-C10
    0,     0.034, 0,    0,     0,    0.034, 0, 0,     0.44, 0.44,  // C11-C20
    0.034, 0.45, 0,     0.034, 0.44, 0.44};                        // C21-C26
// clang-format on

// Zipf exponent of field f: 1.05, 1.10, 1.15, 1.20, repeating.
constexpr std::array<double, 4> kZipfExponents = {1.05, 1.10, 1.15, 1.20};
double ZipfExponent(int f) { return kZipfExponents[f % kZipfExponents.size()]; }

// An integer column: missing with `missing`, else 0 with `zero`, else
// floor(exp(mu + sigma * N(0, 1))), a heavy-tailed count. I2 is also
// negative (-1, -2, -3) with `negative`.
struct IntColumn {
  double missing;
  double zero;
  double mu;
  double sigma;
  double negative;
};
constexpr std::array<IntColumn, kNumIntColumns> kIntColumns = {{
    {0.40, 0.30, 0.7, 1.2, 0},     // I1
    {0.00, 0.15, 1.6, 1.8, 0.05},  // I2
    {0.20, 0.05, 2.0, 1.3, 0},     // I3
    {0.20, 0.05, 1.5, 0.9, 0},     // I4
    {0.03, 0.02, 8.0, 1.8, 0},     // I5
    {0.20, 0.05, 3.5, 1.5, 0},     // I6
    {0.04, 0.10, 1.3, 1.4, 0},     // I7
    {0.005, 0.02, 2.0, 0.9, 0},    // I8
    {0.04, 0.02, 3.6, 1.2, 0},     // I9
    {0.40, 0.50, 0.0, 0.5, 0},     // I10
    {0.04, 0.20, 0.5, 0.9, 0},     // I11
    {0.40, 0.70, 0.3, 1.2, 0},     // I12
    {0.20, 0.05, 1.5, 1.0, 0},     // I13
}};
constexpr double kMaxCount = 1e9;

// Field pairs (0-based categorical fields) with a latent interaction, from
// low x low to high x high cardinality.
constexpr int kLatentDim = 4;
constexpr std::array<std::pair<int, int>, 8> kInteractions = {
    {{0, 1}, {1, 10}, {4, 8}, {5, 13}, {6, 14}, {16, 22}, {9, 23}, {12, 17}}};

// The nonlinear term: -(t_I6 - kBumpCenter)^2, t = log1p(I6).
constexpr int kBumpColumn = 5;  // I6
constexpr double kBumpCenter = 3.0;

// Column numbers hashed into the row draws: label 0, I1..I13 1..13,
// C1..C26 14..39. Never renumber: they define the data of a seed.
constexpr uint64_t kLabelColumn = 0;
constexpr uint64_t IntColumnId(int j) { return 1 + j; }
constexpr uint64_t CatColumnId(int f) { return 1 + kNumIntColumns + f; }

// Salts separating the model's parameter streams from each other and from
// the rows. Never change: they define the model of a seed.
constexpr uint64_t kParamSalt = 0x706c616e746564ULL;  // "planted"
constexpr uint64_t kWeightStream = 1;
constexpr uint64_t kLatentStream = 2;
constexpr uint64_t kHexStream = 3;
constexpr uint64_t kDenseStream = 4;

double Unit(uint64_t h) { return ToUnitInterval(h); }

// An N(0, 1) draw from a 64-bit hash: the inverse normal CDF of a uniform,
// by Acklam's rational approximation (relative error < 1.2e-9). 95% of
// draws take the central branch, which needs no log or sqrt: this is the
// generator's hottest function.
double Normal(uint64_t h) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  const double p = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
  if (p < kLow || p > 1 - kLow) {
    const double q = std::sqrt(-2 * std::log(p < kLow ? p : 1 - p));
    const double x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
                     ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    return p < kLow ? x : -x;
  }
  const double q = p - 0.5;
  const double r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

// A keyed bijection of 32-bit values: distinct ranks of a field get
// distinct hex ids (each step is invertible).
uint32_t Permute32(uint32_t x, uint64_t key) {
  x ^= static_cast<uint32_t>(key);
  x *= 0x9e3779b1U;
  x ^= x >> 16;
  x += static_cast<uint32_t>(key >> 32);
  x *= 0x85ebca6bU;
  x ^= x >> 13;
  x *= 0xc2b2ae35U;
  x ^= x >> 16;
  return x;
}

double DenseTransform(int64_t x) {
  return std::log1p(static_cast<double>(std::max<int64_t>(x, 0)));
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::string IntName(int j) { return absl::StrCat("I", j + 1); }
std::string CatName(int f) { return absl::StrCat("C", f + 1); }

Status CheckVariance(double v, absl::string_view name) {
  if (!std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("planted model ", name, " must be finite and >= 0 (got ", v, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

Status PlantedModelOptions::Validate() const {
  RETURN_IF_ERROR(CheckVariance(id_variance, "id_variance"));
  RETURN_IF_ERROR(CheckVariance(dense_variance, "dense_variance"));
  RETURN_IF_ERROR(CheckVariance(interaction_variance, "interaction_variance"));
  RETURN_IF_ERROR(CheckVariance(nonlinear_variance, "nonlinear_variance"));
  if (!(positive_rate > 0 && positive_rate < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("planted model positive_rate must be in (0, 1) (got ", positive_rate, ")"));
  }
  if (calibration_rows < 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("planted model calibration_rows must be >= 100 (got ", calibration_rows, ")"));
  }
  if (!(drift >= 0 && drift <= 1.5707963267948966)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--drift must be in [0, pi/2] radians per day (got ", drift, ")"));
  }
  return absl::OkStatus();
}

StatusOr<PlantedModel> PlantedModel::Create(uint64_t seed, const PlantedModelOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  PlantedModel model(seed, options);
  model.Calibrate();
  return model;
}

PlantedModel::PlantedModel(uint64_t seed, const PlantedModelOptions& options)
    : seed_(seed),
      options_(options),
      weight_key_(Hash3(seed, kParamSalt, kWeightStream)),
      drift_key_(Hash3(seed, kParamSalt, kWeightStream + 0x6472696674ULL)),
      latent_key_(Hash3(seed, kParamSalt, kLatentStream)) {
  samplers_.reserve(kNumCatColumns);
  for (int f = 0; f < kNumCatColumns; ++f) {
    samplers_.emplace_back(kCardinality[f], ZipfExponent(f));
    hex_keys_[f] = Hash3(Hash3(seed, kParamSalt, kHexStream), f, 0);
  }
  for (int j = 0; j < kNumIntColumns; ++j) {
    dense_weights_[j] = Normal(Hash3(Hash3(seed, kParamSalt, kDenseStream), j, 0));
  }
}

void PlantedModel::DrawFeatures(Split split, uint64_t index, Row* row) const {
  const uint64_t row_key = Hash3(seed_, static_cast<uint64_t>(split), index);
  for (int j = 0; j < kNumIntColumns; ++j) {
    const IntColumn& c = kIntColumns[j];
    const uint64_t column = IntColumnId(j);
    row->int_present[j] = Unit(Hash3(row_key, column, 0)) >= c.missing;
    if (!row->int_present[j]) {
      row->ints[j] = 0;
      continue;
    }
    const double u = Unit(Hash3(row_key, column, 1));
    if (u < c.negative) {
      // -1 most of the time, like Criteo's I2.
      const double v = u / c.negative;
      row->ints[j] = v < 0.75 ? -1 : (v < 0.93 ? -2 : -3);
    } else if (u < c.negative + c.zero) {
      row->ints[j] = 0;
    } else {
      const double z = Normal(Hash3(row_key, column, 2));
      row->ints[j] =
          static_cast<int64_t>(std::min(std::floor(std::exp(c.mu + c.sigma * z)), kMaxCount));
    }
  }
  for (int f = 0; f < kNumCatColumns; ++f) {
    const uint64_t column = CatColumnId(f);
    if (Unit(Hash3(row_key, column, 0)) < kCatMissing[f]) {
      row->ranks[f] = 0;
      row->cats[f] = 0;
      continue;
    }
    uint64_t attempt = 0;
    const uint64_t rank =
        samplers_[f].Sample([&] { return Unit(Hash3(row_key, column, ++attempt)); });
    row->ranks[f] = rank;
    row->cats[f] = Permute32(static_cast<uint32_t>(rank - 1), hex_keys_[f]);
  }
}

PlantedModel::Terms PlantedModel::ComputeTerms(const Row& row) const {
  Terms terms;
  const double angle = options_.drift * row.day;
  for (int f = 0; f < kNumCatColumns; ++f) {
    if (row.ranks[f] == 0) continue;
    double z = Normal(Hash3(weight_key_, f, row.ranks[f]));
    if (angle != 0) {
      z = std::cos(angle) * z + std::sin(angle) * Normal(Hash3(drift_key_, f, row.ranks[f]));
    }
    terms.id += kFieldSigma[f] * z;
  }
  for (int j = 0; j < kNumIntColumns; ++j) {
    if (row.int_present[j]) terms.dense += dense_weights_[j] * DenseTransform(row.ints[j]);
  }
  // Latent vectors of the fields in some pair, computed once per row.
  std::array<std::array<double, kLatentDim>, kNumCatColumns> latent;
  std::array<bool, kNumCatColumns> have_latent{};
  const auto latent_of = [&](int f) -> const std::array<double, kLatentDim>& {
    if (!have_latent[f]) {
      for (int k = 0; k < kLatentDim; ++k) {
        latent[f][k] = Normal(Hash3(latent_key_, f * kLatentDim + k, row.ranks[f]));
      }
      have_latent[f] = true;
    }
    return latent[f];
  };
  for (const auto& [f, g] : kInteractions) {
    if (row.ranks[f] == 0 || row.ranks[g] == 0) continue;
    const auto& vf = latent_of(f);
    const auto& vg = latent_of(g);
    for (int k = 0; k < kLatentDim; ++k) terms.interaction += vf[k] * vg[k];
  }
  if (row.int_present[kBumpColumn]) {
    const double d = DenseTransform(row.ints[kBumpColumn]) - kBumpCenter;
    terms.nonlinear = -d * d;
  }
  return terms;
}

double PlantedModel::Combine(const Terms& terms) const {
  return bias_ + id_scale_ * terms.id + dense_scale_ * terms.dense +
         interaction_scale_ * terms.interaction + nonlinear_scale_ * terms.nonlinear;
}

double PlantedModel::Logit(const Row& row) const { return Combine(ComputeTerms(row)); }

void PlantedModel::Calibrate() {
  const int n = options_.calibration_rows;
  std::vector<Terms> sample(n);
  Row row;
  for (int i = 0; i < n; ++i) {
    DrawFeatures(Split::kCalibration, i, &row);
    sample[i] = ComputeTerms(row);
  }
  const auto variance = [&](double Terms::*member) {
    double mean = 0;
    for (const Terms& t : sample) mean += t.*member;
    mean /= n;
    double var = 0;
    for (const Terms& t : sample) var += (t.*member - mean) * (t.*member - mean);
    return var / (n - 1);
  };
  const Terms unscaled_variance = {variance(&Terms::id), variance(&Terms::dense),
                                   variance(&Terms::interaction), variance(&Terms::nonlinear)};
  const auto scale = [](double target, double var) {
    return var > 0 ? std::sqrt(target / var) : 0.0;
  };
  id_scale_ = scale(options_.id_variance, unscaled_variance.id);
  dense_scale_ = scale(options_.dense_variance, unscaled_variance.dense);
  interaction_scale_ = scale(options_.interaction_variance, unscaled_variance.interaction);
  nonlinear_scale_ = scale(options_.nonlinear_variance, unscaled_variance.nonlinear);

  // The bias: mean sigmoid is increasing in it, so bisect.
  std::vector<double> logits(n);
  bias_ = 0;
  for (int i = 0; i < n; ++i) logits[i] = Combine(sample[i]);
  double lo = -40, hi = 40;
  for (int iter = 0; iter < 100 && hi - lo > 1e-12; ++iter) {
    const double mid = (lo + hi) / 2;
    double mean = 0;
    for (double l : logits) mean += Sigmoid(mid + l);
    mean /= n;
    (mean < options_.positive_rate ? lo : hi) = mid;
  }
  bias_ = (lo + hi) / 2;
}

void PlantedModel::GenerateRow(Split split, uint64_t index, Row* row, int day) const {
  DrawFeatures(split, index, row);
  row->day = day;
  row->probability = Sigmoid(Logit(*row));
  const uint64_t row_key = Hash3(seed_, static_cast<uint64_t>(split), index);
  row->label = Unit(Hash3(row_key, kLabelColumn, 0)) < row->probability ? 1 : 0;
}

void PlantedModel::AppendCriteoLine(const Row& row, std::string* out) const {
  static constexpr char kHex[] = "0123456789abcdef";
  // Longest line: label, 13 x (tab + 20 chars), 26 x (tab + 8), newline.
  char buffer[2 + kNumIntColumns * 21 + kNumCatColumns * 9 + 1];
  char* p = buffer;
  *p++ = row.label ? '1' : '0';
  for (int j = 0; j < kNumIntColumns; ++j) {
    *p++ = '\t';
    if (row.int_present[j]) p = std::to_chars(p, buffer + sizeof(buffer), row.ints[j]).ptr;
  }
  for (int f = 0; f < kNumCatColumns; ++f) {
    *p++ = '\t';
    if (row.ranks[f] == 0) continue;
    const uint32_t v = row.cats[f];
    for (int shift = 28; shift >= 0; shift -= 4) *p++ = kHex[(v >> shift) & 0xf];
  }
  *p++ = '\n';
  out->append(buffer, p);
}

nlohmann::json PlantedModel::Describe() const {
  nlohmann::json fields = nlohmann::json::array();
  for (int f = 0; f < kNumCatColumns; ++f) {
    fields.push_back({{"name", CatName(f)},
                      {"cardinality", kCardinality[f]},
                      {"zipf_exponent", ZipfExponent(f)},
                      {"missing_rate", kCatMissing[f]},
                      {"weight_sigma", id_scale_ * kFieldSigma[f]}});
  }
  nlohmann::json ints = nlohmann::json::array();
  for (int j = 0; j < kNumIntColumns; ++j) {
    const IntColumn& c = kIntColumns[j];
    ints.push_back({{"name", IntName(j)},
                    {"missing_rate", c.missing},
                    {"zero_rate", c.zero},
                    {"negative_rate", c.negative},
                    {"lognormal_mu", c.mu},
                    {"lognormal_sigma", c.sigma},
                    {"weight", dense_scale_ * dense_weights_[j]}});
  }
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& [f, g] : kInteractions) pairs.push_back({CatName(f), CatName(g)});
  return {
      {"model", "planted-criteo-v1"},
      {"logit",
       "bias + sum_f weight_sigma_f * z(f, id_f) + sum_j weight_j * log1p(max(I_j, 0)) + "
       "interaction_scale * sum_pairs <v(f, id_f), v(g, id_g)> - nonlinear_scale * "
       "(log1p(I6) - 3)^2; z, v ~ N(0, 1) per id; missing fields contribute 0"},
      {"bias", bias_},
      {"target_positive_rate", options_.positive_rate},
      {"target_variance",
       {{"id", options_.id_variance},
        {"dense", options_.dense_variance},
        {"interaction", options_.interaction_variance},
        {"nonlinear", options_.nonlinear_variance}}},
      {"calibration_rows", options_.calibration_rows},
      {"drift", options_.drift},
      {"categorical", fields},
      {"integer", ints},
      {"interactions", {{"dim", kLatentDim}, {"scale", interaction_scale_}, {"pairs", pairs}}},
      {"nonlinear",
       {{"column", IntName(kBumpColumn)}, {"center", kBumpCenter}, {"scale", nonlinear_scale_}}},
  };
}

}  // namespace eps::datagen
