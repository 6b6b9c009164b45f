// Message: one eps request or reply as it travels over ZeroMQ.
//
// Frame 0 is the protobuf Envelope (protocol version, request id, method,
// status, cluster-map version, the method's body); every further frame is a
// raw little-endian array. Arrays are read back as spans that alias the
// received frame (no copy) when it is suitably aligned.
//
// Thread-safety: a value type; one thread at a time.

#ifndef EPS_RPC_MESSAGE_H_
#define EPS_RPC_MESSAGE_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "proto/eps.pb.h"
#include "zmq.hpp"

namespace eps {

static_assert(std::endian::native == std::endian::little,
              "eps frames are little-endian arrays copied byte for byte");

// Bumped when a peer of the previous version can no longer be understood.
inline constexpr uint32_t kProtocolVersion = 1;

class Message {
 public:
  Message() = default;
  Message(Message&&) = default;
  Message& operator=(Message&&) = default;

  proto::Envelope& header() { return header_; }
  const proto::Envelope& header() const { return header_; }

  // Number of bulk frames (not counting the envelope).
  size_t num_frames() const { return frames_.size(); }
  const zmq::message_t& frame(size_t i) const { return frames_[i]; }

  // Appends a bulk frame holding a copy of `values`.
  template <typename T>
  void AddArray(std::span<const T> values) {
    static_assert(std::is_trivially_copyable_v<T>);
    frames_.emplace_back(values.data(), values.size_bytes());
  }
  template <typename T>
  void AddArray(const std::vector<T>& values) {
    AddArray(std::span<const T>(values));
  }
  // Appends an uninitialised frame of `count` values and returns it for
  // filling in place. The span stays valid while this Message lives and
  // is not converted by ToFrames.
  template <typename T>
  std::span<T> AddUninitializedArray(size_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    frames_.emplace_back(count * sizeof(T));
    return {static_cast<T*>(frames_.back().data()), count};
  }
  void AddFrame(zmq::message_t frame) { frames_.push_back(std::move(frame)); }

  // Bulk frame `i` viewed as an array of T. kInvalidArgument when the frame
  // is missing or its size is not a multiple of sizeof(T). The span lives
  // as long as this Message.
  template <typename T>
  StatusOr<std::span<const T>> Array(size_t i) const {
    static_assert(std::is_trivially_copyable_v<T>);
    if (i >= frames_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("message has ", frames_.size(), " bulk frames, frame ", i, " is missing"));
    }
    const zmq::message_t& frame = frames_[i];
    if (frame.size() % sizeof(T) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frame ", i, " has ", frame.size(), " bytes, not a multiple of ", sizeof(T)));
    }
    const size_t count = frame.size() / sizeof(T);
    if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(T) == 0) {
      return std::span<const T>(static_cast<const T*>(frame.data()), count);
    }
    // Small frames live inside the zmq_msg_t and may be misaligned.
    auto copy = std::make_unique<T[]>(count);
    std::memcpy(copy.get(), frame.data(), frame.size());
    std::span<const T> view(copy.get(), count);
    aligned_copies_.push_back(std::unique_ptr<void, void (*)(void*)>(
        copy.release(), [](void* p) { delete[] static_cast<T*>(p); }));
    return view;
  }

  // Turns this message into ZeroMQ frames (the envelope first) and hands
  // them to `out`; the bulk frames are moved, not copied.
  std::vector<zmq::message_t> ToFrames() &&;
  // A shallow copy of the frames for resending: bulk buffers are shared by
  // reference count, not copied.
  std::vector<zmq::message_t> CopyFrames() const;

  // Parses frames (the envelope first). kInvalidArgument when the envelope
  // does not parse or speaks another protocol version.
  static StatusOr<Message> FromFrames(std::vector<zmq::message_t> frames);

  // "PULL id=7 status=OK frames=[800B, 400B]".
  std::string DebugString() const;

 private:
  proto::Envelope header_;
  // A deque: appending never moves earlier frames, so the spans handed out
  // by AddUninitializedArray stay valid (small frames keep their bytes
  // inside the zmq_msg_t and would move with it).
  std::deque<zmq::message_t> frames_;
  mutable std::vector<std::unique_ptr<void, void (*)(void*)>> aligned_copies_;
};

// Bytes of a message's frames together.
uint64_t FramesBytes(const std::vector<zmq::message_t>& frames);

// kResourceExhausted when `frames` carry more than `limit` bytes
// (TransportOptions.max_message_bytes): `what` ("PUSH to tcp://...", "the
// reply to PULL") is over the limit, and `remedy` says what to do.
Status CheckMessageBytes(const std::vector<zmq::message_t>& frames, int64_t limit,
                         absl::string_view what, absl::string_view remedy);

// Status <-> wire. The ErrorReason travels as a payload of the Status.
void StatusToProto(const Status& status, proto::StatusProto* out);
Status StatusFromProto(const proto::StatusProto& proto);

// A Status that tells the caller what to do beyond its code.
Status ErrorWithReason(absl::StatusCode code, absl::string_view message,
                       proto::ErrorReason reason);
proto::ErrorReason ReasonOf(const Status& status);

// The status carried by a reply (OK when none).
inline Status ReplyStatus(const Message& reply) {
  return reply.header().has_status() ? StatusFromProto(reply.header().status())
                                     : absl::OkStatus();
}

}  // namespace eps

#endif  // EPS_RPC_MESSAGE_H_
