// RpcServer: serves eps requests on a ZeroMQ ROUTER socket.
//
// One proxy thread owns the ROUTER and forwards requests over inproc to
// `num_threads` handler threads (one DEALER each), which call the handler
// and send the reply back the same way. A request goes to a free handler
// (the proxy queues it until one is): a long call (a partition's copy, a
// checkpoint) holds up no other request while another handler is free. Before the handler runs, the server
// rejects what no handler should see: fewer than one frame, more than
// `max_frames`, an envelope that does not parse or speaks another protocol
// version. Those get an INVALID_ARGUMENT reply; nothing a peer sends can
// crash the process. Then it authorizes the call by the sender's role
// with the authorizer it was given (RpcServerOptions.authorize; the job's
// members pass cluster/call_table.h's AuthorizeCall): under CURVE the role
// of the peer's key, which the envelope must not contradict; without, the
// role the envelope claims. The transport itself knows no call table.
// Under CURVE a worker's or a server's request (but its registration and
// reads of the cluster map) must also carry the credential of the worker
// id or server slot it claims (WorkerCredentials); until the server has
// the credentials' key it answers such requests UNAVAILABLE (NOT_READY). A refusal is a
// PERMISSION_DENIED (or UNAUTHENTICATED) reply, counted and logged once per
// peer.
//
// Bounds per peer: before a request reaches a handler, the proxy answers
// kResourceExhausted when its peer (connection) already has
// max_in_flight_per_peer requests in flight or the request is over
// TransportOptions.max_message_bytes; a reply over that limit becomes a
// kResourceExhausted too (the caller would drop it unread).
//
// Thread-safety: the handler is called from several threads at once (when
// num_threads > 1) and must be safe for concurrent use. Start/Stop from the
// owning thread.

#ifndef EPS_RPC_RPC_SERVER_H_
#define EPS_RPC_RPC_SERVER_H_

#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "core/token_bucket.h"
#include "rpc/message.h"
#include "rpc/security.h"
#include "rpc/socket_factory.h"

namespace eps {

struct RpcServerOptions {
  // Where to listen, "tcp://HOST:PORT"; port 0 picks a free port.
  // Default tcp://127.0.0.1:0.
  std::string endpoint = "tcp://127.0.0.1:0";
  // Handler threads. Default 1.
  int num_threads = 1;
  // Most bulk frames a request may carry (after the envelope). Default 64.
  int max_frames = 64;
  // Most requests one peer (one connection) may have in flight: a request
  // beyond is answered kResourceExhausted at once, before it reaches a
  // handler, so that no peer can take every handler. Default 64.
  int max_in_flight_per_peer = 64;
  // Names the server in logs, e.g. "ps[2]". Default "rpc".
  std::string name = "rpc";
  // Keep when the requests not answered yet arrived (OldestWaiting): the
  // master's, whose leases depend on it; off on the servers' pull and push
  // path. Default false.
  bool track_waiting = false;
  // One method whose calls each connection may make at a bounded rate: a
  // bucket of `rate_limited_burst` calls refilled at `rate_limited_per_s`
  // a second, per connection; a call beyond is answered SLOW_DOWN
  // (kResourceExhausted) before any handler, and counted in limited().
  // The master's REGISTER_WORKER: a holder of the worker key cannot spend
  // the job's registration rate from one connection. METHOD_UNSPECIFIED
  // (the default): none.
  proto::Method rate_limited = proto::METHOD_UNSPECIFIED;
  double rate_limited_burst = 4;
  double rate_limited_per_s = 1;
  // Whether a peer of `caller`'s role may call `method`: OK, or the
  // refusal (PERMISSION_DENIED), or UNIMPLEMENTED for a method unknown to
  // the build (answered, not counted as a refusal). Required under CURVE
  // (Start refuses a server without one); without CURVE, empty lets every
  // claimed role call every method (in-process tests and fakes).
  std::function<Status(proto::Method method, proto::Role caller)> authorize;
};

// Handles one request. `reply` arrives with its request id and method set;
// the handler fills in the body and bulk frames. A non-OK return becomes the
// reply's status (bulk frames dropped).
using RpcHandler = std::function<Status(Message& request, Message* reply)>;

class RpcServer {
 public:
  // Binds and starts serving. kUnavailable when the endpoint cannot be
  // bound or the context has no sockets left; kInvalidArgument for bad
  // options or a malformed endpoint. `factory` must outlive the server.
  static StatusOr<std::unique_ptr<RpcServer>> Start(SocketFactory* factory,
                                                    const RpcServerOptions& options,
                                                    RpcHandler handler);
  ~RpcServer();  // Stop()s.
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // The endpoint actually bound, e.g. "tcp://127.0.0.1:40123".
  const std::string& endpoint() const { return endpoint_; }

