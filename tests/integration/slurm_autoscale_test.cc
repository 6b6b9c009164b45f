// The autoscaler on a real Slurm (SlurmCluster: munged, slurmctld and
// slurmd on loopback, 8 GPUs on mknod devices), with the slurm source and
// the slurm launcher: every worker is a batch job.
//
// Another user's job holds 7 GPUs and eps runs at min_workers (1); that
// job ends and eps grows to max_workers (4); one worker is killed outright
// (scancel --signal=KILL: a preemption) and is replaced; a new job of
// another user asks for 6 GPUs and pends, and eps gives back 2 workers so
// that it starts. The job finishes with every record committed exactly
// once and an eval AUC within 0.005 of a fixed-size run, and the events
// log shows each decision with its signal. The test prints the times from
// GPUs freed to a new worker training and from others' demand to a worker
// asked to leave and to their job running. And deploy/slurm/eps.sbatch,
// submitted as a user would, runs a job to its end there.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/slurm_cluster.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr int kRows = 40000;
constexpr int kGpus = 8;
// Jobs of "another user" run as nobody.
constexpr const char* kOtherUser = "nobody";

std::string WriteJobConfig(const TempDir& dir) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path, absl::StrCat("[job]\n"
                               "name = slurmtest\n"
                               "epochs = 12\n"
                               "[data]\n"
                               "shard_records = 2000\n"
                               "[worker]\n"
                               "batch_size = 256\n"
                               "max_records_per_s = 2000\n"
                               "compute_threads = 1\n"
                               "[master]\n"
                               "heartbeat_ms = 200\n"
                               "lease_ms = 2000\n"
                               "[checkpoint]\n"
                               "interval_s = 5\n"
                               "[autoscale]\n"
                               "source = slurm\n"
                               "launcher = slurm\n"
                               "partition = gpu\n"
                               "worker_binary = ", BinaryPath("eps-worker"), "\n"
                               "min_workers = 1\n"
                               "max_workers = 4\n"
                               "gpus_per_worker = 1\n"
                               "interval_s = 1\n"
                               "cooldown_s = 0\n"
                               "scale_down_stabilization_s = 2\n"
                               "restart_backoff_s = 1\n"));
  return path;
}

