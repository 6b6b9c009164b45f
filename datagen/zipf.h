// ZipfSampler: draws ranks in [1, n] with P(k) proportional to k^-s, in
// O(1) time and memory for any n (no CDF table).
//
// It is the rejection-inversion method of Hoermann and Derflinger ("Rejection-
// inversion to generate variates from monotone discrete distributions",
// 1996): invert the integral of the continuous hat function x^-s, round to
// the nearest integer and accept with a cheap test; the acceptance rate is
// above 0.9 for every n and s, so a draw costs about one log and one exp.
//
// The sampler holds no random state: Sample() takes a callable returning
// uniforms in [0, 1), so counter-based (hashed) uniforms make each draw a
// pure function of its key.
//
// Thread-safety: immutable after construction; const methods are safe for
// concurrent use.

#ifndef EPS_DATAGEN_ZIPF_H_
#define EPS_DATAGEN_ZIPF_H_

#include <cmath>
#include <cstdint>

namespace eps::datagen {

class ZipfSampler {
 public:
  // REQUIRES: n >= 1 and exponent > 0 (CHECK-fails otherwise: the callers'
  // parameters are constants, so a bad one is a bug).
  ZipfSampler(uint64_t n, double exponent);

  uint64_t n() const { return n_; }
  double exponent() const { return exponent_; }

  // Returns a rank in [1, n]. `uniform()` must return doubles in [0, 1); it
  // is called once per attempt (almost always once, rarely more).
  template <typename UniformFn>
  uint64_t Sample(UniformFn&& uniform) const {
    while (true) {
      // u is uniform in (h_integral_n_, h_integral_x1_].
      const double u = h_integral_n_ + uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double k = std::floor(x + 0.5);
      if (k < 1) {
        k = 1;
      } else if (k > static_cast<double>(n_)) {
        k = static_cast<double>(n_);
      }
      if (k - x <= s_ || u >= HIntegral(k + 0.5) - H(k)) {
        return static_cast<uint64_t>(k);
      }
    }
  }

  // The probability of rank k (1 <= k <= n) under the target distribution,
  // k^-s / sum_{j<=n} j^-s. The normaliser is summed exactly over the first
  // ranks and by Euler-Maclaurin beyond (relative error below 1e-12).
  double Probability(uint64_t k) const;

 private:
  double H(double x) const { return std::exp(-exponent_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - exponent_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - exponent_);
    if (t < -1.0) t = -1.0;  // rounding guard: the exact value is > -1
    return std::exp(Helper1(t) * x);
  }
  // log1p(x) / x, continuous at 0.
  static double Helper1(double x) {
    if (std::fabs(x) > 1e-8) return std::log1p(x) / x;
    return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  // expm1(x) / x, continuous at 0.
  static double Helper2(double x) {
    if (std::fabs(x) > 1e-8) return std::expm1(x) / x;
    return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }

  uint64_t n_;
  double exponent_;
  double h_integral_x1_;
  double h_integral_n_;
  double s_;
  double normalizer_;  // sum_{k=1..n} k^-exponent
};

}  // namespace eps::datagen

#endif  // EPS_DATAGEN_ZIPF_H_
