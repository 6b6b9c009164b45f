// The autoscaler with real processes: the `command` source reads a file
// the test rewrites (free GPUs, others' pending GPUs) and the `local`
// launcher starts and stops eps-worker processes. The job starts at
// min_workers, grows to max_workers when GPUs are free, replaces a worker
// killed with -9, shrinks when another job waits for GPUs, and finishes
// with every record committed exactly once; every decision is in the
// events log with the signal's values.

#include <signal.h>
#include <stdlib.h>

#include <cstdint>
#include <regex>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
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

  // Every autoscale family the Grafana dashboard queries is exposed.
  {
    httplib::Client http(job.http());
    httplib::Result metrics = http.Get("/metrics");
    ASSERT_TRUE(metrics && metrics->status == 200);
    const std::string dashboard =
        ReadFile(std::string(EPS_SOURCE_DIR) + "/deploy/grafana/eps-dashboard.json");
    const std::regex family("eps_autoscale_[a-z_]+");
    int queried = 0;
    for (std::sregex_iterator it(dashboard.begin(), dashboard.end(), family), end; it != end;
         ++it, ++queried) {
      EXPECT_NE(metrics->body.find("# TYPE " + it->str() + " "), std::string::npos)
          << "the dashboard queries " << it->str() << ", which /metrics does not expose";
    }
    EXPECT_GE(queried, 5);
  }

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

  ASSERT_NO_FATAL_FAILURE(
      ExpectFinishedExactlyOnce(job, absl::Minutes(3), CountLines(dir.Join("data/train"))));

  // Every decision with the signal it was made from.
  const std::vector<json> events = ReadEvents(job.master_dir());
  const std::vector<json> ups = EventsNamed(events, "scale_up");
  ASSERT_EQ(ups.size(), 1u) << json(ups).dump();
  EXPECT_EQ(ups[0]["previous"], 1);
  EXPECT_EQ(ups[0]["target"], 3);
  EXPECT_EQ(ups[0]["free_gpus"], 2);
  EXPECT_NE(ups[0]["rule"].get<std::string>().find("autoscale.scale_up_free_gpus"),
            std::string::npos);
  const std::vector<json> downs = EventsNamed(events, "scale_down");
  ASSERT_EQ(downs.size(), 1u) << json(downs).dump();
  EXPECT_EQ(downs[0]["target"], 1);
  EXPECT_EQ(downs[0]["pending_gpus"], 2);
  EXPECT_EQ(EventsNamed(events, "worker_exited").size(), 1u);  // the one killed
  EXPECT_EQ(EventsNamed(events, "worker_replaced").size(), 1u);
  EXPECT_GE(EventsNamed(events, "worker_stopped").size(), 2u);  // the two given back
  // The stopped workers left gracefully; no worker was killed by the fleet.
  EXPECT_EQ(EventsNamed(events, "worker_stuck").size(), 0u);

  // plot_run.py draws the decisions against the worker count.
  const std::string png = dir.Join("run.png");
  const auto [plotted, plot_log] = PlotRun(job.master_dir(), png);
  ASSERT_EQ(plotted, 0) << plot_log;
  EXPECT_EQ(ReadFile(png).substr(0, 8), "\x89PNG\r\n\x1a\n") << plot_log;
}

TEST(AutoscaleTest, AStuckWorkerIsDetectedWithinTheProgressTimeoutAndReplaced) {
  constexpr int kProgressTimeoutS = 3;
  constexpr int kHeartbeatMs = 200;
  TempDir dir;
  Status generated = GenerateData(dir.Join("data"), 8000, /*seed=*/5, /*files=*/1);
  ASSERT_TRUE(generated.ok()) << generated;
  const std::string signal = dir.Join("signal");
  WriteFile(signal, "0 0\n");
  // Worker 0 (the first to register: the autoscaler's first launch) hangs
  // after its first batch; the processes inherit the failpoint, and only
  // the one the master numbers 0 takes it.
  ::setenv("EPS_FAILPOINTS", "worker.hang_trainer=0", 1);
  LocalJob job(dir.path(), WriteJobConfig(dir, signal),
               {"--data.train=" + dir.Join("data/train"), "--job.epochs=1",
                "--worker.max_records_per_s=4000",
                absl::StrCat("--master.progress_timeout_s=", kProgressTimeoutS)},
               /*deadline=*/absl::Minutes(2));
  const Status started = job.Start(/*servers=*/1, /*workers=*/0);
  ::unsetenv("EPS_FAILPOINTS");
  ASSERT_TRUE(started.ok()) << job.Logs();

  ASSERT_NO_FATAL_FAILURE(
      ExpectFinishedExactlyOnce(job, absl::Minutes(1), CountLines(dir.Join("data/train"))));

  const std::vector<json> events = ReadEvents(job.master_dir());
  const std::vector<json> fenced = EventsNamed(events, "worker_fenced_alive");
  ASSERT_EQ(fenced.size(), 1u) << json(events).dump();
  EXPECT_EQ(fenced[0]["worker"], 0);
  // "... made no progress for 3.1s (master.progress_timeout_s = 3 s) ...":
  // detected within the timeout plus one heartbeat.
  const std::string reason = fenced[0]["reason"];
  const size_t at = reason.find("no progress for ");
  ASSERT_NE(at, std::string::npos) << reason;
  double seconds = 0;
  ASSERT_TRUE(absl::SimpleAtod(
      reason.substr(at + 16, reason.find('s', at + 16) - (at + 16)), &seconds))
      << reason;
  EXPECT_GE(seconds, kProgressTimeoutS) << reason;
  EXPECT_LE(seconds, kProgressTimeoutS + kHeartbeatMs / 1000.0) << reason;
  std::cout << "stuck worker fenced after " << seconds << " s without progress (timeout "
            << kProgressTimeoutS << " s, heartbeat " << kHeartbeatMs << " ms)\n";
  // The fleet killed it and launched another, which finished the job.
  const std::vector<json> stuck = EventsNamed(events, "worker_stuck");
  ASSERT_EQ(stuck.size(), 1u) << json(events).dump();
  EXPECT_EQ(EventsNamed(events, "worker_replaced").size(), 1u);
  const std::vector<json> launched = EventsNamed(events, "worker_launched");
  EXPECT_EQ(launched.size(), 2u) << json(launched).dump();
  std::cout << "replacement launched "
            << launched.back()["time"].get<double>() - fenced[0]["time"].get<double>()
            << " s after the fence\n";
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
  EXPECT_EQ(EventsNamed(ReadEvents(job.master_dir()), "autoscale_signal_failed").size(), 1u);
}

}  // namespace
}  // namespace eps::testing
