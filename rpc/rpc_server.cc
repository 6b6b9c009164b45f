#include "rpc/rpc_server.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/logging.h"

namespace eps {
namespace {

std::atomic<uint64_t> g_server_counter{0};

// Receives one whole multipart message, or nothing when the timeout passes.
bool ReceiveMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames) {
  frames->clear();
  while (true) {
    zmq::message_t frame;
    zmq::recv_result_t got = socket.recv(frame, zmq::recv_flags::none);
    if (!got.has_value()) return false;  // timeout (only possible on the first frame)
    const bool more = frame.more();
    frames->push_back(std::move(frame));
    if (!more) return true;
  }
}

// Sends `frames` on `to` as one message; false once a send fails (the
// rest is dropped). A ROUTER drops what it cannot route, so a send to the
// frontend never blocks.
bool SendAll(zmq::socket_t& to, std::vector<zmq::message_t>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!to.send(frames[i], flags).has_value()) return false;
  }
  return true;
}

// The rest of a message whose first frame was `first` (read whole: ZeroMQ
// delivers a message only whole, so it is all here already).
std::vector<zmq::message_t> ReceiveRest(zmq::socket_t& from, zmq::message_t first) {
  std::vector<zmq::message_t> frames;
  bool more = first.more();
  frames.push_back(std::move(first));
  while (more) {
    zmq::message_t frame;
    (void)from.recv(frame, zmq::recv_flags::none);
    more = frame.more();
    frames.push_back(std::move(frame));
  }
  return frames;
}

// What the proxy tells the handlers about a request's sender, as a frame
// after its routing id: "ROLE ADDRESS", ROLE being the ZAP user id (the role
// of the peer's CURVE key; "-" when unauthenticated) and ADDRESS its IP.
std::string PeerFrame(zmq::message_t& frame) {
  auto property = [&frame](const char* name) -> std::string {
    try {
      const char* value = frame.gets(name);
      return value != nullptr && *value != '\0' ? value : "-";
    } catch (const zmq::error_t&) {
      return "-";
    }
  };
  return absl::StrCat(property("User-Id"), " ", property("Peer-Address"));
}

// The error reply to a request whose envelope is `envelope`: it echoes the
// request id and method when the envelope parses at all, so that the
// caller's channel files the error with its call instead of waiting for a
// reply that never comes.
std::vector<zmq::message_t> ErrorReply(const zmq::message_t& envelope, const Status& status) {
  Message error;
  proto::Envelope header;
  if (header.ParseFromArray(envelope.data(), static_cast<int>(envelope.size()))) {
    error.header().set_request_id(header.request_id());
    error.header().set_method(header.method());
  }
  StatusToProto(status, error.header().mutable_status());
  return std::move(error).ToFrames();
}

// Counts a request refused for a limit; logs the first and then whenever
// the count reaches a power of two (an overloaded peer sends many).
void CountLimited(std::atomic<uint64_t>& limited, const std::string& server, const Status& why) {
  const uint64_t now = limited.fetch_add(1, std::memory_order_relaxed) + 1;
  if ((now & (now - 1)) != 0) return;
  LOG(WARNING) << server << ": refused a request for a limit (" << now << " so far): "
               << why.message();
}

// The proxy's state: what each peer has in flight, and its limits.
struct ProxyState {
  int max_in_flight_per_peer;
  int64_t max_message_bytes;
  std::string name;
  std::atomic<uint64_t>* limited;
  // By routing id; a peer with nothing in flight has no entry.
  absl::flat_hash_map<std::string, int> in_flight;
  // With track_waiting (`oldest` set): the arrival times (Unix ns) of the
  // requests forwarded and not answered, per peer in order and all of them;
  // the oldest goes to `oldest`.
  absl::flat_hash_map<std::string, std::deque<int64_t>> arrivals = {};
  std::multiset<int64_t> waiting = {};
  std::atomic<int64_t>* oldest = nullptr;
  // Handlers waiting for a request (their routing ids on the backend), and
  // requests waiting for a handler (routed: the peer's routing id, its
  // PeerFrame, the request's frames). A request goes to a handler that is
  // free, never behind one busy with a long call (a partition's copy, a
  // checkpoint), as a DEALER's round robin would.
  std::deque<std::string> idle = {};
  std::deque<std::vector<zmq::message_t>> queued = {};

  void PublishOldest() {
    oldest->store(waiting.empty() ? RpcServer::kNoneWaiting : *waiting.begin(),
                  std::memory_order_relaxed);
  }
};

