#include "datagen/datagen.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace eps::datagen {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the test temp dir, removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(absl::string_view name)
      : path_(fs::path(::testing::TempDir()) /
              absl::StrCat("datagen_test_", name, "_", ::getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string Sub(absl::string_view name) const { return (path_ / std::string(name)).string(); }

 private:
  fs::path path_;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string PartPath(const std::string& dir, absl::string_view split, int index) {
  return absl::StrFormat("%s/%s/part-%05d.txt", dir, split, index);
}

// The training parts of `dir`, concatenated in order.
std::string ReadTrain(const std::string& dir, int files) {
  std::string all;
  for (int i = 0; i < files; ++i) all += ReadFile(PartPath(dir, "train", i));
  return all;
}

int64_t CountLines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

DatagenOptions SmallOptions(const std::string& out_dir) {
  DatagenOptions options;
  options.rows = 20000;
  options.out_dir = out_dir;
  options.seed = 11;
  options.files = 3;
  options.threads = 2;
  options.chunk_rows = 3000;
  return options;
}

TEST(DatagenOptions, RejectsNonsenseNamingTheFlag) {
  DatagenOptions valid;
  valid.rows = 100;
  valid.out_dir = "/tmp/x";
  ASSERT_TRUE(valid.Validate().ok());

  const auto expect_invalid = [](const DatagenOptions& options, absl::string_view flag) {
    const Status status = options.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_TRUE(absl::StrContains(status.message(), flag)) << status;
  };
  DatagenOptions o = valid;
  o.rows = 0;
  expect_invalid(o, "--rows must be >= 1 (got 0)");
  o = valid;
  o.rows = -5;
  expect_invalid(o, "--rows");
  o = valid;
  o.out_dir = "";
  expect_invalid(o, "--out");
  o = valid;
  o.files = 0;
  expect_invalid(o, "--files");
  o = valid;
  o.files = 101;  // more files than rows
  expect_invalid(o, "--files");
  o = valid;
  o.eval_rows = 0;
  expect_invalid(o, "--eval-rows");
  o = valid;
  o.rows = 5'000'000'000;  // the default eval rows, 500M, are too many
  expect_invalid(o, "--eval-rows");
  o.eval_rows = 1000;
  EXPECT_TRUE(o.Validate().ok());
  o = valid;
  o.threads = -1;
  expect_invalid(o, "--threads");
  o = valid;
  o.chunk_rows = 0;
  expect_invalid(o, "chunk_rows");
  o = valid;
  o.model.positive_rate = 0;
  expect_invalid(o, "positive_rate");
}

TEST(DatagenOptions, Defaults) {
  DatagenOptions options;
  options.rows = 50000;
  EXPECT_EQ(options.EffectiveEvalRows(), 5000);
  options.rows = 10;
  EXPECT_EQ(options.EffectiveEvalRows(), 1000);
  options.eval_rows = 7;
  EXPECT_EQ(options.EffectiveEvalRows(), 7);
  EXPECT_GE(options.EffectiveThreads(), 1);
}

TEST(GenerateDataset, WritesLayoutAndTruth) {
  ScratchDir scratch("layout");
  const std::string out = scratch.Sub("data");  // created by GenerateDataset
  DatagenOptions options = SmallOptions(out);
  options.eval_rows = 20000;  // a stable optimal AUC
  const StatusOr<DatagenResult> result = GenerateDataset(options);
  ASSERT_TRUE(result.ok()) << result.status();

  // Training rows split evenly over the files, in order.
  for (int i = 0; i < 3; ++i) {
    const int64_t lines = CountLines(ReadFile(PartPath(out, "train", i)));
    EXPECT_TRUE(lines == 6666 || lines == 6667) << "part " << i << ": " << lines;
  }
  EXPECT_EQ(CountLines(ReadTrain(out, 3)), 20000);
  EXPECT_EQ(CountLines(ReadFile(PartPath(out, "eval", 0))), 20000);
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    EXPECT_FALSE(absl::EndsWith(entry.path().string(), ".tmp")) << entry.path();
  }

  const nlohmann::json truth = nlohmann::json::parse(ReadFile(fs::path(out) / "truth.json"));
  for (const char* key : {"optimal_auc", "optimal_logloss", "eval_rows", "train_rows",
                          "positive_rate_eval", "seed", "files", "generator"}) {
    EXPECT_TRUE(truth.contains(key)) << key;
  }
  EXPECT_EQ(truth["train_rows"], 20000);
  EXPECT_EQ(truth["eval_rows"], 20000);
  EXPECT_EQ(truth["seed"], 11);
  EXPECT_EQ(truth["files"], 3);
  const double auc = truth["optimal_auc"];
  EXPECT_GT(auc, 0.7);
  EXPECT_LT(auc, 0.95);
  const double logloss = truth["optimal_logloss"];
  EXPECT_GT(logloss, 0.2);
  EXPECT_LT(logloss, 0.6);  // below the ~0.56 of predicting the base rate
  const double rate = truth["positive_rate_eval"];
  EXPECT_GT(rate, 0.15);
  EXPECT_LT(rate, 0.35);
  EXPECT_TRUE(truth["generator"].contains("categorical"));

  EXPECT_DOUBLE_EQ(result->optimal_auc, auc);
  EXPECT_EQ(result->train_rows, 20000);
  EXPECT_GT(result->bytes_written, 0);
}

TEST(GenerateDataset, BytesDependOnlyOnRowsSeedAndEvalRows) {
  ScratchDir scratch("determinism");
  struct Layout {
    int threads;
    int64_t files;
    int64_t chunk_rows;
  };
  std::string train0, eval0;
  double auc0 = 0;
  const std::vector<Layout> splits = {{1, 1, 100000}, {4, 7, 333}, {3, 2, 1000}, {2, 500, 4}};
  for (size_t i = 0; i < splits.size(); ++i) {
    const std::string out = scratch.Sub(absl::StrCat("run", i));
    DatagenOptions options = SmallOptions(out);
    options.rows = 12345;
    options.eval_rows = 1500;
    options.threads = splits[i].threads;
    options.files = splits[i].files;
    options.chunk_rows = splits[i].chunk_rows;
    const StatusOr<DatagenResult> result = GenerateDataset(options);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::string train = ReadTrain(out, static_cast<int>(options.files));
    const std::string eval = ReadFile(PartPath(out, "eval", 0));
    if (i == 0) {
      train0 = train;
      eval0 = eval;
      auc0 = result->optimal_auc;
      EXPECT_EQ(CountLines(train0), 12345);
      continue;
    }
    EXPECT_TRUE(train == train0) << "training bytes differ for split " << i;
    EXPECT_TRUE(eval == eval0) << "eval bytes differ for split " << i;
    EXPECT_EQ(result->optimal_auc, auc0);
  }

  // Another seed gives other data.
  DatagenOptions options = SmallOptions(scratch.Sub("other_seed"));
  options.rows = 12345;
  options.eval_rows = 1500;
  options.files = 1;
  options.seed = 12;
  ASSERT_TRUE(GenerateDataset(options).ok());
  EXPECT_NE(ReadTrain(options.out_dir, 1), train0);
}

TEST(GenerateDataset, RemovesStalePartsOfAnEarlierRun) {
  ScratchDir scratch("stale");
  DatagenOptions options = SmallOptions(scratch.Sub("data"));
  options.rows = 1000;
  options.files = 5;
  ASSERT_TRUE(GenerateDataset(options).ok());
  EXPECT_TRUE(fs::exists(PartPath(options.out_dir, "train", 4)));
  const std::string unrelated = options.out_dir + "/train/notes.md";
  std::ofstream(unrelated) << "kept";

  options.files = 2;
  ASSERT_TRUE(GenerateDataset(options).ok());
  EXPECT_TRUE(fs::exists(PartPath(options.out_dir, "train", 1)));
  for (int i = 2; i < 5; ++i) EXPECT_FALSE(fs::exists(PartPath(options.out_dir, "train", i)));
  EXPECT_TRUE(fs::exists(unrelated));
  EXPECT_EQ(CountLines(ReadTrain(options.out_dir, 2)), 1000);
}

TEST(GenerateDataset, FailsWhenTheDirectoryCannotBeCreated) {
  ScratchDir scratch("blocked");
  const std::string blocker = scratch.Sub("a_file");
  std::ofstream(blocker) << "in the way";
  DatagenOptions options = SmallOptions(blocker + "/data");
  const StatusOr<DatagenResult> result = GenerateDataset(options);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(result.status().message(), blocker + "/data")) << result.status();

  // DIR itself a file.
  options.out_dir = blocker;
  const StatusOr<DatagenResult> again = GenerateDataset(options);
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::StrContains(again.status().message(), blocker)) << again.status();
}

TEST(GenerateDataset, InvalidOptionsAreInvalidArgument) {
  DatagenOptions options;
  options.out_dir = "/nonexistent/never/created";
  EXPECT_EQ(GenerateDataset(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(options.out_dir));
}

TEST(GenerateDataset, ReportsProgress) {
  ScratchDir scratch("progress");
  DatagenOptions options = SmallOptions(scratch.Sub("data"));
  options.rows = 5000;
  options.files = 1;
  options.eval_rows = 1000;
  options.chunk_rows = 1000;
  options.progress_interval_ms = 0;  // every chunk
  std::vector<DatagenProgress> reports;
  ASSERT_TRUE(
      GenerateDataset(options, [&](const DatagenProgress& p) { reports.push_back(p); }).ok());
  ASSERT_EQ(reports.size(), 6u);
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].rows_written, 1000 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(reports[i].rows_total, 6000);
  }
}

}  // namespace
}  // namespace eps::datagen
