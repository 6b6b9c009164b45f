#include "rpc/message.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace eps {
namespace {
constexpr char kReasonPayload[] = "eps.reason";
}  // namespace

std::vector<zmq::message_t> Message::ToFrames() && {
  std::vector<zmq::message_t> out;
  out.reserve(frames_.size() + 1);
  header_.set_protocol_version(kProtocolVersion);
  std::string bytes = header_.SerializeAsString();
  out.emplace_back(bytes.data(), bytes.size());
  for (zmq::message_t& frame : frames_) out.push_back(std::move(frame));
  frames_.clear();
  return out;
}

std::vector<zmq::message_t> Message::CopyFrames() const {
  std::vector<zmq::message_t> out;
  out.reserve(frames_.size() + 1);
  proto::Envelope header = header_;
  header.set_protocol_version(kProtocolVersion);
  std::string bytes = header.SerializeAsString();
  out.emplace_back(bytes.data(), bytes.size());
  for (const zmq::message_t& frame : frames_) {
    zmq::message_t copy;
    // zmq_msg_copy shares large buffers by reference count.
    copy.copy(const_cast<zmq::message_t&>(frame));
    out.push_back(std::move(copy));
  }
  return out;
}

StatusOr<Message> Message::FromFrames(std::vector<zmq::message_t> frames) {
  if (frames.empty()) return absl::InvalidArgumentError("empty message");
  Message message;
  if (!message.header_.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()))) {
    return absl::InvalidArgumentError("envelope frame does not parse");
  }
  if (message.header_.protocol_version() != kProtocolVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("protocol version ", message.header_.protocol_version(),
                     " is not supported (this build speaks ", kProtocolVersion, ")"));
  }
  for (size_t i = 1; i < frames.size(); ++i) message.frames_.push_back(std::move(frames[i]));
  return message;
}

std::string Message::DebugString() const {
  std::vector<std::string> sizes;
  for (const zmq::message_t& frame : frames_) sizes.push_back(absl::StrCat(frame.size(), "B"));
  return absl::StrCat(
      proto::Method_Name(header_.method()), " id=", header_.request_id(),
      header_.has_status() ? absl::StrCat(" status=", StatusFromProto(header_.status()).ToString())
                           : "",
      " body={", header_.ShortDebugString(), "} frames=[", absl::StrJoin(sizes, ", "), "]");
}

void StatusToProto(const Status& status, proto::StatusProto* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
  out->set_reason(ReasonOf(status));
}

Status StatusFromProto(const proto::StatusProto& proto) {
  if (proto.code() == 0) return absl::OkStatus();
  // A code from a newer or hostile peer that absl does not know becomes
  // kUnknown rather than a StatusCode value outside the enum.
  // absl's codes are exactly 0..16.
  const bool known =
      proto.code() > 0 && proto.code() <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
  const auto code =
      known ? static_cast<absl::StatusCode>(proto.code()) : absl::StatusCode::kUnknown;
  return ErrorWithReason(code, proto.message(), proto.reason());
}

Status ErrorWithReason(absl::StatusCode code, absl::string_view message,
                       proto::ErrorReason reason) {
  Status status(code, message);
  if (reason != proto::REASON_UNSPECIFIED) {
    status.SetPayload(kReasonPayload, absl::Cord(proto::ErrorReason_Name(reason)));
  }
  return status;
}

proto::ErrorReason ReasonOf(const Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kReasonPayload);
  proto::ErrorReason reason = proto::REASON_UNSPECIFIED;
  if (payload.has_value()) proto::ErrorReason_Parse(std::string(payload->Flatten()), &reason);
  return reason;
}

uint64_t FramesBytes(const std::vector<zmq::message_t>& frames) {
  uint64_t bytes = 0;
  for (const zmq::message_t& frame : frames) bytes += frame.size();
  return bytes;
}

Status CheckMessageBytes(const std::vector<zmq::message_t>& frames, int64_t limit,
                         absl::string_view what, absl::string_view remedy) {
  const uint64_t bytes = FramesBytes(frames);
  if (bytes <= static_cast<uint64_t>(limit)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s is %.1f MiB, over the %.1f MiB one message may carry: %s", what,
      bytes / double{1 << 20}, limit / double{1 << 20}, remedy));
}

}  // namespace eps
