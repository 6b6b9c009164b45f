#include "worker/ps_client.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "rpc/bfloat16.h"
#include "rpc/message.h"

namespace eps {

StatusOr<ParamTables> MatchParamTables(const proto::JobSpec& job,
                                       const std::vector<ParamSpec>& params) {
  ParamTables tables;
  for (const ParamSpec& param : params) {
    const proto::TableSpec* found = nullptr;
    for (const proto::TableSpec& table : job.tables()) {
      if (table.name() == param.name) found = &table;
    }
    const bool embedding = param.kind == ParamSpec::Kind::kEmbedding;
    if (found == nullptr ||
        (embedding ? found->kind() != proto::EMBEDDING || found->dim() != param.size
                   : found->kind() != proto::DENSE || found->dense_size() != param.size)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the master's job has no table matching the model's parameter '", param.name,
          "' (do the master and the worker read the same config?)"));
    }
    tables.ids.push_back(found->id());
    std::vector<uint64_t>& keys = tables.dense_keys.emplace_back();
    if (!embedding) {
      for (uint64_t c = 0; c < DenseChunkCount(found->dense_size(), found->dim()); ++c) {
        keys.push_back(DenseChunkKey(found->id(), c));
      }
    }
  }
  return tables;
}
namespace {

// Re-routing rounds after WRONG_OWNER answers before giving up.
constexpr int kMaxRoutingRounds = 5;

// A pull's version of a server not heard from yet (0 once the pull ends).
constexpr uint64_t kNoVersion = std::numeric_limits<uint64_t>::max();

}  // namespace

PsClient::PsClient(SocketFactory* factory, proto::NodeId self, proto::JobSpec job,
                   CallOptions options, MapSource refresh_map, size_t max_request_bytes)
    : factory_(factory),
      job_(std::move(job)),
      options_(options),
      refresh_map_(std::move(refresh_map)),
      max_request_bytes_(max_request_bytes),
      channel_(factory, std::move(self)) {}

Status PsClient::SetClusterMap(const proto::ClusterMap& map) {
  ASSIGN_OR_RETURN(Placement placement, Placement::FromProto(map));
  placement_ = std::make_unique<Placement>(std::move(placement));
  return absl::OkStatus();
}

Status PsClient::Refresh() {
  ASSIGN_OR_RETURN(proto::ClusterMap map, refresh_map_());
  const uint64_t before = map_version();
  RETURN_IF_ERROR(SetClusterMap(map));
  VLOG(1) << "cluster map v" << before << " -> v" << map_version();
  return absl::OkStatus();
}

Status PsClient::AfterRound(const RoundOutcome& outcome, absl::string_view method, int* round,
                            absl::Time deadline) {
  if (outcome.wrong_owner) {
    const uint64_t before = map_version();
    RETURN_IF_ERROR(Refresh());
    if (map_version() != before) return absl::OkStatus();
    // No newer map: the new owner has not learned of its partitions yet
    // (servers see a new map a heartbeat after the master). Wait for it
    // like NOT_READY rather than burn the routing rounds at once.
  } else if (!outcome.waits()) {
    return absl::OkStatus();
  }
  // A server that has not heard of the cluster map yet learns it within a
  // heartbeat, a row quota refills within a second, and a full global
  // batch steps once the pushes it waits for arrive (or their reservations
  // expire, ps/global_batch.h); wait for them without counting a routing
  // round.
  if (absl::Now() >= deadline) {
    return absl::UnavailableError(absl::StrCat(
        method, ": parameter servers still ",
        outcome.wrong_owner
            ? absl::StrCat("refuse keys that cluster map v", map_version(), " gives them")
        : outcome.slow_down
            ? std::string("tell this worker to slow down (it creates more rows per second "
                          "than ps.max_new_rows_per_worker_s)")
        : outcome.batch_full
            ? absl::StrCat("answer BATCH_FULL (optimizer.dense_global_batch: the step waits "
                           "for pushes that do not come; the last said: ",
                           outcome.full_why, ")")
            : std::string("have no cluster map"),
        " after ", absl::FormatDuration(options_.attempt_timeout * options_.max_attempts)));
  }
  // A full batch is one push from its step: ask again sooner.
  const bool only_full = !outcome.wrong_owner && !outcome.not_ready && !outcome.slow_down;
  absl::SleepFor(absl::Milliseconds(only_full ? 2 : 20));
  --*round;
  return absl::OkStatus();
}

