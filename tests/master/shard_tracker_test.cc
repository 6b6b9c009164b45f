// Tests master/progress/shard_tracker.h: the TODO -> DOING -> DONE state machine,
// exactly-once commits, Release, straggler splits and the persisted
// records a restarted master rebuilds the tracker from.

#include "master/progress/shard_tracker.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/progress/data_set.h"
#include "tests/master/unit_testing.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

// Shard i holds kShardLines lines of kLineBytes bytes (the last one
// `last_lines`), starting at byte i * kShardLines * kLineBytes.
constexpr uint64_t kShardLines = 10;
constexpr uint64_t kLastShardLines = 4;

DataSet MakeShards(int num_shards, uint64_t last_lines = kLastShardLines) {
  std::vector<uint64_t> lines(num_shards, kShardLines);
  lines.back() = last_lines;
  return MakeData("/data/part-0", lines);
}

std::vector<uint32_t> Identity(int n) {
  std::vector<uint32_t> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  return order;
}

// Commits `lines` lines of shard `id` from its committed offset.
StatusOr<ShardTracker::CommitResult> CommitLines(ShardTracker& tracker, uint32_t worker,
                                                 uint64_t id, uint64_t lines) {
  const uint64_t begin = tracker.shard(id).committed_offset;
  return tracker.Commit(worker, id, begin, begin + lines * kLineBytes, lines);
}

TEST(ShardTracker, AssignsInTheGivenOrder) {
  const DataSet data = MakeShards(4);
  ShardTracker tracker(data, {2, 0, 3, 1});
  EXPECT_EQ(tracker.num_shards(), 4u);
  EXPECT_EQ(tracker.todo(), 4u);
  std::vector<uint64_t> handed;
  while (std::optional<ShardTracker::Assignment> a = tracker.Assign(/*worker=*/7)) {
    const ShardSpec& spec = data.shards[a->shard_id];
    EXPECT_EQ(a->spec->begin, spec.begin);
    EXPECT_EQ(a->committed_offset, spec.begin);
    EXPECT_EQ(a->committed_line, spec.first_line);
    EXPECT_EQ(a->lines, spec.lines);
    EXPECT_EQ(tracker.shard(a->shard_id).holder, 7u);
    EXPECT_EQ(tracker.shard(a->shard_id).state, ShardTracker::State::kDoing);
    handed.push_back(a->shard_id);
  }
  EXPECT_EQ(handed, (std::vector<uint64_t>{2, 0, 3, 1}));
  EXPECT_EQ(tracker.todo(), 0u);
  EXPECT_EQ(tracker.doing(), 4u);
  EXPECT_EQ(tracker.done(), 0u);
  EXPECT_FALSE(tracker.finished());
}

TEST(ShardTracker, CommitAppliesAndAdvances) {
  const DataSet data = MakeShards(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);

  ASSERT_EQ(*CommitLines(tracker, 1, 0, 3), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(0).committed_offset, 3 * kLineBytes);
  EXPECT_EQ(tracker.shard(0).committed_line, 4u);
  EXPECT_EQ(tracker.shard(0).committed_lines, 3u);
  EXPECT_EQ(tracker.committed_lines(), 3u);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDoing);

  ASSERT_EQ(*CommitLines(tracker, 1, 0, 7), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDone);
  EXPECT_EQ(tracker.committed_lines(), 10u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(tracker.done(), 1u);
  EXPECT_FALSE(tracker.finished());

  ASSERT_EQ(tracker.Assign(1)->shard_id, 1u);
  ASSERT_EQ(*CommitLines(tracker, 1, 1, kLastShardLines), ShardTracker::CommitResult::kApplied);
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.committed_lines(), data.lines);
  EXPECT_FALSE(tracker.Assign(1).has_value());
}

