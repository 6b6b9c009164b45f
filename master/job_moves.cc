// JobControl's partition moves (docs/design.md 2.20): draining a server,
// the steps of each move, and their commit in the cluster map.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "master/job_control.h"

namespace eps {

using nlohmann::json;

StatusOr<json> JobControl::Drain(uint32_t slot) {
  if (over() || progress_.phase() != JobPhase::kTraining || !membership_.placed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("servers are drained while the job trains; it is ",
                     JobPhaseName(progress_.phase())));
  }
  if (recovery_.active()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job is being restored (", recovery_.why(), "); ask again once it trains"));
  }
  if (membership_.server(slot) == nullptr) {
    return absl::NotFoundError(absl::StrCat("the job has no server ", slot));
  }
  if (drains_.Leaving(slot)) {
    return json{{"server", slot},
                {"moves_queued", 0},
                {drains_.state(slot) == Drains::State::kDrained ? "drained" : "already_draining",
                 true}};
  }
  if (DrainTargets(slot).empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps[", slot, "] is the only server left to hold the partitions: add one first"));
  }
  drains_.Start(slot);
  const uint32_t queued = PlanDrain(slot);
  return json{{"server", slot}, {"moves_queued", queued}};
}

std::string JobControl::ServersChanging() const {
  if (over() || progress_.phase() != JobPhase::kTraining || !membership_.placed()) {
    return absl::StrCat("the job is ", JobPhaseName(progress_.phase()), ", not training");
  }
  if (recovery_.active()) return absl::StrCat("a recovery is in progress (", recovery_.why(), ")");
  if (!moves_.idle()) return "partitions are moving";
  if (std::optional<uint32_t> slot = drains_.FirstDraining()) {
    return absl::StrCat("ps[", *slot, "] is being drained");
  }
  if (balancing_) return "a server that joined waits for its partitions";
  return "";
}

std::map<uint32_t, uint32_t> JobControl::DrainTargets(uint32_t slot) const {
  std::map<uint32_t, uint32_t> counts;
  for (const auto& [id, partitions] : membership_.PartitionCounts()) {
    if (id != slot && !drains_.Leaving(id) && !excluded_new_owners_.contains(id) &&
        membership_.ServerAlive(id)) {
      counts[id] = partitions;
    }
  }
  return counts;
}

uint32_t JobControl::PlanDrain(uint32_t slot) {
  std::map<uint32_t, uint32_t> counts = DrainTargets(slot);
  const proto::ClusterMap& map = membership_.cluster_map();
  uint32_t queued = 0;
  for (uint32_t p = 0; p < static_cast<uint32_t>(map.partition_owner_size()); ++p) {
    if (map.partition_owner(static_cast<int>(p)) != slot || counts.empty() ||
        moves_.Queued(p)) {
      continue;
    }
    // To the server with the fewest partitions (planned moves counted).
    auto target = std::min_element(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
      return a.second < b.second;
    });
    moves_.Queue({.partition = p, .from = slot, .to = target->first});
    ++target->second;
    ++queued;
  }
  if (queued > 0) {
    LOG(INFO) << "draining ps[" << slot << "]: " << queued << " partition move(s) queued";
  } else if (counts.empty()) {
    LOG(WARNING) << "the drain of ps[" << slot << "] stops: no other live server can take its "
                 << "partitions; ask again (POST /servers/" << slot << "/drain) once one can";
    drains_.Stop(slot);
  } else if (membership_.PartitionCounts()[slot] == 0 && drains_.Emptied(slot)) {
    LOG(INFO) << "ps[" << slot << "] is drained: it holds no partition, and leaves the job once "
              << "no recovery can need its part of a checkpoint";
    events_->Record("server_drained", {{"server", slot}});
  }
  return queued;
}

