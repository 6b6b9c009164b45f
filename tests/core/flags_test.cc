// Tests core/flags.h: CommandLine over real INI files, and FindOptionLine.

#include "core/flags.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A fresh directory under the test temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = ::testing::TempDir() + "eps_flags_test_XXXXXX";
    CHECK(mkdtemp(pattern.data()) != nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // Writes `contents` to `name` in this directory and returns its path.
  std::string Write(const std::string& name, const std::string& contents) const {
    const std::string file = path_ + "/" + name;
    std::ofstream out(file);
    out << contents;
    CHECK(out.good()) << "writing " << file;
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs cl.Parse over `args` (the program name is added).
StatusOr<JobConfig> Parse(CommandLine& cl, const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"eps-test"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return cl.Parse(static_cast<int>(argv.size()), argv.data());
}

constexpr char kValidConfig[] =
    "# A job for the flags test.\n"    // 1
    "[job]\n"                          // 2
    "name = ctr   # inline comment\n"  // 3
    "epochs = 3\n"                     // 4
    "seed = 7\n"                       // 5
    "\n"                               // 6
    "[data]  # section comment\n"      // 7
    "train = /data/train/*.txt\n"      // 8
    "eval = /data/eval\n"              // 9
    "\n"                               // 10
    "  # indented comment\n"           // 11
    "[worker]\n"                       // 12
    "batch_size = 256\n"               // 13
    "rpc_timeout_ms = 500\n"           // 14
    "\n"                               // 15
    "[optimizer]\n"                    // 16
    "type = sgd\n"                     // 17
    "learning_rate = 0.25\n";          // 18

class CommandLineTest : public ::testing::Test {
 protected:
  ScratchDir dir_;
  CommandLine cl_{"eps-test", "--config JOB.ini"};
};

TEST_F(CommandLineTest, ValidFileLandsInJobConfig) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job.name, "ctr");
  EXPECT_EQ(config->job.epochs, 3);
  EXPECT_EQ(config->job.seed, 7);
  EXPECT_EQ(config->data.train, "/data/train/*.txt");
  EXPECT_EQ(config->data.eval, "/data/eval");
  EXPECT_EQ(config->worker.batch_size.value, 256);
  EXPECT_EQ(config->worker.rpc_timeout_ms, 500);
  EXPECT_EQ(config->optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(config->optimizer.learning_rate, 0.25);
  // Untouched options keep their defaults.
  EXPECT_EQ(config->data.format, "criteo");
  EXPECT_EQ(config->ps.partitions, 256);
  EXPECT_EQ(cl_.config_path(), path);
  EXPECT_FALSE(cl_.help_requested());
}

TEST_F(CommandLineTest, ConfigGivenWithEqualsSign) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config=" + path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job.epochs, 3);
}

TEST_F(CommandLineTest, CommandLineWinsOverFile) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(
      cl_, {"--worker.batch_size=64", "--config", path, "--job.epochs", "5", "--ps.partitions=17"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->worker.batch_size.value, 64);
  EXPECT_EQ(config->job.epochs, 5);
  EXPECT_EQ(config->ps.partitions, 17);
  // File values not overridden still apply.
  EXPECT_EQ(config->job.seed, 7);
}

TEST_F(CommandLineTest, CommandLineOverrideOfDuplicatedFileKeyIsNotAnError) {
  // The file is wrong, but the command line decides the value.
  const std::string path =
      dir_.Write("job.ini", "[data]\ntrain = x\n[job]\nepochs = 2\nepochs = 3\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path, "--job.epochs=9"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job.epochs, 9);
}

TEST_F(CommandLineTest, UnknownOptionInFileNamesOptionAndLine) {
  const std::string path =
      dir_.Write("job.ini", "[data]\ntrain = x\n[job]\nepochs = 2\nbogus_key = 1\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.bogus_key"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":5"));
}

TEST_F(CommandLineTest, UnknownSectionInFileNamesOptionAndLine) {
  const std::string path = dir_.Write("job.ini", "[data]\ntrain = x\n\n[jobb]\nepochs = 2\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("jobb.epochs"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":5"));
}

TEST_F(CommandLineTest, UnknownDottedKeyOutsideSectionNamesLine) {
  const std::string path = dir_.Write("job.ini", "data.train = x\njob.bogus = 1\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.bogus"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":2"));
}

