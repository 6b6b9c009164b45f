// A soak with the real binaries (CTest label `soak`, not in the default
// suite): EPS_SOAK_MINUTES (default 30) of training while a worker is
// killed (-9) or added every few seconds and a server is killed (-9) and
// restarted on its --data-dir every few minutes. Afterwards every process
// that lived through the whole run kept its resident memory within 5% of
// what it held after the warm-up, and every complete epoch's ledger counts
// each line exactly once.
//
// The master, server 0 and worker 0 are never killed, so that memory drift
// is measured over the whole run. The job has more epochs than the run can
// train; it ends with SIGTERM to the master (a resumable stop).

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr int kRows = 30000;
constexpr int kRecordsPerWorkerPerS = 3000;
constexpr int kMaxWorkers = 4;
constexpr uint32_t kSeed = 13;
// Memory: one sample per process this often. After the warm-up (the first
// quarter of the run: caches fill, the allocator finds its arenas, the
// first rollbacks happen), the figures compared are the medians of the
// first and of the second half of the samples: a RocksDB memtable filling
// and flushing, and a rollback reopening a server's store, make RSS a
// sawtooth of a few MiB, which medians over long halves see past, while a
// leak moves the second half's away from the first's.
constexpr absl::Duration kSampleEvery = absl::Seconds(5);
constexpr double kMaxDriftPercent = 5;
// Chaos: a worker killed or added every 2-5 s, the chaos server killed
// every 90-150 s.
constexpr int kWorkerEventMinMs = 2000;
constexpr int kWorkerEventMaxMs = 5000;
constexpr int kServerKillMinS = 90;
constexpr int kServerKillMaxS = 150;

absl::Duration SoakDuration() {
  const char* minutes = ::getenv("EPS_SOAK_MINUTES");
  double value = 30;
  if (minutes != nullptr && !absl::SimpleAtod(minutes, &value)) value = 30;
  return absl::Seconds(std::max(1.0, value * 60));
}

// Enough epochs that even kMaxWorkers at full speed cannot finish before
// the run ends.
int64_t EpochsFor(absl::Duration duration) {
  const double most_records = absl::ToDoubleSeconds(duration) * kMaxWorkers * kRecordsPerWorkerPerS;
  return static_cast<int64_t>(std::ceil(most_records / kRows)) * 2 + 10;
}

std::string WriteJobConfig(const TempDir& dir, int64_t epochs) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path, absl::StrCat("[job]\n"
                               "name = soak\n"
                               "epochs = ", epochs, "\n"
                               "progress_interval_s = 10\n"
                               "[data]\n"
                               "shard_records = 2000\n"
                               "[ps]\n"
                               "num_servers = 2\n"
                               "partitions = 16\n"
                               "[worker]\n"
                               "batch_size = 256\n"
                               "max_records_per_s = ", kRecordsPerWorkerPerS, "\n"
                               "compute_threads = 1\n"
                               "master_wait_s = 60\n"
                               "rpc_timeout_ms = 2000\n"
                               "rpc_attempts = 2\n"
                               "[master]\n"
                               "heartbeat_ms = 200\n"
                               "lease_ms = 2000\n"
                               "[checkpoint]\n"
                               "interval_s = 3\n"
                               "keep = 2\n"));
  return path;
}

// One process's resident set size over the run.
struct MemoryTrack {
  std::string name;
  Process* process;  // not owned; the LocalJob's
  std::vector<std::pair<absl::Time, uint64_t>> samples;
  uint64_t peak = 0;
};

