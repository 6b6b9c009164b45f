// The server autoscaler (autoscale.max_servers) with real processes: a job
// whose one server passes its memory share gets a second one, started by
// the master, which joins and takes partitions; a job of two idle servers
// drains one. Both finish with every record committed exactly once.

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr int kRows = 200000;

class ServerAutoscaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(GenerateData(dir_.Join("data"), kRows, /*seed=*/29, /*files=*/2).ok());
    lines_ = CountLines(dir_.Join("data/train"));
  }

  // The job's flags: about 25 s of training, the server autoscaler reading
  // every second, and `extra`.
  std::vector<std::string> Overrides(const std::vector<std::string>& extra) const {
    std::vector<std::string> flags = {
        "--data.train=" + dir_.Join("data/train"), "--data.eval=" + dir_.Join("data/eval"),
        "--worker.max_records_per_s=4000", "--autoscale.max_servers=2",
        "--autoscale.interval_s=1", "--autoscale.cooldown_s=0",
        "--autoscale.scale_down_stabilization_s=0",
        "--autoscale.server_binary=" + BinaryPath("eps-server")};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }

  static size_t ServersWithPartitions(const json& status) {
    size_t count = 0;
    for (const json& server : status["servers"]) count += server["partitions"] > 0;
    return count;
  }

  TempDir dir_;
  uint64_t lines_ = 0;
};

TEST_F(ServerAutoscaleTest, AServerPastItsMemoryShareGetsAnotherThatJoins) {
  LocalJob job(dir_.path(), WriteFaultJobConfig(dir_.path(), "server-autoscale"),
               Overrides({"--ps.num_servers=1", "--ps.memory_budget_mb=1",
                          "--autoscale.servers_memory_high=0.5"}));
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["autoscale"]["servers"]["target_servers"] == 2 &&
           ServersWithPartitions(status) == 2;
  })) << job.master().Log();
  json status;
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job, absl::Minutes(4), lines_, &status));
  const std::vector<json> events = ReadEvents(job.master_dir());
  const std::vector<json> ups = EventsNamed(events, "servers_scale_up");
  ASSERT_EQ(ups.size(), 1u) << job.master().Log();
  EXPECT_NE(ups[0]["rule"].get<std::string>().find("autoscale.servers_memory_high"),
            std::string::npos)
      << ups[0].dump();
  EXPECT_EQ(EventsNamed(events, "server_joined").size(), 1u);
  EXPECT_TRUE(EventsNamed(events, "server_launch_exited").empty());
  std::cout << "moves " << status["moves"].dump() << "\n";
}

TEST_F(ServerAutoscaleTest, OneOfTwoIdleServersIsDrained) {
  LocalJob job(dir_.path(), WriteFaultJobConfig(dir_.path(), "server-autoscale"),
               Overrides({"--ps.memory_budget_mb=256"}));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  json status;
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job, absl::Minutes(4), lines_, &status));
  const std::vector<json> events = ReadEvents(job.master_dir());
  const std::vector<json> downs = EventsNamed(events, "servers_scale_down");
  ASSERT_EQ(downs.size(), 1u) << status["autoscale"].dump() << job.master().Log();
  EXPECT_NE(downs[0]["rule"].get<std::string>().find("idle with one server fewer"),
            std::string::npos)
      << downs[0].dump();
  EXPECT_EQ(EventsNamed(events, "server_drained").size(), 1u) << job.master().Log();
  EXPECT_EQ(ServersWithPartitions(status), 1u) << status["servers"].dump();
  EXPECT_EQ(status["autoscale"]["servers"]["target_servers"], 1) << status["autoscale"].dump();
}

}  // namespace
}  // namespace eps::testing
