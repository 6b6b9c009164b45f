// The autoscaler's sources: the command source's line, Prometheus answers,
// and the prometheus source against a real Prometheus server (Debian's
// `prometheus`) scraping an endpoint this test serves. Skipped, saying
// so, where no prometheus binary is installed.

#include "master/autoscale/autoscaler.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "master/autoscale/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

TEST(ParseSignalLine, ReadsFreeAndPendingGpus) {
  StatusOr<AutoscaleSignal> both = ParseSignalLine("  3 2 \nignored\n");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->free_gpus, 3);
  EXPECT_EQ(both->pending_gpus, 2);
  StatusOr<AutoscaleSignal> free_only = ParseSignalLine("7");
  ASSERT_TRUE(free_only.ok()) << free_only.status();
  EXPECT_EQ(free_only->free_gpus, 7);
  EXPECT_EQ(free_only->pending_gpus, 0);
  for (const char* bad : {"", "lots", "-1", "1 2 3", "1.5", "2 -3"}) {
    StatusOr<AutoscaleSignal> parsed = ParseSignalLine(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(ParsePrometheusAnswer, SumsAVectorOrTakesAScalar) {
  StatusOr<double> vector = ParsePrometheusAnswer(
      R"({"status":"success","data":{"resultType":"vector","result":[
          {"metric":{"node":"a"},"value":[1700000000.1,"3"]},
          {"metric":{"node":"b"},"value":[1700000000.1,"2.5"]}]}})",
      "free");
  ASSERT_TRUE(vector.ok()) << vector.status();
  EXPECT_EQ(*vector, 5.5);
  StatusOr<double> scalar = ParsePrometheusAnswer(
      R"({"status":"success","data":{"resultType":"scalar","result":[1700000000,"4"]}})", "4");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(*scalar, 4);
}

TEST(ParsePrometheusAnswer, RefusesWhatIsNotACount) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not a Prometheus answer"},
      {R"({"status":"error","error":"parse error at char 3"})", "parse error at char 3"},
      {R"({"status":"success","data":{"resultType":"vector","result":[]}})",
       "returned no series"},
      {R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1,"NaN"]}]}})",
       "did not give a number"},
      {R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1,"-2"]}]}})",
       "did not give a number"},
      {R"({"status":"success","data":{"resultType":"matrix","result":[]}})",
       "did not give a number"},
  };
  for (const auto& [body, message] : cases) {
    StatusOr<double> value = ParsePrometheusAnswer(body, "gpus_free");
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(std::string(value.status().message()), HasSubstr(message)) << body;
  }
}

