// Fault-tolerant jobs with the real binaries: a parameter server killed
// mid-epoch (restarted on its data dir, or replaced by one on a fresh dir),
// a whole job stopped by SIGTERM and resumed with --resume, and a
// checkpoint interrupted by a crash. Each job ends with every record of the
// epoch counted exactly once and an eval AUC within 0.005 of the same job
// run without faults.

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr absl::Duration kJobTimeout = absl::Seconds(240);
constexpr int kRows = 300000;

std::string WriteJobConfig(const TempDir& dir, const std::string& checkpoint_extra = "") {
  return WriteFaultJobConfig(dir.path(), "recovery", checkpoint_extra);
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(GenerateData(dir_.Join("data"), kRows, /*seed=*/11, /*files=*/2).ok());
    overrides_ = {"--data.train=" + dir_.Join("data/train"),
                  "--data.eval=" + dir_.Join("data/eval")};
    lines_ = CountLines(dir_.Join("data/train"));
  }

  // The eval AUC of the same job without faults.
  double FaultFreeAuc(const std::string& config) {
    const std::string reference = dir_.Join("reference");
    std::filesystem::create_directories(reference);
    LocalJob job(reference, config, overrides_);
    EXPECT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
    StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
    EXPECT_TRUE(exit.ok() && *exit == 0) << job.Logs();
    StatusOr<json> status = job.FinalStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? (*status)["metrics"]["eval_auc"].get<double>() : 0.0;
  }

  // Mid-epoch with a written checkpoint behind: two checkpoints written, a
  // quarter of the epoch trained, and some of it since the last checkpoint
  // (what a rollback undoes).
  bool WaitForMidEpoch(LocalJob& job) {
    return job.WaitForStatus([this](const json& status) {
      const json& last = status["checkpoints"]["last"];
      const uint64_t trained = status["records_trained"].get<uint64_t>();
      return status["checkpoints"]["written"].get<uint64_t>() >= 2 && trained > lines_ / 4 &&
             last.is_object() && trained > last["records_trained"].get<uint64_t>() + 5000;
    });
  }

  // The job finished with every record once and the AUC of a fault-free
  // run; returns the final status.
  json ExpectCompleteJob(LocalJob& job, const std::string& config) {
    StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
    EXPECT_TRUE(exit.ok() && *exit == 0) << job.Logs();
    StatusOr<json> final_status = job.FinalStatus();
    EXPECT_TRUE(final_status.ok()) << final_status.status() << job.Logs();
    if (!final_status.ok()) return json();
    const json& status = *final_status;
    EXPECT_EQ(status["state"], "finished") << status.dump();
    EXPECT_EQ(status["records_trained"].get<uint64_t>(), lines_);
    EXPECT_EQ(status["ledger"].size(), 1u) << status["ledger"].dump();
    EXPECT_TRUE(status["ledger"][0]["exactly_once"].get<bool>()) << status["ledger"].dump();
    EXPECT_EQ(status["ledger"][0]["lines_committed"].get<uint64_t>(), lines_);
    const double auc = status["metrics"]["eval_auc"].get<double>();
    const double reference = FaultFreeAuc(config);
    std::cout << "eval AUC " << auc << ", fault-free " << reference << ", recovery "
              << status["recovery"].dump() << "\n";
    EXPECT_NEAR(auc, reference, 0.005);
    return status;
  }

  // kill -9 server `index` and waits for it to be gone.
  static void KillServer(LocalJob& job, size_t index) {
    job.servers()[index]->Signal(SIGKILL);
    ASSERT_EQ(job.servers()[index]->Wait(absl::Seconds(10)), 128 + SIGKILL);
  }

  static std::vector<json> Events(const LocalJob& job, const std::string& name) {
    std::vector<json> out;
    for (json& event : ReadEvents(job.master_dir())) {
      if (event["event"] == name) out.push_back(std::move(event));
    }
    return out;
  }

  TempDir dir_;
  std::vector<std::string> overrides_;
  uint64_t lines_ = 0;
};

