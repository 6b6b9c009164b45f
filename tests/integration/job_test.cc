// A real job end to end: eps-datagen data, one master, two servers, two
// workers, each a separate process on loopback; and the one-line errors a
// user gets for a bad config, missing data or an unreachable master.

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/single_process_trainer.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr absl::Duration kJobTimeout = absl::Seconds(180);

// The job file of these tests; data paths are given as overrides.
std::string WriteJobConfig(const TempDir& dir) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path,
            "[job]\n"
            "name = integration\n"
            "epochs = 1\n"
            "progress_interval_s = 2\n"
            "[data]\n"
            "shard_records = 10000\n"
            "[ps]\n"
            "num_servers = 2\n"
            "partitions = 32\n"
            "[worker]\n"
            "batch_size = 1024\n"
            "master_wait_s = 20\n"
            "[master]\n"
            "heartbeat_ms = 200\n"
            "lease_ms = 3000\n");
  return path;
}

// Generates `rows` training rows (and the default eval split) into DIR/data.
void Generate(const TempDir& dir, int rows) {
  Status generated = GenerateData(dir.Join("data"), rows, /*seed=*/7, /*files=*/3);
  ASSERT_TRUE(generated.ok()) << generated;
}

std::vector<std::string> DataFlags(const TempDir& dir) {
  return {"--data.train=" + dir.Join("data/train"), "--data.eval=" + dir.Join("data/eval")};
}

uint64_t CountTrainRecords(const TempDir& dir) { return CountLines(dir.Join("data/train")); }

// DataFlags for a small DLRM (MLPs of 64, Adagrad at 0.01 on the table,
// one compute thread, optimizer.mlp's default), then `more`.
std::vector<std::string> SmallDlrmFlags(const TempDir& dir, std::vector<std::string> more) {
  std::vector<std::string> flags = DataFlags(dir);
  flags.insert(flags.end(), {"--model.type=dlrm", "--model.bottom_mlp=64,16",
                             "--model.top_mlp=64,1", "--optimizer.learning_rate=0.01",
                             "--worker.compute_threads=1"});
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

TEST(Job, DistributedRunMatchesSingleProcessAccuracy) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 200000));

  LocalJob job(dir.path(), config, DataFlags(dir));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();

  // While the job runs, /status answers with the contract's fields.
  StatusOr<json> live = job.LiveStatus();
  ASSERT_TRUE(live.ok()) << live.status() << job.Logs();
  for (const char* key : {"state", "epoch", "shards", "records_trained", "workers", "servers",
                          "metrics"}) {
    EXPECT_TRUE(live->contains(key)) << key << " missing from " << live->dump();
  }

  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(master_exit.ok()) << master_exit.status() << job.Logs();
  EXPECT_EQ(*master_exit, 0) << job.Logs();
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(20))) {
    EXPECT_EQ(code, 0) << "a server or worker did not exit 0\n" << job.Logs();
  }

  StatusOr<json> final_status = job.FinalStatus();
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  const json& status = *final_status;
  EXPECT_EQ(status["state"], "finished");
  EXPECT_EQ(status["records_trained"].get<uint64_t>(), CountTrainRecords(dir));
  EXPECT_EQ(status["records_malformed"].get<uint64_t>(), 0u);
  EXPECT_EQ(status["shards"]["done"], status["shards"]["total"]);
  ASSERT_EQ(status["workers"].size(), 2u);
  uint64_t worker_records = 0;
  for (const json& worker : status["workers"]) {
    worker_records += worker["records"].get<uint64_t>();
    // Where its steps' time went, as its last heartbeat said.
    const json& step = worker["step_ms"];
    EXPECT_GT(step["steps"].get<uint64_t>(), 0u) << worker.dump();
    EXPECT_GT(step["compute"].get<double>(), 0.0) << worker.dump();
    for (const char* wait : {"batch_wait", "push_wait"}) {
      EXPECT_GE(step[wait].get<double>(), 0.0) << wait << ": " << worker.dump();
    }
    // LR has no dense tensors to wait for.
    EXPECT_TRUE(step["dense_wait"].is_null()) << worker.dump();
  }
  EXPECT_EQ(worker_records, CountTrainRecords(dir));
  ASSERT_EQ(status["servers"].size(), 2u);
  for (const json& server : status["servers"]) {
    EXPECT_GT(server["rows"].get<uint64_t>(), 0u) << server.dump();
    EXPECT_EQ(server["partitions"].get<uint64_t>(), 16u);
  }
  const double distributed_auc = status["metrics"]["eval_auc"].get<double>();
  const double distributed_logloss = status["metrics"]["eval_logloss"].get<double>();
  EXPECT_EQ(status["metrics"]["eval_records"].get<uint64_t>(), 20000u);

  // The same model through the same math code in one process.
  StatusOr<SingleProcessResult> reference = TrainSingleProcess(config, DataFlags(dir));
  ASSERT_TRUE(reference.ok()) << reference.status();

  std::cout << "eval AUC: distributed " << distributed_auc << ", single process "
            << reference->eval_auc << "; eval log loss: distributed " << distributed_logloss
            << ", single process " << reference->eval_logloss << "\n";
  EXPECT_GT(distributed_auc, 0.6);
  EXPECT_NEAR(distributed_auc, reference->eval_auc, 0.005);
  EXPECT_NEAR(distributed_logloss, reference->eval_logloss, 0.01);
}

