// The crash test of ServerStorage's durability (issue 4): a server process
// (ps_crash_child) pushes a stream of batches and acknowledges each on a
// pipe; the test kills it with SIGKILL at a random moment, reopens its data
// dir itself and checks what the store kept:
//   every_push  every acknowledged batch is there;
//   flush       the acknowledged batches missing were all acknowledged
//               within one flush interval (plus kSlackMs) before the kill;
//   both        the database always reopens; nothing unacknowledged beyond
//               the batch in flight is there, and no push is applied twice.
// Then the next child continues in the same dir, on top of what was kept.
//
// Batch b adds 1 to the weights of keys (b * kBatch + j) % kKeys, j <
// kBatch, so a key's weight counts its pushes; pushes to one key are applied
// and written in batch order, so a weight of c - (what the key held before
// the run) means the key's first c pushes of the run are stored, and batch
// b is stored iff each of its keys has at least as many pushes stored as b
// made of it.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "ps/storage.h"
#include "tests/ps/crash_job.h"

extern char** environ;

namespace eps {
namespace {

constexpr uint64_t kKeys = 50000;
constexpr uint64_t kBatch = 64;
constexpr int kKillsPerMode = 5;
constexpr int64_t kFlushMs = 250;
// How much later than due (one interval after the last one began, or when
// the last one ended if it took longer) a flush may begin: the flusher
// thread waiting to be scheduled on a loaded machine.
constexpr int64_t kLateFlushMs = 100;

using ::eps::testing::TempDir;

// A ps_crash_child with its stdout on a pipe; killed (SIGKILL) and reaped
// when it goes away, if not before.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& log_path) {
    int fds[2];
    CHECK_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> argv_strings = {EPS_CRASH_CHILD};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int spawned =
        ::posix_spawn(&pid_, EPS_CRASH_CHILD, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    read_fd_ = fds[0];
    CHECK_EQ(spawned, 0) << "spawning " << EPS_CRASH_CHILD << ": " << std::strerror(spawned);
  }
  ~Child() {
    if (pid_ > 0) KillAndReap();
    ::close(read_fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int read_fd() const { return read_fd_; }

  // Sends SIGKILL (unless reaped already) and waits for the exit; the wait
  // status.
  int KillAndReap() {
    CHECK_GT(pid_, 0);
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
};

// A flush the child saw complete.
struct Flush {
  uint64_t count = 0;    // flushes completed so far
  int64_t start_ms = 0;  // it began no earlier
  int64_t duration_ms = 0;
};

// What one child wrote: ack_ms[b] is when batch b was acknowledged.
struct Acks {
  std::vector<int64_t> ack_ms;
  std::vector<Flush> flushes;
  std::string partial;  // an incomplete last line
  bool eof = false;
  std::string error;  // a malformed line
};

// Reads acknowledgements from `fd` until `deadline`, EOF, or (with
// `until_first`) the first one.
void ReadAcks(int fd, absl::Time deadline, bool until_first, Acks* acks) {
  char buffer[1 << 16];
  while (!acks->eof && acks->error.empty() && !(until_first && !acks->ack_ms.empty())) {
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (wait_ms <= 0) return;
    pollfd poll_fd{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = ::poll(&poll_fd, 1, static_cast<int>(std::min<int64_t>(wait_ms, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    CHECK_GE(ready, 0) << std::strerror(errno);
    if (ready == 0) continue;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    CHECK_GE(n, 0) << std::strerror(errno);
    if (n == 0) {
      acks->eof = true;
      return;
    }
    acks->partial.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t end; (end = acks->partial.find('\n', start)) != std::string::npos;
         start = end + 1) {
      const std::string line = acks->partial.substr(start, end - start);
      std::vector<std::string> fields = absl::StrSplit(line, ' ');
      uint64_t batch = 0;
      int64_t ms = 0;
      Flush flush;
      if (fields.size() == 3 && fields[0] == "ack" && absl::SimpleAtoi(fields[1], &batch) &&
          absl::SimpleAtoi(fields[2], &ms) && batch == acks->ack_ms.size()) {
        acks->ack_ms.push_back(ms);
      } else if (fields.size() == 4 && fields[0] == "flush" &&
                 absl::SimpleAtoi(fields[1], &flush.count) &&
                 absl::SimpleAtoi(fields[2], &flush.start_ms) &&
                 absl::SimpleAtoi(fields[3], &flush.duration_ms)) {
        acks->flushes.push_back(flush);
      } else {
        acks->error = absl::StrCat("unexpected line from the child: '", line, "' after ",
                                   acks->ack_ms.size(), " acks");
        return;
      }
    }
    acks->partial.erase(0, start);
  }
}

std::string ReadLog(const std::string& path) {
  std::string text;
  if (FILE* file = std::fopen(path.c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) text.append(buffer, n);
    std::fclose(file);
  }
  return text.size() > 4000 ? text.substr(text.size() - 4000) : text;
}

StorageOptions Options(const std::string& data_dir, bool every_push, int64_t budget_mb) {
  StorageOptions options;
  options.data_dir = data_dir;
  options.every_push = every_push;
  options.flush_interval = absl::Milliseconds(kFlushMs);
  options.memory_budget_mb = budget_mb;
  return options;
}

// The stored push count of every key, read by opening `data_dir` the way a
// restarted server does.
std::vector<int64_t> StoredCounts(const StorageOptions& options) {
  StatusOr<std::unique_ptr<ServerStorage>> storage = ServerStorage::Open(options);
  EXPECT_TRUE(storage.ok()) << "reopening after the kill: " << storage.status();
  if (!storage.ok()) return {};
  Status created = (*storage)->CreateTables(CrashTestJob());
  EXPECT_TRUE(created.ok()) << created;
  if (!created.ok()) return {};
  Table* table = (*storage)->table(0);
  std::vector<uint64_t> keys(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) keys[k] = k;
  std::vector<float> weights(kKeys * table->dim());
  Status pulled = table->Pull(keys, weights);
  EXPECT_TRUE(pulled.ok()) << pulled;
  if (!pulled.ok()) return {};
  std::vector<int64_t> counts(kKeys);
  uint64_t torn = 0;
  for (uint64_t k = 0; k < kKeys; ++k) {
    const float* row = weights.data() + k * table->dim();
    counts[k] = static_cast<int64_t>(row[0]);
    for (uint32_t d = 0; d < table->dim(); ++d) {
      if (row[d] != static_cast<float>(counts[k])) ++torn;
    }
  }
  EXPECT_EQ(torn, 0u) << "rows whose weights differ (torn, or not whole counts)";
  return counts;
}

struct ModeFigures {
  uint64_t acked = 0;
  uint64_t acked_lost = 0;
  int64_t max_loss_window_ms = 0;  // kill time - earliest lost ack
  int64_t max_flush_ms = 0;        // the longest flush seen
  int kills_inside_a_write = 0;    // with in_store_write: as the child logged
};

// Starts, kills and checks kKillsPerMode children in one data dir.
// Kills at random moments, or (`in_store_write`) has each child kill itself
// in the middle of a write to its store (failpoint ps.kill_in_store_write).
ModeFigures RunKills(bool every_push, int64_t budget_mb, bool in_store_write = false) {
  ModeFigures figures;
  TempDir temp;
  const std::string data_dir = temp.path() + "/data";
  const StorageOptions options = Options(data_dir, every_push, budget_mb);
  const uint64_t seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  std::mt19937_64 rng(seed);
  const char* mode = every_push ? "every_push" : "flush";
  std::cout << "mode " << mode << ", seed " << seed << "\n";
  std::vector<int64_t> before(kKeys, 0);  // stored counts after the last kill
  for (int kill = 0; kill < kKillsPerMode; ++kill) {
    const std::string log_path = absl::StrCat(temp.path(), "/child", kill, ".log");
    Acks acks;
    int64_t kill_ms = 0;
    absl::Duration delay;
    {
      if (in_store_write) {
        const uint64_t write = 50 + rng() % 400;
        std::cout << "kill " << kill << ": in store write " << write << "\n";
        ::setenv("EPS_FAILPOINTS", absl::StrCat("ps.kill_in_store_write=", write).c_str(), 1);
      }
      Child child({data_dir, mode, std::to_string(kFlushMs), std::to_string(budget_mb),
                   std::to_string(kKeys), std::to_string(kBatch)},
                  log_path);
      ::unsetenv("EPS_FAILPOINTS");
      ReadAcks(child.read_fd(), absl::Now() + absl::Seconds(30), /*until_first=*/true, &acks);
      if (acks.ack_ms.empty()) {
        ADD_FAILURE() << "kill " << kill << ": the child acknowledged nothing"
                      << (acks.eof ? " and exited" : "") << "; its log:\n"
                      << ReadLog(log_path);
        return figures;
      }
      if (in_store_write) {
        ReadAcks(child.read_fd(), absl::Now() + absl::Seconds(60), /*until_first=*/false, &acks);
        EXPECT_TRUE(acks.eof) << "the child did not kill itself in a store write; its log:\n"
                              << ReadLog(log_path);
      } else {
        delay = absl::Milliseconds(200 + static_cast<int64_t>(rng() % 1301));
        ReadAcks(child.read_fd(), absl::Now() + delay, /*until_first=*/false, &acks);
        EXPECT_FALSE(acks.eof) << "the child exited on its own; its log:\n" << ReadLog(log_path);
      }
      kill_ms = absl::ToUnixMillis(absl::Now());
      const int status = child.KillAndReap();
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "wait status " << status;
      // Acks written before the kill may still be in the pipe.
      ReadAcks(child.read_fd(), absl::Now() + absl::Seconds(10), /*until_first=*/false, &acks);
      EXPECT_TRUE(acks.eof);
    }
    if (!acks.error.empty()) {
      ADD_FAILURE() << acks.error;
      return figures;
    }
    EXPECT_TRUE(acks.partial.empty()) << "a torn ack: '" << acks.partial << "'";

    const std::vector<int64_t> counts = StoredCounts(options);
    if (counts.size() != kKeys) return figures;

    // Walk the batches in order: applied[k] counts the pushes of key k in
    // batches 0..b; batch b is stored iff every key of it has at least that
    // many stored in this run.
    const uint64_t acked = acks.ack_ms.size();
    std::vector<int64_t> applied(kKeys, 0);
    std::vector<uint64_t> lost;
    bool in_flight_stored = true;
    for (uint64_t b = 0; b <= acked; ++b) {  // batch `acked` was in flight
      bool stored = true;
      for (uint64_t j = 0; j < kBatch; ++j) {
        const uint64_t k = (b * kBatch + j) % kKeys;
        ++applied[k];
        if (counts[k] - before[k] < applied[k]) stored = false;
      }
      if (b == acked) {
        in_flight_stored = stored;
      } else if (!stored) {
        lost.push_back(b);
      }
    }
    // Nothing beyond the batch in flight, nothing twice.
    int64_t phantom_keys = 0;
    for (uint64_t k = 0; k < kKeys; ++k) {
      if (counts[k] - before[k] > applied[k] || counts[k] < before[k]) ++phantom_keys;
    }
    EXPECT_EQ(phantom_keys, 0) << "keys holding pushes that were never made";

    const int64_t window_ms = lost.empty() ? 0 : kill_ms - acks.ack_ms[lost.front()];
    int64_t max_flush_ms = 0;
    for (const Flush& flush : acks.flushes)
      max_flush_ms = std::max(max_flush_ms, flush.duration_ms);
    const std::string log = in_store_write ? ReadLog(log_path) : std::string();
    const bool inside = log.find("killed inside the store write") != std::string::npos;
    figures.kills_inside_a_write += inside;
    std::cout << mode << " kill " << kill << " "
              << (in_store_write ? (inside ? "inside a store write" : "after a store write")
                                 : "after " + absl::FormatDuration(delay))
              << ": acked "
              << acked << " batches, lost " << lost.size() << " of them (loss window " << window_ms
              << " ms), batch in flight " << (in_flight_stored ? "stored" : "not (fully) stored")
              << "; " << acks.flushes.size() << " flushes seen, longest " << max_flush_ms << " ms";
    if (!acks.flushes.empty()) {
      std::cout << ", the last began >= " << kill_ms - acks.flushes.back().start_ms
                << " ms before the kill and took " << acks.flushes.back().duration_ms << " ms";
    }
    std::cout << "\n";
    if (every_push) {
      EXPECT_TRUE(lost.empty()) << "kill " << kill << ": " << lost.size()
                                << " acknowledged batches lost, the first " << lost.front();
    } else {
      // A completed flush holds every push acknowledged before it began...
      const int64_t covered_ms =
          acks.flushes.empty() ? std::numeric_limits<int64_t>::min() : acks.flushes.back().start_ms;
      const auto covered = std::find_if(lost.begin(), lost.end(),
                                        [&](uint64_t b) { return acks.ack_ms[b] < covered_ms; });
      EXPECT_EQ(covered, lost.end())
          << "kill " << kill << ": batch " << *covered << ", acknowledged "
          << kill_ms - acks.ack_ms[*covered]
          << " ms before the kill, was lost although a flush that began after it completed";
      // ... and flushes begin every interval (back to back when one takes
      // longer), so what is lost was acknowledged within one interval plus
      // the flush in flight before the kill.
      for (size_t i = 1; i < acks.flushes.size(); ++i) {
        const Flush& previous = acks.flushes[i - 1];
        if (acks.flushes[i].count != previous.count + 1) continue;
        EXPECT_LE(acks.flushes[i].start_ms - previous.start_ms,
                  std::max(kFlushMs, previous.duration_ms) + kLateFlushMs)
            << "kill " << kill << ": flush " << acks.flushes[i].count << " began late";
      }
    }
    figures.acked += acked;
    figures.acked_lost += lost.size();
    figures.max_loss_window_ms = std::max(figures.max_loss_window_ms, window_ms);
    figures.max_flush_ms = std::max(figures.max_flush_ms, max_flush_ms);
    before = counts;
  }
  return figures;
}

TEST(CrashTest, EveryPushKeepsEveryAcknowledgedPush) {
  // 1 MiB holds about 21k of the 50k rows: rows leave memory and come back
  // between the kills.
  const ModeFigures figures = RunKills(/*every_push=*/true, /*budget_mb=*/1);
  EXPECT_EQ(figures.acked_lost, 0u);
  EXPECT_GT(figures.acked, 0u);
  RecordProperty("acked", static_cast<int>(figures.acked));
}

// Issue 35: killed in the middle of writing rows to RocksDB (the write a
// push waits for under every_push), a server still keeps every push it
// acknowledged, and nothing else.
TEST(CrashTest, EveryPushKeepsEveryAcknowledgedPushKilledInsideAStoreWrite) {
  const ModeFigures figures =
      RunKills(/*every_push=*/true, /*budget_mb=*/1, /*in_store_write=*/true);
  EXPECT_EQ(figures.acked_lost, 0u);
  EXPECT_GT(figures.acked, 0u);
  std::cout << figures.kills_inside_a_write << " of " << kKillsPerMode
            << " kills fell inside a store write\n";
  EXPECT_GT(figures.kills_inside_a_write, 0) << "no kill fell inside a store write";
  RecordProperty("kills_inside_a_write", figures.kills_inside_a_write);
}

TEST(CrashTest, FlushLosesAtMostOneFlushInterval) {
  // No budget: only the interval makes the flusher write.
  const ModeFigures figures = RunKills(/*every_push=*/false, /*budget_mb=*/0);
  EXPECT_GT(figures.acked, 0u);
  RecordProperty("acked", static_cast<int>(figures.acked));
  RecordProperty("acked_lost", static_cast<int>(figures.acked_lost));
  RecordProperty("max_loss_window_ms", static_cast<int>(figures.max_loss_window_ms));
  RecordProperty("max_flush_ms", static_cast<int>(figures.max_flush_ms));
}

}  // namespace
}  // namespace eps
