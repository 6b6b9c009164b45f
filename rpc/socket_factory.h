// SocketFactory: the one place ZeroMQ sockets are made.
//
// Every socket of every eps process comes from here, so transport-wide
// settings (frame-size cap, linger, reconnect pacing and, once security
// lands, CURVE keys) apply everywhere alike.
//
// Thread-safety: safe for concurrent use (zmq::context_t is thread-safe).
// The sockets it returns belong to one thread each (core/rpc_*.h).

#ifndef EPS_RPC_SOCKET_FACTORY_H_
#define EPS_RPC_SOCKET_FACTORY_H_

#include <cstdint>
#include <string>

#include "core/status.h"
#include "zmq.hpp"

namespace eps {

struct TransportOptions {
  // Largest frame a socket accepts (ZMQ_MAXMSGSIZE, per frame); a peer
  // sending a larger one is disconnected. Default 64 MiB.
  int64_t max_frame_bytes = int64_t{64} << 20;
  // Pause before reconnecting to a lost peer, growing to the max. Defaults
  // 100 ms and 2000 ms.
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
  // Queued messages per socket before sends fail (ZMQ HWM). Default 100000.
  int high_water_mark = 100000;
  // I/O threads of the ZeroMQ context. Default 1.
  int io_threads = 1;

  Status Validate() const;
};

class SocketFactory {
 public:
  explicit SocketFactory(const TransportOptions& options = {});
  SocketFactory(const SocketFactory&) = delete;
  SocketFactory& operator=(const SocketFactory&) = delete;

  // A ROUTER bound to `endpoint` ("tcp://HOST:PORT"; port 0 picks a free
  // one). On success `*bound` is the endpoint actually bound. kUnavailable
  // when the address is taken or not local, or no socket is left;
  // kInvalidArgument when malformed.
  StatusOr<zmq::socket_t> BindRouter(const std::string& endpoint, std::string* bound);

  // A DEALER connected to `endpoint`. Connecting never blocks: ZeroMQ
  // connects (and reconnects) in the background. kInvalidArgument when the
  // endpoint is malformed, kUnavailable when no socket is left.
  StatusOr<zmq::socket_t> ConnectDealer(const std::string& endpoint);

  // A socket of `type` with the common options, neither bound nor connected
  // (for inproc plumbing). Throws zmq::error_t when the context has no
  // socket left (EMFILE, ZMQ_MAX_SOCKETS); callers catch it and return a
  // Status.
  zmq::socket_t MakeSocket(zmq::socket_type type);

  zmq::context_t& context() { return context_; }
  const TransportOptions& options() const { return options_; }

 private:
  const TransportOptions options_;
  zmq::context_t context_;
};

}  // namespace eps

#endif  // EPS_RPC_SOCKET_FACTORY_H_