TEST_F(RecoveryTest, ServerKilledAndRestartedOnItsDataDir) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForMidEpoch(job)) << job.Logs();
  ASSERT_NO_FATAL_FAILURE(KillServer(job, 1));
  // Back at once, before its lease ran out.
  ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());

  const json status = ExpectCompleteJob(job, config);
  EXPECT_EQ(status["recovery"]["recoveries"], 1) << status["recovery"].dump();
  EXPECT_EQ(status["recovery"]["last"]["mode"], "rollback");
  EXPECT_GT(status["recovery"]["last"]["checkpoint"].get<uint64_t>(), 0u);
  EXPECT_GT(status["recovery"]["last"]["records_rolled_back"].get<uint64_t>(), 0u);
  EXPECT_GT(status["records_retrained"].get<uint64_t>(), 0u);
  ASSERT_EQ(Events(job, "server_dead").size(), 1u);
  EXPECT_EQ(Events(job, "recovered").size(), 1u);
  const std::vector<std::optional<int>> codes = job.WaitForOthers(absl::Seconds(30));
  for (size_t i = 0; i < codes.size(); ++i) {
    if (i == 1) continue;  // the killed server
    EXPECT_EQ(codes[i], 0) << "process " << i << "\n" << job.Logs();
  }
}

// checkpoint.on_server_failure = continue: only the lost server's
// partitions return to the checkpoint; no data progress is undone.
TEST_F(RecoveryTest, ContinueRestoresOnlyTheLostServer) {
  const std::string config = WriteJobConfig(dir_, "on_server_failure = continue\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForMidEpoch(job)) << job.Logs();
  ASSERT_NO_FATAL_FAILURE(KillServer(job, 0));
  ASSERT_TRUE(job.StartServer(job.server_dir(0)).ok());

  const json status = ExpectCompleteJob(job, config);
  const json& last = status["recovery"]["last"];
  EXPECT_EQ(last["mode"], "continue") << last.dump();
  EXPECT_EQ(last["records_rolled_back"], 0) << last.dump();
  EXPECT_EQ(last["servers_restored"].size(), 1u) << last.dump();
}

TEST_F(RecoveryTest, ServerKilledAndReplacedOnAFreshDataDir) {
  const std::string shared = dir_.Join("shared-checkpoints");
  const std::string config = WriteJobConfig(dir_, "dir = " + shared + "\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForMidEpoch(job)) << job.Logs();
  ASSERT_NO_FATAL_FAILURE(KillServer(job, 1));
  // Its lease runs out; the job waits for a server in its place.
  int64_t lost = -1;
  ASSERT_TRUE(job.WaitForStatus([&lost](const json& status) {
    const json& recovery = status["recovery"]["in_progress"];
    if (!recovery.is_object() || recovery["waiting_for_servers"].size() != 1) return false;
    lost = recovery["waiting_for_servers"][0].get<int64_t>();
    return true;
  })) << job.Logs();
  const StatusOr<size_t> fresh = job.StartServer();  // DIR/server-2, empty
  ASSERT_TRUE(fresh.ok());

  const json status = ExpectCompleteJob(job, config);
  EXPECT_EQ(status["recovery"]["recoveries"], 1) << status["recovery"].dump();
  // The checkpoints live in checkpoint.dir, one folder per server slot.
  for (const json& server : status["checkpoints"]["last"]["servers"]) {
    const std::string path = server["path"].get<std::string>();
    EXPECT_EQ(path.rfind(shared + "/ps-" + std::to_string(server["id"].get<int>()) + "/", 0), 0u)
        << path;
    EXPECT_TRUE(std::filesystem::exists(path + "/CURRENT")) << path;
  }
  const std::vector<json> registered = Events(job, "server_registered");
  ASSERT_EQ(registered.size(), 3u);
  EXPECT_EQ(registered[2]["server"], lost);
  EXPECT_EQ(registered[2]["fresh_data_dir"], true);
  EXPECT_EQ(registered[2]["replaces"], true);
}

TEST_F(RecoveryTest, StoppedJobResumesFromItsLastCheckpoint) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForMidEpoch(job)) << job.Logs();
  // SIGTERM on every process at once.
  job.master().Signal(SIGTERM);
  for (auto& server : job.servers()) server->Signal(SIGTERM);
  for (auto& worker : job.workers()) worker->Signal(SIGTERM);
  ASSERT_TRUE(job.master().Wait(absl::Seconds(30)).has_value()) << job.Logs();
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(30))) {
    ASSERT_TRUE(code.has_value()) << job.Logs();
  }
  StatusOr<json> stopped = job.FinalStatus();
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ((*stopped)["resumable"], true) << stopped->dump();
  const uint64_t trained_at_stop = (*stopped)["records_trained"].get<uint64_t>();
  EXPECT_LT(trained_at_stop, lines_);

  // Without --resume the master refuses, naming it.
  ASSERT_FALSE(job.RestartMaster(absl::Seconds(20)).ok());
  EXPECT_EQ(job.master().Wait(absl::Seconds(10)), 2);
  EXPECT_NE(job.master().Log().find("--resume"), std::string::npos) << job.master().Log();

  ASSERT_TRUE(job.RestartMaster(absl::Seconds(20), {"--resume"}).ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer(job.server_dir(0)).ok());
  ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  const json status = ExpectCompleteJob(job, config);
  EXPECT_EQ(status["resumed"], true);
  const std::vector<json> resumed = Events(job, "job_resuming");
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_LE(resumed[0]["records_trained"].get<uint64_t>(), trained_at_stop);
  EXPECT_EQ(Events(job, "recovered").size(), 1u);
}

