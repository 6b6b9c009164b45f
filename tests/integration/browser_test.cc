// The master's page (GET /) in headless Chromium (Debian's chromium),
// against a running job: it renders the job's workers, servers and history
// chart from /status with no script error. Skips when chromium is absent
// (`scripts/test.sh -L browser` installs it).

#include <filesystem>
#include <regex>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

// The value of attribute `name` in `dom`, or -1.
int Attribute(const std::string& dom, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(dom, match, std::regex(name + "=\"([0-9]+)\""))) return -1;
  return std::stoi(match[1]);
}

TEST(Browser, StatusPageRendersWithoutErrors) {
  const std::string chromium = "/usr/bin/chromium";
  if (!std::filesystem::exists(chromium)) {
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium, or run "
                    "scripts/test.sh -L browser)";
  }
  TempDir dir;
  ASSERT_TRUE(GenerateData(dir.Join("data"), 60000, /*seed=*/4, /*files=*/1).ok());
  const std::string config = dir.Join("job.ini");
  WriteFile(config,
            // Epochs enough to outlive Chromium however slowly it starts
            // (in CI it once took so long that the job had finished).
            "[job]\nname = <page & test>\nprogress_interval_s = 1\nepochs = 100\n"
            "[data]\nshard_records = 5000\n"
            "[ps]\nnum_servers = 1\npartitions = 8\n"
            "[worker]\nbatch_size = 512\nmax_records_per_s = 2000\n"
            "[master]\nheartbeat_ms = 200\nlease_ms = 1000\n"
            // The autoscaler starts the worker, and the page shows it.
            "[autoscale]\nsource = command\ncommand = echo 3 1\ninterval_s = 1\n"
            "min_workers = 1\nmax_workers = 1\nworker_binary = " +
                BinaryPath("eps-worker") + "\n");
  LocalJob job(dir.path(), config,
               {"--data.train=" + dir.Join("data/train"), "--data.eval=" + dir.Join("data/eval")});
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/0).ok()) << job.Logs();
  // A few progress samples for the chart.
  ASSERT_TRUE(job.WaitForStatus([](const json& status) { return status["history"].size() >= 3; }))
      << job.Logs();

  // Virtual time lets the page fetch /status and re-render twice.
  StatusOr<std::unique_ptr<Process>> browser =
      Process::Start({chromium, "--headless", "--no-sandbox", "--disable-gpu",
                      "--enable-logging=stderr", "--user-data-dir=" + dir.Join("chromium-profile"),
                      "--virtual-time-budget=5000", "--dump-dom", job.http() + "/"},
                     dir.Join("chromium.log"));
  ASSERT_TRUE(browser.ok()) << browser.status();
  ASSERT_EQ((*browser)->Wait(absl::Seconds(90)), 0) << (*browser)->Log();
  const std::string output = (*browser)->Log();
  const size_t html = output.find("<html");
  ASSERT_NE(html, std::string::npos) << output << job.Logs();
  const std::string dom = output.substr(html);

  EXPECT_GE(Attribute(dom, "data-rendered"), 2) << dom;
  EXPECT_GE(Attribute(dom, "data-points"), 3) << dom;
  EXPECT_FALSE(absl::StrContains(dom, "data-error")) << dom;
  // Chromium logs a page's uncaught errors and console errors.
  EXPECT_FALSE(absl::StrContains(output, "Uncaught")) << output;
  EXPECT_FALSE(absl::StrContains(output, ":ERROR:CONSOLE")) << output;
  // The job name is text, not markup.
  EXPECT_TRUE(absl::StrContains(dom, "&lt;page &amp; test&gt;")) << dom;
  EXPECT_TRUE(absl::StrContains(dom, "<td class=\"alive\">alive</td>")) << dom;
  EXPECT_TRUE(absl::StrContains(dom, "state running")) << dom;
  // The autoscaler's section: shown, with the signal and the size.
  EXPECT_TRUE(absl::StrContains(dom, "<div id=\"autoscale-section\"><h2>Autoscaler</h2>")) << dom;
  EXPECT_TRUE(absl::StrContains(dom, "command · local")) << dom;
  EXPECT_TRUE(absl::StrContains(dom, "1/1 (1 to 1)")) << dom;
}

}  // namespace
}  // namespace eps::testing
