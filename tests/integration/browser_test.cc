// The master's page (GET /) in headless Chromium (Debian's chromium): its
// script parses on its own, and against a running job with every kind of
// state /status reports (a partition move, a checkpoint, an autoscaler, a
// fenced worker) it renders each section's values with nothing written to
// the console. Skips visibly when chromium is absent (scripts/test.sh
// installs it).

#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "master/http/status_page.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;

constexpr char kChromium[] = "/usr/bin/chromium";
// What the page shows for a value /status left null or out.
constexpr char kNoValue[] = "–";

// Skips the test when Chromium is absent.
#define SKIP_WITHOUT_CHROMIUM()                                                     \
  if (!std::filesystem::exists(kChromium)) {                                        \
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium, or run " \
                    "scripts/test.sh, which installs it)";                          \
  }

// The value of attribute `name` in `dom`, or -1.
int Attribute(const std::string& dom, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(dom, match, std::regex(name + "=\"([0-9]+)\""))) return -1;
  return std::stoi(match[1]);
}

// Loads `url` in headless Chromium and lets the page run `budget_ms` of
// virtual time. Returns Chromium's log (its stderr, then the DOM after the
// page's scripts ran).
std::string LoadPage(const TempDir& dir, const std::string& url, int budget_ms) {
  StatusOr<std::unique_ptr<Process>> browser = Process::Start(
      {kChromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
       "--user-data-dir=" + dir.Join("chromium-profile"),
       absl::StrCat("--virtual-time-budget=", budget_ms), "--dump-dom", url},
      dir.Join("chromium.log"));
  EXPECT_TRUE(browser.ok()) << browser.status();
  if (!browser.ok()) return "";
  EXPECT_EQ((*browser)->Wait(absl::Seconds(90)), 0) << (*browser)->Log();
  return (*browser)->Log();
}

// Every message a script of `page` wrote to the console, as a failure
// would name it: the script's line, its text and the message. Chromium logs
// every level (errors, uncaught exceptions, warnings) as
// `INFO:CONSOLE:LINE] "text", source: URL (LINE)`; the page writes none by
// design, so any is a defect.
std::vector<std::string> ConsoleMessages(const std::string& log, const std::string& page) {
  const std::vector<std::string> page_lines = absl::StrSplit(page, '\n');
  int script_start = 0;  // the page line (1-based) of "<script>"
  for (size_t i = 0; i < page_lines.size(); ++i) {
    if (absl::StartsWith(page_lines[i], "<script>")) script_start = static_cast<int>(i) + 1;
  }
  static const std::regex kConsole(R"re(:CONSOLE[:(](\d+)\)?\] "(.*)", source: (.*) \((\d+)\))re");
  std::vector<std::string> messages;
  for (absl::string_view piece : absl::StrSplit(log, '\n')) {
    const std::string line(piece);
    std::smatch match;
    if (!std::regex_search(line, match, kConsole)) continue;
    const int at = std::stoi(match[1]);
    const std::string text = at >= 1 && at <= static_cast<int>(page_lines.size())
                                 ? page_lines[at - 1]
                                 : "(not a line of the page)";
    messages.push_back(absl::StrCat("the status page's script, line ", at - script_start,
                                    " (page line ", at, ": `", text,
                                    "`), wrote to the console: ", match[2].str()));
  }
  return messages;
}

void ExpectNoConsoleMessages(const std::string& log, const std::string& page) {
  for (const std::string& message : ConsoleMessages(log, page)) ADD_FAILURE() << message;
}

// The DOM in `log` (what --dump-dom printed), without the page's own script.
std::string DomOf(const std::string& log) {
  const size_t html = log.find("<html");
  if (html == std::string::npos) return "";
  std::string dom = log.substr(html);
  const size_t script = dom.find("<script>"), script_end = dom.find("</script>");
  if (script != std::string::npos && script_end != std::string::npos) {
    dom.erase(script, script_end - script);
  }
  return dom;
}

