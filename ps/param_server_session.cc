// ParamServer::Impl's life in the job: its member session with the master
// (registration, heartbeats with its stats, following the cluster map),
// taking its slot back when the master stopped counting it (Rejoin), and
// Wait, which runs the rejoins until the server stops.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "cluster/job_options.h"
#include "cluster/job_progress.h"
#include "cluster/member_session.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "ps/param_server_impl.h"
#include "rpc/message.h"
#include "rpc/net.h"
#include "rpc/rpc_channel.h"

namespace eps {

// How often a server leaving asks the master again to drain it (a drain the
// master gave up is planned again; asking is harmless).
constexpr absl::Duration kLeaveAskEvery = absl::Seconds(30);

std::unique_ptr<MemberSession> ParamServer::Impl::NewSession() {
  MemberSessionOptions session_options;
  session_options.master = options_.master;
  session_options.role = proto::ROLE_SERVER;
  session_options.master_wait = options_.master_wait;
  return std::make_unique<MemberSession>(&factory_, session_options);
}

Status ParamServer::Impl::CheckWorkerCredentials(const proto::RegisterServerReply& reply) {
  if (!options_.security.curve) return absl::OkStatus();
  StatusOr<WorkerCredentials> credentials = WorkerCredentials::FromKey(reply.worker_credential_key());
  if (!credentials.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the master's registration answer carries no valid key of workers' credentials (",
        credentials.status().message(), "): are the master and this server the same eps build?"));
  }
  if (!credentials->VerifyServer(reply.server_id(), reply.slot_credential())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the master's registration answer carries no valid credential of ps[",
                     reply.server_id(), "]: are the master and this server the same eps build?"));
  }
  gate_.SetReceiptKey(*credentials);
  rpc_->SetWorkerCredentials(*std::move(credentials));
  return absl::OkStatus();
}

proto::NodeId ParamServer::Impl::Self() const {
  proto::NodeId self;
  self.set_role(proto::ROLE_SERVER);
  self.set_id(id_);
  self.set_credential(credential_);
  return self;
}

Message ParamServer::Impl::RegisterRequest(bool rejoin) const {
  Message request;
  request.header().set_method(proto::REGISTER_SERVER);
  proto::RegisterServerRequest* body = request.header().mutable_register_server_request();
  body->set_endpoint(endpoint_);
  body->set_hostname(Hostname());
  body->set_pid(static_cast<uint32_t>(getpid()));
  body->set_stored_job(storage_->stored_job());
  body->set_instance(instance_);
  if (rejoin) {
    // The slot this process holds (a memory-only server has no SERVER file).
    body->set_stored_server_id(id_);
    body->set_slot_credential(credential_);
    body->set_rejoin(true);
  } else if (const std::optional<uint32_t> stored = storage_->stored_server_id();
             stored.has_value()) {
    body->set_stored_server_id(*stored);
    body->set_slot_credential(storage_->stored_server_credential());
  }
  body->set_launch_id(options_.grant.id);
  body->set_launch_secret(options_.grant.secret);
  AddSharedOptions(options_.shared_options, body->mutable_job_options());
  return request;
}

void ParamServer::Impl::StartHeartbeats() {
  // A server never checks its lease (it pushes nothing); the master wait
  // stands in for it.
  session_->Start(Self(), options_.heartbeat, options_.master_wait, SessionHooks());
}

Status ParamServer::Impl::Rejoin(const Status& why) {
  if (rejoined_ && !answered_.load()) {
    // It took the slot back and was refused again before any heartbeat
    // went through: registering once more would only loop.
    return absl::FailedPreconditionError(absl::StrCat(
        "the master refuses ps[", id_, "]'s heartbeats right after it took its slot back: ",
        why.message()));
  }
  LOG(WARNING) << "the master no longer counts this server (" << why.message()
               << "); registering again as ps[" << id_ << "]";
  session_->Stop();
  rejoined_ = true;
  answered_.store(false);
  {
    // Request threads poke the session (HeartbeatNow) under mu_.
    std::unique_ptr<MemberSession> fresh = NewSession();
    absl::MutexLock lock(&mu_);
    session_.swap(fresh);
  }
  StatusOr<Message> reply = session_->Register(RegisterRequest(/*rejoin=*/true));
  if (ReasonOf(reply.status()) == proto::JOB_OVER) {
    LOG(INFO) << "the job is over; exiting";
    Stop(absl::OkStatus());
    return absl::OkStatus();
  }
  if (!reply.ok()) {
    return Annotate(reply.status(), absl::StrCat("ps[", id_, "] cannot take its slot back"));
  }
  const uint32_t slot = reply->header().register_server_reply().server_id();
  RETURN_IF_ERROR(CheckWorkerCredentials(reply->header().register_server_reply()));
  if (slot != id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ps[", id_, "] registered again but the master answered slot ", slot));
  }
  LOG(INFO) << "back in the job as ps[" << id_ << "]: the master restores what it needs";
  StartHeartbeats();
  return absl::OkStatus();
}

