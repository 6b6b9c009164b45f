// A job never hangs and never lies, with the real binaries: each ordinary
// fault (a data file truncated or deleted while the job trains, a server's
// disk filling up, a server cut off past its lease and coming back, a
// server that never comes back, a member started with other job options, a
// learning rate that makes the model diverge) ends within its bound in a
// finished job or in a resumable stop whose line names the cause.

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Seconds(180);
constexpr int kRows = 200000;

// The fault tests' job (WriteFaultJobConfig: 2 servers, 2 throttled
// workers, about 5 s of training, short leases, a checkpoint every second);
// `extra` is appended.
std::string WriteJobConfig(const TempDir& dir, const std::string& extra = "") {
  return WriteFaultJobConfig(dir.path(), "liveness", extra);
}

class LivenessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(GenerateData(dir_.Join("data"), kRows, /*seed=*/21, /*files=*/2).ok());
    train_ = dir_.Join("data/train");
    overrides_ = {"--data.train=" + train_, "--data.eval=" + dir_.Join("data/eval")};
    lines_ = CountLines(train_);
  }

  std::string TrainFile(int i) const { return absl::StrCat(train_, "/part-0000", i, ".txt"); }

  // Waits until `fraction` of the epoch is trained.
  static bool WaitForTrained(LocalJob& job, double fraction, uint64_t lines) {
    return job.WaitForStatus([&](const json& status) {
      return status["records_trained"].get<double>() >= fraction * static_cast<double>(lines);
    });
  }

  // The job ended in a resumable stop within `bound` of `since`, the
  // master exiting 1 and every other process 0 (but the servers numbered
  // in `killed`); its final status.
  static json ExpectResumableStop(LocalJob& job, absl::Time since, absl::Duration bound,
                                  const std::string& cause,
                                  const std::vector<size_t>& killed = {}) {
    StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
    EXPECT_TRUE(exit.ok() && *exit == 1) << (exit.ok() ? *exit : -1) << job.Logs();
    EXPECT_LT(absl::Now() - since, bound) << "the stop took longer than its bound";
    const std::vector<std::optional<int>> codes = job.WaitForOthers(absl::Seconds(60));
    for (size_t i = 0; i < codes.size(); ++i) {
      if (std::find(killed.begin(), killed.end(), i) != killed.end()) continue;
      EXPECT_EQ(codes[i], 0) << "process " << i << "\n" << job.Logs();
    }
    StatusOr<json> final_status = job.FinalStatus();
    EXPECT_TRUE(final_status.ok()) << final_status.status();
    if (!final_status.ok()) return json();
    EXPECT_EQ((*final_status)["state"], "failed") << final_status->dump();
    EXPECT_EQ((*final_status)["resumable"], true) << final_status->dump();
    EXPECT_THAT((*final_status)["error"].get<std::string>(), HasSubstr(cause));
    EXPECT_THAT(job.master().Log(), HasSubstr(cause)) << "one line in the master's log says why";
    return *final_status;
  }

  // The job finished with every line of the epoch counted once (committed
  // or skipped); its final status.
  json ExpectFinished(LocalJob& job) {
    StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
    EXPECT_TRUE(exit.ok() && *exit == 0) << job.Logs();
    StatusOr<json> final_status = job.FinalStatus();
    EXPECT_TRUE(final_status.ok()) << final_status.status() << job.Logs();
    if (!final_status.ok()) return json();
    const json& status = *final_status;
    EXPECT_EQ(status["state"], "finished") << status.dump();
    EXPECT_EQ(status["ledger"].size(), 1u);
    const json& epoch = status["ledger"][0];
    EXPECT_TRUE(epoch["exactly_once"].get<bool>()) << epoch.dump();
    EXPECT_EQ(epoch["lines_committed"].get<uint64_t>() + epoch["lines_skipped"].get<uint64_t>(),
              lines_)
        << epoch.dump();
    EXPECT_GT(status["metrics"]["eval_auc"].get<double>(), 0.6) << status["metrics"].dump();
    return status;
  }

  // Starts the master again with --resume, both servers on their data
  // dirs and two workers.
  static void Resume(LocalJob& job, const std::vector<std::string>& master_flags = {}) {
    std::vector<std::string> flags = {"--resume"};
    flags.insert(flags.end(), master_flags.begin(), master_flags.end());
    ASSERT_TRUE(job.RestartMaster(absl::Seconds(20), flags).ok()) << job.Logs();
    ASSERT_TRUE(job.StartServer(job.server_dir(0)).ok());
    ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());
    ASSERT_TRUE(job.StartWorker().ok());
    ASSERT_TRUE(job.StartWorker().ok());
  }

  TempDir dir_;
  std::string train_;
  std::vector<std::string> overrides_;
  uint64_t lines_ = 0;
};

