// Helpers of the transport tests (tests/rpc): call bounds, requests, raw
// frames and the RpcTest fixture, a default socket factory serving
// loopback.

#ifndef EPS_TESTS_RPC_RPC_TESTING_H_
#define EPS_TESTS_RPC_RPC_TESTING_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"

namespace eps::testing {

// Generous bounds for calls that should succeed: a loaded CI machine must
// not turn them into retries.
inline CallOptions Patient() {
  CallOptions options;
  options.attempt_timeout = absl::Seconds(5);
  options.max_attempts = 1;
  return options;
}

// Short bounds for calls that are meant to time out.
inline CallOptions Fast(int attempts, absl::Duration attempt_timeout = absl::Milliseconds(150)) {
  CallOptions options;
  options.attempt_timeout = attempt_timeout;
  options.max_attempts = attempts;
  return options;
}

inline proto::NodeId WorkerId(uint32_t id) {
  proto::NodeId node;
  node.set_role(proto::ROLE_WORKER);
  node.set_id(id);
  return node;
}

// A request whose first bulk frame is the single uint64 `tag`, from worker 0
// (a channel stamps its own sender over it; raw sockets send it as is).
inline Message Tagged(uint64_t tag, proto::Method method = proto::PULL) {
  Message request;
  request.header().set_method(method);
  *request.header().mutable_sender() = WorkerId(0);
  request.AddArray(std::vector<uint64_t>{tag});
  return request;
}

// Replies with the request's frames, unchanged.
inline Status Echo(Message& request, Message* reply) {
  for (size_t i = 0; i < request.num_frames(); ++i) {
    zmq::message_t copy;
    copy.copy(const_cast<zmq::message_t&>(request.frame(i)));
    reply->AddFrame(std::move(copy));
  }
  return absl::OkStatus();
}

inline void SendFrames(zmq::socket_t& socket, std::vector<zmq::message_t> frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    ASSERT_TRUE(socket.send(frames[i], flags).has_value());
  }
}

// One whole multipart message, or nothing once `timeout` passes.
inline std::vector<zmq::message_t> ReceiveFrames(zmq::socket_t& socket,
                                          std::chrono::milliseconds timeout) {
  std::vector<zmq::message_t> frames;
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) <= 0) return frames;
  bool more = true;
  while (more) {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::none).has_value()) break;
    more = frame.more();
    frames.push_back(std::move(frame));
  }
  return frames;
}

inline std::vector<zmq::message_t> EnvelopeFrames(const proto::Envelope& envelope) {
  std::vector<zmq::message_t> frames;
  const std::string bytes = envelope.SerializeAsString();
  frames.emplace_back(bytes.data(), bytes.size());
  return frames;
}

// An endpoint on which nobody listens: a port the kernel just handed out
// and that was closed again.
inline std::string DeadEndpoint(SocketFactory& factory) {
  std::string endpoint;
  StatusOr<zmq::socket_t> router = factory.BindRouter("tcp://127.0.0.1:0", &endpoint);
  CHECK_OK(router.status());
  router->close();
  return endpoint;
}

class RpcTest : public ::testing::Test {
 protected:
  std::unique_ptr<RpcServer> StartServer(RpcHandler handler, RpcServerOptions options = {}) {
    StatusOr<std::unique_ptr<RpcServer>> server =
        RpcServer::Start(&factory_, options, std::move(handler));
    CHECK_OK(server.status());
    return std::move(server).value();
  }

  // Declared first: destroyed after every server, channel and socket.
  SocketFactory factory_;
};

}  // namespace eps::testing

#endif  // EPS_TESTS_RPC_RPC_TESTING_H_
