// Failpoints: test-only fault injection for crash tests.
//
// A failpoint is a named spot in the code where a test can make a process
// fail on purpose, armed through the environment of the process under test:
//
//   EPS_FAILPOINTS=ps.crash_in_checkpoint=7,some.other.point=3
//
// Each entry arms failpoint `name` for one value, whose meaning the spot
// defines (a checkpoint id, an attempt number). The variable is read once,
// at the first FailpointArmed call. This is the one place library code
// reads the environment, and only for tests: nothing in production sets
// EPS_FAILPOINTS, and an unset or empty variable arms nothing.
//
// Failpoints in the code:
//   ps.crash_in_checkpoint=N  a parameter server kills itself (SIGKILL) once
//                             checkpoint N is written, before it replies
//                             (ps/storage.cc).
//   ps.kill_in_store_write=N  a parameter server kills itself (SIGKILL) as
//                             its N-th write to its store (a flush's or an
//                             every_push push's) starts, saying on stderr
//                             whether the write had returned by then
//                             (ps/write_queue.cc).
//   ps.crash_in_move=STEP     a parameter server doing step STEP (1 COPY,
//                             2 HANDOFF, 3 TAIL) of a partition move kills
//                             itself (SIGKILL): the new owner once it wrote
//                             a page, the old one once it handed off
//                             (ps/param_server_moves.cc).
//   master.crash_in_move=STEP the master kills itself (SIGKILL) once step
//                             STEP of a partition move answered, before it
//                             reads the answer (master/master_moves.cc).
//   ps.fail_expiry=N          a parameter server's sweep of expired rows
//                             after N passes fails (ps/storage.cc).
//   worker.hang_trainer=ID    worker ID's trainer hangs after its first
//                             committed batch, in its step and holding its
//                             shard, while its heartbeats go on, until the
//                             process is asked to stop (worker/trainer.cc).
//   worker.oom_above=N        a worker's step over N records fails as out of
//                             memory (std::bad_alloc), as a device's would
//                             (worker/trainer.cc).
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_CORE_FAILPOINT_H_
#define EPS_CORE_FAILPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

namespace eps {

// Failpoint name -> the value it is armed for.
using Failpoints = absl::flat_hash_map<std::string, uint64_t>;

// Parses "name=value[,name=value...]" (values unsigned decimal; spaces
// around names and values ignored); an empty spec arms nothing.
// kInvalidArgument for an entry without a name or '=', a value that is not
// an unsigned 64-bit number, or a name given twice.
StatusOr<Failpoints> ParseFailpoints(absl::string_view spec);

// True when EPS_FAILPOINTS arms failpoint `name` for exactly `value`. A
// malformed EPS_FAILPOINTS is logged once (ERROR) and arms nothing. Cheap
// after the first call: one hash lookup.
bool FailpointArmed(absl::string_view name, uint64_t value);

// The value EPS_FAILPOINTS arms failpoint `name` for; nullopt when unarmed.
std::optional<uint64_t> FailpointValue(absl::string_view name);

}  // namespace eps

#endif  // EPS_CORE_FAILPOINT_H_