// Trains `config` (+ overrides) through the real binaries (2 servers,
// `workers` workers; their data dirs under `run_dir`, made here) and
// through the same code in one process; returns both eval AUCs,
// {distributed, single process}.
std::pair<double, double> TrainBothWays(const std::string& run_dir, const std::string& config,
                                        const std::vector<std::string>& overrides, int workers) {
  std::filesystem::create_directories(run_dir);
  LocalJob job(run_dir, config, overrides);
  EXPECT_TRUE(job.Start(/*servers=*/2, workers).ok()) << job.Logs();
  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  EXPECT_TRUE(master_exit.ok() && *master_exit == 0) << job.Logs();
  StatusOr<json> status = job.FinalStatus();
  if (!status.ok()) {
    ADD_FAILURE() << status.status() << job.Logs();
    return {0, 0};
  }
  EXPECT_EQ((*status)["records_malformed"].get<uint64_t>(), 0u);
  EXPECT_TRUE((*status)["ledger"][0]["exactly_once"].get<bool>()) << status->dump();

  StatusOr<SingleProcessResult> reference = TrainSingleProcess(config, overrides);
  EXPECT_TRUE(reference.ok()) << reference.status();
  if (!reference.ok()) return {0, 0};
  return {(*status)["metrics"]["eval_auc"].get<double>(), reference->eval_auc};
}

// What distribution costs is measured with Adagrad on the MLPs too (as
// examples/wdl.ini and deepfm.ini train): under the default Adam at 0.001
// (optimizer.mlp) the embedding rows pulled a few batches ahead cost more
// on this small data (measured with one worker: dlrm 0.727-0.731 against
// 0.734-0.737 in one process; docs/accuracy.md).
constexpr char kAdagradMlps[] = "--optimizer.mlp=type=adagrad,learning_rate=0.01";

// The models with MLPs train through servers and a worker as in one
// process (small MLPs, to keep the test short): dense tensors in chunks on
// two servers, pulled at each step (pulled with the batch, a few steps
// ahead, DLRM's AUC fell from 0.75 to 0.57). One worker: two add the
// run-to-run variation of asynchronous training (bench/models_vs_reference.sh
// measures that against PyTorch).
TEST(Job, DlrmAndDeepFmTrainDistributedAsInOneProcess) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 100000));
  for (const std::string model : {"dlrm", "deepfm"}) {
    SCOPED_TRACE(model);
    std::vector<std::string> overrides = DataFlags(dir);
    overrides.insert(overrides.end(),
                     {"--model.type=" + model, "--model.bottom_mlp=64,16", "--model.top_mlp=64,1",
                      "--model.mlp=64,32,1", "--optimizer.learning_rate=0.01",
                      kAdagradMlps, "--worker.compute_threads=1"});
    const auto [distributed, single] =
        TrainBothWays(dir.Join(model), config, overrides, /*workers=*/1);
    std::cout << model << " eval AUC: distributed " << distributed << ", single process " << single
              << "\n";
    EXPECT_GT(single, 0.7);
    // Embedding rows pulled a few batches ahead differ a little from the
    // single process's (measured: within 0.003).
    EXPECT_NEAR(distributed, single, 0.01);
  }
}

