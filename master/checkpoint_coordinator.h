// CheckpointCoordinator: the coordinated checkpoint round as a state
// machine, and the job's list of complete checkpoints.
//
// A round pauses every worker after its batch in hand is committed, has
// every server write checkpoint N once no push is in flight, records the
// job's state with it (one CheckpointRecord) and lets the workers go on:
//
//   idle --interval or Request--> pausing(N) --every live worker paused,
//     no fence pending--> writing(N) --Complete--> idle (N complete)
//   pausing --patience (2 leases) passed with workers not paused-->
//     OverdueToPause names them, once per round (the caller fences them,
//     and patience starts again for the fences)
//   pausing --patience passed again, the job over, or Abandon--> idle (N failed)
//   writing --Fail (a server error, the record not written)--> idle (N failed)
//
// Checkpoint ids are never reused: N is saved (last_checkpoint_id) before
// any server sees it. Checkpoint 0 is the job as training starts: written
// by nobody, it needs no server part (restoring it empties a server).
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_CHECKPOINT_COORDINATOR_H_
#define EPS_MASTER_CHECKPOINT_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "master/event_log.h"
#include "master/state_store.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"

namespace eps {

class CheckpointCoordinator {
 public:
  // `events` is not owned and must outlive the unit.
  CheckpointCoordinator(const JobConfig& job, EventSink* events);

  // Starts round N when one is due (every checkpoint.interval_s, the first
  // an interval after the first call) or requested, and `may_start`.
  // Returns its id.
  std::optional<uint64_t> MaybeStart(absl::Time now, bool may_start);
  // An operator's checkpoint (POST /checkpoint): the id to wait for, the
  // round in progress or the next one, which starts at the next MaybeStart.
  uint64_t Request();
  // Forgets a request not started yet (a recovery began).
  void CancelRequest() { requested_ = false; }

  // The workers of `not_paused` that round N waited for a whole patience,
  // once per round: all of them, or none. The caller fences them, so that
  // one worker that never pauses cannot fail every round; the patience then
  // starts again, for their fences to reach every server.
  std::vector<uint32_t> OverdueToPause(absl::Time now, const std::vector<uint32_t>& not_paused);
  // How long a round waits for its workers to pause: two leases.
  absl::Duration Patience() const { return absl::Milliseconds(2 * job_.master.lease_ms); }


  struct Write {
    uint64_t id = 0;
    absl::Time started;
    // The complete checkpoints the servers keep besides this one.
    std::vector<uint64_t> keep;
  };
  // The round's next step once it is pausing: with every live worker
  // paused (`not_paused` empty) and no fenced worker waiting for its
  // fence to reach every server, the round writes (returned once). A round
  // that waits longer than its patience, or waits while the job is over,
  // fails. nullopt otherwise.
  std::optional<Write> Next(absl::Time now, const std::vector<uint32_t>& not_paused,
                            bool fences_pending, bool job_over);

  // The update that makes the written round complete: its record, and the
  // deletion of the oldest complete ones beyond checkpoint.keep.
  StateUpdate CompleteUpdate(const proto::CheckpointRecord& record) const;
  // The record of the round is written: it is the newest complete one.
  void Completed(const proto::CheckpointRecord& record, absl::Time now);
  // Ends the round in progress as failed with `error` (log, event, result);
  // the next one is due an interval later. It counts as a consecutive
  // failure unless `counts` is false. REQUIRES: a round in progress.
  void Fail(const std::string& error, absl::Time now, bool counts = true);
  // Fails a round still pausing (its workers are fenced: they will not
  // pause again), not counting it as a consecutive failure: the recovery
  // that fenced them is the cause. A round writing carries on.
  void AbandonPausing(const std::string& why, absl::Time now);

  // Checkpoint 0, written with the first epoch's start.
  void RecordStart(proto::CheckpointRecord start);
  // Checkpoint 0's record, once, for the next write.
  std::optional<proto::CheckpointRecord> TakePendingRecord();

  std::optional<uint64_t> round_id() const;
  bool writing() const { return round_.has_value() && round_->writing; }
  // The outcome of round `id` (its record's JSON or {"error": ...}) once
  // it is over; kept for the last 16 rounds.
  const nlohmann::json* Result(uint64_t id) const;
  // The newest complete round's JSON, or null.
  nlohmann::json LastResult() const;
  // The newest complete checkpoint: what a recovery restores.
  const std::optional<proto::CheckpointRecord>& last() const { return last_; }
  uint64_t last_id() const { return last_id_; }
  uint64_t written() const { return written_; }
  uint64_t failed() const { return failed_; }
  // Rounds failed since the last complete one, and the last one's error.
  uint64_t consecutive_failures() const { return consecutive_failures_; }
  const std::string& last_failure() const { return last_failure_; }
  double pause_s() const { return pause_s_; }

  static nlohmann::json RecordJson(const proto::CheckpointRecord& record);

  void SaveTo(proto::MasterRecord* record) const { record->set_last_checkpoint_id(last_id_); }
  // The saved complete checkpoints (ascending ids) and the last id started.
  void RestoreFrom(const MasterSnapshot& snapshot);

 private:
  struct Round {
    uint64_t id = 0;
    absl::Time started;
    bool writing = false;  // every worker has paused; the servers write
    absl::Time patient_since;      // started, or when OverdueToPause named workers
    bool overdue_named = false;    // OverdueToPause named workers
  };
  void SetResult(uint64_t id, nlohmann::json result);

  const JobConfig& job_;
  EventSink* const events_;
  std::optional<Round> round_;
  absl::Time next_ = absl::InfiniteFuture();
  bool requested_ = false;
  uint64_t last_id_ = 0;         // started, complete or not
  std::deque<uint64_t> kept_;    // complete, oldest first
  uint64_t written_ = 0;
  uint64_t failed_ = 0;
  uint64_t consecutive_failures_ = 0;
  std::string last_failure_;
  double pause_s_ = 0;           // total, over every round
  std::map<uint64_t, nlohmann::json> results_;
  std::optional<proto::CheckpointRecord> last_;
  std::optional<proto::CheckpointRecord> pending_;
};

}  // namespace eps

#endif  // EPS_MASTER_CHECKPOINT_COORDINATOR_H_