TEST(SlurmAutoscaleTest, FollowsTheQueuesFreeGpusWithEveryRecordOnce) {
  const std::string unavailable = SlurmCluster::Unavailable();
  if (!unavailable.empty()) GTEST_SKIP() << "no Slurm here: " << unavailable;

  TempDir data;
  Status generated = GenerateData(data.Join("data"), kRows, /*seed=*/23, /*files=*/2);
  ASSERT_TRUE(generated.ok()) << generated;
  const uint64_t lines = CountLines(data.Join("data/train"));
  const std::vector<std::string> data_flags = {"--data.train=" + data.Join("data/train"),
                                               "--data.eval=" + data.Join("data/eval")};

  // The fixed-size reference: two workers started by hand, no autoscaler.
  double reference_auc = 0;
  {
    TempDir dir;
    std::vector<std::string> flags = data_flags;
    flags.push_back("--autoscale.source=none");
    flags.push_back("--worker.max_records_per_s=0");
    LocalJob job(dir.path(), WriteJobConfig(dir), flags);
    ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/2).ok()) << job.Logs();
    json final_status;
    ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job, absl::Minutes(3), lines, &final_status));
    reference_auc = final_status["metrics"]["eval_auc"].get<double>();
  }

  TempDir slurm_dir;
  StatusOr<std::unique_ptr<SlurmCluster>> started = SlurmCluster::Start(slurm_dir.path(), kGpus);
  ASSERT_TRUE(started.ok()) << started.status();
  SlurmCluster& slurm = **started;

  // Another user's job holds 7 of the 8 GPUs.
  StatusOr<std::string> hog = slurm.Submit("hog", 7, "sleep 600", kOtherUser);
  ASSERT_TRUE(hog.ok()) << hog.status();
  ASSERT_EQ(slurm.AwaitJobState(*hog, {"RUNNING"}, absl::Seconds(30)), "RUNNING") << slurm.Logs();

  TempDir dir;
  LocalJob job(dir.path(), WriteJobConfig(dir), data_flags, /*deadline=*/absl::Minutes(6));
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/0).ok()) << job.Logs();

  // At min_workers: one batch job, training.
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return AliveWorkers(status, /*trained=*/true) == 1 &&
           status["autoscale"]["free_gpus"] == 0 && status["autoscale"]["target_workers"] == 1;
  })) << job.Logs() << slurm.Logs();

  // The other job ends: 7 GPUs free, eps grows to max_workers.
  ASSERT_TRUE(slurm.Command({"scancel", *hog}).ok());
  const absl::Time freed = absl::Now();
  absl::Time first_new_training = absl::InfiniteFuture();
  ASSERT_TRUE(job.WaitForStatus([&](const json& status) {
    const int trained = AliveWorkers(status, /*trained=*/true);
    if (trained >= 2 && first_new_training == absl::InfiniteFuture()) {
      first_new_training = absl::Now();
    }
    return trained == 4 && status["autoscale"]["target_workers"] == 4;
  })) << job.Logs() << slurm.Logs();
  const absl::Time all_training = absl::Now();

  // One worker killed outright (as a preemption would): replaced.
  StatusOr<json> status = job.LiveStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  std::string victim;
  for (const json& worker : (*status)["autoscale"]["fleet"]["workers"]) {
    const std::string handle = worker["handle"];
    if (worker["state"] == "running" && handle.rfind("slurm job ", 0) == 0) {
      victim = handle.substr(10);
    }
  }
  ASSERT_FALSE(victim.empty()) << status->dump();
  ASSERT_TRUE(slurm.Command({"scancel", "--full", "--signal=KILL", victim}).ok());
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["autoscale"]["fleet"]["restarts"] == 1 &&
           AliveWorkers(status, /*trained=*/true) == 4;
  })) << job.Logs() << slurm.Logs();

  // Another user's job asks for 6 GPUs; 4 are free: it pends, and eps
  // gives back 2 workers so that it starts.
  StatusOr<std::string> other = slurm.Submit("other", 6, "sleep 600", kOtherUser);
  ASSERT_TRUE(other.ok()) << other.status();
  const absl::Time demanded = absl::Now();
  absl::Time released = absl::InfiniteFuture();
  ASSERT_TRUE(job.WaitForStatus([&](const json& status) {
    if (status["autoscale"]["fleet"]["live"].get<int>() < 4 && released == absl::InfiniteFuture()) {
      released = absl::Now();
    }
    return status["autoscale"]["target_workers"] == 2 &&
           status["autoscale"]["fleet"]["live"] == 2 && AliveWorkers(status) == 2;
  })) << job.Logs() << slurm.Logs();
  ASSERT_EQ(slurm.AwaitJobState(*other, {"RUNNING"}, absl::Seconds(60)), "RUNNING")
      << job.Logs() << slurm.Logs();
  const absl::Time others_running = absl::Now();

  json final_status;
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job, absl::Minutes(4), lines, &final_status));
  const double auc = final_status["metrics"]["eval_auc"].get<double>();
  EXPECT_NEAR(auc, reference_auc, 0.005);

  // Every decision with the signal it was made from.
  const std::vector<json> events = ReadEvents(job.master_dir());
  const std::vector<json> ups = EventsNamed(events, "scale_up");
  ASSERT_EQ(ups.size(), 1u) << json(ups).dump();
  EXPECT_EQ(ups[0]["previous"], 1);
  EXPECT_EQ(ups[0]["target"], 4);
  EXPECT_GE(ups[0]["free_gpus"].get<int>(), 3);
  const std::vector<json> downs = EventsNamed(events, "scale_down");
  ASSERT_EQ(downs.size(), 1u) << json(downs).dump();
  EXPECT_EQ(downs[0]["target"], 2);
  EXPECT_EQ(downs[0]["pending_gpus"], 6);
  EXPECT_NE(downs[0]["rule"].get<std::string>().find("other jobs wait for 6 GPUs"),
            std::string::npos)
      << downs[0].dump();
  EXPECT_EQ(EventsNamed(events, "worker_replaced").size(), 1u);
  EXPECT_GE(EventsNamed(events, "worker_stopped").size(), 2u);  // the two given back

  std::cout << absl::StrFormat(
      "| measured on Slurm (loopback, 8 GPUs) | seconds |\n| --- | --- |\n"
      "| GPUs freed -> a new worker training | %.1f |\n"
      "| GPUs freed -> all 3 new workers training | %.1f |\n"
      "| others' demand -> a worker asked to leave | %.1f |\n"
      "| others' demand -> their job running | %.1f |\n"
      "eval AUC %.4f, fixed-size run %.4f; records lost 0 (every epoch exactly once)\n",
      absl::ToDoubleSeconds(first_new_training - freed),
      absl::ToDoubleSeconds(all_training - freed), absl::ToDoubleSeconds(released - demanded),
      absl::ToDoubleSeconds(others_running - demanded), auc, reference_auc);
  std::cout << slurm.Command({"squeue", "--states=all"}).value_or("") << std::endl;
}

}  // namespace
}  // namespace eps::testing

