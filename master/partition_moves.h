// PartitionMoves: the partition moves a job has to make (docs/design.md
// 2.20), one at a time: the queue, the move in progress and its step, and
// what the moves did (/status `moves`).
//
//   queued --Start--> COPY --> HANDOFF --> TAIL --> committed (map v+1)
//                       \---------\----------\----> given up (map v+1, owner kept)
//
// The master persists the partition in HANDOFF (Membership) before the
// old owner hears of it; any map newer than the move's ends it on the
// servers, so a master restarted during a move gives it up by raising the
// map's version.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_PARTITION_MOVES_H_
#define EPS_MASTER_PARTITION_MOVES_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"

namespace eps {

struct PartitionMove {
  uint32_t partition = 0;
  uint32_t from = 0;  // the slot that owns it
  uint32_t to = 0;    // the slot it goes to
  uint32_t attempts = 0;
};

class PartitionMoves {
 public:
  // A move gone wrong is tried again this many times in all.
  static constexpr uint32_t kMaxAttempts = 3;

  struct Active {
    PartitionMove move;
    proto::MovePartitionRequest::Step step = proto::MovePartitionRequest::COPY;
    uint64_t map_version = 0;  // the map the move started from
    absl::Time started;
    absl::Time handed_off = absl::InfiniteFuture();
    uint64_t rows = 0;
    uint64_t bytes = 0;
  };

  void Queue(const PartitionMove& move) { queue_.push_back(move); }
  bool idle() const { return !active_.has_value() && queue_.empty(); }
  const std::optional<Active>& active() const { return active_; }
  // Moves queued or in progress away from `slot`.
  bool MovingFrom(uint32_t slot) const;
  // A move of `partition` is queued or in progress.
  bool Queued(uint32_t partition) const;

  // Takes the next queued move as the one in progress (step COPY).
  // REQUIRES: no move in progress and one queued.
  const Active& Start(uint64_t map_version, absl::Time now);
  // The step in progress succeeded with `reply`: the next step, or
  // nullopt when the move is done (the caller commits it).
  std::optional<proto::MovePartitionRequest::Step> StepDone(
      const proto::MovePartitionReply& reply, absl::Time now);
  // The move in progress is committed (the map gives the partition to its
  // new owner); a record of it for the event and /status.
  nlohmann::json Committed(absl::Time now);
  // The move in progress failed: with `retry`, queued again while it has
  // attempts left (true), else dropped. Nothing is in progress after.
  bool GiveUp(const std::string& why, bool retry);
  // Drops every queued move.
  void Clear() { queue_.clear(); }
  // Drops the queued moves away from `slot`.
  void DropFrom(uint32_t slot);
  // Drops the queued moves to `slot`.
  void DropTo(uint32_t slot);

  // /status `moves`.
  nlohmann::json ToJson(absl::Time now) const;
  // Totals since the master started (/metrics).
  uint64_t done() const { return done_; }
  uint64_t failed() const { return failed_; }
  uint64_t rows() const { return rows_; }
  uint64_t bytes() const { return bytes_; }
  double longest_unavailable_ms() const { return longest_unavailable_ms_; }

 private:
  std::deque<PartitionMove> queue_;
  std::optional<Active> active_;
  uint64_t done_ = 0;
  uint64_t failed_ = 0;
  uint64_t rows_ = 0;
  uint64_t bytes_ = 0;
  double move_ms_ = 0;
  // The longest time a moved partition's keys were refused (from the
  // hand-off to the map that gave them to the new owner).
  double longest_unavailable_ms_ = 0;
  std::string last_error_;
};

}  // namespace eps

#endif  // EPS_MASTER_PARTITION_MOVES_H_