// With its embedding rows pulled fresh at each step (worker.deterministic)
// one worker trains DLRM with Adam on its MLPs (optimizer.mlp's default)
// close to eps-train-local in one process, with no Adagrad pinned to match:
// measured 0.0018 apart (prefetched rows: 0.0041). Issue 51 asks 0.001: not
// reached (docs/accuracy.md).
TEST(Job, OneWorkerWithFreshRowsTrainsDlrmWithAdamAsInOneProcess) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 100000));
  const std::vector<std::string> overrides = SmallDlrmFlags(dir, {"--worker.deterministic=true"});
  const auto [distributed, single] = TrainBothWays(dir.Join("run"), config, overrides, 1);
  std::cout << "dlrm with Adam, fresh rows: eval AUC distributed " << distributed
            << ", single process " << single << "\n";
  EXPECT_GT(single, 0.7);
  EXPECT_NEAR(distributed, single, 0.003);
}

// optimizer.dense_global_batch end to end: the dense tensors step once per
// 1,024 records whichever workers sent them (reservations: none computes
// on a version that steps under it; stale pushes dropped), with
// worker.deterministic pulling each step's embedding rows fresh, and
// checkpoints every second applying the servers' partial sums: each record
// is trained exactly once, with one worker, with three, and with three
// through each fault mid-job: a worker killed (kill -9: its share is filled
// by the others, nobody waits for it past its reservation's bound), a worker
// frozen 10 s (SIGSTOP), a fourth worker added, a server killed and
// restarted on its data dir (the servers restore the last checkpoint and
// drop their partial sums), the master killed and restarted.
TEST(Job, AGlobalBatchTrainsOneModelThroughEveryFault) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 100000));
  const std::vector<std::string> overrides = SmallDlrmFlags(
      dir, {"--worker.batch_size=256", "--optimizer.dense_global_batch=1024",
            "--worker.deterministic=true", "--checkpoint.interval_s=1"});
  const uint64_t lines = CountTrainRecords(dir);
  enum class Fault { kNone, kKillWorker, kFreezeWorker, kAddWorker, kKillServer, kKillMaster };
  struct Run {
    const char* name;
    int workers;
    Fault fault;
    double auc = 0;
  };
  Run runs[] = {{"1 worker", 1, Fault::kNone},
                {"3 workers", 3, Fault::kNone},
                {"3 workers, one killed", 3, Fault::kKillWorker},
                {"3 workers, one frozen 10 s", 3, Fault::kFreezeWorker},
                {"3 workers, a fourth added", 3, Fault::kAddWorker},
                {"3 workers, ps[1] killed and restarted", 3, Fault::kKillServer},
                {"3 workers, the master killed and restarted", 3, Fault::kKillMaster}};
  for (size_t r = 0; r < std::size(runs); ++r) {
    Run& run = runs[r];
    SCOPED_TRACE(run.name);
    LocalJob job(dir.Join(absl::StrCat("run-", r)), config, overrides);
    ASSERT_TRUE(job.Start(/*servers=*/2, run.workers).ok()) << job.Logs();
    if (run.fault != Fault::kNone) {
      // Mid-job, with global steps taken and a batch filling.
      ASSERT_TRUE(job.WaitForStatus(
          [&](const json& status) {
            return status.contains("global_batch") && status["global_batch"]["steps"] > 4 &&
                   status["records_trained"].get<uint64_t>() > lines / 3;
          },
          kJobTimeout))
          << job.Logs();
    }
    switch (run.fault) {
      case Fault::kNone:
        break;
      case Fault::kKillWorker:
        job.workers()[1]->Signal(SIGKILL);
        break;
      case Fault::kFreezeWorker:
        job.workers()[1]->Signal(SIGSTOP);
        absl::SleepFor(absl::Seconds(10));
        job.workers()[1]->Signal(SIGCONT);
        break;
      case Fault::kAddWorker:
        ASSERT_TRUE(job.StartWorker().ok()) << job.Logs();
        break;
      case Fault::kKillServer:
        job.servers()[1]->Signal(SIGKILL);
        ASSERT_EQ(job.servers()[1]->Wait(absl::Seconds(10)), 128 + SIGKILL);
        ASSERT_TRUE(job.StartServer(job.server_dir(1)).ok()) << job.Logs();
        break;
      case Fault::kKillMaster:
        job.master().Signal(SIGKILL);
        ASSERT_TRUE(job.master().Wait(absl::Seconds(10)).has_value());
        ASSERT_TRUE(job.RestartMaster().ok()) << job.Logs();
        break;
    }
    json final_status;
    ASSERT_NO_FATAL_FAILURE(ExpectFinishedExactlyOnce(job, kJobTimeout, lines, &final_status));
    EXPECT_GT(final_status["checkpoints"]["written"].get<uint64_t>(), 0u);
    run.auc = final_status["metrics"]["eval_auc"].get<double>();
    // Seen from outside (/status global_batch): steps of at most a batch
    // and one push over it (a checkpoint's flush applies less).
    const json& global = final_status["global_batch"];
    ASSERT_TRUE(global.is_object()) << final_status.dump();
    EXPECT_EQ(global["records"], 1024);
    EXPECT_GT(global["steps"].get<uint64_t>(), 0u);
    EXPECT_GT(global["records_per_step"].get<double>(), 0.0);
    EXPECT_LT(global["records_per_step"].get<double>(), 1024.0 + 256.0);
    if (r == 0) {
      // Nothing of one worker's is stale, not even its first push after a
      // checkpoint applied the servers' partial sums (RenewDense).
      EXPECT_EQ(global["pushes_dropped"], 0) << global.dump();
    }
    // Reservations: no worker computes on a version that steps under it;
    // only a frozen worker's push, a restore's or a restart's is dropped
    // (without them three workers dropped 32-33%).
    EXPECT_LT(global["dropped_share"].get<double>(), 0.01) << run.name << ": " << global.dump();
    std::cout << run.name << ": eval AUC " << run.auc << ", global steps " << global["steps"]
              << ", " << global["records_per_step"] << " records per step, dropped share "
              << global["dropped_share"] << "\n";
  }
  // One model whatever the workers (measured in 6 runs: three workers
  // within 0.0033 of one; before reservations 0.0065 to 0.0112 below).
  // The faults: most runs within 0.0038 of the clean one, but two runs in
  // 25 ended 0.010 (the master restarted) and 0.017 (a worker added) below
  // it, with nothing dropped; not explained yet (docs/accuracy.md), so
  // their bound stays 0.02.
  EXPECT_GT(runs[0].auc, 0.7);
  EXPECT_NEAR(runs[1].auc, runs[0].auc, 0.006);
  for (size_t r = 2; r < std::size(runs); ++r) {
    EXPECT_NEAR(runs[r].auc, runs[1].auc, 0.02) << runs[r].name;
  }
}

