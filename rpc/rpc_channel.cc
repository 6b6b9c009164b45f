#include "rpc/rpc_channel.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

struct RpcChannel::Peer {
  zmq::socket_t socket;
};

namespace {

uint64_t RandomPrefix() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) & 0xffffffff00000000ULL;
}

}  // namespace

RpcChannel::RpcChannel(SocketFactory* factory, proto::NodeId self)
    : factory_(factory), self_(std::move(self)), id_prefix_(RandomPrefix()) {}

RpcChannel::~RpcChannel() = default;

StatusOr<RpcChannel::Peer*> RpcChannel::GetPeer(const std::string& endpoint,
                                                 proto::Method method) {
  auto it = peers_.find(endpoint);
  if (it != peers_.end()) return it->second.get();
  StatusOr<zmq::socket_t> socket = factory_->ConnectDealer(endpoint, ServingRole(method));
  if (!socket.ok()) return socket.status();
  auto peer = std::make_unique<Peer>();
  peer->socket = std::move(socket).value();
  Peer* raw = peer.get();
  peers_.emplace(endpoint, std::move(peer));
  return raw;
}

uint64_t RpcChannel::Start(const std::string& endpoint, Message request,
                           const CallOptions& options) {
  const uint64_t id = id_prefix_ | (next_id_++ & 0xffffffffULL);
  request.header().set_request_id(id);
  *request.header().mutable_sender() = self_;
  PendingCall& call = calls_[id];
  call.endpoint = endpoint;
  call.method = request.header().method();
  call.options = options;
  call.options.max_attempts = std::max(1, options.max_attempts);
  call.frames = std::move(request).ToFrames();
  // A peer would drop it unread: the caller hears why at once instead.
  // (The message is formatted only then: this runs for every call.)
  const int64_t limit = factory_->options().max_message_bytes;
  if (FramesBytes(call.frames) > static_cast<uint64_t>(limit)) {
    call.done = true;
    call.result = CheckMessageBytes(
        call.frames, limit,
        absl::StrCat("the ", proto::Method_Name(call.method), " request to ", endpoint),
        "send fewer keys or rows per request");
    call.frames.clear();
    return id;
  }
  Send(id, call);
  return id;
}

void RpcChannel::Send(uint64_t id, PendingCall& call) {
  call.attempts++;
  call.deadline = absl::Now() + call.options.attempt_timeout;
  StatusOr<Peer*> peer_or = GetPeer(call.endpoint, call.method);
  if (!peer_or.ok()) {
    call.done = true;
    call.frames.clear();
    call.result = Annotate(peer_or.status(), proto::Method_Name(call.method));
    return;
  }
  Peer* peer = *peer_or;
  for (size_t i = 0; i < call.frames.size(); ++i) {
    zmq::message_t copy;
    copy.copy(call.frames[i]);
    const auto flags = i + 1 < call.frames.size()
                           ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                           : zmq::send_flags::dontwait;
    if (!peer->socket.send(copy, flags).has_value()) {
      // Queue full: the attempt's deadline will pass and it is retried.
      VLOG(2) << "send to " << call.endpoint << " would block; will retry";
      return;
    }
  }
  VLOG(2) << "-> " << call.endpoint << " " << proto::Method_Name(call.method) << " id=" << id
          << " attempt " << call.attempts;
}

void RpcChannel::Pump(absl::Time until) {
  std::vector<zmq::pollitem_t> items;
  std::vector<std::string> endpoints;
  for (auto& [endpoint, peer] : peers_) {
    items.push_back({peer->socket.handle(), 0, ZMQ_POLLIN, 0});
    endpoints.push_back(endpoint);
  }
  const absl::Duration wait = std::max(absl::ZeroDuration(), until - absl::Now());
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(wait) + 1);
  int ready = 0;
  try {
    ready = zmq::poll(items.data(), items.size(), timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) LOG(ERROR) << "poll failed: " << e.what();
  }
  for (size_t i = 0; ready > 0 && i < items.size(); ++i) {
    if (!(items[i].revents & ZMQ_POLLIN)) continue;
    zmq::socket_t& socket = peers_[endpoints[i]]->socket;
    while (true) {
      std::vector<zmq::message_t> frames;
      bool more = true;
      while (more) {
        zmq::message_t frame;
        if (!socket.recv(frame, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none)
                 .has_value()) {
          break;
        }
        more = frame.more();
        frames.push_back(std::move(frame));
      }
      if (frames.empty()) break;
      StatusOr<Message> reply = Message::FromFrames(std::move(frames));
      if (!reply.ok()) {
        LOG(WARNING) << "dropping malformed reply from " << endpoints[i] << ": " << reply.status();
        continue;
      }
      auto it = calls_.find(reply->header().request_id());
      if (it == calls_.end() || it->second.done) continue;  // late reply of a finished call
      PendingCall& call = it->second;
      VLOG(2) << "<- " << endpoints[i] << " " << reply->DebugString();
      call.done = true;
      call.frames.clear();
      Status status = ReplyStatus(*reply);
      if (status.ok()) {
        call.result = std::move(reply);
      } else {
        call.result =
            Annotate(status, absl::StrCat(proto::Method_Name(call.method), " to ", call.endpoint));
      }
    }
  }
  // Timeouts: resend on a fresh connection, or give up.
  const absl::Time now = absl::Now();
  std::vector<std::string> to_reset;
  for (auto& [id, call] : calls_) {
    if (call.done || call.deadline > now) continue;
    if (call.attempts >= call.options.max_attempts) {
      call.done = true;
      call.frames.clear();
      call.result = absl::DeadlineExceededError(absl::StrCat(
          "no reply from ", call.endpoint, " to ", proto::Method_Name(call.method), " after ",
          call.attempts, " attempt(s) of ", absl::FormatDuration(call.options.attempt_timeout)));
    } else if (std::find(to_reset.begin(), to_reset.end(), call.endpoint) == to_reset.end()) {
      to_reset.push_back(call.endpoint);
    }
  }
  for (const std::string& endpoint : to_reset) {
    VLOG(1) << "no reply from " << endpoint << " in time; reconnecting and resending";
    peers_.erase(endpoint);
    for (auto& [id, call] : calls_) {
      if (call.done || call.endpoint != endpoint) continue;
      if (call.deadline <= now) {
        Send(id, call);  // a new attempt
      } else {
        const absl::Time deadline = call.deadline;
        call.attempts--;
        Send(id, call);  // the same attempt, on the new connection
        call.deadline = deadline;
      }
    }
  }
}

StatusOr<Message> RpcChannel::Wait(uint64_t id) {
  return *WaitUntil(id, absl::InfiniteFuture());
}

std::optional<StatusOr<Message>> RpcChannel::WaitUntil(uint64_t id, absl::Time until) {
  auto it = calls_.find(id);
  if (it == calls_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown call id ", id));
  }
  while (!it->second.done) {
    if (absl::Now() >= until) return std::nullopt;
    absl::Time next = until;
    for (const auto& [other_id, call] : calls_) {
      if (!call.done) next = std::min(next, call.deadline);
    }
    Pump(next);
    it = calls_.find(id);
  }
  StatusOr<Message> result = std::move(it->second.result);
  calls_.erase(it);
  return result;
}

StatusOr<Message> RpcChannel::Call(const std::string& endpoint, Message request,
                                   const CallOptions& options) {
  return Wait(Start(endpoint, std::move(request), options));
}

void RpcChannel::Cancel(uint64_t id) { calls_.erase(id); }

}  // namespace eps