bool JobControl::RetireIfDrained(uint32_t slot, absl::Time now) {
  // Not under an export either: it took its servers and map when it began.
  if (drains_.state(slot) != Drains::State::kDrained || over() || recovery_.active() ||
      export_due_) {
    return false;
  }
  if (membership_.PartitionCounts()[slot] != 0) {
    drains_.Refilled(slot);  // a recovery gave it partitions back: drained again
    return false;
  }
  if (moves_.active().has_value() || checkpoints_.round_id().has_value()) return false;
  // A recovery restores the newest checkpoint, reading each partition
  // from its owner's part then (checkpoint 0 is empty: nothing to read).
  const std::optional<proto::CheckpointRecord>& last = checkpoints_.last();
  if (last.has_value() && last->id() != 0) {
    const auto& owners = last->master().cluster_map().partition_owner();
    if (std::find(owners.begin(), owners.end(), slot) != owners.end()) {
      if (membership_.ServerAlive(slot)) checkpoints_.Request();
      return false;
    }
  }
  membership_.RetireServer(slot, now);
  drains_.Retired(slot);
  return true;
}

uint32_t JobControl::PlanBalance() {
  std::map<uint32_t, uint32_t> counts = DrainTargets(/*slot=*/~0u);
  if (counts.size() < 2) return 0;
  uint32_t queued = 0;
  while (true) {
    auto [fewest, most] = std::minmax_element(
        counts.begin(), counts.end(),
        [](const auto& a, const auto& b) { return a.second < b.second; });
    if (most->second <= fewest->second + 1) break;
    // The highest partition `most` holds that no queued move takes already.
    const proto::ClusterMap& map = membership_.cluster_map();
    std::optional<uint32_t> pick;
    for (uint32_t p = 0; p < static_cast<uint32_t>(map.partition_owner_size()); ++p) {
      if (map.partition_owner(static_cast<int>(p)) == most->first && !moves_.Queued(p)) pick = p;
    }
    if (!pick.has_value()) break;
    moves_.Queue({.partition = *pick, .from = most->first, .to = fewest->first});
    --most->second;
    ++fewest->second;
    ++queued;
  }
  if (queued > 0) LOG(INFO) << "balancing the servers: " << queued << " partition move(s) queued";
  return queued;
}

std::optional<JobControl::MoveStep> JobControl::NextMoveStep(absl::Time now) {
  if (over()) {
    // Nothing serves the job any more: no move is left half done.
    AbandonMoves("the job is over", /*retry=*/false);
    moves_.Clear();
    return std::nullopt;
  }
  if (recovery_.active() || checkpoints_.round_id().has_value() || !membership_.placed()) {
    return std::nullopt;
  }
  // A move starts while the job trains; one in progress finishes after.
  if (!moves_.active().has_value() && progress_.phase() != JobPhase::kTraining) {
    return std::nullopt;
  }
  if (moves_.idle() && progress_.phase() == JobPhase::kTraining) {
    // What a drain has left (the master restarted, a move given up, a
    // recovery took partitions back): planned again; then a join's share.
    for (uint32_t slot : drains_.leaving()) PlanDrain(slot);
    if (moves_.idle() && balancing_ && PlanBalance() == 0) balancing_ = false;
  }
  if (!moves_.active().has_value()) {
    if (moves_.idle()) return std::nullopt;
    const PartitionMoves::Active& started = moves_.Start(membership_.cluster_map().version(), now);
    const PartitionMove& move = started.move;
    const uint32_t owner =
        membership_.cluster_map().partition_owner(static_cast<int>(move.partition));
    std::string stale;
    if (owner != move.from) {
      stale = absl::StrCat("partition ", move.partition, " is on ps[", owner, "] now");
    } else if (const uint32_t gone = membership_.ServerAlive(move.from) ? move.to : move.from;
               !membership_.ServerAlive(gone)) {
      stale = absl::StrCat("ps[", gone, "] is not alive");
    }
    if (!stale.empty()) {
      LOG(WARNING) << "the move of partition " << move.partition << " from ps[" << move.from
                   << "] to ps[" << move.to << "] is dropped: " << stale;
      moves_.GiveUp(stale, /*retry=*/false);
      return std::nullopt;
    }
    events_->Record("partition_move_started",
                    {{"partition", move.partition}, {"from", move.from}, {"to", move.to}});
  }
  const PartitionMoves::Active& active = *moves_.active();
  MoveStep step;
  proto::MovePartitionRequest& request = step.request;
  request.set_step(active.step);
  request.set_partition(active.move.partition);
  request.set_from_server(active.move.from);
  request.set_from_endpoint(membership_.server(active.move.from)->endpoint);
  request.set_map_version(active.map_version);
  const uint32_t target =
      active.step == proto::MovePartitionRequest::HANDOFF ? active.move.from : active.move.to;
  step.target = {target, membership_.server(target)->endpoint};
  // Persisted before any server hears of it (the driver persists between
  // this and the call): a restarted master gives the move up.
  membership_.SetMoving(active.move.partition);
  return step;
}