// Multi-value fields (data.format = tsv, multicat columns) train with mean
// pooling: the Criteo fields in pairs, "a,b", 13 multi-value fields.
TEST(Job, MultiValueFieldsTrainDistributedAsInOneProcess) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 100000));
  for (const std::string split : {"train", "eval"}) {
    std::filesystem::create_directories(dir.Join("multi/" + split));
    std::ofstream out(dir.Join("multi/" + split + "/part-0"));
    for (const auto& entry : std::filesystem::directory_iterator(dir.Join("data/" + split))) {
      std::ifstream in(entry.path());
      std::string line;
      while (std::getline(in, line)) {
        std::vector<std::string> columns = absl::StrSplit(line, '\t');
        ASSERT_EQ(columns.size(), 40u) << line;
        std::vector<std::string> fields(columns.begin(), columns.begin() + 14);
        for (int c = 14; c < 40; c += 2) {
          fields.push_back(absl::StrCat(columns[c], columns[c].empty() ? "" : ",", columns[c + 1]));
        }
        out << absl::StrJoin(fields, "\t") << "\n";
      }
    }
  }
  const std::vector<std::string> overrides = {
      "--data.train=" + dir.Join("multi/train"), "--data.eval=" + dir.Join("multi/eval"),
      "--data.format=tsv", "--data.schema=label,dense*13,multicat*13", "--model.type=wdl",
      "--model.mlp=64,32,1", "--model.pooling=mean", "--optimizer.learning_rate=0.01",
      kAdagradMlps, "--worker.compute_threads=1"};
  const auto [distributed, single] =
      TrainBothWays(dir.Join("run"), config, overrides, /*workers=*/2);
  std::cout << "multi-value wdl eval AUC: distributed " << distributed << ", single process "
            << single << "\n";
  EXPECT_GT(single, 0.7);
  EXPECT_NEAR(distributed, single, 0.01);
}

