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
// Every failpoint in the code, with what its value means, is listed in
// docs/development.md ("Failpoints"); the test docs.failpoints keeps that
// list and the code in step.
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
