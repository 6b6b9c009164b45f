// Tests worker/batch_sizer.h with scripted step times: a simulated device
// whose records/s rise with the batch until it saturates.

#include "worker/batch_sizer.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

BatchSizer::Options Auto(int64_t min, int64_t max) {
  BatchSizer::Options options;
  options.automatic = true;
  options.min = min;
  options.max = max;
  options.window_batches = 4;
  options.window_time = absl::Milliseconds(100);
  return options;
}

// A step of `records` on a device with `overhead` per step and a top rate
// of `peak` records/s: small batches are overhead-bound, large ones
// saturate it.
absl::Duration StepTime(int64_t records, absl::Duration overhead, double peak) {
  return overhead + absl::Seconds(static_cast<double>(records) / peak);
}

// Runs steps at whatever size the sizer asks until it settles (or `steps`
// run out); returns every size it moved to.
std::vector<int64_t> RunUntilSettled(BatchSizer& sizer, absl::Duration overhead, double peak,
                                     int steps = 10000) {
  std::vector<int64_t> sizes = {sizer.size()};
  for (int i = 0; i < steps && !sizer.settled(); ++i) {
    const int64_t records = sizer.size();
    if (std::optional<BatchSizer::Change> change =
            sizer.StepDone(records, StepTime(records, overhead, peak))) {
      EXPECT_EQ(change->from, records);
      EXPECT_EQ(change->to, sizer.size());
      EXPECT_FALSE(change->reason.empty());
      sizes.push_back(change->to);
    }
  }
  return sizes;
}

TEST(BatchSizer, FixedSizeNeverChanges) {
  BatchSizer::Options options;
  options.min = options.max = 512;
  BatchSizer sizer(options);
  EXPECT_TRUE(sizer.settled());
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(sizer.StepDone(512, absl::Milliseconds(10)).has_value());
  }
  EXPECT_FALSE(sizer.OutOfMemory(512).has_value());
  EXPECT_EQ(sizer.size(), 512);
}

TEST(BatchSizer, GrowsWhileRecordsPerSecondRiseThenSettlesOnTheSizeBefore) {
  // 1 ms per step, at most 1M records/s: the rate at b is b / (1 ms + b us).
  // 256: 204k/s; 512: 339k; 1024: 506k; 2048: 672k (+33%); 4096: 804k
  // (+20%); 8192: 891k (+11%); 16384: 942k (+6%): back to 8192.
  BatchSizer sizer(Auto(256, 65536));
  const std::vector<int64_t> sizes = RunUntilSettled(sizer, absl::Milliseconds(1), 1e6);
  EXPECT_THAT(sizes, ::testing::ElementsAre(256, 512, 1024, 2048, 4096, 8192, 16384, 8192));
  EXPECT_TRUE(sizer.settled());
  EXPECT_EQ(sizer.size(), 8192);
  // Settled means settled: more steps change nothing.
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(sizer.StepDone(8192, absl::Milliseconds(9)));
}

TEST(BatchSizer, StopsAtTheLargestSizeAllowed) {
  BatchSizer sizer(Auto(256, 1024));
  const std::vector<int64_t> sizes = RunUntilSettled(sizer, absl::Milliseconds(1), 1e6);
  EXPECT_THAT(sizes, ::testing::ElementsAre(256, 512, 1024));
  EXPECT_TRUE(sizer.settled());
  EXPECT_EQ(sizer.size(), 1024);
}

TEST(BatchSizer, ASaturatedDeviceKeepsTheMinimum) {
  // No per-step overhead: records/s are the same at every size.
  BatchSizer sizer(Auto(256, 65536));
  const std::vector<int64_t> sizes = RunUntilSettled(sizer, absl::ZeroDuration(), 1e5);
  EXPECT_THAT(sizes, ::testing::ElementsAre(256, 512, 256));
  EXPECT_EQ(sizer.size(), 256);
}

TEST(BatchSizer, ShortBatchesAndTheFirstAtANewSizeDoNotCount) {
  BatchSizer sizer(Auto(256, 65536));
  // A shard's short last batches, however fast, never measure anything.
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(sizer.StepDone(100, absl::Microseconds(1)));
  // One left out, then 4 batches and 100 ms: the fifth full batch decides.
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(sizer.StepDone(256, absl::Milliseconds(30))) << i;
  }
  std::optional<BatchSizer::Change> change = sizer.StepDone(256, absl::Milliseconds(30));
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->to, 512);
  EXPECT_THAT(change->reason, HasSubstr("8533 records/s at 256: trying 512"));
}

TEST(BatchSizer, OutOfMemoryHalvesAndNeverGrowsBackToIt) {
  BatchSizer sizer(Auto(256, 65536));
  while (sizer.size() < 2048) {
    sizer.StepDone(sizer.size(), StepTime(sizer.size(), absl::Milliseconds(1), 1e6));
  }
  ASSERT_FALSE(sizer.settled());
  const int64_t failed = sizer.size();
  std::optional<BatchSizer::Change> change = sizer.OutOfMemory(failed);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->from, failed);
  EXPECT_EQ(change->to, failed / 2);
  EXPECT_THAT(change->reason, HasSubstr("ran out of memory"));
  EXPECT_TRUE(sizer.settled());
  // A batch made before the shrink fails too: no second halving.
  EXPECT_FALSE(sizer.OutOfMemory(failed).has_value());
  EXPECT_EQ(sizer.size(), failed / 2);
  // But one at the new size does, down to the minimum and no further.
  change = sizer.OutOfMemory(failed / 2);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(sizer.size(), std::max<int64_t>(256, failed / 4));
  while (sizer.size() > 256) ASSERT_TRUE(sizer.OutOfMemory(sizer.size()).has_value());
  EXPECT_FALSE(sizer.OutOfMemory(256).has_value());
  EXPECT_EQ(sizer.size(), 256);
}