// SIGTERM on a worker mid-epoch: it finishes and commits the batch in hand,
// hands its shard back and exits 0; the other worker finishes the job and
// every record is still counted exactly once.
TEST(Job, WorkerStoppedBySigtermHandsItsShardBackAndExitsZero) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 300000));
  LocalJob job(dir.path(), config, DataFlags(dir));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  // Stop the first worker once it trains (not merely once the job does: on
  // a loaded machine the other may start first, and a signal before the
  // worker has set up its handler would simply kill it).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool training = false;
  while (!training && absl::Now() < deadline) {
    StatusOr<json> live = job.LiveStatus();
    if (live.ok()) {
      for (const json& worker : (*live)["workers"]) {
        training |= worker["pid"].get<pid_t>() == job.workers()[0]->pid() &&
                    worker["records"].get<uint64_t>() > 0;
      }
    }
    if (!training) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(training) << job.Logs();
  job.workers()[0]->Signal(SIGTERM);
  EXPECT_EQ(job.workers()[0]->Wait(absl::Seconds(30)), 0) << job.Logs();

  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(master_exit.ok() && *master_exit == 0) << job.Logs();
  StatusOr<json> status = job.FinalStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["records_trained"].get<uint64_t>(), CountTrainRecords(dir));
  const std::string first_log = job.workers()[0]->Log();
  EXPECT_TRUE(absl::StrContains(first_log, "received Terminated")) << first_log;
  bool found = false;
  for (const json& worker : (*status)["workers"]) {
    if (worker["pid"].get<pid_t>() != job.workers()[0]->pid()) continue;
    found = true;
    EXPECT_EQ(worker["state"], "left") << status->dump();
  }
  EXPECT_TRUE(found) << status->dump();
}

// Runs `argv` to completion and returns (exit code, output).
std::pair<int, std::string> RunToExit(const TempDir& dir, std::vector<std::string> argv,
                                      absl::Duration timeout = absl::Seconds(30)) {
  static int counter = 0;
  auto process = Process::Start(argv, dir.Join(absl::StrCat("run-", counter++, ".log")));
  if (!process.ok()) return {-1, std::string(process.status().message())};
  std::optional<int> code = (*process)->Wait(timeout);
  return {code.value_or(-1), (*process)->Log()};
}

