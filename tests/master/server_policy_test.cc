// ServerScalePolicy with scripted time: each rule that grows the job, the
// idle rule that shrinks it, min and max, readings during a change, and
// counters read as differences between readings.

#include "master/autoscale/server_policy.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using Action = AutoscaleDecision::Action;

constexpr int64_t kMiB = int64_t{1} << 20;

JobConfig::Autoscale Options() {
  JobConfig::Autoscale options;
  options.min_servers = 1;
  options.max_servers = 3;
  options.servers_memory_high = 0.9;
  options.interval_s = 10;
  options.cooldown_s = 0;
  options.scale_up_stabilization_s = 0;
  options.scale_down_stabilization_s = 0;
  return options;
}

// A push-latency histogram: `fast` pushes under 1 ms and `slow` ones of
// about 100 ms.
HistogramSnapshot Pushes(uint64_t fast, uint64_t slow) {
  HistogramSnapshot pushes;
  pushes.bounds = {0.001, 0.01, 0.1, 1.0};
  pushes.counts = {fast, 0, slow, 0, 0};
  pushes.count = fast + slow;
  pushes.sum = 0.0005 * static_cast<double>(fast) + 0.1 * static_cast<double>(slow);
  return pushes;
}

// `evictions`: since the server started.
ServerReading Server(uint32_t slot, int64_t memory_mib, int64_t budget_mib = 100,
                     uint64_t evictions = 0) {
  return ServerReading{.slot = slot,
                       .memory_bytes = memory_mib * kMiB,
                       .budget_bytes = budget_mib * kMiB,
                       .hits = 0,
                       .misses = 0,
                       .evictions = evictions,
                       .push_latency = Pushes(0, 0)};
}

class ServerScalePolicyTest : public ::testing::Test {
 protected:
  AutoscaleDecision Read(ServerScalePolicy& policy, const std::vector<ServerReading>& servers,
                         const std::string& changing = "") {
    now_ += absl::Seconds(10);
    return policy.Decide(servers, changing, now_);
  }
  absl::Time now_ = absl::UnixEpoch();
};

TEST_F(ServerScalePolicyTest, AServerOverItsMemoryShareAndEvictingAddsOneUpToTheMaximum) {
  ServerScalePolicy policy(Options(), 1);
  AutoscaleDecision decision = Read(policy, {Server(0, 95, 100, 1000)});
  EXPECT_EQ(decision.action, Action::kUp);
  EXPECT_EQ(decision.target, 2);
  EXPECT_THAT(decision.rule, HasSubstr("ps[0] holds 95.0 MiB"));
  EXPECT_THAT(decision.rule, HasSubstr("autoscale.servers_memory_high"));
  EXPECT_THAT(decision.rule, HasSubstr("evicted 1000 rows"));
  decision = Read(policy, {Server(0, 95, 100, 2000), Server(1, 95, 100, 1000)});
  EXPECT_EQ(decision.target, 3);
  decision =
      Read(policy, {Server(0, 95, 100, 3000), Server(1, 95, 100, 2000), Server(2, 95, 100, 500)});
  EXPECT_EQ(decision.action, Action::kHold);
  EXPECT_EQ(decision.target, 3);
  EXPECT_THAT(decision.rule, HasSubstr("autoscale.max_servers = 3"));
  // Under the mark: nothing to add; without a budget, never.
  ServerScalePolicy calm(Options(), 1);
  EXPECT_EQ(Read(calm, {Server(0, 85, 100, 1000)}).action, Action::kHold);
  EXPECT_EQ(Read(calm, {Server(0, 500, /*budget_mib=*/0, 2000)}).action, Action::kHold);
  // Past the mark but no longer evicting since the last reading (a hot
  // tier's size never falls: after a join it stays): its rows fit now.
  ServerScalePolicy fits(Options(), 2);
  Read(fits, {Server(0, 95, 100, 1000), Server(1, 10)});
  decision = Read(fits, {Server(0, 95, 100, 1050), Server(1, 10)});
  EXPECT_EQ(decision.action, Action::kHold) << decision.rule;
}

TEST_F(ServerScalePolicyTest, ALowHitRateSinceTheLastReadingAddsOne) {
  JobConfig::Autoscale options = Options();
  options.servers_min_hit_rate = 0.9;
  ServerScalePolicy policy(options, 1);
  ServerReading server = Server(0, 10);
  // 5,000 lookups, half from the store: but the first reading counts all
  // since the server started.
  server.hits = 2500;
  server.misses = 2500;
  AutoscaleDecision decision = Read(policy, {server});
  EXPECT_EQ(decision.action, Action::kUp) << decision.rule;
  EXPECT_THAT(decision.rule, HasSubstr("hit rate 0.500"));
  // Since then 10,000 lookups, all from memory: the rate of the interval
  // is 1, whatever the server's whole life says.
  ServerScalePolicy later(options, 1);
  Read(later, {server});
  server.hits += 10000;
  decision = Read(later, {server});
  EXPECT_EQ(decision.action, Action::kHold) << decision.rule;
  // Too few lookups to judge.
  server.misses += 500;
  EXPECT_EQ(Read(later, {server}).action, Action::kHold);
}

