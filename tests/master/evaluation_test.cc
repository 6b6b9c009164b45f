// Tests master/progress/evaluation.h: results are kept per commit and queued for
// the store, the metrics come from all of them when the pass finishes,
// who committed is known (or, after a restart with results, assumed), and
// a new pass or a rollback drops what it should.

#include "master/progress/evaluation.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/progress/data_set.h"
#include "master/progress/shard_tracker.h"
#include "proto/eps.pb.h"
#include "tests/master/unit_testing.h"
#include "tests/testing/recording_events.h"

namespace eps {
namespace {

using ::testing::ElementsAre;

class EvaluationTest : public ::testing::Test {
 protected:
  RecordingEvents events_;
  Evaluation evaluation_{&events_};
};

TEST_F(EvaluationTest, TheMetricsCoverEveryResultWhenThePassFinishes) {
  evaluation_.Start();
  const std::vector<float> labels_a = {1, 0}, predictions_a = {0.9f, 0.2f};
  const std::vector<float> labels_b = {1, 0}, predictions_b = {0.4f, 0.6f};
  evaluation_.Add(/*worker=*/1, /*shard=*/0, /*begin=*/0, labels_a, predictions_a, 1);
  evaluation_.Add(/*worker=*/2, /*shard=*/1, /*begin=*/0, labels_b, predictions_b, 0);
  EXPECT_EQ(evaluation_.records(), 4u);
  EXPECT_EQ(evaluation_.malformed(), 1u);
  EXPECT_FALSE(evaluation_.auc().has_value()) << "not before the pass is over";
  evaluation_.Finish();
  ASSERT_TRUE(evaluation_.auc().has_value());
  // Pairs (positive, negative): 0.9 > 0.2, 0.9 > 0.6, 0.4 > 0.2, 0.4 < 0.6.
  EXPECT_DOUBLE_EQ(*evaluation_.auc(), 0.75);
  ASSERT_EQ(events_.Count("evaluation_finished"), 1u);
  EXPECT_EQ(events_.Named("evaluation_finished")[0]["records"], 4);
}

TEST_F(EvaluationTest, EachResultIsQueuedForTheStoreOnce) {
  const std::vector<float> labels = {1}, predictions = {0.7f};
  evaluation_.Add(1, /*shard=*/3, /*begin=*/40, labels, predictions, 0);
  StateUpdate update;
  evaluation_.TakeChanges(&update);
  EXPECT_EQ(PeekUpdate(update).put_keys.size(), 1u);
  StateUpdate again;
  evaluation_.TakeChanges(&again);
  EXPECT_TRUE(PeekUpdate(again).put_keys.empty());
}

TEST_F(EvaluationTest, WhoCommittedIsKnownUntilARestartWithResults) {
  const std::vector<float> labels = {1}, predictions = {0.7f};
  evaluation_.Add(1, 0, 0, labels, predictions, 0);
  EXPECT_TRUE(evaluation_.CommittedBy(1));
  EXPECT_FALSE(evaluation_.CommittedBy(2));

  MasterSnapshot snapshot;
  Evaluation restarted(&events_);
  restarted.RestoreResults(snapshot);
  EXPECT_FALSE(restarted.CommittedBy(2)) << "no results: nobody committed";
  snapshot.eval_results[{0, 0}] = {labels, predictions};
  Evaluation with_results(&events_);
  with_results.RestoreResults(snapshot);
  EXPECT_TRUE(with_results.CommittedBy(2)) << "not stored: anyone may have";
  EXPECT_EQ(with_results.records(), 1u);
}

TEST_F(EvaluationTest, ResultsComeInTheOrderOfTheData) {
  // Two files, a shard each; shard 0 holds file 1.
  DataSet data = MakeData("/data/eval-0", {4});
  DataSet other = MakeData("/data/eval-1", {4});
  data.files.push_back(other.files[0]);
  ShardSpec second = other.shards[0];
  second.file = 1;
  data.shards.insert(data.shards.begin(), second);
  data.shards[1].file = 0;
  ShardTracker tracker(data, {0, 1});
  evaluation_.Add(1, /*shard=*/0, /*begin=*/0, std::vector<float>{0}, std::vector<float>{0.1f}, 0);
  evaluation_.Add(1, /*shard=*/1, /*begin=*/8, std::vector<float>{1}, std::vector<float>{0.3f}, 0);
  evaluation_.Add(1, /*shard=*/1, /*begin=*/0, std::vector<float>{1}, std::vector<float>{0.2f}, 0);
  std::vector<float> labels, predictions;
  evaluation_.InDataOrder(tracker, &labels, &predictions);
  EXPECT_THAT(predictions, ElementsAre(0.2f, 0.3f, 0.1f));
  EXPECT_THAT(labels, ElementsAre(1, 1, 0));
}

TEST_F(EvaluationTest, ANewPassKeepsTheLastMetricsAndARollbackDropsThem) {
  evaluation_.Add(1, 0, 0, std::vector<float>{1, 0}, std::vector<float>{0.9f, 0.1f}, 0);
  evaluation_.Skip(5, "/data/eval-0 lines 1-5: unreadable");
  evaluation_.Finish();
  evaluation_.Start();
  EXPECT_EQ(evaluation_.records(), 0u);
  EXPECT_EQ(evaluation_.lines_skipped(), 0u);
  EXPECT_FALSE(evaluation_.CommittedBy(1));
  EXPECT_TRUE(evaluation_.auc().has_value());
  evaluation_.Reset();
  EXPECT_FALSE(evaluation_.auc().has_value());
  EXPECT_FALSE(evaluation_.logloss().has_value());
}

TEST_F(EvaluationTest, TheRecordKeepsTheMetricsAndTheSkips) {
  evaluation_.Add(1, 0, 0, std::vector<float>{1, 0}, std::vector<float>{0.9f, 0.1f}, 0);
  evaluation_.Skip(5, "/data/eval-0 lines 1-5: unreadable");
  evaluation_.Finish();
  proto::MasterRecord record;
  evaluation_.SaveTo(&record);
  EXPECT_EQ(record.eval_records(), 2u);
  Evaluation restored(&events_);
  restored.RestoreFrom(record);
  EXPECT_EQ(restored.auc(), evaluation_.auc());
  EXPECT_EQ(restored.logloss(), evaluation_.logloss());
  EXPECT_EQ(restored.lines_skipped(), 5u);
  EXPECT_THAT(restored.skipped(), ElementsAre("/data/eval-0 lines 1-5: unreadable"));
}

}  // namespace
}  // namespace eps
