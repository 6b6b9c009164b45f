// Tests the transport: rpc/socket_factory.h, rpc/rpc_server.h and
// rpc/rpc_channel.h, over real ZeroMQ sockets on loopback, ephemeral ports.
//
// Raw DEALER/ROUTER sockets stand in for broken or slow peers (hostile and
// oversized traffic: rpc_limits_test.cc). Every blocking receive in this
// file has a timeout, so a bug fails a test rather than hanging it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/logging.h"
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

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

TEST_F(RpcTest, RoundTripWithEnvelopeBodyAndBulkArrays) {
  std::vector<uint64_t> keys(10000);
  std::vector<float> values(keys.size() * 4);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 0x9e3779b97f4a7c15ULL * (i + 1);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f;
  const std::vector<uint64_t> small = {1, 2, 3};

  absl::Mutex mu;
  proto::Envelope seen;  // the request header as the handler saw it
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    {
      absl::MutexLock lock(&mu);
      seen = request.header();
    }
    EXPECT_EQ(reply->header().request_id(), request.header().request_id());
    EXPECT_EQ(reply->header().method(), request.header().method());
    if (request.num_frames() != 4) return absl::InvalidArgumentError("want 4 frames");
    ASSIGN_OR_RETURN(std::span<const uint64_t> k, request.Array<uint64_t>(0));
    ASSIGN_OR_RETURN(std::span<const float> v, request.Array<float>(1));
    ASSIGN_OR_RETURN(std::span<const uint64_t> s, request.Array<uint64_t>(2));
    ASSIGN_OR_RETURN(std::span<const float> empty, request.Array<float>(3));
    if (v.size() != k.size() * 4 || s.size() != 3 || !empty.empty()) {
      return absl::InvalidArgumentError("bad sizes");
    }
    // Reply: keys + 1 and values * 2, computed from what arrived.
    std::span<uint64_t> out_keys = reply->AddUninitializedArray<uint64_t>(k.size());
    for (size_t i = 0; i < k.size(); ++i) out_keys[i] = k[i] + 1;
    std::vector<float> out_values(v.begin(), v.end());
    for (float& x : out_values) x *= 2;
    reply->AddArray(out_values);
    reply->AddArray(std::vector<uint64_t>(s.begin(), s.end()));
    reply->header().mutable_push_reply();
    reply->header().set_cluster_map_version(request.header().push_request().client_seq());
    return absl::OkStatus();
  });

  RpcChannel channel(&factory_, WorkerId(4));
  Message request;
  request.header().set_method(proto::PUSH);
  request.header().set_cluster_map_version(3);
  request.header().mutable_push_request()->add_table_ids(1);
  request.header().mutable_push_request()->add_table_ids(2);
  request.header().mutable_push_request()->set_client_seq(99);
  request.AddArray(keys);
  request.AddArray(values);
  request.AddArray(small);
  request.AddArray(std::vector<float>{});
  const uint64_t id = channel.Start(server->endpoint(), std::move(request), Patient());
  EXPECT_EQ(channel.pending(), 1u);
  StatusOr<Message> reply = channel.Wait(id);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(channel.pending(), 0u);

  EXPECT_EQ(reply->header().request_id(), id);
  EXPECT_EQ(reply->header().method(), proto::PUSH);
  EXPECT_TRUE(reply->header().has_push_reply());
  EXPECT_EQ(reply->header().cluster_map_version(), 99u);
  ASSERT_EQ(reply->num_frames(), 3u);
  StatusOr<std::span<const uint64_t>> got_keys = reply->Array<uint64_t>(0);
  ASSERT_TRUE(got_keys.ok());
  ASSERT_EQ(got_keys->size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ((*got_keys)[i], keys[i] + 1) << i;
  StatusOr<std::span<const float>> got_values = reply->Array<float>(1);
  ASSERT_TRUE(got_values.ok());
  ASSERT_EQ(got_values->size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ((*got_values)[i], values[i] * 2) << i;
  StatusOr<std::span<const uint64_t>> got_small = reply->Array<uint64_t>(2);
  ASSERT_TRUE(got_small.ok());
  EXPECT_THAT(*got_small, ElementsAreArray(small));

  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen.protocol_version(), kProtocolVersion);
  EXPECT_EQ(seen.request_id(), id);
  EXPECT_EQ(seen.sender().role(), proto::ROLE_WORKER);
  EXPECT_EQ(seen.sender().id(), 4u);
  EXPECT_EQ(seen.cluster_map_version(), 3u);
  EXPECT_EQ(seen.push_request().table_ids_size(), 2);
  EXPECT_EQ(seen.push_request().client_seq(), 99u);
}