Status ParamServer::Impl::AskToLeave() {
  RpcChannel master(&factory_, Self());
  Message request;
  request.header().set_method(proto::DEREGISTER);
  proto::DeregisterRequest* body = request.header().mutable_deregister_request();
  body->set_endpoint(endpoint_);
  body->set_server_id(id_);
  CallOptions call;
  // The master answers at once (asking again is harmless); one that does
  // not within a few seconds is gone or stopping.
  call.attempt_timeout = std::min(options_.rpc_timeout, absl::Seconds(2));
  call.max_attempts = 3;
  return master.Call(options_.master, std::move(request), call).status();
}

void ParamServer::Impl::Leave(bool again) {
  if (!again) {
    bool asked_before = false;
    {
      absl::MutexLock lock(&mu_);
      asked_before = leave_deadline_ != absl::InfiniteFuture();
      if (asked_before) leave_deadline_ = leave_ask_at_ = absl::InfiniteFuture();
    }
    if (asked_before) {
      LOG(WARNING) << "asked again to stop: exiting now, before the drain is done (the master "
                   << "counts ps[" << id_ << "] as lost and restores its partitions)";
      Stop(absl::OkStatus());
      return;
    }
  }
  const Status asked = AskToLeave();
  // Asked again (the master may have given the drain up): only a refusal
  // ends the wait; a master away for a moment is asked again later.
  if (!asked.ok() && (!again || absl::IsFailedPrecondition(asked) || absl::IsNotFound(asked))) {
    LOG(WARNING) << "the master cannot drain ps[" << id_ << "] (" << asked.message()
                 << "); exiting now";
    Stop(absl::OkStatus());
    return;
  }
  if (!again) {
    LOG(INFO) << "leaving the job: the master moves ps[" << id_ << "]'s partitions to the "
              << "other servers, and this server exits once it has (at most "
              << "ps.leave_timeout_s, " << absl::FormatDuration(options_.leave_timeout)
              << "); signal again to exit now";
  }
  absl::MutexLock lock(&mu_);
  if (!again) leave_deadline_ = absl::Now() + options_.leave_timeout;
  leave_ask_at_ = absl::Now() + kLeaveAskEvery;
}

Status ParamServer::Impl::Wait() {
  if (!started_) return absl::FailedPreconditionError("Wait without a successful Start");
  while (true) {
    Status why;
    bool leave = false;
    bool ask_again = false;
    bool leaving = false;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || rejoin_ || leave_requested_;
      };
      const absl::Time until = std::min(leave_deadline_, leave_ask_at_);
      if (!mu_.AwaitWithDeadline(absl::Condition(&wake), until)) {
        if (absl::Now() < leave_deadline_) {
          ask_again = true;
        } else {
          leave_deadline_ = absl::InfiniteFuture();
          leave_ask_at_ = absl::InfiniteFuture();
          why = absl::DeadlineExceededError(absl::StrCat(
              "the master did not drain ps[", id_, "] within ps.leave_timeout_s (",
              absl::FormatDuration(options_.leave_timeout),
              "): exiting; the master counts it as lost and restores its partitions"));
        }
      } else if (stop_) {
        break;
      } else if (leave_requested_) {
        leave_requested_ = false;
        leave = true;
      } else {
        rejoin_ = false;
        why = rejoin_why_;
      }
      leaving = leave_deadline_ != absl::InfiniteFuture();
    }
    if (absl::IsDeadlineExceeded(why)) {
      Stop(why);
    } else if (leave || ask_again) {
      Leave(/*again=*/ask_again);
    } else if (Status rejoined = Rejoin(why); !rejoined.ok()) {
      if (leaving && absl::IsFailedPrecondition(rejoined)) {
        // Drained and retired while it was cut off: it has left.
        LOG(INFO) << "ps[" << id_ << "] has left the job (" << rejoined.message() << ")";
        Stop(absl::OkStatus());
      } else {
        Stop(rejoined);
      }
    }
  }
  session_->Stop();
  if (!summarized_) {
    summarized_ = true;
    const proto::ServerStats stats = Stats();
    LOG(INFO) << "summary: " << stats.rows() << " rows, " << stats.pulls() << " pulls ("
              << rows_pulled_.load() << " rows), " << stats.pushes() << " pushes ("
              << rows_pushed_.load() << " rows), " << stats.pushes_fenced() << " pushes fenced, "
              << stats.pushes_deduplicated() << " pushes deduplicated";
  }
  absl::MutexLock lock(&mu_);
  return stop_reason_;
}