// Moves one request from the frontend to the backend, with the PeerFrame
// after its routing id, or answers it at once when it is over a limit;
// false when there is none.
bool ForwardRequest(zmq::socket_t& frontend, zmq::socket_t& backend, ProxyState& state) {
  zmq::message_t routing;
  if (!frontend.recv(routing, zmq::recv_flags::none).has_value()) return false;
  if (!routing.more()) return true;  // a routing id alone: nothing to answer
  zmq::message_t first;
  (void)frontend.recv(first, zmq::recv_flags::none);
  zmq::message_t peer(PeerFrame(first));
  std::vector<zmq::message_t> request = ReceiveRest(frontend, std::move(first));
  std::string id(static_cast<const char*>(routing.data()), routing.size());
  int& in_flight = state.in_flight[id];
  Status limit;
  if (in_flight >= state.max_in_flight_per_peer) {
    limit = absl::ResourceExhaustedError(absl::StrCat(
        "this peer has ", in_flight, " requests in flight, the most one peer may have: wait for "
        "their replies"));
  } else {
    limit = CheckMessageBytes(request, state.max_message_bytes, "the request",
                              "send fewer keys or rows per request");
  }
  if (!limit.ok()) {
    if (in_flight == 0) state.in_flight.erase(id);
    CountLimited(*state.limited, state.name, limit);
    std::vector<zmq::message_t> reply = ErrorReply(request[0], limit);
    reply.insert(reply.begin(), std::move(routing));
    SendAll(frontend, reply);
    return true;
  }
  std::vector<zmq::message_t> routed;
  routed.reserve(request.size() + 3);
  routed.push_back(std::move(routing));
  routed.push_back(std::move(peer));
  for (zmq::message_t& frame : request) routed.push_back(std::move(frame));
  ++in_flight;
  if (state.oldest != nullptr) {
    const int64_t now = absl::ToUnixNanos(absl::Now());
    state.arrivals[id].push_back(now);
    state.waiting.insert(now);
    state.PublishOldest();
  }
  state.queued.push_back(std::move(routed));
  return true;
}

// Hands queued requests to free handlers.
void Dispatch(zmq::socket_t& backend, ProxyState& state) {
  while (!state.idle.empty() && !state.queued.empty()) {
    std::vector<zmq::message_t> routed = std::move(state.queued.front());
    state.queued.pop_front();
    routed.insert(routed.begin(), zmq::message_t(state.idle.front()));
    state.idle.pop_front();
    SendAll(backend, routed);
  }
}

// Moves one reply from the backend to the frontend; false when there is
// none (`flags` dontwait).
bool ForwardReply(zmq::socket_t& backend, zmq::socket_t& frontend, ProxyState& state,
                  zmq::recv_flags flags) {
  zmq::message_t handler;
  if (!backend.recv(handler, flags).has_value()) return false;
  // Whatever a handler sends, it is free again: a reply, or (one empty
  // frame) word that it is ready.
  state.idle.emplace_back(static_cast<const char*>(handler.data()), handler.size());
  if (!handler.more()) return true;
  zmq::message_t routing;
  (void)backend.recv(routing, zmq::recv_flags::none);
  if (!routing.more()) return true;  // ready
  const absl::string_view id(static_cast<const char*>(routing.data()), routing.size());
  auto it = state.in_flight.find(id);
  if (it != state.in_flight.end() && --it->second <= 0) state.in_flight.erase(it);
  // A peer's replies may come back out of order: its oldest goes (an
  // approximation that only ever makes the oldest look newer).
  if (auto arrived = state.arrivals.find(id);
      state.oldest != nullptr && arrived != state.arrivals.end()) {
    state.waiting.erase(state.waiting.find(arrived->second.front()));
    arrived->second.pop_front();
    if (arrived->second.empty()) state.arrivals.erase(arrived);
    state.PublishOldest();
  }
  std::vector<zmq::message_t> reply = ReceiveRest(backend, std::move(routing));
  SendAll(frontend, reply);
  return true;
}

// How long the frontend keeps trying to deliver the last replies once the
// server stopped: a peer told "the job is over" in its last reply must hear
// it, not wait out its own timeout on a master that is gone.
constexpr int kLastRepliesLingerMs = 1000;

