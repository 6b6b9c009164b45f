// ParamServer::Impl's part of a partition move (docs/design.md 2.20): the
// master's steps (MOVE_PARTITION) and the pages of a partition's rows one
// server reads from another (FETCH_PARTITION).

#include <signal.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/placement.h"
#include "core/failpoint.h"
#include "core/logging.h"
#include "ps/param_server_impl.h"
#include "rpc/rpc_channel.h"

namespace eps {

namespace {

// Rows the new owner asks for a page, and the bytes a page may hold.
constexpr uint32_t kPageRows = 16384;
// Keys of the store a page scans at most where a table is kept in key
// order (a store made before rows were grouped by partition, where a
// partition is a filtered scan of every key): tens of ms a page.
constexpr size_t kPageScan = 32768;
constexpr size_t kPageBytes = size_t{2} << 20;
// A copy's catch-up rounds before its hand-off (FetchPartitionRequest.
// catch_up): at most this many, and none more once a round took this few
// rows (a tail this short is read in a few ms).
constexpr uint32_t kCatchUpRounds = 3;
constexpr uint64_t kShortTail = 256;

// Kills this server (SIGKILL) at `where` when failpoint `name` is armed for
// `value`: ps.crash_in_move=STEP, the server doing step STEP of a move
// (MovePartitionRequest.Step); ps.crash_serving_copy=1, the old owner
// serving the copy's first page (the move registered, pushes noted).
void MaybeCrash(const char* name, uint64_t value, const char* where) {
  if (!FailpointArmed(name, value)) return;
  LOG(WARNING) << "failpoint " << name << "=" << value << ": killing this server (SIGKILL) "
               << where;
  raise(SIGKILL);
}
void MaybeCrashInMove(proto::MovePartitionRequest::Step step, const char* where) {
  MaybeCrash("ps.crash_in_move", static_cast<uint64_t>(step), where);
}

// Adds `tables` to a FETCH_PARTITION reply: per table its id, a frame of
// keys and a frame of stored floats.
void AddRowFrames(std::span<const TableRows> tables, proto::FetchPartitionReply* answer,
                  Message* reply) {
  for (const TableRows& rows : tables) {
    if (rows.keys.empty()) continue;
    answer->add_table_ids(rows.table);
    reply->AddArray(rows.keys);
    reply->AddArray(rows.values);
  }
}

// Per table, the keys of `noted`, sorted (the store reads them in order).
std::vector<std::vector<uint64_t>> SortedKeys(
    const std::vector<absl::flat_hash_set<uint64_t>>& noted) {
  std::vector<std::vector<uint64_t>> sorted(noted.size());
  for (size_t t = 0; t < noted.size(); ++t) {
    sorted[t].assign(noted[t].begin(), noted[t].end());
    std::sort(sorted[t].begin(), sorted[t].end());
  }
  return sorted;
}

}  // namespace

void ParamServer::Impl::NoteMovingKeys(std::span<Table* const> tables,
                                       std::span<const std::span<const uint64_t>> keys) {
  const uint64_t noting = noting_.load(std::memory_order_acquire);
  if (noting == kNotNoting) return;
  const uint32_t partitions = job_.num_partitions();
  const auto moving = [&](uint64_t key) {
    return noting == kNotingSeveral || PartitionOf(key, partitions) == noting;
  };
  // The lock (which every push to this server would wait for) only for
  // the push's keys of the moving partition, found without it.
  std::vector<std::pair<uint32_t, uint64_t>> noted;
  for (size_t i = 0; i < tables.size(); ++i) {
    const uint32_t table = tables[i]->spec().id();
    for (uint64_t key : keys[i]) {
      if (moving(key)) noted.emplace_back(table, key);
    }
  }
  if (noted.empty()) return;
  absl::MutexLock lock(&moves_mu_);
  for (const auto& [table, key] : noted) {
    auto it = outgoing_.find(PartitionOf(key, partitions));
    if (it != outgoing_.end() && !it->second.handed_off) it->second.pushed[table].insert(key);
  }
}

void ParamServer::Impl::PublishNoting() {
  uint64_t noting = kNotNoting;
  for (const auto& [p, move] : outgoing_) {
    if (!move.handed_off) noting = noting == kNotNoting ? p : kNotingSeveral;
  }
  noting_.store(noting, std::memory_order_release);
}

Status ParamServer::Impl::ServeNotedRows(const proto::FetchPartitionRequest& body,
                                         size_t max_rows, proto::FetchPartitionReply* answer,
                                         Message* reply) {
  const uint32_t p = body.partition();
  const bool tail = body.tail();
  // The move's state for this request; null (with *error) when there is no
  // such copy in progress, or no such round.
  const auto find = [&](Status* error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(moves_mu_) {
    auto it = outgoing_.find(p);
    OutgoingMove* move = it == outgoing_.end() ? nullptr : &it->second;
    if (move != nullptr && move->map_version == body.map_version() &&
        move->handed_off == tail && (tail || move->catch_up_round >= body.catch_up())) {
      return move;
    }
    *error = absl::FailedPreconditionError(absl::StrCat(
        "ps[", id_, "] has no ",
        tail ? std::string("tail") : absl::StrCat("catch-up round ", body.catch_up()),
        " of partition ", p, " at cluster map v",
        body.map_version(), tail ? " (not handed off)" : " (no such copy, or handed off)"));
    return static_cast<OutgoingMove*>(nullptr);
  };
  if (!tail && body.key() == 0) {
    // A new round takes the keys noted so far, exclusively: every push to
    // p either applied before (this round reads it) or is noted for the
    // next round or the tail. Only the taking holds restore_mu_ (every
    // pull and push waits for it); the sort holds moves_mu_, so a repeat of
    // the round (which reads its keys again) waits for the keys.
    restore_mu_.WriterLock();
    moves_mu_.Lock();
    auto it = outgoing_.find(p);
    std::vector<absl::flat_hash_set<uint64_t>> taken;
    if (it != outgoing_.end() && it->second.map_version == body.map_version() &&
        !it->second.handed_off && it->second.catch_up_round + 1 == body.catch_up()) {
      OutgoingMove& move = it->second;
      move.catch_up_round = body.catch_up();
      taken.swap(move.pushed);
      move.pushed.resize(taken.size());
    }
    restore_mu_.WriterUnlock();
    Status error;
    if (it != outgoing_.end() && !taken.empty()) it->second.caught_up = SortedKeys(taken);
    const bool valid = find(&error) != nullptr;
    moves_mu_.Unlock();
    if (!valid) return error;
  }
  // This page's part of the noted keys: `key` counts the ones sent before,
  // the tables in id order.
  std::vector<std::pair<uint32_t, std::vector<uint64_t>>> want;
  uint64_t total = 0;
  {
    absl::MutexLock lock(&moves_mu_);
    Status error;
    const OutgoingMove* move = find(&error);
    if (move == nullptr) return error;
    if (!tail && move->catch_up_round != body.catch_up()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ps[", id_, "] is at catch-up round ", move->catch_up_round,
                       " of partition ", p, ", not ", body.catch_up()));
    }
    const std::vector<std::vector<uint64_t>>& noted = tail ? move->tail : move->caught_up;
    uint64_t skip = body.key();
    size_t left = max_rows;
    for (uint32_t t = 0; t < noted.size(); ++t) {
      const std::vector<uint64_t>& keys = noted[t];
      total += keys.size();
      if (skip >= keys.size()) {
        skip -= keys.size();
        continue;
      }
      const size_t take = std::min(left, keys.size() - skip);
      if (take == 0) continue;
      const auto first = keys.begin() + static_cast<ptrdiff_t>(skip);
      want.emplace_back(t, std::vector<uint64_t>(first, first + static_cast<ptrdiff_t>(take)));
      left -= take;
      skip = 0;
    }
  }
  uint64_t sent = body.key();
  absl::ReaderMutexLock restore_lock(&restore_mu_);
  for (const auto& [table, keys] : want) {
    ASSIGN_OR_RETURN(TableRows rows, storage_->ReadRows(table, keys));
    AddRowFrames(std::span(&rows, 1), answer, reply);
    sent += keys.size();
  }
  answer->set_next_key(sent);
  answer->set_done(sent >= total);
  return absl::OkStatus();
}

