// JobControl: the master's state machine. It composes the units
// (Membership, TrainingProgress, CheckpointCoordinator, Recovery,
// PartitionMoves, Drains, ProgressMeter) and holds the rules between them in one place:
//   - while a recovery is in progress: workers get NOT_READY for the
//     cluster map and WAIT for shards; no checkpoint starts; a round still
//     pausing is abandoned;
//   - while the servers write a checkpoint: no shard is handed out (a
//     worker that joined after the pause would push into it);
//   - a fenced worker's shards move only once every live server has its
//     fence; a rollback replaces the pass instead;
//   - a lost server before training starts only frees its slot;
//   - every wait on something outside the master has a bound and an
//     outcome (docs/design.md 2.14), enforced on every Tick: servers to
//     register, a slot to be filled, fences to be acknowledged, a shard's
//     holder to make progress, workers to exist, checkpoints to succeed;
//   - a model that diverged (a non-finite loss or prediction, a loss past
//     job.divergence_factor) or a server that cannot write its store stops
//     the job resumably; the job never finishes with a non-finite
//     evaluation.
//
// It decides and never waits: RPC handlers take decoded requests and fill
// replies; the job loop's steps return what to send to the servers (fence
// lists, checkpoint writes, restores) and take the replies back. Time is
// passed in. The driver (master.cc) holds the one mutex around every call,
// does the I/O without it, and persists TakeChanges() before any reply
// leaves.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_JOB_CONTROL_H_
#define EPS_MASTER_JOB_CONTROL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/status.h"
#include "master/checkpoint_coordinator.h"
#include "master/drains.h"
#include "master/event_log.h"
#include "master/membership.h"
#include "master/partition_moves.h"
#include "master/progress/data_set.h"
#include "master/progress/training_progress.h"
#include "master/progress_meter.h"
#include "master/recovery.h"
#include "master/state_store.h"
#include "master/trust/server_admission.h"
#include "master/wait_bounds.h"
#include "proto/eps.pb.h"
#include "rpc/security.h"

namespace eps {

class JobControl {
 public:
  // `spec` is the job as servers and workers receive it (its job_id set by
  // StartNew or Restore); `fingerprint` the options a restart must keep
  // (JobFingerprint). `events` is not owned and must outlive the unit.
  JobControl(const JobConfig& job, proto::JobSpec spec, std::string fingerprint,
             std::string data_dir, EventSink* events, absl::Time now);

  // --- Startup --------------------------------------------------------------

  // A new job with id `job_id`.
  void StartNew(const std::string& job_id);
  // Takes up the job saved in --data-dir (see MasterOptions::resume).
  //   kFailedPrecondition: state of another format or configuration, a
  //     job that is over, a stopped job without `resume`, `resume` with
  //     nothing to resume.
  //   kDataLoss: saved records that do not add up.
  Status Restore(const MasterSnapshot& snapshot, bool resume, absl::Time now);
  // The data scan ended: training starts once the servers are placed.
  // A failed scan fails the job.
  void DataScanned(StatusOr<std::pair<DataSet, DataSet>> data, absl::Time now);
  bool data_ready() const { return progress_.data_ready(); }
  // Under CURVE: training commits must carry the servers' receipts for
  // their records (master/trust/work_proof.h); a commit they do not cover fences
  // its worker. `key` must outlive the unit; nullptr (the default) checks
  // nothing.
  void CheckWorkWith(const WorkerCredentials* key) { receipt_key_ = key; }
  // Under CURVE: who may take a server slot (master/trust/server_admission.h).
  // Default: anyone with the server key (security off).
  ServerAdmission& admission() { return admission_; }
  // With an autoscaler: whether it may still start workers. While it may,
  // no worker alive does not stop the job (master.worker_wait_s): the
  // autoscaler is waiting for capacity or replacing them. Unset: it never
  // may.
  void ExpectWorkersFrom(std::function<bool()> may_launch) { may_launch_ = std::move(may_launch); }

  // --- RPC handlers ---------------------------------------------------------
  // Each validates, applies and fills its reply; errors as the wire
  // expects them (FENCED, NOT_READY reasons; kInvalidArgument for
  // malformed requests).

