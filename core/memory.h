// Returning freed memory to the system.
//
// glibc's malloc keeps what a program frees in its arenas (one per thread
// that allocated concurrently) and gives back only the top of each heap.
// A long-running process whose threads come and go (RPC fan-outs, RocksDB's
// flushes and compactions, a server's restore) so holds more and more free
// pages: resident memory grows while the memory in use does not (measured
// in the 30-minute soak: the master's heap held 3 MiB in use and 5 MiB free
// after 10 minutes, its anonymous RSS rising 0.75 MiB a minute, new arenas
// appearing). TrimFreeMemory hands those free pages back (malloc_trim), at
// most once per interval; LimitMallocArenas caps the arenas, so that the
// free pages stay in fewer of them. With both the soak's master went from
// +14% to +2.6% over 30 minutes. FixMmapThreshold keeps large blocks out
// of the arenas for good: glibc otherwise raises its mmap threshold to the
// largest block freed so far (up to 32 MiB), after which RocksDB's memtable
// blocks and a restore's buffers come from the heaps, where what is freed
// around long-lived blocks stays resident (the soak's server: 41.5 MiB
// after warm-up with the dynamic threshold, 32.8 MiB with a fixed one).
//
// A server moves messages of up to 4 MiB (PsClient cuts every request, and
// so every reply, there) many times a second. Each served by its own mmap,
// every one of their pages faults in afresh and is zeroed: a wdl step at 1
// server and 1 worker spent about 15% of the server's CPU in page faults.
// TuneForMessages serves blocks under 8 MiB from the arenas and keeps up
// to 4 MiB free at the top of a heap, so message buffers are reused; the
// TrimFreeMemory after every heartbeat (MemberSession, at most every 30 s)
// hands back what the heaps hold free between long-lived blocks. Measured (bench/e2e.sh's wdl at (1, 1), 200,000 rows):
// 13.0-13.5k samples/s before, 15.6-15.8k after; a 5-minute soak kept the
// server within +1.5%. With 32 MiB kept at a heap's top the server drifted
// +21% in that soak; tuning the worker too (17k samples/s) drifted it +8%,
// so the worker keeps glibc's thresholds.
//
// Thread-safety: TrimFreeMemory is safe for concurrent use;
// LimitMallocArenas should run before the process's threads allocate.

#ifndef EPS_CORE_MEMORY_H_
#define EPS_CORE_MEMORY_H_

#include <cstddef>

#include "absl/time/time.h"

namespace eps {

// At most once per `every` (process-wide; calls in between return at once):
// gives the free pages of every malloc arena back to the system. True when
// it trimmed. It holds each arena's lock while it walks that arena's free
// chunks; measured here, a trim takes 4 ms for 16 MiB freed in small
// blocks, 12 ms for 64 MiB, and about a fifth of that when repeated with
// nothing new freed. So call it from a loop that can afford that (a
// heartbeat, the master's job loop), never from a pull or push.
bool TrimFreeMemory(absl::Time now, absl::Duration every = absl::Seconds(30));

// Caps glibc's malloc arenas at `arenas` unless MALLOC_ARENA_MAX or arena_max in
// GLIBC_TUNABLES is set (the user's choice wins). Give at least the number of threads that
// allocate at once on a hot path: fewer makes them wait for each other.
// True when it set the cap.
bool LimitMallocArenas(int arenas);

// Serves every allocation of at least `bytes` with its own mmap, returned
// whole when freed, and turns off glibc's rising threshold, unless the
// user set one (MALLOC_MMAP_THRESHOLD_, or mmap_threshold in
// GLIBC_TUNABLES). Call at startup. True when it set it. The default is
// glibc's own starting threshold.
bool FixMmapThreshold(size_t bytes = 128 << 10);

// Keeps up to `bytes` free at the top of each malloc heap instead of giving
// it back at once, unless the user set it (MALLOC_TRIM_THRESHOLD_, or
// trim_threshold in GLIBC_TUNABLES). True when it set it.
bool FixTrimThreshold(size_t bytes);

// A server's thresholds: FixMmapThreshold(8 MiB) and FixTrimThreshold(4
// MiB). Call at startup.
void TuneForMessages();

}  // namespace eps

#endif  // EPS_CORE_MEMORY_H_
