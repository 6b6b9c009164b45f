#include "master/server_calls.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

namespace {

proto::NodeId MasterId() {
  proto::NodeId self;
  self.set_role(proto::ROLE_MASTER);
  return self;
}

// Checkpoints of large tables and their restores take a while; a server
// that dies meanwhile is given up on through `serving`, not this.
constexpr absl::Duration kSlowCallTimeout = absl::Seconds(600);

}  // namespace

ServerCalls::ServerCalls(SocketFactory* factory, const Clock* clock)
    : clock_(clock), channel_(factory, MasterId()) {}

std::vector<StatusOr<Message>> ServerCalls::CallAll(const std::vector<ServerAddress>& servers,
                                                    const std::function<Message(size_t)>& make,
                                                    absl::Duration timeout,
                                                    const Serving& serving) {
  CallOptions call;
  call.attempt_timeout = timeout;
  call.max_attempts = 1;
  std::vector<uint64_t> calls;
  for (size_t i = 0; i < servers.size(); ++i) {
    calls.push_back(channel_.Start(servers[i].second, make(i), call));
  }
  std::vector<std::optional<StatusOr<Message>>> results(servers.size());
  size_t left = servers.size();
  while (left > 0) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (results[i].has_value()) continue;
      results[i] = channel_.WaitUntil(calls[i], clock_->Now() + absl::Milliseconds(20));
      if (results[i].has_value()) --left;
    }
    if (left == 0 || !serving) continue;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (results[i].has_value() || serving(servers[i])) continue;
      channel_.Cancel(calls[i]);
      results[i] = absl::UnavailableError(absl::StrCat("ps[", servers[i].first, "] at ",
                                                       servers[i].second,
                                                       " died before it answered"));
      --left;
    }
  }
  std::vector<StatusOr<Message>> out;
  for (auto& result : results) out.push_back(*std::move(result));
  return out;
}

std::vector<ServerAddress> ServerCalls::SendFences(const Membership::FenceRound& round,
                                                   absl::Duration timeout) {
  std::vector<StatusOr<Message>> replies = CallAll(
      round.servers,
      [&](size_t) {
        Message request;
        request.header().set_method(proto::FENCE_WORKERS);
        proto::FenceWorkersRequest* body = request.header().mutable_fence_workers_request();
        for (uint32_t id : round.fenced) body->add_worker_ids(id);
        return request;
      },
      timeout, /*serving=*/nullptr);
  std::vector<ServerAddress> refused;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].ok()) continue;
    refused.push_back(round.servers[i]);
    VLOG(1) << "fencing at " << round.servers[i].second << ": " << replies[i].status();
  }
  return refused;
}

std::vector<StatusOr<proto::ServerCheckpoint>> ServerCalls::WriteCheckpoint(
    uint64_t id, const std::vector<uint64_t>& keep, const std::vector<ServerAddress>& servers,
    const Serving& serving) {
  std::vector<StatusOr<Message>> replies = CallAll(
      servers,
      [&](size_t) {
        Message request;
        request.header().set_method(proto::CHECKPOINT);
        proto::CheckpointRequest* body = request.header().mutable_checkpoint_request();
        body->set_checkpoint_id(id);
        for (uint64_t kept : keep) body->add_keep_ids(kept);
        return request;
      },
      kSlowCallTimeout, serving);
  std::vector<StatusOr<proto::ServerCheckpoint>> results;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].ok()) {
      results.push_back(Annotate(replies[i].status(), absl::StrCat("ps[", servers[i].first, "]")));
      continue;
    }
    const proto::CheckpointReply& body = replies[i]->header().checkpoint_reply();
    proto::ServerCheckpoint part;
    part.set_server_id(servers[i].first);
    part.set_path(body.path());
    part.set_bytes(body.bytes());
    part.set_duration_ms(body.duration_ms());
    results.push_back(part);
  }
  return results;
}

std::vector<StatusOr<uint64_t>> ServerCalls::Restore(
    uint64_t id, const std::vector<Recovery::RestoreTarget>& targets, const Serving& serving,
    const std::string& init_from, bool init_state) {
  std::vector<ServerAddress> servers;
  for (const Recovery::RestoreTarget& target : targets) {
    servers.emplace_back(target.slot, target.endpoint);
  }
  std::vector<StatusOr<Message>> replies = CallAll(
      servers,
      [&](size_t i) {
        Message request;
        request.header().set_method(proto::RESTORE);
        proto::RestoreRequest* body = request.header().mutable_restore_request();
        body->set_checkpoint_id(id);
        body->set_path(targets[i].path);
        body->set_joined_after(targets[i].joined_after);
        if (id == 0 && !init_from.empty()) {
          body->set_init_from(init_from);
          body->set_init_optimizer_state(init_state);
        }
        return request;
      },
      kSlowCallTimeout, serving);
  std::vector<StatusOr<uint64_t>> results;
  for (StatusOr<Message>& reply : replies) {
    if (!reply.ok()) {
      results.push_back(reply.status());
    } else {
      const proto::RestoreReply& body = reply->header().restore_reply();
      results.push_back(id == 0 && !init_from.empty() ? body.rows_imported() : body.bytes());
    }
  }
  return results;
}

StatusOr<proto::MovePartitionReply> ServerCalls::MovePartition(
    const ServerAddress& server, const proto::MovePartitionRequest& step, const Serving& serving) {
  std::vector<StatusOr<Message>> replies = CallAll(
      {server},
      [&](size_t) {
        Message request;
        request.header().set_method(proto::MOVE_PARTITION);
        *request.header().mutable_move_partition_request() = step;
        return request;
      },
      kSlowCallTimeout, serving);
  if (!replies[0].ok()) {
    return Annotate(replies[0].status(), absl::StrCat("ps[", server.first, "]"));
  }
  return replies[0]->header().move_partition_reply();
}

std::vector<StatusOr<proto::ExportReply>> ServerCalls::Export(
    const std::string& dir, const std::vector<ServerAddress>& servers, const Serving& serving,
    uint64_t map_version, std::optional<uint32_t> passes_done) {
  std::vector<StatusOr<Message>> replies = CallAll(
      servers,
      [&](size_t) {
        Message request;
        request.header().set_method(proto::EXPORT);
        request.header().set_cluster_map_version(map_version);
        request.header().mutable_export_request()->set_dir(dir);
        if (passes_done.has_value()) {
          request.header().mutable_export_request()->set_passes_done(*passes_done);
        }
        return request;
      },
      kSlowCallTimeout, serving);
  std::vector<StatusOr<proto::ExportReply>> results;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].ok()) {
      results.push_back(Annotate(replies[i].status(), absl::StrCat("ps[", servers[i].first, "]")));
    } else {
      results.push_back(replies[i]->header().export_reply());
    }
  }
  return results;
}

}  // namespace eps