  Status RegisterServer(const proto::RegisterServerRequest& request, absl::Time now,
                        proto::RegisterServerReply* reply);
  // Refused with reason SLOW_DOWN (the worker waits and asks again) at
  // master.max_workers or the registration rate (Membership::TakeRegistration).
  Status RegisterWorker(const proto::RegisterWorkerRequest& request, absl::Time now,
                        proto::RegisterWorkerReply* reply);
  // `map_version`: the cluster map the sender says it routes by (the
  // envelope's; a worker's lets a retired server go, RetiredServerMayGo).
  Status Heartbeat(const proto::NodeId& sender, const proto::HeartbeatRequest& request,
                   uint64_t map_version, absl::Time now, proto::HeartbeatReply* reply);
  Status GetClusterMap(const proto::NodeId& sender, proto::GetClusterMapReply* reply) const;
  Status GetShard(const proto::NodeId& sender, absl::Time now, proto::GetShardReply* reply);
  // `labels` and `predictions`: an eval commit's frames.
  Status Commit(const proto::NodeId& sender, const proto::CommitProgressRequest& request,
                std::span<const float> labels, std::span<const float> predictions,
                absl::Time now, proto::CommitProgressReply* reply);
  // The range to check (master/trust/eval_check.h) before Commit applies
  // `request`, when it is an evaluation commit Commit would apply now.
  // (None while a recovery restores the servers: the commit is refused.)
  std::optional<TrainingProgress::EvalRange> EvalRangeOf(
      const proto::NodeId& sender, const proto::CommitProgressRequest& request) const {
    const WorkerEntry* worker = membership_.worker(sender.id());
    if (recovery_.active() || worker == nullptr || worker->state != PeerState::kAlive) {
      return std::nullopt;
    }
    return progress_.EvalRangeOf(sender.id(), request);
  }
  // `sender`'s evaluation commit failed the check (`why`): the worker is
  // fenced, and when an evaluation of it was applied in this pass the
  // evaluation starts over, every worker registering again; a job's
  // metrics never come from a worker fenced for lying. Returns the FENCED
  // error the worker is told.
  Status RefuseEvaluation(const proto::NodeId& sender, const std::string& why, absl::Time now);
  Status SplitShard(const proto::NodeId& sender, const proto::SplitShardRequest& request,
                    absl::Time now, proto::SplitShardReply* reply);
  // SHARD_UNREADABLE, in two halves around the master's own read of the
  // file (I/O, which the driver does without its lock). First, the range
  // to read; nullopt when there is none to read: a repeated report of a
  // shard skipped already (`reply` says so). FENCED for a fenced worker,
  // JOB_OVER once the job is over, TrainingProgress::Unread's errors.
  StatusOr<std::optional<TrainingProgress::UnreadRange>> UnreadableShard(
      const proto::NodeId& sender, const proto::ShardUnreadableRequest& request, absl::Time now,
      proto::ShardUnreadableReply* reply);
  // Then what the master's read of `range` found: OK means the file is
  // fine and the worker's own access is broken (kFailedPrecondition for
  // it, naming the file: the worker exits and its shard moves on);
  // otherwise data.on_unreadable decides: "fail" stops the job resumably
  // naming the file (JOB_OVER for the worker), "skip" skips the range.
  Status ShardUnreadable(const proto::NodeId& sender, const proto::ShardUnreadableRequest& request,
                         const TrainingProgress::UnreadRange& range, const Status& readable,
                         absl::Time now, proto::ShardUnreadableReply* reply);
  // DEREGISTER: a worker leaves (its shards go back at once); a server is
  // drained (Drain). A server's request names its slot (`server_id`, which
  // must be the sender's id: kPermissionDenied otherwise) and its endpoint
  // (kInvalidArgument when empty; FENCED when not its slot's current
  // process); a refusal drains nothing and counts in deregisters_refused().
  Status Deregister(const proto::NodeId& sender, const proto::DeregisterRequest& request = {});
  // Servers' DEREGISTERs refused since the master started (/metrics
  // eps_master_requests_refused_total{reason="deregister"}).
  uint64_t deregisters_refused() const { return deregisters_refused_; }
  // Server registrations ServerAdmission refused since the master started
  // (eps_master_requests_refused_total{reason="server_admission"}).
  uint64_t servers_refused() const { return servers_refused_; }
  // The slots no drain or balance moves a partition to (see
  // excluded_new_owners_).
  const std::set<uint32_t>& excluded_new_owners() const { return excluded_new_owners_; }

