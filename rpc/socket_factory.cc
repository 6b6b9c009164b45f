#include "rpc/socket_factory.h"

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

Status TransportOptions::Validate() const {
  if (max_message_bytes < 1024 || max_message_bytes > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError("transport: max_message_bytes must be in [1 KiB, 1 TiB]");
  }
  if (reconnect_ivl_ms < 1 || reconnect_ivl_max_ms < reconnect_ivl_ms) {
    return absl::InvalidArgumentError("transport: bad reconnect interval");
  }
  if (high_water_mark < 1 || io_threads < 1) {
    return absl::InvalidArgumentError("transport: high_water_mark and io_threads must be >= 1");
  }
  if (security.curve && (security.secret_key.empty() || security.master_key.empty() ||
                         security.server_key.empty())) {
    return absl::InvalidArgumentError("transport: CURVE without keys");
  }
  return absl::OkStatus();
}

SocketFactory::SocketFactory(const TransportOptions& options)
    : options_(options), context_(options.io_threads) {
  CHECK_OK(options_.Validate());
  if (options_.security.curve) {
    StatusOr<std::unique_ptr<ZapAuthenticator>> zap =
        ZapAuthenticator::Start(context_, options_.security);
    CHECK_OK(zap.status());
    zap_ = std::move(zap).value();
  }
}

SocketFactory::~SocketFactory() = default;

zmq::socket_t SocketFactory::MakeSocket(zmq::socket_type type) {
  zmq::socket_t socket(context_, type);
  socket.set(zmq::sockopt::linger, 0);
  // Twice the limit, so that a server can answer a request over it.
  socket.set(zmq::sockopt::maxmsgsize, 2 * options_.max_message_bytes);
  socket.set(zmq::sockopt::sndhwm, options_.high_water_mark);
  socket.set(zmq::sockopt::rcvhwm, options_.high_water_mark);
  return socket;
}

StatusOr<zmq::socket_t> SocketFactory::BindRouter(const std::string& endpoint, std::string* bound) {
  zmq::socket_t socket;
  try {
    socket = MakeSocket(zmq::socket_type::router);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", endpoint, ": no socket: ", e.what()));
  }
  if (options_.security.curve) {
    socket.set(zmq::sockopt::zap_domain, "eps");
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, options_.security.secret_key);
  }
  // ZeroMQ spells "any port" as '*'.
  std::string address = endpoint;
  if (address.size() > 2 && address.compare(address.size() - 2, 2, ":0") == 0) {
    address.replace(address.size() - 1, 1, "*");
  }
  try {
    socket.bind(address);
  } catch (const zmq::error_t& e) {
    const absl::StatusCode code = e.num() == EINVAL || e.num() == EPROTONOSUPPORT
                                      ? absl::StatusCode::kInvalidArgument
                                      : absl::StatusCode::kUnavailable;
    return Status(code, absl::StrCat("cannot bind ", endpoint, ": ", e.what()));
  }
  *bound = socket.get(zmq::sockopt::last_endpoint);
  return socket;
}

StatusOr<zmq::socket_t> SocketFactory::ConnectDealer(const std::string& endpoint,
                                                     proto::Role serving) {
  const SecurityOptions& security = options_.security;
  if (security.curve && serving != proto::ROLE_MASTER && serving != proto::ROLE_SERVER) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot connect to ", endpoint, ": a ", RoleName(serving), " serves nothing"));
  }
  zmq::socket_t socket;
  try {
    socket = MakeSocket(zmq::socket_type::dealer);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", endpoint, ": no socket: ", e.what()));
  }
  socket.set(zmq::sockopt::reconnect_ivl, options_.reconnect_ivl_ms);
  socket.set(zmq::sockopt::reconnect_ivl_max, options_.reconnect_ivl_max_ms);
  if (security.curve) {
    socket.set(zmq::sockopt::curve_serverkey,
               serving == proto::ROLE_MASTER ? security.master_key : security.server_key);
    socket.set(zmq::sockopt::curve_publickey, security.public_key);
    socket.set(zmq::sockopt::curve_secretkey, security.secret_key);
  }
  try {
    socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot connect to ", endpoint, ": ", e.what()));
  }
  return socket;
}

}  // namespace eps
