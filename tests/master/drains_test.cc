// Tests master/drains.h on its own: each transition of its diagram, what
// holds other server changes back, and the saved record.

#include "master/drains.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/eps.pb.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using State = Drains::State;

TEST(DrainsTest, ASlotDrainsEmptiesAndLeaves) {
  Drains drains;
  EXPECT_EQ(drains.state(1), State::kNone);
  EXPECT_FALSE(drains.Emptied(1)) << "not draining";
  ASSERT_TRUE(drains.Start(1));
  EXPECT_FALSE(drains.Start(1)) << "already draining";
  EXPECT_EQ(drains.state(1), State::kDraining);
  EXPECT_TRUE(drains.Leaving(1));
  EXPECT_EQ(drains.FirstDraining(), 1u);
  EXPECT_THAT(drains.drained(), IsEmpty());

  EXPECT_TRUE(drains.Emptied(1));
  EXPECT_FALSE(drains.Emptied(1)) << "server_drained is recorded once";
  EXPECT_EQ(drains.state(1), State::kDrained);
  EXPECT_TRUE(drains.Leaving(1)) << "a drained slot takes no partition";
  EXPECT_EQ(drains.FirstDraining(), std::nullopt) << "it holds nothing back";
  EXPECT_THAT(drains.drained(), ElementsAre(1u));
  EXPECT_FALSE(drains.Start(1)) << "a drain of a drained slot starts nothing";

  drains.Retired(1);
  EXPECT_EQ(drains.state(1), State::kNone);
  EXPECT_THAT(drains.leaving(), IsEmpty());
}

TEST(DrainsTest, ARefilledSlotDrainsAgainAndAStoppedOneStays) {
  Drains drains;
  ASSERT_TRUE(drains.Start(0));
  ASSERT_TRUE(drains.Start(2));
  ASSERT_TRUE(drains.Emptied(0));
  drains.Refilled(0);  // a recovery gave it partitions back
  EXPECT_EQ(drains.state(0), State::kDraining);
  EXPECT_TRUE(drains.Emptied(0)) << "drained again, recorded again";
  EXPECT_TRUE(drains.Stop(2));
  EXPECT_FALSE(drains.Stop(2));
  EXPECT_EQ(drains.state(2), State::kNone);
  EXPECT_THAT(drains.leaving(), ElementsAre(0u));
  drains.Refilled(3);  // no drain: nothing
  EXPECT_EQ(drains.state(3), State::kNone);
}

TEST(DrainsTest, TheRecordKeepsEveryLeavingSlotAsDraining) {
  Drains drains;
  ASSERT_TRUE(drains.Start(4));
  ASSERT_TRUE(drains.Start(1));
  ASSERT_TRUE(drains.Emptied(4));
  proto::MasterRecord record;
  drains.SaveTo(&record);
  EXPECT_THAT(record.draining_servers(), ElementsAre(1u, 4u));
  Drains restored;
  restored.RestoreFrom(record);
  EXPECT_EQ(restored.state(1), State::kDraining);
  EXPECT_EQ(restored.state(4), State::kDraining) << "the next plan finds it empty";
  EXPECT_EQ(restored.FirstDraining(), 1u);
}

}  // namespace
}  // namespace eps
