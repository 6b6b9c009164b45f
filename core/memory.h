// Returning freed memory to the system.
//
// glibc's malloc keeps what a program frees in its arenas (one per thread
// that allocated concurrently) and gives back only the top of each heap.
// A long-running process whose threads come and go (RPC fan-outs, RocksDB's
// flushes and compactions, a server's restore) so holds more and more free
// pages: resident memory grows while the memory in use does not (measured
// in the 30-minute soak: the master's heap held 3 MiB in use and 5 MiB free
// after 10 minutes, its anonymous RSS rising 0.75 MiB a minute).
// TrimFreeMemory hands those free pages back (malloc_trim), at most once
// per interval, so that a process's RSS follows what it uses.
//
// LimitMallocArenas caps the arenas glibc makes (8 per core by default, one
// more whenever threads contend): every arena keeps its own free pages and
// partly used ones, so a process whose threads come and go slowly spreads
// over more of them. Without it the soak's server grew 12% in 12 minutes
// with its heap's use flat; the master and servers call it first thing,
// unless MALLOC_ARENA_MAX is set (the user's choice wins).
//
// Thread-safety: TrimFreeMemory is safe for concurrent use;
// LimitMallocArenas must run before the process starts threads.

#ifndef EPS_CORE_MEMORY_H_
#define EPS_CORE_MEMORY_H_

#include "absl/time/time.h"

namespace eps {

// At most once per `every` (process-wide; calls in between return at once):
// gives the free pages of every malloc arena back to the system. True when
// it trimmed. Takes each arena's lock briefly (well under a millisecond for
// tens of MiB), so call it from a loop that can afford that, not from a
// hot path.
bool TrimFreeMemory(absl::Time now, absl::Duration every = absl::Seconds(30));

// Caps glibc's malloc arenas at `arenas` unless MALLOC_ARENA_MAX is set.
// True when it set the cap.
bool LimitMallocArenas(int arenas);

}  // namespace eps

#endif  // EPS_CORE_MEMORY_H_
