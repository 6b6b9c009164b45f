// Tests master/shard_tracker.h: the TODO -> DOING -> DONE state machine,
// exactly-once commits and Release.

#include "master/shard_tracker.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/data_set.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

// Lines of kLineBytes bytes; shard i holds kRecords lines (the last one
// `last_records`) starting at byte i * kRecords * kLineBytes.
constexpr uint64_t kLineBytes = 10;
constexpr uint64_t kRecords = 10;
constexpr uint64_t kLastRecords = 4;

DataSet MakeData(int num_shards, uint64_t last_records = kLastRecords) {
  DataSet data;
  data.files = {"/data/part-0"};
  uint64_t offset = 0;
  uint64_t line = 1;
  for (int i = 0; i < num_shards; ++i) {
    const uint64_t records = i + 1 == num_shards ? last_records : kRecords;
    data.shards.push_back(ShardSpec{.file = 0,
                                    .begin = offset,
                                    .end = offset + records * kLineBytes,
                                    .first_line = line,
                                    .records = records});
    offset += records * kLineBytes;
    line += records;
    data.records += records;
  }
  data.bytes = offset;
  return data;
}

std::vector<uint32_t> Identity(int n) {
  std::vector<uint32_t> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  return order;
}

// Commits `lines` lines of shard `id` from its committed offset.
StatusOr<ShardTracker::CommitResult> CommitLines(ShardTracker& tracker, uint32_t worker,
                                                 uint64_t id, uint64_t lines) {
  const uint64_t begin = tracker.shard(id).committed;
  return tracker.Commit(worker, id, begin, begin + lines * kLineBytes, lines);
}

TEST(ShardTracker, AssignsInTheGivenOrder) {
  const DataSet data = MakeData(4);
  ShardTracker tracker(data, {2, 0, 3, 1});
  EXPECT_EQ(tracker.num_shards(), 4u);
  EXPECT_EQ(tracker.todo(), 4u);
  std::vector<uint64_t> handed;
  while (std::optional<ShardTracker::Assignment> a = tracker.Assign(/*worker=*/7)) {
    const ShardSpec& spec = data.shards[a->shard_id];
    EXPECT_EQ(a->spec->begin, spec.begin);
    EXPECT_EQ(a->start, spec.begin);
    EXPECT_EQ(a->start_line, spec.first_line);
    EXPECT_EQ(a->records, spec.records);
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
  const DataSet data = MakeData(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);

  ASSERT_EQ(*CommitLines(tracker, 1, 0, 3), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(0).committed, 3 * kLineBytes);
  EXPECT_EQ(tracker.shard(0).committed_line, 4u);
  EXPECT_EQ(tracker.shard(0).committed_records, 3u);
  EXPECT_EQ(tracker.committed_records(), 3u);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDoing);

  ASSERT_EQ(*CommitLines(tracker, 1, 0, 7), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDone);
  EXPECT_EQ(tracker.committed_records(), 10u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(tracker.done(), 1u);
  EXPECT_FALSE(tracker.finished());

  ASSERT_EQ(tracker.Assign(1)->shard_id, 1u);
  ASSERT_EQ(*CommitLines(tracker, 1, 1, kLastRecords), ShardTracker::CommitResult::kApplied);
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.committed_records(), data.records);
  EXPECT_FALSE(tracker.Assign(1).has_value());
}