// The one line a failing binary prints on stderr (its last line).
std::string LastLine(const std::string& output) {
  std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

TEST(Job, UnknownOptionIsAOneLineErrorWithExitCode2) {
  TempDir dir;
  const std::string config = dir.Join("bad.ini");
  WriteFile(config, "[data]\ntrain = x\n[worker]\nbach_size = 5\n");
  for (const char* binary : {"eps-master", "eps-server", "eps-worker"}) {
    std::vector<std::string> argv = {BinaryPath(binary), "--config", config};
    if (std::string(binary) != "eps-master") {
      argv.insert(argv.end(), {"--master", "tcp://127.0.0.1:1"});
    }
    auto [code, output] = RunToExit(dir, argv);
    EXPECT_EQ(code, 2) << binary << ": " << output;
    EXPECT_TRUE(absl::StrContains(output, "worker.bach_size")) << output;
    EXPECT_TRUE(absl::StrContains(output, "bad.ini:4")) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}

TEST(Job, MalformedValueOnTheCommandLineNamesTheOption) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  auto [code, output] = RunToExit(dir, {BinaryPath("eps-master"), "--config", config,
                                        "--data.train=x", "--worker.batch_size=lots"});
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(absl::StrContains(output, "worker.batch_size")) << output;
}

TEST(Job, MissingDataFileIsAConfigError) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  const std::string missing = dir.Join("no-such-file.txt");
  auto [code, output] =
      RunToExit(dir, {BinaryPath("eps-master"), "--config", config, "--port", "0", "--http-port",
                      "0", "--data-dir", dir.Join("m"), "--data.train=" + missing,
                      JobKeysFlag(dir.Join("keys"))});
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(absl::StrContains(LastLine(output), "data.train")) << output;
  EXPECT_TRUE(absl::StrContains(LastLine(output), missing)) << output;
}

TEST(Job, MissingConfigFileIsNamed) {
  TempDir dir;
  auto [code, output] =
      RunToExit(dir, {BinaryPath("eps-worker"), "--config", dir.Join("nope.ini"), "--master",
                      "tcp://127.0.0.1:1"});
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(absl::StrContains(output, "nope.ini")) << output;
}

TEST(Job, UnreachableMasterFailsWithinTheWaitAndSaysSo) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  for (const char* binary : {"eps-worker", "eps-server"}) {
    const absl::Time start = absl::Now();
    // Port 1 on loopback: nobody listens there.
    auto [code, output] =
        RunToExit(dir, {BinaryPath(binary), "--config", config, "--master", "tcp://127.0.0.1:1",
                        "--data.train=x", "--worker.master_wait_s=2", "--ps.master_wait_s=2",
                        JobKeysFlag(dir.Join("keys"))});
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(code, 1) << binary << ": " << output;
    EXPECT_TRUE(absl::StrContains(LastLine(output), "tcp://127.0.0.1:1")) << output;
    EXPECT_TRUE(absl::StrContains(LastLine(output), "master")) << output;
    EXPECT_LT(took, absl::Seconds(15)) << binary;
  }
}

TEST(Job, MalformedLinesAreSkippedCountedAndReportedWithFileAndLine) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 20000));
  // Break three lines of one training file.
  const std::string path = dir.Join("data/train/part-00001.txt");
  std::vector<std::string> lines = absl::StrSplit(ReadFile(path), '\n');
  lines[9] = "this is not a record";
  lines[99] = "1\t2\t3";
  lines[199] = "x" + lines[199];
  WriteFile(path, absl::StrJoin(lines, "\n"));

  LocalJob job(dir.path(), config, DataFlags(dir));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/1).ok()) << job.Logs();
  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(master_exit.ok()) << job.Logs();
  EXPECT_EQ(*master_exit, 0) << job.Logs();
  StatusOr<json> status = job.FinalStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["records_malformed"].get<uint64_t>(), 3u);
  EXPECT_EQ((*status)["records_trained"].get<uint64_t>(), CountTrainRecords(dir) - 3);
  const std::string examples = (*status)["malformed_examples"].dump();
  EXPECT_TRUE(absl::StrContains(examples, "part-00001.txt:10:")) << examples;
  EXPECT_TRUE(absl::StrContains(examples, "part-00001.txt:100:")) << examples;
  EXPECT_TRUE(absl::StrContains(examples, "part-00001.txt:200:")) << examples;
  EXPECT_TRUE(absl::StrContains(job.workers()[0]->Log(), "part-00001.txt:10:"));
}