TEST_F(RpcTest, SetSelfChangesTheSender) {
  absl::Mutex mu;
  std::vector<uint32_t> senders;
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    absl::MutexLock lock(&mu);
    senders.push_back(request.header().sender().id());
    return absl::OkStatus();
  });
  RpcChannel channel(&factory_, WorkerId(1));
  ASSERT_TRUE(channel.Call(server->endpoint(), Tagged(0), Patient()).ok());
  channel.set_self(WorkerId(8));
  ASSERT_TRUE(channel.Call(server->endpoint(), Tagged(1), Patient()).ok());
  absl::MutexLock lock(&mu);
  EXPECT_THAT(senders, ElementsAreArray({1u, 8u}));
}

TEST_F(RpcTest, ManyCallsInFlightAcrossTwoServersMatchedById) {
  constexpr int kCalls = 64;
  absl::Mutex mu;
  std::vector<uint64_t> finished[2];  // tags in the order each server answered
  std::unique_ptr<RpcServer> servers[2];
  for (uint64_t s = 0; s < 2; ++s) {
    RpcServerOptions options;
    options.num_threads = 4;
    options.name = "ps[" + std::to_string(s) + "]";
    servers[s] = StartServer(
        [&, s](Message& request, Message* reply) -> Status {
          ASSIGN_OR_RETURN(std::span<const uint64_t> tag, request.Array<uint64_t>(0));
          if (tag.size() != 1) return absl::InvalidArgumentError("one tag");
          // Every fourth call is slow, so later calls overtake it.
          if (tag[0] % 4 == 0) absl::SleepFor(absl::Milliseconds(80));
          reply->AddArray(std::vector<uint64_t>{tag[0], s});
          absl::MutexLock lock(&mu);
          finished[s].push_back(tag[0]);
          return absl::OkStatus();
        },
        options);
  }

  RpcChannel channel(&factory_, WorkerId(0));
  std::vector<uint64_t> ids;
  for (uint64_t tag = 0; tag < kCalls; ++tag) {
    ids.push_back(channel.Start(servers[tag % 2]->endpoint(), Tagged(tag), Patient()));
  }
  EXPECT_EQ(channel.pending(), static_cast<size_t>(kCalls));
  // Wait in an order unrelated to the order replies arrive in.
  for (int i = kCalls - 1; i >= 0; i -= 2) {
    for (int tag : {i, i - 1}) {
      StatusOr<Message> reply = channel.Wait(ids[tag]);
      ASSERT_TRUE(reply.ok()) << "tag " << tag << ": " << reply.status();
      EXPECT_EQ(reply->header().request_id(), ids[tag]);
      StatusOr<std::span<const uint64_t>> got = reply->Array<uint64_t>(0);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(got->size(), 2u);
      EXPECT_EQ((*got)[0], static_cast<uint64_t>(tag));
      EXPECT_EQ((*got)[1], static_cast<uint64_t>(tag % 2));
    }
  }
  EXPECT_EQ(channel.pending(), 0u);
  absl::MutexLock lock(&mu);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(finished[s].size(), static_cast<size_t>(kCalls / 2));
    EXPECT_FALSE(std::is_sorted(finished[s].begin(), finished[s].end()))
        << "server " << s << " answered in request order; the test proves nothing";
  }
}