TEST(ShardTracker, RepeatedCommitIsADuplicateCountedOnce) {
  const DataSet data = MakeShards(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_EQ(*tracker.Commit(1, 0, 0, 40, 4), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(*tracker.Commit(1, 0, 0, 40, 4), ShardTracker::CommitResult::kDuplicate);
  EXPECT_EQ(tracker.committed_lines(), 4u);
  EXPECT_EQ(tracker.shard(0).committed_offset, 40u);

  // The last commit of a shard, repeated after it is done, and repeated by
  // its former holder after the shard moved on to another worker.
  ASSERT_EQ(*tracker.Commit(1, 0, 40, 100, 6), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(*tracker.Commit(1, 0, 40, 100, 6), ShardTracker::CommitResult::kDuplicate);
  EXPECT_EQ(tracker.done(), 1u);
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_EQ(*tracker.Commit(1, 1, 100, 120, 2), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.Release(1).size(), 1u);
  ASSERT_EQ(tracker.Assign(2)->shard_id, 1u);
  EXPECT_EQ(*tracker.Commit(1, 1, 100, 120, 2), ShardTracker::CommitResult::kDuplicate);
  EXPECT_EQ(tracker.committed_lines(), 12u);
}

TEST(ShardTracker, CommitByNonHolderIsRefused) {
  const DataSet data = MakeShards(3);
  ShardTracker tracker(data, Identity(3));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);
  StatusOr<ShardTracker::CommitResult> other = tracker.Commit(2, 0, 0, 10, 1);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("not held by worker 2"));
  // A shard nobody holds yet.
  EXPECT_EQ(tracker.Commit(1, 1, 100, 110, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker.committed_lines(), 0u);
}

TEST(ShardTracker, GapOrOverlapIsRefused) {
  const DataSet data = MakeShards(1, kShardLines);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 30, 3).ok());
  // A gap: starts past the committed offset.
  EXPECT_EQ(tracker.Commit(1, 0, 40, 50, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  // An overlap: starts before the committed offset and ends past it.
  EXPECT_EQ(tracker.Commit(1, 0, 20, 50, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker.shard(0).committed_offset, 30u);
  EXPECT_EQ(tracker.committed_lines(), 3u);
}

TEST(ShardTracker, OutOfRangeCommitIsInvalid) {
  const DataSet data = MakeShards(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(tracker.Assign(1).has_value());
  EXPECT_EQ(tracker.Commit(1, 2, 0, 10, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Commit(1, 0, 0, 110, 10).status().code(), absl::StatusCode::kInvalidArgument);
  // Shard 1 starts at byte 100.
  EXPECT_EQ(tracker.Commit(1, 1, 90, 110, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Commit(1, 0, 20, 10, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.committed_lines(), 0u);
}

TEST(ShardTracker, TooManyRecordsIsInvalid) {
  const DataSet data = MakeShards(1, kShardLines);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 50, 5).ok());
  StatusOr<ShardTracker::CommitResult> result = tracker.Commit(1, 0, 50, 90, 6);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("only 5 are left"));
  EXPECT_EQ(tracker.committed_lines(), 5u);
}

// Lines and bytes must agree: a commit reaching the shard's end covers
// every line left, and one that stops short leaves some. A peer claiming
// otherwise must get an error, not crash the master.
TEST(ShardTracker, RecordCountInconsistentWithRangeIsInvalid) {
  const DataSet data = MakeShards(1, kShardLines);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  // Reaches the end with lines left over.
  EXPECT_EQ(tracker.Commit(1, 0, 0, 100, 9).status().code(), absl::StatusCode::kInvalidArgument);
  // Claims every line but stops short of the end.
  EXPECT_EQ(tracker.Commit(1, 0, 0, 90, 10).status().code(), absl::StatusCode::kInvalidArgument);
  // Bytes without lines, and lines without bytes.
  EXPECT_EQ(tracker.Commit(1, 0, 0, 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Commit(1, 0, 0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.committed_lines(), 0u);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDoing);
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 100, 10).ok());
  EXPECT_TRUE(tracker.finished());
}

TEST(ShardTracker, ReleaseResumesAtTheCommittedOffsetAtTheFront) {
  const DataSet data = MakeShards(4);
  ShardTracker tracker(data, {3, 1, 0, 2});
  ASSERT_EQ(tracker.Assign(1)->shard_id, 3u);
  ASSERT_EQ(tracker.Assign(1)->shard_id, 1u);
  ASSERT_EQ(*CommitLines(tracker, 1, 1, 4), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.todo(), 2u);
  EXPECT_EQ(tracker.doing(), 2u);

  EXPECT_EQ(tracker.Release(1).size(), 2u);
  EXPECT_EQ(tracker.todo(), 4u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(tracker.reassignments(), 2u);
  EXPECT_EQ(tracker.Release(1).size(), 0u);

  // Released shards come before the untouched 0 and 2.
  std::optional<ShardTracker::Assignment> first = tracker.Assign(2);
  std::optional<ShardTracker::Assignment> second = tracker.Assign(2);
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_THAT((std::vector<uint64_t>{first->shard_id, second->shard_id}),
              ::testing::UnorderedElementsAre(1u, 3u));
  const ShardTracker::Assignment& resumed = first->shard_id == 1 ? *first : *second;
  const ShardTracker::Assignment& fresh = first->shard_id == 1 ? *second : *first;
  EXPECT_EQ(resumed.committed_offset, data.shards[1].begin + 4 * kLineBytes);
  EXPECT_EQ(resumed.committed_line, data.shards[1].first_line + 4);
  EXPECT_EQ(resumed.lines, kShardLines - 4);
  EXPECT_EQ(fresh.committed_offset, data.shards[3].begin);
  EXPECT_EQ(fresh.committed_line, data.shards[3].first_line);
  EXPECT_EQ(fresh.lines, kLastShardLines);
  EXPECT_EQ(tracker.shard(1).assignments, 2u);
  EXPECT_EQ(tracker.Assign(2)->shard_id, 0u);
  EXPECT_EQ(tracker.Assign(2)->shard_id, 2u);

  // The new holder picks up exactly where the old one stopped.
  EXPECT_EQ(*tracker.Commit(2, 1, data.shards[1].begin, resumed.committed_offset, 4),
            ShardTracker::CommitResult::kDuplicate);
  ASSERT_EQ(*tracker.Commit(2, 1, resumed.committed_offset, data.shards[1].end, 6),
            ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(1).state, ShardTracker::State::kDone);
  EXPECT_EQ(tracker.committed_lines(), kShardLines);
}

// A shard whose workers keep dying is never dropped, and each of its
// lines is counted once however often it moves.
TEST(ShardTracker, RepeatedDeathsNeverDropOrDoubleCount) {
  const DataSet data = MakeShards(3);
  ShardTracker tracker(data, Identity(3));
  uint32_t worker = 0;
  for (uint64_t i = 0; i < kShardLines - 1; ++i) {
    std::optional<ShardTracker::Assignment> a = tracker.Assign(++worker);
    ASSERT_TRUE(a.has_value());
    ASSERT_EQ(a->shard_id, 0u) << "round " << i;
    EXPECT_EQ(a->committed_offset, i * kLineBytes);
    EXPECT_EQ(a->committed_line, 1 + i);
    EXPECT_EQ(a->lines, kShardLines - i);
    ASSERT_EQ(*CommitLines(tracker, worker, 0, 1), ShardTracker::CommitResult::kApplied);
    // The dying worker's last commit may arrive twice.
    EXPECT_EQ(*tracker.Commit(worker, 0, i * kLineBytes, (i + 1) * kLineBytes, 1),
              ShardTracker::CommitResult::kDuplicate);
    EXPECT_EQ(tracker.Release(worker).size(), 1u);
    EXPECT_EQ(tracker.committed_lines(), i + 1);
    EXPECT_EQ(tracker.todo(), 3u);
  }
  EXPECT_EQ(tracker.reassignments(), kShardLines - 1);
  // Finish everything with one last worker.
  ++worker;
  while (std::optional<ShardTracker::Assignment> a = tracker.Assign(worker)) {
    ASSERT_EQ(*CommitLines(tracker, worker, a->shard_id, a->lines),
              ShardTracker::CommitResult::kApplied);
  }
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.done(), 3u);
  EXPECT_EQ(tracker.todo(), 0u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(tracker.committed_lines(), data.lines);
  EXPECT_EQ(tracker.shard(0).assignments, kShardLines);
}

TEST(ShardTracker, EmptyDataSetIsFinishedAtOnce) {
  const DataSet data;
  ShardTracker tracker(data, {});
  EXPECT_TRUE(tracker.finished());
  EXPECT_FALSE(tracker.Assign(1).has_value());
}

// ---------------------------------------------------------------------------
// Straggler splits.

TEST(ShardTracker, RequestSplitPicksTheDoingShardWithMostRecordsLeft) {
  // Shards 0..3 of 10 records each; 4 of kLastShardLines.
  const DataSet data = MakeShards(5);
  ShardTracker tracker(data, Identity(5));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);
  ASSERT_EQ(tracker.Assign(2)->shard_id, 1u);
  ASSERT_EQ(tracker.Assign(3)->shard_id, 2u);
  ASSERT_EQ(*CommitLines(tracker, 1, 0, 3), ShardTracker::CommitResult::kApplied);   // 7 left
  ASSERT_EQ(*CommitLines(tracker, 2, 1, 6), ShardTracker::CommitResult::kApplied);   // 4 left
  ASSERT_EQ(*CommitLines(tracker, 3, 2, 10), ShardTracker::CommitResult::kApplied);  // DONE
  // Shards 3 (10 lines) and 4 are TODO: never asked, however large.
  EXPECT_EQ(tracker.shard(3).state, ShardTracker::State::kTodo);
  EXPECT_FALSE(tracker.SplitRequestedOf(1).has_value());

  // Nothing has 8 left; 7 qualifies for a minimum of 7.
  EXPECT_FALSE(tracker.RequestSplit(8).has_value());
  EXPECT_FALSE(tracker.shard(0).split_requested);
  EXPECT_EQ(tracker.RequestSplit(7), std::optional<uint64_t>(0));
  EXPECT_TRUE(tracker.shard(0).split_requested);
  EXPECT_EQ(tracker.SplitRequestedOf(1), std::optional<uint64_t>(0));
  EXPECT_FALSE(tracker.SplitRequestedOf(2).has_value());
  EXPECT_FALSE(tracker.SplitRequestedOf(3).has_value());
  // Not asked twice: the next largest comes next, then nothing.
  EXPECT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(1));
  EXPECT_EQ(tracker.SplitRequestedOf(2), std::optional<uint64_t>(1));
  EXPECT_FALSE(tracker.RequestSplit(0).has_value());
  EXPECT_FALSE(tracker.shard(2).split_requested);
  EXPECT_FALSE(tracker.shard(3).split_requested);
  EXPECT_FALSE(tracker.shard(4).split_requested);
}

// A shard with one line left cannot be split, whatever the minimum.
TEST(ShardTracker, RequestSplitNeedsTwoRecordsLeft) {
  const DataSet data = MakeShards(1, kShardLines);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(CommitLines(tracker, 1, 0, kShardLines - 1).ok());
  EXPECT_FALSE(tracker.RequestSplit(0).has_value());
  EXPECT_FALSE(tracker.RequestSplit(1).has_value());
  EXPECT_FALSE(tracker.SplitRequestedOf(1).has_value());
}

TEST(ShardTracker, SplitIsRefusedUnlessRequestedAndHeld) {
  const DataSet data = MakeShards(3);
  ShardTracker tracker(data, Identity(3));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);
  ASSERT_EQ(tracker.Assign(2)->shard_id, 1u);
  ASSERT_TRUE(CommitLines(tracker, 1, 0, 2).ok());  // committed: byte 20, line 3
  ASSERT_TRUE(CommitLines(tracker, 2, 1, 5).ok());  // 5 left, fewer than shard 0's 8
  // Not requested yet.
  StatusOr<uint64_t> split = tracker.Split(1, 0, 60, 7);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kFailedPrecondition) << split.status();
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(0));
  // Requested, but asked by a worker that does not hold it.
  split = tracker.Split(2, 0, 60, 7);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kFailedPrecondition) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr("not held by worker 2"));
  // A held shard nobody asked to split.
  EXPECT_EQ(tracker.Split(2, 1, 160, 17).status().code(), absl::StatusCode::kFailedPrecondition);
  // A TODO shard.
  EXPECT_EQ(tracker.Split(1, 2, 260, 27).status().code(), absl::StatusCode::kFailedPrecondition);
  // An unknown one.
  EXPECT_EQ(tracker.Split(1, 3, 260, 27).status().code(), absl::StatusCode::kInvalidArgument);

  // Offsets not strictly inside (committed, end) of shard 0 = [0, 100).
  for (uint64_t offset : {uint64_t{0}, uint64_t{10}, uint64_t{20}, uint64_t{100}, uint64_t{150}}) {
    split = tracker.Split(1, 0, offset, 7);
    EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << offset;
  }
  // Lines leaving either part without lines: shard 0 holds lines 1..10,
  // committed up to line 3.
  for (uint64_t line : {uint64_t{1}, uint64_t{3}, uint64_t{11}, uint64_t{20}}) {
    split = tracker.Split(1, 0, 60, line);
    EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(split.status().message(), HasSubstr("not strictly inside")) << line;
  }
  // Nothing changed; the request still stands.
  EXPECT_EQ(tracker.num_shards(), 3u);
  EXPECT_EQ(tracker.splits(), 0u);
  EXPECT_EQ(tracker.shard(0).spec.end, 100u);
  EXPECT_EQ(tracker.SplitRequestedOf(1), std::optional<uint64_t>(0));
  EXPECT_TRUE(tracker.Split(1, 0, 60, 7).ok());
}