// Requests from the frontend to the handlers, replies back, until
// `control` says stop. Unlike zmq::proxy_steerable, whose TERMINATE drops a
// reply still queued on the backend and whose frontend then closes with no
// linger, it first sends every reply the (already stopped) handlers left.
void Proxy(zmq::socket_t& frontend, zmq::socket_t& backend, zmq::socket_t& control,
           ProxyState& state) {
  zmq::pollitem_t items[] = {{frontend.handle(), 0, ZMQ_POLLIN, 0},
                             {backend.handle(), 0, ZMQ_POLLIN, 0},
                             {control.handle(), 0, ZMQ_POLLIN, 0}};
  while (true) {
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal: not ours to act on
      throw;
    }
    if (items[2].revents & ZMQ_POLLIN) break;
    if (items[0].revents & ZMQ_POLLIN) ForwardRequest(frontend, backend, state);
    if (items[1].revents & ZMQ_POLLIN) {
      ForwardReply(backend, frontend, state, zmq::recv_flags::none);
    }
    Dispatch(backend, state);
  }
  while (ForwardReply(backend, frontend, state, zmq::recv_flags::dontwait)) {
  }
  frontend.set(zmq::sockopt::linger, kLastRepliesLingerMs);
}

}  // namespace

StatusOr<std::unique_ptr<RpcServer>> RpcServer::Start(SocketFactory* factory,
                                                      const RpcServerOptions& options,
                                                      RpcHandler handler) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError("rpc server: num_threads must be >= 1");
  }
  if (options.max_frames < 0 || options.max_in_flight_per_peer < 1) {
    return absl::InvalidArgumentError(
        "rpc server: max_frames must be >= 0 and max_in_flight_per_peer >= 1");
  }
  if (factory->options().security.curve && !options.authorize) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc server ", options.name,
                     ": under CURVE it needs an authorizer (RpcServerOptions.authorize)"));
  }
  std::unique_ptr<RpcServer> server(new RpcServer(options, std::move(handler), factory->options()));
  ASSIGN_OR_RETURN(zmq::socket_t frontend,
                   factory->BindRouter(options.endpoint, &server->endpoint_));

  // Every socket first, threads after: a failure here leaves nothing running.
  const uint64_t id = g_server_counter.fetch_add(1);
  const std::string backend_endpoint = absl::StrCat("inproc://rpc-backend-", id);
  const std::string control_endpoint = absl::StrCat("inproc://rpc-control-", id);
  zmq::socket_t backend;
  zmq::socket_t control;
  std::vector<zmq::socket_t> workers;
  try {
    backend = factory->MakeSocket(zmq::socket_type::router);
    backend.bind(backend_endpoint);
    control = factory->MakeSocket(zmq::socket_type::pair);
    control.bind(control_endpoint);
    server->control_ = factory->MakeSocket(zmq::socket_type::pair);
    server->control_.connect(control_endpoint);
    for (int i = 0; i < options.num_threads; ++i) {
      zmq::socket_t worker = factory->MakeSocket(zmq::socket_type::dealer);
      worker.set(zmq::sockopt::rcvtimeo, 100);
      worker.set(zmq::sockopt::routing_id, absl::StrCat("handler-", i));
      worker.connect(backend_endpoint);
      workers.push_back(std::move(worker));
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("rpc server ", options.name, ": cannot set up its sockets: ", e.what()));
  }

  for (zmq::socket_t& worker : workers) {
    server->handler_threads_.emplace_back(
        [s = server.get(), w = std::move(worker)]() mutable { s->HandlerLoop(std::move(w)); });
  }
  // The sockets move into the proxy thread, which alone uses them from now on.
  server->proxy_thread_ = std::thread(
      [f = std::move(frontend), b = std::move(backend), c = std::move(control),
       state = ProxyState{.max_in_flight_per_peer = options.max_in_flight_per_peer,
                          .max_message_bytes = server->max_message_bytes_,
                          .name = options.name,
                          .limited = &server->limited_,
                          .in_flight = {},
                          .oldest = options.track_waiting ? &server->oldest_waiting_ns_
                                                          : nullptr}]() mutable {
        try {
          Proxy(f, b, c, state);
        } catch (const zmq::error_t& e) {
          if (e.num() != ETERM) LOG(ERROR) << "rpc proxy stopped: " << e.what();
        }
      });
  return server;
}

RpcServer::RpcServer(const RpcServerOptions& options, RpcHandler handler,
                     const TransportOptions& transport)
    : options_(options),
      handler_(std::move(handler)),
      curve_(transport.security.curve),
      max_message_bytes_(transport.max_message_bytes) {}