TEST(CommandSource, ReadsTheCommandsLineAndReportsItsFailure) {
  JobConfig job;
  JobConfig::Autoscale& options = job.autoscale;
  options.source = "command";
  options.command = "echo 4 1";
  StatusOr<std::unique_ptr<SignalSource>> source = MakeSignalSource(job);
  ASSERT_TRUE(source.ok()) << source.status();
  StatusOr<AutoscaleSignal> signal = (*source)->Read();
  ASSERT_TRUE(signal.ok()) << signal.status();
  EXPECT_EQ(signal->free_gpus, 4);
  EXPECT_EQ(signal->pending_gpus, 1);

  options.command = "echo no scheduler >&2; exit 3";
  source = MakeSignalSource(job);
  ASSERT_TRUE(source.ok());
  signal = (*source)->Read();
  EXPECT_EQ(signal.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(signal.status().message()),
              HasSubstr("autoscale.command failed: no scheduler (exit 3)"));

  options.command = "sleep 30";
  options.source_timeout_s = 1;
  source = MakeSignalSource(job);
  ASSERT_TRUE(source.ok());
  const absl::Time start = absl::Now();
  signal = (*source)->Read();
  EXPECT_EQ(signal.status().code(), absl::StatusCode::kDeadlineExceeded) << signal.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The command launcher's values are words, never commands: a handle a
// start command printed and a directory with a ';' in its name run nothing.
TEST(CommandLauncher, SubstitutesEveryValueAsOneShellWord) {
  testing::TempDir dir;
  const std::string pwned = dir.Join("pwned");
  JobConfig job;
  job.autoscale.launcher = "command";
  job.autoscale.start_command = absl::StrCat("printf '%s\\n' {config} {master} {id} {secret} > ",
                                             dir.Join("started"), " && echo 'h-1; touch ",
                                             pwned, "'");
  job.autoscale.stop_command =
      absl::StrCat("printf '%s\\n' {handle} {signal} > ", dir.Join("stopped"));
  LauncherContext context;
  context.worker_config = dir.Join("a;touch " + pwned + ";'b/worker.ini");
  context.master_endpoint = "tcp://127.0.0.1:5555 $(touch " + pwned + ")";
  context.log_dir = dir.Join("workers");
  StatusOr<std::unique_ptr<WorkerLauncher>> launcher = MakeLauncher(job, context);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  StatusOr<std::string> handle = (*launcher)->Start(7, "s3cr3t");
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(*handle, "h-1; touch " + pwned);
  EXPECT_EQ(ReadAll(dir.Join("started")),
            absl::StrCat(context.worker_config, "\n", context.master_endpoint, "\n7\ns3cr3t\n"));
  ASSERT_TRUE((*launcher)->Stop(7, *handle, /*force=*/false).ok());
  EXPECT_EQ(ReadAll(dir.Join("stopped")), *handle + "\nTERM\n");
  EXPECT_FALSE(std::filesystem::exists(pwned));
}

TEST(PrometheusSource, ReadsARealPrometheusServer) {
  if (::access("/usr/bin/prometheus", X_OK) != 0) {
    GTEST_SKIP() << "no /usr/bin/prometheus (Debian's prometheus package): not tested here";
  }
  testing::TempDir dir;
  // The exporter: a gauge of free GPUs and one of others' pending demand,
  // per node, which the test changes.
  std::atomic<int> free_per_node{1};
  std::atomic<int> pending{0};
  httplib::Server exporter;
  exporter.Get("/metrics", [&](const httplib::Request&, httplib::Response& response) {
    response.set_content(absl::StrCat("# TYPE gpus_free gauge\n",
                                      "gpus_free{node=\"a\"} ", free_per_node.load(), "\n",
                                      "gpus_free{node=\"b\"} ", free_per_node.load(), "\n",
                                      "# TYPE gpus_pending gauge\n",
                                      "gpus_pending ", pending.load(), "\n"),
                         "text/plain; version=0.0.4");
  });
  const int exporter_port = exporter.bind_to_any_port("127.0.0.1");
  ASSERT_GT(exporter_port, 0);
  std::thread serving([&exporter] { exporter.listen_after_bind(); });

  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::ofstream(dir.Join("prometheus.yml"))
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: gpus\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << exporter_port << "']\n";
  StatusOr<std::unique_ptr<Subprocess>> prometheus = Subprocess::Start(
      {"/usr/bin/prometheus", "--config.file=" + dir.Join("prometheus.yml"),
       "--storage.tsdb.path=" + dir.Join("tsdb"),
       absl::StrCat("--web.listen-address=127.0.0.1:", port)},
      {}, dir.Join("prometheus.log"));
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();

  JobConfig job;
  JobConfig::Autoscale& options = job.autoscale;
  options.source = "prometheus";
  options.prometheus_url = absl::StrCat("http://127.0.0.1:", port);
  options.query = "sum(gpus_free)";
  options.pending_query = "gpus_pending";
  options.source_timeout_s = 2;
  StatusOr<std::unique_ptr<SignalSource>> source = MakeSignalSource(job);
  ASSERT_TRUE(source.ok()) << source.status();
  // Reads until `want` holds (Prometheus starts, then scrapes every second).
  auto read_until = [&](int64_t free, int64_t want_pending) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    StatusOr<AutoscaleSignal> signal = absl::UnavailableError("not read");
    while (absl::Now() < deadline) {
      signal = (*source)->Read();
      if (signal.ok() && signal->free_gpus == free && signal->pending_gpus == want_pending) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    ADD_FAILURE() << "want " << free << " free, " << want_pending << " pending; last read: "
                  << (signal.ok() ? absl::StrCat(signal->free_gpus, " ", signal->pending_gpus)
                                  : signal.status().ToString());
    return false;
  };
  EXPECT_TRUE(read_until(2, 0));
  free_per_node = 3;
  pending = 4;
  EXPECT_TRUE(read_until(6, 4));

  // A query Prometheus refuses, and one with no series.
  options.query = "sum(";
  StatusOr<std::unique_ptr<SignalSource>> bad = MakeSignalSource(job);
  ASSERT_TRUE(bad.ok());
  StatusOr<AutoscaleSignal> refused = (*bad)->Read();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  options.query = "no_such_metric";
  bad = MakeSignalSource(job);
  ASSERT_TRUE(bad.ok());
  EXPECT_THAT(std::string((*bad)->Read().status().message()), HasSubstr("returned no series"));

  (*prometheus)->Signal(SIGTERM);
  if (!(*prometheus)->Wait(absl::Seconds(20)).has_value()) {
    (*prometheus)->Signal(SIGKILL);
    (*prometheus)->Wait(absl::Seconds(5));
  }
  exporter.stop();
  serving.join();
}

}  // namespace
}  // namespace eps