TEST(ShardTracker, SplitCutsTheRestIntoANewShardAtTheFrontCountedOnce) {
  const DataSet data = MakeShards(3);
  ShardTracker tracker(data, Identity(3));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);
  ASSERT_TRUE(CommitLines(tracker, 1, 0, 2).ok());
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(0));

  // Lines 7..10 ([60, 100)) go; lines 1..6 ([0, 60)) stay.
  StatusOr<uint64_t> child = tracker.Split(1, 0, 60, 7);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(*child, 3u);
  EXPECT_EQ(tracker.num_shards(), 4u);
  EXPECT_EQ(tracker.splits(), 1u);
  EXPECT_EQ(tracker.todo(), 3u);
  EXPECT_EQ(tracker.doing(), 1u);
  EXPECT_FALSE(tracker.SplitRequestedOf(1).has_value());
  EXPECT_FALSE(tracker.shard(0).split_requested);

  const ShardTracker::Shard& parent = tracker.shard(0);
  EXPECT_EQ(parent.state, ShardTracker::State::kDoing);
  EXPECT_EQ(parent.holder, 1u);
  EXPECT_EQ(parent.spec.begin, 0u);
  EXPECT_EQ(parent.spec.end, 60u);
  EXPECT_EQ(parent.spec.first_line, 1u);
  EXPECT_EQ(parent.spec.lines, 6u);
  EXPECT_EQ(parent.committed_offset, 20u);
  EXPECT_EQ(parent.committed_lines, 2u);
  EXPECT_FALSE(parent.split_from.has_value());
  const ShardTracker::Shard& part = tracker.shard(3);
  EXPECT_EQ(part.state, ShardTracker::State::kTodo);
  EXPECT_EQ(part.spec.file, data.shards[0].file);
  EXPECT_EQ(part.spec.begin, 60u);
  EXPECT_EQ(part.spec.end, 100u);
  EXPECT_EQ(part.spec.first_line, 7u);
  EXPECT_EQ(part.spec.lines, 4u);
  EXPECT_EQ(part.committed_offset, 60u);
  EXPECT_EQ(part.committed_line, 7u);
  EXPECT_EQ(part.committed_lines, 0u);
  EXPECT_EQ(part.assignments, 0u);
  EXPECT_EQ(part.split_from, std::optional<uint64_t>(0));

  // The holder can no longer commit past the cut.
  EXPECT_EQ(tracker.Commit(1, 0, 20, 80, 6).status().code(), absl::StatusCode::kInvalidArgument);

  // The new shard comes first, ahead of the untouched 1 and 2.
  std::optional<ShardTracker::Assignment> taken = tracker.Assign(2);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->shard_id, 3u);
  EXPECT_EQ(taken->committed_offset, 60u);
  EXPECT_EQ(taken->committed_line, 7u);
  EXPECT_EQ(taken->lines, 4u);
  EXPECT_EQ(taken->spec->end, 100u);

  // Both halves complete; every line of the original shard counts once.
  ASSERT_EQ(*tracker.Commit(2, 3, 60, 100, 4), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(3).state, ShardTracker::State::kDone);
  ASSERT_EQ(*tracker.Commit(1, 0, 20, 60, 4), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDone);
  EXPECT_EQ(tracker.committed_lines(), kShardLines);
  EXPECT_EQ(*tracker.Commit(1, 0, 20, 60, 4), ShardTracker::CommitResult::kDuplicate);
  while (std::optional<ShardTracker::Assignment> a = tracker.Assign(2)) {
    ASSERT_TRUE(CommitLines(tracker, 2, a->shard_id, a->lines).ok());
  }
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.done(), 4u);
  EXPECT_EQ(tracker.committed_lines(), data.lines);
}