Status PsClient::RerouteSilent(std::span<const Keys> tables, absl::string_view method,
                               const std::vector<SilentRequest>& silent,
                               std::vector<std::vector<uint32_t>>* remaining) {
  const SilentRequest& first = silent.front();
  // The silence stands (the caller's AwaitVerdict decides what follows),
  // saying why the keys were not sent elsewhere.
  auto stands = [&](absl::string_view why) {
    return Annotate(first.error, absl::StrCat(method, " to ps[", first.server_id, "] (", why, ")"));
  };
  StatusOr<proto::ClusterMap> fetched = refresh_map_();
  if (!fetched.ok()) {
    return stands(absl::StrCat("the master's cluster map could not be fetched: ",
                               fetched.status().message()));
  }
  StatusOr<Placement> fresh = Placement::FromProto(*fetched);
  if (!fresh.ok()) {
    return stands(absl::StrCat("the master's cluster map is inconsistent: ",
                               fresh.status().message()));
  }
  // The same version routes every key as this round did (a map of the same
  // version naming another endpoint for the slot is not taken: the slot's
  // process changes only with a recovery, which fences this worker).
  if (fresh->version() <= map_version()) {
    return stands(absl::StrCat("the master's cluster map is still v", map_version()));
  }
  for (const SilentRequest& request : silent) {
    for (const Piece& piece : request.request->pieces) {
      for (uint32_t position : piece.positions) {
        const uint64_t key = tables[piece.table].keys[position];
        if (fresh->server(fresh->ServerIndexOf(key)).id() == request.server_id) {
          return stands(absl::StrCat("cluster map v", fresh->version(), " still places ",
                                     table(tables[piece.table].table_id).name(), " key ", key,
                                     " on ps[", request.server_id, "]"));
        }
      }
    }
  }
  for (const SilentRequest& request : silent) {
    LOG(INFO) << method << ": no reply from ps[" << request.server_id << "] ("
              << request.endpoint << "); the master's cluster map v" << fresh->version()
              << " (this worker had v" << map_version()
              << ") places its keys elsewhere: sending them there";
    for (const Piece& piece : request.request->pieces) {
      (*remaining)[piece.table].insert((*remaining)[piece.table].end(), piece.positions.begin(),
                                       piece.positions.end());
    }
  }
  placement_ = std::make_unique<Placement>(*std::move(fresh));
  return absl::OkStatus();
}

std::vector<PsClient::Request> PsClient::Plan(
    std::span<const Keys> tables, const std::vector<std::vector<uint32_t>>& positions) const {
  const size_t num_servers = placement_->num_servers();
  // by_server[s][t]: positions of table t's keys owned by server s.
  std::vector<std::vector<std::vector<uint32_t>>> by_server(
      num_servers, std::vector<std::vector<uint32_t>>(tables.size()));
  for (size_t t = 0; t < tables.size(); ++t) {
    for (uint32_t position : positions[t]) {
      by_server[placement_->ServerIndexOf(tables[t].keys[position])][t].push_back(position);
    }
  }
  std::vector<Request> requests;
  for (size_t s = 0; s < num_servers; ++s) {
    Request current{.server = s, .pieces = {}};
    size_t bytes = 0;
    for (size_t t = 0; t < tables.size(); ++t) {
      const std::vector<uint32_t>& owned = by_server[s][t];
      // A key and its values as they travel (bfloat16 for dense tensors
      // under worker.dense_wire = bfloat16).
      const uint32_t id = tables[t].table_id;
      const size_t row_bytes =
          sizeof(uint64_t) + (Bf16(id) ? sizeof(uint16_t) : sizeof(float)) * table(id).dim();
      size_t offset = 0;
      while (offset < owned.size()) {
        size_t room = bytes < max_request_bytes_ ? (max_request_bytes_ - bytes) / row_bytes : 0;
        if (room == 0) {
          if (!current.pieces.empty()) {
            requests.push_back(std::move(current));
            current = Request{.server = s, .pieces = {}};
            bytes = 0;
            continue;
          }
          room = 1;  // a single row larger than the cap still has to go
        }
        const size_t take = std::min(room, owned.size() - offset);
        Piece piece;
        piece.table = t;
        piece.positions.assign(owned.begin() + offset, owned.begin() + offset + take);
        current.pieces.push_back(std::move(piece));
        bytes += take * row_bytes;
        offset += take;
      }
    }
    if (!current.pieces.empty()) requests.push_back(std::move(current));
  }
  return requests;
}

