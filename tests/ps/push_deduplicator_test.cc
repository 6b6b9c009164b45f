// Tests ps/push_deduplicator.h.

#include "ps/push_deduplicator.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

constexpr uint64_t kWindow = PushDeduplicator::kWindow;

TEST(PushDeduplicator, FirstDeliveryIsNewAndRepeatsAreNot) {
  PushDeduplicator dedup;
  EXPECT_EQ(dedup.workers(), 0u);
  EXPECT_TRUE(dedup.FirstTime(/*worker=*/1, /*seq=*/1));
  EXPECT_FALSE(dedup.FirstTime(/*worker=*/1, /*seq=*/1));
  EXPECT_FALSE(dedup.FirstTime(/*worker=*/1, /*seq=*/1));
  EXPECT_TRUE(dedup.FirstTime(/*worker=*/1, /*seq=*/2));
  EXPECT_FALSE(dedup.FirstTime(/*worker=*/1, /*seq=*/2));
  EXPECT_EQ(dedup.workers(), 1u);
}

TEST(PushDeduplicator, OutOfOrderSeqsInsideTheWindowAreEachNewOnce) {
  PushDeduplicator dedup;
  for (uint64_t seq : {5, 3, 9, 4, 1, 2, 8, 6, 7}) {
    EXPECT_TRUE(dedup.FirstTime(1, seq)) << seq;
  }
  for (uint64_t seq = 1; seq <= 9; ++seq) EXPECT_FALSE(dedup.FirstTime(1, seq)) << seq;
  // A jump leaves the numbers skipped over new.
  EXPECT_TRUE(dedup.FirstTime(1, 1000));
  EXPECT_TRUE(dedup.FirstTime(1, 500));
  EXPECT_TRUE(dedup.FirstTime(1, 10));
  EXPECT_FALSE(dedup.FirstTime(1, 500));
}

TEST(PushDeduplicator, SeqZeroIsAlwaysNewAndNotRecorded) {
  PushDeduplicator dedup;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(dedup.FirstTime(1, /*seq=*/0));
  EXPECT_EQ(dedup.workers(), 0u);
  EXPECT_TRUE(dedup.FirstTime(1, 1));
  EXPECT_TRUE(dedup.FirstTime(1, 0));
}

TEST(PushDeduplicator, WorkersAreIndependent) {
  PushDeduplicator dedup;
  // 1 and 17 share a stripe.
  for (uint32_t worker : {1u, 2u, 17u}) EXPECT_TRUE(dedup.FirstTime(worker, 7)) << worker;
  for (uint32_t worker : {1u, 2u, 17u}) EXPECT_FALSE(dedup.FirstTime(worker, 7)) << worker;
  EXPECT_EQ(dedup.workers(), 3u);
}

TEST(PushDeduplicator, SeqsBelowTheWindowAreTreatedAsApplied) {
  PushDeduplicator dedup;
  const uint64_t highest = 3 * kWindow;
  EXPECT_TRUE(dedup.FirstTime(1, highest));
  // The oldest number still in the window, and the first one out of it.
  EXPECT_TRUE(dedup.FirstTime(1, highest - kWindow + 1));
  EXPECT_FALSE(dedup.FirstTime(1, highest - kWindow));
  EXPECT_FALSE(dedup.FirstTime(1, 1));
  // Numbers that leave the window as it advances are answered false, even
  // though they share their bits with new numbers that are answered true.
  EXPECT_TRUE(dedup.FirstTime(1, highest + kWindow - 1));
  EXPECT_FALSE(dedup.FirstTime(1, highest - 1));
  EXPECT_TRUE(dedup.FirstTime(1, highest + kWindow - 2));
}

