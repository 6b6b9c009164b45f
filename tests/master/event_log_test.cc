// Tests master/event_log.h: events queued by Record land in the file as
// JSON lines on Flush, in order, and survive a failed Flush.

#include "master/event_log.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace eps {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class EventLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/event_log_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  // The file's lines, each parsed (a line that does not parse fails).
  std::vector<json> Lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<json> lines;
    std::string line;
    while (std::getline(in, line)) {
      EXPECT_TRUE(json::accept(line)) << line;
      if (json::accept(line)) lines.push_back(json::parse(line));
    }
    return lines;
  }

  std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }

  std::string dir_;
};

TEST_F(EventLogTest, FlushWritesOneObjectPerLine) {
  const std::string path = dir_ + "/events.jsonl";
  EventLog log(path);
  EXPECT_EQ(log.path(), path);
  const double before = absl::ToUnixMillis(absl::Now()) / 1000.0;
  log.Record("job_started", {{"job", "test"}});
  log.Record("worker_joined", {{"worker", 3}, {"host", "h"}, {"ratio", 0.5}, {"ok", true}});
  log.Record("epoch_finished");
  // Record only queues.
  EXPECT_FALSE(std::filesystem::exists(path));
  ASSERT_TRUE(log.Flush().ok());
  const double after = absl::ToUnixMillis(absl::Now()) / 1000.0;

  const std::string text = ReadAll(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const std::vector<json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 3u);
  for (const json& line : lines) {
    ASSERT_TRUE(line.is_object()) << line;
    ASSERT_TRUE(line.contains("time")) << line;
    ASSERT_TRUE(line["time"].is_number()) << line;
    EXPECT_GE(line["time"].get<double>(), before - 0.001) << line;
    EXPECT_LE(line["time"].get<double>(), after + 0.001) << line;
  }
  EXPECT_EQ(lines[0]["event"], "job_started");
  EXPECT_EQ(lines[0]["job"], "test");
  EXPECT_EQ(lines[0].size(), 3u);
  EXPECT_EQ(lines[1]["event"], "worker_joined");
  EXPECT_EQ(lines[1]["worker"], 3);
  EXPECT_EQ(lines[1]["host"], "h");
  EXPECT_EQ(lines[1]["ratio"], 0.5);
  EXPECT_EQ(lines[1]["ok"], true);
  EXPECT_EQ(lines[2]["event"], "epoch_finished");
  EXPECT_EQ(lines[2].size(), 2u);

  // Nothing queued: nothing written.
  ASSERT_TRUE(log.Flush().ok());
  EXPECT_EQ(ReadAll(path), text);
}

TEST_F(EventLogTest, FlushesAppendToTheFile) {
  const std::string path = dir_ + "/events.jsonl";
  {
    EventLog log(path);
    log.Record("first");
    ASSERT_TRUE(log.Flush().ok());
    log.Record("second");
    ASSERT_TRUE(log.Flush().ok());
  }
  // A new log on the same file (a restarted master) appends too.
  EventLog again(path);
  again.Record("third");
  ASSERT_TRUE(again.Flush().ok());
  const std::vector<json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["event"], "first");
  EXPECT_EQ(lines[1]["event"], "second");
  EXPECT_EQ(lines[2]["event"], "third");
}

// Paths and names come from outside and need not be UTF-8.
TEST_F(EventLogTest, TextThatIsNotUtf8DoesNotThrow) {
  const std::string path = dir_ + "/events.jsonl";
  EventLog log(path);
  EXPECT_NO_THROW(log.Record("bad_\xff", {{"path", "/data/\xfe\xff.tsv"}, {"error", "x\xc3"}}));
  ASSERT_TRUE(log.Flush().ok());
  const std::vector<json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0]["path"].get<std::string>(), HasSubstr("/data/"));
  EXPECT_THAT(lines[0]["event"].get<std::string>(), HasSubstr("bad_"));
}

TEST_F(EventLogTest, FailedFlushKeepsTheEventsForTheNextOne) {
  const std::string missing = dir_ + "/not-yet";
  const std::string path = missing + "/events.jsonl";
  EventLog log(path);
  log.Record("first", {{"n", 1}});
  log.Record("second", {{"n", 2}});
  const Status failed = log.Flush();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr(path));
  // Still failing, with one more queued meanwhile.
  log.Record("third", {{"n", 3}});
  EXPECT_EQ(log.Flush().code(), absl::StatusCode::kUnavailable);

  std::filesystem::create_directories(missing);
  log.Record("fourth", {{"n", 4}});
  ASSERT_TRUE(log.Flush().ok());
  const std::vector<json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["n"], i + 1) << lines[i];
  // Written once: the next flush adds nothing.
  ASSERT_TRUE(log.Flush().ok());
  EXPECT_EQ(Lines(path).size(), 4u);
}

// Safe for concurrent use: records from many threads all land, each line
// whole.
TEST_F(EventLogTest, ConcurrentRecordsAndFlushesLoseNothing) {
  const std::string path = dir_ + "/events.jsonl";
  EventLog log(path);
  constexpr int kThreads = 4;
  constexpr int kEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&log, t] {
      for (int i = 0; i < kEach; ++i) {
        log.Record("tick", {{"thread", t}, {"i", i}});
        if (i % 50 == 0) {
          EXPECT_TRUE(log.Flush().ok());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(log.Flush().ok());
  const std::vector<json> lines = Lines(path);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kEach));
  // Each thread's events in its order.
  std::vector<int> next(kThreads, 0);
  for (const json& line : lines) {
    const int t = line["thread"];
    EXPECT_EQ(line["i"], next[t]) << line;
    next[t] = line["i"].get<int>() + 1;
  }
}

}  // namespace
}  // namespace eps
