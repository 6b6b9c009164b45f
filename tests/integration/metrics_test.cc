// The master's /metrics with the real binaries, read the way Prometheus
// reads it: scraped twice while a job trains, each scrape checked by
// `promtool check metrics` (which lints too), the values moving between the
// scrapes; and deploy/ (the scrape config and the Grafana dashboard) checked
// against the same tools and the families the master exposes.
//
// promtool comes with Debian's prometheus package; without it the tests
// are skipped, saying so.

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr absl::Duration kScrapeTimeout = absl::Seconds(60);
constexpr absl::Duration kJobTimeout = absl::Seconds(120);

// promtool on PATH or in /usr/bin; empty when absent.
std::string FindPromtool() {
  std::vector<std::string> dirs = {"/usr/bin"};
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      dirs.emplace(dirs.begin(), dir);
    }
  }
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/promtool";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs `promtool ARGS`, `stdin_path` (if any) as its standard input; its
// exit code and output.
struct ToolResult {
  int code = -1;
  std::string output;
};
ToolResult RunPromtool(const std::string& promtool, const std::string& args,
                       const std::string& stdin_path, const std::string& log_path) {
  std::string command = absl::StrCat("'", promtool, "' ", args);
  if (!stdin_path.empty()) absl::StrAppend(&command, " < '", stdin_path, "'");
  StatusOr<std::unique_ptr<Process>> process = Process::Start({"/bin/sh", "-c", command}, log_path);
  if (!process.ok()) return {-1, process.status().ToString()};
  const std::optional<int> code = (*process)->Wait(absl::Seconds(30));
  return {code.value_or(-1), (*process)->Log()};
}

// One scrape: its text and its samples by series ("name{labels}").
struct Scrape {
  std::string text;
  std::map<std::string, double> samples;
  std::set<std::string> families;  // from the TYPE lines

  double Value(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
  bool Has(const std::string& series) const { return samples.contains(series); }
};

StatusOr<Scrape> ScrapeMetrics(const LocalJob& job) {
  httplib::Client client(job.http());
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  if (!result || result->status != 200) return absl::UnavailableError("GET /metrics failed");
  Scrape scrape;
  scrape.text = result->body;
  for (absl::string_view line : absl::StrSplit(scrape.text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# TYPE ")) {
      const std::vector<std::string> words = absl::StrSplit(line, ' ');
      if (words.size() == 4) scrape.families.insert(words[2]);
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    scrape.samples[std::string(line.substr(0, space))] =
        std::strtod(std::string(line.substr(space + 1)).c_str(), nullptr);
  }
  return scrape;
}

// Scrapes until `ready` holds; kDeadlineExceeded, with the last scrape,
// when it does not within kScrapeTimeout.
StatusOr<Scrape> ScrapeWhen(const LocalJob& job, const std::function<bool(const Scrape&)>& ready) {
  const absl::Time deadline = absl::Now() + kScrapeTimeout;
  std::string last = "(none)";
  while (absl::Now() < deadline) {
    StatusOr<Scrape> scrape = ScrapeMetrics(job);
    if (scrape.ok() && ready(*scrape)) return scrape;
    last = scrape.ok() ? scrape->text : scrape.status().ToString();
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("/metrics not as expected within ",
                                                  absl::FormatDuration(kScrapeTimeout),
                                                  "; last scrape:\n", last));
}

// promtool's verdict on an exposition: "" when it passes, else its output.
std::string PromtoolComplaints(const std::string& promtool, const TempDir& dir,
                               const std::string& name, const std::string& text) {
  const std::string path = dir.Join(name + ".prom");
  WriteFile(path, text);
  const ToolResult result =
      RunPromtool(promtool, "check metrics", path, dir.Join(name + ".promtool.log"));
  if (result.code == 0 && result.output.find_first_not_of(" \n") == std::string::npos) return "";
  return absl::StrCat("promtool check metrics exited ", result.code, ":\n", result.output);
}

std::string WriteJobConfig(const TempDir& dir) {
  const std::string path = dir.Join("job.ini");
  WriteFile(path,
            "[job]\n"
            "name = metrics\n"
            "epochs = 2\n"
            "progress_interval_s = 1\n"
            "[data]\n"
            "shard_records = 5000\n"
            // A small MLP: its dense tensors travel through the workers'
            // step pipeline, whose staleness the test reads.
            "[model]\n"
            "type = wdl\n"
            "embedding_dim = 4\n"
            "mlp = 16,1\n"
            "[ps]\n"
            "num_servers = 2\n"
            "partitions = 16\n"
            "[worker]\n"
            "batch_size = 512\n"
            "max_staleness = 1\n"
            "master_wait_s = 20\n"
            // About 5 s per epoch with two workers: room for two scrapes.
            "max_records_per_s = 6000\n"
            "[master]\n"
            "heartbeat_ms = 200\n"
            "lease_ms = 3000\n"
            "[checkpoint]\n"
            "interval_s = 2\n");
  return path;
}

// Sum of the series of `family` (a histogram's _count, say) over every
// label set.
double SumOf(const Scrape& scrape, const std::string& name) {
  double sum = 0;
  for (const auto& [series, value] : scrape.samples) {
    if (series == name || absl::StartsWith(series, name + "{")) sum += value;
  }
  return sum;
}

TEST(Metrics, ScrapesDuringAJobPassPromtoolAndMove) {
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian package prometheus): /metrics not validated";
  }
  TempDir dir;
  const std::string config = WriteJobConfig(dir);
  ASSERT_TRUE(GenerateData(dir.Join("data"), 60000, /*seed=*/3, /*files=*/2).ok());
  LocalJob job(dir.path(), config, {"--data.train=" + dir.Join("data/train")});
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();