TEST_F(RpcTest, HandlerErrorReachesCallerWithReason) {
  std::atomic<int> calls{0};
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    calls++;
    reply->AddArray(std::vector<float>{1, 2, 3});  // dropped with the error
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition, "partition 7 is owned by ps[2]",
                           proto::WRONG_OWNER);
  });
  RpcChannel channel(&factory_, WorkerId(0));
  StatusOr<Message> reply = channel.Call(server->endpoint(), Tagged(1), Fast(3, absl::Seconds(5)));
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("partition 7 is owned by ps[2]"));
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("PULL"));  // the channel's context
  EXPECT_EQ(ReasonOf(reply.status()), proto::WRONG_OWNER);
  EXPECT_EQ(calls.load(), 1) << "an error reply must not be retried";
  EXPECT_EQ(server->rejected(), 0u);

  // On the wire: the status, and no bulk frames.
  StatusOr<zmq::socket_t> raw = factory_.ConnectDealer(server->endpoint(), proto::ROLE_SERVER);
  ASSERT_TRUE(raw.ok());
  SendFrames(*raw, Tagged(2).ToFrames());
  StatusOr<Message> raw_reply = Message::FromFrames(ReceiveFrames(*raw, std::chrono::seconds(5)));
  ASSERT_TRUE(raw_reply.ok()) << raw_reply.status();
  EXPECT_EQ(raw_reply->num_frames(), 0u);
  EXPECT_EQ(ReplyStatus(*raw_reply).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RpcTest, NobodyListeningFailsWithDeadlineExceeded) {
  const std::string endpoint = DeadEndpoint(factory_);
  RpcChannel channel(&factory_, WorkerId(0));
  const absl::Time start = absl::Now();
  StatusOr<Message> reply = channel.Call(endpoint, Tagged(1), Fast(2));
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr(endpoint));
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("2 attempt"));
  EXPECT_GE(elapsed, absl::Milliseconds(290));  // 2 x 150 ms, less clock slack
  EXPECT_LT(elapsed, absl::Seconds(3));
  EXPECT_EQ(channel.pending(), 0u);
}

TEST_F(RpcTest, SilentPeerGetsEveryAttemptWithTheSameRequestId) {
  // A ROUTER that is never read while the call runs: it never answers.
  std::string endpoint;
  StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &endpoint);
  ASSERT_TRUE(router.ok()) << router.status();
  RpcChannel channel(&factory_, WorkerId(0));
  const absl::Time start = absl::Now();
  const uint64_t id = channel.Start(endpoint, Tagged(1), Fast(3));
  StatusOr<Message> reply = channel.Wait(id);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("3 attempt"));
  EXPECT_GE(elapsed, absl::Milliseconds(440));
  EXPECT_LT(elapsed, absl::Seconds(3));

  // Now read what arrived: every attempt carries the one request id. (An
  // attempt whose connection was still being set up when it timed out may
  // be lost with its socket; on loopback in 150 ms that is rare.)
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    std::vector<zmq::message_t> frames = ReceiveFrames(*router, std::chrono::seconds(1));
    if (frames.empty()) break;
    ASSERT_GE(frames.size(), 2u);
    frames.erase(frames.begin());  // routing id
    StatusOr<Message> request = Message::FromFrames(std::move(frames));
    ASSERT_TRUE(request.ok()) << request.status();
    ids.push_back(request->header().request_id());
  }
  ASSERT_GE(ids.size(), 2u) << "the call was not resent";
  for (uint64_t seen : ids) EXPECT_EQ(seen, id);
}

TEST_F(RpcTest, ZeroAttemptsMeansOne) {
  const std::string endpoint = DeadEndpoint(factory_);
  RpcChannel channel(&factory_, WorkerId(0));
  const absl::Time start = absl::Now();
  StatusOr<Message> reply = channel.Call(endpoint, Tagged(1), Fast(0));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("1 attempt"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(RpcTest, BlockedHandlerFailsWithDeadlineExceeded) {
  absl::Notification release;
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    release.WaitForNotificationWithTimeout(absl::Seconds(5));
    return absl::OkStatus();
  });
  RpcChannel channel(&factory_, WorkerId(0));
  StatusOr<Message> reply = channel.Call(server->endpoint(), Tagged(1), Fast(2));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
  release.Notify();
}

