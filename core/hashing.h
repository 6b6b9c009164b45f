// Feature ids and key mixing.
//
// A feature id is the 64-bit hash of (field, raw value): rows are keyed by
// the exact id, never by id modulo a table size, so two features collide
// only if their 64-bit hashes do (probability ~n^2 / 2^65).
//
// Thread-safety: pure functions, safe for concurrent use.

#ifndef EPS_CORE_HASHING_H_
#define EPS_CORE_HASHING_H_

#include <cstdint>
#include "absl/strings/string_view.h"

namespace eps {

// The feature id of `raw_value` in categorical field `field` (0-based).
// Stable across processes, runs and releases: changing it invalidates
// every trained model.
uint64_t FeatureId(uint32_t field, absl::string_view raw_value);

// A bijective 64-bit mixer (the splitmix64 finaliser): spreads keys whose
// low bits are regular.
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A deterministic pseudo-random 64-bit value for (a, b, c), used to derive
// initial weights and synthetic data from a seed.
constexpr uint64_t Hash3(uint64_t a, uint64_t b, uint64_t c) {
  return Mix64(Mix64(Mix64(a + 0x9e3779b97f4a7c15ULL) ^ b) ^ c);
}

// Maps a 64-bit hash to a double uniform in [0, 1).
constexpr double ToUnitInterval(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace eps

#endif  // EPS_CORE_HASHING_H_