// The element with id `id` in `dom`, up to its closing `tag`.
std::string Element(const std::string& dom, const std::string& tag, const std::string& id) {
  const size_t named = dom.find(" id=\"" + id + "\"");
  if (named == std::string::npos) return "";
  const size_t start = dom.rfind("<" + tag, named);
  if (start == std::string::npos) return "";
  const size_t end = dom.find("</" + tag + ">", start);
  return dom.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The "key: value" pairs of a section (`<span>key: <b>value</b></span>`).
std::map<std::string, std::string> Pairs(const std::string& section) {
  std::map<std::string, std::string> pairs;
  static const std::regex kPair(R"(<span>([^<]+?): <b>([^<]*)</b></span>)");
  for (std::sregex_iterator it(section.begin(), section.end(), kPair), end; it != end; ++it) {
    pairs[(*it)[1]] = (*it)[2];
  }
  return pairs;
}

// The syntax of the page's script on its own, with no job: a page whose
// script does not parse runs none of it and stays at "loading", and the
// failure names the script's line. (The page's fetch is stubbed on the same
// line as <script>, so the lines Chromium names are the page's own.)
TEST(Browser, TheScriptParses) {
  SKIP_WITHOUT_CHROMIUM();
  TempDir dir;
  const std::string page = StatusPage("syntax check");
  std::string stubbed = page;
  const size_t script = stubbed.find("<script>\n");
  ASSERT_NE(script, std::string::npos) << page;
  stubbed.insert(script, "<script>window.fetch = () => new Promise(() => {});</script>");
  WriteFile(dir.Join("page.html"), stubbed);
  const std::string log = LoadPage(dir, "file://" + dir.Join("page.html"), 1000);
  ExpectNoConsoleMessages(log, page);
  const std::string dom = DomOf(log);
  ASSERT_FALSE(dom.empty()) << log;
  EXPECT_FALSE(absl::StrContains(dom, "data-error")) << dom;
}

// The test sees what it is for: a script error (here a value declared
// twice, the regression this test was written after) is reported with the
// script's line and text.
TEST(Browser, AScriptErrorIsNamedWithItsLine) {
  SKIP_WITHOUT_CHROMIUM();
  TempDir dir;
  std::string page = StatusPage("syntax check");
  const size_t script = page.find("<script>\n");
  ASSERT_NE(script, std::string::npos) << page;
  page.insert(script + 9, "\"use strict\";\nconst twice = 1;\nconst twice = 2;\n");
  WriteFile(dir.Join("page.html"), page);
  const std::vector<std::string> messages =
      ConsoleMessages(LoadPage(dir, "file://" + dir.Join("page.html"), 1000), page);
  ASSERT_EQ(messages.size(), 1u) << absl::StrJoin(messages, "\n");
  EXPECT_TRUE(absl::StrContains(messages[0], "script, line 3 ")) << messages[0];
  EXPECT_TRUE(absl::StrContains(messages[0], "`const twice = 2;`")) << messages[0];
  EXPECT_TRUE(absl::StrContains(messages[0], "Identifier 'twice' has already been declared"))
      << messages[0];
}

// Writes a job of `extra` options over `records` generated records with
// `servers` servers and `workers` workers started here (the autoscaler may
// start more), and waits for a few progress samples for the chart.
void StartJob(const TempDir& dir, const std::string& extra, int records, int servers,
              int workers, std::unique_ptr<LocalJob>* job) {
  ASSERT_TRUE(GenerateData(dir.Join("data"), records, /*seed=*/4, /*files=*/1).ok());
  const std::string config = dir.Join("job.ini");
  WriteFile(config,
            // Epochs enough to outlive Chromium however slowly it starts
            // (in CI it once took so long that the job had finished).
            "[job]\nname = <page & test>\nprogress_interval_s = 1\nepochs = 100\n"
            "[data]\nshard_records = 2000\n"
            "[ps]\npartitions = 8\n"
            "[worker]\nbatch_size = 512\nmax_records_per_s = 2000\n"
            "[master]\nheartbeat_ms = 200\nlease_ms = 1000\n" + extra);
  *job = std::make_unique<LocalJob>(
      dir.path(), config,
      std::vector<std::string>{"--data.train=" + dir.Join("data/train"),
                               "--data.eval=" + dir.Join("data/eval")},
      absl::Minutes(4));
  ASSERT_TRUE((*job)->Start(servers, workers).ok()) << (*job)->Logs();
  ASSERT_TRUE(
      (*job)->WaitForStatus([](const json& status) { return status["history"].size() >= 3; }))
      << (*job)->Logs();
}

// The page as Chromium renders it from the job (the DOM after its scripts
// ran), after checking that it rendered /status twice with nothing written
// to the console and no value left undefined.
void RenderPage(const TempDir& dir, LocalJob& job, std::string* dom) {
  // Virtual time lets the page fetch /status and re-render twice.
  const std::string log = LoadPage(dir, job.http() + "/", 5000);
  *dom = DomOf(log);
  ASSERT_FALSE(dom->empty()) << log << job.Logs();
  ExpectNoConsoleMessages(log, StatusPage("<page & test>"));
  EXPECT_GE(Attribute(*dom, "data-rendered"), 2) << *dom;
  EXPECT_GE(Attribute(*dom, "data-points"), 3) << *dom;
  EXPECT_FALSE(absl::StrContains(*dom, "data-error")) << *dom;
  // Nothing the page shows is a value /status left out.
  EXPECT_FALSE(absl::StrContains(*dom, "undefined")) << *dom;
  EXPECT_FALSE(absl::StrContains(*dom, "NaN")) << *dom;
  // The job name is text, not markup.
  EXPECT_TRUE(absl::StrContains(*dom, "&lt;page &amp; test&gt;")) << *dom;
  EXPECT_TRUE(absl::StrContains(*dom, "<td class=\"alive\">alive</td>")) << *dom;
  EXPECT_TRUE(absl::StrContains(*dom, "state running")) << *dom;
}

// Every section that reads /status shows its values: a job with two
// servers (one drained: partition moves), checkpoints, an autoscaler that
// started the workers, and a worker fenced for making no progress. A "–"
// where /status had the value (before and after the render) is a field the
// page reads under a wrong name.
TEST(Browser, EverySectionShowsWhatStatusHas) {
  SKIP_WITHOUT_CHROMIUM();
  TempDir dir;
  std::unique_ptr<LocalJob> job;
  // The autoscaler's first worker (id 0) hangs after its first batch; the
  // master fences it after master.progress_timeout_s and the autoscaler
  // starts another.
  ::setenv("EPS_FAILPOINTS", "worker.hang_trainer=0", 1);
  StartJob(dir,
           "[checkpoint]\ninterval_s = 1\n"
           "[autoscale]\nsource = command\ncommand = echo 3 1\n"
           "interval_s = 1\nmin_workers = 1\nmax_workers = 1\n"
           "worker_binary = " + BinaryPath("eps-worker") + "\n",
           /*records=*/12000, /*servers=*/2, /*workers=*/0, &job);
  ::unsetenv("EPS_FAILPOINTS");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(job->WaitForStatus([](const json& s) {
    return s["phase"] == "training" && s["workers_fenced"].get<int>() >= 1;
  })) << job->Logs();
  {
    httplib::Client client(job->http());
    client.set_read_timeout(30);
    client.set_bearer_token_auth(job->HttpToken().c_str());
    const httplib::Result drained = client.Post("/servers/1/drain");
    ASSERT_TRUE(drained) << job->Logs();
    ASSERT_EQ(drained->status, 200) << drained->body;
  }
  // Every value the page shows exists but the evaluation's (the master
  // evaluates at the job's end): a finished epoch, a checkpoint, finished
  // moves, a fenced worker and its replacement training.
  const auto complete = [](const json& s) {
    bool fenced = false;
    for (const json& w : s["workers"]) fenced = fenced || w["state"] == "fenced";
    return fenced && AliveWorkers(s) >= 1 && s["phase"] == "training" &&
           !s["metrics"]["train_loss"].is_null() &&
           s["checkpoints"]["written"].get<int>() >= 1 && s["moves"]["done"].get<int>() >= 1 &&
           s["moves"]["queued"].get<int>() == 0 && s["moves"]["in_progress"].is_null();
  };
  ASSERT_TRUE(job->WaitForStatus(complete, absl::Seconds(90))) << job->Logs();
  const StatusOr<json> before = job->LiveStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  std::string dom;
  ASSERT_NO_FATAL_FAILURE(RenderPage(dir, *job, &dom));
  const StatusOr<json> after = job->LiveStatus();
  ASSERT_TRUE(after.ok()) << after.status();

  // The summary: a value null in neither /status (the loss so far resets
  // only between epochs, so only within one epoch) shows.
  const std::map<std::string, std::string> summary = Pairs(Element(dom, "div", "summary"));
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"records trained", "/records_trained"},
      {"records/s", "/records_per_s"},
      {"loss (epoch so far)", "/metrics/epoch_loss_so_far"},
      {"train loss (last epoch)", "/metrics/train_loss"},
      {"eval AUC", "/metrics/eval_auc"},
      {"eval log loss", "/metrics/eval_logloss"}};
  const bool same_epoch = (*before)["epoch"] == (*after)["epoch"];
  for (const auto& [label, pointer] : fields) {
    ASSERT_TRUE(summary.count(label)) << label << " is not shown: " << dom;
    const bool known = !(*before)[json::json_pointer(pointer)].is_null() &&
                       !(*after)[json::json_pointer(pointer)].is_null();
    if (known && (label != "loss (epoch so far)" || same_epoch)) {
      EXPECT_NE(summary.at(label), kNoValue) << label << " (" << pointer << ") " << dom;
    }
  }
  EXPECT_NE(summary.at("ETA"), "?") << dom;
  // The tables: /status has every field of every row.
  for (const std::string id : {"workers", "servers"}) {
    const std::string table = Element(dom, "table", id);
    ASSERT_FALSE(table.empty()) << id << ": " << dom;
    EXPECT_FALSE(absl::StrContains(table, absl::StrCat(">", kNoValue, "<"))) << id << ": " << table;
  }
  const std::string workers = Element(dom, "table", "workers");
  EXPECT_TRUE(absl::StrContains(workers, "<td class=\"fenced\">fenced</td>")) << workers;
  EXPECT_TRUE(absl::StrContains(workers, "<td class=\"alive\">alive</td>")) << workers;
  // The drained server left the table; the other holds every partition.
  const std::string servers = Element(dom, "table", "servers");
  EXPECT_TRUE(absl::StrContains(servers, "<td class=\"alive\">alive</td>")) << servers;
  EXPECT_TRUE(absl::StrContains(servers, "<td>8</td>")) << servers;
  // Checkpoints, recovery and moves.
  const std::map<std::string, std::string> state = Pairs(Element(dom, "div", "checkpoints"));
  ASSERT_TRUE(state.count("written") && state.count("last") && state.count("partition moves"))
      << dom;
  EXPECT_NE(state.at("written"), "0") << dom;
  EXPECT_TRUE(absl::StartsWith(state.at("last"), "#")) << dom;
  EXPECT_TRUE(std::regex_search(state.at("partition moves"),
                                std::regex("^[1-9][0-9]* done, 0 failed, 0 queued; [1-9]")))
      << state.at("partition moves");
  for (const auto& [key, value] : state) {
    EXPECT_FALSE(absl::StrContains(value, kNoValue)) << key << ": " << value;
  }
  // The autoscaler: the signal, the size and a decision.
  const std::map<std::string, std::string> autoscale = Pairs(Element(dom, "div", "autoscale"));
  ASSERT_TRUE(autoscale.count("source · launcher")) << dom;
  EXPECT_EQ(autoscale.at("source · launcher"), "command · local") << dom;
  EXPECT_EQ(autoscale.at("workers target/launched"), "1/1 (1 to 1)") << dom;
  EXPECT_NE(autoscale.at("replaced"), "0") << dom;
  for (const auto& [key, value] : autoscale) {
    EXPECT_FALSE(absl::StrContains(value, kNoValue)) << key << ": " << value;
  }
}

// A feature that is off reads as off: with no autoscaler, its section says
// so, and nothing on the page is undefined.
TEST(Browser, AFeatureThatIsOffReadsAsOff) {
  SKIP_WITHOUT_CHROMIUM();
  TempDir dir;
  std::unique_ptr<LocalJob> job;
  ASSERT_NO_FATAL_FAILURE(StartJob(dir, "", /*records=*/60000, /*servers=*/1, /*workers=*/1,
                                   &job));
  std::string dom;
  ASSERT_NO_FATAL_FAILURE(RenderPage(dir, *job, &dom));
  EXPECT_TRUE(absl::StrContains(dom, "autoscaler: <b>off (autoscale.source = none)</b>")) << dom;
  EXPECT_FALSE(absl::StrContains(dom, "source · launcher")) << dom;
  // No partition moved: the line says so, with no "undefined" in it.
  EXPECT_TRUE(absl::StrContains(
      dom, "partition moves: <b>0 done, 0 failed, 0 queued; 0 rows, longest unavailable 0 ms</b>"))
      << dom;
}

}  // namespace
}  // namespace eps::testing