  // --- The job loop ---------------------------------------------------------

  // Leases, the progress sample, a checkpoint due.
  void Tick(absl::Time now);
  // Leases only: workers that missed theirs are fenced, a lost server starts
  // a recovery (also called while the driver waits for servers).
  void ExpireLeases(absl::Time now);
  // When the oldest request the master has not answered yet arrived
  // (RpcServer::OldestWaiting), for ExpireLeases; nullopt: none waits.
  void NoteUnhandledSince(std::optional<absl::Time> since) { unhandled_since_ = since; }
  // The fence list to send to every live server, if some may lack it.
  std::optional<Membership::FenceRound> PendingFences() const {
    return membership_.PendingFences();
  }
  // Every server in `round` acknowledged it.
  void FencesAcknowledged(const Membership::FenceRound& round, absl::Time now);
  // The servers `refused` of `round` did not acknowledge it (the others
  // did). One that has failed to for longer than a lease is lost (it
  // cannot refuse fenced workers, so it is not serving): a recovery.
  void FencesRefused(const Membership::FenceRound& round,
                     const std::vector<ServerAddress>& refused, absl::Time now);

  // The checkpoint round's write, once every worker paused; with the live
  // servers to write it. The id must be persisted before it is sent.
  struct CheckpointWrite {
    CheckpointCoordinator::Write write;
    std::vector<ServerAddress> servers;
  };
  std::optional<CheckpointWrite> NextCheckpointWrite(absl::Time now);
  // The servers answered: the record to write (with `*update`), or the
  // round fails now (an error from a server). `writing_started`: when the
  // calls went out.
  std::optional<proto::CheckpointRecord> CheckpointWritten(
      const CheckpointWrite& write, std::vector<StatusOr<proto::ServerCheckpoint>> parts,
      absl::Time writing_started, absl::Time now, StateUpdate* update);
  // The record was written (or not: `written`); the workers go on.
  void CheckpointRecorded(const proto::CheckpointRecord& record, const Status& written,
                          absl::Time now);

  // The model export (job.export_dir), due once the last pass is done: the
  // job finishes only when it is written. Nothing pushes then, so every
  // server writes what it holds.
  struct ExportWrite {
    std::string dir;
    std::vector<ServerAddress> servers;
    uint32_t attempt = 0;  // 1 for the first
    // The training passes done: the servers delete what expired with them.
    std::optional<uint32_t> passes_done;
  };
  // The export to write now: nullopt while none is due or while a recovery
  // runs or a slot has no live server (the export waits for them).
  std::optional<ExportWrite> NextExport(absl::Time now);
  // The servers answered (`parts`, one per server) and the master wrote
  // the manifest, or could not (`manifest`; not attempted when a server
  // failed). Finishes the job when all succeeded; otherwise tries again on
  // a later tick, and after kMaxExportAttempts stops the job resumably
  // naming the error.
  void Exported(const ExportWrite& write, const std::vector<StatusOr<proto::ExportReply>>& parts,
                const Status& manifest, absl::Time now);
  static constexpr uint32_t kMaxExportAttempts = 3;

  // The warm start (job.init_from), due once the servers are placed and
  // the data scanned, before training starts: checkpoint 0 is the export's
  // rows. The live servers to load it; nullopt while none is due or a slot
  // has no live server.
  struct ImportWrite {
    std::vector<ServerAddress> servers;
    uint32_t attempt = 0;  // 1 for the first
  };
  std::optional<ImportWrite> NextImport(absl::Time now);
  // The master checked the export before asking `write`'s servers to load
  // it (ValidateModelExport, cluster/model_format.h): an error stops the
  // job at once (resumably), naming the file, and no server is asked.
  void ImportChecked(const ImportWrite& write, const Status& checked, absl::Time now);
  // The servers answered (rows loaded, or the error). Training starts when
  // all succeeded. A server that refused the export itself (kNotFound,
  // kDataLoss, kInvalidArgument, kFailedPrecondition: a file missing or
  // broken, a model of another type) stops the job at once with its
  // reason, as ImportChecked does; other errors are tried again, and after
  // kMaxExportAttempts the job fails naming the error.
  void Imported(const ImportWrite& write, const std::vector<StatusOr<uint64_t>>& replies,
                absl::Time now);