Status PsClient::Exchange(std::span<const Keys> tables, absl::string_view method,
                          const std::function<Message(const Request&, bool first)>& build,
                          const std::function<Status(const Request&, Message&)>& on_reply) {
  if (placement_ == nullptr) {
    RETURN_IF_ERROR(Refresh());
  } else if (newest_map_ != nullptr && newest_map_() > map_version()) {
    // Not fatal: the calls go by the map in hand, and a server that left
    // answers WRONG_OWNER or nothing (RerouteSilent).
    if (const Status refreshed = Refresh(); !refreshed.ok()) {
      VLOG(1) << "cannot fetch cluster map v" << newest_map_() << ": " << refreshed;
    }
  }
  std::vector<std::vector<uint32_t>> remaining(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    remaining[t].resize(tables[t].keys.size());
    for (uint32_t i = 0; i < remaining[t].size(); ++i) remaining[t][i] = i;
  }
  const absl::Duration budget = options_.attempt_timeout * options_.max_attempts;
  absl::Time deadline = absl::Now() + budget;
  for (int round = 0; round < kMaxRoutingRounds; ++round) {
    std::vector<Request> requests = Plan(tables, remaining);
    std::vector<uint64_t> calls(requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
      calls[r] = channel_.Start(placement_->server(requests[r].server).endpoint(),
                                build(requests[r], /*first=*/r == 0), options_);
    }
    // Wait for every call, even after an error, so none is left pending.
    Status first_error;
    RoundOutcome outcome;
    std::vector<SilentRequest> silent;
    for (auto& list : remaining) list.clear();
    for (size_t r = 0; r < requests.size(); ++r) {
      std::optional<StatusOr<Message>> waited;
      while (!(waited = channel_.WaitUntil(calls[r], absl::Now() + absl::Milliseconds(20)))) {
        if (abandon_ && abandon_()) {
          for (size_t rest = r; rest < calls.size(); ++rest) channel_.Cancel(calls[rest]);
          return absl::AbortedError(absl::StrCat(method, " given up: the worker's session ended"));
        }
      }
      StatusOr<Message>& reply = *waited;
      if (!reply.ok() && absl::IsDeadlineExceeded(reply.status())) {
        // No reply after every attempt: the server may have left the job
        // (drained and retired) while this map still names it. Decided
        // once the round is over, with the master's map.
        const proto::ServerInfo& server = placement_->server(requests[r].server);
        silent.push_back({.request = &requests[r],
                          .server_id = server.id(),
                          .endpoint = server.endpoint(),
                          .error = reply.status()});
        continue;
      }
      Status status = reply.ok() ? on_reply(requests[r], *reply) : reply.status();
      if (status.ok()) continue;
      const proto::ErrorReason reason = ReasonOf(status);
      if (reason == proto::WRONG_OWNER || reason == proto::NOT_READY ||
          reason == proto::SLOW_DOWN || reason == proto::BATCH_FULL) {
        // The server applied nothing of this request: re-send just it.
        (reason == proto::WRONG_OWNER  ? outcome.wrong_owner
         : reason == proto::NOT_READY  ? outcome.not_ready
         : reason == proto::BATCH_FULL ? outcome.batch_full
                                       : outcome.slow_down) = true;
        if (reason == proto::BATCH_FULL) outcome.full_why = std::string(status.message());
        for (const Piece& piece : requests[r].pieces) {
          remaining[piece.table].insert(remaining[piece.table].end(), piece.positions.begin(),
                                        piece.positions.end());
        }
      } else if (first_error.ok()) {
        first_error = status;
      }
    }
    RETURN_IF_ERROR(first_error);
    if (!silent.empty()) {
      RETURN_IF_ERROR(RerouteSilent(tables, method, silent, &remaining));
      // The installed map is the master's newest already: what was refused
      // is routed by it too. The new owners get a whole call's time (this
      // round spent it on the silence), still within the routing rounds.
      outcome.wrong_owner = false;
      deadline = std::max(deadline, absl::Now() + budget);
      if (!outcome.waits()) continue;
    }
    if (!outcome.wrong_owner && !outcome.waits()) return absl::OkStatus();
    RETURN_IF_ERROR(AfterRound(outcome, method, &round, deadline));
  }
  return absl::UnavailableError(absl::StrCat(method, " still routed to the wrong servers after ",
                                             kMaxRoutingRounds, " cluster-map refreshes"));
}

