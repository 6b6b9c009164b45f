// Elastic workers with the real binaries: workers killed, added, stopped by
// SIGTERM, frozen past their lease, and the master killed and restarted.
// Every test ends with an eval AUC within 0.005 of a fault-free run of the
// same job and a ledger that counts every record of every epoch once.
//
// Workers are throttled (worker.max_records_per_s) so that a small data set
// takes long enough for the faults to land mid-epoch.

#include <signal.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr int kRows = 120000;
constexpr int kEpochs = 2;
constexpr int kLeaseMs = 1000;
constexpr int kHeartbeatMs = 200;
constexpr absl::Duration kJobTimeout = absl::Seconds(240);

// One data set and one fault-free run, shared by every test.
class ElasticTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    shared_ = new TempDir();
    Status generated = GenerateData(shared_->Join("data"), kRows, /*seed=*/11, /*files=*/2);
    ASSERT_TRUE(generated.ok()) << generated;
    records_ = CountLines(shared_->Join("data/train"));
    TempDir dir;
    LocalJob job(dir.path(), WriteConfig(dir), DataFlags());
    ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
    ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job));
    reference_auc_ = (*job.FinalStatus())["metrics"]["eval_auc"].get<double>();
    std::cout << "fault-free run: eval AUC " << reference_auc_ << "\n";
  }
  static void TearDownTestSuite() {
    delete shared_;
    shared_ = nullptr;
  }

  static std::string WriteConfig(const TempDir& dir) {
    const std::string path = dir.Join("job.ini");
    WriteFile(path, absl::StrCat("[job]\n"
                                 "epochs = ", kEpochs, "\n"
                                 "progress_interval_s = 2\n"
                                 "[data]\n"
                                 "shard_records = 4000\n"
                                 "[ps]\n"
                                 "num_servers = 2\n"
                                 "partitions = 32\n"
                                 "[worker]\n"
                                 "batch_size = 512\n"
                                 "max_records_per_s = 15000\n"
                                 "master_wait_s = 30\n"
                                 "rpc_timeout_ms = 2000\n"
                                 "[master]\n"
                                 "heartbeat_ms = ", kHeartbeatMs, "\n"
                                 "lease_ms = ", kLeaseMs, "\n"));
    return path;
  }

  static std::vector<std::string> DataFlags() {
    return {"--data.train=" + shared_->Join("data/train"),
            "--data.eval=" + shared_->Join("data/eval")};
  }

  // Waits for the job's end and checks: the master exits 0, the final state
  // is finished, every epoch committed each line exactly once, and the
  // records trained are the records times the epochs.
  static void ExpectFinishedExactlyOnce(LocalJob& job) {
    StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
    ASSERT_TRUE(master_exit.ok()) << master_exit.status() << job.Logs();
    ASSERT_EQ(*master_exit, 0) << job.Logs();
    StatusOr<json> status = job.FinalStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ((*status)["state"], "finished");
    EXPECT_EQ((*status)["records_trained"].get<uint64_t>(), records_ * kEpochs);
    ASSERT_EQ((*status)["ledger"].size(), static_cast<size_t>(kEpochs)) << status->dump();
    for (const json& epoch : (*status)["ledger"]) {
      EXPECT_TRUE(epoch["exactly_once"].get<bool>()) << epoch.dump();
      EXPECT_EQ(epoch["lines_committed"].get<uint64_t>(), records_) << epoch.dump();
    }
  }

  void ExpectAucCloseToFaultFree(LocalJob& job) {
    StatusOr<json> status = job.FinalStatus();
    ASSERT_TRUE(status.ok());
    const double auc = (*status)["metrics"]["eval_auc"].get<double>();
    std::cout << "eval AUC " << auc << " against fault-free " << reference_auc_ << "\n";
    EXPECT_NEAR(auc, reference_auc_, 0.005);
  }

  static bool Training(const json& status) {
    return status["phase"] == "training" && status["records_trained"].get<uint64_t>() > 0;
  }

  static TempDir* shared_;
  static uint64_t records_;
  static double reference_auc_;
};

TempDir* ElasticTest::shared_ = nullptr;
uint64_t ElasticTest::records_ = 0;
double ElasticTest::reference_auc_ = 0;

