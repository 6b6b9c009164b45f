// Tests of ps/storage.h's checkpoints: where they go, which are kept, their
// restore (at open and while open, of a missing or broken one), and the
// stored server id.
//
// Updates are SGD with learning rate 0.5 on zero-initialised rows and
// gradients that are powers of two, so every expected weight is exact.

#include "ps/storage.h"

#include <stdlib.h>

#include <cfloat>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/logging.h"
#include "core/npy.h"
#include "nlohmann/json.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ps/storage_testing.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::TempDir;
using ::testing::HasSubstr;


std::set<std::string> Checkpoints(const std::string& data_dir, std::string root = "") {
  if (root.empty()) root = data_dir + "/checkpoints";
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

TEST(ServerStorage, CheckpointsKeepTheNewest) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  options.keep_checkpoints = 2;
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  for (uint64_t id = 1; id <= 4; ++id) {
    PushAll(*storage, 0, Keys(id, 10), 1.0f);
    StatusOr<CheckpointInfo> info = storage->Checkpoint(id * 10);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->path, temp.path() + "/checkpoints/" + std::to_string(id * 10));
    EXPECT_TRUE(std::filesystem::exists(info->path + "/CURRENT")) << info->path;
    EXPECT_GT(info->bytes, 0u);
  }
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"30", "40"}));
  EXPECT_EQ(storage->Checkpoint(40).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"30", "40"}));
}

TEST(ServerStorage, RestoreCheckpointBringsBackItsState) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  options.memory_budget_mb = 1;
  options.flush_interval = absl::Hours(1);
  const std::vector<uint64_t> keys = Keys(100, 30000);
  const std::vector<uint64_t> later_keys = Keys(200000000, 1000);
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    PushAll(*storage, 0, keys, 2.0f);  // -1
    ASSERT_TRUE(storage->Checkpoint(7).ok());
    PushAll(*storage, 0, keys, 4.0f);  // -3
    PushAll(*storage, 1, later_keys, 1.0f);
    ASSERT_TRUE(storage->Checkpoint(8).ok());
    PushAll(*storage, 0, keys, 8.0f);  // -7, only written by the destructor
  }
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -7.0f, "latest");
  }
  options.restore_checkpoint = "7";
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -1.0f, "checkpoint 7");
    ExpectAll(*storage, 1, later_keys, 0.0f, "checkpoint 7");
    PushAll(*storage, 0, keys, 2.0f);  // -2, in the restored database
  }
  options.restore_checkpoint.clear();
  {
    // The restored database is the database now; checkpoints are intact.
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -2.0f, "after restoring 7");
  }
  options.restore_checkpoint = "8";
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -3.0f, "checkpoint 8");
    ExpectAll(*storage, 1, later_keys, -0.5f, "checkpoint 8");
  }
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"7", "8"}));
}

TEST(ServerStorage, MissingCheckpointIsNotFound) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ASSERT_TRUE(storage->Checkpoint(1).ok());
  }
  options.restore_checkpoint = "2";
  StatusOr<std::unique_ptr<ServerStorage>> storage = ServerStorage::Open(options);
  ASSERT_FALSE(storage.ok());
  EXPECT_EQ(storage.status().code(), absl::StatusCode::kNotFound) << storage.status();
  // The database was left alone.
  options.restore_checkpoint.clear();
  EXPECT_NE(MustOpen(options), nullptr);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return contents;
}

TEST(ServerStorage, CheckpointDirPutsCheckpointsUnderTheServersIdWithAbsolutePaths) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.Join("data");
  // Relative, and not normalised: the reply's path must be absolute anyway.
  options.checkpoint_dir =
      (std::filesystem::relative(temp.path()) / "shared" / ".." / "shared").string();
  ASSERT_FALSE(std::filesystem::path(options.checkpoint_dir).is_absolute());
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  PushAll(*storage, 0, Keys(1, 10), 2.0f);
  // The root names the server: none before it has an id.
  StatusOr<CheckpointInfo> info = storage->Checkpoint(7);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition) << info.status();
  ASSERT_TRUE(storage->SetServerId(4).ok());
  info = storage->Checkpoint(7);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->path, temp.path() + "/shared/ps-4/7");
  EXPECT_TRUE(std::filesystem::path(info->path).is_absolute());
  EXPECT_TRUE(std::filesystem::exists(info->path + "/CURRENT")) << info->path;
  EXPECT_FALSE(std::filesystem::exists(options.data_dir + "/checkpoints"));

  // Without checkpoint_dir: DATA_DIR/checkpoints, absolute too.
  storage.reset();
  options.checkpoint_dir.clear();
  options.data_dir =
      (std::filesystem::relative(temp.path()) / "." / "data3").string();
  storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  info = storage->Checkpoint(2);  // needs no id
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->path, temp.path() + "/data3/checkpoints/2");
}

