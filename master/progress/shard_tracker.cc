#include "master/progress/shard_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

ShardTracker::ShardTracker(const DataSet& data, const std::vector<uint32_t>& order) {
  shards_.reserve(data.shards.size());
  for (const ShardSpec& spec : data.shards) {
    Shard shard;
    shard.spec = spec;
    shard.committed_offset = spec.begin;
    shard.committed_line = spec.first_line;
    shards_.push_back(shard);
  }
  CHECK_EQ(order.size(), shards_.size());
  for (uint32_t index : order) {
    CHECK_LT(index, shards_.size());
    todo_.push_back(index);
  }
}

std::optional<ShardTracker::Assignment> ShardTracker::Assign(uint32_t worker) {
  if (todo_.empty()) return std::nullopt;
  const uint32_t id = todo_.front();
  todo_.pop_front();
  Shard& shard = shards_[id];
  CHECK(shard.state == State::kTodo);
  shard.state = State::kDoing;
  shard.holder = worker;
  shard.assignments++;
  ++doing_;
  return Assignment{.shard_id = id,
                    .spec = &shard.spec,
                    .committed_offset = shard.committed_offset,
                    .committed_line = shard.committed_line,
                    .lines = shard.spec.lines - shard.committed_lines};
}

StatusOr<ShardTracker::CommitResult> ShardTracker::CheckCommit(uint32_t worker,
                                                               uint64_t shard_id, uint64_t begin,
                                                               uint64_t end, uint64_t lines) const {
  if (shard_id >= shards_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown shard ", shard_id));
  }
  const Shard& shard = shards_[shard_id];
  if (begin > end || end > shard.spec.end || begin < shard.spec.begin) {
    return absl::InvalidArgumentError(absl::StrCat("commit [", begin, ", ", end,
                                                   ") is outside shard ", shard_id, " [",
                                                   shard.spec.begin, ", ", shard.spec.end, ")"));
  }
  if (begin == end && lines > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("commit of shard ", shard_id, " claims ", lines, " lines in an empty range"));
  }
  // A repeat of an applied commit: acknowledge, change nothing.
  if (end <= shard.committed_offset) {
    return CommitResult::kDuplicate;
  }
  if (shard.state != State::kDoing || shard.holder != worker) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, " is not held by worker ", worker));
  }
  if (begin != shard.committed_offset) {
    return absl::FailedPreconditionError(absl::StrCat("commit of shard ", shard_id, " starts at ",
                                                      begin, " but its lines are committed up to ",
                                                      shard.committed_offset));
  }
  const uint64_t left = shard.spec.lines - shard.committed_lines;
  if (lines > left) {
    return absl::InvalidArgumentError(absl::StrCat("commit of shard ", shard_id, " claims ", lines,
                                                   " lines; only ", left, " are left"));
  }
  // Shards and commits are aligned to line starts, so a range that reaches
  // the shard's end holds every line left, and a shorter (non-empty) one
  // holds at least one and leaves at least one. A peer claiming otherwise
  // is answered with an error; the DONE transition below relies on it.
  const bool to_end = end == shard.spec.end;
  if (lines == 0 || (to_end ? lines != left : lines >= left)) {
    return absl::InvalidArgumentError(
        absl::StrCat("commit [", begin, ", ", end, ") of shard ", shard_id, " claims ", lines,
                     " lines, which does not fit the ", left, " lines left in [",
                     shard.committed_offset, ", ", shard.spec.end, ")"));
  }
  return CommitResult::kApplied;
}

StatusOr<ShardTracker::CommitResult> ShardTracker::Commit(uint32_t worker, uint64_t shard_id,
                                                          uint64_t begin, uint64_t end,
                                                          uint64_t lines) {
  ASSIGN_OR_RETURN(const CommitResult result, CheckCommit(worker, shard_id, begin, end, lines));
  if (result == CommitResult::kDuplicate) return result;
  Shard& shard = shards_[shard_id];
  shard.committed_offset = end;
  shard.committed_line += lines;
  shard.committed_lines += lines;
  committed_lines_ += lines;
  if (end == shard.spec.end) {
    CHECK_EQ(shard.committed_lines, shard.spec.lines);
    shard.state = State::kDone;
    --doing_;
    ++done_;
  }
  return CommitResult::kApplied;
}

