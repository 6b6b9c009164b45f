// Tests core/status.h and core/logging.h.

#include "core/status.h"

#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

Status Fails() { return absl::NotFoundError("table 3"); }
Status Succeeds() { return absl::OkStatus(); }
StatusOr<int> Seven() { return 7; }
StatusOr<int> NoInt() { return absl::DataLossError("corrupt"); }

Status UsesReturnIfError(bool fail, int* reached) {
  RETURN_IF_ERROR(Succeeds());
  ++*reached;
  if (fail) RETURN_IF_ERROR_CTX(Fails(), "pull of shard 3");
  ++*reached;
  return absl::OkStatus();
}

StatusOr<int> UsesAssignOrReturn(bool fail) {
  ASSIGN_OR_RETURN(int a, Seven());
  if (fail) {
    ASSIGN_OR_RETURN(int b, NoInt());
    return a + b;
  }
  return a * 2;
}

TEST(Status, AnnotateKeepsCodeAndPayloads) {
  Status status = absl::UnavailableError("peer down");
  status.SetPayload("eps.test", absl::Cord("x"));
  const Status annotated = Annotate(status, "push to ps[2]");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(annotated.message(), "push to ps[2]: peer down");
  ASSERT_TRUE(annotated.GetPayload("eps.test").has_value());
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

TEST(Status, ReturnIfError) {
  int reached = 0;
  EXPECT_TRUE(UsesReturnIfError(false, &reached).ok());
  EXPECT_EQ(reached, 2);
  reached = 0;
  const Status status = UsesReturnIfError(true, &reached);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "pull of shard 3: table 3");
  EXPECT_EQ(reached, 1);
}

TEST(Status, AssignOrReturn) {
  EXPECT_EQ(UsesAssignOrReturn(false).value(), 14);
  EXPECT_EQ(UsesAssignOrReturn(true).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Logging, VerbosityGatesVlog) {
  const int before = LogVerbosity();
  SetLogVerbosity(0);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  VLOG(1) << "not evaluated " << count();
  EXPECT_EQ(evaluated, 0);
  SetLogVerbosity(1);
  VLOG(1) << "evaluated " << count();
  EXPECT_EQ(evaluated, 1);
  SetLogVerbosity(before);
  SetLogNode("test[0]");
  LOG(INFO) << "a line from test[0]";
  SetLogNode("eps");
}

TEST(LoggingDeathTest, CheckFailureAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(CHECK(1 + 1 == 3) << "math", "Check failed: 1 \\+ 1 == 3 math");
  EXPECT_DEATH(CHECK_EQ(2, 3), "2 vs 3");
  EXPECT_DEATH(CHECK_OK(absl::InternalError("broken")), "broken");
}

}  // namespace
}  // namespace eps