uint64_t Median(std::vector<uint64_t> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

class SoakTest : public ::testing::Test {
 protected:
  void Track(const std::string& name, Process* process) {
    tracks_.push_back({name, process, {}, 0});
  }

  void Sample() {
    const absl::Time now = absl::Now();
    for (MemoryTrack& track : tracks_) {
      if (!track.process->Running()) continue;
      if (std::optional<uint64_t> rss = track.process->ResidentBytes()) {
        track.samples.emplace_back(now, *rss);
      }
      if (std::optional<uint64_t> peak = track.process->PeakResidentBytes()) {
        track.peak = std::max(track.peak, *peak);
      }
    }
  }

  // What the servers say their memory holds: rows (the memory tier) and
  // the store's own (RocksDB's cache and memtables), both bounded by
  // options, so that RSS growth can be told from them.
  void LogServerMemory(const LocalJob& job) {
    StatusOr<json> status = job.LiveStatus();
    if (!status.ok()) return;
    std::string line = "servers' memory (MiB):";
    for (const json& server : (*status)["servers"]) {
      absl::StrAppendFormat(&line, " server %d rows %.1f store %.1f;", server["id"].get<int>(),
                            Mib(server["memory_bytes"].get<uint64_t>()),
                            Mib(server["store_memory_bytes"].get<uint64_t>()));
    }
    Log(line);
    // What each tracked process's resident memory is made of: anonymous
    // pages (heap, stacks) against file pages (code, mapped files), and its
    // threads, whose stacks and arenas are anonymous memory too.
    line = "resident (MiB anon/file, threads):";
    for (const MemoryTrack& track : tracks_) {
      std::optional<uint64_t> anon = track.process->StatusField("RssAnon:");
      std::optional<uint64_t> file = track.process->StatusField("RssFile:");
      std::optional<uint64_t> threads = track.process->StatusField("Threads:");
      if (!anon || !file || !threads) continue;
      absl::StrAppendFormat(&line, " %s %.1f/%.1f %d;", track.name, Mib(*anon << 10),
                            Mib(*file << 10), *threads);
    }
    Log(line);
  }

  void Log(const std::string& line) {
    std::cout << absl::StrFormat("[%7.1fs] ", absl::ToDoubleSeconds(absl::Now() - start_)) << line
              << std::endl;
  }

  // Every process that ran from the start to the end: the median RSS of
  // its samples in the first half after `warm_up_end` against the median of
  // the second half, up to `end`, printed as a table. Expects each within
  // kMaxDriftPercent.
  void CheckMemoryDrift(absl::Time warm_up_end, absl::Time end) {
    const absl::Time middle = warm_up_end + (end - warm_up_end) / 2;
    std::cout << "memory: medians of the samples from "
              << absl::FormatDuration(warm_up_end - start_) << " to "
              << absl::FormatDuration(middle - start_) << " (after warm-up) and from there to "
              << absl::FormatDuration(end - start_) << " (at the end)\n"
              << "| process | RSS after warm-up (MiB) | RSS at the end (MiB) | drift | peak RSS "
                 "(MiB) |\n| --- | --- | --- | --- | --- |\n";
    int measured = 0;
    const size_t samples_a_minute = absl::Minutes(1) / kSampleEvery;
    std::string trends;
    for (const MemoryTrack& track : tracks_) {
      if (!track.process->Running()) continue;
      std::vector<uint64_t> after_warm_up;
      std::vector<uint64_t> at_end;
      for (const auto& [time, rss] : track.samples) {
        if (time >= warm_up_end && time < middle) after_warm_up.push_back(rss);
        if (time >= middle) at_end.push_back(rss);
      }
      ASSERT_FALSE(after_warm_up.empty() || at_end.empty()) << track.name << ": no samples";
      const uint64_t before = Median(after_warm_up);
      const uint64_t after = Median(at_end);
      const double drift = 100.0 * (static_cast<double>(after) - static_cast<double>(before)) /
                           static_cast<double>(before);
      std::cout << absl::StrFormat("| %s | %.1f | %.1f | %+.1f%% | %.1f |\n", track.name,
                                   Mib(before), Mib(after), drift, Mib(track.peak));
      std::string minutes;
      for (size_t i = 0; i < track.samples.size(); i += samples_a_minute) {
        absl::StrAppendFormat(&minutes, " %.1f", Mib(track.samples[i].second));
      }
      absl::StrAppend(&trends, track.name, " RSS (MiB) a minute apart:", minutes, "\n");
      EXPECT_LE(std::abs(drift), kMaxDriftPercent)
          << track.name << ": RSS " << before << " -> " << after << " bytes";
      ++measured;
    }
    std::cout << trends;
    // The master, server 0 and worker 0 at least.
    EXPECT_GE(measured, 3);
  }

  std::vector<MemoryTrack> tracks_;
  absl::Time start_;
};

TEST_F(SoakTest, ChurnKeepsMemoryFlatAndEveryEpochExactlyOnce) {
  const absl::Duration duration = SoakDuration();
  const int64_t epochs = EpochsFor(duration);
  TempDir dir;
  Status generated = GenerateData(dir.Join("data"), kRows, /*seed=*/17, /*files=*/2);
  ASSERT_TRUE(generated.ok()) << generated;
  const uint64_t lines = CountLines(dir.Join("data/train"));
  LocalJob job(dir.path(), WriteJobConfig(dir, epochs), {"--data.train=" + dir.Join("data/train")},
               /*deadline=*/duration + absl::Minutes(10));
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([](const json& status) {
    return status["phase"] == "training" && status["records_trained"].get<uint64_t>() > 0;
  })) << job.Logs();

  start_ = absl::Now();
  const absl::Time end = start_ + duration;
  const absl::Time warm_up_end = start_ + duration / 4;
  std::cout << "soak: " << absl::FormatDuration(duration) << ", " << lines << " lines an epoch, "
            << epochs << " epochs configured, seed " << kSeed << "\n";
  // The processes started with the job; those alive at the end are
  // measured.
  Track("master", &job.master());
  Track("server-0", job.servers()[0].get());
  Track("server-1", job.servers()[1].get());
  Track("worker-0", job.workers()[0].get());
  Track("worker-1", job.workers()[1].get());

  std::mt19937 rng(kSeed);
  auto between = [&rng](int low, int high) {
    return low + static_cast<int>(rng() % (high - low + 1));
  };
  size_t chaos_server = 1;  // the index in job.servers() of server slot 1's process
  int worker_kills = 0;
  int workers_added = 0;
  int server_kills = 0;
  absl::Time next_sample = start_;
  absl::Time next_store_report = start_;
  absl::Time next_worker_event =
      start_ + absl::Milliseconds(between(kWorkerEventMinMs, kWorkerEventMaxMs));
  absl::Time next_server_kill = start_ + absl::Seconds(between(kServerKillMinS, kServerKillMaxS));
  while (absl::Now() < end) {
    ASSERT_TRUE(job.master().Running()) << "the master exited during the soak\n" << job.Logs();
    const absl::Time now = absl::Now();
    if (now >= next_sample) {
      Sample();
      next_sample += kSampleEvery;
    }
    if (now >= next_store_report) {
      LogServerMemory(job);
      next_store_report += absl::Minutes(1);
    }
    if (now >= next_worker_event) {
      // Worker 0 is never killed; the others come and go, 1 to kMaxWorkers
      // alive in all.
      std::vector<size_t> others;
      for (size_t i = 1; i < job.workers().size(); ++i) {
        if (job.workers()[i]->Running()) others.push_back(i);
      }
      const bool add = others.empty() || (others.size() + 1 < kMaxWorkers && rng() % 2 == 0);
      if (add) {
        StatusOr<size_t> added = job.StartWorker();
        ASSERT_TRUE(added.ok()) << added.status();
        ++workers_added;
        Log(absl::StrCat("start worker-", *added, " (", others.size() + 2, " alive)"));
      } else {
        const size_t victim = others[rng() % others.size()];
        job.workers()[victim]->Signal(SIGKILL);
        ASSERT_EQ(job.workers()[victim]->Wait(absl::Seconds(10)), 128 + SIGKILL);
        ++worker_kills;
        Log(absl::StrCat("kill -9 worker-", victim, " (", others.size(), " alive)"));
      }
      next_worker_event = now + absl::Milliseconds(between(kWorkerEventMinMs, kWorkerEventMaxMs));
    }
    if (now >= next_server_kill) {
      Process& server = *job.servers()[chaos_server];
      server.Signal(SIGKILL);
      ASSERT_EQ(server.Wait(absl::Seconds(10)), 128 + SIGKILL);
      // Back at once on its --data-dir: the job rolls back to its last
      // checkpoint and goes on.
      StatusOr<size_t> restarted = job.StartServer(job.server_dir(1));
      ASSERT_TRUE(restarted.ok()) << restarted.status();
      chaos_server = *restarted;
      ++server_kills;
      Log(absl::StrCat("kill -9 server slot 1, restarted on its data dir as server-", *restarted));
      next_server_kill = now + absl::Seconds(between(kServerKillMinS, kServerKillMaxS));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  Sample();
  std::cout << "soak: " << worker_kills << " workers killed, " << workers_added
            << " workers added, " << server_kills << " server kills\n";
  ASSERT_NO_FATAL_FAILURE(CheckMemoryDrift(warm_up_end, end));

  // The chaos is over: let the last recovery finish, then stop the job.
  ASSERT_TRUE(job.WaitForStatus(
      [](const json& status) {
        return status["phase"] == "training" && status["recovery"]["in_progress"].is_null();
      },
      absl::Seconds(120)))
      << job.Logs();
  std::vector<bool> alive_at_stop;
  for (auto* group : {&job.servers(), &job.workers()}) {
    for (auto& process : *group) alive_at_stop.push_back(process->Running());
  }
  job.master().Signal(SIGTERM);
  StatusOr<int> exit = job.WaitForMaster(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  // A stopped job: failed, resumable.
  EXPECT_EQ(*exit, 1) << job.Logs();
  // Every server and worker is told to exit, and exits 0 (a worker whose
  // commit the stopped job refused hears JOB_OVER).
  const std::vector<std::optional<int>> codes = job.WaitForOthers(absl::Seconds(60));
  for (size_t i = 0; i < codes.size(); ++i) {
    if (!alive_at_stop[i]) continue;  // killed by the chaos
    EXPECT_EQ(codes[i], 0) << "process " << i << "\n" << job.Logs();
  }

  StatusOr<json> final_status = job.FinalStatus();
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  const json& status = *final_status;
  EXPECT_EQ(status["resumable"], true) << status.dump();
  const json& ledger = status["ledger"];
  ASSERT_GE(ledger.size(), 2u) << ledger.dump();
  uint64_t committed = 0;
  size_t complete = 0;
  for (size_t e = 0; e < ledger.size(); ++e) {
    const json& entry = ledger[e];
    committed += entry["records_committed"].get<uint64_t>();
    EXPECT_EQ(entry["lines_expected"].get<uint64_t>(), lines) << entry.dump();
    if (e + 1 < ledger.size()) {
      EXPECT_TRUE(entry["complete"].get<bool>()) << entry.dump();
    }
    if (!entry["complete"].get<bool>()) {
      EXPECT_LE(entry["lines_committed"].get<uint64_t>(), lines) << entry.dump();
      continue;
    }
    ++complete;
    EXPECT_TRUE(entry["exactly_once"].get<bool>()) << entry.dump();
    EXPECT_EQ(entry["lines_committed"].get<uint64_t>(), lines) << entry.dump();
    EXPECT_EQ(entry["records_committed"].get<uint64_t>(), lines) << entry.dump();
  }
  EXPECT_EQ(status["records_trained"].get<uint64_t>(), committed);
  // What is trained again is what the deaths left uncommitted (a few
  // batches each) and what the rollbacks undid (a few seconds each): a
  // small part of all, not a count that grows with every fence.
  EXPECT_LT(status["records_retrained"].get<uint64_t>(), committed / 4) << status.dump();
  EXPECT_EQ(status["recovery"]["recoveries"].get<int>(), server_kills) << status["recovery"].dump();
  std::cout << "soak: " << complete << " complete epochs, each exactly once; records_trained "
            << status["records_trained"] << ", records_retrained " << status["records_retrained"]
            << ", recoveries " << status["recovery"]["recoveries"] << ", checkpoints written "
            << status["checkpoints"]["written"] << ", failed " << status["checkpoints"]["failed"]
            << ", reassignments " << status["reassignments"] << "\n";
}

}  // namespace
}  // namespace eps::testing