namespace eps::testing {
namespace {

// deploy/slurm/eps.sbatch as a user submits it: the master and two servers
// in one CPU job, the workers submitted by the master as GPU jobs; the
// batch job completes with the master's exit code 0 and the job finished
// with every record once.
TEST(SlurmDeployTest, TheSubmissionScriptRunsAJobToTheEnd) {
  const std::string unavailable = SlurmCluster::Unavailable();
  if (!unavailable.empty()) GTEST_SKIP() << "no Slurm here: " << unavailable;
  TempDir dir;
  // Jobs run as this user, but slurmstepd enters the directory first.
  ::chmod(dir.path().c_str(), 0755);
  Status generated = GenerateData(dir.Join("data"), 20000, /*seed=*/29, /*files=*/2);
  ASSERT_TRUE(generated.ok()) << generated;
  const uint64_t lines = CountLines(dir.Join("data/train"));
  const std::string config = dir.Join("job.ini");
  WriteFile(config, absl::StrCat("[job]\n"
                                 "name = sbatchtest\n"
                                 "epochs = 2\n"
                                 "[data]\n"
                                 "train = ", dir.Join("data/train"), "\n"
                                 "eval = ", dir.Join("data/eval"), "\n"
                                 "shard_records = 2000\n"
                                 "[worker]\n"
                                 "batch_size = 256\n"
                                 "compute_threads = 1\n"
                                 "[master]\n"
                                 "heartbeat_ms = 200\n"
                                 "lease_ms = 2000\n"
                                 "[autoscale]\n"
                                 "source = slurm\n"
                                 "launcher = slurm\n"
                                 "partition = gpu\n"
                                 "worker_binary = ", BinaryPath("eps-worker"), "\n"
                                 "min_workers = 2\n"
                                 "max_workers = 2\n"
                                 "interval_s = 1\n"));
  TempDir slurm_dir;
  StatusOr<std::unique_ptr<SlurmCluster>> started = SlurmCluster::Start(slurm_dir.path(), 4);
  ASSERT_TRUE(started.ok()) << started.status();
  SlurmCluster& slurm = **started;

  // The script's own resources are the cluster's; this one is small.
  StatusOr<std::string> submitted = slurm.Command(
      {"sbatch", "--parsable", "--ntasks=3", "--cpus-per-task=1", "--mem-per-cpu=200M",
       "--output=" + dir.Join("eps.out"), "--chdir=" + dir.path(),
       absl::StrCat("--export=ALL,EPS_CONFIG=", config, ",EPS_DIR=", dir.Join("run"),
                    ",EPS_BIN=", EPS_BIN_DIR, ",EPS_PORT=", FreeLoopbackPort(),
                    ",EPS_HTTP_PORT=", FreeLoopbackPort()),
       std::string(EPS_SOURCE_DIR) + "/deploy/slurm/eps.sbatch"});
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job_id(absl::StripAsciiWhitespace(*submitted));

  const std::string state = slurm.AwaitJobState(
      job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, absl::Minutes(4));
  const std::string output = ReadFile(dir.Join("eps.out"));
  ASSERT_EQ(state, "COMPLETED") << output << slurm.Logs();
  // The master's two worker jobs ran in partition gpu and completed (exit
  // 0 at the job's end; squeue keeps ended jobs for MinJobAge, 5 minutes).
  StatusOr<std::string> workers = slurm.Command({"squeue", "--noheader", "--states=all",
                                                 "--partition=gpu", "--Format=Name:100|,State"});
  ASSERT_TRUE(workers.ok()) << workers.status();
  int completed_workers = 0;
  for (absl::string_view line : absl::StrSplit(*workers, '\n', absl::SkipEmpty())) {
    completed_workers += absl::StartsWith(line, "eps-sbatchtest-worker-") &&
                         absl::StrContains(line, "|COMPLETED");
  }
  EXPECT_EQ(completed_workers, 2) << *workers;
  EXPECT_NE(output.find("eps.sbatch: master tcp://"), std::string::npos) << output;
  const std::string final_text = ReadFile(dir.Join("run/master/final_status.json"));
  const json final_status = json::parse(final_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(final_status.is_discarded()) << final_text << output;
  ASSERT_NO_FATAL_FAILURE(ExpectEveryEpochExactlyOnce(final_status, lines));
  EXPECT_EQ(final_status["servers"].size(), 2u) << "two tasks of the three ran servers";
  // Both workers were batch jobs the master submitted.
  const std::vector<json> launched =
      EventsNamed(ReadEvents(dir.Join("run/master")), "worker_launched");
  ASSERT_EQ(launched.size(), 2u) << json(launched).dump();
  for (const json& event : launched) {
    EXPECT_EQ(event["handle"].get<std::string>().rfind("slurm job ", 0), 0u) << event.dump();
  }
}

}  // namespace
}  // namespace eps::testing
