#include "core/memory.h"

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace eps {

bool TrimFreeMemory(absl::Time now, absl::Duration every) {
  static std::atomic<int64_t> last_ns{INT64_MIN};
  const int64_t now_ns = absl::ToUnixNanos(now);
  int64_t last = last_ns.load(std::memory_order_relaxed);
  // A clock that went back does not hold the next trim off.
  if (last != INT64_MIN && now_ns >= last && now_ns - last < absl::ToInt64Nanoseconds(every)) {
    return false;
  }
  // One caller per interval trims.
  if (!last_ns.compare_exchange_strong(last, now_ns, std::memory_order_relaxed)) return false;
#if defined(__GLIBC__)
  ::malloc_trim(0);
  return true;
#else
  return false;
#endif
}

namespace {

#if defined(__GLIBC__)
constexpr int kArenaMax = M_ARENA_MAX;
constexpr int kMmapThreshold = M_MMAP_THRESHOLD;
constexpr int kTrimThreshold = M_TRIM_THRESHOLD;
#else
constexpr int kArenaMax = 0;
constexpr int kMmapThreshold = 0;
constexpr int kTrimThreshold = 0;
#endif

// Sets mallopt's `param` to `value` unless the user set it through the
// environment (`variable`, or `tunable` in GLIBC_TUNABLES).
bool SetUnlessUserSet(int param, size_t value, const char* variable, const char* tunable) {
#if defined(__GLIBC__)
  if (std::getenv(variable) != nullptr) return false;
  if (const char* tunables = std::getenv("GLIBC_TUNABLES");
      tunables != nullptr && std::strstr(tunables, tunable) != nullptr) {
    return false;
  }
  return ::mallopt(param, static_cast<int>(value)) == 1;
#else
  (void)param, (void)value, (void)variable, (void)tunable;
  return false;
#endif
}

}  // namespace

bool LimitMallocArenas(int arenas) {
  return SetUnlessUserSet(kArenaMax, static_cast<size_t>(arenas), "MALLOC_ARENA_MAX", "arena_max");
}

bool FixMmapThreshold(size_t bytes) {
  return SetUnlessUserSet(kMmapThreshold, bytes, "MALLOC_MMAP_THRESHOLD_", "mmap_threshold");
}

bool FixTrimThreshold(size_t bytes) {
  return SetUnlessUserSet(kTrimThreshold, bytes, "MALLOC_TRIM_THRESHOLD_", "trim_threshold");
}

void TuneForMessages() {
  FixMmapThreshold(size_t{8} << 20);
  FixTrimThreshold(size_t{4} << 20);
}

}  // namespace eps
