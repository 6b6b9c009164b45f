#include "master/job_control.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cluster/job_options.h"
#include "core/logging.h"
#include "master/job_record.h"
#include "master/trust/peer_stats.h"
#include "master/trust/work_proof.h"
#include "rpc/message.h"
#include "rpc/net.h"

namespace eps {

using nlohmann::json;

namespace {

// The answer to a worker's call once the job has failed or stopped: it
// stops too (the master's final status says why).
Status JobOver() {
  return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                         "the job is over; the master's final status says why", proto::JOB_OVER);
}

}  // namespace

JobControl::JobControl(const JobConfig& job, proto::JobSpec spec, std::string fingerprint,
                       std::string data_dir, EventSink* events, absl::Time now)
    : job_(job),
      job_spec_(std::move(spec)),
      fingerprint_(std::move(fingerprint)),
      data_dir_(std::move(data_dir)),
      events_(events),
      started_(now),
      membership_(job, events),
      progress_(job, events),
      checkpoints_(job, events),
      meter_(absl::Seconds(job.job.progress_interval_s), now),
      bounds_(job) {}

// --- Startup ------------------------------------------------------------------

void JobControl::StartNew(const std::string& job_id) {
  job_spec_.set_job_id(job_id);
  events_->Record("job_started", {{"job", job_.job.name}, {"job_id", job_id}});
}

Status JobControl::Restore(const MasterSnapshot& snapshot, bool resume, absl::Time now) {
  const proto::MasterRecord& record = snapshot.master;
  RETURN_IF_ERROR(CheckSavedJob(record, fingerprint_, data_dir_, resume));
  checkpoints_.RestoreFrom(snapshot);
  resumed_ = true;
  job_spec_.set_job_id(record.job_id());
  membership_.RestoreFrom(record, now);
  drains_.RestoreFrom(record);
  balancing_ = record.balancing_servers();
  if (resume) return ResumeFromCheckpoint(snapshot, now);
  RETURN_IF_ERROR(progress_.RestoreFrom(snapshot));
  if (progress_.phase() == JobPhase::kScanning) {
    // Nothing was handed out yet: scan again.
    LOG(INFO) << "resuming the job in " << data_dir_ << " before its data was scanned";
    events_->Record("master_resumed", {{"phase", "scanning"}});
    return absl::OkStatus();
  }
  // Workers of the previous master's life are gone for it: fence them
  // before their shards move (their pushes must stop first).
  const std::set<uint32_t> holders = progress_.HoldersOfShardsInProgress();
  for (uint32_t holder : holders) membership_.Fence(holder, now, "the master restarted");
  const bool eval = progress_.phase() == JobPhase::kEvaluating;
  const ShardTracker& tracker = *progress_.tracker();
  LOG(INFO) << "resuming the job in " << data_dir_ << ": " << JobPhaseName(progress_.phase())
            << (eval ? std::string() : absl::StrCat(" epoch ", progress_.epoch() + 1)) << ", "
            << tracker.done() << "/" << tracker.num_shards() << " shards done, "
            << progress_.records_trained() << " records trained; " << holders.size()
            << " worker(s) of the previous run must register again";
  events_->Record("master_resumed", {{"phase", JobPhaseName(progress_.phase())},
                                     {"epoch", progress_.epoch() + 1},
                                     {"shards_done", tracker.done()},
                                     {"records_trained", progress_.records_trained()}});
  if (record.recovering()) {
    // The servers may hold a checkpoint's state already, the saved progress
    // not: restore both again.
    LOG(WARNING) << "the previous master was restoring the job from a checkpoint; doing it again";
    recovery_.StartRollback("the master restarted during a recovery", now);
  }
  return absl::OkStatus();
}

Status JobControl::ResumeFromCheckpoint(const MasterSnapshot& snapshot, absl::Time now) {
  const std::optional<proto::CheckpointRecord>& last = checkpoints_.last();
  if (!last.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume: the job in --data-dir ", data_dir_,
        " has no checkpoint to continue from: it stopped before training started; start it "
        "again without --resume (a fresh --data-dir)"));
  }
  progress_.RestoreForResume(snapshot, *last);
  // Every worker of the earlier run is fenced: none of its pushes may land
  // on a restored server.
  for (uint32_t id = 0; id < membership_.next_worker_id(); ++id) {
    if (!membership_.IsFenced(id)) membership_.Fence(id, now, "resumed");
  }
  recovery_.StartRollback(snapshot.master.stopped()
                              ? "resuming the stopped job"
                              : "resuming the job (it was not stopped: a crash or a machine "
                                "restart)",
                          now);
  LOG(INFO) << "resuming the job in " << data_dir_ << " from checkpoint " << last->id()
            << " (epoch " << progress_.epoch() + 1 << ", " << last->master().records_trained()
            << " records trained); waiting for its " << membership_.servers().size()
            << " server(s) to register again";
  events_->Record("job_resuming", {{"checkpoint", last->id()},
                                   {"epoch", progress_.epoch() + 1},
                                   {"records_trained", last->master().records_trained()}});
  return absl::OkStatus();
}

