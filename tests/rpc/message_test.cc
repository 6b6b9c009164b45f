// Tests rpc/message.h: frames, arrays, the envelope and Status on the wire.

#include "rpc/message.h"

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<uint64_t> Keys(size_t n) {
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = 0x1234567890abcdefULL * (i + 1);
  return keys;
}

std::vector<float> Values(size_t n) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = 0.5f * static_cast<float>(i) - 3.25f;
  return values;
}

Message PushMessage(const std::vector<uint64_t>& keys, const std::vector<float>& values) {
  Message message;
  message.header().set_request_id(42);
  message.header().set_method(proto::PUSH);
  message.header().set_cluster_map_version(9);
  message.header().mutable_sender()->set_role(proto::ROLE_WORKER);
  message.header().mutable_sender()->set_id(3);
  message.header().mutable_push_request()->add_table_ids(5);
  message.header().mutable_push_request()->set_client_seq(11);
  message.AddArray(keys);
  message.AddArray(values);
  return message;
}

TEST(Message, RoundTripsThroughFrames) {
  const std::vector<uint64_t> keys = Keys(100);
  const std::vector<float> values = Values(400);
  std::vector<zmq::message_t> frames = PushMessage(keys, values).ToFrames();
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[1].size(), 800u);
  EXPECT_EQ(frames[2].size(), 1600u);

  StatusOr<Message> parsed = Message::FromFrames(std::move(frames));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header().protocol_version(), kProtocolVersion);
  EXPECT_EQ(parsed->header().request_id(), 42u);
  EXPECT_EQ(parsed->header().method(), proto::PUSH);
  EXPECT_EQ(parsed->header().cluster_map_version(), 9u);
  EXPECT_EQ(parsed->header().sender().role(), proto::ROLE_WORKER);
  EXPECT_EQ(parsed->header().sender().id(), 3u);
  ASSERT_TRUE(parsed->header().has_push_request());
  EXPECT_THAT(parsed->header().push_request().table_ids(), ElementsAre(5u));
  EXPECT_EQ(parsed->header().push_request().client_seq(), 11u);
  ASSERT_EQ(parsed->num_frames(), 2u);

  StatusOr<std::span<const uint64_t>> got_keys = parsed->Array<uint64_t>(0);
  ASSERT_TRUE(got_keys.ok()) << got_keys.status();
  EXPECT_THAT(*got_keys, ElementsAreArray(keys));
  StatusOr<std::span<const float>> got_values = parsed->Array<float>(1);
  ASSERT_TRUE(got_values.ok()) << got_values.status();
  EXPECT_THAT(*got_values, ElementsAreArray(values));
}

TEST(Message, EmptyArraysAndNoArrays) {
  Message message;
  message.header().set_method(proto::PULL);
  message.AddArray(std::vector<uint64_t>{});
  StatusOr<Message> parsed = Message::FromFrames(std::move(message).ToFrames());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->num_frames(), 1u);
  StatusOr<std::span<const uint64_t>> keys = parsed->Array<uint64_t>(0);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->empty());

  Message bare;
  bare.header().set_method(proto::HEARTBEAT);
  StatusOr<Message> bare_parsed = Message::FromFrames(std::move(bare).ToFrames());
  ASSERT_TRUE(bare_parsed.ok()) << bare_parsed.status();
  EXPECT_EQ(bare_parsed->num_frames(), 0u);
}

