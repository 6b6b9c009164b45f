// Tests what the transport does with hostile and oversized traffic:
// malformed envelopes, other protocol versions, too many frames, messages
// over the size limit, a peer with too many requests in flight, and
// hostile replies. Real ZeroMQ sockets on loopback; raw DEALER sockets
// stand in for the peers. Every blocking receive has a timeout.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"
#include "tests/rpc/rpc_testing.h"

namespace eps {
namespace {

using namespace ::eps::testing;  // NOLINT: the transport tests' helpers
using ::testing::HasSubstr;

TEST_F(RpcTest, GarbageEnvelopeGetsInvalidArgumentAndServerKeepsServing) {
  std::atomic<int> calls{0};
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    calls++;
    return Echo(request, reply);
  });
  StatusOr<zmq::socket_t> raw = factory_.ConnectDealer(server->endpoint(), proto::ROLE_SERVER);
  ASSERT_TRUE(raw.ok()) << raw.status();

  std::vector<std::vector<zmq::message_t>> bad_requests;
  {
    std::vector<zmq::message_t> garbage;
    const std::string junk(24, '\xff');  // an endless varint: never parses
    garbage.emplace_back(junk.data(), junk.size());
    garbage.emplace_back(junk.data(), 5);
    bad_requests.push_back(std::move(garbage));
  }
  {
    std::vector<zmq::message_t> empty_envelope;  // parses, but version 0
    empty_envelope.emplace_back();
    bad_requests.push_back(std::move(empty_envelope));
  }
  for (size_t i = 0; i < bad_requests.size(); ++i) {
    SCOPED_TRACE(i);
    SendFrames(*raw, std::move(bad_requests[i]));
    std::vector<zmq::message_t> frames = ReceiveFrames(*raw, std::chrono::seconds(5));
    ASSERT_FALSE(frames.empty()) << "no reply to a malformed request";
    StatusOr<Message> reply = Message::FromFrames(std::move(frames));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(ReplyStatus(*reply).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(reply->num_frames(), 0u);
  }
  EXPECT_EQ(server->rejected(), 2u);
  EXPECT_EQ(calls.load(), 0);

  // The same connection and a fresh channel are both still served.
  SendFrames(*raw, Tagged(5).ToFrames());
  StatusOr<Message> raw_reply = Message::FromFrames(ReceiveFrames(*raw, std::chrono::seconds(5)));
  ASSERT_TRUE(raw_reply.ok()) << raw_reply.status();
  EXPECT_TRUE(ReplyStatus(*raw_reply).ok());
  RpcChannel channel(&factory_, WorkerId(0));
  EXPECT_TRUE(channel.Call(server->endpoint(), Tagged(6), Patient()).ok());
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(RpcTest, WrongProtocolVersionIsRejected) {
  std::atomic<int> calls{0};
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    calls++;
    return absl::OkStatus();
  });
  StatusOr<zmq::socket_t> raw = factory_.ConnectDealer(server->endpoint(), proto::ROLE_SERVER);
  ASSERT_TRUE(raw.ok());
  proto::Envelope envelope;
  envelope.set_protocol_version(kProtocolVersion + 1);
  envelope.set_request_id(77);
  envelope.set_method(proto::PULL);
  SendFrames(*raw, EnvelopeFrames(envelope));
  StatusOr<Message> reply = Message::FromFrames(ReceiveFrames(*raw, std::chrono::seconds(5)));
  ASSERT_TRUE(reply.ok()) << reply.status();
  const Status status = ReplyStatus(*reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("protocol version"));
  // Echoed so that the caller can match the rejection to its call.
  EXPECT_EQ(reply->header().request_id(), 77u);
  EXPECT_EQ(server->rejected(), 1u);
  EXPECT_EQ(calls.load(), 0);
}