  // Stops accepting requests and joins every thread; requests being handled
  // finish first, and their replies go out (the socket keeps trying for up
  // to a second after, without holding Stop up). Idempotent.
  void Stop();

  // Checks workers' credentials from now on (under CURVE); any thread.
  void SetWorkerCredentials(WorkerCredentials credentials) ABSL_LOCKS_EXCLUDED(credentials_mu_);

  // Malformed requests rejected before reaching the handler.
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  // Requests refused: by their sender's role (PERMISSION_DENIED), and for
  // carrying no trusted key (UNAUTHENTICATED).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint64_t unauthenticated() const { return unauthenticated_.load(std::memory_order_relaxed); }
  // Requests refused for a limit (kResourceExhausted): over the peer's
  // requests in flight, a request or its reply over max_message_bytes.
  uint64_t limited() const { return limited_.load(std::memory_order_relaxed); }
  // When the oldest request that reached the server and has not been
  // answered yet arrived (queued for a handler or being handled); nullopt
  // when none waits, or without RpcServerOptions.track_waiting. A
  // request's peer is judged on when it came, not on when a busy handler
  // got to it (the master's leases).
  std::optional<absl::Time> OldestWaiting() const {
    const int64_t nanos = oldest_waiting_ns_.load(std::memory_order_relaxed);
    if (nanos == kNoneWaiting) return std::nullopt;
    return absl::FromUnixNanos(nanos);
  }
  static constexpr int64_t kNoneWaiting = std::numeric_limits<int64_t>::max();

  // A server that binds nothing and runs no thread (`curve`: as if its
  // factory used CURVE), for feeding routed requests straight to the
  // validation and dispatch that Start's threads run (fuzz/).
  static std::unique_ptr<RpcServer> CreateUnstartedForTesting(const RpcServerOptions& options,
                                                              RpcHandler handler, bool curve);
  // Handles one routed request (the peer's routing id, its PeerFrame text
  // "ROLE ADDRESS", then the request's frames) as a handler thread does and
  // returns the routed reply; empty when there is nothing to answer to.
  std::vector<zmq::message_t> HandleForTesting(std::vector<zmq::message_t> frames) {
    return Handle(std::move(frames));
  }

 private:
  RpcServer(const RpcServerOptions& options, RpcHandler handler, const TransportOptions& transport);
  // Whether the sender `peer` (the proxy's PeerFrame) may make this call.
  Status Authorize(absl::string_view peer, const proto::Envelope& header);
  // Under CURVE, whether a worker's or a server's request carries the
  // credential of the id or slot it claims.
  Status CheckCredential(const proto::Envelope& header) ABSL_LOCKS_EXCLUDED(credentials_mu_);
  void HandlerLoop(zmq::socket_t socket);
  // Validates, dispatches and replies to one routed request.
  std::vector<zmq::message_t> Handle(std::vector<zmq::message_t> frames);
  // Takes one call of options_.rate_limited from connection `routing_id`'s
  // bucket; SLOW_DOWN when it is empty.
  Status TakeRateLimited(const std::string& routing_id) ABSL_LOCKS_EXCLUDED(rate_mu_);

  const RpcServerOptions options_;
  const RpcHandler handler_;
  const bool curve_;
  const int64_t max_message_bytes_;
  std::string endpoint_;
  // Stop()'s end of the proxy's control pair. Made in Start, so that
  // stopping never needs a new socket (and cannot fail for want of one).
  zmq::socket_t control_;
  std::atomic<bool> stopping_{false};
  // See OldestWaiting; written by the proxy thread alone.
  std::atomic<int64_t> oldest_waiting_ns_{kNoneWaiting};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> limited_{0};  // counted by the proxy thread too
  absl::Mutex credentials_mu_;
  std::optional<WorkerCredentials> credentials_ ABSL_GUARDED_BY(credentials_mu_);
  absl::Mutex refusals_mu_;
  // The peers whose refusal was logged.
  absl::flat_hash_set<std::string> refusals_logged_ ABSL_GUARDED_BY(refusals_mu_);
  absl::Mutex rate_mu_;
  absl::flat_hash_map<std::string, TokenBucket> rate_buckets_ ABSL_GUARDED_BY(rate_mu_);
  std::thread proxy_thread_;
  std::vector<std::thread> handler_threads_;
};

}  // namespace eps

#endif  // EPS_RPC_RPC_SERVER_H_