  // The recovery's restores, when every slot is filled and fenced.
  std::optional<Recovery::Step> NextRestore(absl::Time now);
  // The servers answered the restores (bytes restored, per target).
  void Restored(const Recovery::Step& step, const std::vector<StatusOr<uint64_t>>& replies,
                absl::Time restore_started, absl::Time now);

  // The job loop may end: the job is over and every live peer heard it (or
  // the shutdown deadline passed).
  bool Done(absl::Time now) const;

  // --- Lifecycle ------------------------------------------------------------

  // Fails the job (a no-op once over). `stopped`: it can go on with --resume.
  void Fail(const std::string& reason, bool stopped, absl::Time now);
  // Stops the job resumably (Fail with stopped): its checkpoints stand, and
  // --resume goes on from the last complete one once the cause is fixed.
  void Stop(const std::string& reason, absl::Time now) {
    progress_.set_stopped(true);
    Fail(reason, /*stopped=*/true, now);
  }
  bool over() const { return progress_.over(); }

  // POST /checkpoint: the id of the round to wait for, or kFailedPrecondition
  // saying why none can be taken now.
  StatusOr<uint64_t> RequestCheckpoint();

  // --- Partition moves (job_moves.cc; docs/design.md 2.20) ---------------------

  // POST /servers/N/drain: queues the moves of every partition of server
  // `slot` to the other live servers (each to the one holding fewest);
  // what was queued. kNotFound for an unknown slot; kFailedPrecondition
  // unless the job trains, or when no other server is left.
  StatusOr<nlohmann::json> Drain(uint32_t slot);
  // The next step of a move to send (to `target`), when one may run now:
  // not during a recovery or a checkpoint round, and only while training.
  struct MoveStep {
    proto::MovePartitionRequest request;
    ServerAddress target;
  };
  std::optional<MoveStep> NextMoveStep(absl::Time now);
  // The step's result: the next step, the commit (the map gives the
  // partition to its new owner: event partition_moved), or on an error
  // the move given up (a newer map; tried again up to 3 times).
  void MoveStepDone(const MoveStep& step, const StatusOr<proto::MovePartitionReply>& reply,
                    absl::Time now);
  const PartitionMoves& moves() const { return moves_; }
  // Slots being drained (drained ones stay: no balance gives them
  // partitions again).
  const Drains& drains() const { return drains_; }
  // Why the job's servers are changing now (a recovery, moves, a drain, a
  // join waiting for its partitions, or the job not training), for the
  // server autoscaler; empty when they are not.
  std::string ServersChanging() const;

  // --- Persistence ----------------------------------------------------------

  // Moves every change since the last call into `update` (the master record
  // only when it differs from the one last taken). True when the job ended
  // since: the final status must be in place before any reply leaves.
  bool TakeChanges(StateUpdate* update);
  // The master record as the state is now.
  proto::MasterRecord SaveRecord() const;

  // --- Views ----------------------------------------------------------------

  const JobConfig& job() const { return job_; }
  const proto::JobSpec& job_spec() const { return job_spec_; }
  const Membership& membership() const { return membership_; }
  const TrainingProgress& progress() const { return progress_; }
  const CheckpointCoordinator& checkpoints() const { return checkpoints_; }
  const Recovery& recovery() const { return recovery_; }
  const ProgressMeter& meter() const { return meter_; }
  bool resumed() const { return resumed_; }
  absl::Time started() const { return started_; }
  // Seconds to the end of the job at the last interval's rate.
  std::optional<double> EtaSeconds() const;
  // What the job waits for right now on something outside the master
  // (servers, workers, a recovery, a checkpoint round), one line each with
  // how long and its bound; empty when it waits for nothing. /status
  // `waiting_for`.
  std::vector<std::string> Waits(absl::Time now) const;

