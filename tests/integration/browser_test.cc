// The master's page (GET /) in headless Chromium (Debian's chromium),
// against a running job: it renders the job's workers, servers and history
// chart from /status with no script error. Skips when chromium is absent
// (`scripts/test.sh -L browser` installs it).

#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <vector>

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

// Skips the test when Chromium is absent.
#define SKIP_WITHOUT_CHROMIUM()                                                     \
  if (!std::filesystem::exists(kChromium)) {                                        \
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium, or run " \
                    "scripts/test.sh -L browser)";                                  \
  }

constexpr char kChromium[] = "/usr/bin/chromium";

// Writes a job of `extra` options and `epochs` over 60,000 generated records,
// starts it with `workers` and one server, and waits for a few progress
// samples for the chart.
void StartJob(const TempDir& dir, const std::string& extra, int workers,
              std::unique_ptr<LocalJob>* job) {
  ASSERT_TRUE(GenerateData(dir.Join("data"), 60000, /*seed=*/4, /*files=*/1).ok());
  const std::string config = dir.Join("job.ini");
  WriteFile(config,
            // Epochs enough to outlive Chromium however slowly it starts
            // (in CI it once took so long that the job had finished).
            "[job]\nname = <page & test>\nprogress_interval_s = 1\nepochs = 100\n"
            "[data]\nshard_records = 5000\n"
            "[ps]\nnum_servers = 1\npartitions = 8\n"
            "[worker]\nbatch_size = 512\nmax_records_per_s = 2000\n"
            "[master]\nheartbeat_ms = 200\nlease_ms = 1000\n" + extra);
  *job = std::make_unique<LocalJob>(
      dir.path(), config,
      std::vector<std::string>{"--data.train=" + dir.Join("data/train"),
                               "--data.eval=" + dir.Join("data/eval")});
  ASSERT_TRUE((*job)->Start(/*servers=*/1, workers).ok()) << (*job)->Logs();
  ASSERT_TRUE(
      (*job)->WaitForStatus([](const json& status) { return status["history"].size() >= 3; }))
      << (*job)->Logs();
}

// The page as Chromium renders it (the DOM after its scripts ran), after
// checking that it rendered /status twice with no script error and no
// value left undefined. Chromium's own log goes to `*log`.
void RenderPage(const TempDir& dir, LocalJob& job, std::string* dom, std::string* log) {
  // Virtual time lets the page fetch /status and re-render twice.
  StatusOr<std::unique_ptr<Process>> browser =
      Process::Start({kChromium, "--headless", "--no-sandbox", "--disable-gpu",
                      "--enable-logging=stderr", "--user-data-dir=" + dir.Join("chromium-profile"),
                      "--virtual-time-budget=5000", "--dump-dom", job.http() + "/"},
                     dir.Join("chromium.log"));
  ASSERT_TRUE(browser.ok()) << browser.status();
  ASSERT_EQ((*browser)->Wait(absl::Seconds(90)), 0) << (*browser)->Log();
  *log = (*browser)->Log();
  const size_t html = log->find("<html");
  ASSERT_NE(html, std::string::npos) << *log << job.Logs();
  *dom = log->substr(html);
  // The page's own script is not what it shows.
  const size_t script = dom->find("<script>"), script_end = dom->find("</script>");
  ASSERT_TRUE(script != std::string::npos && script_end != std::string::npos) << *dom;
  dom->erase(script, script_end - script);

  EXPECT_GE(Attribute(*dom, "data-rendered"), 2) << *dom;
  EXPECT_GE(Attribute(*dom, "data-points"), 3) << *dom;
  EXPECT_FALSE(absl::StrContains(*dom, "data-error")) << *dom;
  // Chromium logs a page's uncaught errors and console errors.
  EXPECT_FALSE(absl::StrContains(*log, "Uncaught")) << *log;
  EXPECT_FALSE(absl::StrContains(*log, ":ERROR:CONSOLE")) << *log;
  // Nothing the page shows is a value /status left out.
  EXPECT_FALSE(absl::StrContains(*dom, "undefined")) << *dom;
  EXPECT_FALSE(absl::StrContains(*dom, "NaN")) << *dom;
  // The job name is text, not markup.
  EXPECT_TRUE(absl::StrContains(*dom, "&lt;page &amp; test&gt;")) << *dom;
  EXPECT_TRUE(absl::StrContains(*dom, "<td class=\"alive\">alive</td>")) << *dom;
  EXPECT_TRUE(absl::StrContains(*dom, "state running")) << *dom;
}

TEST(Browser, StatusPageRendersWithoutErrors) {
  SKIP_WITHOUT_CHROMIUM();
  TempDir dir;
  std::unique_ptr<LocalJob> job;
  // The autoscaler starts the worker, and the page shows it.
  ASSERT_NO_FATAL_FAILURE(StartJob(dir,
                                   "[autoscale]\nsource = command\ncommand = echo 3 1\n"
                                   "interval_s = 1\nmin_workers = 1\nmax_workers = 1\n"
                                   "worker_binary = " + BinaryPath("eps-worker") + "\n",
                                   /*workers=*/0, &job));
  std::string dom, log;
  ASSERT_NO_FATAL_FAILURE(RenderPage(dir, *job, &dom, &log));
  // The autoscaler's section: shown, with the signal and the size.
  EXPECT_TRUE(absl::StrContains(dom, "<div id=\"autoscale-section\"><h2>Autoscaler</h2>")) << dom;
  EXPECT_TRUE(absl::StrContains(dom, "command · local")) << dom;
  EXPECT_TRUE(absl::StrContains(dom, "1/1 (1 to 1)")) << dom;
}

// A feature that is off reads as off: with no autoscaler, its section says
// so, and nothing on the page is undefined.
TEST(Browser, AFeatureThatIsOffReadsAsOff) {
  SKIP_WITHOUT_CHROMIUM();
  TempDir dir;
  std::unique_ptr<LocalJob> job;
  ASSERT_NO_FATAL_FAILURE(StartJob(dir, "", /*workers=*/1, &job));
  std::string dom, log;
  ASSERT_NO_FATAL_FAILURE(RenderPage(dir, *job, &dom, &log));
  EXPECT_TRUE(absl::StrContains(dom, "autoscaler: <b>off (autoscale.source = none)</b>")) << dom;
  EXPECT_FALSE(absl::StrContains(dom, "source · launcher")) << dom;
  // No partition moved: the line says so, with no "undefined" in it.
  EXPECT_TRUE(absl::StrContains(
      dom, "partition moves: <b>0 done, 0 failed, 0 queued; 0 rows, longest unavailable 0 ms</b>"))
      << dom;
  EXPECT_FALSE(absl::StrContains(dom, "undefined")) << dom;
}

}  // namespace
}  // namespace eps::testing