// kill -9 a random worker every few seconds and start a new one shortly
// after, for the whole job.
TEST_F(ElasticTest, Churn) {
  TempDir dir;
  LocalJob job(dir.path(), WriteConfig(dir), DataFlags());
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/3).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus(Training)) << job.Logs();
  std::mt19937 rng(5);
  std::vector<absl::Time> kills;
  while (job.master().Running()) {
    std::vector<size_t> alive;
    for (size_t i = 0; i < job.workers().size(); ++i) {
      if (job.workers()[i]->Running()) alive.push_back(i);
    }
    if (!alive.empty()) {
      job.workers()[alive[rng() % alive.size()]]->Signal(SIGKILL);
      kills.push_back(absl::Now());
    }
    absl::SleepFor(absl::Milliseconds(1200));
    if (!job.master().Running()) break;
    ASSERT_TRUE(job.StartWorker().ok());
    absl::SleepFor(absl::Milliseconds(800));
  }
  ASSERT_GE(kills.size(), 3u) << "the job ended before the churn";
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job));
  ExpectAucCloseToFaultFree(job);

  // Time from a death to its shard going back to the queue, from the
  // events log: at most lease + one heartbeat.
  const json status = *job.FinalStatus();
  const double worst_ms = status["max_reassign_delay_ms"].get<double>();
  std::cout << "worker deaths: " << kills.size() << "; worst time from a worker's last "
            << "heartbeat to its shard being handed out again: " << worst_ms << " ms (lease "
            << kLeaseMs << " ms + heartbeat " << kHeartbeatMs << " ms = " << kLeaseMs + kHeartbeatMs
            << " ms)\n";
  EXPECT_GT(status["reassignments"].get<uint64_t>(), 0u);
  EXPECT_GT(worst_ms, kLeaseMs);
  EXPECT_LE(worst_ms, kLeaseMs + kHeartbeatMs);
  int dead = 0;
  for (const json& event : ReadEvents(job.master_dir())) dead += event["event"] == "worker_dead";
  EXPECT_GE(dead, static_cast<int>(kills.size()) - 1);
}

// Start with one worker, add three mid-epoch, then SIGTERM two of them.
TEST_F(ElasticTest, ScaleUpThenDown) {
  TempDir dir;
  LocalJob job(dir.path(), WriteConfig(dir), DataFlags());
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/1).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus(Training)) << job.Logs();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(job.StartWorker().ok());
  // A worker shows in /status as soon as it registers (the master adds it
  // while answering the registration), well within one heartbeat.
  ASSERT_TRUE(job.WaitForStatus([](const json& s) { return s["workers"].size() == 4; }))
      << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([](const json& s) {
    int busy = 0;
    for (const json& w : s["workers"]) busy += w["records"].get<uint64_t>() > 0;
    return busy == 4;
  })) << job.Logs();
  job.workers()[1]->Signal(SIGTERM);
  job.workers()[2]->Signal(SIGTERM);
  EXPECT_EQ(job.workers()[1]->Wait(absl::Seconds(30)), 0) << job.Logs();
  EXPECT_EQ(job.workers()[2]->Wait(absl::Seconds(30)), 0) << job.Logs();
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job));
  ExpectAucCloseToFaultFree(job);
  int left = 0;
  for (const json& event : ReadEvents(job.master_dir())) left += event["event"] == "worker_left";
  EXPECT_GE(left, 2);
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(20))) {
    EXPECT_EQ(code, 0) << job.Logs();
  }
}

// SIGSTOP a worker past its lease, SIGCONT it later: it is fenced, none of
// its stale pushes lands, it registers again and helps finish.
TEST_F(ElasticTest, FrozenWorkerIsFenced) {
  TempDir dir;
  LocalJob job(dir.path(), WriteConfig(dir), DataFlags());
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus(Training)) << job.Logs();
  Process& frozen = *job.workers()[0];
  frozen.Signal(SIGSTOP);
  ASSERT_TRUE(job.WaitForStatus([](const json& s) {
    for (const json& w : s["workers"]) {
      if (w["state"] == "dead") return true;
    }
    return false;
  })) << job.Logs();
  absl::SleepFor(absl::Milliseconds(2 * kLeaseMs));
  frozen.Signal(SIGCONT);
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job));
  ExpectAucCloseToFaultFree(job);
  EXPECT_EQ(frozen.Wait(absl::Seconds(30)), 0) << job.Logs();
  const std::string log = frozen.Log();
  EXPECT_TRUE(absl::StrContains(log, "fenced")) << log;
  bool fenced_event = false;
  for (const json& event : ReadEvents(job.master_dir())) {
    fenced_event = fenced_event || event["event"] == "worker_fenced";
  }
  EXPECT_TRUE(fenced_event);
}

// kill -9 the master mid-epoch and restart it on the same data dir and
// port: the servers and workers reconnect on their own and the job
// completes without losing a shard.
TEST_F(ElasticTest, MasterKilledAndRestarted) {
  TempDir dir;
  LocalJob job(dir.path(), WriteConfig(dir), DataFlags());
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([](const json& s) {
    return Training(s) && s["records_trained"].get<uint64_t>() > records_ / 3;
  })) << job.Logs();
  const uint64_t before = job.LiveStatus()->value("records_trained", uint64_t{0});
  job.master().Signal(SIGKILL);
  ASSERT_TRUE(job.master().Wait(absl::Seconds(10)).has_value());
  // Down for longer than a lease and an RPC attempt: workers fence
  // themselves and wait; servers keep their parameters.
  absl::SleepFor(absl::Seconds(3));
  ASSERT_TRUE(job.RestartMaster().ok()) << job.Logs();
  StatusOr<json> resumed = job.LiveStatus();
  ASSERT_TRUE(resumed.ok());
  EXPECT_TRUE((*resumed)["resumed"].get<bool>());
  EXPECT_GE((*resumed)["records_trained"].get<uint64_t>(), before);
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job));
  ExpectAucCloseToFaultFree(job);
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(20))) {
    EXPECT_EQ(code, 0) << job.Logs();
  }
}

}  // namespace
}  // namespace eps::testing