void JobControl::DataScanned(StatusOr<std::pair<DataSet, DataSet>> data, absl::Time now) {
  if (!data.ok()) {
    Fail(std::string(data.status().message()), /*stopped=*/false, now);
    return;
  }
  if (over()) return;
  progress_.SetData(std::move(data->first), std::move(data->second));
  MaybeStartTraining(now);
}

void JobControl::MaybeStartTraining(absl::Time now) {
  membership_.MaybePlace(job_spec_.num_partitions());
  // Placement and the data scan finish in either order (servers usually
  // register while a large data set is still being scanned); training
  // starts on whichever comes second.
  if (!progress_.data_ready() || progress_.phase() != JobPhase::kScanning ||
      !membership_.placed() || !membership_.all_servers_alive()) {
    return;
  }
  if (!job_.job.init_from.empty() && !import_done_ && !checkpoints_.last().has_value()) {
    // The servers load the export first (NextImport); then training starts.
    if (!import_due_) {
      LOG(INFO) << "loading the model in " << job_.job.init_from << " into the servers"
                << (job_.job.init_optimizer_state ? " with its optimizer state" : "");
    }
    import_due_ = true;
    return;
  }
  progress_.StartEpoch(0);
  if (checkpoints_.last().has_value()) return;
  // Checkpoint 0: nothing trained; every server empty, or holding the
  // rows of job.init_from.
  checkpoints_.RecordStart(CheckpointRecordNow(/*id=*/0, now));
}

// --- RPC handlers -------------------------------------------------------------

Status JobControl::RegisterServer(const proto::RegisterServerRequest& request, absl::Time now,
                                  proto::RegisterServerReply* reply) {
  if (!ParseTcpEndpoint(request.endpoint()).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad server endpoint '", request.endpoint(), "'"));
  }
  // Before the server counts: one with another model, optimizer or lease
  // must not take a slot.
  if (Status options = CheckSharedOptions(job_, request.job_options(), "server"); !options.ok()) {
    LOG(WARNING) << "refused the server at " << request.endpoint() << " (" << request.hostname()
                 << " pid " << request.pid() << "): " << options.message();
    return options;
  }
  const std::string this_job = absl::StrCat(job_spec_.job_id(), " ", job_spec_.name());
  if (!request.stored_job().empty() && request.stored_job() != this_job) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the server's --data-dir holds the parameters of job ", request.stored_job(),
        ", not of this job (", this_job, "); give it a fresh --data-dir"));
  }
  if (over()) return JobOver();
  // Who it claims to be is judged before the claim changes anything (a
  // claim on a live slot marks its server dead).
  const auto refused = [&](Status why) {
    if (++servers_refused_ <= 16 || (servers_refused_ & (servers_refused_ - 1)) == 0) {
      LOG(WARNING) << "refused a server registration (" << servers_refused_
                   << " so far): " << why.message();
    }
    return why;
  };
  if (request.rejoin() || request.has_stored_server_id()) {
    if (Status claim = admission_.CheckClaim(request); !claim.ok()) return refused(claim);
  }
  ASSIGN_OR_RETURN(Membership::Claim claim, membership_.ClaimSlot(request));
  if (claim.joined) {
    if (Status join = admission_.CheckJoin(request); !join.ok()) return refused(join);
  }
  if (claim.joined && (recovery_.active() || progress_.phase() != JobPhase::kTraining)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a server joins a job while it trains, with no recovery running; the job is ",
        recovery_.active() ? "being restored" : JobPhaseName(progress_.phase()),
        ": start this server again then"));
  }
  if (!claim.retried) {
    if (claim.restarted) {
      StartRecovery(claim.slot, absl::StrCat("ps[", claim.slot, "] restarted"), now);
      if (over()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the job failed: ", progress_.failure()));
      }
    }
    const bool replaces = membership_.AdmitServer(claim.slot, request, now);
    if (replaces) recovery_.AddLost(claim.slot);
    // A process admitted anew: moves may go to its slot again.
    excluded_new_owners_.erase(claim.slot);
    if (claim.joined) {
      LOG(INFO) << "ps[" << claim.slot << "] joins the job (" << request.endpoint()
                << "): partitions move to it";
      events_->Record("server_joined", {{"server", claim.slot}, {"endpoint", request.endpoint()}});
      balancing_ = true;
    }
    events_->Record("server_registered", {{"server", claim.slot},
                                          {"endpoint", request.endpoint()},
                                          {"host", request.hostname()},
                                          {"replaces", replaces},
                                          {"restarted", claim.restarted},
                                          {"rejoined", request.rejoin()},
                                          {"fresh_data_dir", !request.has_stored_server_id()}});
    MaybeStartTraining(now);
  }
  reply->set_server_id(claim.slot);
  reply->set_slot_credential(admission_.Credential(claim.slot));
  *reply->mutable_job() = job_spec_;
  return absl::OkStatus();
}