 private:
  Status ResumeFromCheckpoint(const MasterSnapshot& snapshot, absl::Time now);
  void StartRecovery(uint32_t server, const std::string& why, absl::Time now);
  // Gives up the move in progress (a newer map; with `retry`, queued again
  // while it has attempts left: event partition_move_failed), e.g. for a
  // recovery.
  void AbandonMoves(const std::string& reason, bool retry = true);
  // The live slots a drain of `slot` may move to, with their partitions
  // (none of excluded_new_owners_).
  std::map<uint32_t, uint32_t> DrainTargets(uint32_t slot) const;
  // Adds to a heartbeat reply for server `slot` the move in progress whose
  // old owner it is (HeartbeatReply.moves_out): the old owner serves its
  // pages only to the new owner named there.
  void FillMovesOut(uint32_t slot, proto::HeartbeatReply* reply) const;
  // Queues the moves of the partitions `slot` still owns (event
  // server_drained once it owns none); how many.
  uint32_t PlanDrain(uint32_t slot);
  // Retires drained `slot` (Membership::RetireServer) once nothing needs
  // it: it owns no partition, no move, checkpoint round or export is in progress,
  // and no recovery could restore a partition from its part of the newest
  // checkpoint (until then it asks for a checkpoint). True when it did.
  bool RetireIfDrained(uint32_t slot, absl::Time now);
  // Queues moves from the live servers holding most partitions to those
  // holding fewest until they differ by at most one; how many (0: even).
  uint32_t PlanBalance();
  // Ends the waits that ran past their bounds (Tick).
  void EnforceBounds(absl::Time now);
  // Stops the job for a diverged model: `reason`, and how to go on.
  void StopDiverged(const std::string& reason, absl::Time now);
  // Places the servers and starts training once both are ready.
  void MaybeStartTraining(absl::Time now);
  void AfterCommit(absl::Time now);
  // The last pass is done: the export, if one is asked for, then Finish
  // (job_export.cc).
  void PassesDone(absl::Time now);
  // Why the job must not finish with its evaluation (not finite, or worse
  // than knowing nothing past job.divergence_factor); nullopt when it may.
  std::optional<std::string> RuinedEvaluation() const;
  void Finish(absl::Time now);
  void SampleProgress(absl::Time now);
  void FillJobProgress(proto::HeartbeatReply* reply) const;
  // The job's state now as checkpoint `id`'s record (no server parts yet).
  proto::CheckpointRecord CheckpointRecordNow(uint64_t id, absl::Time now) const;

  const JobConfig& job_;
  proto::JobSpec job_spec_;
  const std::string fingerprint_;
  const std::string data_dir_;
  EventSink* const events_;
  const absl::Time started_;
  Membership membership_;
  TrainingProgress progress_;
  CheckpointCoordinator checkpoints_;
  Recovery recovery_;
  PartitionMoves moves_;
  // Slots leaving the job (master/drains.h).
  Drains drains_;
  // A server joined: moves even out the partitions of the live servers
  // (MasterRecord.balancing_servers).
  bool balancing_ = false;
  ProgressMeter meter_;
  const WorkerCredentials* receipt_key_ = nullptr;
  std::function<bool()> may_launch_;
  bool resumed_ = false;
  WaitBounds bounds_;
  absl::Time done_at_ = absl::InfiniteFuture();
  bool ended_ = false;  // the job ended since the last TakeChanges
  // The export (PassesDone): due since, and the attempts that failed. Not
  // persisted: a restarted master finds the last pass done (Tick) and
  // exports again.
  // The warm start (NextImport): due, done, and the attempts that failed.
  // Not persisted: a master restarted before training starts loads it
  // again (a load replaces what the servers hold).
  bool import_due_ = false;
  bool import_done_ = false;
  uint32_t import_attempts_ = 0;
  std::string import_error_;
  bool export_due_ = false;
  absl::Time export_due_since_ = absl::InfiniteFuture();
  // See NoteUnhandledSince.
  std::optional<absl::Time> unhandled_since_;
  uint32_t export_attempts_ = 0;
  std::string export_error_;
  std::string saved_record_;  // the master record last taken, serialized

  uint64_t deregisters_refused_ = 0;
  ServerAdmission admission_;
  uint64_t servers_refused_ = 0;
  // Slots no drain or balance moves a partition to: a move to each failed
  // in its own step (COPY or TAIL) PartitionMoves::kMaxAttempts times. A
  // slot leaves the set when a process registers for it again; not
  // persisted (a restarted master tries it again).
  std::set<uint32_t> excluded_new_owners_;
};

}  // namespace eps

#endif  // EPS_MASTER_JOB_CONTROL_H_
