// Fuzzes what an RpcServer does with a request before and around its
// handler (RpcServer::Handle): the frame count bound, the envelope's
// parse and protocol version, the sender's authorization for every
// proto::Method (AuthorizeCall; under CURVE, the claimed role against the
// key's), and the reply it builds; the handler then decodes every bulk frame
// as the typed arrays the methods carry (keys, gradients, values, eval
// labels and predictions).
//
// Input: one byte choosing the peer (bit 7: CURVE on; the rest modulo 5:
// the key's role, none/master/server/worker/tool), then a chunked input
// (fuzz/fuzz_support.h) whose chunks are the request's frames, the
// envelope first. Seeds: fuzz/corpus/rpc_request (fuzz/make_corpus.cc),
// real requests of every method.
//
// Invariants checked: the server answers every request of at least one
// frame, its reply decodes, and it echoes the request id of any envelope
// that parses.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cluster/call_table.h"
#include "core/logging.h"
#include "fuzz/fuzz_support.h"
#include "rpc/message.h"
#include "rpc/rpc_server.h"

namespace eps {
namespace {

// Decodes the request as the role handlers do: each bulk frame as every
// array type a method carries, the body and the status.
Status DecodeLikeAHandler(Message& request, Message* reply) {
  const proto::Envelope& header = request.header();
  uint64_t keys = 0;
  for (size_t i = 0; i < request.num_frames(); ++i) {
    StatusOr<std::span<const uint64_t>> ids = request.Array<uint64_t>(i);
    StatusOr<std::span<const float>> values = request.Array<float>(i);
    StatusOr<std::span<const uint32_t>> ends = request.Array<uint32_t>(i);
    if (ids.ok()) {
      for (uint64_t id : *ids) keys ^= id;
      reply->AddArray(*ids);
    }
    if (values.ok() && !values->empty()) reply->AddArray<float>(values->subspan(0, 1));
    if (ends.ok() && !ends->empty()) keys += (*ends)[ends->size() - 1];
  }
  (void)request.DebugString();
  const Status carried = ReplyStatus(request);
  // Both reply paths: a body, or an error with a reason.
  if (header.request_id() % 3 == 1) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           absl::StrCat("refused ", keys, carried.ToString()), proto::WRONG_OWNER);
  }
  reply->header().mutable_pull_reply();
  return absl::OkStatus();
}

constexpr const char* kKeyRoles[] = {"-", "master", "server", "worker", "tool"};

}  // namespace
}  // namespace eps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace eps;
  if (size < 1) return 0;
  const bool curve = (data[0] & 0x80) != 0;
  const std::string peer = absl::StrCat(kKeyRoles[(data[0] & 0x7f) % 5], " 127.0.0.1");
  const std::vector<absl::string_view> chunks = fuzz::SplitChunks(
      absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));

  RpcServerOptions options;
  options.max_frames = 8;
  options.authorize = AuthorizeCall;
  std::unique_ptr<RpcServer> server =
      RpcServer::CreateUnstartedForTesting(options, DecodeLikeAHandler, curve);
  std::vector<zmq::message_t> frames;
  frames.emplace_back("routing-id", 10);
  frames.emplace_back(peer.data(), peer.size());
  for (absl::string_view chunk : chunks) frames.emplace_back(chunk.data(), chunk.size());
  proto::Envelope sent;
  const bool parses =
      !chunks.empty() && sent.ParseFromArray(chunks[0].data(), static_cast<int>(chunks[0].size()));

  std::vector<zmq::message_t> out = server->HandleForTesting(std::move(frames));
  if (chunks.empty()) {
    CHECK(out.empty());
    return 0;
  }
  CHECK_GE(out.size(), 2u) << "a request of " << chunks.size() << " frames got no reply";
  CHECK(out[0].to_string_view() == "routing-id");
  out.erase(out.begin());
  StatusOr<Message> reply = Message::FromFrames(std::move(out));
  CHECK(reply.ok()) << "the server's reply does not decode: " << reply.status();
  if (parses) CHECK_EQ(reply->header().request_id(), sent.request_id());
  (void)reply->DebugString();
  return 0;
}
