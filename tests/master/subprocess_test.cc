#include "master/autoscale/subprocess.h"

#include <signal.h>

#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

TEST(RunCommand, CapturesOutputAndExitCode) {
  StatusOr<CommandResult> result = RunShell("echo 7 3; echo oops >&2; exit 4", absl::Seconds(10));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 4);
  EXPECT_EQ(result->out, "7 3\n");
  EXPECT_EQ(result->err, "oops\n");
  EXPECT_EQ(DescribeFailure(*result), "oops (exit 4)");
}

TEST(RunCommand, KillsACommandPastItsTimeoutWithWhatItStarted) {
  testing::TempDir dir;
  const std::string marker = dir.Join("still-running");
  const absl::Time start = absl::Now();
  // The shell's child would outlive a kill of the shell alone.
  StatusOr<CommandResult> result =
      RunShell("(sleep 2; touch " + marker + ") & sleep 30", absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_NE(result.status().message().find("sleep 30"), std::string::npos) << result.status();
  EXPECT_LT(took, absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_FALSE(std::ifstream(marker).good()) << "the process group outlived the timeout";
}

TEST(RunCommand, KeepsAtMostTheLimitOfOutput) {
  StatusOr<CommandResult> result =
      RunShell("head -c 100000 /dev/zero; head -c 100000 /dev/zero >&2", absl::Seconds(10),
               /*max_output=*/1000);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_EQ(result->out.size(), 1000u);
  EXPECT_EQ(result->err.size(), 1000u);
}

TEST(RunCommand, AProgramThatDoesNotExistIsUnavailable) {
  StatusOr<CommandResult> result = RunCommand({"/nonexistent/eps-tool"}, absl::Seconds(5));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_NE(result.status().message().find("/nonexistent/eps-tool"), std::string::npos);
  EXPECT_EQ(RunCommand({}, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Subprocess, RunsWithItsEnvironmentAndLogsAndEndsBySignal) {
  testing::TempDir dir;
  const std::string log = dir.Join("child.log");
  StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(
      {"/bin/sh", "-c", "echo launch $EPS_TEST_VALUE; exec sleep 30"}, {"EPS_TEST_VALUE=42"}, log);
  ASSERT_TRUE(child.ok()) << child.status();
  auto logged = [&log] {
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    return text.str();
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (logged().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(logged(), "launch 42\n");
  EXPECT_FALSE((*child)->Poll().has_value());
  (*child)->Signal(SIGTERM);
  EXPECT_EQ((*child)->Wait(absl::Seconds(10)), 128 + SIGTERM);

  StatusOr<std::unique_ptr<Subprocess>> done = Subprocess::Start({"true"}, {}, log);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*done)->Wait(absl::Seconds(10)), 0);
  EXPECT_EQ(Subprocess::Start({"true"}, {}, dir.Join("no/such/dir/log")).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace eps