// --- Bad data at run time ------------------------------------------------------------

TEST_F(LivenessTest, TruncatedFileStopsTheJobNamingItThenResumesSkippingIt) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.1, lines_)) << job.Logs();
  const std::string file = TrainFile(1);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  const absl::Time truncated = absl::Now();
  const json stopped = ExpectResumableStop(job, truncated, absl::Seconds(30),
                                           "data file " + file + " cannot be read (truncated");
  EXPECT_THAT(stopped["error"].get<std::string>(), HasSubstr("data.on_unreadable = skip"));

  // Resumed without the lost half: every line is committed or skipped once.
  ASSERT_NO_FATAL_FAILURE(Resume(job, {"--data.on_unreadable=skip"}));
  const json status = ExpectFinished(job);
  const json& epoch = status["ledger"][0];
  EXPECT_GT(epoch["lines_skipped"].get<uint64_t>(), 0u);
  ASSERT_GE(epoch["skipped"].size(), 1u);
  EXPECT_THAT(epoch["skipped"][0].get<std::string>(), HasSubstr(file + " lines "));
  EXPECT_THAT(epoch["skipped"][0].get<std::string>(), HasSubstr("truncated"));
}

TEST_F(LivenessTest, DeletedFileIsSkippedWithTheReasonAndTheJobFinishes) {
  const std::string config = WriteJobConfig(dir_, "[data]\non_unreadable = skip\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.1, lines_)) << job.Logs();
  std::filesystem::remove(TrainFile(0));
  const json status = ExpectFinished(job);
  const json& epoch = status["ledger"][0];
  EXPECT_GT(epoch["lines_skipped"].get<uint64_t>(), 0u) << epoch.dump();
  ASSERT_GE(epoch["skipped"].size(), 1u);
  EXPECT_THAT(epoch["skipped"][0].get<std::string>(), HasSubstr("the file is gone"));
  EXPECT_EQ(status["records_trained"].get<uint64_t>() + epoch["lines_skipped"].get<uint64_t>(),
            lines_)
      << "no malformed lines in generated data";
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(30))) {
    EXPECT_EQ(code, 0) << job.Logs();
  }
}

// --- Full disks ---------------------------------------------------------------------------