void PsClient::NoteVersions(const Request& request,
                            const google::protobuf::RepeatedField<uint64_t>& reply_versions,
                            bool lowest, Versions* versions) const {
  if (versions == nullptr) return;
  // A server that says nothing of versions (or garbles them) leaves 0s.
  if (static_cast<size_t>(reply_versions.size()) != request.pieces.size()) return;
  for (size_t p = 0; p < request.pieces.size(); ++p) {
    std::vector<uint64_t>& per_server = (*versions)[request.pieces[p].table];
    // The placement may have grown since the call began (a newer map).
    if (per_server.size() <= request.server) {
      per_server.resize(request.server + 1, lowest ? kNoVersion : 0);
    }
    uint64_t& kept = per_server[request.server];
    const uint64_t said = reply_versions[static_cast<int>(p)];
    kept = lowest ? std::min(kept, said) : std::max(kept, said);
  }
}

void PsClient::SizeRows(std::span<const Keys> tables, std::vector<std::vector<float>>* out,
                        Versions* versions) const {
  if (versions != nullptr) versions->assign(tables.size(), {});
  out->resize(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    (*out)[t].resize(tables[t].keys.size() * table(tables[t].table_id).dim());
  }
}

Status PsClient::ScatterRows(std::span<const Keys> tables, const Request& request,
                             const Message& reply, absl::string_view method,
                             const google::protobuf::RepeatedField<uint64_t>& reply_versions,
                             std::vector<std::vector<float>>* out, Versions* versions) const {
  const std::string& endpoint = placement_->server(request.server).endpoint();
  if (reply.num_frames() != request.pieces.size()) {
    return absl::DataLossError(absl::StrCat(method, " reply from ", endpoint, " has ",
                                            reply.num_frames(), " frames for ",
                                            request.pieces.size(), " tables"));
  }
  for (size_t p = 0; p < request.pieces.size(); ++p) {
    const Piece& piece = request.pieces[p];
    const uint32_t dim = table(tables[piece.table].table_id).dim();
    const size_t count = piece.positions.size() * dim;
    const bool bf16 = Bf16(tables[piece.table].table_id);
    // Each row goes straight to its place: widened there from bfloat16, or
    // copied.
    std::span<const uint16_t> narrow;
    std::span<const float> values;
    Status read;
    if (bf16) {
      StatusOr<std::span<const uint16_t>> array = reply.Array<uint16_t>(p);
      read = array.status();
      if (array.ok()) narrow = *array;
    } else {
      StatusOr<std::span<const float>> array = reply.Array<float>(p);
      read = array.status();
      if (array.ok()) values = *array;
    }
    if (const size_t got = bf16 ? narrow.size() : values.size(); !read.ok() || got != count) {
      return absl::DataLossError(absl::StrCat(
          method, " reply from ", endpoint, " for table '",
          table(tables[piece.table].table_id).name(), "': ",
          read.ok() ? absl::StrCat(got, " values, expected ", count) : read.message(), " (",
          bf16 ? "bfloat16" : "float32", " asked, by worker.dense_wire for dense tensors)"));
    }
    std::span<float> target((*out)[piece.table]);
    for (size_t i = 0; i < piece.positions.size(); ++i) {
      const std::span<float> row =
          target.subspan(static_cast<size_t>(piece.positions[i]) * dim, dim);
      if (bf16) {
        FromBfloat16(narrow.subspan(i * dim, dim), row);
      } else {
        std::memcpy(row.data(), values.data() + i * dim, dim * sizeof(float));
      }
    }
  }
  NoteVersions(request, reply_versions, /*lowest=*/true, versions);
  return absl::OkStatus();
}

