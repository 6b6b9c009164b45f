// Tests of the eps-datagen binary's command line: exit codes and messages.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class DatagenMain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("datagen_main_test_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs eps-datagen with `args` (shell words).
  RunResult Run(const std::string& args) {
    const fs::path out = dir_ / "stdout";
    const fs::path err = dir_ / "stderr";
    const std::string command =
        absl::StrCat(EPS_DATAGEN_BIN, " ", args, " >", out.string(), " 2>", err.string());
    const int status = std::system(command.c_str());
    RunResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = ReadFile(out);
    result.err = ReadFile(err);
    return result;
  }

  fs::path dir_;
};

TEST_F(DatagenMain, HelpPrintsUsage) {
  const RunResult r = Run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--rows")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--eval-rows")) << r.out;
}

TEST_F(DatagenMain, UsageErrorsExitTwoWithOneLine) {
  const std::string out = (dir_ / "data").string();
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {"--rows 0 --out " + out, "eps-datagen: --rows must be >= 1 (got 0)"},
      {"--out " + out, "--rows is required"},
      {"--rows 10", "--out is required"},
      {"--rows 10 --out " + out + " --bogus 3", "--bogus"},
      {"--rows ten --out " + out, "--rows"},
      {"--rows 10 --out " + out + " --files 0", "--files"},
      {"--rows 10 --out " + out + " --files 11", "--files"},
      {"--rows 10 --out " + out + " --eval-rows 0", "--eval-rows"},
      {"--rows 10 --out " + out + " --threads -2", "--threads"},
      {"--rows 10 --out " + out + " --seed -1", "--seed"},
      {"--rows 10 --out " + out + " extra", "extra"},
  };
  for (const auto& c : cases) {
    const RunResult r = Run(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "eps-datagen: ")) << c.args << "\n" << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.message)) << c.args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(DatagenMain, UnwritableDirectoryExitsOne) {
  const std::string blocker = (dir_ / "a_file").string();
  std::ofstream(blocker) << "in the way";
  const RunResult r = Run("--rows 10 --out " + blocker + "/data");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(absl::StrContains(lines.back(), blocker + "/data")) << r.err;
  EXPECT_TRUE(absl::StrContains(lines.back(), "Not a directory")) << r.err;
}

TEST_F(DatagenMain, WritesDataAndSummary) {
  const fs::path out = dir_ / "data";
  const RunResult r = Run("--rows 3000 --out " + out.string() + " --seed 4 --files 2 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "train" / "part-00000.txt"));
  EXPECT_TRUE(fs::exists(out / "train" / "part-00001.txt"));
  EXPECT_TRUE(fs::exists(out / "eval" / "part-00000.txt"));
  EXPECT_TRUE(fs::exists(out / "truth.json"));
  EXPECT_TRUE(absl::StrContains(r.out, "optimal AUC")) << r.out;
}

}  // namespace
