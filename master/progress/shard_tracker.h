// ShardTracker: the state of every data shard in one pass over a data set
// (one training epoch, or the final evaluation).
//
//   TODO --Assign--> DOING(worker, committed offset) --Commit(..end)--> DONE
//     ^                 |
//     +----Release------+   (the worker died or left: back to TODO, resuming
//                            from the committed offset; nothing is dropped)
//
// Stragglers: when TODO is empty and a worker idles, RequestSplit marks the
// DOING shard with the most lines left; its holder answers with Split at
// a line start past what it has read, and [split, end) becomes a new
// shard at the front of TODO. A line is in exactly one of the two.
//
// A commit covers [begin, end) of a shard and is accepted only from the
// shard's holder and only when `begin` is the committed offset, so lines
// are counted exactly once; a commit that repeats one already applied (end
// at or below the committed offset) is acknowledged without effect.
//
// A shard whose file cannot be read can be skipped (Skip): it is DONE,
// its lines from the committed offset on counted as skipped instead of
// committed, so every line of the pass is committed or skipped, once.
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_PROGRESS_SHARD_TRACKER_H_
#define EPS_MASTER_PROGRESS_SHARD_TRACKER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "master/progress/data_set.h"
#include "proto/eps.pb.h"

namespace eps {

class ShardTracker {
 public:
  enum class State { kTodo, kDoing, kDone };

  struct Shard {
    ShardSpec spec;
    State state = State::kTodo;
    uint32_t holder = 0;            // valid while kDoing
    uint64_t committed_offset = 0;  // byte offset up to which lines are committed
    uint64_t committed_line = 1;    // line number at committed_offset
    uint64_t committed_lines = 0;   // lines committed so far
    uint32_t assignments = 0;       // times handed out
    bool split_requested = false;
    std::optional<uint64_t> split_from;  // parent shard of a split-off shard
    // Lines from the committed offset to the end, skipped because the file
    // could not be read (the shard is kDone), and why.
    uint64_t skipped_lines = 0;
    std::string skip_reason;
  };

  // Sent as ShardAssignment: committed_offset and committed_line as
  // `start` and `start_line`, lines as `records`.
  struct Assignment {
    uint64_t shard_id = 0;
    const ShardSpec* spec = nullptr;
    uint64_t committed_offset = 0;  // where the worker starts
    uint64_t committed_line = 0;    // line number at committed_offset
    uint64_t lines = 0;             // lines left, from committed_offset
  };

  enum class CommitResult { kApplied, kDuplicate };

  // Tracks `data`'s shards, handed out in `order` (a permutation of shard
  // indices).
  ShardTracker(const DataSet& data, const std::vector<uint32_t>& order);

  // Rebuilds a tracker from persisted records (ids 0..n-1, `records[i]`
  // shard i). TODO shards are queued split-offs first, then in `order` (a
  // permutation of the scan's shard ids, which come first in `records`).
  // kDataLoss when the records are inconsistent.
  static StatusOr<ShardTracker> FromRecords(const std::vector<proto::ShardRecord>& records,
                                            const std::vector<uint32_t>& order);
  // Shard `id` as a persisted record.
  proto::ShardRecord ToRecord(uint64_t id) const;

  // Hands the next TODO shard to `worker`; nullopt when none is left.
  std::optional<Assignment> Assign(uint32_t worker);

  // Commits [begin, end) of shard `shard_id` holding `lines` lines.
  //   kInvalidArgument: unknown shard, end outside the shard, begin > end,
  //     or `lines` that cannot be the lines of [begin, end): more than
  //     are left, none for a non-empty range, fewer than are left for a
  //     range reaching the shard's end, all that are left for one that
  //     does not.
  //   kFailedPrecondition: the shard is not held by `worker`, or `begin` is
  //     not the committed offset (a gap or an overlap).
  StatusOr<CommitResult> Commit(uint32_t worker, uint64_t shard_id, uint64_t begin, uint64_t end,
                                uint64_t lines);
  // What Commit would answer, changing nothing.
  StatusOr<CommitResult> CheckCommit(uint32_t worker, uint64_t shard_id, uint64_t begin,
                                     uint64_t end, uint64_t lines) const;

  // Puts every shard `worker` holds back to TODO (at its committed offset,
  // ahead of untouched shards). Returns their ids.
  std::vector<uint64_t> Release(uint32_t worker);

  // Ends shard `shard_id`, held by `worker` and committed up to `offset`,
  // unread: the lines left are counted as skipped, for `reason`. Returns
  // them.
  //   kInvalidArgument: unknown shard.
  //   kFailedPrecondition: not held by `worker`, or `offset` is not its
  //     committed offset.
  StatusOr<uint64_t> Skip(uint32_t worker, uint64_t shard_id, uint64_t offset,
                          const std::string& reason);

  // Marks the DOING shard with the most lines left (at least
  // `min_lines`, not asked before) for splitting; nullopt when none
  // qualifies.
  std::optional<uint64_t> RequestSplit(uint64_t min_lines);
  // The shard `worker` holds that was asked to split, if any.
  std::optional<uint64_t> SplitRequestedOf(uint32_t worker) const;
  // Cuts [offset, end) off shard `shard_id` as a new TODO shard (front of
  // the queue) whose first line is line `line`; returns its id.
  //   kFailedPrecondition: not held by `worker`, or no split was requested.
  //   kInvalidArgument: `offset` not strictly inside (committed, end), or
  //     `line` leaving either part without lines.
  StatusOr<uint64_t> Split(uint32_t worker, uint64_t shard_id, uint64_t offset, uint64_t line);

  uint64_t num_shards() const { return shards_.size(); }
  uint64_t todo() const { return todo_.size(); }
  uint64_t doing() const { return doing_; }
  uint64_t done() const { return done_; }
  bool finished() const { return done_ == shards_.size(); }
  // Lines committed so far in this pass, and skipped.
  uint64_t committed_lines() const { return committed_lines_; }
  uint64_t skipped_lines() const { return skipped_lines_; }
  // Shards put back to TODO because their worker died or left.
  uint64_t reassignments() const { return reassignments_; }
  // Shards split off stragglers in this pass.
  uint64_t splits() const { return splits_; }
  const Shard& shard(uint64_t id) const { return shards_[id]; }

 private:
  // Shard `shard_id` if `worker` holds it: kInvalidArgument for an unknown
  // shard, kFailedPrecondition for one it does not hold.
  StatusOr<Shard*> HeldShard(uint32_t worker, uint64_t shard_id);

  std::vector<Shard> shards_;
  std::deque<uint32_t> todo_;
  uint64_t doing_ = 0;
  uint64_t done_ = 0;
  uint64_t committed_lines_ = 0;
  uint64_t skipped_lines_ = 0;
  uint64_t reassignments_ = 0;
  uint64_t splits_ = 0;
};

}  // namespace eps

#endif  // EPS_MASTER_PROGRESS_SHARD_TRACKER_H_
