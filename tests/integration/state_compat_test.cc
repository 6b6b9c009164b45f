// The master takes up a --data-dir written by the master of an earlier
// format: tests/testdata/master_state_v1.tar.gz holds the state (RocksDB
// `state/`, events.jsonl, final_status.json, master.json) of a job the old
// master ran mid-epoch and stopped with SIGTERM, resumable, with only
// checkpoint 0 behind it. tests/testdata/README.md says how it was made
// (tests/testdata/make_master_state_v1.sh).
//
// The job's data paths are part of its config fingerprint, so its data must
// lie at the absolute path the old job read: /tmp/eps-fixture-v1/data,
// regenerated here by eps-datagen with the fixture's arguments and checked
// byte for byte.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "xxhash.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr absl::Duration kJobTimeout = absl::Seconds(120);

// The fixture's data: eps-datagen --rows 10000 --seed 7 --files 1 --out
// /tmp/eps-fixture-v1/data (eval rows by default: 1000).
constexpr char kFixtureRoot[] = "/tmp/eps-fixture-v1";
constexpr int kRows = 10000;
constexpr int kSeed = 7;

struct DataFile {
  const char* path;  // under DATA
  uint64_t bytes;
  uint64_t xxh64;  // XXH64, seed 0, of the whole file
};
constexpr DataFile kDataFiles[] = {
    {"train/part-00000.txt", 2467450, 0x28e909a717377330ULL},
    {"eval/part-00000.txt", 246601, 0xd56f4d3d5c0821dfULL},
};

// What the old master's final_status.json in the fixture says.
constexpr uint64_t kTrainedAtStop = 3280;

std::string DataDir() { return absl::StrCat(kFixtureRoot, "/data"); }

std::string FixturePath() {
  return absl::StrCat(EPS_SOURCE_DIR, "/tests/testdata/master_state_v1.tar.gz");
}

// The fixture job's config, as the old master ran it (make_master_state_v1.sh
// writes the same file).
std::string WriteJobConfig(const TempDir& dir) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path, absl::StrCat("[job]\n"
                               "name = compat\n"
                               "epochs = 1\n"
                               "progress_interval_s = 1\n"
                               "[data]\n"
                               "train = ",
                               DataDir(), "/train\n", "eval = ", DataDir(), "/eval\n",
                               "shard_records = 2000\n"
                               "[ps]\n"
                               "num_servers = 1\n"
                               "partitions = 16\n"
                               "master_wait_s = 60\n"
                               "[worker]\n"
                               "batch_size = 256\n"
                               "master_wait_s = 60\n"
                               "max_records_per_s = 2000\n"
                               "[master]\n"
                               "heartbeat_ms = 200\n"
                               "lease_ms = 2000\n"
                               "[checkpoint]\n"
                               "interval_s = 3600\n"));
  return path;
}