Status ParamServer::Impl::CheckFetcher(const proto::NodeId& sender,
                                       const proto::FetchPartitionRequest& body) {
  const auto named = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = moves_out_.find(body.partition());
    return sender.role() == proto::ROLE_SERVER && it != moves_out_.end() &&
           it->second.map_version() == body.map_version() &&
           it->second.to_server() == sender.id();
  };
  {
    absl::MutexLock lock(&mu_);
    if (named()) return absl::OkStatus();
    if (sender.role() == proto::ROLE_SERVER && session_ != nullptr) {
      // The master starts a move before its new owner asks, but the last
      // reply may predate it, and so may the heartbeat in flight: the one
      // after that names it.
      const uint64_t taken = replies_taken_;
      session_->HeartbeatNow();
      const auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return named() || replies_taken_ >= taken + 2;
      };
      mu_.AwaitWithTimeout(absl::Condition(&settled), options_.rpc_timeout);
      if (named()) return absl::OkStatus();
    }
  }
  const uint64_t refused = fetches_refused_.fetch_add(1) + 1;
  const std::string why = absl::StrCat(
      "the master started no move of partition ", body.partition(), " at cluster map v",
      body.map_version(), " from ps[", id_, "] to ", RoleName(sender.role()), " ", sender.id(),
      ": its pages go only to the new owner the master named");
  // Logged at the first refusal and then at powers of two (a peer may ask
  // without end).
  if ((refused & (refused - 1)) == 0) {
    LOG(WARNING) << "refused FETCH_PARTITION (" << refused << " so far): " << why;
  }
  return absl::PermissionDeniedError(why);
}

