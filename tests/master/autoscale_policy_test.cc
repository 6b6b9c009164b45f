// AutoscalePolicy with scripted time: thresholds, min and max, the
// stabilization windows, the cooldown, a flapping signal, a failing source.

#include "master/autoscale/autoscale_policy.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using Action = AutoscaleDecision::Action;

JobConfig::Autoscale Options() {
  JobConfig::Autoscale options;
  options.source = "command";
  options.command = "true";
  options.min_workers = 1;
  options.max_workers = 4;
  options.gpus_per_worker = 1;
  options.scale_up_free_gpus = 1;
  options.scale_down_free_gpus = 0;
  options.interval_s = 10;
  options.cooldown_s = 0;
  options.scale_up_stabilization_s = 0;
  options.scale_down_stabilization_s = 0;
  return options;
}

AutoscaleSignal Free(int64_t free, int64_t pending = 0) { return {free, pending}; }

class AutoscalePolicyTest : public ::testing::Test {
 protected:
  // Reads `signal` one interval after the last reading.
  AutoscaleDecision Read(AutoscalePolicy& policy, const StatusOr<AutoscaleSignal>& signal,
                         int64_t starting_gpus = 0, int64_t stopping_gpus = 0) {
    now_ += absl::Seconds(10);
    return policy.Decide(signal, {.starting = starting_gpus, .stopping = stopping_gpus}, now_);
  }
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

TEST_F(AutoscalePolicyTest, StartsAtMinWorkers) {
  JobConfig::Autoscale options = Options();
  options.min_workers = 2;
  AutoscalePolicy policy(options);
  EXPECT_EQ(policy.target(), 2);
  EXPECT_THAT(policy.last().rule, HasSubstr("autoscale.min_workers = 2"));
}

TEST_F(AutoscalePolicyTest, TakesFreeGpusUpToMaxWorkers) {
  JobConfig::Autoscale options = Options();
  options.gpus_per_worker = 2;
  options.scale_up_free_gpus = 2;
  AutoscalePolicy policy(options);
  // One free GPU is not a worker's worth.
  AutoscaleDecision held = Read(policy, Free(1));
  EXPECT_EQ(held.action, Action::kHold);
  EXPECT_THAT(held.rule, HasSubstr("free GPUs 1 within [0, 2)"));
  AutoscaleDecision up = Read(policy, Free(5));
  EXPECT_EQ(up.action, Action::kUp);
  EXPECT_EQ(up.previous, 1);
  EXPECT_EQ(up.target, 3);  // 5 GPUs make 2 workers of 2
  EXPECT_THAT(up.rule, HasSubstr("free GPUs 5 >= autoscale.scale_up_free_gpus = 2"));
  ASSERT_TRUE(up.signal.has_value());
  EXPECT_EQ(up.signal->free_gpus, 5);
  AutoscaleDecision capped = Read(policy, Free(100));
  EXPECT_EQ(capped.target, 4);
  EXPECT_THAT(capped.rule, HasSubstr("at autoscale.max_workers = 4"));
  EXPECT_EQ(Read(policy, Free(100)).action, Action::kHold);
}

TEST_F(AutoscalePolicyTest, GpusOurStartingWorkersTakeAreNotFree) {
  AutoscalePolicy policy(Options());
  ASSERT_EQ(Read(policy, Free(2)).target, 3);
  // Slurm still counts the 2 GPUs as free until our jobs start on them.
  AutoscaleDecision decision = Read(policy, Free(2), /*starting_gpus=*/2);
  EXPECT_EQ(decision.action, Action::kHold);
  EXPECT_THAT(decision.rule, HasSubstr("free GPUs 0 (2 less 2 our starting workers take)"));
}

TEST_F(AutoscalePolicyTest, GivesBackWhatOthersWaitForDownToMinWorkers) {
  JobConfig::Autoscale options = Options();
  options.gpus_per_worker = 2;
  AutoscalePolicy policy(options);
  ASSERT_EQ(Read(policy, Free(6)).target, 4);
  // 3 GPUs wanted: two workers of 2 give them back.
  AutoscaleDecision down = Read(policy, Free(0, 3));
  EXPECT_EQ(down.action, Action::kDown);
  EXPECT_EQ(down.target, 2);
  EXPECT_THAT(down.rule,
              HasSubstr("other jobs wait for 3 GPUs, free GPUs 0: give back 2 worker(s)"));
  // Free GPUs that cover what others wait for: no growing into them, and
  // no shrinking either (the scheduler starts those jobs by itself).
  AutoscaleDecision covered = Read(policy, Free(6, 4));
  EXPECT_EQ(covered.action, Action::kHold);
  EXPECT_EQ(covered.target, 2);
  EXPECT_THAT(covered.rule,
              HasSubstr("other jobs wait for 4 GPUs, free GPUs 6 cover them: keep the size"));
  // Workers already leaving count for the demand: a shrink in progress is
  // not repeated while they go...
  AutoscaleDecision leaving = Read(policy, Free(2, 4), /*starting_gpus=*/0, /*stopping_gpus=*/2);
  EXPECT_EQ(leaving.action, Action::kHold);
  EXPECT_THAT(leaving.rule, HasSubstr("free GPUs 2 and 2 our stopping workers release cover them"));
  // ...but never as free GPUs to grow into.
  EXPECT_EQ(Read(policy, Free(0), /*starting_gpus=*/0, /*stopping_gpus=*/4).action, Action::kHold);
  // Demand beyond the free GPUs: only the difference is given back.
  AutoscaleDecision rest = Read(policy, Free(8, 10));
  EXPECT_EQ(rest.target, 1);
  EXPECT_THAT(rest.rule, HasSubstr("give back 1 worker(s)"));
  AutoscaleDecision floor = Read(policy, Free(0, 10));
  EXPECT_EQ(floor.action, Action::kHold);
  EXPECT_THAT(floor.rule, HasSubstr("at autoscale.min_workers = 1"));
}

TEST_F(AutoscalePolicyTest, ShrinksWhenFreeGpusFallBelowTheThreshold) {
  JobConfig::Autoscale options = Options();
  options.scale_up_free_gpus = 4;
  options.scale_down_free_gpus = 2;
  AutoscalePolicy policy(options);
  ASSERT_EQ(Read(policy, Free(6)).target, 4);
  EXPECT_EQ(Read(policy, Free(3)).action, Action::kHold);  // within [2, 4)
  AutoscaleDecision down = Read(policy, Free(0));
  EXPECT_EQ(down.target, 2);  // two workers free the two GPUs the threshold keeps
  EXPECT_THAT(down.rule, HasSubstr("free GPUs 0 < autoscale.scale_down_free_gpus = 2"));
}

TEST_F(AutoscalePolicyTest, CooldownHoldsTheNextChange) {
  JobConfig::Autoscale options = Options();
  options.cooldown_s = 25;
  options.max_workers = 10;
  AutoscalePolicy policy(options);
  ASSERT_EQ(Read(policy, Free(1)).target, 2);  // t = 10
  AutoscaleDecision held = Read(policy, Free(1));  // t = 20
  EXPECT_EQ(held.action, Action::kHold);
  EXPECT_EQ(held.target, 2);
  EXPECT_THAT(held.rule, HasSubstr("held at 2 by autoscale.cooldown_s = 25 (10 s since"));
  EXPECT_EQ(Read(policy, Free(1)).action, Action::kHold);  // t = 30: 20 s
  EXPECT_EQ(Read(policy, Free(1)).target, 3);             // t = 40: 30 s
}

TEST_F(AutoscalePolicyTest, ScaleDownStabilizationTakesTheHighestRecentRecommendation) {
  JobConfig::Autoscale options = Options();
  options.scale_down_stabilization_s = 30;
  AutoscalePolicy policy(options);
  ASSERT_EQ(Read(policy, Free(3)).target, 4);  // t = 10, recommends 4
  AutoscaleDecision held = Read(policy, Free(0, 3));  // t = 20, recommends 1
  EXPECT_EQ(held.action, Action::kHold);
  EXPECT_THAT(held.rule, HasSubstr("held at 4 by the stabilization window"));
  EXPECT_EQ(Read(policy, Free(0, 3)).action, Action::kHold);  // t = 30: t = 10's 4 is in it
  AutoscaleDecision down = Read(policy, Free(0, 3));            // t = 40: out of the window
  EXPECT_EQ(down.action, Action::kDown);
  EXPECT_EQ(down.target, 1);
}

TEST_F(AutoscalePolicyTest, ScaleUpStabilizationTakesTheLowestRecentRecommendation) {
  JobConfig::Autoscale options = Options();
  options.scale_up_stabilization_s = 20;
  AutoscalePolicy policy(options);
  EXPECT_EQ(Read(policy, Free(0)).action, Action::kHold);  // t = 10, recommends 1
  EXPECT_EQ(Read(policy, Free(3)).action, Action::kHold);  // t = 20: the 1 is in the window
  AutoscaleDecision up = Read(policy, Free(3));            // t = 30: 4 and 4
  EXPECT_EQ(up.action, Action::kUp);
  EXPECT_EQ(up.target, 4);
}

TEST_F(AutoscalePolicyTest, AFlappingSignalDoesNotFlap) {
  JobConfig::Autoscale options = Options();
  options.cooldown_s = 15;
  options.scale_down_stabilization_s = 60;
  AutoscalePolicy policy(options);
  std::vector<int64_t> targets;
  int changes = 0;
  for (int i = 0; i < 30; ++i) {
    // Every other interval: 3 GPUs free, then another job waiting for 3.
    const AutoscaleDecision decision = Read(policy, i % 2 == 0 ? Free(3) : Free(0, 3));
    changes += decision.action != Action::kHold;
    targets.push_back(decision.target);
  }
  EXPECT_EQ(changes, 1) << ::testing::PrintToString(targets);
  EXPECT_EQ(policy.target(), 4);
}

TEST_F(AutoscalePolicyTest, AFailingSourceHoldsTheSizeAndSaysWhy) {
  AutoscalePolicy policy(Options());
  ASSERT_EQ(Read(policy, Free(1)).target, 2);
  AutoscaleDecision held = Read(policy, absl::UnavailableError("sinfo: not reachable"));
  EXPECT_EQ(held.action, Action::kHold);
  EXPECT_EQ(held.target, 2);
  EXPECT_FALSE(held.signal.has_value());
  EXPECT_THAT(held.rule, HasSubstr("no signal (sinfo: not reachable): keeping 2 worker(s)"));
  EXPECT_EQ(policy.last().rule, held.rule);
  EXPECT_FALSE(held.ToJson().contains("free_gpus"));
  EXPECT_EQ(Read(policy, Free(1)).target, 3);
  EXPECT_EQ(policy.last().ToJson()["action"], "scale_up");
}

}  // namespace
}  // namespace eps
