#include "core/hashing.h"

#include "xxhash.h"

namespace eps {

uint64_t FeatureId(uint32_t field, absl::string_view raw_value) {
  // The field is the seed, so equal strings in different fields differ.
  constexpr uint64_t kFieldSeedBase = 0x6570735f66656174ULL;  // "eps_feat"
  return XXH3_64bits_withSeed(raw_value.data(), raw_value.size(), kFieldSeedBase + field);
}

}  // namespace eps