// A child can be split again, and a split right after the committed offset
// leaves the holder a single line.
TEST(ShardTracker, SplitsNestAndKeepEveryRecordOnce) {
  const DataSet data = MakeShards(1, kShardLines);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(0));
  ASSERT_EQ(*tracker.Split(1, 0, 10, 2), 1u);  // worker 1 keeps line 1
  EXPECT_EQ(tracker.shard(0).spec.lines, 1u);
  ASSERT_EQ(tracker.Assign(2)->shard_id, 1u);
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(1));
  EXPECT_EQ(tracker.SplitRequestedOf(2), std::optional<uint64_t>(1));
  ASSERT_EQ(*tracker.Split(2, 1, 50, 6), 2u);  // lines 2..5 stay, 6..10 go
  EXPECT_EQ(tracker.shard(1).spec.lines, 4u);
  EXPECT_EQ(tracker.shard(2).spec.lines, 5u);
  EXPECT_EQ(tracker.shard(2).split_from, std::optional<uint64_t>(1));
  ASSERT_EQ(tracker.Assign(3)->shard_id, 2u);
  ASSERT_TRUE(tracker.Commit(3, 2, 50, 100, 5).ok());
  ASSERT_TRUE(tracker.Commit(2, 1, 10, 50, 4).ok());
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 10, 1).ok());
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.splits(), 2u);
  EXPECT_EQ(tracker.committed_lines(), kShardLines);
}

