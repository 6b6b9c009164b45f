// Tests core/token_bucket.h: a full bucket lends its capacity at once, then
// one token per 1/per_s seconds; debt is paid back by time; a clock going
// back refills nothing; a refilled bucket is full.

#include "core/token_bucket.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1000);

TEST(TokenBucket, TakesItsCapacityAtOnceThenOneTokenPerRefill) {
  TokenBucket bucket(/*capacity=*/4, /*per_s=*/2, t0);
  EXPECT_TRUE(bucket.full());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(bucket.TakeOne()) << i;
  EXPECT_FALSE(bucket.TakeOne());
  EXPECT_FALSE(bucket.full());
  bucket.Refill(t0 + absl::Milliseconds(400));
  EXPECT_FALSE(bucket.TakeOne()) << "0.8 of a token";
  bucket.Refill(t0 + absl::Milliseconds(500));
  EXPECT_TRUE(bucket.TakeOne());
  // Never past its capacity, however long it rests.
  bucket.Refill(t0 + absl::Hours(1));
  EXPECT_TRUE(bucket.full());
  EXPECT_DOUBLE_EQ(bucket.tokens(), 4);
}

TEST(TokenBucket, DebtIsPaidBackByTime) {
  TokenBucket bucket(/*capacity=*/10, /*per_s=*/10, t0);
  bucket.Spend(25);
  EXPECT_DOUBLE_EQ(bucket.tokens(), -15);
  EXPECT_FALSE(bucket.TakeOne());
  bucket.Refill(t0 + absl::Seconds(1));
  EXPECT_DOUBLE_EQ(bucket.tokens(), -5);
  bucket.Refill(t0 + absl::Seconds(2));
  EXPECT_DOUBLE_EQ(bucket.tokens(), 5);
  EXPECT_TRUE(bucket.TakeOne());
}

TEST(TokenBucket, AClockGoingBackRefillsNothing) {
  TokenBucket bucket(/*capacity=*/2, /*per_s=*/1, t0);
  ASSERT_TRUE(bucket.TakeOne());
  ASSERT_TRUE(bucket.TakeOne());
  bucket.Refill(t0 - absl::Seconds(5));
  EXPECT_FALSE(bucket.TakeOne());
  // And the time it went back is not counted twice when it comes forward.
  bucket.Refill(t0 + absl::Milliseconds(900));
  EXPECT_FALSE(bucket.TakeOne());
  bucket.Refill(t0 + absl::Seconds(1));
  EXPECT_TRUE(bucket.TakeOne());
}

}  // namespace
}  // namespace eps
