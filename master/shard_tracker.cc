#include "master/shard_tracker.h"

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {

ShardTracker::ShardTracker(const DataSet* data, const std::vector<uint32_t>& order) {
  shards_.reserve(data->shards.size());
  for (const ShardSpec& spec : data->shards) {
    Shard shard;
    shard.spec = spec;
    shard.committed = spec.begin;
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
                    .start = shard.committed,
                    .start_line = shard.committed_line,
                    .records = shard.spec.records - shard.committed_records};
}

StatusOr<ShardTracker::CommitResult> ShardTracker::Commit(uint32_t worker, uint64_t shard_id,
                                                          uint64_t begin, uint64_t end,
                                                          uint64_t records) {
  if (shard_id >= shards_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown shard ", shard_id));
  }
  Shard& shard = shards_[shard_id];
  if (begin > end || end > shard.spec.end || begin < shard.spec.begin) {
    return absl::InvalidArgumentError(absl::StrCat("commit [", begin, ", ", end,
                                                   ") is outside shard ", shard_id, " [",
                                                   shard.spec.begin, ", ", shard.spec.end, ")"));
  }
  if (begin == end && records > 0) {
    return absl::InvalidArgumentError(absl::StrCat("commit of shard ", shard_id, " claims ",
                                                   records, " records in an empty range"));
  }
  // A repeat of an applied commit: acknowledge, change nothing.
  if (end <= shard.committed) {
    return CommitResult::kDuplicate;
  }
  if (shard.state != State::kDoing || shard.holder != worker) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, " is not held by worker ", worker));
  }
  if (begin != shard.committed) {
    return absl::FailedPreconditionError(absl::StrCat("commit of shard ", shard_id, " starts at ",
                                                      begin, " but its records are committed up to ",
                                                      shard.committed));
  }
  const uint64_t left = shard.spec.records - shard.committed_records;
  if (records > left) {
    return absl::InvalidArgumentError(absl::StrCat("commit of shard ", shard_id, " claims ",
                                                   records, " records; only ", left, " are left"));
  }
  // Shards and commits are aligned to record starts, so a range that reaches
  // the shard's end holds every record left, and a shorter (non-empty) one
  // holds at least one and leaves at least one. A peer claiming otherwise
  // is answered with an error; the DONE transition below relies on it.
  const bool to_end = end == shard.spec.end;
  if (records == 0 || (to_end ? records != left : records >= left)) {
    return absl::InvalidArgumentError(
        absl::StrCat("commit [", begin, ", ", end, ") of shard ", shard_id, " claims ", records,
                     " records, which does not fit the ", left, " records left in [",
                     shard.committed, ", ", shard.spec.end, ")"));
  }
  shard.committed = end;
  shard.committed_line += records;
  shard.committed_records += records;
  committed_records_ += records;
  if (end == shard.spec.end) {
    CHECK_EQ(shard.committed_records, shard.spec.records);
    shard.state = State::kDone;
    --doing_;
    ++done_;
  }
  return CommitResult::kApplied;
}

int ShardTracker::Release(uint32_t worker) {
  int released = 0;
  // Front of the queue, so a half-done shard finishes before new ones.
  for (uint32_t id = static_cast<uint32_t>(shards_.size()); id-- > 0;) {
    Shard& shard = shards_[id];
    if (shard.state != State::kDoing || shard.holder != worker) continue;
    shard.state = State::kTodo;
    --doing_;
    todo_.push_front(id);
    ++reassignments_;
    ++released;
  }
  return released;
}

}  // namespace eps