// A handler held by a long call (a partition's copy, a checkpoint) takes no
// more requests: the others go to the free handlers, not queued behind it
// (a DEALER's round robin queued every other request there).
TEST_F(RpcTest, ALongCallHoldsUpNoOtherRequest) {
  absl::Notification release;
  RpcServerOptions options;
  options.num_threads = 2;
  auto server = StartServer(
      [&](Message& request, Message* reply) -> Status {
        ASSIGN_OR_RETURN(std::span<const uint64_t> tag, request.Array<uint64_t>(0));
        if (tag.size() == 1 && tag[0] == 0) {
          release.WaitForNotificationWithTimeout(absl::Seconds(20));
        }
        return Echo(request, reply);
      },
      options);
  RpcChannel slow(&factory_, WorkerId(0));
  const uint64_t held = slow.Start(server->endpoint(), Tagged(0), Patient());
  absl::SleepFor(absl::Milliseconds(50));  // the long call reaches a handler first
  RpcChannel channel(&factory_, WorkerId(1));
  for (uint64_t tag = 1; tag <= 8; ++tag) {
    StatusOr<Message> reply =
        channel.Call(server->endpoint(), Tagged(tag), Fast(1, absl::Seconds(2)));
    EXPECT_TRUE(reply.ok()) << "call " << tag << ": " << reply.status();
  }
  release.Notify();
  EXPECT_TRUE(slow.Wait(held).ok());
}

TEST_F(RpcTest, RetryAfterADroppedAttemptSucceedsWithTheSameId) {
  // A hand-made server that ignores the first request and answers the next.
  std::string endpoint;
  StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &endpoint);
  ASSERT_TRUE(router.ok()) << router.status();
  std::vector<uint64_t> seen_ids;
  std::thread peer([&seen_ids, socket = std::move(router).value()]() mutable {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<zmq::message_t> frames = ReceiveFrames(socket, std::chrono::seconds(5));
      if (frames.size() < 2) return;
      zmq::message_t routing_id = std::move(frames[0]);
      frames.erase(frames.begin());
      StatusOr<Message> request = Message::FromFrames(std::move(frames));
      if (!request.ok()) return;
      seen_ids.push_back(request->header().request_id());
      if (attempt == 0) continue;  // dropped
      Message reply;
      reply.header().set_request_id(request->header().request_id());
      reply.header().set_method(request->header().method());
      reply.AddArray(std::vector<uint64_t>{42});
      std::vector<zmq::message_t> out;
      out.push_back(std::move(routing_id));
      for (zmq::message_t& f : std::move(reply).ToFrames()) out.push_back(std::move(f));
      SendFrames(socket, std::move(out));
    }
  });
  RpcChannel channel(&factory_, WorkerId(0));
  const uint64_t id = channel.Start(endpoint, Tagged(1), Fast(3, absl::Milliseconds(200)));
  StatusOr<Message> reply = channel.Wait(id);
  peer.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header().request_id(), id);
  StatusOr<std::span<const uint64_t>> answer = reply->Array<uint64_t>(0);
  ASSERT_TRUE(answer.ok());
  EXPECT_THAT(*answer, ElementsAreArray({42u}));
  EXPECT_THAT(seen_ids, ElementsAreArray({id, id}));
}

TEST_F(RpcTest, RetryOvertakesASlowFirstAttempt) {
  absl::Mutex mu;
  std::vector<uint64_t> seen_ids;
  RpcServerOptions options;
  options.num_threads = 2;
  auto server = StartServer(
      [&](Message& request, Message* reply) -> Status {
        bool first;
        {
          absl::MutexLock lock(&mu);
          first = seen_ids.empty();
          seen_ids.push_back(request.header().request_id());
        }
        // Simulates a peer that stalls past the attempt timeout once.
        if (first) absl::SleepFor(absl::Milliseconds(500));
        return Echo(request, reply);
      },
      options);
  RpcChannel channel(&factory_, WorkerId(0));
  const absl::Time start = absl::Now();
  const uint64_t id = channel.Start(server->endpoint(), Tagged(9), Fast(3));
  StatusOr<Message> reply = channel.Wait(id);
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header().request_id(), id);
  EXPECT_GE(elapsed, absl::Milliseconds(140));
  absl::MutexLock lock(&mu);
  ASSERT_GE(seen_ids.size(), 2u);
  EXPECT_EQ(seen_ids[0], id);
  EXPECT_EQ(seen_ids[1], id);
}

