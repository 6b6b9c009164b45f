#include "datagen/zipf.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/logging.h"

namespace eps::datagen {
namespace {

// Ranks up to this are summed exactly in the normaliser; the Euler-Maclaurin
// tail beyond has error ~ s^3 * kExactTerms^-(s+3), far below double noise.
constexpr uint64_t kExactTerms = 1000;

// sum_{k=1..n} k^-s.
double ZipfNormalizer(uint64_t n, double s) {
  const uint64_t exact = std::min(n, kExactTerms);
  double sum = 0;
  // Smallest terms first, for accuracy.
  for (uint64_t k = exact; k >= 1; --k) sum += std::pow(static_cast<double>(k), -s);
  if (n <= exact) return sum;
  const double a = static_cast<double>(exact + 1);
  const double b = static_cast<double>(n);
  const auto f = [s](double x) { return std::pow(x, -s); };
  const auto df = [s](double x) { return -s * std::pow(x, -s - 1); };
  const double integral = std::fabs(1.0 - s) < 1e-12
                              ? std::log(b / a)
                              : (std::pow(b, 1.0 - s) - std::pow(a, 1.0 - s)) / (1.0 - s);
  return sum + integral + (f(a) + f(b)) / 2 + (df(b) - df(a)) / 12;
}

}  // namespace

ZipfSampler::ZipfSampler(uint64_t n, double exponent) : n_(n), exponent_(exponent) {
  CHECK(n >= 1) << "Zipf over an empty range";
  CHECK(exponent > 0) << "Zipf exponent " << exponent;
  h_integral_x1_ = HIntegral(1.5) - 1.0;
  h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
  s_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  normalizer_ = ZipfNormalizer(n, exponent);
}

double ZipfSampler::Probability(uint64_t k) const {
  if (k < 1 || k > n_) return 0.0;
  return std::pow(static_cast<double>(k), -exponent_) / normalizer_;
}

}  // namespace eps::datagen