MemberSession::Hooks ParamServer::Impl::SessionHooks() {
  MemberSession::Hooks hooks;
  hooks.fill_heartbeat = [this](proto::HeartbeatRequest* request) {
    *request->mutable_server() = Stats();
    request->set_endpoint(endpoint_);
    const std::string write_error = storage_->write_error();
    if (!write_error.empty() && !write_error_reported_) {
      write_error_reported_ = true;
      LOG(ERROR) << "cannot write: " << write_error << "; telling the master";
    }
    request->set_storage_error(write_error);
  };
  hooks.on_reply = [this](const proto::HeartbeatReply& body) {
    answered_.store(true);
    OnHeartbeatReply(body);
  };
  // The first heartbeat's reply brings the map: PULL and PUSH are served
  // from then on.
  hooks.follow_map = [this](uint64_t) { return RefreshClusterMap(); };
  hooks.on_end = [this](MemberSession::State state, const Status& status) {
    if (state == MemberSession::State::kFenced) {
      // Cut off past its lease (or replaced): Wait registers again, and the
      // master says whether the slot is still this process's.
      absl::MutexLock lock(&mu_);
      rejoin_ = true;
      rejoin_why_ = status;
    } else {
      absl::Duration linger;
      {
        absl::MutexLock lock(&mu_);
        linger = retire_linger_;
      }
      // Drained and told to go: it serves its redirects a moment longer.
      absl::SleepFor(linger);
      Stop(status);  // OK when the job is over
    }
  };
  return hooks;
}

Status ParamServer::Impl::RefreshClusterMap() {
  Message request;
  request.header().set_method(proto::GET_CLUSTER_MAP);
  request.header().mutable_get_cluster_map_request();
  CallOptions call;
  call.attempt_timeout = options_.rpc_timeout;
  call.max_attempts = 1;
  ASSIGN_OR_RETURN(Message reply, session_->Call(std::move(request), call));
  ASSIGN_OR_RETURN(Placement placement,
                   Placement::FromProto(reply.header().get_cluster_map_reply().map()));
  std::vector<bool> owned(placement.num_partitions(), false);
  for (uint32_t p : placement.PartitionsOf(id_)) owned[p] = true;
  const size_t count = placement.PartitionsOf(id_).size();
  const uint64_t version = placement.version();
  {
    absl::MutexLock lock(&mu_);
    // A partition handed off stays refused until a map newer than its move.
    std::erase_if(handed_off_, [&](const auto& handed) { return version > handed.second; });
    for (const auto& [p, handed] : handed_off_) {
      if (p < owned.size()) owned[p] = false;
    }
    LOG(INFO) << "cluster map v" << version << ": " << count << " of "
              << placement.num_partitions() << " partitions are here";
    placement_ = std::make_shared<const Placement>(std::move(placement));
    owned_ = std::move(owned);
  }
  // Then (a first page checks the map it registers under, so none can
  // register for an older one from now on): a newer map ends every move of
  // a partition away from here, committed (the partition is another's now)
  // or given up (it is still ours)...
  {
    absl::MutexLock moves_lock(&moves_mu_);
    std::erase_if(outgoing_, [&](const auto& move) { return version > move.second.map_version; });
    PublishNoting();
  }
  // ...and every copy into here.
  absl::MutexLock import_lock(&import_mu_);
  std::erase_if(importing_, [&](const auto& copy) { return version > copy.second; });
  return absl::OkStatus();
}