TEST(ShardTracker, ReleaseOfASplitShardsHolder) {
  const DataSet data = MakeShards(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);
  ASSERT_TRUE(CommitLines(tracker, 1, 0, 2).ok());
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(0));
  ASSERT_EQ(*tracker.Split(1, 0, 60, 7), 2u);
  ASSERT_TRUE(CommitLines(tracker, 1, 0, 1).ok());  // up to byte 30, line 4

  // Only the shortened parent was the holder's; the new shard stays queued.
  EXPECT_EQ(tracker.Release(1), (std::vector<uint64_t>{0}));
  EXPECT_EQ(tracker.todo(), 3u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(tracker.shard(2).state, ShardTracker::State::kTodo);
  // The parent resumes at its committed offset, up to the cut.
  std::optional<ShardTracker::Assignment> resumed = tracker.Assign(2);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->shard_id, 0u);
  EXPECT_EQ(resumed->committed_offset, 30u);
  EXPECT_EQ(resumed->committed_line, 4u);
  EXPECT_EQ(resumed->lines, 3u);
  EXPECT_EQ(resumed->spec->end, 60u);
  EXPECT_EQ(tracker.Assign(3)->shard_id, 2u);
  ASSERT_TRUE(tracker.Commit(2, 0, 30, 60, 3).ok());
  ASSERT_TRUE(tracker.Commit(3, 2, 60, 100, 4).ok());
  EXPECT_EQ(tracker.committed_lines(), kShardLines);
}

