// Seeing a job, with the real binaries: the events log records a killed
// worker's death and its shards' reassignment, scripts/plot_run.py draws
// the run, and (label `browser`) the master's page renders in headless
// Chromium without errors.

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr absl::Duration kJobTimeout = absl::Seconds(180);

std::string WriteJobConfig(const TempDir& dir) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path,
            "[job]\n"
            "name = observed\n"
            "progress_interval_s = 1\n"
            "[data]\n"
            "shard_records = 5000\n"
            "[ps]\n"
            "num_servers = 1\n"
            "partitions = 8\n"
            "[worker]\n"
            "batch_size = 512\n"
            "max_records_per_s = 10000\n"
            "master_wait_s = 30\n"
            "[master]\n"
            "heartbeat_ms = 200\n"
            "lease_ms = 1000\n");
  return path;
}

bool IsPng(const std::string& path) {
  const std::string bytes = ReadFile(path);
  return bytes.size() > 10000 && bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0;
}

TEST(Observability, KilledWorkerShowsInTheEventsLogAndThePlot) {
  TempDir dir;
  ASSERT_TRUE(GenerateData(dir.Join("data"), 60000, /*seed=*/3, /*files=*/1).ok());
  LocalJob job(dir.path(), WriteJobConfig(dir),
               {"--data.train=" + dir.Join("data/train"), "--data.eval=" + dir.Join("data/eval")});
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["records_trained"].get<uint64_t>() > 10000 && status["workers"].size() == 2;
  })) << job.Logs();
  const pid_t doomed = job.workers()[1]->pid();
  job.workers()[1]->Signal(SIGKILL);
  StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(exit.ok() && *exit == 0) << job.Logs();

  // The death, by pid, then its shards going back to the queue.
  int64_t dead_worker = -1;
  int reassigned = 0;
  int progress = 0;
  bool evaluated = false;
  for (const json& event : ReadEvents(job.master_dir())) {
    const std::string name = event["event"];
    if (name == "worker_dead" && event["pid"] == doomed) dead_worker = event["worker"];
    if (name == "shard_reassigned" && dead_worker >= 0 && event["from_worker"] == dead_worker) {
      ++reassigned;
    }
    progress += name == "progress";
    evaluated |= name == "evaluation_finished";
  }
  EXPECT_GE(dead_worker, 0) << "no worker_dead event for pid " << doomed;
  EXPECT_GE(reassigned, 1) << "no shard_reassigned event from worker " << dead_worker;
  EXPECT_GE(progress, 3);
  EXPECT_TRUE(evaluated);

  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string png = dir.Join("run.png");
  const auto [plotted, plot_log] = PlotRun(job.master_dir(), png);
  if (plotted == 1 && absl::StrContains(plot_log, "needs matplotlib")) {
    GTEST_SKIP() << "python3-matplotlib is not installed: " << plot_log;
  }
  ASSERT_EQ(plotted, 0) << plot_log;
  EXPECT_TRUE(IsPng(png)) << png;
}

}  // namespace
}  // namespace eps::testing