void JobControl::MoveStepDone(const MoveStep& step,
                              const StatusOr<proto::MovePartitionReply>& reply, absl::Time now) {
  const std::optional<PartitionMoves::Active>& active = moves_.active();
  if (!active.has_value() || active->step != step.request.step() ||
      active->move.partition != step.request.partition()) {
    return;  // given up meanwhile (a recovery)
  }
  const PartitionMove move = active->move;
  if (!reply.ok()) {
    const std::string why = absl::StrCat(
        "step ", proto::MovePartitionRequest::Step_Name(step.request.step()), ": ",
        reply.status().message());
    AbandonMoves(why);
    // The new owner's own step (its copy or its tail) failed on its last
    // attempt: no drain or balance picks it again, or a server that never
    // copies would be given the partition without end.
    const bool new_owners_step = step.request.step() != proto::MovePartitionRequest::HANDOFF;
    if (new_owners_step && move.attempts >= PartitionMoves::kMaxAttempts &&
        excluded_new_owners_.insert(move.to).second) {
      LOG(WARNING) << "ps[" << move.to << "] failed to take partition " << move.partition
                   << " " << move.attempts << " times (last: " << why
                   << "): no partition moves to it until it registers again";
      events_->Record("move_target_excluded",
                      {{"server", move.to}, {"partition", move.partition}, {"error", why}});
      moves_.DropTo(move.to);
    }
    return;
  }
  if (membership_.cluster_map().version() != active->map_version) {
    // Another map came meanwhile (a join, a replaced server): the old
    // owner took the partition back when it saw it.
    AbandonMoves(absl::StrCat("the cluster map changed during the move (v",
                              active->map_version, " -> v",
                              membership_.cluster_map().version(), ")"));
    return;
  }
  if (moves_.StepDone(*reply, now).has_value()) return;
  membership_.MovePartition(move.partition, move.to);
  json record = moves_.Committed(now);
  record["map_version"] = membership_.cluster_map().version();
  LOG(INFO) << "partition " << move.partition << " moved from ps[" << move.from << "] to ps["
            << move.to << "]: " << record["rows"].get<uint64_t>() << " rows in "
            << static_cast<int64_t>(record["took_ms"].get<double>()) << " ms, unavailable for "
            << static_cast<int64_t>(record["unavailable_ms"].get<double>()) << " ms (cluster map v"
            << membership_.cluster_map().version() << ")";
  events_->Record("partition_moved", record);
  if (drains_.Leaving(move.from) && !moves_.MovingFrom(move.from)) PlanDrain(move.from);
}

void JobControl::FillMovesOut(uint32_t slot, proto::HeartbeatReply* reply) const {
  const std::optional<PartitionMoves::Active>& active = moves_.active();
  if (!active.has_value() || active->move.from != slot) return;
  proto::MoveNotice* notice = reply->add_moves_out();
  notice->set_partition(active->move.partition);
  notice->set_to_server(active->move.to);
  notice->set_map_version(active->map_version);
}

void JobControl::AbandonMoves(const std::string& reason, bool retry) {
  if (!moves_.active().has_value()) return;
  const PartitionMove move = moves_.active()->move;
  const std::string why = absl::StrCat("moving partition ", move.partition, " from ps[",
                                       move.from, "] to ps[", move.to, "] failed: ", reason);
  // A newer map ends the move on both servers; the old owner keeps it.
  membership_.RaiseMapVersion();
  const bool again = moves_.GiveUp(why, retry);
  LOG(WARNING) << why << (again ? "; trying again" : retry ? "; given up" : "");
  events_->Record("partition_move_failed", {{"partition", move.partition},
                                            {"from", move.from},
                                            {"to", move.to},
                                            {"error", why},
                                            {"retry", again}});
  if (!again && retry && drains_.Stop(move.from)) {
    moves_.DropFrom(move.from);
    LOG(WARNING) << "the drain of ps[" << move.from << "] stops: " << why
                 << "; ask again (POST /servers/" << move.from << "/drain)";
  }
}

}  // namespace eps