RpcServer::~RpcServer() { Stop(); }

std::unique_ptr<RpcServer> RpcServer::CreateUnstartedForTesting(const RpcServerOptions& options,
                                                                RpcHandler handler, bool curve) {
  TransportOptions transport;
  transport.security.curve = curve;
  return std::unique_ptr<RpcServer>(new RpcServer(options, std::move(handler), transport));
}

void RpcServer::Stop() {
  if (stopping_.exchange(true)) return;
  // Handlers poll `stopping_` between requests; the proxy needs a command.
  for (std::thread& t : handler_threads_) t.join();
  if (proxy_thread_.joinable()) {
    // Non-blocking: if the proxy already died (and logged why), nobody reads
    // the command and the join returns at once.
    try {
      control_.send(zmq::str_buffer("TERMINATE"), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      LOG(ERROR) << options_.name << ": cannot stop the rpc proxy: " << e.what();
    }
    proxy_thread_.join();
  }
  if (control_) control_.close();
}

void RpcServer::HandlerLoop(zmq::socket_t socket) {
  std::vector<zmq::message_t> frames;
  // Ready: the proxy hands requests only to a handler free for them.
  (void)socket.send(zmq::message_t(), zmq::send_flags::none);
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (!ReceiveMultipart(socket, &frames)) continue;
    std::vector<zmq::message_t> reply = Handle(std::move(frames));
    // Nothing to answer: ready again all the same.
    if (reply.empty()) reply.emplace_back();
    for (size_t i = 0; i < reply.size(); ++i) {
      const auto flags = i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (!socket.send(reply[i], flags).has_value()) break;
    }
  }
}

Status RpcServer::Authorize(absl::string_view peer, const proto::Envelope& header) {
  const proto::NodeId& claimed = header.sender();
  const std::pair<absl::string_view, absl::string_view> role_address =
      absl::StrSplit(peer, absl::MaxSplits(' ', 1));
  Status status;
  proto::Role role = claimed.role();
  if (curve_) {
    std::optional<proto::Role> authenticated = RoleFromName(role_address.first);
    if (!authenticated.has_value()) {
      status = absl::UnauthenticatedError("the request carries no key the job trusts");
    } else if (*authenticated != claimed.role()) {
      status = absl::PermissionDeniedError(
          absl::StrCat("the request claims to come from a ", RoleName(claimed.role()),
                       ", but its key is the ", RoleName(*authenticated), "'s"));
    }
    role = authenticated.value_or(proto::ROLE_UNSPECIFIED);
  }
  if (status.ok() && options_.authorize) status = options_.authorize(header.method(), role);
  if (status.ok() && curve_ && (role == proto::ROLE_WORKER || role == proto::ROLE_SERVER)) {
    status = CheckCredential(header);
  }
  // Not ready to check yet: the worker retries, no refusal.
  if (absl::IsUnavailable(status)) return status;
  // A method this build does not know is no refusal of the peer.
  if (status.ok() || absl::IsUnimplemented(status)) return status;
  (absl::IsUnauthenticated(status) ? unauthenticated_ : refused_)
      .fetch_add(1, std::memory_order_relaxed);
  const std::string who =
      absl::StrCat(curve_ ? absl::StrCat(RoleName(role), " key") : "peer (unauthenticated)",
                   " at ", role_address.second, " claiming to be ", RoleName(claimed.role()), " ",
                   claimed.id());
  {
    absl::MutexLock lock(&refusals_mu_);
    constexpr size_t kMaxLogged = 1024;  // an attacker can claim many ids
    if (refusals_logged_.size() < kMaxLogged && refusals_logged_.insert(who).second) {
      LOG(WARNING) << options_.name << ": refused " << proto::Method_Name(header.method())
                   << " from a " << who << ": " << status.message() << " (logged once per peer)";
    }
  }
  return status;
}

void RpcServer::SetWorkerCredentials(WorkerCredentials credentials) {
  absl::MutexLock lock(&credentials_mu_);
  credentials_ = std::move(credentials);
}