// Holds an exclusive flock(2) on a file while alive: tests running at once
// (ctest -j, two build trees) take turns at the shared data dir.
class FileLock {
 public:
  explicit FileLock(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666)) {
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool locked() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Whether `data` holds exactly the fixture's files; why not in `why`.
bool HoldsFixtureData(const std::string& data, std::string* why) {
  for (const char* sub : {"train", "eval"}) {
    // data.train and data.eval name directories: every file in them is data.
    std::error_code error;
    size_t files = 0;
    for (std::filesystem::directory_iterator it(data + "/" + sub, error), end; !error && it != end;
         it.increment(error)) {
      ++files;
    }
    if (error || files != 1) {
      *why = absl::StrCat(data, "/", sub, " does not hold exactly one file");
      return false;
    }
  }
  for (const DataFile& file : kDataFiles) {
    const std::string path = data + "/" + file.path;
    const std::string text = ReadFile(path);
    const uint64_t hash = XXH64(text.data(), text.size(), /*seed=*/0);
    if (text.size() != file.bytes || hash != file.xxh64) {
      *why = absl::StrFormat("%s: %d bytes, XXH64 %016x; the fixture's: %d bytes, XXH64 %016x",
                             path, text.size(), hash, file.bytes, file.xxh64);
      return false;
    }
  }
  return true;
}

// Makes DataDir() hold the fixture's data. Generates it with eps-datagen
// into a directory of our own and renames that into place, under a lock,
// so a run never sees another's half-written data; removes nothing another
// run may use.
void EnsureFixtureData() {
  std::error_code error;
  std::filesystem::create_directories(kFixtureRoot, error);
  ASSERT_FALSE(error) << kFixtureRoot << ": " << error.message();
  FileLock lock(absl::StrCat(kFixtureRoot, "/.lock"));
  ASSERT_TRUE(lock.locked()) << "cannot lock " << kFixtureRoot << "/.lock";

  std::string why;
  if (std::filesystem::exists(DataDir())) {
    ASSERT_TRUE(HoldsFixtureData(DataDir(), &why))
        << why << "\n"
        << DataDir() << " is not the fixture's data; remove it to regenerate it";
    return;
  }
  std::string scratch = absl::StrCat(kFixtureRoot, "/generating-XXXXXX");
  ASSERT_NE(::mkdtemp(scratch.data()), nullptr) << scratch;
  const std::string generated = scratch + "/data";
  const Status status = GenerateData(generated, kRows, kSeed, /*files=*/1);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(HoldsFixtureData(generated, &why))
      << why << "\neps-datagen no longer writes the bytes the fixture's job trained on: ship "
      << "the data in tests/testdata instead";
  std::filesystem::rename(generated, DataDir(), error);
  ASSERT_FALSE(error) << "rename " << generated << " to " << DataDir() << ": " << error.message();
  std::filesystem::remove_all(scratch, error);
}

// Unpacks the fixture into `master_dir`.
void UnpackFixture(const TempDir& dir, const std::string& master_dir) {
  std::filesystem::create_directories(master_dir);
  StatusOr<std::unique_ptr<Process>> tar =
      Process::Start({"/bin/tar", "xzf", FixturePath(), "-C", master_dir}, dir.Join("tar.log"));
  ASSERT_TRUE(tar.ok()) << tar.status();
  ASSERT_EQ((*tar)->Wait(absl::Seconds(30)), 0) << (*tar)->Log();
  ASSERT_TRUE(std::filesystem::exists(master_dir + "/state/CURRENT")) << master_dir;
}

std::vector<json> Events(const LocalJob& job, const std::string& name) {
  std::vector<json> out;
  for (json& event : ReadEvents(job.master_dir())) {
    if (event["event"] == name) out.push_back(std::move(event));
  }
  return out;
}

class StateCompatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EnsureFixtureData());
    config_ = WriteJobConfig(dir_);
    ASSERT_NO_FATAL_FAILURE(UnpackFixture(dir_, dir_.Join("master")));
    // The old master's word on its job: stopped mid-epoch, resumable.
    StatusOr<json> stopped = FinalStatusIn(dir_.Join("master"));
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    ASSERT_EQ((*stopped)["resumable"], true) << stopped->dump();
    ASSERT_EQ((*stopped)["records_trained"].get<uint64_t>(), kTrainedAtStop) << stopped->dump();
    // Its endpoints are the old run's. LocalJob passes extra flags (--resume)
    // only when it restarts a master, on the ports of the start before; a
    // master.json naming port 0 makes those ephemeral.
    WriteFile(dir_.Join("master/master.json"),
              R"({"rpc": "tcp://127.0.0.1:0", "http": "http://127.0.0.1:0", "pid": 0})");
  }

  static StatusOr<json> FinalStatusIn(const std::string& master_dir) {
    const std::string path = master_dir + "/final_status.json";
    json doc = json::parse(ReadFile(path), nullptr, false);
    if (doc.is_discarded()) return absl::DataLossError(path + " is missing or not JSON");
    return doc;
  }

  // Starts the master without --resume; it must refuse the stopped job.
  static void ExpectRefusalWithoutResume(LocalJob& job) {
    // StartMaster returns once it has read the master.json written in
    // SetUp; the master itself finds the stopped job and exits.
    ASSERT_TRUE(job.StartMaster().ok());
    EXPECT_EQ(job.master().Wait(absl::Seconds(20)), 2) << job.Logs();
    const std::string log = job.master().Log();
    EXPECT_NE(log.find("--resume"), std::string::npos) << log;
    std::cout << "without --resume: " << log;
  }

  TempDir dir_;
  std::string config_;
};