// A machine restart: every process killed with -9 at once, nothing marked
// stopped; --resume continues from the last complete checkpoint.
TEST_F(RecoveryTest, KilledJobResumesFromItsLastCheckpoint) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForMidEpoch(job)) << job.Logs();
  job.master().Signal(SIGKILL);
  for (auto& server : job.servers()) server->Signal(SIGKILL);
  for (auto& worker : job.workers()) worker->Signal(SIGKILL);
  ASSERT_EQ(job.master().Wait(absl::Seconds(10)), 128 + SIGKILL);
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(10))) {
    ASSERT_EQ(code, 128 + SIGKILL);
  }

  ASSERT_TRUE(job.RestartMaster(absl::Seconds(20), {"--resume"}).ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer(job.server_dir(0)).ok());
  ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  const json status = ExpectCompleteJob(job, config);
  EXPECT_EQ(Events(job, "job_resuming").size(), 1u);
  const std::vector<json> recovered = Events(job, "recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_NE(recovered[0]["reason"].get<std::string>().find("not stopped"), std::string::npos)
      << recovered[0].dump();
}

TEST_F(RecoveryTest, CheckpointInterruptedByACrashIsIgnored) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.StartMaster().ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer().ok());
  // Server 1 dies in the middle of writing checkpoint 3.
  ::setenv("EPS_FAILPOINTS", "ps.crash_in_checkpoint=3", 1);
  const StatusOr<size_t> doomed = job.StartServer();
  ::unsetenv("EPS_FAILPOINTS");
  ASSERT_TRUE(doomed.ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_EQ(job.servers()[1]->Wait(absl::Seconds(60)), 128 + SIGKILL) << job.Logs();
  // Its part of checkpoint 3 is on disk, but no record makes it complete.
  EXPECT_TRUE(std::filesystem::exists(job.server_dir(1) + "/checkpoints/3"));
  ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());

  const json status = ExpectCompleteJob(job, config);
  const std::vector<json> failed = Events(job, "checkpoint_failed");
  ASSERT_GE(failed.size(), 1u);
  EXPECT_EQ(failed[0]["checkpoint"], 3) << failed[0].dump();
  const std::vector<json> recovered = Events(job, "recovered");
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0]["checkpoint"], 2) << recovered[0].dump();
  // Checkpoint ids are never reused: the next one written is past 3.
  for (const json& event : Events(job, "checkpoint")) {
    EXPECT_NE(event["checkpoint"], 3) << event.dump();
  }
}

}  // namespace
}  // namespace eps::testing
