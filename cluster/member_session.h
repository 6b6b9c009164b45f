// MemberSession: one registration of a cluster member (a parameter server or
// a worker) with the master, and everything that keeps it valid.
//
//   MemberSession session(&factory, options);
//   ASSIGN_OR_RETURN(Message reply, session.Register(std::move(register_request)));
//   ... read the id and the job from the reply ...
//   session.Start(self, heartbeat, lease, hooks);  // heartbeats from now on
//   ... RETURN_IF_ERROR(session.CheckLease()) before each push ...
//   session.Stop();
//
// The session owns:
//  - registration: the role's REGISTER_* request, each attempt given
//    register_attempt_timeout and resent on a fresh connection until
//    master_wait has passed (the master may still be starting);
//  - a heartbeat thread (started by Start, joined by Stop): the first
//    heartbeat at once, then one every heartbeat interval after the last
//    one finished, or at once after HeartbeatNow(). Each attempt may take
//    max(heartbeat, 1 s); it is not retried, the next heartbeat is;
//  - the lease: the master's lease on this member runs from no earlier
//    than when the last heartbeat it answered was sent (at first: when the
//    registration was sent). CheckLease() refuses (FENCED) once that is a
//    lease ago, and a member must then neither push nor commit;
//  - the end: a FENCED reply ends the session fenced; no heartbeat answered
//    for master_wait (counted from the same instant as the lease) ends it
//    with kUnavailable "lost the master at ..."; a reply with `shutdown`
//    ends it finished (the job is over); Stop() ends it stopped. The first
//    end wins, and the heartbeat thread then exits;
//  - the cluster map version: a reply announcing a non-zero version other
//    than the one last followed is handed to Hooks::follow_map; the version
//    counts as followed once that hook succeeds, so a failure (logged) is
//    tried again on the next reply.
// The role supplies only its side through Hooks: its stats for each
// heartbeat, what it makes of each reply, how it follows a map, and what
// it does when the master ends the session.
//
// Every wait is bounded: registration by master_wait, a heartbeat by its
// attempt timeout, the pause between heartbeats by the interval. Stop gives
// up the session's call in flight (a heartbeat, the registration, or a
// hook's Call), so it returns within a few tens of milliseconds unless a
// hook is busy with something else.
//
// Errors: the hooks report theirs only through follow_map's Status; a
// session's own end is its state() and status(), and on_end.
//
// Thread-safety: HeartbeatNow, CheckLease, CallMaster, state and status
// are safe from any thread, Stop from any thread but the heartbeat
// thread; Register and Start from the owning thread. The hooks run on the
// heartbeat thread, one at a time, concurrently with the role's other
// threads.

#ifndef EPS_CLUSTER_MEMBER_SESSION_H_
#define EPS_CLUSTER_MEMBER_SESSION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/status.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"

namespace eps {

struct MemberSessionOptions {
  // The master, "tcp://HOST:PORT". Required.
  std::string master;
  // ROLE_SERVER or ROLE_WORKER: stamped on the registration request and
  // named in messages. Required.
  proto::Role role = proto::ROLE_UNSPECIFIED;
  // How long the master may go unanswering, at registration or later,
  // before the session gives up; 0 gives up at the first unanswered call
  // (registration still makes one attempt). Default 30 s.
  absl::Duration master_wait = absl::Seconds(30);
  // Time per registration attempt. Default 1 s.
  absl::Duration register_attempt_timeout = absl::Seconds(1);
  // Where the lease's time comes from: when a registration or heartbeat
  // was sent, CheckLease and the master wait read it (tests script it).
  // Calls and the heartbeat interval run on real time. Never null.
  Clock* clock = Clock::Real();

  // kInvalidArgument for a malformed master endpoint, a role that is not a
  // member's, a negative master wait or an attempt timeout that is not
  // positive, or no clock.
  Status Validate() const;
};

class MemberSession {
 public:
  enum class State {
    kNew,         // not registered yet
    kRegistered,  // registered, not heartbeating yet
    kRunning,     // heartbeating
    kStopped,     // Stop() was called
    kFinished,    // the master said the job is over (shutdown)
    kFenced,      // the master refused a heartbeat with FENCED
    kLostMaster,  // no heartbeat answered for master_wait
  };

  // The role's side. Every hook runs on the heartbeat thread, never two at
  // once; a hook must synchronise with the role's other threads itself and
  // must not call Stop (it may call any other method, Call included).
  struct Hooks {
    // Fills in the role's part of a heartbeat request: its stats (a
    // worker's also paused_for_checkpoint, a server's its endpoint).
    // Called before each heartbeat. Required.
    std::function<void(proto::HeartbeatRequest* request)> fill_heartbeat;
    // Takes every answered heartbeat's reply, after the map version was
    // followed; the one that says shutdown too, after which the session
    // ends finished. Optional.
    std::function<void(const proto::HeartbeatReply& reply)> on_reply;
    // The master announced cluster map `version` (non-zero, not the one
    // followed last): fetch and install it. OK marks it followed; an error
    // is logged and the hook is called again on the next reply still
    // announcing a version not followed. Not called for a shutdown reply.
    // Every heartbeat says the version followed last (the envelope's
    // cluster_map_version; 0 before any): the master lets a retired server
    // go once no worker routes by a map older than its retirement.
    // Optional: without it versions are ignored.
    std::function<Status(uint64_t version)> follow_map;
    // The master ended the session: kFinished (status OK), kFenced (the
    // FENCED reply's status) or kLostMaster (kUnavailable). Called once,
    // last, on the heartbeat thread; not called for Stop(). Optional.
    std::function<void(State state, const Status& status)> on_end;
  };

