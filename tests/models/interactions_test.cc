#include "models/interactions.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/models/gradient_check.h"

namespace eps {
namespace {

std::vector<float> Random(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}

TEST(Fm, MatchesPairwiseDotProducts) {
  // One example, 3 fields of dim 2, after one leading column (offset 1).
  const std::vector<float> in = {9, 1, 2, 3, -1, 0.5f, 4};
  float out = 0;
  FmForward(in.data(), 1, /*stride=*/7, /*offset=*/1, /*num_fields=*/3, /*dim=*/2, &out);
  // v1.v2 + v1.v3 + v2.v3 = (3 - 2) + (0.5 + 8) + (1.5 - 4) = 7.
  EXPECT_FLOAT_EQ(out, 7.0f);
}

TEST(Fm, GradientsMatchFiniteDifferences) {
  const int n = 3, stride = 11, offset = 2, fields = 3, dim = 3;
  std::vector<float> in = Random(static_cast<size_t>(n) * stride, 1);
  const std::vector<float> r = Random(n, 2);
  auto f = [&] {
    std::vector<float> out(n);
    FmForward(in.data(), n, stride, offset, fields, dim, out.data());
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(r[i]) * out[i];
    return sum;
  };
  std::vector<float> din(in.size(), 0.0f);
  FmBackward(in.data(), n, stride, offset, fields, dim, r.data(), din.data());
  ExpectMatchesCentralDifferences(f, &in, din, "fm input", {.max_elements = 1000});
}

TEST(Dot, OrdersTheLowerTriangleRowByRow) {
  // z = (1, 0), fields v1 = (0, 1), v2 = (2, 3); dim 2.
  const std::vector<float> z = {1, 0};
  const std::vector<float> in = {0, 1, 2, 3};
  std::vector<float> out(1 + DotInteractionCount(2), -1.0f);
  ASSERT_EQ(DotInteractionCount(2), 3);
  DotForward(z.data(), in.data(), 1, /*stride=*/4, /*offset=*/0, /*num_fields=*/2, /*dim=*/2,
             out.data(), /*out_stride=*/4, /*out_offset=*/1);
  // (v1.z, v2.z, v2.v1) = (0, 2, 3); out[0] untouched.
  EXPECT_EQ(out, (std::vector<float>{-1, 0, 2, 3}));
}

TEST(Dot, GradientsMatchFiniteDifferences) {
  const int n = 2, fields = 4, dim = 3, stride = fields * dim + 1, offset = 1;
  const int pairs = DotInteractionCount(fields), out_stride = pairs + 2, out_offset = 2;
  std::vector<float> z = Random(static_cast<size_t>(n) * dim, 3);
  std::vector<float> in = Random(static_cast<size_t>(n) * stride, 4);
  const std::vector<float> r = Random(static_cast<size_t>(n) * out_stride, 5);
  auto f = [&] {
    std::vector<float> out(static_cast<size_t>(n) * out_stride, 0.0f);
    DotForward(z.data(), in.data(), n, stride, offset, fields, dim, out.data(), out_stride,
               out_offset);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      for (int p = 0; p < pairs; ++p) {
        const size_t at = static_cast<size_t>(i) * out_stride + out_offset + p;
        sum += static_cast<double>(r[at]) * out[at];
      }
    }
    return sum;
  };
  std::vector<float> dz(z.size(), 0.0f);
  std::vector<float> din(in.size(), 0.0f);
  DotBackward(z.data(), in.data(), n, stride, offset, fields, dim, r.data(), out_stride, out_offset,
              dz.data(), din.data());
  ExpectMatchesCentralDifferences(f, &z, dz, "z", {.max_elements = 1000});
  ExpectMatchesCentralDifferences(f, &in, din, "fields", {.max_elements = 1000});
}

}  // namespace
}  // namespace eps
