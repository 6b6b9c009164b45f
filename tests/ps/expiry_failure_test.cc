// Tests that a failed sweep of expired rows is no sweep: the server's
// background sweep fails (failpoint ps.fail_expiry), and the export that
// follows sweeps again, failing as loudly, instead of writing rows that
// should have expired. Its own binary: failpoints are read from the
// environment once per process.

#include <stdlib.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/storage.h"
#include "tests/ps/storage_testing.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::TempDir;
using ::testing::HasSubstr;

TEST(ServerStorage, AFailedSweepIsNoSweepAndTheExportSaysSo) {
  ASSERT_EQ(setenv("EPS_FAILPOINTS", "ps.fail_expiry=2", 1), 0);
  TempDir dir;
  StorageOptions options;
  options.data_dir = dir.Join("data");
  std::unique_ptr<ServerStorage> storage = OpenExpiring(options);
  ASSERT_NE(storage, nullptr);
  const std::vector<uint64_t> keys = Keys(1, 100);
  PushAll(*storage, 1, keys, 2.0f);  // pass 0, untrained after: expired once 2 are done
  ASSERT_TRUE(storage->Flush().ok());

  storage->NotePassesDone(2);
  // The background sweep runs and fails (the failpoint), deleting nothing.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(storage->stats().rows_expired, 0u);

  StatusOr<ExportInfo> info = storage->Export(dir.Join("model"), 2);
  ASSERT_FALSE(info.ok()) << "exported " << info->rows << " rows, expired ones among them";
  EXPECT_THAT(info.status().message(), HasSubstr("deleting expired rows before the export"));
  EXPECT_THAT(info.status().message(), HasSubstr("ps.fail_expiry=2"));
}

}  // namespace
}  // namespace eps