// The master keeps its job in --data-dir: started again there it refuses
// a job that is over, and one whose options changed, naming them.
TEST(Job, MasterRefusesTheDataDirOfAFinishedOrDifferentJob) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 20000));
  LocalJob job(dir.path(), config, DataFlags(dir));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/1).ok()) << job.Logs();
  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(master_exit.ok() && *master_exit == 0) << job.Logs();

  std::vector<std::string> argv = {BinaryPath("eps-master"), "--config", config, "--port", "0",
                                   "--http-port", "0", "--data-dir", job.master_dir(),
                                   "--security.keys_dir=" + job.keys_dir()};
  for (const std::string& flag : DataFlags(dir)) argv.push_back(flag);
  auto [code, output] = RunToExit(dir, argv);
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(absl::StrContains(LastLine(output), "is over")) << output;

  argv.push_back("--data.shard_records=5000");
  std::tie(code, output) = RunToExit(dir, argv);
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(absl::StrContains(LastLine(output), "data.shard_records")) << output;
}

// A server's --data-dir holds one job's parameters: a server of another
// job started on it refuses to start, naming both jobs.
TEST(Job, ServerRefusesTheDataDirOfAnotherJob) {
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 20000));
  std::string server_dir;
  {
    LocalJob first(dir.Join("first"), config, DataFlags(dir));
    std::filesystem::create_directories(dir.Join("first"));
    ASSERT_TRUE(first.Start(/*servers=*/2, /*workers=*/1).ok()) << first.Logs();
    StatusOr<int> master_exit = first.WaitForMaster(kJobTimeout);
    ASSERT_TRUE(master_exit.ok() && *master_exit == 0) << first.Logs();
    first.WaitForOthers(absl::Seconds(20));
    server_dir = dir.Join("first/server-0");
    ASSERT_TRUE(std::filesystem::exists(server_dir + "/JOB"));
  }
  std::filesystem::create_directories(dir.Join("second"));
  LocalJob second(dir.Join("second"), config, DataFlags(dir));
  ASSERT_TRUE(second.StartMaster().ok()) << second.Logs();
  std::vector<std::string> argv = {BinaryPath("eps-server"), "--config", config, "--master",
                                   second.endpoint(), "--data-dir", server_dir,
                                   "--security.keys_dir=" + second.keys_dir()};
  for (const std::string& flag : DataFlags(dir)) argv.push_back(flag);
  auto [code, output] = RunToExit(dir, argv);
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(absl::StrContains(LastLine(output), "holds the parameters of job")) << output;
  EXPECT_TRUE(absl::StrContains(LastLine(output), server_dir)) << output;
}

// eps's LR against a careful single-machine PyTorch LR (bench/reference_lr.py:
// sparse Adagrad on the ids, one epoch, batch 1024, best of several learning
// rates) on the same files: within 0.01 eval AUC.
TEST(Job, LrReachesTheAccuracyOfACarefulPyTorchLr) {
  TempDir dir;
  auto probe = RunToExit(dir, {"/usr/bin/python3", "-c", "import torch, numpy"});
  if (probe.first != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch/numpy (Debian's python3-torch, "
                    "python3-numpy): skipping the PyTorch cross-check";
  }
  const std::string config = WriteJobConfig(dir);
  ASSERT_NO_FATAL_FAILURE(Generate(dir, 100000));
  LocalJob job(dir.path(), config, DataFlags(dir));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(master_exit.ok() && *master_exit == 0) << job.Logs();
  StatusOr<json> status = job.FinalStatus();
  ASSERT_TRUE(status.ok());
  const double eps_auc = (*status)["metrics"]["eval_auc"].get<double>();

  auto [code, output] = RunToExit(
      dir,
      {"/usr/bin/python3", std::string(EPS_SOURCE_DIR) + "/bench/reference_lr.py", "--train",
       dir.Join("data/train"), "--eval", dir.Join("data/eval"), "--lr", "0.02,0.05,0.1"},
      absl::Seconds(120));
  ASSERT_EQ(code, 0) << output;
  const std::string last = LastLine(output);
  json best = json::parse(last, nullptr, false);
  ASSERT_FALSE(best.is_discarded()) << output;
  const double reference_auc = best["best"]["eval_auc"].get<double>();
  std::cout << "eval AUC: eps " << eps_auc << ", PyTorch reference " << reference_auc
            << " (lr " << best["best"]["lr"] << ")\n";
  EXPECT_GT(eps_auc, reference_auc - 0.01);
}

}  // namespace
}  // namespace eps::testing
