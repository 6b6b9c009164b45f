// SocketFactory: the one place ZeroMQ sockets are made.
//
// Every socket of every eps process comes from here, so transport-wide
// settings (frame-size cap, linger, reconnect pacing, CURVE keys) apply
// everywhere alike. With security.curve, every ROUTER is a CURVE server whose
// handshakes the factory's ZapAuthenticator answers, and every DEALER a CURVE
// client of the serving role's key (rpc/security.h).
//
// Thread-safety: safe for concurrent use (zmq::context_t is thread-safe).
// The sockets it returns belong to one thread each (core/rpc_*.h).

#ifndef EPS_RPC_SOCKET_FACTORY_H_
#define EPS_RPC_SOCKET_FACTORY_H_

#include <cstdint>
#include <string>

#include "core/status.h"
#include "rpc/security.h"
#include "zmq.hpp"

namespace eps {

struct TransportOptions {
  // Most bytes one message (all its frames) may carry. A channel refuses
  // to send a larger request (kResourceExhausted, nothing sent), a server
  // answers one with kResourceExhausted and refuses to send a larger reply.
  // ZeroMQ itself reads no frame over twice this (ZMQ_MAXMSGSIZE): a peer
  // sending one is disconnected unanswered, as ZeroMQ delivers a message
  // only whole. Default 64 MiB.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Pause before reconnecting to a lost peer, growing to the max. Defaults
  // 100 ms and 2000 ms.
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
  // Queued messages per socket before sends fail (ZMQ HWM). Default 100000.
  int high_water_mark = 100000;
  // I/O threads of the ZeroMQ context. Default 1.
  int io_threads = 1;
  // CURVE and the keys; off by default (in-process tests). The binaries
  // load it from [security] (LoadSecurity).
  SecurityOptions security;

  Status Validate() const;
};

class SocketFactory {
 public:
  // Starts the ZAP handler when options.security.curve (CHECK-fails when it
  // cannot: one factory per process, made at its start).
  explicit SocketFactory(const TransportOptions& options = {});
  ~SocketFactory();
  SocketFactory(const SocketFactory&) = delete;
  SocketFactory& operator=(const SocketFactory&) = delete;

  // A ROUTER bound to `endpoint` ("tcp://HOST:PORT"; port 0 picks a free
  // one). On success `*bound` is the endpoint actually bound. kUnavailable
  // when the address is taken or not local, or no socket is left;
  // kInvalidArgument when malformed.
  StatusOr<zmq::socket_t> BindRouter(const std::string& endpoint, std::string* bound);

  // A DEALER connected to `endpoint`, served by a process of role `serving`
  // (whose public key CURVE checks). Connecting never blocks: ZeroMQ
  // connects (and reconnects) in the background. kInvalidArgument when the
  // endpoint is malformed or `serving` is not a serving role under CURVE,
  // kUnavailable when no socket is left.
  StatusOr<zmq::socket_t> ConnectDealer(const std::string& endpoint, proto::Role serving);

  // A socket of `type` with the common options, neither bound nor connected
  // (for inproc plumbing). Throws zmq::error_t when the context has no
  // socket left (EMFILE, ZMQ_MAX_SOCKETS); callers catch it and return a
  // Status.
  zmq::socket_t MakeSocket(zmq::socket_type type);

  zmq::context_t& context() { return context_; }
  const TransportOptions& options() const { return options_; }
  // CURVE handshakes refused for a key the job does not trust (0 when off).
  uint64_t handshakes_refused() const { return zap_ ? zap_->refused() : 0; }

 private:
  const TransportOptions options_;
  zmq::context_t context_;
  std::unique_ptr<ZapAuthenticator> zap_;  // after context_: stops first
};

}  // namespace eps

#endif  // EPS_RPC_SOCKET_FACTORY_H_