// A split asked of a worker that then dies is dropped with its shard: the
// next holder is not asked, and the shard may be asked again.
TEST(ShardTracker, ReleaseClearsASplitRequest) {
  const DataSet data = MakeShards(1, kShardLines);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(0));
  EXPECT_EQ(tracker.Release(1), (std::vector<uint64_t>{0}));
  EXPECT_FALSE(tracker.shard(0).split_requested);
  ASSERT_TRUE(tracker.Assign(2).has_value());
  EXPECT_FALSE(tracker.SplitRequestedOf(2).has_value());
  EXPECT_EQ(tracker.Split(2, 0, 50, 6).status().code(), absl::StatusCode::kFailedPrecondition);
  // The dead worker's late answer is refused too.
  EXPECT_EQ(tracker.Split(1, 0, 50, 6).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(0));
  EXPECT_EQ(tracker.SplitRequestedOf(2), std::optional<uint64_t>(0));
}

// ---------------------------------------------------------------------------
// Persistence.

void ExpectSameShard(const ShardTracker::Shard& a, const ShardTracker::Shard& b) {
  EXPECT_EQ(a.spec.file, b.spec.file);
  EXPECT_EQ(a.spec.begin, b.spec.begin);
  EXPECT_EQ(a.spec.end, b.spec.end);
  EXPECT_EQ(a.spec.first_line, b.spec.first_line);
  EXPECT_EQ(a.spec.lines, b.spec.lines);
  EXPECT_EQ(a.state, b.state);
  if (a.state == ShardTracker::State::kDoing) {
    EXPECT_EQ(a.holder, b.holder);
  }
  EXPECT_EQ(a.committed_offset, b.committed_offset);
  EXPECT_EQ(a.committed_line, b.committed_line);
  EXPECT_EQ(a.committed_lines, b.committed_lines);
  EXPECT_EQ(a.assignments, b.assignments);
  EXPECT_EQ(a.split_from, b.split_from);
  EXPECT_EQ(a.skipped_lines, b.skipped_lines);
  EXPECT_EQ(a.skip_reason, b.skip_reason);
}


std::vector<proto::ShardRecord> Records(const ShardTracker& tracker) {
  std::vector<proto::ShardRecord> records;
  for (uint64_t id = 0; id < tracker.num_shards(); ++id) records.push_back(tracker.ToRecord(id));
  return records;
}