Status JobControl::RegisterWorker(const proto::RegisterWorkerRequest& request, absl::Time now,
                                  proto::RegisterWorkerReply* reply) {
  if (over()) return JobOver();
  if (Status options = CheckSharedOptions(job_, request.job_options(), "worker"); !options.ok()) {
    LOG(WARNING) << "refused a worker (" << request.hostname() << " pid " << request.pid()
                 << "): " << options.message();
    return options;
  }
  RETURN_IF_ERROR(membership_.TakeRegistration(now));
  reply->set_worker_id(membership_.AdmitWorker(request, now));
  *reply->mutable_job() = job_spec_;
  reply->set_heartbeat_ms(static_cast<uint32_t>(job_.master.heartbeat_ms));
  reply->set_lease_ms(static_cast<uint32_t>(job_.master.lease_ms));
  return absl::OkStatus();
}

Status JobControl::Heartbeat(const proto::NodeId& sender, const proto::HeartbeatRequest& request,
                             uint64_t map_version, absl::Time now, proto::HeartbeatReply* reply) {
  if (over()) {
    // Whoever asks hears that the job ended, alive or not: a peer whose
    // lease ran out meanwhile (a master slow to answer) must still learn
    // it, not be told to register again.
    if (sender.role() != proto::ROLE_WORKER && sender.role() != proto::ROLE_SERVER) {
      return absl::InvalidArgumentError("heartbeat from an unknown role");
    }
  } else if (sender.role() == proto::ROLE_WORKER) {
    // Bounded before anything of it is kept (and before it renews a lease).
    proto::WorkerStats stats = request.worker();
    RETURN_IF_ERROR(CheckWorkerStats(stats));
    const std::optional<uint64_t> round = checkpoints_.round_id();
    RETURN_IF_ERROR(membership_.WorkerHeartbeat(sender, recovery_.why(), std::move(stats),
                                                request.paused_for_checkpoint(), round, now,
                                                request.seq()));
    membership_.NoteWorkerMap(sender.id(), map_version);
    if (round.has_value()) reply->set_pause_for_checkpoint(*round);
    if (std::optional<uint64_t> split = progress_.SplitRequestedOf(sender.id()); split) {
      reply->set_split_shard(*split);
    }
  } else if (const std::string* left = membership_.LeftServer(sender.id());
             sender.role() == proto::ROLE_SERVER && left != nullptr &&
             (request.endpoint().empty() || request.endpoint() == *left)) {
    // Drained, and its slot retired (RetireServer): it exits once no worker
    // can still send to it. Until then it answers them WRONG_OWNER, and
    // hears of no map (the newer ones do not name it).
    if (!membership_.RetiredServerMayGo(sender.id(), now)) {
      reply->set_state(proto::JOB_RUNNING);
      return absl::OkStatus();
    }
    reply->set_shutdown(true);
  } else if (sender.role() == proto::ROLE_SERVER) {
    bool first_contact = false;
    proto::ServerStats stats = request.server();
    RETURN_IF_ERROR(CheckServerStats(stats, request.storage_error()));
    RETURN_IF_ERROR(
        membership_.ServerHeartbeat(sender.id(), request.endpoint(), stats, now, &first_contact,
                                    request.seq()));
    const ServerEntry& server = *membership_.server(sender.id());
    FillMovesOut(sender.id(), reply);
    if (!request.storage_error().empty()) {
      // What it acknowledges from now on may never reach its store: stop
      // before more work is lost.
      Stop(absl::StrCat("ps[", sender.id(), "] (", server.host, " pid ", server.pid,
                        ") cannot write its store: ", request.storage_error(),
                        "; free space (or fix the disk), then run eps-master --resume and "
                        "restart the servers on their --data-dir"),
           now);
    }
    // Rows untrained for ps.ttl_passes passes go once a pass ends.
    // Not while a recovery runs: the restored servers learn the restored
    // count, once the job has taken it back.
    std::optional<uint32_t> done = progress_.passes_done();
    if (done.has_value() && !recovery_.active()) {
      reply->set_training_passes_done(*done);
    }
  } else {
    return absl::InvalidArgumentError("heartbeat from an unknown role");
  }
  reply->set_state(progress_.phase() == JobPhase::kFinished ? proto::JOB_FINISHED
                   : progress_.phase() == JobPhase::kFailed ? proto::JOB_FAILED
                                                            : proto::JOB_RUNNING);
  reply->set_cluster_map_version(membership_.cluster_map().version());
  reply->set_membership_epoch(membership_.generation());
  FillJobProgress(reply);
  if (over()) {
    reply->set_shutdown(true);
    membership_.ToldToExit(sender);
  }
  return absl::OkStatus();
}