proto::ServerStats ParamServer::Impl::Stats() const {
  proto::ServerStats stats;
  const StorageStats storage = storage_->stats();
  stats.set_rows(storage.rows_in_memory);
  stats.set_bytes(storage.memory_bytes);
  stats.set_rows_on_disk(storage.rows_on_disk);
  stats.set_disk_bytes(storage.disk_bytes);
  stats.set_store_memory_bytes(storage.store_memory_bytes);
  stats.set_hits(storage.hits);
  stats.set_misses(storage.misses);
  stats.set_evictions(storage.evictions);
  stats.set_last_flush_ms(storage.last_flush_ms);
  stats.set_memory_budget_bytes(options_.storage.memory_budget_mb << 20);
  stats.set_pulls(pulls_.load());
  stats.set_pushes(pushes_.load());
  stats.set_pushes_fenced(pushes_fenced_.load());
  stats.set_pushes_deduplicated(pushes_deduplicated_.load());
  stats.set_updates_refused(storage.updates_refused);
  stats.set_rows_admitted(storage.rows_admitted);
  stats.set_updates_rejected(storage.updates_rejected);
  stats.set_admission_candidates(storage.admission_candidates);
  stats.set_rows_expired(storage.rows_expired);
  for (const std::unique_ptr<DenseBatch>& batch : global_batches_) {
    if (batch == nullptr) continue;
    absl::MutexLock lock(&batch->mu);
    const GlobalBatch::Stats& global = batch->batch.stats();
    stats.set_global_steps(stats.global_steps() + global.steps);
    stats.set_global_step_records(stats.global_step_records() + global.step_records);
    stats.set_global_pushes_decayed(stats.global_pushes_decayed() + global.pushes_decayed);
    stats.set_global_pushes_dropped(stats.global_pushes_dropped() + global.pushes_dropped);
    stats.set_global_records_dropped(stats.global_records_dropped() + global.records_dropped);
    stats.set_global_reads_refused(stats.global_reads_refused() + global.reads_refused);
    stats.set_global_reservations_expired(stats.global_reservations_expired() +
                                          global.reservations_expired);
  }
  if (rpc_ != nullptr) {
    stats.set_requests_refused(rpc_->refused() + fetches_refused_.load());
    stats.set_requests_unauthenticated(rpc_->unauthenticated() + factory_.handshakes_refused());
    stats.set_requests_limited(rpc_->limited() + rows_limited_.load());
  }
  HistogramToProto(pull_latency_.Snapshot(), stats.mutable_pull_latency());
  HistogramToProto(push_latency_.Snapshot(), stats.mutable_push_latency());
  HistogramToProto(dense_staleness_.Snapshot(), stats.mutable_dense_staleness());
  return stats;
}

void ParamServer::Impl::OnHeartbeatReply(const proto::HeartbeatReply& body) {
  {
    // Every reply says all the moves out of here there are (a move given
    // up or committed is in none after).
    absl::MutexLock lock(&mu_);
    moves_out_.clear();
    for (const proto::MoveNotice& notice : body.moves_out()) {
      moves_out_[notice.partition()] = notice;
    }
    ++replies_taken_;
  }
  if (body.shutdown()) {
    if (body.state() == proto::JOB_RUNNING) {
      // Told only once every live worker follows a map without this
      // server (Membership::RetiredServerMayGo); a call one started before
      // may still come, and is answered WRONG_OWNER (every partition was
      // handed off) instead of waiting on a server that is gone.
      const absl::Duration linger = std::max(absl::Seconds(3), 4 * options_.heartbeat);
      LOG(INFO) << "the master has drained ps[" << id_ << "]: it leaves the job; exiting in "
                << absl::FormatDuration(linger);
      absl::MutexLock lock(&mu_);
      retire_linger_ = linger;
    } else {
      LOG(INFO) << "the master says the job is "
                << (body.state() == proto::JOB_FINISHED ? "finished" : "over") << "; exiting";
    }
    return;
  }
  if (body.has_training_passes_done()) storage_->NotePassesDone(body.training_passes_done());
  const absl::Time now = absl::Now();
  if (now - last_progress_ < options_.progress_interval) return;
  const double seconds = absl::ToDoubleSeconds(now - last_progress_);
  const uint64_t pulled = rows_pulled_.load();
  const uint64_t pushed = rows_pushed_.load();
  const proto::ServerStats stats = Stats();
  LOG(INFO) << stats.rows() << " rows (" << stats.bytes() / (1 << 20) << " MiB), "
            << absl::StrFormat("%.0f", (pulled - rows_pulled_before_) / seconds)
            << " rows pulled/s, "
            << absl::StrFormat("%.0f", (pushed - rows_pushed_before_) / seconds)
            << " rows pushed/s; " << JobProgress(body);
  rows_pulled_before_ = pulled;
  rows_pushed_before_ = pushed;
  last_progress_ = now;
}

}  // namespace eps