TEST(ShardTracker, SkipEndsAShardWithItsUncommittedLinesSkipped) {
  ShardTracker tracker(MakeShards(3), Identity(3));
  ASSERT_EQ(tracker.Assign(7)->shard_id, 0u);
  ASSERT_TRUE(CommitLines(tracker, 7, 0, 4).ok());
  const uint64_t at = tracker.shard(0).committed_offset;
  EXPECT_EQ(tracker.Skip(8, 0, at, "gone").status().code(), absl::StatusCode::kFailedPrecondition)
      << "not its shard";
  EXPECT_EQ(tracker.Skip(7, 0, at + kLineBytes, "gone").status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "not the committed offset";
  EXPECT_EQ(tracker.Skip(7, 9, at, "gone").status().code(), absl::StatusCode::kInvalidArgument);
  StatusOr<uint64_t> skipped = tracker.Skip(7, 0, at, "the file is gone");
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(*skipped, kShardLines - 4);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDone);
  EXPECT_EQ(tracker.shard(0).skip_reason, "the file is gone");
  EXPECT_EQ(tracker.committed_lines(), 4u);
  EXPECT_EQ(tracker.skipped_lines(), kShardLines - 4);
  EXPECT_EQ(tracker.done(), 1u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(CommitLines(tracker, 7, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition)
      << "nothing more is committed to a skipped shard";
  // The rest of the pass completes it.
  for (uint64_t id : {1u, 2u}) {
    ASSERT_EQ(tracker.Assign(7)->shard_id, id);
    ASSERT_TRUE(CommitLines(tracker, 7, id, tracker.shard(id).spec.lines).ok());
  }
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.committed_lines() + tracker.skipped_lines(), 2 * kShardLines + kLastShardLines);

  // A restarted master sees the same.
  StatusOr<ShardTracker> restored = ShardTracker::FromRecords(Records(tracker), Identity(3));
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectSameShard(restored->shard(0), tracker.shard(0));
  EXPECT_EQ(restored->skipped_lines(), kShardLines - 4);
  EXPECT_TRUE(restored->finished());
  // Skipped lines that are not exactly the uncommitted ones are refused.
  std::vector<proto::ShardRecord> bad = Records(tracker);
  bad[0].set_skipped_lines(2);
  EXPECT_EQ(ShardTracker::FromRecords(bad, Identity(3)).status().code(),
            absl::StatusCode::kDataLoss);
  bad = Records(tracker);
  bad[1].set_skipped_lines(1);  // a shard committed to its end
  EXPECT_EQ(ShardTracker::FromRecords(bad, Identity(3)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ShardTracker, RecordsRoundTripEveryState) {
  // Shards 0..4 of 10 lines, 5 of 4; handed out in `order`.
  const DataSet data = MakeShards(6);
  const std::vector<uint32_t> order = {2, 0, 5, 1, 4, 3};
  ShardTracker tracker(data, order);
  ASSERT_EQ(tracker.Assign(1)->shard_id, 2u);
  ASSERT_TRUE(CommitLines(tracker, 1, 2, 3).ok());  // DOING, committed
  ASSERT_EQ(tracker.Assign(2)->shard_id, 0u);
  ASSERT_TRUE(CommitLines(tracker, 2, 0, kShardLines).ok());  // DONE
  ASSERT_EQ(tracker.Assign(3)->shard_id, 5u);
  ASSERT_TRUE(CommitLines(tracker, 3, 5, 1).ok());
  ASSERT_EQ(tracker.Assign(4)->shard_id, 1u);
  ASSERT_TRUE(CommitLines(tracker, 4, 1, 5).ok());
  // Shard 2 has 7 lines left, 1 has 5, 5 has 3.
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(2));
  ASSERT_EQ(*tracker.Split(1, 2, data.shards[2].begin + 60, data.shards[2].first_line + 6), 6u);
  ASSERT_EQ(tracker.RequestSplit(2), std::optional<uint64_t>(1));
  ASSERT_EQ(*tracker.Split(4, 1, data.shards[1].begin + 70, data.shards[1].first_line + 7), 7u);
  EXPECT_EQ(tracker.Release(3), (std::vector<uint64_t>{5}));  // TODO, committed
  // TODO now, front to back: 5 (released), 7, 6 (split-offs), 4, 3.

  const std::vector<proto::ShardRecord> records = Records(tracker);
  ASSERT_EQ(records.size(), 8u);
  EXPECT_EQ(records[2].state(), proto::SHARD_DOING);
  EXPECT_EQ(records[2].holder(), 1u);
  EXPECT_EQ(records[0].state(), proto::SHARD_DONE);
  EXPECT_EQ(records[5].state(), proto::SHARD_TODO);
  EXPECT_EQ(records[6].split_from(), 2u);
  EXPECT_FALSE(records[3].has_split_from());

  StatusOr<ShardTracker> restored = ShardTracker::FromRecords(records, order);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->num_shards(), tracker.num_shards());
  for (uint64_t id = 0; id < tracker.num_shards(); ++id) {
    SCOPED_TRACE(id);
    ExpectSameShard(restored->shard(id), tracker.shard(id));
  }
  EXPECT_EQ(restored->todo(), 5u);
  EXPECT_EQ(restored->doing(), 2u);
  EXPECT_EQ(restored->done(), 1u);
  EXPECT_EQ(restored->committed_lines(), tracker.committed_lines());
  EXPECT_EQ(restored->splits(), 2u);
  EXPECT_FALSE(restored->finished());
  // Records of the restored tracker are the same records.
  const std::vector<proto::ShardRecord> again = Records(*restored);
  for (size_t id = 0; id < records.size(); ++id) {
    EXPECT_EQ(again[id].SerializeAsString(), records[id].SerializeAsString()) << id;
  }

  // DOING shards stay with their holders, who carry on committing.
  EXPECT_EQ(restored->shard(2).holder, 1u);
  EXPECT_EQ(restored->shard(1).holder, 4u);
  ASSERT_EQ(*restored->Commit(1, 2, data.shards[2].begin + 30, data.shards[2].begin + 60, 3),
            ShardTracker::CommitResult::kApplied);
  // TODO order: split-offs first (by id), then `order`.
  std::vector<uint64_t> handed;
  while (std::optional<ShardTracker::Assignment> a = restored->Assign(9)) {
    handed.push_back(a->shard_id);
    if (a->shard_id == 5) {
      EXPECT_EQ(a->committed_offset, data.shards[5].begin + kLineBytes);
      EXPECT_EQ(a->committed_line, data.shards[5].first_line + 1);
      EXPECT_EQ(a->lines, kLastShardLines - 1);
    }
    ASSERT_TRUE(CommitLines(*restored, 9, a->shard_id, a->lines).ok()) << a->shard_id;
  }
  EXPECT_EQ(handed, (std::vector<uint64_t>{6, 7, 5, 4, 3}));
  ASSERT_TRUE(CommitLines(*restored, 4, 1, 2).ok());
  EXPECT_TRUE(restored->finished());
  // Every line once, the ones committed before the restart included.
  EXPECT_EQ(restored->committed_lines(), data.lines);
}

// Shards missing from `order` are still queued; duplicates are harmless.
TEST(ShardTracker, RecordsNotInTheOrderAreStillQueued) {
  const DataSet data = MakeShards(3);
  ShardTracker tracker(data, Identity(3));
  StatusOr<ShardTracker> restored = ShardTracker::FromRecords(Records(tracker), {1, 1});
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->todo(), 3u);
  std::vector<uint64_t> handed;
  while (std::optional<ShardTracker::Assignment> a = restored->Assign(1)) {
    handed.push_back(a->shard_id);
  }
  EXPECT_EQ(handed, (std::vector<uint64_t>{1, 0, 2}));
}