TEST_F(CommandLineTest, DottedKeysOutsideSectionsAreAccepted) {
  const std::string path = dir_.Write("job.ini", "data.train = x\njob.epochs = 4\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job.epochs, 4);
  EXPECT_EQ(config->data.train, "x");
}

TEST_F(CommandLineTest, LineThatIsNotAnOptionNamesLine) {
  const std::string path = dir_.Write("job.ini", "[data]\ntrain = x\nthis is not an option\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":3"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("this is not an option"));
}

TEST_F(CommandLineTest, UnknownCommandLineOptionNamesIt) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path, "--job.bogus=1"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.bogus"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("command line"));
}

TEST_F(CommandLineTest, PrefixOfAnOptionIsUnknown) {
  // Boost would otherwise guess that --worker.batch means worker.batch_size.
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path, "--worker.batch=5"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("worker.batch"));
}

TEST_F(CommandLineTest, PositionalArgumentIsAnError) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("command line"));
}

TEST_F(CommandLineTest, MalformedValueInFileNamesOptionAndLine) {
  const std::string path =
      dir_.Write("job.ini", "[data]\ntrain = x\n\n[worker]\nbatch_size = abc\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("worker.batch_size"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":5"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("abc"));
}

// Boost would loop forever formatting the error about such a value or
// name (found by fuzz/job_config_fuzzer.cc).
TEST_F(CommandLineTest, BoostPlaceholderInAnArgumentOrLineIsRefused) {
  const std::string good = dir_.Write("good.ini", "[data]\ntrain = x\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", good, "--worker.batch_size=%value%"});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("argument 3 holds '%value%'"));
  config = Parse(cl_, {"--config", good, "--('%canonical_option%x"});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);

  const std::string bad =
      dir_.Write("bad.ini", "# %value% in a comment is fine\n[data]\ntrain = %option%\n");
  config = Parse(cl_, {"--config", bad});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(bad + ":3: '%option%'"));
}

TEST_F(CommandLineTest, BatchSizeAutoInFileAndOnTheCommandLine) {
  const std::string path = dir_.Write(
      "job.ini", "[data]\ntrain = x\n[worker]\nbatch_size = auto\nmax_batch_size = 2048\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->worker.batch_size.automatic);
  EXPECT_EQ(config->worker.max_batch_size, 2048);
  CommandLine fixed("eps-test", "--config JOB.ini");
  config = Parse(fixed, {"--config", path, "--worker.batch_size=300"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->worker.batch_size.automatic);
  EXPECT_EQ(config->worker.batch_size.value, 300);
  // The bound names the option and its line.
  const std::string bad = dir_.Write(
      "bad.ini", "[data]\ntrain = x\n[worker]\nbatch_size = auto\nmin_batch_size = 32768\n");
  CommandLine again("eps-test", "--config JOB.ini");
  config = Parse(again, {"--config", bad});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(bad + ":5"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("worker.min_batch_size"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("worker.max_batch_size"));
}

TEST_F(CommandLineTest, MalformedFloatAndOverflowInFileAreRejected) {
  for (const std::string value : {"0.5", "1e3", "99999999999999999999999", ""}) {
    SCOPED_TRACE("job.epochs = '" + value + "'");
    const std::string path =
        dir_.Write("job.ini", "[data]\ntrain = x\n[job]\nepochs = " + value + "\n");
    CommandLine cl("eps-test", "--config JOB.ini");
    StatusOr<JobConfig> config = Parse(cl, {"--config", path});
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.epochs"));
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":4"));
  }
}

TEST_F(CommandLineTest, MalformedValueOnCommandLineNamesOption) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path, "--worker.batch_size=abc"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("worker.batch_size"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("command line"));
}

TEST_F(CommandLineTest, DuplicateKeyInFileNamesOptionAndRepeatedLine) {
  const std::string path =
      dir_.Write("job.ini", "[data]\ntrain = x\n[job]\nepochs = 2\nseed = 1\nepochs = 3\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.epochs"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":6"));
}