TEST_F(RpcTest, FastCallIsNotHeldUpByADeadPeer) {
  std::string silent;
  StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &silent);
  ASSERT_TRUE(router.ok());
  auto server = StartServer(Echo);
  RpcChannel channel(&factory_, WorkerId(0));
  const uint64_t slow = channel.Start(silent, Tagged(1), Fast(1, absl::Seconds(5)));
  const absl::Time start = absl::Now();
  const uint64_t fast = channel.Start(server->endpoint(), Tagged(2), Patient());
  ASSERT_TRUE(channel.Wait(fast).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(channel.pending(), 1u);
  channel.Cancel(slow);
  EXPECT_EQ(channel.pending(), 0u);
  EXPECT_EQ(channel.Wait(slow).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RpcTest, LateReplyToACancelledCallIsDropped) {
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    ASSIGN_OR_RETURN(std::span<const uint64_t> tag, request.Array<uint64_t>(0));
    if (tag[0] == 1) absl::SleepFor(absl::Milliseconds(100));  // a slow peer
    return Echo(request, reply);
  });
  RpcChannel channel(&factory_, WorkerId(0));
  const uint64_t cancelled = channel.Start(server->endpoint(), Tagged(1), Patient());
  channel.Cancel(cancelled);
  const uint64_t second = channel.Start(server->endpoint(), Tagged(2), Patient());
  StatusOr<Message> reply = channel.Wait(second);
  ASSERT_TRUE(reply.ok()) << reply.status();
  StatusOr<std::span<const uint64_t>> tag = reply->Array<uint64_t>(0);
  ASSERT_TRUE(tag.ok());
  EXPECT_THAT(*tag, ElementsAreArray({2u}));
  // A third call is not confused by the late reply either.
  reply = channel.Call(server->endpoint(), Tagged(3), Patient());
  ASSERT_TRUE(reply.ok()) << reply.status();
  tag = reply->Array<uint64_t>(0);
  ASSERT_TRUE(tag.ok());
  EXPECT_THAT(*tag, ElementsAreArray({3u}));
  EXPECT_EQ(channel.pending(), 0u);
}