  const std::string kTrained = "eps_records_trained_total";
  // First scrape: both workers have pulled and pushed, each server holds
  // rows and has answered.
  StatusOr<Scrape> first = ScrapeWhen(job, [](const Scrape& s) {
    for (const char* worker : {"0", "1"}) {
      const std::string label = absl::StrCat("{worker=\"", worker, "\"}");
      if (s.Value("eps_worker_pull_seconds_count" + label) <= 0 ||
          s.Value("eps_worker_push_seconds_count" + label) <= 0) {
        return false;
      }
    }
    for (const char* server : {"0", "1"}) {
      const std::string label = absl::StrCat("{server=\"", server, "\"}");
      if (s.Value("eps_server_rows" + label) <= 0 ||
          s.Value("eps_server_push_seconds_count" + label) <= 0) {
        return false;
      }
    }
    return s.Value("eps_job_phase{phase=\"training\"}") == 1 &&
           s.Value("eps_records_trained_total") > 0;
  });
  ASSERT_TRUE(first.ok()) << first.status() << job.Logs();
  // Second scrape: in epoch 2, after a checkpoint, and well after the first.
  const double trained_first = first->Value(kTrained);
  StatusOr<Scrape> second = ScrapeWhen(job, [&](const Scrape& s) {
    return s.Value("eps_job_epoch") == 2 && s.Value(kTrained) > trained_first &&
           s.Value("eps_checkpoints_written_total") >= 1;
  });
  ASSERT_TRUE(second.ok()) << second.status() << job.Logs();
  std::cout << "records trained: " << trained_first << " then " << second->Value(kTrained) << "\n";

  EXPECT_EQ(PromtoolComplaints(promtool, dir, "first", first->text), "") << first->text;
  EXPECT_EQ(PromtoolComplaints(promtool, dir, "second", second->text), "") << second->text;