void JobControl::FillJobProgress(proto::HeartbeatReply* reply) const {
  if (std::optional<uint64_t> left = progress_.PassLinesLeft(); left.has_value()) {
    reply->set_pass_records_left(*left);
  }
  reply->set_job_records_per_s(meter_.records_per_s());
  if (const std::optional<double> eta = EtaSeconds(); eta.has_value()) reply->set_eta_s(*eta);
}

Status JobControl::GetClusterMap(const proto::NodeId& sender,
                                 proto::GetClusterMapReply* reply) const {
  if (recovery_.active() && sender.role() == proto::ROLE_WORKER) {
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           absl::StrCat("the job is being restored (", recovery_.why(),
                                        "); training goes on once every server is back"),
                           proto::NOT_READY);
  }
  if (!membership_.placed()) {
    return ErrorWithReason(
        absl::StatusCode::kUnavailable,
        absl::StrCat("waiting for parameter servers: ", membership_.servers().size(), " of ",
                     job_.ps.num_servers, " registered"),
        proto::NOT_READY);
  }
  *reply->mutable_map() = membership_.cluster_map();
  return absl::OkStatus();
}

Status JobControl::GetShard(const proto::NodeId& sender, absl::Time now,
                            proto::GetShardReply* reply) {
  RETURN_IF_ERROR(membership_.LiveWorker(sender, recovery_.why(), now).status());
  if (over()) {
    reply->set_action(proto::GetShardReply::FINISHED);
    membership_.ToldToExit(sender);
    return absl::OkStatus();
  }
  // Nothing new starts while the job is restored, or while the servers
  // write a checkpoint (a worker that joined after the pause would push
  // into it).
  const bool hold = recovery_.active() || checkpoints_.writing();
  std::optional<proto::ShardAssignment> shard;
  if (!hold) shard = progress_.Assign(sender.id());
  if (!shard.has_value()) {
    reply->set_action(proto::GetShardReply::WAIT);
    // Well within a heartbeat, so a shard freed by a death is picked up
    // within lease + one heartbeat.
    reply->set_retry_after_ms(
        static_cast<uint32_t>(std::clamp<int64_t>(job_.master.heartbeat_ms / 4, 5, 200)));
    // An idle worker and nothing queued: ask the slowest holder to share.
    if (!hold) progress_.RequestSplit(sender.id());
    return absl::OkStatus();
  }
  reply->set_action(proto::GetShardReply::ASSIGNED);
  *reply->mutable_shard() = *std::move(shard);
  membership_.NoteProgress(sender.id(), now);
  return absl::OkStatus();
}