TEST(Message, ArrayRejectsSizeNotAMultiple) {
  Message message;
  const char bytes[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  message.AddFrame(zmq::message_t(bytes, sizeof(bytes)));
  StatusOr<std::span<const uint64_t>> as_u64 = message.Array<uint64_t>(0);
  ASSERT_FALSE(as_u64.ok());
  EXPECT_EQ(as_u64.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(as_u64.status().message()), HasSubstr("12 bytes"));
  // The same 12 bytes are three floats.
  StatusOr<std::span<const float>> as_float = message.Array<float>(0);
  ASSERT_TRUE(as_float.ok()) << as_float.status();
  EXPECT_EQ(as_float->size(), 3u);
}

TEST(Message, ArrayRejectsMissingFrame) {
  Message message;
  message.AddArray(Keys(2));
  StatusOr<std::span<const uint64_t>> missing = message.Array<uint64_t>(1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing"));
}

// A frame whose bytes start at an odd address, as frames received over TCP
// often do (they alias ZeroMQ's receive buffer after a short header).
TEST(Message, MisalignedFramesReadCorrectly) {
  for (size_t count : {1, 3, 4, 1000}) {
    SCOPED_TRACE(count);
    const std::vector<uint64_t> keys = Keys(count);
    std::vector<char> buffer(keys.size() * sizeof(uint64_t) + 1);
    char* odd = buffer.data() + 1;
    std::memcpy(odd, keys.data(), keys.size() * sizeof(uint64_t));
    ASSERT_NE(reinterpret_cast<uintptr_t>(odd) % alignof(uint64_t), 0u);

    Message message;
    // No free function: `buffer` owns the bytes and outlives `message`.
    message.AddFrame(zmq::message_t(odd, keys.size() * sizeof(uint64_t), nullptr, nullptr));
    StatusOr<std::span<const uint64_t>> got = message.Array<uint64_t>(0);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got->data()) % alignof(uint64_t), 0u);
    EXPECT_THAT(*got, ElementsAreArray(keys));
    // A second view stays valid alongside the first.
    StatusOr<std::span<const uint64_t>> again = message.Array<uint64_t>(0);
    ASSERT_TRUE(again.ok());
    EXPECT_THAT(*again, ElementsAreArray(keys));
    EXPECT_THAT(*got, ElementsAreArray(keys));
  }
}

TEST(Message, AlignedFramesAreNotCopied) {
  Message message;
  message.AddArray(Keys(1000));
  StatusOr<std::span<const uint64_t>> got = message.Array<uint64_t>(0);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(static_cast<const void*>(got->data()), message.frame(0).data());
}

TEST(Message, UninitializedArrayIsFilledInPlace) {
  Message message;
  message.header().set_method(proto::PULL);
  std::span<float> values = message.AddUninitializedArray<float>(5);
  ASSERT_EQ(values.size(), 5u);
  std::iota(values.begin(), values.end(), 1.0f);
  StatusOr<Message> parsed = Message::FromFrames(std::move(message).ToFrames());
  ASSERT_TRUE(parsed.ok());
  StatusOr<std::span<const float>> got = parsed->Array<float>(0);
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(*got, ElementsAre(1.0f, 2.0f, 3.0f, 4.0f, 5.0f));
}

TEST(Message, UninitializedArraysStayValidWhenMoreFramesAreAdded) {
  // Small frames keep their bytes inside the zmq_msg_t: a frame that moved
  // when a later one was added would leave the first span dangling.
  Message message;
  std::vector<std::span<uint64_t>> spans;
  for (uint64_t i = 0; i < 40; ++i) spans.push_back(message.AddUninitializedArray<uint64_t>(2));
  for (uint64_t i = 0; i < spans.size(); ++i) {
    spans[i][0] = i;
    spans[i][1] = 1000 + i;
  }
  for (uint64_t i = 0; i < spans.size(); ++i) {
    StatusOr<std::span<const uint64_t>> array = message.Array<uint64_t>(i);
    ASSERT_TRUE(array.ok());
    EXPECT_EQ((*array)[0], i);
    EXPECT_EQ((*array)[1], 1000 + i);
  }
}

TEST(Message, CopyFramesLeavesTheMessageIntact) {
  const std::vector<uint64_t> keys = Keys(64);
  const std::vector<float> values = Values(3);
  Message message = PushMessage(keys, values);
  for (int round = 0; round < 2; ++round) {
    StatusOr<Message> copy = Message::FromFrames(message.CopyFrames());
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_EQ(copy->header().request_id(), 42u);
    EXPECT_EQ(copy->header().protocol_version(), kProtocolVersion);
    StatusOr<std::span<const uint64_t>> got = copy->Array<uint64_t>(0);
    ASSERT_TRUE(got.ok());
    EXPECT_THAT(*got, ElementsAreArray(keys));
  }
  ASSERT_EQ(message.num_frames(), 2u);
  StatusOr<std::span<const float>> original = message.Array<float>(1);
  ASSERT_TRUE(original.ok());
  EXPECT_THAT(*original, ElementsAreArray(values));
}

