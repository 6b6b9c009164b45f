#include "datagen/zipf.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/hashing.h"
#include "gtest/gtest.h"

namespace eps::datagen {
namespace {

// Draws `count` ranks with counter-based uniforms, as the generator does.
std::vector<uint64_t> Draw(const ZipfSampler& zipf, uint64_t key, int count) {
  std::vector<uint64_t> ranks(count);
  for (int i = 0; i < count; ++i) {
    uint64_t attempt = 0;
    ranks[i] = zipf.Sample([&] { return ToUnitInterval(Hash3(key, i, attempt++)); });
  }
  return ranks;
}

TEST(ZipfSampler, StaysInRange) {
  for (uint64_t n : {1ULL, 2ULL, 3ULL, 10ULL, 1000ULL, 10131227ULL, 1ULL << 40}) {
    for (double s : {0.5, 1.0, 1.05, 1.2, 2.5}) {
      const ZipfSampler zipf(n, s);
      for (uint64_t rank : Draw(zipf, n * 31 + static_cast<uint64_t>(s * 100), 20000)) {
        ASSERT_GE(rank, 1u) << "n=" << n << " s=" << s;
        ASSERT_LE(rank, n) << "n=" << n << " s=" << s;
      }
    }
  }
}

TEST(ZipfSampler, ZeroUniformGivesLastRank) {
  // u = 0 maps to the far end of the hat, x = n + 0.5: rounds to n + 1 and
  // must be clamped to n.
  const ZipfSampler zipf(/*n=*/583, /*exponent=*/1.1);
  EXPECT_EQ(zipf.Sample([] { return 0.0; }), 583u);
}

TEST(ZipfSampler, ProbabilitiesSumToOne) {
  for (uint64_t n : {1ULL, 3ULL, 1000ULL, 1001ULL, 50000ULL}) {
    for (double s : {1.0, 1.05, 1.2}) {
      const ZipfSampler zipf(n, s);
      double sum = 0;
      for (uint64_t k = n; k >= 1; --k) sum += zipf.Probability(k);
      EXPECT_NEAR(sum, 1.0, 1e-9) << "n=" << n << " s=" << s;
    }
  }
}

TEST(ZipfSampler, FrequenciesMatchTheory) {
  constexpr int kDraws = 200000;
  for (uint64_t n : {3ULL, 24ULL, 1460ULL, 93145ULL, 10131227ULL}) {
    for (double s : {1.05, 1.2}) {
      const ZipfSampler zipf(n, s);
      std::vector<int> counts(6, 0);
      int beyond = 0;  // ranks > 5
      for (uint64_t rank : Draw(zipf, n + static_cast<uint64_t>(s * 1000), kDraws)) {
        if (rank <= 5) {
          ++counts[rank];
        } else {
          ++beyond;
        }
      }
      double p_beyond = 1.0;
      for (uint64_t k = 1; k <= std::min<uint64_t>(n, 5); ++k) {
        const double p = zipf.Probability(k);
        p_beyond -= p;
        // Five standard deviations of a binomial frequency.
        const double tolerance = 5 * std::sqrt(p * (1 - p) / kDraws);
        EXPECT_NEAR(static_cast<double>(counts[k]) / kDraws, p, tolerance)
            << "rank " << k << " n=" << n << " s=" << s;
      }
      p_beyond = std::max(p_beyond, 0.0);  // rounding, for n <= 5
      const double tolerance = 5 * std::sqrt(p_beyond * (1 - p_beyond) / kDraws) + 1e-12;
      EXPECT_NEAR(static_cast<double>(beyond) / kDraws, p_beyond, tolerance)
          << "tail n=" << n << " s=" << s;
    }
  }
}

TEST(ZipfSampler, HeavyTailReachesDeepRanks) {
  const ZipfSampler zipf(/*n=*/10131227, /*exponent=*/1.05);
  uint64_t deepest = 0;
  for (uint64_t rank : Draw(zipf, 7, 100000)) deepest = std::max(deepest, rank);
  // P(rank > 1e6) is about 2.5% here.
  EXPECT_GT(deepest, 1000000u);
}

}  // namespace
}  // namespace eps::datagen
