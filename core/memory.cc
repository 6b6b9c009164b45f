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

bool LimitMallocArenas(int arenas) {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return false;
  return ::mallopt(M_ARENA_MAX, arenas) == 1;
#else
  (void)arenas;
  return false;
#endif
}

bool FixMmapThreshold(size_t bytes) {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return false;
  if (const char* tunables = std::getenv("GLIBC_TUNABLES");
      tunables != nullptr && std::strstr(tunables, "mmap_threshold") != nullptr) {
    return false;
  }
  return ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)) == 1;
#else
  (void)bytes;
  return false;
#endif
}

}  // namespace eps