Status JobControl::Commit(const proto::NodeId& sender, const proto::CommitProgressRequest& request,
                          std::span<const float> labels, std::span<const float> predictions,
                          absl::Time now, proto::CommitProgressReply* reply) {
  // A failed or stopped job takes nothing more; a finished one still
  // acknowledges a repeat of its last commits (below).
  if (progress_.phase() == JobPhase::kFailed) return JobOver();
  if (request.phase() == proto::EVAL) {
    if (labels.size() != predictions.size() ||
        labels.size() + request.malformed() != request.lines()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval commit carries ", labels.size(), " labels and ", predictions.size(),
                       " predictions for ", request.lines(), " lines (", request.malformed(),
                       " malformed)"));
    }
    // The metrics sort by prediction: NaN would break them, not just skew.
    for (size_t i = 0; i < labels.size(); ++i) {
      if (std::isnan(predictions[i])) {
        // The model itself is broken: no evaluation of it may stand.
        RETURN_IF_ERROR(membership_.LiveWorker(sender, recovery_.why(), now).status());
        StopDiverged(absl::StrCat("the model diverged: worker[", sender.id(),
                                  "] predicted NaN for the evaluation (shard ", request.shard_id(),
                                  ", record ", i, " of the commit)"),
                     now);
        return JobOver();
      }
      if (!(predictions[i] >= 0.0f && predictions[i] <= 1.0f) || !std::isfinite(labels[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "eval commit record ", i, " has prediction ", predictions[i], " and label ", labels[i],
            "; predictions must be probabilities in [0, 1], labels finite"));
      }
    }
  }
  if (request.malformed() > request.lines()) {
    return absl::InvalidArgumentError("more malformed lines than lines");
  }
  RETURN_IF_ERROR(membership_.LiveWorker(sender, recovery_.why(), now).status());
  if (receipt_key_ != nullptr) {
    if (Status proof = CheckWorkProof(*receipt_key_, sender.id(), request); !proof.ok()) {
      // Its shards go to others once every server refuses it.
      progress_.AddRetrained(membership_.FenceAlive(
          sender.id(), now, absl::StrCat("its work is not proven: ", proof.message())));
      return membership_.LiveWorker(sender, recovery_.why(), now).status();
    }
  }
  if (request.phase() == proto::TRAIN) {
    if (std::optional<std::string> diverged = progress_.NonFiniteLoss(sender.id(), request)) {
      StopDiverged(*diverged, now);
      return JobOver();
    }
  }
  ASSIGN_OR_RETURN(TrainingProgress::Committed committed,
                   progress_.Commit(sender.id(), request, labels, predictions));
  reply->set_applied(committed.applied);
  if (!committed.current_pass) return absl::OkStatus();
  if (std::optional<uint64_t> round = checkpoints_.round_id(); round.has_value()) {
    reply->set_pause_for_checkpoint(*round);
  }
  if (std::optional<uint64_t> split = progress_.SplitRequestedOf(sender.id()); split) {
    reply->set_split_shard(*split);
  }
  if (!committed.applied) return absl::OkStatus();
  membership_.NoteProgress(sender.id(), now, committed.records_trained);
  if (std::optional<std::string> diverged = progress_.Diverging()) {
    StopDiverged(absl::StrCat(*diverged, "; first seen in worker[", sender.id(), "]'s commit"),
                 now);
    return absl::OkStatus();
  }
  if (progress_.LossPastFactor()) {
    checkpoints_.AbandonPausing("the recent loss is past job.divergence_factor", now);
  }
  if (progress_.AdvanceIfPassDone() == TrainingProgress::PassEnd::kFinished) PassesDone(now);
  return absl::OkStatus();
}

Status JobControl::RefuseEvaluation(const proto::NodeId& sender, const std::string& why,
                                    absl::Time now) {
  const std::string fenced_why =
      absl::StrCat("the master's check of ", why,
                   " (a worker of another eps build, or a data file changed since the scan?)");
  progress_.AddRetrained(membership_.FenceAlive(sender.id(), now, fenced_why));
  if (progress_.phase() == JobPhase::kEvaluating && progress_.EvaluatedBy(sender.id())) {
    const std::string restart =
        absl::StrCat("worker[", sender.id(), "] evaluated falsely, and some of its evaluation was "
                     "taken before");
    // The shards of the pass in progress go away with it: their holders
    // register again and take the new pass's.
    progress_.AddRetrained(membership_.FenceAllAlive(now, restart, /*tell_why=*/true));
    progress_.RestartEvaluation(restart);
  }
  return membership_.LiveWorker(sender, recovery_.why(), now).status();
}

Status JobControl::SplitShard(const proto::NodeId& sender, const proto::SplitShardRequest& request,
                              absl::Time now, proto::SplitShardReply* reply) {
  RETURN_IF_ERROR(membership_.LiveWorker(sender, recovery_.why(), now).status());
  ASSIGN_OR_RETURN(TrainingProgress::Split split, progress_.SplitShard(sender.id(), request));
  reply->set_accepted(split.accepted);
  if (split.accepted) reply->set_new_shard_id(split.new_shard);
  return absl::OkStatus();
}

StatusOr<std::optional<TrainingProgress::UnreadRange>> JobControl::UnreadableShard(
    const proto::NodeId& sender, const proto::ShardUnreadableRequest& request, absl::Time now,
    proto::ShardUnreadableReply* reply) {
  RETURN_IF_ERROR(membership_.LiveWorker(sender, recovery_.why(), now).status());
  if (over()) return JobOver();
  ASSIGN_OR_RETURN(std::optional<TrainingProgress::UnreadRange> range,
                   progress_.Unread(sender.id(), request));
  if (!range.has_value()) reply->set_skipped(true);
  return range;
}