TEST(LearningRateScale, RulesAgainstTheReference) {
  LearningRateScale none("none", 256, 0);
  LearningRateScale linear("linear", 256, 0);
  LearningRateScale sqrt_rule("sqrt", 256, 0);
  EXPECT_FLOAT_EQ(none.Next(1024), 1.0f);
  EXPECT_FLOAT_EQ(linear.Next(1024), 4.0f);
  EXPECT_FLOAT_EQ(linear.Next(128), 0.5f);  // a short last batch
  EXPECT_FLOAT_EQ(sqrt_rule.Next(1024), 2.0f);
  EXPECT_FLOAT_EQ(sqrt_rule.Next(256), 1.0f);
}

TEST(LearningRateScale, WarmsUpLinearlyAfterASizeChange) {
  LearningRateScale scale("linear", 256, /*warmup_batches=*/3);
  EXPECT_FLOAT_EQ(scale.Next(256), 1.0f);
  scale.SizeChanged(256, 1024);
  // From 1 towards 4 over 3 batches: weights 3/4, 2/4, 1/4 on the old value.
  EXPECT_FLOAT_EQ(scale.Next(1024), 0.75f * 1 + 0.25f * 4);
  EXPECT_FLOAT_EQ(scale.Next(1024), 0.5f * 1 + 0.5f * 4);
  EXPECT_FLOAT_EQ(scale.Next(1024), 0.25f * 1 + 0.75f * 4);
  EXPECT_FLOAT_EQ(scale.Next(1024), 4.0f);
  // A change in the middle of a warm-up starts from where the factor is.
  scale.SizeChanged(1024, 512);
  EXPECT_FLOAT_EQ(scale.Next(512), 0.75f * 4 + 0.25f * 2);
  scale.SizeChanged(512, 256);
  const float from = 0.5f * 4 + 0.5f * 2;  // where it stood
  EXPECT_FLOAT_EQ(scale.Next(256), 0.75f * from + 0.25f * 1);
}

TEST(LearningRateScale, ForUsesTheReferenceBatchSize) {
  JobConfig job;
  job.optimizer.lr_scaling = "sqrt";
  job.optimizer.lr_warmup_batches = 0;
  job.worker.batch_size = IntOrAuto{0, true};
  job.worker.min_batch_size = 100;
  LearningRateScale scale = LearningRateScale::For(job);
  EXPECT_FLOAT_EQ(scale.Next(400), 2.0f);
  BatchSizer::Options options = BatchSizer::OptionsFor(job.worker);
  EXPECT_TRUE(options.automatic);
  EXPECT_EQ(options.min, 100);
  EXPECT_EQ(options.max, job.worker.max_batch_size);
}

// What heartbeats report: the size now and the changes after a session's
// start, the latest kChangesKept at most, each numbered once.
TEST(WorkerBatchSize, ReportsTheChangesAfterASessionsStart) {
  JobConfig job;
  job.worker.batch_size = IntOrAuto{0, true};
  job.worker.min_batch_size = 1;
  job.worker.max_batch_size = 1 << 20;
  job.optimizer.lr_scaling = "linear";
  job.optimizer.lr_warmup_batches = 0;
  WorkerBatchSize batch_size(job);
  EXPECT_EQ(batch_size.size(), 1);
  EXPECT_EQ(batch_size.last_change(), 0u);
  // One batch left out, then the eighth of 200 ms (over a second in all)
  // decides: a doubling, then out of memory back to 1.
  ASSERT_FALSE(batch_size.StepDone(1, absl::Milliseconds(1)));
  for (int i = 0; i < 7; ++i) ASSERT_FALSE(batch_size.StepDone(1, absl::Milliseconds(200)));
  std::optional<BatchSizer::Change> grown = batch_size.StepDone(1, absl::Milliseconds(200));
  ASSERT_TRUE(grown.has_value());
  EXPECT_EQ(batch_size.size(), 2);
  const uint64_t session_start = batch_size.last_change();
  EXPECT_EQ(session_start, 1u);
  EXPECT_TRUE(batch_size.OutOfMemory(2).has_value());
  EXPECT_EQ(batch_size.size(), 1);
  EXPECT_FLOAT_EQ(batch_size.LrScale(1), 1.0f);

  proto::WorkerStats stats;
  batch_size.Report(session_start, &stats);
  EXPECT_EQ(stats.batch_size(), 1u);
  ASSERT_EQ(stats.batch_size_changes_size(), 1);
  EXPECT_EQ(stats.batch_size_changes(0).seq(), 2u);
  EXPECT_EQ(stats.batch_size_changes(0).from(), 2u);
  EXPECT_EQ(stats.batch_size_changes(0).to(), 1u);
  EXPECT_THAT(stats.batch_size_changes(0).reason(), HasSubstr("ran out of memory"));
  stats.Clear();
  batch_size.Report(0, &stats);
  EXPECT_EQ(stats.batch_size_changes_size(), 2);
}

}  // namespace
}  // namespace eps