TEST(ServerStorage, ACheckpointThatCannotBeWrittenIsAWriteError) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.Join("data");
  // A checkpoint dir under a regular file can never be made (root or not).
  std::ofstream(temp.Join("not-a-dir")) << "x";
  options.checkpoint_dir = temp.Join("not-a-dir/checkpoints");
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  ASSERT_TRUE(storage->SetServerId(1).ok());
  PushAll(*storage, 0, Keys(1, 10), 2.0f);
  EXPECT_EQ(storage->write_error(), "") << "every write succeeded so far";
  StatusOr<CheckpointInfo> info = storage->Checkpoint(5);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
  EXPECT_THAT(storage->write_error(),
              HasSubstr("cannot create checkpoint dir " + temp.Join("not-a-dir/checkpoints/ps-1")));
  // It stays: the master stops the job on it.
  ASSERT_TRUE(storage->Flush().ok());
  EXPECT_THAT(storage->write_error(), HasSubstr("cannot create checkpoint dir"));
  // A checkpoint id used twice is the caller's mistake, not the disk's.
  options.checkpoint_dir.clear();
  options.data_dir = temp.Join("data2");
  storage.reset();
  storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  ASSERT_TRUE(storage->Checkpoint(1).ok());
  EXPECT_EQ(storage->Checkpoint(1).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(storage->write_error(), "");
}

TEST(ServerStorage, KeepIdsDropExactlyTheUnlistedOlderCheckpoints) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  options.keep_checkpoints = 1;  // the rule without keep_ids; must not apply with them
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  const std::vector<uint64_t> all = {1, 2, 3, 5, 9};
  for (uint64_t id : all) {
    ASSERT_TRUE(storage->Checkpoint(id, all).ok()) << id;
  }
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"1", "2", "3", "5", "9"}));
  // Not ours: left alone.
  std::filesystem::create_directories(temp.path() + "/checkpoints/notes");

  // 6 itself stays although unlisted; 9 is newer and stays; 1 and 3 go.
  const std::vector<uint64_t> keep = {2, 5};
  StatusOr<CheckpointInfo> info = storage->Checkpoint(6, keep);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"2", "5", "6", "9", "notes"}));
  const std::vector<uint64_t> keep_six = {6, 100};
  ASSERT_TRUE(storage->Checkpoint(7, keep_six).ok());
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"6", "7", "9", "notes"}));
  // Without keep_ids: the newest keep_checkpoints.
  ASSERT_TRUE(storage->Checkpoint(8).ok());
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"9", "notes"}));
}

TEST(ServerStorage, ServerIdIsStoredAtomicallyAndAbsentForAFreshDir) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    EXPECT_EQ(storage->stored_server_id(), std::nullopt);
    ASSERT_TRUE(storage->SetServerId(12).ok());
    EXPECT_EQ(storage->stored_server_id(), std::optional<uint32_t>(12));
    ASSERT_TRUE(storage->SetServerId(5).ok());  // the master gave another slot
    EXPECT_EQ(storage->stored_server_id(), std::optional<uint32_t>(5));
  }
  EXPECT_EQ(ReadFile(temp.path() + "/SERVER"), "5\n");
  EXPECT_FALSE(std::filesystem::exists(temp.path() + "/SERVER.tmp"));
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    EXPECT_EQ(storage->stored_server_id(), std::optional<uint32_t>(5));
  }
  std::ofstream(temp.path() + "/SERVER", std::ios::trunc) << "five\n";
  EXPECT_EQ(MustOpen(options)->stored_server_id(), std::nullopt);

  // Memory only: nothing to store, nothing stored.
  std::unique_ptr<ServerStorage> memory = MustOpen(StorageOptions{});
  ASSERT_NE(memory, nullptr);
  EXPECT_TRUE(memory->SetServerId(3).ok());
  EXPECT_EQ(memory->stored_server_id(), std::nullopt);
}

