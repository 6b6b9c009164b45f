// Small network helpers: endpoint parsing and the local address facing a
// peer.
//
// Thread-safety: pure functions, safe for concurrent use.

#ifndef EPS_RPC_NET_H_
#define EPS_RPC_NET_H_

#include <cstdint>
#include <string>

#include "core/status.h"

namespace eps {

struct HostPort {
  std::string host;
  int port = 0;
};

// Parses "tcp://HOST:PORT". kInvalidArgument names what is wrong.
StatusOr<HostPort> ParseTcpEndpoint(const std::string& endpoint);

// The local IP address this machine uses to reach `endpoint`'s host (no
// packet is sent). kInvalidArgument for a malformed endpoint, kUnavailable
// when the host does not resolve or is unreachable.
StatusOr<std::string> LocalAddressFor(const std::string& endpoint);

// This machine's host name.
std::string Hostname();

}  // namespace eps

#endif  // EPS_RPC_NET_H_