TEST(PushDeduplicator, MemoryStaysBoundedOverAMillionSeqs) {
  PushDeduplicator dedup;
  EXPECT_TRUE(dedup.FirstTime(1, 1));
  const size_t one = dedup.memory_bytes();
  EXPECT_GT(one, 0u);
  EXPECT_LT(one, 64u * 1024);
  for (uint64_t seq = 2; seq <= 1'000'000; ++seq) ASSERT_TRUE(dedup.FirstTime(1, seq)) << seq;
  EXPECT_EQ(dedup.memory_bytes(), one);
  // The recent ones are remembered, the old ones pruned (and answered false).
  EXPECT_FALSE(dedup.FirstTime(1, 1'000'000));
  EXPECT_FALSE(dedup.FirstTime(1, 1'000'000 - kWindow + 1));
  EXPECT_FALSE(dedup.FirstTime(1, 2));
  // A huge jump is as cheap and as small.
  EXPECT_TRUE(dedup.FirstTime(1, uint64_t{1} << 62));
  EXPECT_TRUE(dedup.FirstTime(1, (uint64_t{1} << 62) - 1));
  EXPECT_EQ(dedup.memory_bytes(), one);
}

TEST(PushDeduplicator, ForgetDropsAWorker) {
  PushDeduplicator dedup;
  EXPECT_TRUE(dedup.FirstTime(1, 4));
  EXPECT_TRUE(dedup.FirstTime(2, 4));
  dedup.Forget(1);
  dedup.Forget(99);  // unknown: no-op
  EXPECT_EQ(dedup.workers(), 1u);
  EXPECT_TRUE(dedup.FirstTime(1, 4));
  EXPECT_FALSE(dedup.FirstTime(2, 4));
  const size_t two = dedup.memory_bytes();
  dedup.Forget(1);
  dedup.Forget(2);
  EXPECT_EQ(dedup.workers(), 0u);
  // The windows are freed; what remains is less than one window's bitmap.
  EXPECT_LT(dedup.memory_bytes(), kWindow / 8);
  EXPECT_LT(dedup.memory_bytes(), two);
}

TEST(PushDeduplicator, ConcurrentDeliveriesOfOneSeqAreNewExactlyOnce) {
  constexpr int kThreads = 8;
  constexpr uint64_t kSeqs = 2000;
  PushDeduplicator dedup;
  std::atomic<uint64_t> firsts{0};
  std::vector<std::atomic<int>> per_seq(kSeqs + 1);
  absl::Barrier* start = new absl::Barrier(kThreads);  // deletes itself
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      if (start->Block()) delete start;
      // Every thread delivers every seq of two workers, as racing retries.
      for (uint64_t seq = 1; seq <= kSeqs; ++seq) {
        for (uint32_t worker : {3u, 19u}) {
          if (dedup.FirstTime(worker, seq)) {
            firsts.fetch_add(1);
            if (worker == 3) per_seq[seq].fetch_add(1);
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(firsts.load(), 2 * kSeqs);
  for (uint64_t seq = 1; seq <= kSeqs; ++seq) EXPECT_EQ(per_seq[seq].load(), 1) << seq;
}

// Seen answers what FirstTime would, recording nothing.
TEST(PushDeduplicator, SeenPeeksWithoutRecording) {
  PushDeduplicator dedup;
  EXPECT_FALSE(dedup.Seen(3, 5));
  EXPECT_FALSE(dedup.Seen(3, 5));  // still not recorded
  EXPECT_TRUE(dedup.FirstTime(3, 5));
  EXPECT_TRUE(dedup.Seen(3, 5));
  EXPECT_FALSE(dedup.Seen(3, 6));
  EXPECT_FALSE(dedup.Seen(4, 5));  // another worker
  EXPECT_FALSE(dedup.Seen(3, 0));  // no sequence number
  EXPECT_TRUE(dedup.FirstTime(3, 5 + PushDeduplicator::kWindow));
  EXPECT_TRUE(dedup.Seen(3, 4));  // fell out of the window: treated as applied
  EXPECT_FALSE(dedup.FirstTime(3, 4));
}

}  // namespace
}  // namespace eps