std::vector<uint64_t> ShardTracker::Release(uint32_t worker) {
  std::vector<uint64_t> released;
  // Front of the queue, so a half-done shard finishes before new ones.
  for (uint32_t id = static_cast<uint32_t>(shards_.size()); id-- > 0;) {
    Shard& shard = shards_[id];
    if (shard.state != State::kDoing || shard.holder != worker) continue;
    shard.state = State::kTodo;
    shard.split_requested = false;
    --doing_;
    todo_.push_front(id);
    ++reassignments_;
    released.push_back(id);
  }
  return released;
}

StatusOr<ShardTracker::Shard*> ShardTracker::HeldShard(uint32_t worker, uint64_t shard_id) {
  if (shard_id >= shards_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown shard ", shard_id));
  }
  Shard& shard = shards_[shard_id];
  if (shard.state != State::kDoing || shard.holder != worker) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, " is not held by worker ", worker));
  }
  return &shard;
}

StatusOr<uint64_t> ShardTracker::Skip(uint32_t worker, uint64_t shard_id, uint64_t offset,
                                      const std::string& reason) {
  ASSIGN_OR_RETURN(Shard * held, HeldShard(worker, shard_id));
  Shard& shard = *held;
  if (offset != shard.committed_offset) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_id, " is committed up to byte ", shard.committed_offset, ", not ", offset));
  }
  shard.skipped_lines = shard.spec.lines - shard.committed_lines;
  shard.skip_reason = reason;
  shard.state = State::kDone;
  shard.split_requested = false;
  --doing_;
  ++done_;
  skipped_lines_ += shard.skipped_lines;
  return shard.skipped_lines;
}

std::optional<uint64_t> ShardTracker::RequestSplit(uint64_t min_lines) {
  std::optional<uint64_t> best;
  uint64_t best_left = 0;
  for (uint64_t id = 0; id < shards_.size(); ++id) {
    const Shard& shard = shards_[id];
    if (shard.state != State::kDoing || shard.split_requested) continue;
    const uint64_t left = shard.spec.lines - shard.committed_lines;
    if (left >= std::max<uint64_t>(min_lines, 2) && left > best_left) {
      best = id;
      best_left = left;
    }
  }
  if (best.has_value()) shards_[*best].split_requested = true;
  return best;
}

std::optional<uint64_t> ShardTracker::SplitRequestedOf(uint32_t worker) const {
  for (uint64_t id = 0; id < shards_.size(); ++id) {
    const Shard& shard = shards_[id];
    if (shard.state == State::kDoing && shard.holder == worker && shard.split_requested) return id;
  }
  return std::nullopt;
}

StatusOr<uint64_t> ShardTracker::Split(uint32_t worker, uint64_t shard_id, uint64_t offset,
                                       uint64_t line) {
  ASSIGN_OR_RETURN(Shard * held, HeldShard(worker, shard_id));
  Shard& shard = *held;
  if (!shard.split_requested) {
    return absl::FailedPreconditionError(
        absl::StrCat("no split of shard ", shard_id, " was asked"));
  }
  const uint64_t end_line = shard.spec.first_line + shard.spec.lines;
  if (offset <= shard.committed_offset || offset >= shard.spec.end ||
      line <= shard.committed_line || line >= end_line) {
    return absl::InvalidArgumentError(
        absl::StrCat("split of shard ", shard_id, " at byte ", offset, ", line ", line,
                     " is not strictly inside its uncommitted part (bytes ", shard.committed_offset,
                     "-", shard.spec.end, ", lines ", shard.committed_line, "-", end_line, ")"));
  }
  Shard child;
  child.spec = shard.spec;
  child.spec.begin = offset;
  child.spec.first_line = line;
  child.spec.lines = end_line - line;
  child.committed_offset = offset;
  child.committed_line = line;
  child.split_from = shard_id;
  shard.spec.end = offset;
  shard.spec.lines = line - shard.spec.first_line;
  shard.split_requested = false;
  const uint64_t child_id = shards_.size();
  shards_.push_back(child);
  todo_.push_front(static_cast<uint32_t>(child_id));
  ++splits_;
  return child_id;
}

