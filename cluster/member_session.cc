#include "cluster/member_session.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "core/memory.h"
#include "rpc/net.h"

namespace eps {

namespace {

// How often a wait for a call checks whether the session was stopped.
constexpr absl::Duration kStopCheckInterval = absl::Milliseconds(20);
// Between the attempts of a call the master answered SLOW_DOWN.
constexpr absl::Duration kSlowDownPause = absl::Milliseconds(500);

bool IsFenced(const Status& status) { return ReasonOf(status) == proto::FENCED; }

proto::NodeId RoleOnly(proto::Role role) {
  proto::NodeId node;
  node.set_role(role);
  return node;
}

}  // namespace

Status MemberSessionOptions::Validate() const {
  RETURN_IF_ERROR_CTX(ParseTcpEndpoint(master).status(), "the master's endpoint");
  if (role != proto::ROLE_SERVER && role != proto::ROLE_WORKER) {
    return absl::InvalidArgumentError(
        absl::StrCat("a member session is a server's or a worker's, not ", proto::Role_Name(role)));
  }
  if (master_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the master wait must be >= 0");
  }
  if (register_attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the registration attempt timeout must be > 0");
  }
  if (clock == nullptr) return absl::InvalidArgumentError("a member session needs a clock");
  return absl::OkStatus();
}

MemberSession::MemberSession(SocketFactory* factory, const MemberSessionOptions& options)
    : options_(options),
      curve_(factory->options().security.curve),
      channel_(factory, RoleOnly(options.role)) {}

MemberSession::~MemberSession() { Stop(); }

std::string MemberSession::Name() const {
  return options_.role == proto::ROLE_SERVER ? "server" : "worker";
}

StatusOr<Message> MemberSession::Register(Message request) {
  RETURN_IF_ERROR(options_.Validate());
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("stopped before registering");
    CHECK(state_ == State::kNew) << "Register twice";
    // The master may answer any attempt: its lease runs from no earlier
    // than the first.
    lease_start_ = options_.clock->Now();
  }
  CallOptions call;
  call.attempt_timeout = options_.register_attempt_timeout;
  call.max_attempts = static_cast<int>(
      std::max<int64_t>(1, options_.master_wait / options_.register_attempt_timeout));
  StatusOr<Message> reply = AwaitCall(channel_.Start(options_.master, std::move(request), call));
  if (!reply.ok()) {
    // Under CURVE a master that does not trust this process's key stays
    // as silent as one that is not there.
    const std::string hint =
        curve_ && absl::IsDeadlineExceeded(reply.status())
            ? " (or it refuses this process's key: are the keys in security.keys_dir this "
              "job's?)"
            : "";
    return Annotate(reply.status(),
                    absl::StrCat("cannot register with the master at ", options_.master, hint));
  }
  absl::MutexLock lock(&mu_);
  if (state_ == State::kNew) state_ = State::kRegistered;
  return reply;
}

void MemberSession::Start(const proto::NodeId& self, absl::Duration heartbeat, absl::Duration lease,
                          Hooks hooks) {
  CHECK(heartbeat > absl::ZeroDuration() && lease > absl::ZeroDuration());
  CHECK(hooks.fill_heartbeat != nullptr);
  absl::MutexLock thread_lock(&thread_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kStopped) return;  // stopped while registering
    CHECK(state_ == State::kRegistered) << "Start without a registration";
    state_ = State::kRunning;
    lease_ = lease;
  }
  // The heartbeat thread starts after these: it sees them without a lock.
  channel_.set_self(self);
  heartbeat_ = heartbeat;
  hooks_ = std::move(hooks);
  thread_ = std::thread([this] { HeartbeatLoop(); });
}

void MemberSession::HeartbeatNow() {
  absl::MutexLock lock(&mu_);
  heartbeat_now_ = true;
}

Status MemberSession::CheckLease() const {
  absl::MutexLock lock(&mu_);
  const absl::Duration silent = options_.clock->Now() - lease_start_;
  if (silent < lease_) return absl::OkStatus();
  return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                         absl::StrCat("no heartbeat answered for ", absl::FormatDuration(silent),
                                      ", longer than the lease (", absl::FormatDuration(lease_),
                                      "): this ", Name(), " may be fenced"),
                         proto::FENCED);
}