void PsClient::ForgetUnknownVersions(Versions* versions) {
  if (versions == nullptr) return;
  for (std::vector<uint64_t>& per_server : *versions) {
    for (uint64_t& version : per_server) {
      if (version == kNoVersion) version = 0;
    }
  }
}

Status PsClient::Pull(std::span<const Keys> tables, std::vector<std::vector<float>>* out,
                      Versions* versions, bool reserve) {
  const ScopedLatency timer(pull_latency_);
  SizeRows(tables, out, versions);
  // A server reserved this worker's read of a global batch already
  // (PullRequest.holds_reservations).
  bool reserved = false;
  auto build = [&](const Request& request, bool /*first*/) {
    Message message;
    message.header().set_method(proto::PULL);
    // A server behind this map learns of it now (a partition just moved).
    message.header().set_cluster_map_version(map_version());
    proto::PullRequest* body = message.header().mutable_pull_request();
    if (dense_bf16_) body->set_dense_bf16(true);
    if (reserve) body->set_reserve(true);
    if (reserved) body->set_holds_reservations(true);
    for (const Piece& piece : request.pieces) {
      body->add_table_ids(tables[piece.table].table_id);
      std::span<uint64_t> keys = message.AddUninitializedArray<uint64_t>(piece.positions.size());
      for (size_t i = 0; i < piece.positions.size(); ++i) {
        keys[i] = tables[piece.table].keys[piece.positions[i]];
      }
    }
    return message;
  };
  RETURN_IF_ERROR(Exchange(tables, "PULL", build, [&](const Request& request, Message& reply) {
    RETURN_IF_ERROR(ScatterRows(tables, request, reply, "PULL",
                                reply.header().pull_reply().versions(), out, versions));
    if (reply.header().pull_reply().reserved()) reserved = true;
    return absl::OkStatus();
  }));
  ForgetUnknownVersions(versions);
  return absl::OkStatus();
}