TEST_F(StateCompatTest, RefusesTheStoppedJobWithoutResume) {
  LocalJob job(dir_.path(), config_, {});
  ASSERT_NO_FATAL_FAILURE(ExpectRefusalWithoutResume(job));
  // Refusing leaves the job resumable.
  StatusOr<json> status = FinalStatusIn(job.master_dir());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ((*status)["resumable"], true) << status->dump();
}

TEST_F(StateCompatTest, ResumesTheStoppedJobFromCheckpointZero) {
  const absl::Time start = absl::Now();
  LocalJob job(dir_.path(), config_, {});
  // A refused start first: it must leave the stored state as it was.
  ASSERT_NO_FATAL_FAILURE(ExpectRefusalWithoutResume(job));
  ASSERT_TRUE(job.RestartMaster(absl::Seconds(20), {"--resume"}).ok()) << job.Logs();

  // The restored membership holds the old server's slot until its lease
  // runs out; then a server on a fresh --data-dir takes it (a fresh server
  // replaces only a lost one).
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    const json& servers = status["servers"];
    return servers.is_array() && servers.size() == 1 && servers[0]["state"] == "dead";
  })) << "the old job's server never counted as lost\n"
      << job.Logs();
  ASSERT_TRUE(job.StartServer().ok());
  ASSERT_TRUE(job.StartWorker().ok());

  StatusOr<int> exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << job.Logs();
  EXPECT_EQ(*exit, 0) << job.Logs();
  const std::vector<std::optional<int>> codes = job.WaitForOthers(absl::Seconds(30));
  for (size_t i = 0; i < codes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "process " << i << "\n" << job.Logs();
  }

  StatusOr<json> final_status = job.FinalStatus();
  ASSERT_TRUE(final_status.ok()) << final_status.status() << "\n" << job.Logs();
  const json& status = *final_status;
  EXPECT_EQ(status["state"], "finished") << status.dump();
  EXPECT_EQ(status["resumed"], true);
  EXPECT_EQ(status["records_trained"].get<uint64_t>(), static_cast<uint64_t>(kRows));
  ASSERT_EQ(status["ledger"].size(), 1u) << status["ledger"].dump();
  EXPECT_TRUE(status["ledger"][0]["exactly_once"].get<bool>()) << status["ledger"].dump();
  EXPECT_EQ(status["ledger"][0]["lines_committed"].get<uint64_t>(), static_cast<uint64_t>(kRows));
  // Back to checkpoint 0: everything the old job trained is undone.
  const json& recovery = status["recovery"]["last"];
  EXPECT_EQ(recovery["checkpoint"], 0) << recovery.dump();
  EXPECT_EQ(recovery["records_rolled_back"].get<uint64_t>(), kTrainedAtStop) << recovery.dump();

  const std::vector<json> resuming = Events(job, "job_resuming");
  ASSERT_EQ(resuming.size(), 1u);
  EXPECT_EQ(resuming[0]["checkpoint"], 0) << resuming[0].dump();
  EXPECT_EQ(resuming[0]["records_trained"], 0) << resuming[0].dump();
  // The old job's events are still there, before the new master's.
  EXPECT_EQ(Events(job, "job_started").size(), 1u);
  std::cout << "resumed and finished in " << absl::FormatDuration(absl::Now() - start)
            << ": eval AUC " << status["metrics"]["eval_auc"] << ", recovery " << recovery.dump()
            << "\n";
}

}  // namespace
}  // namespace eps::testing