TEST_F(LivenessTest, FullDiskStopsTheJobNamingTheServerThenResumesOnceThereIsSpace) {
  SmallDisk disk(dir_.Join("small-disk"), 96);
  if (!disk.error().empty()) GTEST_SKIP() << "no full-disk test: " << disk.error();
  const std::string config = WriteJobConfig(dir_, "[ps]\ndurability = every_push\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.StartMaster().ok()) << job.Logs();
  const std::string server_dir = dir_.Join("small-disk/server-0");
  ASSERT_TRUE(job.StartServer(server_dir).ok());
  ASSERT_TRUE(job.StartServer().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  const std::string filler = disk.Fill(/*spare=*/256 << 10);
  const absl::Time full = absl::Now();
  const json stopped = ExpectResumableStop(job, full, absl::Seconds(30), "cannot write its store");
  const std::string error = stopped["error"].get<std::string>();
  const std::string slot = ReadFile(server_dir + "/SERVER");
  EXPECT_THAT(error, HasSubstr(absl::StrCat("ps[", slot.substr(0, slot.find('\n')), "] (")))
      << "it names the server";
  EXPECT_THAT(error, HasSubstr(server_dir)) << "it names the path";
  EXPECT_THAT(error, HasSubstr("No space left on device"));
  EXPECT_THAT(error, HasSubstr("run eps-master --resume"));

  // Space freed: the job goes on from its last checkpoint.
  std::filesystem::remove(filler);
  ASSERT_TRUE(job.RestartMaster(absl::Seconds(20), {"--resume"}).ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer(server_dir).ok());
  ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  const json status = ExpectFinished(job);
  EXPECT_EQ(status["ledger"][0]["lines_committed"].get<uint64_t>(), lines_);
}

// The master's own disk full: the job stops resumably, the master exits 1
// naming its dir (never "finished" with its files unwritten), and goes on
// once there is space.
TEST_F(LivenessTest, FullMasterDiskStopsTheJobResumablyNamingTheMastersDir) {
  SmallDisk disk(dir_.Join("master"), 64);
  if (!disk.error().empty()) GTEST_SKIP() << "no full-disk test: " << disk.error();
  // Three epochs: the disk fills while the job trains.
  std::vector<std::string> overrides = overrides_;
  overrides.push_back("--job.epochs=3");
  LocalJob job(dir_.path(), WriteJobConfig(dir_), overrides);
  ASSERT_EQ(job.master_dir(), dir_.Join("master"));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  const std::string filler = disk.Fill(/*spare=*/0);
  StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(exit.ok()) << job.Logs();
  EXPECT_EQ(*exit, 1) << job.Logs();
  const std::string log = job.master().Log();
  EXPECT_THAT(log, HasSubstr("the master cannot"));
  EXPECT_THAT(log, HasSubstr(job.master_dir()));
  EXPECT_THAT(log, HasSubstr("No space left on device"));
  EXPECT_THAT(log, HasSubstr("eps-master --resume"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("job finished")));
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(60))) {
    EXPECT_EQ(code, 0) << job.Logs();
  }

  std::filesystem::remove(filler);
  ASSERT_TRUE(job.RestartMaster(absl::Seconds(20), {"--resume"}).ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer(job.server_dir(0)).ok());
  ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok());
  ASSERT_TRUE(job.StartWorker().ok());
  ASSERT_TRUE(job.StartWorker().ok());
  StatusOr<int> resumed = job.WaitForMaster(kJobTimeout);
  EXPECT_TRUE(resumed.ok() && *resumed == 0) << job.Logs();
  StatusOr<json> status = job.FinalStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ((*status)["state"], "finished") << status->dump();
  ASSERT_EQ((*status)["ledger"].size(), 3u);
  for (const json& epoch : (*status)["ledger"]) {
    EXPECT_TRUE(epoch["exactly_once"].get<bool>()) << epoch.dump();
    EXPECT_EQ(epoch["lines_committed"].get<uint64_t>(), lines_) << epoch.dump();
  }
}

// --- Servers that do not come back, or come back on their own ---------------------------

TEST_F(LivenessTest, ServerCutOffPastItsLeaseTakesItsSlotBackWhenItReturns) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  // Frozen for 2.5 leases; nothing else is started.
  job.servers()[1]->Signal(SIGSTOP);
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["recovery"]["in_progress"].is_object();
  })) << job.Logs();
  absl::SleepFor(absl::Seconds(3));
  job.servers()[1]->Signal(SIGCONT);
  const json status = ExpectFinished(job);
  EXPECT_EQ(status["recovery"]["recoveries"], 1) << status["recovery"].dump();
  EXPECT_EQ(status["ledger"][0]["lines_skipped"], 0);
  bool rejoined = false;
  for (const json& event : ReadEvents(job.master_dir())) {
    rejoined |= event["event"] == "server_registered" && event["rejoined"] == true;
  }
  EXPECT_TRUE(rejoined) << "the same process took slot 1 back";
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(30))) {
    EXPECT_EQ(code, 0) << job.Logs();
  }
}