  // Values move.
  EXPECT_GT(second->Value(kTrained), first->Value(kTrained)) << second->text;
  EXPECT_GT(second->Value("eps_job_records_trained"), first->Value("eps_job_records_trained"));
  for (const char* histogram : {"eps_worker_pull_seconds_count", "eps_worker_push_seconds_count",
                                "eps_server_pull_seconds_count", "eps_server_push_seconds_count"}) {
    EXPECT_GT(SumOf(*second, histogram), SumOf(*first, histogram)) << histogram;
  }
  // Per-peer series, each worker's and each server's.
  for (const Scrape* scrape : {&*first, &*second}) {
    for (const char* worker : {"0", "1"}) {
      const std::string label = absl::StrCat("{worker=\"", worker, "\"}");
      EXPECT_TRUE(scrape->Has("eps_worker_records_per_second" + label)) << label;
      EXPECT_TRUE(scrape->Has("eps_worker_records_committed_total" + label)) << label;
      EXPECT_GT(scrape->Value("eps_worker_pull_seconds_count" + label), 0) << label;
    }
    for (const char* server : {"0", "1"}) {
      const std::string label = absl::StrCat("{server=\"", server, "\"}");
      EXPECT_GT(scrape->Value("eps_server_rows" + label), 0) << label;
      EXPECT_GT(scrape->Value("eps_server_push_seconds_count" + label), 0) << label;
      // A healthy job has no update a server refused.
      EXPECT_TRUE(scrape->Has("eps_server_updates_refused_total" + label)) << label;
      EXPECT_EQ(scrape->Value("eps_server_updates_refused_total" + label), 0) << label;
    }
    EXPECT_EQ(scrape->Value("eps_workers{state=\"alive\"}"), 2);
    EXPECT_EQ(scrape->Value("eps_servers{state=\"alive\"}"), 2);
  }
  // Bounded staleness, seen from outside: every step of each worker
  // started from a dense copy missing at most worker.max_staleness = 1
  // updates it knew of, and the servers measured what pushes missed.
  for (const char* worker : {"0", "1"}) {
    const std::string label = absl::StrCat("{worker=\"", worker, "\"");
    const double steps = second->Value("eps_worker_dense_staleness_count" + label + "}");
    EXPECT_GT(steps, 0) << label;
    EXPECT_EQ(second->Value("eps_worker_dense_staleness_bucket" + label + ",le=\"1\"}"), steps)
        << label;
    EXPECT_TRUE(second->Has("eps_worker_staleness_wait_seconds_sum" + label + "}")) << label;
  }
  EXPECT_GT(SumOf(*second, "eps_server_dense_staleness_count"), 0) << second->text;
  StatusOr<json> status = job.LiveStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  double measured_by_servers = 0;
  for (const json& server : (*status)["servers"]) {
    measured_by_servers += server["dense_staleness"]["pushes"].get<double>();
  }
  EXPECT_GT(measured_by_servers, 0) << status->dump();
  int workers_seen = 0;
  for (const json& worker : (*status)["workers"]) {
    if (worker["state"] != "alive") continue;
    ++workers_seen;
    const json& trained = worker["dense_staleness"];
    EXPECT_GT(trained["steps"].get<double>(), 0) << worker.dump();
    EXPECT_LE(trained["max"].get<double>(), 1) << worker.dump();
    EXPECT_LE(trained["p99"].get<double>(), 1) << worker.dump();
    EXPECT_GE(trained["wait_s"].get<double>(), 0) << worker.dump();
  }
  EXPECT_EQ(workers_seen, 2) << status->dump();
  // Known once an epoch is over and a checkpoint written.
  EXPECT_TRUE(second->Has("eps_train_loss")) << second->text;
  EXPECT_TRUE(second->Has("eps_checkpoint_last_pause_seconds")) << second->text;

  // Every family the dashboard queries is one the master exposes (the
  // evaluation's only at the end).
  std::set<std::string> exposed = first->families;
  exposed.insert(second->families.begin(), second->families.end());
  exposed.insert({"eps_eval_auc", "eps_eval_logloss"});
  const std::string dashboard =
      ReadFile(std::string(EPS_SOURCE_DIR) + "/deploy/grafana/eps-dashboard.json");
  const std::regex metric("eps_[a-z_]+");
  int queried = 0;
  for (std::sregex_iterator it(dashboard.begin(), dashboard.end(), metric), end; it != end; ++it) {
    std::string name = it->str();
    // Exposed only with [autoscale] on: autoscale_test checks those.
    if (absl::StartsWith(name, "eps_autoscale_")) continue;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (absl::EndsWith(name, suffix) && !exposed.contains(name)) {
        name = name.substr(0, name.size() - std::string(suffix).size());
      }
    }
    EXPECT_TRUE(exposed.contains(name)) << "the dashboard queries " << it->str();
    ++queried;
  }
  EXPECT_GT(queried, 10);

  StatusOr<int> master_exit = job.WaitForMaster(kJobTimeout);
  ASSERT_TRUE(master_exit.ok() && *master_exit == 0) << job.Logs();
  for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(20))) {
    EXPECT_EQ(code, 0) << job.Logs();
  }
}

TEST(Metrics, DeployFilesAreValid) {
  // The dashboard is JSON with panels, its data source a variable.
  const json dashboard = json::parse(
      ReadFile(std::string(EPS_SOURCE_DIR) + "/deploy/grafana/eps-dashboard.json"), nullptr,
      /*allow_exceptions=*/false);
  ASSERT_FALSE(dashboard.is_discarded()) << "deploy/grafana/eps-dashboard.json is not JSON";
  EXPECT_GE(dashboard["panels"].size(), 10u);
  EXPECT_NE(dashboard.dump().find("${DS_PROMETHEUS}"), std::string::npos);

  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian package prometheus): "
                    "deploy/prometheus.yml not validated";
  }
  TempDir dir;
  const ToolResult result = RunPromtool(
      promtool, absl::StrCat("check config '", EPS_SOURCE_DIR, "/deploy/prometheus.yml'"), "",
      dir.Join("promtool.log"));
  EXPECT_EQ(result.code, 0) << result.output;
}

}  // namespace
}  // namespace eps::testing