Status JobControl::ShardUnreadable(const proto::NodeId& sender,
                                   const proto::ShardUnreadableRequest& request,
                                   const TrainingProgress::UnreadRange& range,
                                   const Status& readable, absl::Time now,
                                   proto::ShardUnreadableReply* reply) {
  // The state may have moved while the master read the file.
  ASSIGN_OR_RETURN(std::optional<TrainingProgress::UnreadRange> still,
                   UnreadableShard(sender, request, now, reply));
  if (!still.has_value()) return absl::OkStatus();
  const std::string lines =
      absl::StrCat("lines ", range.first_line, "-", range.first_line + range.lines - 1);
  if (readable.ok()) {
    LOG(WARNING) << "worker[" << sender.id() << "] cannot read " << range.path << " (" << lines
                 << "): " << request.error() << "; the master can: the worker's access is broken";
    return absl::FailedPreconditionError(absl::StrCat(
        "the master reads ", range.path, " (", lines, ") fine, but this worker cannot (",
        request.error(), "): check this machine's access to the data"));
  }
  const std::string reason(readable.message());
  if (job_.data.on_unreadable == "skip") {
    RETURN_IF_ERROR(progress_.SkipUnread(sender.id(), request, reason));
    reply->set_skipped(true);
    if (progress_.AdvanceIfPassDone() == TrainingProgress::PassEnd::kFinished) PassesDone(now);
    return absl::OkStatus();
  }
  Stop(absl::StrCat("data file ", range.path, " cannot be read (", reason, "; ", lines,
                    request.phase() == proto::EVAL
                        ? std::string(" of the evaluation")
                        : absl::StrCat(" in epoch ", request.epoch() + 1),
                    ", first seen by worker[", sender.id(), "]: ", request.error(),
                    "); restore it and run eps-master --resume, or set data.on_unreadable = skip "
                    "to train without it"),
       now);
  return JobOver();
}

Status JobControl::Deregister(const proto::NodeId& sender,
                              const proto::DeregisterRequest& request) {
  if (sender.role() == proto::ROLE_SERVER) {
    // Both checked always: a server that does not say which slot and which
    // process it is drains nothing (any holder of the server key could
    // name a slot).
    if (!request.has_server_id() || request.server_id() != sender.id()) {
      ++deregisters_refused_;
      return absl::PermissionDeniedError(absl::StrCat(
          "a DEREGISTER from ps[", sender.id(), "] names ",
          request.has_server_id() ? absl::StrCat("slot ", request.server_id()) : "no slot",
          ": a server asks to drain only its own slot"));
    }
    const std::string& endpoint = request.endpoint();
    if (endpoint.empty()) {
      ++deregisters_refused_;
      return absl::InvalidArgumentError(absl::StrCat(
          "a DEREGISTER from ps[", sender.id(), "] names no endpoint: nothing drained"));
    }
    const ServerEntry* server = membership_.server(sender.id());
    if (server != nullptr && endpoint != server->endpoint) {
      ++deregisters_refused_;
      return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                             absl::StrCat("ps[", sender.id(), "] is now served at ",
                                          server->endpoint, "; this server at ", endpoint,
                                          " was replaced: nothing of it to drain"),
                             proto::FENCED);
    }
    // A server asked to stop (SIGTERM): drained, then told to exit.
    return Drain(sender.id()).status();
  }
  if (sender.role() != proto::ROLE_WORKER) {
    return absl::InvalidArgumentError("only workers and servers deregister");
  }
  ASSIGN_OR_RETURN(bool left, membership_.Leave(sender.id()));
  if (left) progress_.ReleaseShardsOf(sender.id(), "left", std::nullopt);
  return absl::OkStatus();
}

// --- The job loop ---------------------------------------------------------------

void JobControl::ExpireLeases(absl::Time now) {
  // Leases are judged on when messages arrived: while a request that came
  // at T still waits for a handler, no lease runs out after T (so one
  // peer's slow or huge messages cannot make another's expire), but for at
  // most one lease (a request that never ends must not stop the clock).
  absl::Time judged = now;
  if (unhandled_since_.has_value() && *unhandled_since_ < now) {
    judged = std::max(*unhandled_since_, now - absl::Milliseconds(job_.master.lease_ms));
  }
  Membership::Expired expired = membership_.ExpireLeases(judged);
  for (const auto& [worker, retrained] : expired.workers) {
    // What it pushed but never committed is trained again by others.
    progress_.AddRetrained(retrained);
    if (!over()) membership_.Fence(worker, now, "lease expired");
  }
  for (uint32_t server : expired.servers) {
    // A drained server holds nothing a recovery would need.
    if (RetireIfDrained(server, now)) continue;
    StartRecovery(server, absl::StrCat("ps[", server, "] stopped heartbeating"), now);
  }
}

