// The autoscaler with real processes: the `command` source reads a file
// the test rewrites (free GPUs, others' pending GPUs) and the `local`
// launcher starts and stops eps-worker processes. The job starts at
// min_workers, grows to max_workers when GPUs are free, replaces a worker
// killed with -9, shrinks when another job waits for GPUs, and finishes
// with every record committed exactly once; every decision is in the
// events log with the signal's values.

#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr int kRows = 40000;

std::string WriteJobConfig(const TempDir& dir, const std::string& signal_file) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path, absl::StrCat("[job]\n"
                               "name = autoscale\n"
                               "epochs = 6\n"
                               "[data]\n"
                               "shard_records = 2000\n"
                               "[worker]\n"
                               "batch_size = 256\n"
                               "max_records_per_s = 2500\n"
                               "compute_threads = 1\n"
                               "[master]\n"
                               "heartbeat_ms = 200\n"
                               "lease_ms = 2000\n"
                               "[checkpoint]\n"
                               "interval_s = 5\n"
                               "[autoscale]\n"
                               "source = command\n"
                               "command = cat ",
                               signal_file,
                               "\n"
                               "launcher = local\n"
                               "worker_binary = ",
                               BinaryPath("eps-worker"),
                               "\n"
                               "min_workers = 1\n"
                               "max_workers = 3\n"
                               "interval_s = 1\n"
                               "cooldown_s = 0\n"
                               "scale_down_stabilization_s = 2\n"
                               "restart_backoff_s = 1\n"));
  return path;
}

int AliveWorkers(const json& status) {
  int alive = 0;
  for (const json& worker : status["workers"]) alive += worker["state"] == "alive";
  return alive;
}

std::vector<json> Named(const std::vector<json>& events, const std::string& name) {
  std::vector<json> named;
  for (const json& event : events) {
    if (event["event"] == name) named.push_back(event);
  }
  return named;
}

TEST(AutoscaleTest, GrowsShrinksAndReplacesWithEveryRecordOnce) {
  TempDir dir;
  Status generated = GenerateData(dir.Join("data"), kRows, /*seed=*/5, /*files=*/2);
  ASSERT_TRUE(generated.ok()) << generated;
  const std::string signal = dir.Join("signal");
  WriteFile(signal, "0 0\n");  // another job holds every GPU
  LocalJob job(dir.path(), WriteJobConfig(dir, signal), {"--data.train=" + dir.Join("data/train")},
               /*deadline=*/absl::Minutes(4));
  // No worker started by hand: the autoscaler starts them all.
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/0).ok()) << job.Logs();

  // At min_workers, whatever the signal.
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return AliveWorkers(status) == 1 && status["autoscale"]["target_workers"] == 1 &&
           status["records_trained"].get<uint64_t>() > 0;
  })) << job.Logs();

  // Two GPUs free: two more workers.
  WriteFile(signal, "2 0\n");
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return AliveWorkers(status) == 3 && status["autoscale"]["target_workers"] == 3;
  })) << job.Logs();

  // One launched worker killed outright (a preemption): replaced.
  StatusOr<json> status = job.LiveStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  uint64_t victim = 0;
  for (const json& worker : (*status)["autoscale"]["fleet"]["workers"]) {
    const std::string handle = worker["handle"];
    if (worker["state"] == "running" && handle.rfind("pid ", 0) == 0) {
      ASSERT_TRUE(absl::SimpleAtoi(handle.substr(4), &victim)) << handle;
    }
  }
  ASSERT_GT(victim, 0u) << status->dump();
  ASSERT_EQ(::kill(static_cast<pid_t>(victim), SIGKILL), 0);
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["autoscale"]["fleet"]["restarts"] == 1 && AliveWorkers(status) == 3;
  })) << job.Logs();

  // Another job waits for 2 GPUs: two workers go (gracefully).
  WriteFile(signal, "0 2\n");
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["autoscale"]["target_workers"] == 1 &&
           status["autoscale"]["fleet"]["live"] == 1 && AliveWorkers(status) == 1;
  })) << job.Logs();

  StatusOr<int> exit = job.WaitForMaster(absl::Minutes(3));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0) << job.Logs();
  StatusOr<json> final_status = job.FinalStatus();
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  EXPECT_EQ((*final_status)["state"], "finished");
  const uint64_t lines = CountLines(dir.Join("data/train"));
  for (const json& entry : (*final_status)["ledger"]) {
    EXPECT_TRUE(entry["exactly_once"].get<bool>()) << entry.dump();
    EXPECT_EQ(entry["records_committed"].get<uint64_t>(), lines) << entry.dump();
  }

  // Every decision with the signal it was made from.
  const std::vector<json> events = ReadEvents(job.master_dir());
  const std::vector<json> ups = Named(events, "scale_up");
  ASSERT_EQ(ups.size(), 1u) << json(ups).dump();
  EXPECT_EQ(ups[0]["previous"], 1);
  EXPECT_EQ(ups[0]["target"], 3);
  EXPECT_EQ(ups[0]["free_gpus"], 2);
  EXPECT_NE(ups[0]["rule"].get<std::string>().find("autoscale.scale_up_free_gpus"),
            std::string::npos);
  const std::vector<json> downs = Named(events, "scale_down");
  ASSERT_EQ(downs.size(), 1u) << json(downs).dump();
  EXPECT_EQ(downs[0]["target"], 1);
  EXPECT_EQ(downs[0]["pending_gpus"], 2);
  EXPECT_EQ(Named(events, "worker_exited").size(), 1u);  // the one killed
  EXPECT_EQ(Named(events, "worker_replaced").size(), 1u);
  EXPECT_GE(Named(events, "worker_stopped").size(), 2u);  // the two given back
  // The stopped workers left gracefully; no worker was killed by the fleet.
  EXPECT_EQ(Named(events, "worker_stuck").size(), 0u);
}

TEST(AutoscaleTest, AFailingSourceHoldsTheSizeAndSaysSo) {
  TempDir dir;
  Status generated = GenerateData(dir.Join("data"), 4000, /*seed=*/5, /*files=*/1);
  ASSERT_TRUE(generated.ok()) << generated;
  const std::string signal = dir.Join("signal");
  WriteFile(signal, "lots\n");
  LocalJob job(dir.path(), WriteJobConfig(dir, signal),
               {"--data.train=" + dir.Join("data/train"), "--job.epochs=1",
                "--worker.max_records_per_s=1000"},
               /*deadline=*/absl::Minutes(2));
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/0).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return AliveWorkers(status) == 1 && status["autoscale"]["signal_error"].is_string();
  })) << job.Logs();
  StatusOr<json> status = job.LiveStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE((*status)["autoscale"]["signal_error"].get<std::string>().find("'lots'"),
            std::string::npos)
      << status->dump();
  EXPECT_EQ((*status)["autoscale"]["target_workers"], 1);
  StatusOr<int> exit = job.WaitForMaster(absl::Minutes(1));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0) << job.Logs();
  EXPECT_EQ(Named(ReadEvents(job.master_dir()), "autoscale_signal_failed").size(), 1u);
}

}  // namespace
}  // namespace eps::testing