  // `factory` must outlive the session. Options are checked by Register.
  MemberSession(SocketFactory* factory, const MemberSessionOptions& options);
  ~MemberSession();  // Stop()s.
  MemberSession(const MemberSession&) = delete;
  MemberSession& operator=(const MemberSession&) = delete;

  // Sends `request` (REGISTER_SERVER or REGISTER_WORKER with its body) and
  // returns the master's reply, from which the role reads its id. Blocks for
  // at most master_wait (or until Stop, kCancelled). kInvalidArgument for
  // options that do not Validate; kDeadlineExceeded when no attempt was
  // answered, kUnavailable when no socket could be made, the master's
  // refusal otherwise (e.g. kFailedPrecondition), these annotated "cannot
  // register with the master at M". The lease runs from when the request
  // was first sent. REQUIRES: once.
  StatusOr<Message> Register(Message request);

  // Starts heartbeating as `self` (the id the master gave) every
  // `heartbeat`; `lease` is how long the master keeps this member without
  // an answered heartbeat (CheckLease). Never blocks; does nothing when the
  // session was stopped meanwhile. REQUIRES: a successful Register, once;
  // heartbeat and lease > 0; hooks.fill_heartbeat set.
  void Start(const proto::NodeId& self, absl::Duration heartbeat, absl::Duration lease,
             Hooks hooks);

  // Has the next heartbeat go out now (or as soon as the one in flight is
  // done), e.g. to report a pause at once. Never blocks.
  void HeartbeatNow();

  // OK while the last answered heartbeat (the registration at first) was
  // sent less than a lease ago; kFailedPrecondition/FENCED otherwise
  // ("no heartbeat answered for D, longer than the lease (L): this worker
  // may be fenced"): nothing may be pushed or committed then.
  // REQUIRES: Start was called.
  Status CheckLease() const;

  // Calls the master on `channel` with the message `make` builds, riding
  // out short outages (a master being restarted): a call that gets no
  // answer (kDeadlineExceeded, or kUnavailable without a reason), or is
  // answered SLOW_DOWN (made again after half a second), is made again
  // until master_wait has passed since the first attempt. Stops
  // early with the last error once the session has ended or `give_up`
  // (optional) returns true. Blocks up to master_wait plus one call.
  // `channel` belongs to the calling thread.
  StatusOr<Message> CallMaster(RpcChannel& channel, const std::function<Message()>& make,
                               const CallOptions& options,
                               const std::function<bool()>& give_up = nullptr) const;

  // Calls the master once on the session's own channel (as `self`), e.g.
  // GET_CLUSTER_MAP from follow_map. The reply or its error, or kCancelled
  // when the session is stopped meanwhile. REQUIRES: called from a hook
  // (the heartbeat thread owns that channel).
  StatusOr<Message> Call(Message request, const CallOptions& options);

  // Ends the session (state kStopped unless it has ended already), gives up
  // the master call in flight (Register's too: kCancelled) and joins the
  // heartbeat thread. Idempotent. Safe from any thread but a hook's.
  void Stop();

  State state() const;
  // Why the session ended: OK while it has not, or ended stopped or
  // finished; the FENCED status when fenced; kUnavailable when the master
  // was lost.
  Status status() const;

 private:
  // Waits for call `id` on channel_ until it finishes or the session is
  // stopped (kCancelled, the call given up).
  StatusOr<Message> AwaitCall(uint64_t id);
  void HeartbeatLoop();
  // One heartbeat, sent and answered (or not). False once the session ended.
  bool Heartbeat();
  // Ends the session as `state` unless it has ended already; true if it
  // was this call that ended it.
  bool End(State state, const Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  bool Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Name() const;

  const MemberSessionOptions options_;
  const bool curve_;  // the factory's sockets use CURVE
  // Used by Register (owning thread), then only by the heartbeat thread.
  RpcChannel channel_;
  Hooks hooks_;  // set by Start, before the heartbeat thread starts
  absl::Duration heartbeat_ = absl::ZeroDuration();
  uint64_t followed_map_version_ = 0;  // heartbeat thread only

  // Held by Start while it starts the heartbeat thread and by Stop while it
  // joins it.
  absl::Mutex thread_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;           // Stop() was called
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;  // HeartbeatNow()
  // The last heartbeat's HeartbeatRequest.seq (the heartbeat thread's own).
  uint64_t heartbeat_seq_ = 0;
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // When the last heartbeat the master answered (at first: the
  // registration) was sent.
  absl::Time lease_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace eps

#endif  // EPS_CLUSTER_MEMBER_SESSION_H_