// One method at a bounded rate per connection (the master's
// REGISTER_WORKER): a connection past its burst is answered SLOW_DOWN
// before the handler; another connection has a bucket of its own; the
// bucket refills; other methods are not limited.
TEST_F(RpcTest, ARateLimitedMethodIsBoundedPerConnection) {
  RpcServerOptions options;
  options.rate_limited = proto::REGISTER_WORKER;
  options.rate_limited_burst = 2;
  options.rate_limited_per_s = 20;
  std::atomic<int> calls{0};
  auto server = StartServer(
      [&](Message& request, Message* reply) -> Status {
        calls++;
        return absl::OkStatus();
      },
      options);
  RpcChannel first(&factory_, WorkerId(0));
  const auto registration = [] { return Tagged(1, proto::REGISTER_WORKER); };
  EXPECT_TRUE(first.Call(server->endpoint(), registration(), Fast(1, absl::Seconds(5))).ok());
  EXPECT_TRUE(first.Call(server->endpoint(), registration(), Fast(1, absl::Seconds(5))).ok());
  StatusOr<Message> over = first.Call(server->endpoint(), registration(), Fast(1, absl::Seconds(5)));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(over.status()), proto::SLOW_DOWN);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("REGISTER_WORKER"));
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(server->limited(), 1u);
  EXPECT_TRUE(first.Call(server->endpoint(), Tagged(2), Fast(1, absl::Seconds(5))).ok())
      << "other methods are not limited";

  RpcChannel second(&factory_, WorkerId(1));
  EXPECT_TRUE(second.Call(server->endpoint(), registration(), Fast(1, absl::Seconds(5))).ok())
      << "another connection has its own bucket";
  absl::SleepFor(absl::Milliseconds(120));  // 2.4 calls refilled
  EXPECT_TRUE(first.Call(server->endpoint(), registration(), Fast(1, absl::Seconds(5))).ok());
  EXPECT_EQ(calls.load(), 5);
}

TEST_F(RpcTest, MoreFramesThanMaxFramesIsRejected) {
  RpcServerOptions options;
  options.max_frames = 3;
  std::atomic<int> calls{0};
  auto server = StartServer(
      [&](Message& request, Message* reply) -> Status {
        calls++;
        return absl::OkStatus();
      },
      options);
  RpcChannel channel(&factory_, WorkerId(0));

  Message at_limit;
  at_limit.header().set_method(proto::PUSH);
  for (int i = 0; i < 3; ++i) at_limit.AddArray(std::vector<uint64_t>{1, 2});
  EXPECT_TRUE(channel.Call(server->endpoint(), std::move(at_limit), Patient()).ok());

  Message over;
  over.header().set_method(proto::PUSH);
  for (int i = 0; i < 4; ++i) over.AddArray(std::vector<uint64_t>{1, 2});
  // The rejection must reach the caller as such, not as a timeout.
  StatusOr<Message> reply =
      channel.Call(server->endpoint(), std::move(over), Fast(1, absl::Seconds(5)));
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("more than 3"));
  EXPECT_EQ(server->rejected(), 1u);
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(RpcTest, AMessageOverTheLimitIsAnsweredNotDropped) {
  TransportOptions small;
  small.max_message_bytes = 64 << 10;
  SocketFactory small_factory(small);
  std::atomic<int> calls{0};
  StatusOr<std::unique_ptr<RpcServer>> started =
      RpcServer::Start(&small_factory, RpcServerOptions{}, [&](Message& request, Message* reply) {
        calls++;
        if (request.header().method() == proto::PULL) {
          reply->AddArray(std::vector<float>((100 << 10) / sizeof(float), 3.0f));  // too big
          return absl::OkStatus();
        }
        return Echo(request, reply);
      });
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<RpcServer> server = std::move(started).value();
  RpcChannel channel(&factory_, WorkerId(0));

  // Just under the limit is fine.
  Message fits;
  fits.header().set_method(proto::PUSH);
  fits.AddArray(std::vector<float>((60 << 10) / sizeof(float), 1.0f));
  EXPECT_TRUE(channel.Call(server->endpoint(), std::move(fits), Patient()).ok());

  // 100 KiB from a peer that does not check: an answer, not a dropped
  // connection, and no handler sees it.
  StatusOr<zmq::socket_t> raw = factory_.ConnectDealer(server->endpoint(), proto::ROLE_SERVER);
  ASSERT_TRUE(raw.ok());
  auto big = [](uint64_t id, size_t bytes) {
    Message request;
    request.header().set_method(proto::PUSH);
    request.header().set_request_id(id);
    request.AddArray(std::vector<float>(bytes / sizeof(float), 2.0f));
    return std::move(request).ToFrames();
  };
  SendFrames(*raw, big(1, 100 << 10));
  std::vector<zmq::message_t> answer = ReceiveFrames(*raw, std::chrono::milliseconds(5000));
  ASSERT_FALSE(answer.empty());
  StatusOr<Message> refused = Message::FromFrames(std::move(answer));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->header().request_id(), 1u);
  const Status why = ReplyStatus(*refused);
  EXPECT_EQ(why.code(), absl::StatusCode::kResourceExhausted) << why;
  EXPECT_THAT(why.message(), HasSubstr("over the 0.1 MiB one message may carry"));
  // A channel does not even send one: the caller hears why at once.
  Message over;
  over.header().set_method(proto::PUSH);
  over.AddArray(std::vector<float>((100 << 10) / sizeof(float), 1.0f));
  RpcChannel checked(&small_factory, WorkerId(2));
  const StatusOr<Message> unsent = checked.Call(server->endpoint(), std::move(over), Patient());
  EXPECT_EQ(unsent.status().code(), absl::StatusCode::kResourceExhausted) << unsent.status();
  EXPECT_THAT(unsent.status().message(), HasSubstr("the PUSH request to"));
  // A reply over the limit becomes an error the caller can act on.
  const StatusOr<Message> pulled = channel.Call(server->endpoint(), Tagged(4), Patient());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kResourceExhausted) << pulled.status();
  EXPECT_THAT(pulled.status().message(), HasSubstr("the reply to PULL"));

  // Over twice the limit ZeroMQ itself drops the connection, unanswered.
  SendFrames(*raw, big(2, 1 << 20));
  EXPECT_TRUE(ReceiveFrames(*raw, std::chrono::milliseconds(300)).empty());

  // Everyone else is still served, on old and new connections.
  EXPECT_TRUE(channel.Call(server->endpoint(), Tagged(2, proto::PUSH), Patient()).ok());
  RpcChannel other(&factory_, WorkerId(1));
  EXPECT_TRUE(other.Call(server->endpoint(), Tagged(3, proto::PUSH), Patient()).ok());
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(server->limited(), 2u);
  server.reset();  // before small_factory
}