Status ParamServer::Impl::HandleFetchPartition(const Message& request, Message* reply) {
  if (!request.header().has_fetch_partition_request()) {
    return absl::InvalidArgumentError("FETCH_PARTITION without its body");
  }
  const proto::FetchPartitionRequest& body = request.header().fetch_partition_request();
  const uint32_t p = body.partition();
  const uint32_t partitions = job_.num_partitions();
  {
    absl::ReaderMutexLock lock(&mu_);
    if (placement_ == nullptr) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet",
                             proto::NOT_READY);
    }
    if (p >= partitions) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p, " of a job of ", partitions));
    }
  }
  // Before anything is registered or read: a page request of a move the
  // master did not start, or from another server than its new owner,
  // leaves no trace but the count.
  RETURN_IF_ERROR(CheckFetcher(request.header().sender(), body));
  proto::FetchPartitionReply* answer = reply->header().mutable_fetch_partition_reply();
  size_t max_rows = 0;
  {
    absl::ReaderMutexLock restore_lock(&restore_mu_);
    size_t widest = 1;
    for (uint32_t t = 0; t < storage_->num_tables(); ++t) {
      if (Table* table = storage_->table(t)) {
        widest = std::max<size_t>(widest, table->stored_floats());
      }
    }
    max_rows = std::clamp<size_t>(
        std::min<size_t>(body.max_rows(),
                         kPageBytes / (sizeof(uint64_t) + widest * sizeof(float))),
        1, kPageRows);
  }
  if (body.tail() || body.catch_up() > 0) return ServeNotedRows(body, max_rows, answer, reply);
  // The map the move started from reaches this server a heartbeat after
  // the master wrote it.
  const absl::Time arrived = absl::Now();
  RETURN_IF_ERROR(AwaitMapVersion(body.map_version()));
  const absl::Time mapped = absl::Now();
  {
    absl::ReaderMutexLock lock(&mu_);
    if (placement_->version() > body.map_version() || !owned_[p]) {
      return absl::FailedPreconditionError(
          absl::StrCat("partition ", p, " is not on ps[", id_, "] at cluster map v",
                       body.map_version(), " (this server is at v", placement_->version(), ")"));
    }
  }
  const bool first_page = body.table() == 0 && body.key() == 0;
  if (first_page) {
    {
      // From now on pushes to p are noted. Exclusively: every push either
      // applied before (the walk below finds its rows unstored, or the
      // store has them) or sees the note.
      absl::WriterMutexLock restore_lock(&restore_mu_);
      absl::MutexLock lock(&moves_mu_);
      {
        // Again: a newer map may have come since the check above.
        absl::ReaderMutexLock map_lock(&mu_);
        if (placement_->version() != body.map_version() || !owned_[p]) {
          return absl::FailedPreconditionError(absl::StrCat(
              "partition ", p, " is not on ps[", id_, "] at cluster map v", body.map_version(),
              " any more (this server is at v", placement_->version(), ")"));
        }
      }
      OutgoingMove& move = outgoing_[p];
      if (move.map_version != body.map_version() || move.handed_off) {
        // A new copy (a repeated first page keeps what was noted).
        move = OutgoingMove{};
        move.map_version = body.map_version();
        move.pushed.resize(storage_->num_tables());
      }
      // A copy read again from its start reads the store again, and the rows
      // it lacks again in the rounds: rounds begin anew.
      move.catch_up_round = 0;
      move.caught_up.clear();
      PublishNoting();
    }
    // The rows of p the store lacks now (changed in memory since they were
    // last stored) are read from memory in the first catch-up round, noted
    // as if pushed: every row the pages below read stale or miss was either
    // such a row or pushed since the noting began. No full flush (seconds
    // under load) before the copy.
    absl::ReaderMutexLock restore_lock(&restore_mu_);
    ASSIGN_OR_RETURN(std::vector<std::vector<uint64_t>> unstored,
                     storage_->UnstoredKeys(
                         [&](uint64_t key) { return PartitionOf(key, partitions) == p; }));
    absl::MutexLock lock(&moves_mu_);
    auto it = outgoing_.find(p);
    if (it == outgoing_.end() || it->second.map_version != body.map_version() ||
        it->second.handed_off) {
      return absl::AbortedError(absl::StrCat("the copy of partition ", p, " at cluster map v",
                                             body.map_version(), " ended while it began"));
    }
    for (size_t t = 0; t < unstored.size() && t < it->second.pushed.size(); ++t) {
      it->second.pushed[t].insert(unstored[t].begin(), unstored[t].end());
    }
  } else {
    absl::MutexLock lock(&moves_mu_);
    auto it = outgoing_.find(p);
    if (it == outgoing_.end() || it->second.map_version != body.map_version() ||
        it->second.handed_off) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no copy of partition ", p, " at cluster map v", body.map_version(),
          " is in progress on ps[", id_, "]: start again from the first page"));
    }
  }
  if (first_page) MaybeCrash("ps.crash_serving_copy", 1, "serving the copy's first page");
  absl::ReaderMutexLock restore_lock(&restore_mu_);
  const PartitionCursor from{.table = body.table(), .key = body.key()};
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(PartitionPage page,
                   storage_->ReadPartition(p, partitions, from, max_rows, kPageScan));
  if (const absl::Duration took = absl::Now() - arrived; took > absl::Milliseconds(500)) {
    LOG(INFO) << "a page of partition " << p << " took " << absl::FormatDuration(took)
              << ": " << absl::FormatDuration(mapped - arrived) << " for the map, "
              << absl::FormatDuration(start - mapped) << " for the locks, "
              << absl::FormatDuration(absl::Now() - start) << " to read"
              << (first_page ? " (with the walk for unstored rows)" : "");
  }
  AddRowFrames(page.tables, answer, reply);
  answer->set_done(!page.next.has_value());
  if (page.next.has_value()) {
    answer->set_next_table(page.next->table);
    answer->set_next_key(page.next->key);
  }
  return absl::OkStatus();
}