StatusOr<Message> MemberSession::CallMaster(RpcChannel& channel,
                                            const std::function<Message()>& make,
                                            const CallOptions& options,
                                            const std::function<bool()>& give_up) const {
  const absl::Time deadline = absl::Now() + options_.master_wait;
  while (true) {
    StatusOr<Message> reply = channel.Call(options_.master, make(), options);
    const bool unanswered = absl::IsDeadlineExceeded(reply.status()) ||
                            (absl::IsUnavailable(reply.status()) &&
                             ReasonOf(reply.status()) == proto::REASON_UNSPECIFIED);
    // The master answered "not now" (it cannot check an evaluation while a
    // server does not answer): asked again after a pause, not at once.
    const bool slowed = ReasonOf(reply.status()) == proto::SLOW_DOWN;
    if ((!unanswered && !slowed) || absl::Now() >= deadline) return reply;
    if (slowed) absl::SleepFor(std::min(kSlowDownPause, deadline - absl::Now()));
    {
      absl::MutexLock lock(&mu_);
      if (Ended()) return reply;
    }
    if (give_up != nullptr && give_up()) return reply;
    VLOG(1) << "the master does not answer (" << reply.status() << "); trying again";
  }
}

StatusOr<Message> MemberSession::Call(Message request, const CallOptions& options) {
  return AwaitCall(channel_.Start(options_.master, std::move(request), options));
}

StatusOr<Message> MemberSession::AwaitCall(uint64_t id) {
  while (true) {
    std::optional<StatusOr<Message>> result =
        channel_.WaitUntil(id, absl::Now() + kStopCheckInterval);
    if (result.has_value()) return *std::move(result);
    absl::MutexLock lock(&mu_);
    if (stop_) {
      channel_.Cancel(id);
      return absl::CancelledError("the member session was stopped");
    }
  }
}

void MemberSession::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (!Ended()) state_ = State::kStopped;
  }
  absl::MutexLock thread_lock(&thread_mu_);
  if (thread_.joinable()) thread_.join();
}

MemberSession::State MemberSession::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

Status MemberSession::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

bool MemberSession::Ended() const {
  return state_ != State::kNew && state_ != State::kRegistered && state_ != State::kRunning;
}

bool MemberSession::End(State state, const Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (Ended()) return false;
    state_ = state;
    status_ = status;
  }
  if (hooks_.on_end != nullptr) hooks_.on_end(state, status);
  return true;
}

void MemberSession::HeartbeatLoop() {
  // The first heartbeat goes out at once: it brings the map version.
  for (bool first = true;; first = false) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Ended() || heartbeat_now_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), first ? absl::ZeroDuration() : heartbeat_);
      if (Ended()) return;
      heartbeat_now_ = false;
    }
    if (!Heartbeat()) return;
    // The heartbeat thread of every server and worker keeps their RSS to
    // what they use.
    TrimFreeMemory(absl::Now());
  }
}

bool MemberSession::Heartbeat() {
  Message request;
  request.header().set_method(proto::HEARTBEAT);
  hooks_.fill_heartbeat(request.header().mutable_heartbeat_request());
  request.header().mutable_heartbeat_request()->set_seq(++heartbeat_seq_);
  request.header().set_cluster_map_version(followed_map_version_);
  CallOptions call;
  call.attempt_timeout = std::max(heartbeat_, absl::Seconds(1));
  call.max_attempts = 1;
  const absl::Time sent = options_.clock->Now();
  StatusOr<Message> reply = Call(std::move(request), call);
  if (absl::IsCancelled(reply.status())) return false;  // stopped
  if (!reply.ok()) {
    if (IsFenced(reply.status())) {
      End(State::kFenced, reply.status());
      return false;
    }
    absl::Time lease_start;
    {
      absl::MutexLock lock(&mu_);
      lease_start = lease_start_;
    }
    if (options_.clock->Now() - lease_start > options_.master_wait) {
      End(State::kLostMaster,
          absl::UnavailableError(absl::StrCat("lost the master at ", options_.master, " for ",
                                              absl::FormatDuration(options_.master_wait), ": ",
                                              reply.status().message())));
      return false;
    }
    VLOG(1) << "heartbeat failed: " << reply.status();
    return true;
  }
  {
    absl::MutexLock lock(&mu_);
    lease_start_ = std::max(lease_start_, sent);
  }
  const proto::HeartbeatReply& body = reply->header().heartbeat_reply();
  if (body.shutdown()) {
    if (hooks_.on_reply != nullptr) hooks_.on_reply(body);
    End(State::kFinished, absl::OkStatus());
    return false;
  }
  const uint64_t version = body.cluster_map_version();
  if (version != 0 && version != followed_map_version_ && hooks_.follow_map != nullptr) {
    const Status followed = hooks_.follow_map(version);
    if (followed.ok()) {
      followed_map_version_ = version;
    } else if (!absl::IsCancelled(followed)) {
      LOG(WARNING) << "cannot follow cluster map v" << version << ": " << followed;
    }
  }
  if (hooks_.on_reply != nullptr) hooks_.on_reply(body);
  absl::MutexLock lock(&mu_);
  return !Ended();
}

}  // namespace eps
