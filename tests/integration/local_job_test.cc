// The integration harness's deadline (tests/testing/process.h): a job that
// cannot finish fails its test with the master's /status and the last
// lines of its log, instead of passing as slow.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr absl::Duration kDeadline = absl::Seconds(3);

// A job that waits for a server nobody starts: its master never exits.
class LocalJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status generated = GenerateData(dir_.Join("data"), 2000, /*seed=*/3, /*files=*/1);
    ASSERT_TRUE(generated.ok()) << generated;
    config_ = dir_.Join("job.ini");
    WriteFile(config_, "[ps]\nnum_servers = 1\n");
  }

  std::vector<std::string> DataFlags() const { return {"--data.train=" + dir_.Join("data/train")}; }

  // The first line the master wrote (its endpoints), which a failure's
  // message quotes from the log.
  static std::string FirstLogLine(LocalJob& job) {
    const std::string log = job.master().Log();
    return log.substr(0, log.find('\n'));
  }

  TempDir dir_;
  std::string config_;
};

TEST_F(LocalJobTest, MasterPastTheDeadlineIsAFailureWithStatusAndLogs) {
  LocalJob job(dir_.path(), config_, DataFlags(), kDeadline);
  ASSERT_TRUE(job.StartMaster().ok()) << job.Logs();
  ::testing::TestPartResultArray failures;
  StatusOr<int> exit = 0;
  const absl::Time start = absl::Now();
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    exit = job.WaitForMaster(absl::Minutes(2));
  }
  // It gave up at the deadline, not at the (longer) timeout.
  EXPECT_LT(absl::Now() - start, kDeadline + absl::Seconds(10));
  EXPECT_EQ(exit.status().code(), absl::StatusCode::kDeadlineExceeded) << exit.status();
  EXPECT_TRUE(job.master().Running());
  ASSERT_EQ(failures.size(), 1);
  const ::testing::TestPartResult& failure = failures.GetTestPartResult(0);
  EXPECT_TRUE(failure.nonfatally_failed());
  const std::string message = failure.message();
  EXPECT_TRUE(absl::StrContains(message, "deadline")) << message;
  EXPECT_TRUE(absl::StrContains(message, "\"state\"")) << message;
  const std::string line = FirstLogLine(job);
  ASSERT_FALSE(line.empty());
  EXPECT_TRUE(absl::StrContains(message, line)) << message;
}

TEST_F(LocalJobTest, StatusConditionTimingOutIsAFailureWithTheLastStatus) {
  LocalJob job(dir_.path(), config_, DataFlags());
  ASSERT_TRUE(job.StartMaster().ok()) << job.Logs();
  ::testing::TestPartResultArray failures;
  bool reached = true;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    reached = job.WaitForStatus([](const json& status) { return status["state"] == "finished"; },
                                absl::Seconds(2));
  }
  EXPECT_FALSE(reached);
  ASSERT_EQ(failures.size(), 1);
  const std::string message = failures.GetTestPartResult(0).message();
  EXPECT_TRUE(absl::StrContains(message, "\"state\":\"running\"")) << message;
  EXPECT_TRUE(absl::StrContains(message, FirstLogLine(job))) << message;
}

TEST_F(LocalJobTest, ServerStillRunningPastTheWaitIsAFailure) {
  LocalJob job(dir_.path(), config_, DataFlags());
  ASSERT_TRUE(job.StartMaster().ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer().ok());
  ::testing::TestPartResultArray failures;
  std::vector<std::optional<int>> codes;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    codes = job.WaitForOthers(absl::Seconds(1));
  }
  ASSERT_EQ(codes.size(), 1u);
  EXPECT_FALSE(codes[0].has_value());
  ASSERT_EQ(failures.size(), 1);
  const std::string message = failures.GetTestPartResult(0).message();
  EXPECT_TRUE(absl::StrContains(message, "server-0 still running")) << message;
  EXPECT_TRUE(absl::StrContains(message, "---- server-0 ----")) << message;
}

}  // namespace
}  // namespace eps::testing