Status RpcServer::CheckCredential(const proto::Envelope& header) {
  // A member has no id, and so no credential, before it registers; and the
  // cluster map is the same for every member.
  if (header.method() == proto::REGISTER_WORKER || header.method() == proto::REGISTER_SERVER ||
      header.method() == proto::GET_CLUSTER_MAP) {
    return absl::OkStatus();
  }
  const bool server = header.sender().role() == proto::ROLE_SERVER;
  absl::ReaderMutexLock lock(&credentials_mu_);  // every member request: shared
  if (!credentials_.has_value()) {
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           "cannot check members' credentials yet (not registered)",
                           proto::NOT_READY);
  }
  const uint32_t id = header.sender().id();
  const std::string& credential = header.sender().credential();
  if (server ? credentials_->VerifyServer(id, credential) : credentials_->Verify(id, credential)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the request claims to come from ", server ? "ps[" : "worker ", id, server ? "]" : "",
      credential.empty() ? " but carries no credential" : " but carries another's credential",
      server ? ": a server acts only as the slot the master admitted it to"
             : ": a worker acts only as the id the master gave it"));
}

Status RpcServer::TakeRateLimited(const std::string& routing_id) {
  const absl::Time now = absl::Now();
  const double burst = options_.rate_limited_burst;
  const double per_s = options_.rate_limited_per_s;
  absl::MutexLock lock(&rate_mu_);
  // Connections whose buckets have refilled are as good as new: forgotten,
  // so the map holds only connections that called recently.
  if (rate_buckets_.size() >= 1024) {
    absl::erase_if(rate_buckets_, [&](auto& entry) {
      entry.second.Refill(now);
      return entry.second.full();
    });
  }
  TokenBucket& bucket =
      rate_buckets_.try_emplace(routing_id, TokenBucket(burst, per_s, now)).first->second;
  bucket.Refill(now);
  if (!bucket.TakeOne()) {
    limited_.fetch_add(1, std::memory_order_relaxed);
    return ErrorWithReason(
        absl::StatusCode::kResourceExhausted,
        absl::StrCat("more than ", burst, " ", proto::Method_Name(options_.rate_limited),
                     " calls at once from this connection (", per_s,
                     " a second at most); wait and ask again"),
        proto::SLOW_DOWN);
  }
  return absl::OkStatus();
}

std::vector<zmq::message_t> RpcServer::Handle(std::vector<zmq::message_t> frames) {
  // frames[0] is the ROUTER's routing id of the peer, frames[1] what the
  // proxy knows of it (PeerFrame); the request follows.
  std::vector<zmq::message_t> out;
  if (frames.size() < 3) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return out;  // nothing to answer to
  }
  out.push_back(std::move(frames[0]));
  const std::string peer = frames[1].to_string();
  frames.erase(frames.begin(), frames.begin() + 2);
  // For an error reply (ErrorReply): a small or reference-counted copy,
  // kept because FromFrames consumes the frames.
  zmq::message_t envelope;
  envelope.copy(frames[0]);
  Message reply;
  Status status;
  bool rejected = true;
  if (frames.size() - 1 > static_cast<size_t>(options_.max_frames)) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "request has ", frames.size() - 1, " bulk frames, more than ", options_.max_frames));
  } else {
    StatusOr<Message> request = Message::FromFrames(std::move(frames));
    if (!request.ok()) {
      status = request.status();
    } else {
      rejected = false;
      reply.header().set_request_id(request->header().request_id());
      reply.header().set_method(request->header().method());
      VLOG(2) << options_.name << " <- " << request->DebugString();
      status = Authorize(peer, request->header());
      if (status.ok() && options_.rate_limited != proto::METHOD_UNSPECIFIED &&
          request->header().method() == options_.rate_limited) {
        status = TakeRateLimited(out[0].to_string());
      }
      if (status.ok()) status = handler_(*request, &reply);
    }
  }
  std::vector<zmq::message_t> frames_out;
  if (rejected) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    VLOG(2) << options_.name << " rejected a request: " << status;
  } else if (status.ok()) {
    const proto::Method method = reply.header().method();
    frames_out = std::move(reply).ToFrames();
    // Formatted only when over: this runs for every reply.
    if (FramesBytes(frames_out) > static_cast<uint64_t>(max_message_bytes_)) {
      status = CheckMessageBytes(frames_out, max_message_bytes_,
                                 absl::StrCat("the reply to ", proto::Method_Name(method)),
                                 "ask for fewer keys or rows per request");
      CountLimited(limited_, options_.name, status);
    }
  }
  if (!status.ok()) frames_out = ErrorReply(envelope, status);
  for (zmq::message_t& frame : frames_out) out.push_back(std::move(frame));
  return out;
}

}  // namespace eps