TEST(ServerStorage, RestoreWhileOpenReplacesEveryRowAndWritesNoDiscardedOne) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  options.memory_budget_mb = 1;  // most rows cold: restored rows come from the store
  options.flush_interval = absl::Hours(1);
  const std::vector<uint64_t> keys = Keys(100, 30000);
  const std::vector<uint64_t> later_keys = Keys(200000000, 1000);
  std::string path;
  {
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    PushAll(*storage, 0, keys, 2.0f);  // -1
    StatusOr<CheckpointInfo> checkpoint = storage->Checkpoint(1);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    path = checkpoint->path;
    PushAll(*storage, 0, keys, 4.0f);  // -3, flushed
    PushAll(*storage, 1, later_keys, 1.0f);
    ASSERT_TRUE(storage->Flush().ok());
    PushAll(*storage, 0, keys, 8.0f);  // -7, dirty in memory (and partly evicted)

    for (int round = 0; round < 2; ++round) {  // twice: the same state
      StatusOr<CheckpointInfo> restored = storage->Restore(path);
      ASSERT_TRUE(restored.ok()) << restored.status();
      EXPECT_EQ(restored->path, path);
      EXPECT_GT(restored->bytes, 0u);
      EXPECT_EQ(storage->num_tables(), 2u);
      EXPECT_EQ(storage->stats().rows_in_memory, 0u) << "the hot tier starts empty";
      ExpectAll(*storage, 0, keys, -1.0f, absl::StrCat("restore ", round));
      ExpectAll(*storage, 1, later_keys, 0.0f, absl::StrCat("restore ", round));
      ASSERT_TRUE(storage->status().ok());
    }
  }
  {
    // The discarded rows never reached the restored database.
    std::unique_ptr<ServerStorage> storage = MustOpen(options);
    ASSERT_NE(storage, nullptr);
    ExpectAll(*storage, 0, keys, -1.0f, "reopened after the restore");
    ExpectAll(*storage, 1, later_keys, 0.0f, "reopened after the restore");
    // The restored store serves writes as before.
    ASSERT_TRUE(storage->Restore(path).ok());
    PushAll(*storage, 0, keys, 2.0f);  // -2
  }
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  ExpectAll(*storage, 0, keys, -2.0f, "written after the restore");
  EXPECT_EQ(Checkpoints(temp.path()), (std::set<std::string>{"1"}));
}

TEST(ServerStorage, FlusherRunsAgainAfterRestore) {
  TempDir temp;
  std::unique_ptr<ServerStorage> storage = OpenFlushingOften(temp.path());
  ASSERT_NE(storage, nullptr);
  StatusOr<CheckpointInfo> checkpoint = storage->Checkpoint(1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_TRUE(storage->Restore(checkpoint->path).ok());
  const uint64_t flushes = storage->stats().flushes;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (storage->stats().flushes < flushes + 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));  // polling a counter, bounded
  }
  EXPECT_GE(storage->stats().flushes, flushes + 2);
}

TEST(ServerStorage, RefusedUpdatesStayCountedAcrossRestore) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.path();
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  StatusOr<CheckpointInfo> checkpoint = storage->Checkpoint(1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  // SGD, lr 0.5, from 0: two steps of FLT_MAX reach -FLT_MAX, a third
  // would make the weights -inf.
  const std::vector<uint64_t> key = {1};
  const std::vector<float> huge(4, FLT_MAX);
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(storage->table(0)->Push(key, huge).ok());
  EXPECT_EQ(storage->stats().updates_refused, 1u);
  // Restore replaces the tables; the count stays.
  ASSERT_TRUE(storage->Restore(checkpoint->path).ok());
  EXPECT_EQ(storage->stats().updates_refused, 1u);
}

TEST(ServerStorage, RestoreOfAMissingOrBrokenCheckpointChangesNothing) {
  TempDir temp;
  StorageOptions options;
  options.data_dir = temp.Join("data");
  options.flush_interval = absl::Hours(1);
  {
    StatusOr<std::unique_ptr<ServerStorage>> opened = ServerStorage::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ((*opened)->Restore(temp.path()).status().code(),
              absl::StatusCode::kFailedPrecondition)
        << "before CreateTables";
  }
  std::unique_ptr<ServerStorage> storage = MustOpen(options);
  ASSERT_NE(storage, nullptr);
  const std::vector<uint64_t> keys = Keys(1, 100);
  PushAll(*storage, 0, keys, 2.0f);  // -1, dirty

  const std::string missing = temp.Join("checkpoints/404");
  StatusOr<CheckpointInfo> restored = storage->Restore(missing);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kNotFound) << restored.status();
  EXPECT_THAT(restored.status().message(), HasSubstr(missing));
  std::filesystem::create_directories(temp.Join("not-a-db"));
  restored = storage->Restore(temp.Join("not-a-db"));
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << restored.status();
  EXPECT_THAT(restored.status().message(), HasSubstr(temp.Join("not-a-db")));
  ExpectAll(*storage, 0, keys, -1.0f, "after failed restores");
  EXPECT_TRUE(storage->status().ok());

  // No checkpoint at all (checkpoint 0, training starting): every row goes,
  // flushed or not, and comes back as new.
  ASSERT_TRUE(storage->Flush().ok());
  PushAll(*storage, 0, keys, 2.0f);  // -2, dirty
  restored = storage->Restore("");
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectAll(*storage, 0, keys, 0.0f, "after emptying");
  PushAll(*storage, 0, keys, 2.0f);
  ExpectAll(*storage, 0, keys, -1.0f, "trained again");

  // Memory only: nothing to restore into.
  std::unique_ptr<ServerStorage> memory = MustOpen(StorageOptions{});
  ASSERT_NE(memory, nullptr);
  EXPECT_EQ(memory->Restore(temp.path()).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace eps