TEST(ShardTracker, RepeatedCommitIsADuplicateCountedOnce) {
  const DataSet data = MakeData(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_EQ(*tracker.Commit(1, 0, 0, 40, 4), ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(*tracker.Commit(1, 0, 0, 40, 4), ShardTracker::CommitResult::kDuplicate);
  EXPECT_EQ(tracker.committed_records(), 4u);
  EXPECT_EQ(tracker.shard(0).committed, 40u);

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
  EXPECT_EQ(tracker.committed_records(), 12u);
}

TEST(ShardTracker, CommitByNonHolderIsRefused) {
  const DataSet data = MakeData(3);
  ShardTracker tracker(data, Identity(3));
  ASSERT_EQ(tracker.Assign(1)->shard_id, 0u);
  StatusOr<ShardTracker::CommitResult> other = tracker.Commit(2, 0, 0, 10, 1);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("not held by worker 2"));
  // A shard nobody holds yet.
  EXPECT_EQ(tracker.Commit(1, 1, 100, 110, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker.committed_records(), 0u);
}

TEST(ShardTracker, GapOrOverlapIsRefused) {
  const DataSet data = MakeData(1, kRecords);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 30, 3).ok());
  // A gap: starts past the committed offset.
  EXPECT_EQ(tracker.Commit(1, 0, 40, 50, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  // An overlap: starts before the committed offset and ends past it.
  EXPECT_EQ(tracker.Commit(1, 0, 20, 50, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker.shard(0).committed, 30u);
  EXPECT_EQ(tracker.committed_records(), 3u);
}

TEST(ShardTracker, OutOfRangeCommitIsInvalid) {
  const DataSet data = MakeData(2);
  ShardTracker tracker(data, Identity(2));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(tracker.Assign(1).has_value());
  EXPECT_EQ(tracker.Commit(1, 2, 0, 10, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Commit(1, 0, 0, 110, 10).status().code(), absl::StatusCode::kInvalidArgument);
  // Shard 1 starts at byte 100.
  EXPECT_EQ(tracker.Commit(1, 1, 90, 110, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Commit(1, 0, 20, 10, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.committed_records(), 0u);
}

TEST(ShardTracker, TooManyRecordsIsInvalid) {
  const DataSet data = MakeData(1, kRecords);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 50, 5).ok());
  StatusOr<ShardTracker::CommitResult> result = tracker.Commit(1, 0, 50, 90, 6);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("only 5 are left"));
  EXPECT_EQ(tracker.committed_records(), 5u);
}

// Records and bytes must agree: a commit reaching the shard's end covers
// every record left, and one that stops short leaves some. A peer claiming
// otherwise must get an error, not crash the master.
TEST(ShardTracker, RecordCountInconsistentWithRangeIsInvalid) {
  const DataSet data = MakeData(1, kRecords);
  ShardTracker tracker(data, Identity(1));
  ASSERT_TRUE(tracker.Assign(1).has_value());
  // Reaches the end with records left over.
  EXPECT_EQ(tracker.Commit(1, 0, 0, 100, 9).status().code(), absl::StatusCode::kInvalidArgument);
  // Claims every record but stops short of the end.
  EXPECT_EQ(tracker.Commit(1, 0, 0, 90, 10).status().code(), absl::StatusCode::kInvalidArgument);
  // Bytes without records, and records without bytes.
  EXPECT_EQ(tracker.Commit(1, 0, 0, 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.Commit(1, 0, 0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker.committed_records(), 0u);
  EXPECT_EQ(tracker.shard(0).state, ShardTracker::State::kDoing);
  ASSERT_TRUE(tracker.Commit(1, 0, 0, 100, 10).ok());
  EXPECT_TRUE(tracker.finished());
}

TEST(ShardTracker, ReleaseResumesAtTheCommittedOffsetAtTheFront) {
  const DataSet data = MakeData(4);
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
  EXPECT_EQ(resumed.start, data.shards[1].begin + 4 * kLineBytes);
  EXPECT_EQ(resumed.start_line, data.shards[1].first_line + 4);
  EXPECT_EQ(resumed.records, kRecords - 4);
  EXPECT_EQ(fresh.start, data.shards[3].begin);
  EXPECT_EQ(fresh.start_line, data.shards[3].first_line);
  EXPECT_EQ(fresh.records, kLastRecords);
  EXPECT_EQ(tracker.shard(1).assignments, 2u);
  EXPECT_EQ(tracker.Assign(2)->shard_id, 0u);
  EXPECT_EQ(tracker.Assign(2)->shard_id, 2u);

  // The new holder picks up exactly where the old one stopped.
  EXPECT_EQ(*tracker.Commit(2, 1, data.shards[1].begin, resumed.start, 4),
            ShardTracker::CommitResult::kDuplicate);
  ASSERT_EQ(*tracker.Commit(2, 1, resumed.start, data.shards[1].end, 6),
            ShardTracker::CommitResult::kApplied);
  EXPECT_EQ(tracker.shard(1).state, ShardTracker::State::kDone);
  EXPECT_EQ(tracker.committed_records(), kRecords);
}

// A shard whose workers keep dying is never dropped, and each of its
// records is counted once however often it moves.
TEST(ShardTracker, RepeatedDeathsNeverDropOrDoubleCount) {
  const DataSet data = MakeData(3);
  ShardTracker tracker(data, Identity(3));
  uint32_t worker = 0;
  for (uint64_t i = 0; i < kRecords - 1; ++i) {
    std::optional<ShardTracker::Assignment> a = tracker.Assign(++worker);
    ASSERT_TRUE(a.has_value());
    ASSERT_EQ(a->shard_id, 0u) << "round " << i;
    EXPECT_EQ(a->start, i * kLineBytes);
    EXPECT_EQ(a->start_line, 1 + i);
    EXPECT_EQ(a->records, kRecords - i);
    ASSERT_EQ(*CommitLines(tracker, worker, 0, 1), ShardTracker::CommitResult::kApplied);
    // The dying worker's last commit may arrive twice.
    EXPECT_EQ(*tracker.Commit(worker, 0, i * kLineBytes, (i + 1) * kLineBytes, 1),
              ShardTracker::CommitResult::kDuplicate);
    EXPECT_EQ(tracker.Release(worker).size(), 1u);
    EXPECT_EQ(tracker.committed_records(), i + 1);
    EXPECT_EQ(tracker.todo(), 3u);
  }
  EXPECT_EQ(tracker.reassignments(), kRecords - 1);
  // Finish everything with one last worker.
  ++worker;
  while (std::optional<ShardTracker::Assignment> a = tracker.Assign(worker)) {
    ASSERT_EQ(*CommitLines(tracker, worker, a->shard_id, a->records),
              ShardTracker::CommitResult::kApplied);
  }
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.done(), 3u);
  EXPECT_EQ(tracker.todo(), 0u);
  EXPECT_EQ(tracker.doing(), 0u);
  EXPECT_EQ(tracker.committed_records(), data.records);
  EXPECT_EQ(tracker.shard(0).assignments, kRecords);
}

TEST(ShardTracker, EmptyDataSetIsFinishedAtOnce) {
  const DataSet data;
  ShardTracker tracker(data, {});
  EXPECT_TRUE(tracker.finished());
  EXPECT_FALSE(tracker.Assign(1).has_value());
}

}  // namespace
}  // namespace eps
