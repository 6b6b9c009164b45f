// Tests core/clock.h.

#include "core/clock.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

TEST(Clock, RealFollowsAbslNow) {
  Clock* clock = Clock::Real();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(Clock::Real(), clock);
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, absl::Now());
}

TEST(ScriptedClock, MovesOnlyWhenTold) {
  ScriptedClock clock;
  const absl::Time start = absl::FromUnixSeconds(1'700'000'000);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(5));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now(), start + absl::Seconds(5));
  clock.Set(start - absl::Hours(1));
  EXPECT_EQ(clock.Now(), start - absl::Hours(1));
}

TEST(ScriptedClock, StartsWhereTold) {
  const absl::Time start = absl::FromUnixMillis(42);
  ScriptedClock clock(start);
  EXPECT_EQ(clock.Now(), start);
}

TEST(ScriptedClock, WorksThroughTheInterface) {
  ScriptedClock scripted;
  const Clock& clock = scripted;
  const absl::Time start = clock.Now();
  scripted.Advance(absl::Milliseconds(250));
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(250));
}

TEST(ScriptedClockDeathTest, AdvanceBackwardsCrashes) {
  ScriptedClock clock;
  EXPECT_DEATH(clock.Advance(absl::Seconds(-1)), "ScriptedClock::Advance");
}

}  // namespace
}  // namespace eps