TEST(Message, FromFramesRejectsEmptyGarbageAndOtherVersions) {
  StatusOr<Message> empty = Message::FromFrames({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);

  std::vector<zmq::message_t> garbage;
  const std::string junk(16, '\xff');
  garbage.emplace_back(junk.data(), junk.size());
  StatusOr<Message> bad = Message::FromFrames(std::move(garbage));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);

  proto::Envelope envelope;
  envelope.set_protocol_version(kProtocolVersion + 1);
  envelope.set_request_id(5);
  std::vector<zmq::message_t> future;
  const std::string bytes = envelope.SerializeAsString();
  future.emplace_back(bytes.data(), bytes.size());
  StatusOr<Message> newer = Message::FromFrames(std::move(future));
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(newer.status().message()), HasSubstr("protocol version"));

  // An envelope with no version at all (version 0) is not ours either.
  std::vector<zmq::message_t> unversioned;
  unversioned.emplace_back();
  StatusOr<Message> zero = Message::FromFrames(std::move(unversioned));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Message, DebugStringMentionsMethodIdAndFrameSizes) {
  Message message = PushMessage(Keys(100), Values(100));
  message.header().set_request_id(7);
  const std::string text = message.DebugString();
  EXPECT_THAT(text, HasSubstr("PUSH"));
  EXPECT_THAT(text, HasSubstr("id=7"));
  EXPECT_THAT(text, HasSubstr("800B"));
  EXPECT_THAT(text, HasSubstr("400B"));

  Message reply;
  reply.header().set_method(proto::PULL);
  StatusToProto(absl::NotFoundError("no such table"), reply.header().mutable_status());
  EXPECT_THAT(reply.DebugString(), HasSubstr("no such table"));
}

TEST(StatusOnTheWire, RoundTripKeepsCodeMessageAndReason) {
  const Status original = ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                          "partition 3 moved", proto::WRONG_OWNER);
  EXPECT_EQ(ReasonOf(original), proto::WRONG_OWNER);
  proto::StatusProto wire;
  StatusToProto(original, &wire);
  EXPECT_EQ(wire.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(wire.reason(), proto::WRONG_OWNER);

  // Through bytes, as a peer would see it.
  proto::StatusProto parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  const Status back = StatusFromProto(parsed);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "partition 3 moved");
  EXPECT_EQ(ReasonOf(back), proto::WRONG_OWNER);
}

TEST(StatusOnTheWire, PlainErrorsAndOkHaveNoReason) {
  EXPECT_EQ(ReasonOf(absl::UnavailableError("down")), proto::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), proto::REASON_UNSPECIFIED);
  proto::StatusProto wire;
  StatusToProto(absl::OkStatus(), &wire);
  EXPECT_TRUE(StatusFromProto(wire).ok());
  const Status no_reason =
      ErrorWithReason(absl::StatusCode::kUnavailable, "x", proto::REASON_UNSPECIFIED);
  EXPECT_FALSE(no_reason.GetPayload("eps.reason").has_value());
}

TEST(StatusOnTheWire, ReasonSurvivesAnnotate) {
  const Status annotated =
      Annotate(ErrorWithReason(absl::StatusCode::kUnavailable, "not ready", proto::NOT_READY),
               "register with master");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(annotated.message(), "register with master: not ready");
  EXPECT_EQ(ReasonOf(annotated), proto::NOT_READY);
}

TEST(StatusOnTheWire, HostileCodesAndReasonsDoNotConfuse) {
  proto::StatusProto wire;
  wire.set_code(12345);
  wire.set_message("from a stranger");
  wire.set_reason(static_cast<proto::ErrorReason>(999));
  const Status status = StatusFromProto(wire);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(std::string(status.message()), HasSubstr("from a stranger"));
  EXPECT_EQ(ReasonOf(status), proto::REASON_UNSPECIFIED);

  wire.set_code(-3);
  EXPECT_EQ(StatusFromProto(wire).code(), absl::StatusCode::kUnknown);
}

TEST(StatusOnTheWire, ReplyStatus) {
  Message reply;
  EXPECT_TRUE(ReplyStatus(reply).ok());
  StatusToProto(ErrorWithReason(absl::StatusCode::kFailedPrecondition, "fenced", proto::FENCED),
                reply.header().mutable_status());
  const Status status = ReplyStatus(reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(status), proto::FENCED);
}

}  // namespace
}  // namespace eps