StatusOr<proto::MovePartitionReply> ParamServer::Impl::FetchFromOldOwner(
    const proto::MovePartitionRequest& move, bool tail, absl::Duration* fetching) {
  *fetching = absl::ZeroDuration();
  RpcChannel channel(&factory_, Self());
  CallOptions call;
  call.attempt_timeout = std::max(options_.rpc_timeout, absl::Seconds(30));
  call.max_attempts = 3;
  const std::string from =
      absl::StrCat("ps[", move.from_server(), "] at ", move.from_endpoint());
  proto::FetchPartitionRequest next;
  next.set_partition(move.partition());
  next.set_tail(tail);
  next.set_max_rows(kPageRows);
  next.set_map_version(move.map_version());
  {
    absl::MutexLock lock(&import_mu_);
    auto [it, added] = importing_.try_emplace(move.partition(), move.map_version());
    if (!added && it->second > move.map_version()) {
      return absl::AbortedError(absl::StrCat("a later move of partition ", move.partition(),
                                             " (at cluster map v", it->second,
                                             ") supersedes this one"));
    }
    if (tail && it->second != move.map_version()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no copy of partition ", move.partition(), " at cluster map v", move.map_version(),
          " was made here: no tail to read"));
    }
    it->second = move.map_version();
  }
  proto::MovePartitionReply result;
  const absl::Time start = absl::Now();
  // Reads pages from `next` on and writes them here; the rows in *rows.
  const auto fetch = [&](proto::FetchPartitionRequest next, uint64_t* rows) -> Status {
    while (true) {
      Message request;
      request.header().set_method(proto::FETCH_PARTITION);
      *request.header().mutable_fetch_partition_request() = next;
      const absl::Time asked = absl::Now();
      StatusOr<Message> page = channel.Call(move.from_endpoint(), std::move(request), call);
      *fetching += absl::Now() - asked;
      RETURN_IF_ERROR_CTX(page.status(), absl::StrCat("reading partition ", move.partition(),
                                                      tail                 ? "'s tail"
                                                      : next.catch_up() > 0 ? "'s catch-up"
                                                                            : "",
                                                      " from ", from));
      const proto::FetchPartitionReply& body = page->header().fetch_partition_reply();
      if (page->num_frames() != 2 * static_cast<size_t>(body.table_ids_size())) {
        return absl::DataLossError(absl::StrCat("a page of partition ", move.partition(),
                                                " from ", from, " names ", body.table_ids_size(),
                                                " tables but carries ", page->num_frames(),
                                                " frames"));
      }
      {
        // Written only while this copy is the partition's newest.
        absl::MutexLock import_lock(&import_mu_);
        auto it = importing_.find(move.partition());
        if (it == importing_.end() || it->second != move.map_version()) {
          return absl::AbortedError(absl::StrCat("the move of partition ", move.partition(),
                                                 " at cluster map v", move.map_version(),
                                                 " was given up or superseded"));
        }
        absl::ReaderMutexLock restore_lock(&restore_mu_);
        for (int i = 0; i < body.table_ids_size(); ++i) {
          ASSIGN_OR_RETURN(std::span<const uint64_t> keys, page->Array<uint64_t>(2 * i));
          ASSIGN_OR_RETURN(std::span<const float> values, page->Array<float>(2 * i + 1));
          RETURN_IF_ERROR_CTX(
              storage_->WriteTableRows(body.table_ids(i), keys, values),
              absl::StrCat("writing partition ", move.partition(), " from ", from));
          *rows += keys.size();
          result.set_rows(result.rows() + keys.size());
          result.set_bytes(result.bytes() + keys.size_bytes() + values.size_bytes());
        }
      }
      MaybeCrashInMove(
          tail ? proto::MovePartitionRequest::TAIL : proto::MovePartitionRequest::COPY,
          "having written a page of the partition");
      if (body.done()) return absl::OkStatus();
      next.set_table(body.next_table());
      next.set_key(body.next_key());
    }
  };
  uint64_t rows = 0;
  RETURN_IF_ERROR(fetch(next, &rows));
  // Catch-up rounds, while the old owner serves on: each takes the rows
  // pushed to during the one before (the copy's seconds, then a round's
  // tens of ms), so that the tail the hand-off waits for is short.
  for (uint32_t round = 1; !tail && round <= kCatchUpRounds; ++round) {
    proto::FetchPartitionRequest catch_up = next;
    catch_up.set_catch_up(round);
    catch_up.set_table(0);
    catch_up.set_key(0);
    uint64_t caught_up = 0;
    RETURN_IF_ERROR(fetch(catch_up, &caught_up));
    if (caught_up <= kShortTail) break;
  }
  result.set_duration_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return result;
}

