#include "core/memory.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace eps {
namespace {

// This process's resident set, from /proc/self/statm.
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  uint64_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

TEST(TrimFreeMemory, RunsAtMostOncePerInterval) {
  const absl::Time start = absl::FromUnixSeconds(1'800'000'000);
  EXPECT_TRUE(TrimFreeMemory(start, absl::Seconds(30)));
  EXPECT_FALSE(TrimFreeMemory(start + absl::Seconds(29), absl::Seconds(30)));
  EXPECT_TRUE(TrimFreeMemory(start + absl::Seconds(30), absl::Seconds(30)));
}

TEST(TrimFreeMemory, GivesBackThePagesAFragmentedArenaHolds) {
  // A thread fills its arena with small blocks and frees all but every
  // 64th: the free space lies between live blocks, where glibc does not
  // return it by itself.
  constexpr size_t kBlocks = 200'000;
  constexpr size_t kBytes = 256;
  std::vector<std::unique_ptr<char[]>> kept;
  std::thread filler([&kept] {
    std::vector<std::unique_ptr<char[]>> blocks;
    for (size_t i = 0; i < kBlocks; ++i) {
      blocks.emplace_back(new char[kBytes]);
      blocks.back()[0] = 1;  // touched: resident
    }
    for (size_t i = 0; i < kBlocks; i += 64) kept.push_back(std::move(blocks[i]));
  });
  filler.join();
  const uint64_t before = ResidentBytes();
  ASSERT_TRUE(TrimFreeMemory(absl::FromUnixSeconds(1'900'000'000)));
  const uint64_t after = ResidentBytes();
  // About 50 MiB were freed; most of it goes back.
  EXPECT_GT(before, after + (20u << 20)) << "RSS " << before << " -> " << after;
}

TEST(LimitMallocArenas, LeavesTheUsersSettingAlone) {
  ::setenv("MALLOC_ARENA_MAX", "3", 1);
  EXPECT_FALSE(LimitMallocArenas(2));
  ::unsetenv("MALLOC_ARENA_MAX");
  EXPECT_TRUE(LimitMallocArenas(64));  // the glibc default on most machines
}

}  // namespace
}  // namespace eps