// WaitUntil returns nothing while the call runs, keeps it pending, and
// hands over the reply once it came.
TEST_F(RpcTest, WaitUntilReturnsWhileTheCallRuns) {
  absl::Notification release;
  auto server = StartServer([&](Message& request, Message* reply) -> Status {
    release.WaitForNotificationWithTimeout(absl::Seconds(5));
    return Echo(request, reply);
  });
  RpcChannel channel(&factory_, WorkerId(0));
  const uint64_t call = channel.Start(server->endpoint(), Tagged(7), Patient());
  const absl::Time before = absl::Now();
  EXPECT_FALSE(channel.WaitUntil(call, before + absl::Milliseconds(50)).has_value());
  EXPECT_GE(absl::Now() - before, absl::Milliseconds(50));
  EXPECT_EQ(channel.pending(), 1u);
  release.Notify();
  std::optional<StatusOr<Message>> reply;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!reply.has_value() && absl::Now() < deadline) {
    reply = channel.WaitUntil(call, absl::Now() + absl::Milliseconds(20));
  }
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(reply->ok()) << reply->status();
  StatusOr<std::span<const uint64_t>> tag = (*reply)->Array<uint64_t>(0);
  ASSERT_TRUE(tag.ok());
  EXPECT_THAT(*tag, ElementsAreArray({7u}));
  EXPECT_EQ(channel.pending(), 0u);
  EXPECT_EQ(channel.WaitUntil(call, absl::Now())->status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The server knows when its oldest unanswered request arrived, whatever a
// handler is doing with it: the master judges leases by it.
TEST_F(RpcTest, OldestWaitingIsTheArrivalOfTheOldestUnansweredRequest) {
  absl::Notification release;
  RpcServerOptions options;
  options.track_waiting = true;
  auto server = StartServer(
      [&](Message& request, Message* reply) -> Status {
        release.WaitForNotificationWithTimeout(absl::Seconds(5));
        return Echo(request, reply);
      },
      options);
  EXPECT_EQ(server->OldestWaiting(), std::nullopt);
  RpcChannel channel(&factory_, WorkerId(0));
  const absl::Time sent = absl::Now();
  const uint64_t call = channel.Start(server->endpoint(), Tagged(7), Patient());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!server->OldestWaiting().has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(server->OldestWaiting().has_value());
  const absl::Time arrived = *server->OldestWaiting();
  EXPECT_GE(arrived, sent);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(server->OldestWaiting(), arrived) << "still the arrival, not the time now";
  release.Notify();
  std::optional<StatusOr<Message>> reply;
  while (!reply.has_value() && absl::Now() < deadline) {
    reply = channel.WaitUntil(call, absl::Now() + absl::Milliseconds(20));
  }
  ASSERT_TRUE(reply.has_value() && reply->ok());
  EXPECT_EQ(server->OldestWaiting(), std::nullopt);
}

TEST_F(RpcTest, ChannelMisuseIsReported) {
  RpcChannel channel(&factory_, WorkerId(0));
  const uint64_t bad = channel.Start("not-an-endpoint", Tagged(1), Patient());
  StatusOr<Message> reply = channel.Wait(bad);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("not-an-endpoint"));
  // Each id is waited for once.
  EXPECT_EQ(channel.Wait(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(channel.Wait(12345).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(channel.pending(), 0u);
}

TEST_F(RpcTest, RequestIdsAreDistinctAcrossChannels) {
  auto server = StartServer(Echo);
  RpcChannel a(&factory_, WorkerId(0));
  RpcChannel b(&factory_, WorkerId(1));
  std::vector<uint64_t> a_ids, b_ids;
  for (int i = 0; i < 4; ++i) {
    a_ids.push_back(a.Start(server->endpoint(), Tagged(i), Patient()));
    b_ids.push_back(b.Start(server->endpoint(), Tagged(i), Patient()));
  }
  std::vector<uint64_t> all = a_ids;
  all.insert(all.end(), b_ids.begin(), b_ids.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
  for (uint64_t id : a_ids) EXPECT_TRUE(a.Wait(id).ok());
  for (uint64_t id : b_ids) EXPECT_TRUE(b.Wait(id).ok());
}

TEST_F(RpcTest, StopIsPromptAndIdempotent) {
  auto server = StartServer(Echo);
  const std::string endpoint = server->endpoint();
  RpcChannel channel(&factory_, WorkerId(0));
  ASSERT_TRUE(channel.Call(endpoint, Tagged(1), Patient()).ok());
  const absl::Time start = absl::Now();
  server->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  server->Stop();
  // Nobody answers any more.
  EXPECT_EQ(channel.Call(endpoint, Tagged(2), Fast(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  server.reset();  // the destructor Stop()s again
}

// A reply its handler finished before Stop() still reaches the caller:
// the master answers a peer's last heartbeat ("the job is over") and stops
// at once, and a peer that never hears it waits out its master timeout.
TEST_F(RpcTest, RepliesHandedOutBeforeStopReachTheCaller) {
  constexpr int kRounds = 40;
  int lost = 0;
  for (int round = 0; round < kRounds; ++round) {
    absl::Notification handled;
    auto server = StartServer([&](Message& request, Message* reply) -> Status {
      handled.Notify();
      return Echo(request, reply);
    });
    RpcChannel channel(&factory_, WorkerId(0));
    const uint64_t id = channel.Start(server->endpoint(), Tagged(round), Patient());
    ASSERT_TRUE(handled.WaitForNotificationWithTimeout(absl::Seconds(5)));
    server->Stop();
    StatusOr<Message> reply = channel.Wait(id);
    if (!reply.ok()) ++lost;
  }
  EXPECT_EQ(lost, 0) << "of " << kRounds << " replies";
}

TEST_F(RpcTest, StopWithCallsInFlightDoesNotHang) {
  absl::Notification entered;
  std::atomic<bool> notified{false};
  RpcServerOptions options;
  options.num_threads = 2;
  auto server = StartServer(
      [&](Message& request, Message* reply) -> Status {
        if (!notified.exchange(true)) entered.Notify();
        absl::SleepFor(absl::Milliseconds(100));  // a slow handler
        return Echo(request, reply);
      },
      options);
  RpcChannel channel(&factory_, WorkerId(0));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(channel.Start(server->endpoint(), Tagged(i), Fast(1, absl::Seconds(1))));
  }
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  server->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (uint64_t id : ids) {
    StatusOr<Message> reply = channel.Wait(id);
    EXPECT_TRUE(reply.ok() || reply.status().code() == absl::StatusCode::kDeadlineExceeded)
        << reply.status();
  }
}

TEST_F(RpcTest, StartRejectsBadOptionsAndTakenEndpoints) {
  RpcServerOptions no_threads;
  no_threads.num_threads = 0;
  EXPECT_EQ(RpcServer::Start(&factory_, no_threads, Echo).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto server = StartServer(Echo);
  RpcServerOptions same;
  same.endpoint = server->endpoint();
  StatusOr<std::unique_ptr<RpcServer>> second = RpcServer::Start(&factory_, same, Echo);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(server->endpoint()));
  // The first server is unharmed.
  RpcChannel channel(&factory_, WorkerId(0));
  EXPECT_TRUE(channel.Call(server->endpoint(), Tagged(1), Patient()).ok());
}

TEST(SocketFactory, BindRouterReportsTheBoundEndpoint) {
  SocketFactory factory;
  std::string bound;
  StatusOr<zmq::socket_t> router = factory.BindRouter("tcp://127.0.0.1:0", &bound);
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_THAT(bound, HasSubstr("tcp://127.0.0.1:"));
  EXPECT_NE(bound, "tcp://127.0.0.1:0");

  std::string ignored;
  EXPECT_EQ(factory.BindRouter(bound, &ignored).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(factory.BindRouter("tcp://127.0.0.1", &ignored).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(factory.BindRouter("bogus://127.0.0.1:0", &ignored).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(factory.ConnectDealer("tcp://127.0.0.1", proto::ROLE_SERVER).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Limits `factory`'s context to `n` sockets. REQUIRES: no socket made yet.
void LimitSockets(SocketFactory& factory, int n) {
  ASSERT_EQ(zmq_ctx_set(factory.context().handle(), ZMQ_MAX_SOCKETS, n), 0);
}

TEST(SocketFactory, RunningOutOfSocketsIsAStatus) {
  SocketFactory factory;
  LimitSockets(factory, 1);
  std::string bound;
  StatusOr<zmq::socket_t> first = factory.BindRouter("tcp://127.0.0.1:0", &bound);
  ASSERT_TRUE(first.ok()) << first.status();

  std::string ignored;
  EXPECT_EQ(factory.BindRouter("tcp://127.0.0.1:0", &ignored).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(factory.ConnectDealer(bound, proto::ROLE_SERVER).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(RpcServer::Start(&factory, RpcServerOptions{}, Echo).status().code(),
            absl::StatusCode::kUnavailable);
  RpcChannel channel(&factory, WorkerId(0));
  StatusOr<Message> reply = channel.Call(bound, Tagged(1), Fast(1));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(channel.pending(), 0u);
}

TEST(RpcServer, StartOutOfSocketsIsAStatus) {
  for (int limit = 1; limit <= 4; ++limit) {
    SCOPED_TRACE(limit);
    SocketFactory factory;
    LimitSockets(factory, limit);
    RpcServerOptions options;
    options.num_threads = 2;  // needs 6 sockets in all
    StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(&factory, options, Echo);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  }
}

TEST(RpcServer, StopNeedsNoNewSocket) {
  // Start takes every socket it will ever need, so that Stop (and the
  // destructor) cannot fail when the process is out of sockets.
  SocketFactory factory;
  LimitSockets(factory, 16);
  StatusOr<std::unique_ptr<RpcServer>> server =
      RpcServer::Start(&factory, RpcServerOptions{}, Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<zmq::socket_t> hogs;  // the rest of the budget
  for (int i = 0; i < 16; ++i) {
    try {
      hogs.push_back(factory.MakeSocket(zmq::socket_type::pair));
    } catch (const zmq::error_t& e) {
      break;
    }
  }
  ASSERT_LT(hogs.size(), 16u);
  const absl::Time start = absl::Now();
  (*server)->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(TransportOptions, Validate) {
  EXPECT_TRUE(TransportOptions{}.Validate().ok());
  TransportOptions options;
  options.max_message_bytes = 100;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = TransportOptions{};
  options.reconnect_ivl_ms = 0;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = TransportOptions{};
  options.reconnect_ivl_max_ms = options.reconnect_ivl_ms - 1;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = TransportOptions{};
  options.high_water_mark = 0;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = TransportOptions{};
  options.io_threads = 0;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eps
