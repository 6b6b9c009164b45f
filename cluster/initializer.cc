#include "cluster/initializer.h"

#include <cmath>
#include <cstdint>
#include <numbers>

#include "core/hashing.h"
#include "core/logging.h"

namespace eps {
namespace {

// Truncation bound of NORMAL, in standard deviations.
constexpr double kNormalBound = 2.0;

// A draw beyond the bound happens with probability ~0.046, so 64 rejections
// in a row (~1e-86) never happen; the cap only keeps the loop finite.
constexpr uint64_t kMaxNormalAttempts = 64;

// A standard normal truncated to [-kNormalBound, kNormalBound], drawn by
// Box-Muller from hashes of (row_hash, element, attempt): attempt k uses the
// counters 2k and 2k+1, so a rejected draw is replaced by the next pair.
double TruncatedStandardNormal(uint64_t row_hash, uint64_t element) {
  for (uint64_t attempt = 0; attempt < kMaxNormalAttempts; ++attempt) {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    const double u1 = 1.0 - ToUnitInterval(Hash3(row_hash, element, 2 * attempt));
    const double u2 = ToUnitInterval(Hash3(row_hash, element, 2 * attempt + 1));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    if (std::abs(z) <= kNormalBound) return z;
  }
  return 0.0;
}

}  // namespace

void InitializeRow(const proto::InitializerSpec& spec, uint64_t seed, uint32_t table_id,
                   uint64_t key, float* out, int dim) {
  // Every element's draws derive from this hash and the element index only.
  const uint64_t row_hash = Hash3(seed, table_id, key);
  const double scale = spec.scale();
  switch (spec.kind()) {
    case proto::InitializerSpec::ZEROS:
      for (int i = 0; i < dim; ++i) out[i] = 0.0f;
      return;
    case proto::InitializerSpec::NORMAL:
      for (int i = 0; i < dim; ++i) {
        out[i] = static_cast<float>(scale * TruncatedStandardNormal(row_hash, i));
      }
      return;
    case proto::InitializerSpec::UNIFORM:
      for (int i = 0; i < dim; ++i) {
        const double u = ToUnitInterval(Hash3(row_hash, i, 0));
        out[i] = static_cast<float>(scale * (2.0 * u - 1.0));
      }
      return;
    default:
      // Table::Create rejects unknown kinds, so reaching this is a bug.
      LOG(FATAL) << "InitializeRow: unknown initializer kind " << static_cast<int>(spec.kind());
  }
}

}  // namespace eps
