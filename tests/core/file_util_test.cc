// Tests core/file_util.h.

#include "core/file_util.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

TEST(FileUtil, WritesTheWholeFile) {
  testing::TempDir dir;
  const std::string path = dir.Join("a.json");
  ASSERT_TRUE(WriteFileAtomically(path, "{\"x\": 1}\n").ok());
  EXPECT_EQ(ReadFile(path), "{\"x\": 1}\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(FileUtil, OverwritesAnOlderFile) {
  testing::TempDir dir;
  const std::string path = dir.Join("SERVER");
  ASSERT_TRUE(WriteFileAtomically(path, "a much longer first version\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "2\n").ok());
  EXPECT_EQ(ReadFile(path), "2\n");
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_EQ(ReadFile(path), "");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(FileUtil, MissingDirectoryIsUnavailableAndNamesThePath) {
  testing::TempDir dir;
  const std::string path = dir.Join("no/such/dir/file");
  const Status status = WriteFileAtomically(path, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace eps
