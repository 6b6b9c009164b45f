// Recovery: server loss and --resume as a state machine.
//
// A lost server (lease expired, or a new process on its data dir) fences
// every worker; the job waits until every slot is filled again (the server
// restarted on its --data-dir, or a fresh one) and every live server has
// the fences; then the servers restore the last complete checkpoint:
//
//   idle --Start--> waiting(for slots, fences) --Next: Restore--> restoring
//     --Restored: kDone--> idle (the caller applies a rollback)
//     --Restored: kRetry--> waiting (a server restarting, a lost reply)
//     --Restored: kFail / Next: Fail--> the job stops resumably
//   waiting --Next, master.recovery_timeout_s after Start--> Fail, naming
//     the slots still missing (or the restore that kept failing)
//
// `rollback` restores every server, and the data progress returns to the
// checkpoint; `continue` restores only the lost slots.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_RECOVERY_H_
#define EPS_MASTER_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/status.h"
#include "master/membership.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"

namespace eps {

class Recovery {
 public:
  // Starts a recovery unless one is in progress; either way `lost` is
  // restored. True when it started one.
  bool Start(const std::string& why, bool rollback, uint32_t lost, absl::Time now);
  // Starts one with nothing lost yet (a restarted master redoing a
  // recovery, or --resume): every server restores (a rollback).
  void StartRollback(const std::string& why, absl::Time now);
  // A replacement took `slot`: it restores too.
  void AddLost(uint32_t slot);

  struct RestoreTarget {
    uint32_t slot = 0;
    std::string endpoint;
    std::string path;  // empty for checkpoint 0: the server empties itself
    // The slot joined after the checkpoint: it empties itself too.
    bool joined_after = false;
  };
  struct Step {
    enum class Kind { kWait, kRestore, kFail } kind = Kind::kWait;
    std::vector<RestoreTarget> targets;  // kRestore
    std::string error;                   // kFail
    // kWait: a line to log saying what the recovery waits for, every
    // job.progress_interval_s.
    std::optional<std::string> waiting_line;
  };
  // What to do next: wait for slots and fences, restore `checkpoint` at the
  // targets, or fail: a slot the checkpoint has no part of, or `timeout`
  // passed since the recovery started (the error names what is missing).
  Step Next(const Membership& membership, const proto::CheckpointRecord& checkpoint,
            absl::Duration log_every, absl::Duration timeout, absl::Time now);

  enum class Verdict { kDone, kRetry, kFail };
  // Judges the RESTORE replies (one per target of `step`). kRetry for a
  // server still starting, a lost reply, a target replaced since (even one
  // that answered) or a slot lost since that was not a target (restoring
  // again is harmless); kFail sets *error.
  Verdict Restored(const Membership& membership, const Step& step, uint64_t checkpoint_id,
                   const std::vector<StatusOr<uint64_t>>& restored_bytes, std::string* error);
  // The recovery is over: `result` becomes /status recovery.last.
  void Done(nlohmann::json result);

  bool active() const { return state_.has_value(); }
  bool rollback() const { return state_.has_value() && state_->rollback; }
  // Why it started; empty when idle.
  const std::string& why() const;
  absl::Time started() const { return state_.has_value() ? state_->started : absl::Time(); }
  uint64_t count() const { return count_; }
  const nlohmann::json& last() const { return last_; }

  void SaveTo(proto::MasterRecord* record) const { record->set_recovering(active()); }

 private:
  struct State {
    std::string why;
    absl::Time started;
    bool rollback = true;       // every server restores, and the data progress
    std::set<uint32_t> lost;    // the slots whose server was lost
    absl::Time last_log;
    std::string last_retry;     // why the last restore is tried again
  };
  std::optional<State> state_;
  uint64_t count_ = 0;
  nlohmann::json last_;
};

}  // namespace eps

#endif  // EPS_MASTER_RECOVERY_H_
