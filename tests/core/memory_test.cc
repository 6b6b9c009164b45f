#include "core/memory.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

// AddressSanitizer's allocator replaces glibc's: no arenas, trims or mmap
// threshold to observe (scripts/sanitize.sh builds).
#ifdef ABSL_HAVE_ADDRESS_SANITIZER
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif

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
  if (!kGlibcMalloc) GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc";
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
  if (!kGlibcMalloc) GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc";
  ::setenv("MALLOC_ARENA_MAX", "3", 1);
  EXPECT_FALSE(LimitMallocArenas(2));
  ::unsetenv("MALLOC_ARENA_MAX");
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=3", 1);
  EXPECT_FALSE(LimitMallocArenas(2));
  ::unsetenv("GLIBC_TUNABLES");
  EXPECT_TRUE(LimitMallocArenas(64));  // the glibc default on most machines
}

// glibc's rising threshold would serve the second 1 MiB block from the heap
// (it rises to the first block's size when that is freed); fixed, every
// such block is its own mapping.
TEST(FixMmapThreshold, KeepsLargeBlocksMappedAfterOneIsFreed) {
  if (!kGlibcMalloc) GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc";
  ASSERT_TRUE(FixMmapThreshold(128 << 10));
  constexpr size_t kBytes = 1 << 20;
  void* first = std::malloc(kBytes);
  ASSERT_NE(first, nullptr);
  std::free(first);
  const size_t mapped_before = ::mallinfo2().hblks;
  void* second = std::malloc(kBytes);
  ASSERT_NE(second, nullptr);
  const size_t mapped_after = ::mallinfo2().hblks;
  std::free(second);
  EXPECT_EQ(mapped_after, mapped_before + 1);
}

TEST(FixMmapThreshold, LeavesTheUsersSettingAlone) {
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536", 1);
  EXPECT_FALSE(FixMmapThreshold());
  ::unsetenv("GLIBC_TUNABLES");
  ::setenv("MALLOC_MMAP_THRESHOLD_", "65536", 1);
  EXPECT_FALSE(FixMmapThreshold());
  ::unsetenv("MALLOC_MMAP_THRESHOLD_");
}

// A message buffer of a few MiB, freed and allocated again, reuses the
// heap's pages: it is not a mapping of its own, and freeing it does not
// hand its pages back (glibc's defaults do both, so every buffer faults in
// afresh).
TEST(TuneForMessages, ReusesAMessageBufferInsteadOfMappingItAgain) {
  if (!kGlibcMalloc) GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc";
  TuneForMessages();
  constexpr size_t kBytes = size_t{2} << 20;
  const size_t mapped_before = ::mallinfo2().hblks;
  char* buffer = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(buffer, nullptr);
  buffer[0] = buffer[kBytes - 1] = 1;
  EXPECT_EQ(::mallinfo2().hblks, mapped_before) << "a 2 MiB buffer got a mapping of its own";
  std::free(buffer);
  EXPECT_GE(::mallinfo2().fordblks, kBytes) << "the freed buffer went back to the system";
  FixMmapThreshold();  // as the other tests expect
  FixTrimThreshold(128 << 10);
}

TEST(FixTrimThreshold, LeavesTheUsersSettingAlone) {
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=65536", 1);
  EXPECT_FALSE(FixTrimThreshold(1 << 20));
  ::unsetenv("GLIBC_TUNABLES");
  ::setenv("MALLOC_TRIM_THRESHOLD_", "65536", 1);
  EXPECT_FALSE(FixTrimThreshold(1 << 20));
  ::unsetenv("MALLOC_TRIM_THRESHOLD_");
}

}  // namespace
}  // namespace eps
