// Tests ps/row_quota.h with scripted time.

#include "ps/row_quota.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/message.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

TEST(RowQuota, AWorkerInDebtWaitsUntilItRefills) {
  ScriptedClock clock;
  RowQuota quota(/*rows_per_s=*/1000, &clock);
  EXPECT_TRUE(quota.Admit(7).ok());
  // One request may overdraw: it ran before its rows were known.
  quota.Charge(7, 1500);
  const Status refused = quota.Admit(7);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(refused), proto::SLOW_DOWN);
  EXPECT_THAT(refused.message(), HasSubstr("ps.max_new_rows_per_worker_s = 1000"));
  // Other workers have quotas of their own.
  EXPECT_TRUE(quota.Admit(8).ok());
  // Half a second repays 500 of the 500 owed: still not above zero.
  clock.Advance(absl::Milliseconds(500));
  EXPECT_FALSE(quota.Admit(7).ok());
  clock.Advance(absl::Milliseconds(10));
  EXPECT_TRUE(quota.Admit(7).ok());
  EXPECT_EQ(quota.workers_kept(), 1u);
  // Refilled: forgotten when it next asks.
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(quota.Admit(7).ok());
  EXPECT_EQ(quota.workers_kept(), 0u);
}

// Many ids (one key holder registered again and again) share the total.
TEST(RowQuota, ManyWorkersTogetherStayWithinTheTotal) {
  ScriptedClock clock;
  RowQuota quota(/*rows_per_s=*/1000, &clock, /*total_rows_s=*/3000);
  for (uint32_t worker = 0; worker < 3; ++worker) {
    ASSERT_TRUE(quota.Admit(worker).ok());
    quota.Charge(worker, 900);  // each within its own quota
  }
  ASSERT_TRUE(quota.Admit(3).ok());
  quota.Charge(3, 400);  // the total is spent now
  for (uint32_t worker : {0u, 4u, 99u}) {
    const Status refused = quota.Admit(worker);
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << worker;
    EXPECT_EQ(ReasonOf(refused), proto::SLOW_DOWN);
    EXPECT_THAT(refused.message(), HasSubstr("ps.max_new_rows_s = 3000"));
  }
  // A tenth of a second repays 300 of the 100 owed.
  clock.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(quota.Admit(99).ok());
  // A full second later the total and every worker are as good as new.
  clock.Advance(absl::Seconds(2));
  EXPECT_TRUE(quota.Admit(0).ok());
  EXPECT_TRUE(quota.Admit(99).ok());
}

TEST(RowQuota, ASteadyRateUnderTheLimitIsNeverRefused) {
  ScriptedClock clock;
  RowQuota quota(/*rows_per_s=*/1000, &clock);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(quota.Admit(1).ok()) << "request " << i;
    quota.Charge(1, 90);  // 900 rows/s
    clock.Advance(absl::Milliseconds(100));
  }
}

TEST(RowQuota, ZeroIsUnlimited) {
  ScriptedClock clock;
  RowQuota quota(/*rows_per_s=*/0, &clock);
  quota.Charge(1, uint64_t{1} << 40);
  EXPECT_TRUE(quota.Admit(1).ok());
}

TEST(RowQuota, ForgetsWorkersThatRefilled) {
  ScriptedClock clock;
  RowQuota quota(/*rows_per_s=*/10, &clock);
  // Many ids in debt, then quiet for a while: a new charge sweeps them,
  // and each is as good as new.
  for (uint32_t id = 0; id < 2000; ++id) quota.Charge(id, 10);
  EXPECT_GE(quota.workers_kept(), 1024u);
  clock.Advance(absl::Seconds(2));
  quota.Charge(5000, 1);
  EXPECT_EQ(quota.workers_kept(), 1u);
  for (uint32_t id = 0; id < 2000; ++id) ASSERT_TRUE(quota.Admit(id).ok()) << id;
}

}  // namespace
}  // namespace eps