Status PsClient::Push(std::span<const Keys> tables, std::span<const std::span<const float>> grads,
                      const PushOptions& options) {
  const float lr_scale = options.lr_scale;
  const Versions* based_on = options.based_on;
  Versions* versions = options.versions;
  const uint32_t pass = options.pass;
  const proto::WorkBatch* batch = options.batch;
  std::string* receipt = options.receipt;
  Rows* after = options.after;
  const ScopedLatency timer(push_latency_);
  if (versions != nullptr) versions->assign(tables.size(), {});
  if (receipt != nullptr) receipt->clear();
  if (after != nullptr) SizeRows(tables, &after->values, &after->versions);
  bool read_back_ok = true;
  // Only a caller who takes the receipt sends the batch it is made for.
  bool receipt_wanted = batch != nullptr && receipt != nullptr;
  CHECK_EQ(tables.size(), grads.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    CHECK_EQ(grads[t].size(), tables[t].keys.size() * table(tables[t].table_id).dim());
  }
  auto build = [&](const Request& request, bool first) {
    Message message;
    message.header().set_method(proto::PUSH);
    message.header().set_cluster_map_version(map_version());
    proto::PushRequest* body = message.header().mutable_push_request();
    body->set_client_seq(++push_seq_);
    if (lr_scale != 1.0f) body->set_lr_scale(lr_scale);
    body->set_pass(pass);
    if (options.records != 0) body->set_records(options.records);
    if (after != nullptr) body->set_reply_rows(true);
    if (dense_bf16_) body->set_dense_bf16(true);
    // The batch (for its receipt) in one request per round, until a reply
    // brought the receipt: a round whose carrier was refused re-plans, and
    // its next round's first request carries it again.
    if (receipt_wanted && first) *body->mutable_batch() = *batch;
    for (const Piece& piece : request.pieces) {
      const uint32_t dim = table(tables[piece.table].table_id).dim();
      body->add_table_ids(tables[piece.table].table_id);
      if (based_on != nullptr) {
        const std::vector<uint64_t>& per_server = (*based_on)[piece.table];
        // 1 + the version; 0 where the call does not know it.
        body->add_based_on(request.server < per_server.size() ? per_server[request.server] + 1 : 0);
      }
      // Fill each frame before adding the next: adding one may move the
      // earlier frames, and a small frame's bytes live inside it.
      std::span<uint64_t> keys = message.AddUninitializedArray<uint64_t>(piece.positions.size());
      for (size_t i = 0; i < piece.positions.size(); ++i) {
        keys[i] = tables[piece.table].keys[piece.positions[i]];
      }
      const std::span<const float> from = grads[piece.table];
      if (Bf16(tables[piece.table].table_id)) {
        std::span<uint16_t> values =
            message.AddUninitializedArray<uint16_t>(piece.positions.size() * dim);
        for (size_t i = 0; i < piece.positions.size(); ++i) {
          ToBfloat16(from.subspan(static_cast<size_t>(piece.positions[i]) * dim, dim),
                     values.subspan(i * dim, dim));
        }
        continue;
      }
      std::span<float> values = message.AddUninitializedArray<float>(piece.positions.size() * dim);
      for (size_t i = 0; i < piece.positions.size(); ++i) {
        std::memcpy(values.data() + i * dim,
                    from.data() + static_cast<size_t>(piece.positions[i]) * dim,
                    dim * sizeof(float));
      }
    }
    return message;
  };
  RETURN_IF_ERROR(Exchange(tables, "PUSH", build, [&](const Request& request, Message& reply) {
    const proto::PushReply& answer = reply.header().push_reply();
    NoteVersions(request, answer.versions(), /*lowest=*/false, versions);
    if (receipt_wanted && !answer.receipt().empty()) {
      *receipt = answer.receipt();
      receipt_wanted = false;
    }
    if (after == nullptr || !read_back_ok) return absl::OkStatus();
    if (answer.rows_withheld()) {
      // A full global batch: the pull that follows waits for its step.
      read_back_ok = false;
      return absl::OkStatus();
    }
    // The push is applied whatever its rows look like: a reply without
    // them (a server that does not read them back) only costs a pull.
    if (Status rows = ScatterRows(tables, request, reply, "PUSH", answer.versions(),
                                  &after->values, &after->versions);
        !rows.ok()) {
      // Once per client: a server that never reads rows back would say so
      // on every step, and the pull already makes up for it.
      if (!read_back_warned_) {
        LOG(WARNING) << "a push was applied but its rows did not come back (" << rows
                     << "); they are pulled instead (said once)";
        read_back_warned_ = true;
      } else {
        VLOG(1) << "a push's rows did not come back: " << rows;
      }
      read_back_ok = false;
    }
    return absl::OkStatus();
  }));
  if (after != nullptr) {
    if (read_back_ok) {
      ForgetUnknownVersions(&after->versions);
    } else {
      after->values.clear();
      after->versions.clear();
    }
  }
  return absl::OkStatus();
}

}  // namespace eps
