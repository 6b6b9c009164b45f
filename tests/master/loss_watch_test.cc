// Tests master/progress/loss_watch.h: the recent loss weighs about the last window
// of records; a loss past the factor for kDivergedWindows windows is
// divergence, judged against epoch 1's mean loss or ln 2, whichever is
// lower; a healthy start's overshoot is not; a factor of 0 judges nothing.

#include "master/progress/loss_watch.h"

#include <cstdint>
#include <optional>
#include <string>

#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

class LossWatchTest : public ::testing::Test {
 protected:
  LossWatchTest() {
    job_.job.divergence_factor = 2;
    job_.worker.batch_size.value = 8;  // a window of 64 records
  }
  // Trains `batches` batches of 8 records at mean loss `loss` in `epoch`,
  // keeping epoch 1's totals as the ledger would.
  void Train(int batches, double loss, uint32_t epoch = 0) {
    for (int i = 0; i < batches; ++i) {
      std::optional<LossWatch::EpochTotals> epoch1;
      if (started_) epoch1 = epoch1_;
      watch_.Add(8 * loss, 8, epoch, epoch1);
      started_ = true;
      if (epoch == 0) {
        epoch1_.loss_sum += 8 * loss;
        epoch1_.records += 8;
      }
    }
  }

  JobConfig job_;
  LossWatch watch_{job_};
  LossWatch::EpochTotals epoch1_;
  bool started_ = false;
};

TEST_F(LossWatchTest, TheWindowIsEightOfTheLargestBatchesAndAtLeast64) {
  EXPECT_EQ(watch_.window(), 64);
  job_.worker.batch_size.value = 512;
  EXPECT_EQ(watch_.window(), 4096);
}

TEST_F(LossWatchTest, TheRecentLossWeighsTheLastRecordsMost) {
  EXPECT_FALSE(watch_.recent().has_value());
  Train(40, 0.5);
  Train(8, 1.0);
  ASSERT_TRUE(watch_.recent().has_value());
  EXPECT_GT(*watch_.recent(), 0.8);
  EXPECT_LT(*watch_.recent(), 0.9);
}

TEST_F(LossWatchTest, ALossPastTheFactorForLongIsDivergenceNamingItsReference) {
  Train(40, 0.3);  // epoch 1's baseline: 0.3
  Train(4, 5.0);
  EXPECT_TRUE(watch_.past_factor());
  EXPECT_FALSE(watch_.Diverging(0).has_value()) << "not for long enough";
  Train(80, 5.0);
  const std::optional<std::string> why = watch_.Diverging(0);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("training diverged in epoch 1"));
  EXPECT_THAT(*why, HasSubstr("job.divergence_factor (2) times epoch 1's mean loss before them"));
}

TEST_F(LossWatchTest, AHealthyStartsOvershootIsNotDivergence) {
  // Twice ln 2 for a few batches, then learning: judged against ln 2.
  Train(6, 1.5);
  Train(200, 0.4);
  EXPECT_FALSE(watch_.Diverging(0).has_value());
  EXPECT_FALSE(watch_.past_factor());
}

TEST_F(LossWatchTest, ALossThatExplodesFromTheStartIsJudgedAgainstLn2) {
  Train(100, 50.0);
  const std::optional<std::string> why = watch_.Diverging(0);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("a model that knows nothing (ln 2"));
}

TEST_F(LossWatchTest, LaterEpochsAreJudgedAgainstEpochOnesMean) {
  Train(100, 0.3);
  Train(100, 5.0, /*epoch=*/1);
  const std::optional<std::string> why = watch_.Diverging(1);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("training diverged in epoch 2"));
  EXPECT_THAT(*why, HasSubstr("times epoch 1's mean loss, 0.30000"));
}

TEST_F(LossWatchTest, AFactorOfZeroJudgesNothingAndResetForgets) {
  job_.job.divergence_factor = 0;
  Train(10, 0.5);
  Train(100, 50.0);
  EXPECT_FALSE(watch_.past_factor());
  EXPECT_FALSE(watch_.Diverging(0).has_value());
  watch_.Reset();
  EXPECT_FALSE(watch_.recent().has_value());
}

}  // namespace
}  // namespace eps