TEST_F(RpcTest, APeerGetsAtMostItsRequestsInFlight) {
  RpcServerOptions options;
  options.num_threads = 3;
  options.max_in_flight_per_peer = 2;
  absl::Notification release;
  std::atomic<int> calls{0};
  StatusOr<std::unique_ptr<RpcServer>> server =
      RpcServer::Start(&factory_, options, [&](Message& request, Message* reply) {
        calls++;
        if (request.header().sender().id() == 0) release.WaitForNotificationWithTimeout(absl::Seconds(10));
        return Echo(request, reply);
      });
  ASSERT_TRUE(server.ok()) << server.status();
  RpcChannel greedy(&factory_, WorkerId(0));
  std::vector<uint64_t> held;
  for (uint64_t tag = 1; tag <= 2; ++tag) {
    held.push_back(greedy.Start((*server)->endpoint(), Tagged(tag), Patient()));
  }
  // Both reach handlers before the third arrives (the proxy counts them in
  // order); the third is answered at once.
  const StatusOr<Message> third = greedy.Call((*server)->endpoint(), Tagged(3), Patient());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_THAT(third.status().message(), HasSubstr("2 requests in flight"));
  // Another peer still has a handler.
  RpcChannel polite(&factory_, WorkerId(1));
  EXPECT_TRUE(polite.Call((*server)->endpoint(), Tagged(4), Patient()).ok());
  release.Notify();
  for (uint64_t id : held) EXPECT_TRUE(greedy.Wait(id).ok());
  // Their replies freed the peer's slots.
  EXPECT_TRUE(greedy.Call((*server)->endpoint(), Tagged(5), Patient()).ok());
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ((*server)->limited(), 1u);
}

TEST_F(RpcTest, HostileRepliesDoNotConfuseTheChannel) {
  // A peer that answers with garbage, then a stranger's request id, then a
  // status code nobody knows; only the last is about our call.
  std::string endpoint;
  StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &endpoint);
  ASSERT_TRUE(router.ok()) << router.status();
  std::thread peer([socket = std::move(router).value()]() mutable {
    std::vector<zmq::message_t> frames = ReceiveFrames(socket, std::chrono::seconds(5));
    if (frames.size() < 2) return;
    proto::Envelope request;
    if (!request.ParseFromArray(frames[1].data(), static_cast<int>(frames[1].size()))) return;
    auto send = [&](std::vector<zmq::message_t> reply) {
      std::vector<zmq::message_t> out;
      out.emplace_back(frames[0].data(), frames[0].size());
      for (zmq::message_t& f : reply) out.push_back(std::move(f));
      SendFrames(socket, std::move(out));
    };
    std::vector<zmq::message_t> garbage;
    garbage.emplace_back(std::string(9, '\xff').data(), 9);
    send(std::move(garbage));
    proto::Envelope other;
    other.set_protocol_version(kProtocolVersion);
    other.set_request_id(request.request_id() + 1);
    send(EnvelopeFrames(other));
    proto::Envelope hostile;
    hostile.set_protocol_version(kProtocolVersion);
    hostile.set_request_id(request.request_id());
    hostile.mutable_status()->set_code(999);
    hostile.mutable_status()->set_message("odd");
    send(EnvelopeFrames(hostile));
  });
  RpcChannel channel(&factory_, WorkerId(0));
  StatusOr<Message> reply = channel.Call(endpoint, Tagged(1), Fast(1, absl::Seconds(5)));
  peer.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("odd"));
  EXPECT_EQ(channel.pending(), 0u);
}

}  // namespace
}  // namespace eps