TEST_F(ServerScalePolicyTest, ASlowPushP99AddsOne) {
  JobConfig::Autoscale options = Options();
  options.servers_max_push_ms = 50;
  ServerScalePolicy policy(options, 1);
  ServerReading server = Server(0, 10);
  server.push_latency = Pushes(900, 100);  // p99 in the 100 ms bucket
  AutoscaleDecision decision = Read(policy, {server});
  EXPECT_EQ(decision.action, Action::kUp) << decision.rule;
  EXPECT_THAT(decision.rule, HasSubstr("push p99 100.0 ms"));
  ServerScalePolicy fast(options, 1);
  server.push_latency = Pushes(1000, 5);  // p99 under 1 ms
  EXPECT_EQ(Read(fast, {server}).action, Action::kHold);
}

TEST_F(ServerScalePolicyTest, IdleServersShrinkByOneDownToTheMinimum) {
  ServerScalePolicy policy(Options(), 3);
  // 30 MiB in all over 2 servers: 15 each, under half of 90.
  AutoscaleDecision decision = Read(policy, {Server(0, 10), Server(1, 10), Server(2, 10)});
  EXPECT_EQ(decision.action, Action::kDown) << decision.rule;
  EXPECT_EQ(decision.target, 2);
  EXPECT_THAT(decision.rule, HasSubstr("idle with one server fewer"));
  decision = Read(policy, {Server(0, 10), Server(1, 10)});
  EXPECT_EQ(decision.target, 1) << decision.rule;
  decision = Read(policy, {Server(0, 10)});
  EXPECT_EQ(decision.action, Action::kHold);
  EXPECT_EQ(decision.target, 1);
  // 100 MiB over one server fewer is past half of the mark: no shrinking.
  ServerScalePolicy busy(Options(), 2);
  decision = Read(busy, {Server(0, 50), Server(1, 50)});
  EXPECT_EQ(decision.action, Action::kHold);
  EXPECT_THAT(decision.rule, HasSubstr("would pass half"));
  // A server that evicts rows is not idle, whatever its size.
  ServerScalePolicy evicting(Options(), 2);
  Read(evicting, {Server(0, 10, 100, 0), Server(1, 10)});
  decision = Read(evicting, {Server(0, 10, 100, 500), Server(1, 10)});
  EXPECT_EQ(decision.action, Action::kHold) << decision.rule;
  EXPECT_THAT(decision.rule, HasSubstr("evicts rows"));
  // With no budget and no other rule, nothing tells an idle server.
  ServerScalePolicy blind(Options(), 2);
  decision = Read(blind, {Server(0, 1, 0), Server(1, 1, 0)});
  EXPECT_EQ(decision.action, Action::kHold);
  EXPECT_THAT(decision.rule, HasSubstr("no rule can tell"));
}

TEST_F(ServerScalePolicyTest, ReadingsDuringAChangeHoldTheSize) {
  ServerScalePolicy policy(Options(), 1);
  AutoscaleDecision decision =
      Read(policy, {Server(0, 95, 100, 1000)}, "partitions are moving");
  EXPECT_EQ(decision.action, Action::kHold);
  EXPECT_EQ(decision.target, 1);
  EXPECT_THAT(decision.rule, HasSubstr("partitions are moving"));
  EXPECT_EQ(Read(policy, {Server(0, 95, 100, 2000)}).action, Action::kUp);
}

TEST_F(ServerScalePolicyTest, BelowTheMinimumGrowsAtOnce) {
  JobConfig::Autoscale options = Options();
  options.min_servers = 2;
  ServerScalePolicy policy(options, 1);
  const AutoscaleDecision decision = Read(policy, {Server(0, 1)});
  EXPECT_EQ(decision.action, Action::kUp);
  EXPECT_EQ(decision.target, 2);
  EXPECT_THAT(decision.rule, HasSubstr("autoscale.min_servers = 2"));
}

TEST_F(ServerScalePolicyTest, TheDownWindowHoldsAShrink) {
  JobConfig::Autoscale options = Options();
  options.scale_down_stabilization_s = 30;
  ServerScalePolicy policy(options, 2);
  // Busy, then idle: the busy reading is within the window.
  Read(policy, {Server(0, 50), Server(1, 50)});
  AutoscaleDecision decision = Read(policy, {Server(0, 10), Server(1, 10)});
  EXPECT_EQ(decision.action, Action::kHold) << decision.rule;
  EXPECT_THAT(decision.rule, HasSubstr("stabilization window"));
  Read(policy, {Server(0, 10), Server(1, 10)});
  decision = Read(policy, {Server(0, 10), Server(1, 10)});
  EXPECT_EQ(decision.action, Action::kDown) << decision.rule;
}

}  // namespace
}  // namespace eps