Status ParamServer::Impl::AwaitMapVersion(uint64_t want) {
  if (want == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return placement_ != nullptr && placement_->version() >= want;
  };
  if (has()) return absl::OkStatus();
  // RefreshClusterMap installs it under mu_, which wakes the wait.
  if (session_ != nullptr) session_->HeartbeatNow();
  if (mu_.AwaitWithTimeout(absl::Condition(&has), options_.rpc_timeout)) return absl::OkStatus();
  return ErrorWithReason(absl::StatusCode::kUnavailable,
                         absl::StrCat("ps[", id_, "] has not received cluster map v", want, " yet"),
                         proto::NOT_READY);
}

Status ParamServer::Impl::HandleMovePartition(const Message& request, Message* reply) {
  if (!request.header().has_move_partition_request()) {
    return absl::InvalidArgumentError("MOVE_PARTITION without its body");
  }
  const proto::MovePartitionRequest& move = request.header().move_partition_request();
  const uint32_t p = move.partition();
  // A server that just joined learns of the map a heartbeat after it.
  RETURN_IF_ERROR(AwaitMapVersion(move.map_version()));
  {
    absl::ReaderMutexLock lock(&mu_);
    if (placement_ == nullptr) {
      return ErrorWithReason(absl::StatusCode::kUnavailable, "no cluster map yet",
                             proto::NOT_READY);
    }
    if (p >= owned_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p, " of a job of ", owned_.size()));
    }
    if (move.step() != proto::MovePartitionRequest::HANDOFF && owned_[p]) {
      return absl::FailedPreconditionError(
          absl::StrCat("partition ", p, " is on ps[", id_, "] already: nothing to move here"));
    }
  }
  proto::MovePartitionReply* answer = reply->header().mutable_move_partition_reply();
  switch (move.step()) {
    case proto::MovePartitionRequest::COPY:
    case proto::MovePartitionRequest::TAIL: {
      const bool tail = move.step() == proto::MovePartitionRequest::TAIL;
      absl::Duration fetching;
      ASSIGN_OR_RETURN(*answer, FetchFromOldOwner(move, tail, &fetching));
      // How long the old owner took to answer, against the whole: where a
      // slow move spends its time.
      LOG(INFO) << (tail ? "took the tail of" : "copied") << " partition " << p << " from ps["
                << move.from_server() << "]: " << answer->rows() << " rows ("
                << absl::StrFormat("%.1f", answer->bytes() / double{1 << 20}) << " MiB) in "
                << absl::StrFormat("%.0f", answer->duration_ms()) << " ms ("
                << absl::StrFormat("%.0f", absl::ToDoubleMilliseconds(fetching))
                << " ms waiting for its pages)";
      return absl::OkStatus();
    }
    case proto::MovePartitionRequest::HANDOFF: {
      const absl::Time start = absl::Now();
      uint64_t pushed = 0;
      {
        // Exclusively: no push to p is between its check and its rows now.
        absl::WriterMutexLock restore_lock(&restore_mu_);
        // Pushes the global batches hold for p's chunks are applied here
        // (and noted for the tail), not after p left.
        RETURN_IF_ERROR(FlushGlobalBatches());
        absl::MutexLock moves_lock(&moves_mu_);
        auto it = outgoing_.find(p);
        if (it == outgoing_.end() || it->second.map_version != move.map_version()) {
          return absl::FailedPreconditionError(
              absl::StrCat("no copy of partition ", p, " at cluster map v", move.map_version(),
                           " is in progress on ps[", id_, "]: nothing to hand off"));
        }
        OutgoingMove& out = it->second;
        if (!out.handed_off) {
          out.handed_off = true;
          out.tail = SortedKeys(out.pushed);
          out.pushed.clear();
          out.caught_up.clear();
          PublishNoting();
        }
        for (const std::vector<uint64_t>& keys : out.tail) pushed += keys.size();
        absl::MutexLock lock(&mu_);
        handed_off_[p] = move.map_version();
        owned_[p] = false;
      }
      MaybeCrashInMove(proto::MovePartitionRequest::HANDOFF, "having handed the partition off");
      answer->set_rows(pushed);
      answer->set_duration_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
      LOG(INFO) << "handed off partition " << p << " (" << pushed
                << " rows pushed to during its copy)";
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("MOVE_PARTITION step ", static_cast<int>(move.step()), " is unknown"));
  }
}

}  // namespace eps
