// ps_crash_child: the server that tests/ps/crash_test.cc kills.
//
//   ps_crash_child DATA_DIR every_push|flush FLUSH_MS BUDGET_MB KEYS BATCH
//
// Opens a ServerStorage on DATA_DIR with the given durability, flush
// interval and memory budget, creates one SGD table (CrashTestJob(): dim 4,
// learning rate 1, zeros), then pushes forever: batch b applies gradient -1
// to the BATCH keys (b * BATCH + j) % KEYS, j < BATCH, so each weight counts
// the pushes of its key. After each Push returns it writes
// "ack <b> <unix ms>\n" to stdout. Every kFlushPollBatches batches it looks
// at the storage's flush count, and when flushes completed since it last
// looked, writes "flush <count> <unix ms> <duration ms>": the flusher's last
// flush took <duration ms> and began no earlier than <unix ms> (the last
// look, when the count was lower, less the duration). Each line is one
// write(2), so none is torn or held in a buffer. Errors go to stderr, exit
// code 1.

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ps/storage.h"
#include "tests/ps/crash_job.h"

namespace {

constexpr uint64_t kFlushPollBatches = 16;

bool WriteLine(const std::string& line) {
  if (::write(STDOUT_FILENO, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
    return true;
  }
  std::cerr << "ps_crash_child: writing to stdout: " << std::strerror(errno) << "\n";
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t flush_ms = 0;
  int64_t budget_mb = 0;
  uint64_t keys = 0;
  uint64_t batch = 0;
  const std::string mode = argc == 7 ? argv[2] : "";
  if (argc != 7 || (mode != "every_push" && mode != "flush") ||
      !absl::SimpleAtoi(argv[3], &flush_ms) || !absl::SimpleAtoi(argv[4], &budget_mb) ||
      !absl::SimpleAtoi(argv[5], &keys) || !absl::SimpleAtoi(argv[6], &batch) || keys == 0 ||
      batch == 0 || batch > keys) {
    std::cerr << "usage: ps_crash_child DATA_DIR every_push|flush FLUSH_MS BUDGET_MB KEYS BATCH\n";
    return 1;
  }
  eps::StorageOptions options;
  options.data_dir = argv[1];
  options.every_push = mode == "every_push";
  options.flush_interval = absl::Milliseconds(flush_ms);
  options.memory_budget_mb = budget_mb;
  eps::StatusOr<std::unique_ptr<eps::ServerStorage>> storage = eps::ServerStorage::Open(options);
  if (!storage.ok()) {
    std::cerr << "ps_crash_child: " << storage.status() << "\n";
    return 1;
  }
  if (eps::Status created = (*storage)->CreateTables(eps::CrashTestJob()); !created.ok()) {
    std::cerr << "ps_crash_child: " << created << "\n";
    return 1;
  }
  eps::Table* table = (*storage)->table(0);
  std::vector<uint64_t> batch_keys(batch);
  const std::vector<float> grads(batch * table->dim(), -1.0f);
  uint64_t flushes = 0;
  int64_t last_look_ms = absl::ToUnixMillis(absl::Now());
  for (uint64_t b = 0;; ++b) {
    for (uint64_t j = 0; j < batch; ++j) batch_keys[j] = (b * batch + j) % keys;
    if (eps::Status pushed = table->Push(batch_keys, grads); !pushed.ok()) {
      std::cerr << "ps_crash_child: push of batch " << b << ": " << pushed << "\n";
      return 1;
    }
    if (!WriteLine(absl::StrCat("ack ", b, " ", absl::ToUnixMillis(absl::Now()), "\n"))) return 1;
    if (b % kFlushPollBatches == 0) {
      const int64_t look_ms = absl::ToUnixMillis(absl::Now());
      const eps::StorageStats stats = (*storage)->stats();
      if (stats.flushes > flushes) {
        const auto duration_ms = static_cast<int64_t>(std::ceil(stats.last_flush_ms));
        flushes = stats.flushes;
        if (!WriteLine(absl::StrCat("flush ", flushes, " ", last_look_ms - duration_ms - 1, " ",
                                    duration_ms, "\n"))) {
          return 1;
        }
      }
      last_look_ms = look_ms;
    }
  }
}
