// RpcChannel: the client side of eps calls, one DEALER socket per peer.
//
//   RpcChannel channel(&factory, self);
//   uint64_t a = channel.Start(ps0, std::move(pull0), options);
//   uint64_t b = channel.Start(ps1, std::move(pull1), options);  // both in flight
//   StatusOr<Message> ra = channel.Wait(a);
//
// Each call carries a request id; many calls may be in flight to many
// peers at once. Every attempt has a timeout; a call whose attempt times out
// is resent (same request id) on a fresh connection, up to max_attempts,
// then fails with kDeadlineExceeded. A reply whose status is an error turns
// into that error (with its ErrorReason payload); it is not retried.
//
// Thread-safety: one thread only (it owns ZeroMQ sockets). A process
// makes one channel per thread that talks to peers.

#ifndef EPS_RPC_RPC_CHANNEL_H_
#define EPS_RPC_RPC_CHANNEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "rpc/message.h"
#include "rpc/socket_factory.h"

namespace eps {

struct CallOptions {
  // Time one attempt may take before it is resent. Default 10 s.
  absl::Duration attempt_timeout = absl::Seconds(10);
  // Attempts in all (1 = no retry). Default 3.
  int max_attempts = 3;
};

class RpcChannel {
 public:
  // `factory` must outlive the channel. `self` is stamped on every request.
  RpcChannel(SocketFactory* factory, proto::NodeId self);
  ~RpcChannel();
  RpcChannel(const RpcChannel&) = delete;
  RpcChannel& operator=(const RpcChannel&) = delete;

  // Changes the sender id stamped on later requests (after registration).
  void set_self(proto::NodeId self) { self_ = std::move(self); }

  // Sends `request` to `endpoint` and returns the call's id. Never blocks.
  // The envelope's request id and sender are filled in here. A request
  // over TransportOptions.max_message_bytes is not sent: its Wait returns
  // kResourceExhausted.
  uint64_t Start(const std::string& endpoint, Message request, const CallOptions& options);

  // Blocks until call `id` finishes: its reply, the reply's error status,
  // kDeadlineExceeded after max_attempts timeouts, or kInvalidArgument for
  // an unknown id. Replies to other calls that arrive meanwhile are kept
  // for their own Wait. Each id may be waited for once.
  StatusOr<Message> Wait(uint64_t id);

  // Wait, but only until `until`: the call's result once it finished, or
  // nullopt while it is still running (wait again later, or Cancel it).
  std::optional<StatusOr<Message>> WaitUntil(uint64_t id, absl::Time until);

  // Start + Wait.
  StatusOr<Message> Call(const std::string& endpoint, Message request, const CallOptions& options);

  // Forgets call `id` without waiting; a late reply is dropped.
  void Cancel(uint64_t id);

  // Calls started and not yet waited for.
  size_t pending() const { return calls_.size(); }

 private:
  struct Peer;
  struct PendingCall {
    std::string endpoint;
    std::vector<zmq::message_t> frames;  // kept for resending
    proto::Method method = proto::METHOD_UNSPECIFIED;
    CallOptions options;
    int attempts = 0;
    absl::Time deadline;
    bool done = false;
    StatusOr<Message> result = absl::UnknownError("pending");
  };

  // The peer's socket, connecting one when there is none (to the role that
  // serves `method`). kInvalidArgument for a malformed endpoint,
  // kUnavailable when no socket is left.
  StatusOr<Peer*> GetPeer(const std::string& endpoint, proto::Method method);
  // Sends (or resends) a call's frames on its peer's current socket; fails
  // the call when there is no socket to send on.
  void Send(uint64_t id, PendingCall& call);
  // Waits up to `until` for replies and files them with their calls; then
  // retries or fails calls whose attempt timed out. A retry goes out on a
  // fresh socket, dropping whatever ZeroMQ had queued on the old connection.
  void Pump(absl::Time until);

  SocketFactory* const factory_;
  proto::NodeId self_;
  const uint64_t id_prefix_;
  uint64_t next_id_ = 1;
  std::map<std::string, std::unique_ptr<Peer>> peers_;
  absl::flat_hash_map<uint64_t, PendingCall> calls_;
};

}  // namespace eps

#endif  // EPS_RPC_RPC_CHANNEL_H_