TEST_F(CommandLineTest, DuplicateOptionOnCommandLineNamesIt) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path, "--job.epochs=2", "--job.epochs=3"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.epochs"));
}

TEST_F(CommandLineTest, ValidationFailureInFileNamesOptionAndLine) {
  const std::string path = dir_.Write("job.ini", "[data]\ntrain = x\n[job]\nepochs = 0\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.epochs"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ":4"));
  EXPECT_THAT(std::string(config.status().message()), Not(HasSubstr("command line")));
}

TEST_F(CommandLineTest, TooLargeValueInFileNamesOptionLineAndBound) {
  // 2^32 ms would be a 0 ms heartbeat as a uint32.
  const std::string path = dir_.Write(
      "job.ini", "[data]\ntrain = x\n[master]\nlease_ms = 8589934592\nheartbeat_ms = 4294967296\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr("master.heartbeat_ms"));
  EXPECT_THAT(message, HasSubstr(path + ":5"));
  EXPECT_THAT(message, HasSubstr("86400000"));
  // A double that is 0 as a float, in the [optimizer] section.
  CommandLine cl("eps-test", "--config JOB.ini");
  const std::string tiny =
      dir_.Write("tiny.ini", "[data]\ntrain = x\n[optimizer]\ntype = adam\nepsilon = 1e-50\n");
  config = Parse(cl, {"--config", tiny});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("optimizer.epsilon"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(tiny + ":5"));
}

TEST_F(CommandLineTest, OptimizerPerTableFromFileAndCommandLine) {
  // ';' and ',' are plain characters in values; '#' still starts a comment.
  const std::string path = dir_.Write(
      "job.ini",
      "[data]\ntrain = x\n[optimizer]\ntype = adam\nbeta1 = 0.8\nbeta2 = 0.99\n"
      "ftrl_beta = 0.5\nl1 = 0.25\n"
      "per_table = lr.dense:type=sgd,learning_rate=0.1;lr.w:type=ftrl,l1=1  # comment\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->optimizer.type, "adam");
  EXPECT_DOUBLE_EQ(config->optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(config->optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(config->optimizer.ftrl_beta, 0.5);
  EXPECT_DOUBLE_EQ(config->optimizer.l1, 0.25);
  EXPECT_EQ(config->optimizer.per_table, "lr.dense:type=sgd,learning_rate=0.1;lr.w:type=ftrl,l1=1");

  CommandLine cl("eps-test", "--config JOB.ini");
  config = Parse(cl, {"--config", path, "--optimizer.per_table=lr.w:type=sgd"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->optimizer.per_table, "lr.w:type=sgd");
}

TEST_F(CommandLineTest, BadPerTableEntryInFileNamesOptionLineAndPiece) {
  const std::string path = dir_.Write(
      "job.ini", "[data]\ntrain = x\n[optimizer]\nper_table = lr.w:type=sgd;lr.dense:lr=1\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr("optimizer.per_table"));
  EXPECT_THAT(message, HasSubstr(path + ":4"));
  EXPECT_THAT(message, HasSubstr("unknown key 'lr'"));
  EXPECT_THAT(message, HasSubstr("lr.dense:lr=1"));
}

TEST_F(CommandLineTest, ValidationFailureOnCommandLineSaysCommandLine) {
  const std::string path = dir_.Write("job.ini", kValidConfig);  // epochs = 3 there
  for (const std::vector<std::string>& flag :
       std::vector<std::vector<std::string>>{{"--job.epochs=0"}, {"--job.epochs", "0"}}) {
    CommandLine cl("eps-test", "--config JOB.ini");
    std::vector<std::string> args = {"--config", path};
    args.insert(args.end(), flag.begin(), flag.end());
    StatusOr<JobConfig> config = Parse(cl, args);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr("job.epochs"));
    EXPECT_THAT(std::string(config.status().message()), HasSubstr("command line"));
    EXPECT_THAT(std::string(config.status().message()), Not(HasSubstr(path)));
  }
}

TEST_F(CommandLineTest, ValidationFailureOfRequiredOptionNamesFile) {
  const std::string path = dir_.Write("job.ini", "[job]\nepochs = 2\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("data.train"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST_F(CommandLineTest, MissingConfigFlag) {
  StatusOr<JobConfig> config = Parse(cl_, {});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("--config"));
}

TEST_F(CommandLineTest, MissingConfigFileNamesPath) {
  const std::string path = dir_.path() + "/does_not_exist.ini";
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST_F(CommandLineTest, DirectoryAsConfigFileNamesPath) {
  StatusOr<JobConfig> config = Parse(cl_, {"--config", dir_.path()});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(dir_.path()));
  EXPECT_THAT(std::string(config.status().message()), Not(HasSubstr("data.train")));
}

TEST_F(CommandLineTest, UnreadableConfigFileNamesPath) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const std::string path = dir_.Write("job.ini", kValidConfig);
  std::filesystem::permissions(path, std::filesystem::perms::none);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST_F(CommandLineTest, RequiredRoleFlagMissing) {
  std::string master;
  cl_.AddString("master", &master, "master endpoint", /*required=*/true);
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("--master"));
}

TEST_F(CommandLineTest, RoleFlagsLandInTargets) {
  std::string master;
  std::string device = "auto";
  int64_t port = 7;
  int64_t http_port = 8;
  bool resume = false;
  bool other_switch = false;
  cl_.AddString("master", &master, "master endpoint", /*required=*/true);
  cl_.AddString("device", &device, "auto, cpu or cuda");
  cl_.AddInt("port", &port, "rpc port");
  cl_.AddInt("http-port", &http_port, "http port");
  cl_.AddSwitch("resume", &resume, "resume from the last checkpoint");
  cl_.AddSwitch("other", &other_switch, "unused switch");
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config =
      Parse(cl_, {"--master=tcp://127.0.0.1:5000", "--config", path, "--port", "9000", "--resume"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(master, "tcp://127.0.0.1:5000");
  EXPECT_EQ(device, "auto");  // default kept
  EXPECT_EQ(port, 9000);
  EXPECT_EQ(http_port, 8);  // default kept
  EXPECT_TRUE(resume);
  EXPECT_FALSE(other_switch);
}

TEST_F(CommandLineTest, RoleFlagsAreNotJobOptions) {
  // A role flag in the INI file is an unknown option.
  int64_t port = 0;
  cl_.AddInt("port", &port, "rpc port");
  const std::string path = dir_.Write("job.ini", "[data]\ntrain = x\nport = 5\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("port"));
}

TEST_F(CommandLineTest, HelpNeedsNoConfig) {
  std::string master;
  cl_.AddString("master", &master, "the master endpoint", /*required=*/true);
  StatusOr<JobConfig> config = Parse(cl_, {"--help"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(cl_.help_requested());
  const std::string usage = cl_.Usage();
  EXPECT_THAT(usage, HasSubstr("eps-test"));
  EXPECT_THAT(usage, HasSubstr("--master"));
  EXPECT_THAT(usage, HasSubstr("the master endpoint"));
  EXPECT_THAT(usage, HasSubstr("job.epochs"));
  EXPECT_THAT(usage, HasSubstr("worker.batch_size"));
}

TEST_F(CommandLineTest, ShortHelp) {
  StatusOr<JobConfig> config = Parse(cl_, {"-h"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(cl_.help_requested());
}

TEST_F(CommandLineTest, VerbosityFlagSetsLogVerbosity) {
  const int before = LogVerbosity();
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path, "--v=2"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(LogVerbosity(), 2);
  SetLogVerbosity(before);
}

TEST_F(CommandLineTest, CommentsAreIgnored) {
  const std::string path = dir_.Write("job.ini",
                                      "# full-line comment\n"
                                      "   # indented full-line comment\n"
                                      "[job]   # after a section\n"
                                      "epochs = 6 # after a value\n"
                                      "#epochs = 100\n"
                                      "[data]\n"
                                      "train = /a/b#c\n");
  StatusOr<JobConfig> config = Parse(cl_, {"--config", path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job.epochs, 6);
  // `#` starts a comment anywhere, values included.
  EXPECT_EQ(config->data.train, "/a/b");
}

TEST(FindOptionLine, FindsOptionsBySection) {
  ScratchDir dir;
  const std::string path = dir.Write("job.ini", kValidConfig);
  EXPECT_EQ(FindOptionLine(path, "job.name"), 3);
  EXPECT_EQ(FindOptionLine(path, "job.epochs"), 4);
  EXPECT_EQ(FindOptionLine(path, "data.train"), 8);
  EXPECT_EQ(FindOptionLine(path, "worker.batch_size"), 13);
  EXPECT_EQ(FindOptionLine(path, "optimizer.learning_rate"), 18);
  // Same key, other section.
  EXPECT_EQ(FindOptionLine(path, "optimizer.type"), 17);
  EXPECT_EQ(FindOptionLine(path, "model.type"), 0);
  EXPECT_EQ(FindOptionLine(path, "job.missing"), 0);
  EXPECT_EQ(FindOptionLine(path, "epochs"), 0);
}

TEST(FindOptionLine, MissingFileIsZero) {
  ScratchDir dir;
  EXPECT_EQ(FindOptionLine(dir.path() + "/nope.ini", "job.epochs"), 0);
}

TEST(FindOptionLine, CommentsAndOddSpacing) {
  ScratchDir dir;
  const std::string path = dir.Write("job.ini",
                                     "#[job]\n"
                                     "# epochs = 1\n"
                                     "  [job]  # the job\n"
                                     "\tepochs=2\n"
                                     "seed = 3 # seed = 4\n"
                                     "model.type = lr\n");
  EXPECT_EQ(FindOptionLine(path, "job.epochs"), 4);
  EXPECT_EQ(FindOptionLine(path, "job.seed"), 5);
  // Inside [job], "model.type" is job.model.type.
  EXPECT_EQ(FindOptionLine(path, "model.type"), 0);
  EXPECT_EQ(FindOptionLine(path, "job.model.type"), 6);
}

TEST(FindOptionLine, DottedKeysBeforeAnySection) {
  ScratchDir dir;
  const std::string path = dir.Write("job.ini", "job.epochs = 2\n[data]\ntrain = x\n");
  EXPECT_EQ(FindOptionLine(path, "job.epochs"), 1);
  EXPECT_EQ(FindOptionLine(path, "data.train"), 3);
}

TEST_F(CommandLineTest, ToIniReadsBackAsTheSameConfig) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  StatusOr<JobConfig> config =
      Parse(cl_, {"--config", path, "--optimizer.learning_rate=0.1", "--model.type=dlrm",
                  "--optimizer.per_table=lr.w:type=ftrl,l1=1", "--autoscale.source=command",
                  "--autoscale.command=echo 3 1"});
  ASSERT_TRUE(config.ok()) << config.status();
  StatusOr<std::string> ini = config->ToIni();
  ASSERT_TRUE(ini.ok()) << ini.status();
  const std::string written = dir_.Write("worker.ini", *ini);
  CommandLine again{"eps-test", "--config JOB.ini"};
  StatusOr<JobConfig> read = Parse(again, {"--config", written});
  ASSERT_TRUE(read.ok()) << read.status() << "\n" << *ini;
  EXPECT_EQ(read->DebugString(), config->DebugString());
  EXPECT_EQ(read->SharedOptions(), config->SharedOptions());
  EXPECT_EQ(read->optimizer.learning_rate, 0.1);  // exactly
  EXPECT_EQ(read->autoscale.command, "echo 3 1");
  EXPECT_EQ(read->data.eval, "/data/eval");
}

TEST_F(CommandLineTest, ToIniRefusesAValueAJobFileCannotHold) {
  const std::string path = dir_.Write("job.ini", kValidConfig);
  // From the command line a value may hold a '#'; in a file it would start
  // a comment and the worker would read less.
  StatusOr<JobConfig> config =
      Parse(cl_, {"--config", path, "--autoscale.source=command",
                  "--autoscale.command=cat free # and pending"});
  ASSERT_TRUE(config.ok()) << config.status();
  StatusOr<std::string> ini = config->ToIni();
  EXPECT_EQ(ini.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ini.status().message()), HasSubstr("autoscale.command"));
  EXPECT_THAT(std::string(ini.status().message()), HasSubstr("cannot be written to a job file"));
}

}  // namespace
}  // namespace eps