proto::ShardRecord ShardTracker::ToRecord(uint64_t id) const {
  const Shard& shard = shards_[id];
  proto::ShardRecord record;
  record.set_file(shard.spec.file);
  record.set_begin(shard.spec.begin);
  record.set_end(shard.spec.end);
  record.set_first_line(shard.spec.first_line);
  record.set_records(shard.spec.lines);
  record.set_state(shard.state == State::kTodo    ? proto::SHARD_TODO
                   : shard.state == State::kDoing ? proto::SHARD_DOING
                                                  : proto::SHARD_DONE);
  record.set_holder(shard.holder);
  record.set_committed(shard.committed_offset);
  record.set_committed_line(shard.committed_line);
  record.set_committed_records(shard.committed_lines);
  record.set_assignments(shard.assignments);
  if (shard.split_from.has_value()) record.set_split_from(*shard.split_from);
  record.set_skipped_lines(shard.skipped_lines);
  record.set_skip_reason(shard.skip_reason);
  return record;
}

StatusOr<ShardTracker> ShardTracker::FromRecords(const std::vector<proto::ShardRecord>& records,
                                                 const std::vector<uint32_t>& order) {
  ShardTracker tracker(DataSet{}, {});
  for (size_t id = 0; id < records.size(); ++id) {
    const proto::ShardRecord& record = records[id];
    Shard shard;
    shard.spec = ShardSpec{.file = record.file(),
                           .begin = record.begin(),
                           .end = record.end(),
                           .first_line = record.first_line(),
                           .lines = record.records()};
    shard.holder = record.holder();
    shard.committed_offset = record.committed();
    shard.committed_line = record.committed_line();
    shard.committed_lines = record.committed_records();
    shard.assignments = record.assignments();
    if (record.has_split_from()) shard.split_from = record.split_from();
    shard.skipped_lines = record.skipped_lines();
    shard.skip_reason = record.skip_reason();
    // What Commit and Split maintain: the committed offset inside the
    // range, its line number following from the lines before it, and
    // bytes and lines reaching the end together.
    if (shard.spec.begin > shard.spec.end || shard.committed_offset < shard.spec.begin ||
        shard.committed_offset > shard.spec.end || shard.committed_lines > shard.spec.lines ||
        shard.committed_line != shard.spec.first_line + shard.committed_lines ||
        (shard.committed_offset == shard.spec.end) != (shard.committed_lines == shard.spec.lines)) {
      return absl::DataLossError(absl::StrCat("shard record ", id, " is inconsistent"));
    }
    // Skip maintains: skipped lines are exactly those not committed, and
    // only a DONE shard has them.
    if (shard.skipped_lines > 0 &&
        (record.state() != proto::SHARD_DONE ||
         shard.skipped_lines != shard.spec.lines - shard.committed_lines)) {
      return absl::DataLossError(absl::StrCat("shard record ", id, " skips lines it should not"));
    }
    if (record.state() == proto::SHARD_DONE && shard.committed_offset != shard.spec.end &&
        shard.skipped_lines == 0) {
      return absl::DataLossError(
          absl::StrCat("shard record ", id, " is done but not committed to its end"));
    }
    switch (record.state()) {
      case proto::SHARD_TODO:
        shard.state = State::kTodo;
        break;
      case proto::SHARD_DOING:
        shard.state = State::kDoing;
        ++tracker.doing_;
        break;
      case proto::SHARD_DONE:
        shard.state = State::kDone;
        ++tracker.done_;
        break;
      default:
        return absl::DataLossError(absl::StrCat("shard record ", id, " has no state"));
    }
    tracker.committed_lines_ += shard.committed_lines;
    tracker.skipped_lines_ += shard.skipped_lines;
    tracker.splits_ += shard.split_from.has_value();
    tracker.shards_.push_back(shard);
  }
  // Split-offs first (they were at the front), then the pass's order.
  std::vector<bool> queued(records.size(), false);
  for (uint64_t id = 0; id < records.size(); ++id) {
    if (tracker.shards_[id].split_from.has_value() && tracker.shards_[id].state == State::kTodo) {
      tracker.todo_.push_back(static_cast<uint32_t>(id));
      queued[id] = true;
    }
  }
  for (uint32_t id : order) {
    if (id >= records.size()) return absl::DataLossError("shard order names an unknown shard");
    if (!queued[id] && tracker.shards_[id].state == State::kTodo) {
      tracker.todo_.push_back(id);
      queued[id] = true;
    }
  }
  for (uint64_t id = 0; id < records.size(); ++id) {
    if (tracker.shards_[id].state == State::kTodo && !queued[id]) {
      tracker.todo_.push_back(static_cast<uint32_t>(id));  // not in `order`: keep it anyway
    }
  }
  return tracker;
}

}  // namespace eps
