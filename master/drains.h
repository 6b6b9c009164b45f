// Drains: the server slots leaving the job (docs/design.md 2.20), and how
// far each is. A drain is asked for by POST /servers/N/drain or by the
// server's DEREGISTER (SIGTERM); its partitions move to the other live
// servers (PartitionMoves), and once the newest checkpoint no longer needs
// its part, the slot leaves (Membership::RetireServer).
//
//   (none) --Start--> draining --Emptied--> drained --Retired--> (none: left)
//                       |   ^                  |
//                       |   \----Refilled------/   (a recovery gave it partitions back)
//                       \--Stop--> (none)           (no server can take them; a move given up)
//
// A slot in either state is no move's target and takes no partition from
// a join's balance. Only a `draining` one holds back other server changes
// (FirstDraining). Both are saved (MasterRecord.draining_servers): a
// restored one is draining until the next plan finds it empty.
//
// The unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_DRAINS_H_
#define EPS_MASTER_DRAINS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "proto/eps.pb.h"

namespace eps {

class Drains {
 public:
  enum class State { kNone, kDraining, kDrained };

  State state(uint32_t slot) const;
  // Draining or drained: it takes no partition.
  bool Leaving(uint32_t slot) const { return state(slot) != State::kNone; }
  // Every slot leaving, in order.
  std::set<uint32_t> leaving() const;
  // The drained ones, which leave once nothing needs them.
  std::set<uint32_t> drained() const;
  // The lowest slot still draining (holding partitions), if any.
  std::optional<uint32_t> FirstDraining() const;

  // Starts draining `slot`. False (nothing changes) when it is leaving.
  bool Start(uint32_t slot);
  // `slot` holds no partition: drained. True the first time (the event
  // server_drained); false when it was not draining.
  bool Emptied(uint32_t slot);
  // A drained slot was given partitions back (a recovery): draining again.
  void Refilled(uint32_t slot);
  // The drain of `slot` stops, it stays in the job. False when none ran.
  bool Stop(uint32_t slot);
  // `slot` left the job (Membership::RetireServer).
  void Retired(uint32_t slot) { slots_.erase(slot); }

  // MasterRecord.draining_servers.
  void SaveTo(proto::MasterRecord* record) const;
  void RestoreFrom(const proto::MasterRecord& record);

 private:
  std::map<uint32_t, State> slots_;  // kNone never stored
};

}  // namespace eps

#endif  // EPS_MASTER_DRAINS_H_