TEST_F(LivenessTest, ServerThatNeverComesBackStopsTheJobAtTheRecoveryTimeout) {
  const std::string config = WriteJobConfig(dir_, "[master]\nrecovery_timeout_s = 5\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  job.servers()[1]->Signal(SIGKILL);
  ASSERT_EQ(job.servers()[1]->Wait(absl::Seconds(10)), 128 + SIGKILL);
  const absl::Time killed = absl::Now();
  std::string slot = ReadFile(job.server_dir(1) + "/SERVER");
  slot = slot.substr(0, slot.find('\n'));
  // A lease (2 s) to notice, 5 s of waiting, a few ticks.
  ExpectResumableStop(
      job, killed, absl::Seconds(15),
      absl::StrCat("ps[", slot, "] did not come back within master.recovery_timeout_s (5s)"),
      /*killed=*/{1});
  // Once it is back, --resume finishes the job.
  ASSERT_NO_FATAL_FAILURE(Resume(job));
  const json status = ExpectFinished(job);
  EXPECT_EQ(status["ledger"][0]["lines_committed"].get<uint64_t>(), lines_);
}

// --- One validation for the whole job -----------------------------------------------------

TEST_F(LivenessTest, OptionsAServerWouldRefuseAreRefusedByTheMaster) {
  const std::string config = WriteJobConfig(dir_);
  LocalJob bad(dir_.Join("bad"), config, {overrides_[0], "--model.init_scale=inf"});
  std::filesystem::create_directories(dir_.Join("bad"));
  EXPECT_FALSE(bad.StartMaster().ok()) << "the master refuses to start";
  EXPECT_EQ(bad.master().Wait(absl::Seconds(10)), 2);
  EXPECT_THAT(bad.master().Log(), HasSubstr("model.init_scale"));
}

TEST_F(LivenessTest, MembersWithOtherJobOptionsAreRefusedAndTheJobDoesNotWaitForever) {
  const std::string config = WriteJobConfig(dir_, "[master]\nrecovery_timeout_s = 5\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.StartMaster().ok()) << job.Logs();
  ASSERT_TRUE(job.StartServer().ok());
  const absl::Time started = absl::Now();
  // A server and a worker started with another learning rate.
  auto start = [&](const std::string& binary, std::vector<std::string> args,
                   const std::string& log) {
    std::vector<std::string> argv = {BinaryPath(binary), "--master", job.endpoint(), "--config",
                                     config, "--security.keys_dir=" + job.keys_dir()};
    argv.insert(argv.end(), overrides_.begin(), overrides_.end());
    argv.insert(argv.end(), args.begin(), args.end());
    StatusOr<std::unique_ptr<Process>> process = Process::Start(argv, dir_.Join(log));
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? *std::move(process) : nullptr;
  };
  std::unique_ptr<Process> server =
      start("eps-server", {"--data-dir", dir_.Join("odd-server"), "--optimizer.learning_rate=0.5"},
            "odd-server.log");
  std::unique_ptr<Process> worker =
      start("eps-worker", {"--device", "cpu", "--master.lease_ms=3000"}, "odd-worker.log");
  ASSERT_NE(server, nullptr);
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ(server->Wait(absl::Seconds(30)), 2) << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("optimizer.learning_rate = 0.5 (the master has 0.05)"));
  EXPECT_EQ(worker->Wait(absl::Seconds(30)), 2) << worker->Log();
  EXPECT_THAT(worker->Log(), HasSubstr("master.lease_ms = 3000 (the master has 2000)"));
  // Nobody took the second slot: the master gives up at its bound.
  StatusOr<int> exit = job.WaitForMaster(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << job.Logs();
  EXPECT_EQ(*exit, 1);
  EXPECT_LT(absl::Now() - started, absl::Seconds(30));
  StatusOr<json> final_status = job.FinalStatus();
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  EXPECT_THAT((*final_status)["error"].get<std::string>(),
              HasSubstr("only 1 of 2 parameter server(s) registered within "
                        "master.recovery_timeout_s (5 s)"));
}

// --- A model that diverges -------------------------------------------------------------------

// One PUSH of a finite but enormous gradient (3e38) to the bias of LR's
// dense tensor (table 1, lr.dense, 14 floats in one chunk), sent to every
// server by a worker gone bad (it holds the job's worker key); the chunk's
// owner applies it, the others answer WRONG_OWNER. True when one
// acknowledged it.
bool PoisonTheBias(const json& status, const std::string& keys_dir) {
  std::unique_ptr<SocketFactory> factory = FactoryWithJobKeys(keys_dir, proto::ROLE_WORKER);
  RpcChannel channel(factory.get(), WorkerOfJob(keys_dir, 999'999));
  CallOptions call;
  call.attempt_timeout = absl::Seconds(5);
  call.max_attempts = 1;
  bool acknowledged = false;
  for (const json& server : status["servers"]) {
    Message request;
    request.header().set_method(proto::PUSH);
    request.header().mutable_push_request()->add_table_ids(1);
    request.AddArray(std::vector<uint64_t>{DenseChunkKey(/*table_id=*/1, /*chunk=*/0)});
    std::vector<float> gradient(14, 0.0f);
    gradient[13] = 3e38f;
    request.AddArray(gradient);
    StatusOr<Message> reply =
        channel.Call(server["endpoint"].get<std::string>(), std::move(request), call);
    acknowledged |= reply.ok();
  }
  return acknowledged;
}

TEST_F(LivenessTest, APoisonedPushAServerRefusesLeavesTheModelFinished) {
  // Adagrad (the default): the accumulator would become inf.
  const std::string config = WriteJobConfig(dir_);
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  ASSERT_TRUE(PoisonTheBias(*job.LiveStatus(), job.keys_dir()));
  const json status = ExpectFinished(job);
  uint64_t refused = 0;
  for (const json& server : status["servers"]) refused += server["updates_refused"].get<uint64_t>();
  EXPECT_EQ(refused, 1u) << status["servers"].dump();
  EXPECT_GT(status["metrics"]["eval_auc"].get<double>(), 0.7);
}

TEST_F(LivenessTest, APoisonedPushThatRuinsTheModelStopsTheJob) {
  // SGD (at a step it trains well with): the bias becomes -1.5e36, finite,
  // so the server applies it; the loss it causes stops the job before
  // anything is called finished.
  const std::string config =
      WriteJobConfig(dir_, "[optimizer]\ntype = sgd\nlearning_rate = 0.005\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  const StatusOr<json> healthy = job.LiveStatus();
  ASSERT_TRUE(healthy.ok() && (*healthy)["state"] == "running") << job.Logs();
  ASSERT_TRUE(PoisonTheBias(*healthy, job.keys_dir()));
  const json stopped =
      ExpectResumableStop(job, absl::Now(), absl::Seconds(30), "training diverged in epoch 1");
  EXPECT_TRUE(stopped["metrics"]["eval_auc"].is_null());
  EXPECT_GT(stopped["metrics"]["recent_loss"].get<double>(), 1e6)
      << "it was the poisoned bias: " << stopped["metrics"].dump();
}

TEST_F(LivenessTest, ClippedGradientsTakeAPoisonedPush) {
  // With optimizer.clip the gradient counts as 1: nothing to refuse.
  const std::string config = WriteJobConfig(dir_, "[optimizer]\nclip = 1\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(WaitForTrained(job, 0.2, lines_)) << job.Logs();
  ASSERT_TRUE(PoisonTheBias(*job.LiveStatus(), job.keys_dir()));
  const json status = ExpectFinished(job);
  for (const json& server : status["servers"]) EXPECT_EQ(server["updates_refused"], 0);
}

TEST_F(LivenessTest, DivergingLearningRateStopsTheJobAndResumesWithAnotherStep) {
  // Big enough that the loss explodes, finite enough that it stays a number.
  std::string config = WriteJobConfig(dir_, "[optimizer]\nlearning_rate = 1000\n");
  LocalJob job(dir_.path(), config, overrides_);
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  const absl::Time started = absl::Now();
  const json stopped =
      ExpectResumableStop(job, started, absl::Seconds(60), "training diverged in epoch 1");
  EXPECT_THAT(stopped["error"].get<std::string>(),
              HasSubstr("eps-master --resume --optimizer.learning_rate="));
  EXPECT_TRUE(stopped["metrics"]["eval_auc"].is_null()) << "never evaluated";
  // Every process of the job gets the smaller step, as the line says.
  config = WriteJobConfig(dir_, "[optimizer]\nlearning_rate = 0.05\n");
  ASSERT_NO_FATAL_FAILURE(Resume(job));
  ExpectFinished(job);
}

}  // namespace
}  // namespace eps::testing
