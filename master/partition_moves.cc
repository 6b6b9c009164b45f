#include "master/partition_moves.h"

#include <algorithm>

#include "core/logging.h"

namespace eps {

using nlohmann::json;

bool PartitionMoves::MovingFrom(uint32_t slot) const {
  if (active_.has_value() && active_->move.from == slot) return true;
  return std::any_of(queue_.begin(), queue_.end(),
                     [slot](const PartitionMove& move) { return move.from == slot; });
}

void PartitionMoves::DropFrom(uint32_t slot) {
  std::erase_if(queue_, [slot](const PartitionMove& move) { return move.from == slot; });
}

void PartitionMoves::DropTo(uint32_t slot) {
  std::erase_if(queue_, [slot](const PartitionMove& move) { return move.to == slot; });
}

bool PartitionMoves::Queued(uint32_t partition) const {
  if (active_.has_value() && active_->move.partition == partition) return true;
  return std::any_of(queue_.begin(), queue_.end(), [partition](const PartitionMove& move) {
    return move.partition == partition;
  });
}

const PartitionMoves::Active& PartitionMoves::Start(uint64_t map_version, absl::Time now) {
  CHECK(!active_.has_value() && !queue_.empty());
  active_ = Active{.move = queue_.front(), .map_version = map_version, .started = now};
  ++active_->move.attempts;
  queue_.pop_front();
  return *active_;
}

std::optional<proto::MovePartitionRequest::Step> PartitionMoves::StepDone(
    const proto::MovePartitionReply& reply, absl::Time now) {
  CHECK(active_.has_value());
  switch (active_->step) {
    case proto::MovePartitionRequest::COPY:
      active_->rows += reply.rows();
      active_->bytes += reply.bytes();
      active_->step = proto::MovePartitionRequest::HANDOFF;
      return active_->step;
    case proto::MovePartitionRequest::HANDOFF:
      active_->handed_off = now;
      active_->step = proto::MovePartitionRequest::TAIL;
      return active_->step;
    default:
      active_->rows += reply.rows();
      active_->bytes += reply.bytes();
      return std::nullopt;
  }
}

json PartitionMoves::Committed(absl::Time now) {
  CHECK(active_.has_value());
  const Active& move = *active_;
  const double took_ms = absl::ToDoubleMilliseconds(now - move.started);
  const double unavailable_ms = absl::ToDoubleMilliseconds(now - move.handed_off);
  ++done_;
  rows_ += move.rows;
  bytes_ += move.bytes;
  move_ms_ += took_ms;
  longest_unavailable_ms_ = std::max(longest_unavailable_ms_, unavailable_ms);
  json record = {{"partition", move.move.partition}, {"from", move.move.from},
                 {"to", move.move.to},               {"rows", move.rows},
                 {"bytes", move.bytes},              {"took_ms", took_ms},
                 {"unavailable_ms", unavailable_ms}};
  active_.reset();
  return record;
}

bool PartitionMoves::GiveUp(const std::string& why, bool retry) {
  CHECK(active_.has_value());
  last_error_ = why;
  const PartitionMove move = active_->move;
  active_.reset();
  if (retry && move.attempts < kMaxAttempts) {
    queue_.push_back(move);
    return true;
  }
  ++failed_;
  return false;
}

json PartitionMoves::ToJson(absl::Time now) const {
  json out = {{"queued", queue_.size()},
              {"done", done_},
              {"failed", failed_},
              {"rows", rows_},
              {"bytes", bytes_},
              {"move_ms", move_ms_},
              {"longest_unavailable_ms", longest_unavailable_ms_},
              {"in_progress", nullptr}};
  if (active_.has_value()) {
    out["in_progress"] = {
        {"partition", active_->move.partition},
        {"from", active_->move.from},
        {"to", active_->move.to},
        {"step", proto::MovePartitionRequest::Step_Name(active_->step)},
        {"attempt", active_->move.attempts},
        {"running_s", absl::ToDoubleSeconds(now - active_->started)}};
  }
  if (!last_error_.empty()) out["last_error"] = last_error_;
  return out;
}

}  // namespace eps