void JobControl::EnforceBounds(absl::Time now) {
  if (over()) return;
  const JobPhase phase = progress_.phase();
  WaitBounds::Facts facts{
      .scanning = phase == JobPhase::kScanning,
      .training = phase == JobPhase::kTraining || phase == JobPhase::kEvaluating,
      .recovering = recovery_.active(),
      .export_due = export_due_,
      .servers_registered = membership_.servers().size(),
      .servers_alive = membership_.alive_servers(),
      .all_servers_alive = membership_.all_servers_alive(),
      .workers_alive = membership_.alive_workers(),
      .workers_coming = may_launch_ != nullptr && may_launch_(),
      .holders = {},
      .checkpoint_failures = checkpoints_.consecutive_failures(),
      .last_checkpoint_failure = checkpoints_.last_failure()};
  for (uint32_t holder : progress_.HoldersOfShardsInProgress()) {
    auto it = membership_.workers().find(holder);
    if (it == membership_.workers().end() || it->second.state != PeerState::kAlive) continue;
    facts.holders.emplace_back(holder, std::max(it->second.last_progress, it->second.held_until));
  }
  WaitBounds::Verdict verdict = bounds_.Check(facts, now);
  for (const auto& [holder, why] : verdict.fence) {
    progress_.AddRetrained(membership_.FenceAlive(holder, now, why));
  }
  if (!verdict.fail.empty()) Fail(verdict.fail, /*stopped=*/false, now);
  if (!verdict.stop.empty()) Stop(verdict.stop, now);
}

std::vector<std::string> JobControl::Waits(absl::Time now) const {
  std::vector<std::string> waits;
  if (over()) return waits;
  if (std::optional<std::string> servers = bounds_.ServersWait(membership_.servers().size(), now)) {
    waits.push_back(*std::move(servers));
  }
  if (recovery_.active()) {
    const std::vector<uint32_t> missing = membership_.MissingServers();
    waits.push_back(absl::StrCat(
        "recovery (", recovery_.why(), ") for ", FormatSeconds(now - recovery_.started()), ": ",
        !missing.empty() ? absl::StrCat("ps[", absl::StrJoin(missing, "], ps["), "] to come back")
        : membership_.fencing() ? std::string("the servers to acknowledge the fence list")
                                : std::string("the servers to restore"),
        " (master.recovery_timeout_s = ", job_.master.recovery_timeout_s, " s)"));
  }
  if (const std::optional<uint64_t> round = checkpoints_.round_id(); round.has_value()) {
    waits.push_back(
        absl::StrCat("checkpoint ", *round, ": ",
                     checkpoints_.writing() ? "the servers to write it" : "the workers to pause"));
  }
  if (import_due_) {
    waits.push_back(absl::StrCat(
        "the servers to load the model in ", job_.job.init_from, " (attempt ",
        import_attempts_ + 1, " of ", kMaxExportAttempts,
        import_error_.empty() ? std::string() : absl::StrCat("; the last failed: ", import_error_),
        ")"));
  }
  if (export_due_) {
    waits.push_back(absl::StrCat(
        "the servers to export the model to ", job_.job.export_dir, " for ",
        FormatSeconds(now - export_due_since_), " (attempt ", export_attempts_ + 1, " of ",
        kMaxExportAttempts,
        export_error_.empty() ? std::string() : absl::StrCat("; the last failed: ", export_error_),
        ")"));
  }
  if (std::optional<std::string> workers = bounds_.WorkersWait(now)) {
    waits.push_back(*std::move(workers));
  }
  return waits;
}

void JobControl::Tick(absl::Time now) {
  ExpireLeases(now);
  for (uint32_t slot : drains_.drained()) RetireIfDrained(slot, now);
  EnforceBounds(now);
  SampleProgress(now);
  // A master restarted while the export was due finds the last pass done
  // (its commit and the export's start are one step): it exports again.
  if (!job_.job.export_dir.empty() && !export_due_ && !over() && !recovery_.active() &&
      progress_.AdvanceIfPassDone() == TrainingProgress::PassEnd::kFinished) {
    PassesDone(now);
  }
  // A model whose loss is past the divergence factor is not saved: the
  // checkpoint to resume a diverged job from is one taken before.
  checkpoints_.MaybeStart(now, !recovery_.active() && !over() && !export_due_ &&
                                   progress_.phase() == JobPhase::kTraining &&
                                   membership_.placed() && !progress_.LossPastFactor() &&
                                   !moves_.active().has_value());
}

