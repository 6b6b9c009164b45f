// Tests core/failpoint.h: the EPS_FAILPOINTS parser, and that an armed
// failpoint answers for its value only. (What an armed failpoint does, such
// as a server killing itself, is up to the crash tests of that code.)

#include "core/failpoint.h"

#include <stdlib.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(ParseFailpoints, ParsesEntries) {
  StatusOr<Failpoints> parsed = ParseFailpoints("ps.crash_in_checkpoint=7");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(*parsed, UnorderedElementsAre(Pair("ps.crash_in_checkpoint", 7u)));

  parsed = ParseFailpoints(" a=1 , b.c = 18446744073709551615,d=0");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(*parsed, UnorderedElementsAre(Pair("a", 1u), Pair("b.c", 18446744073709551615u),
                                            Pair("d", 0u)));
}

TEST(ParseFailpoints, EmptyArmsNothing) {
  for (const char* spec : {"", "  "}) {
    StatusOr<Failpoints> parsed = ParseFailpoints(spec);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(parsed->empty()) << "'" << spec << "'";
  }
}

TEST(ParseFailpoints, RejectsMalformedEntries) {
  for (const char* spec : {"a", "=3", "a=", "a=x", "a=-1", "a=+1", "a=1.5", "a=1,", ",a=1",
                           "a=1,,b=2", "a=18446744073709551616", "a=1=2"}) {
    StatusOr<Failpoints> parsed = ParseFailpoints(spec);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << "'" << spec << "'";
  }
  StatusOr<Failpoints> parsed = ParseFailpoints("a=1,b=2,a=3");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("a is given twice"));
}

// The only test in this binary that calls FailpointArmed: the variable is
// read at the first call.
TEST(FailpointArmed, AnswersForTheArmedValueOnlyAndReadsTheEnvironmentOnce) {
  ASSERT_EQ(setenv("EPS_FAILPOINTS", "test.point=5,test.other=0", /*overwrite=*/1), 0);
  EXPECT_TRUE(FailpointArmed("test.point", 5));
  EXPECT_FALSE(FailpointArmed("test.point", 4));
  EXPECT_FALSE(FailpointArmed("test.point", 6));
  EXPECT_TRUE(FailpointArmed("test.other", 0));
  EXPECT_FALSE(FailpointArmed("test.unknown", 5));
  ASSERT_EQ(setenv("EPS_FAILPOINTS", "test.point=6", /*overwrite=*/1), 0);
  EXPECT_TRUE(FailpointArmed("test.point", 5));
  EXPECT_FALSE(FailpointArmed("test.point", 6));
  unsetenv("EPS_FAILPOINTS");
}

}  // namespace
}  // namespace eps
