// worker.batch_size = auto with optimizer.lr_scaling = sqrt, with the real
// binaries. The worker starts at min_batch_size (1,024) and its first
// measurement always tries twice that; the failpoint worker.oom_above
// stands for a device that holds at most 1,500 records, so that step runs
// out of memory: the worker trains it in two halves and goes back to 1,024
// for good. The model ends within 0.005 eval AUC of the same job at the
// fixed reference batch, every record committed once. The batch sizes
// chosen are printed. (Growth by measured records/s is
// tests/worker/batch_sizer_test.cc's, with scripted step times.)

#include <stdlib.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr int kRows = 200000;
constexpr int kEpochs = 3;
constexpr int kReferenceBatch = 1024;
constexpr int kMemoryLimit = 1500;  // records a step can hold

std::string WriteJobConfig(const TempDir& dir, const std::string& name,
                           const std::string& worker, const std::string& optimizer) {
  const std::string path = dir.Join(name + ".ini");
  WriteFile(path, absl::StrCat("[job]\nname = ", name, "\nepochs = ", kEpochs,
                               "\n[data]\nshard_records = 10000\n"
                               "[optimizer]\n",
                               optimizer, "[worker]\ncompute_threads = 1\n", worker,
                               "[master]\nheartbeat_ms = 200\nlease_ms = 2000\n"));
  return path;
}

// Runs the job in `dir` to its end with one server and one worker, on the
// data in `data`; its final status, with its events.
json RunJob(const TempDir& dir, const TempDir& data, const std::string& config, uint64_t lines) {
  LocalJob job(dir.path(), config,
               {"--data.train=" + data.Join("data/train"), "--data.eval=" + data.Join("data/eval")});
  EXPECT_TRUE(job.Start(/*servers=*/1, /*workers=*/1).ok()) << job.Logs();
  json status;
  ExpectFinishedExactlyOnce(job, absl::Minutes(3), lines, &status);
  status["events"] = ReadEvents(job.master_dir());
  return status;
}

TEST(BatchSizeTest, AutoWithSqrtScalingMatchesTheReferenceBatch) {
  TempDir data;
  Status generated = GenerateData(data.Join("data"), kRows, /*seed=*/7, /*files=*/2);
  ASSERT_TRUE(generated.ok()) << generated;
  const uint64_t lines = CountLines(data.Join("data/train"));

  TempDir fixed_dir;
  const json reference = RunJob(
      fixed_dir, data,
      WriteJobConfig(fixed_dir, "reference", absl::StrCat("batch_size = ", kReferenceBatch, "\n"),
                     ""),
      lines);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  TempDir auto_dir;
  ::setenv("EPS_FAILPOINTS", absl::StrCat("worker.oom_above=", kMemoryLimit).c_str(), 1);
  const json automatic = RunJob(
      auto_dir, data,
      WriteJobConfig(auto_dir, "auto",
                     absl::StrCat("batch_size = auto\nmin_batch_size = ", kReferenceBatch,
                                  "\nmax_batch_size = 4096\n"),
                     "lr_scaling = sqrt\nlr_warmup_batches = 20\n"),
      lines);
  ::unsetenv("EPS_FAILPOINTS");
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  // Every change is an event naming the sizes and why; the first
  // measurement always tries a doubling.
  const std::vector<json> changes = EventsNamed(automatic["events"], "batch_size_changed");
  ASSERT_FALSE(changes.empty()) << automatic.dump();
  std::string sizes = std::to_string(kReferenceBatch);
  bool ran_out = false;
  for (const json& change : changes) {
    const int64_t from = change["from"].get<int64_t>();
    const int64_t to = change["to"].get<int64_t>();
    const std::string reason = change["reason"].get<std::string>();
    absl::StrAppend(&sizes, " -> ", to, " (", reason, ")");
    EXPECT_GE(to, kReferenceBatch) << change.dump();
    EXPECT_LE(to, 4096) << change.dump();
    if (absl::StrContains(reason, "ran out of memory")) {
      ran_out = true;
      EXPECT_GT(from, kMemoryLimit) << change.dump();
      EXPECT_LE(to, kMemoryLimit) << change.dump();
    } else {
      EXPECT_TRUE(to == 2 * from || 2 * to == from) << change.dump();
    }
  }
  std::cout << "batch sizes chosen: " << sizes << "\n";
  EXPECT_TRUE(ran_out) << sizes;
  EXPECT_EQ(changes.front()["to"], 2 * kReferenceBatch) << sizes;
  // Past the memory limit, the worker came back below it and stayed.
  ASSERT_EQ(automatic["workers"].size(), 1u) << automatic["workers"].dump();
  const int64_t final_size = automatic["workers"][0]["batch_size"].get<int64_t>();
  EXPECT_LE(final_size, kMemoryLimit);
  EXPECT_GE(final_size, kReferenceBatch);
  if (changes.back()["to"].get<int64_t>() > kMemoryLimit) ADD_FAILURE() << sizes;
  std::cout << "final batch size " << final_size << (ran_out ? ", after a step ran out of memory" : "")
            << "\n";

  const double reference_auc = reference["metrics"]["eval_auc"].get<double>();
  const double auc = automatic["metrics"]["eval_auc"].get<double>();
  std::cout << "eval AUC: batch " << kReferenceBatch << " " << reference_auc << ", auto with sqrt "
            << auc << "\n";
  EXPECT_NEAR(auc, reference_auc, 0.005);
}

}  // namespace
}  // namespace eps::testing