bool JobControl::Done(absl::Time now) const {
  return over() && (membership_.EveryoneTold() || now >= done_at_);
}

std::optional<double> JobControl::EtaSeconds() const {
  const std::optional<double> left = progress_.JobLinesLeft();
  if (!left.has_value() || meter_.records_per_s() <= 0) return std::nullopt;
  return *left / meter_.records_per_s();
}

void JobControl::SampleProgress(absl::Time now) {
  // Every commit applied (training and evaluation; a rollback undoes none).
  if (!meter_.Due(now, progress_.records_committed_total()) || over()) return;
  const size_t alive_workers = membership_.alive_workers();
  const double fraction = progress_.tracker() ? progress_.PassFraction() : 0.0;
  const std::optional<double> eta = EtaSeconds();
  const std::optional<double> loss = progress_.RunningLoss();
  const JobPhase phase = progress_.phase();
  // The history behind the status page's chart and scripts/plot_run.py.
  json sample = {{"time", absl::ToDoubleSeconds(now - absl::UnixEpoch())},
                 {"elapsed_s", absl::ToDoubleSeconds(now - started_)},
                 {"phase", JobPhaseName(phase)},
                 {"epoch", progress_.epoch() + 1},
                 {"records_trained", progress_.records_trained()},
                 {"records_per_s", meter_.records_per_s()},
                 {"train_loss", NullableNumber(loss)},
                 {"workers", alive_workers},
                 {"pass_fraction", fraction},
                 {"eta_s", NullableNumber(eta)}};
  meter_.Keep(sample);
  events_->Record("progress", std::move(sample));
  // A recovery says what it waits for itself (NextRestore).
  if (!recovery_.active()) {
    for (const std::string& wait : Waits(now)) LOG(INFO) << "waiting for " << wait;
  }
  const ShardTracker* tracker = progress_.tracker();
  if (tracker == nullptr) {
    LOG(INFO) << JobPhaseName(phase) << ": " << membership_.servers().size() << "/"
              << job_.ps.num_servers << " server(s), " << alive_workers << " worker(s)";
    return;
  }
  LOG(INFO) << (phase == JobPhase::kEvaluating
                    ? std::string("eval")
                    : absl::StrCat("epoch ", progress_.epoch() + 1, "/", job_.job.epochs))
            << ": " << absl::StrFormat("%.1f", 100 * fraction) << "% (" << tracker->done() << "/"
            << tracker->num_shards() << " shards done, " << tracker->doing()
            << " in progress), " << absl::StrFormat("%.0f", meter_.records_per_s())
            << " records/s, " << alive_workers << " worker(s), loss "
            << (loss ? absl::StrFormat("%.5f", *loss) : std::string("n/a")) << ", ETA "
            << (eta ? absl::FormatDuration(absl::Seconds(static_cast<int64_t>(*eta)))
                    : std::string("?"));
}

// --- Persistence ----------------------------------------------------------------

proto::MasterRecord JobControl::SaveRecord() const {
  proto::MasterRecord record;
  record.set_format_version(kMasterRecordFormat);
  record.set_config_fingerprint(fingerprint_);
  record.set_job_id(job_spec_.job_id());
  membership_.SaveTo(&record);
  drains_.SaveTo(&record);
  record.set_balancing_servers(balancing_);
  progress_.SaveTo(&record);
  checkpoints_.SaveTo(&record);
  recovery_.SaveTo(&record);
  return record;
}

bool JobControl::TakeChanges(StateUpdate* update) {
  if (std::optional<proto::CheckpointRecord> start = checkpoints_.TakePendingRecord(); start) {
    update->PutCheckpoint(*start);
  }
  progress_.TakeChanges(update);
  // The record is compared whole with the last one taken, so no change can
  // be forgotten: there is no dirty flag to set.
  const proto::MasterRecord record = SaveRecord();
  std::string serialized = record.SerializeAsString();
  if (serialized != saved_record_) {
    update->PutMaster(record);
    saved_record_ = std::move(serialized);
  }
  const bool ended = ended_;
  ended_ = false;
  return ended;
}

}  // namespace eps