TEST(ShardTracker, InconsistentRecordsAreDataLoss) {
  const DataSet data = MakeShards(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(CommitLines(tracker, 1, 0, 4).ok());
  const std::vector<proto::ShardRecord> good = Records(tracker);
  ASSERT_TRUE(ShardTracker::FromRecords(good, Identity(2)).ok());

  const std::vector<std::pair<const char*, std::function<void(proto::ShardRecord&)>>> breakages = {
      {"committed before begin", [](proto::ShardRecord& r) { r.set_begin(50); }},
      {"committed past end", [](proto::ShardRecord& r) { r.set_committed(200); }},
      {"more committed records than records",
       [](proto::ShardRecord& r) { r.set_committed_records(11); }},
      {"no state", [](proto::ShardRecord& r) { r.set_state(proto::SHARD_STATE_UNSPECIFIED); }},
      {"begin past end",
       [](proto::ShardRecord& r) {
         r.set_begin(120);
         r.set_committed(120);
       }},
      {"line and records disagree", [](proto::ShardRecord& r) { r.set_committed_line(9); }},
      {"done but not committed to the end",
       [](proto::ShardRecord& r) { r.set_state(proto::SHARD_DONE); }},
      {"every record committed short of the end",
       [](proto::ShardRecord& r) {
         r.set_committed_records(10);
         r.set_committed_line(11);
       }},
  };
  for (const auto& [what, breakage] : breakages) {
    std::vector<proto::ShardRecord> bad = good;
    breakage(bad[0]);
    StatusOr<ShardTracker> restored = ShardTracker::FromRecords(bad, Identity(2));
    EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << what;
  }
  // An order naming a shard that does not exist.
  EXPECT_EQ(ShardTracker::FromRecords(good, {0, 1, 2}).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ShardTracker, EmptyRecordsAreAFinishedTracker) {
  StatusOr<ShardTracker> restored = ShardTracker::FromRecords({}, {});
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(restored->finished());
  EXPECT_FALSE(restored->Assign(1).has_value());
}

}  // namespace
}  // namespace eps
