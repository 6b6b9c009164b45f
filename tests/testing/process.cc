#include "tests/testing/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "rpc/security.h"

namespace eps::testing {

StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv,
                                                  const std::string& log_path,
                                                  const std::vector<std::string>& env) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));
  }
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> variables = env;  // putenv keeps the pointers
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(log);
    return absl::UnavailableError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    // Die with the test if it dies, and start with no signal blocked.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (std::string& variable : variables) putenv(variable.data());
    execv(args[0], args.data());
    _exit(127);
  }
  ::close(log);
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() {
  if (!exit_code_.has_value()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

void Process::Signal(int signal) {
  if (!exit_code_.has_value()) ::kill(pid_, signal);
}

std::optional<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exit_code_.has_value()) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return exit_code_;
}

bool Process::Running() { return !Wait(absl::ZeroDuration()).has_value(); }

std::optional<uint64_t> Process::PeakResidentBytes() const { return StatusBytes("VmHWM:"); }

std::optional<uint64_t> Process::ResidentBytes() const { return StatusBytes("VmRSS:"); }

std::optional<uint64_t> Process::StatusBytes(const std::string& field) const {
  std::optional<uint64_t> kib = StatusField(field);
  if (!kib.has_value()) return std::nullopt;
  return *kib * 1024;
}

std::optional<uint64_t> Process::StatusField(const std::string& field) const {
  if (exit_code_.has_value()) return std::nullopt;
  std::istringstream status(ReadFile(absl::StrCat("/proc/", pid_, "/status")));
  std::string line;
  while (std::getline(status, line)) {
    // "VmHWM:\t   12345 kB"; a zombie has no such line.
    if (line.rfind(field, 0) != 0) continue;
    std::istringstream fields(line.substr(field.size()));
    uint64_t value = 0;
    if (fields >> value) return value;
  }
  return std::nullopt;
}

std::string Process::Log() const { return ReadFile(log_path_); }

std::string BinaryPath(const std::string& name) { return absl::StrCat(EPS_BIN_DIR, "/", name); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

Status GenerateData(const std::string& out, int rows, int seed, int files,
                    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {BinaryPath("eps-datagen"), "--rows", std::to_string(rows),
                                   "--out", out, "--seed", std::to_string(seed), "--files",
                                   std::to_string(files)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  ASSIGN_OR_RETURN(std::unique_ptr<Process> datagen, Process::Start(argv, out + ".log"));
  std::optional<int> code = datagen->Wait(absl::Seconds(120));
  if (code != 0) return absl::InternalError(absl::StrCat("eps-datagen failed: ", datagen->Log()));
  return absl::OkStatus();
}

uint64_t CountLines(const std::string& dir) {
  uint64_t lines = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string text = ReadFile(entry.path().string());
    lines += static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
  }
  return lines;
}

std::string WriteFaultJobConfig(const std::string& dir, const std::string& name,
                                const std::string& extra) {
  const std::string path = dir + "/job.ini";
  WriteFile(path, absl::StrCat("[job]\n"
                               "name = ", name, "\n"
                               "epochs = 1\n"
                               "progress_interval_s = 1\n"
                               "[data]\n"
                               "shard_records = 10000\n"
                               "[ps]\n"
                               "num_servers = 2\n"
                               "partitions = 16\n"
                               "master_wait_s = 60\n"
                               "rpc_timeout_ms = 2000\n"
                               "[worker]\n"
                               "batch_size = 1024\n"
                               "master_wait_s = 60\n"
                               "rpc_timeout_ms = 2000\n"
                               "rpc_attempts = 2\n"
                               "max_records_per_s = 20000\n"
                               "[master]\n"
                               "heartbeat_ms = 200\n"
                               "lease_ms = 2000\n"
                               "[checkpoint]\n"
                               "interval_s = 1\n"
                               "keep = 2\n",
                               extra));
  return path;
}

std::vector<nlohmann::json> ReadEvents(const std::string& master_dir) {
  std::vector<nlohmann::json> events;
  std::istringstream in(ReadFile(master_dir + "/events.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json event = nlohmann::json::parse(line, nullptr, false);
    if (!event.is_discarded()) events.push_back(std::move(event));
  }
  return events;
}

std::vector<nlohmann::json> EventsNamed(const std::vector<nlohmann::json>& events,
                                        const std::string& name) {
  std::vector<nlohmann::json> named;
  for (const nlohmann::json& event : events) {
    if (event["event"] == name) named.push_back(event);
  }
  return named;
}

void ExpectEveryEpochExactlyOnce(const nlohmann::json& final_status, uint64_t lines) {
  EXPECT_EQ(final_status["state"], "finished");
  ASSERT_FALSE(final_status["ledger"].empty()) << final_status.dump();
  for (const nlohmann::json& entry : final_status["ledger"]) {
    EXPECT_TRUE(entry["exactly_once"].get<bool>()) << entry.dump();
    EXPECT_EQ(entry["records_committed"].get<uint64_t>(), lines) << entry.dump();
  }
}

void ExpectFinishedExactlyOnce(LocalJob& job, absl::Duration timeout, uint64_t lines,
                               nlohmann::json* final_status) {
  StatusOr<int> exit = job.WaitForMaster(timeout);
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_EQ(*exit, 0) << job.Logs();
  StatusOr<nlohmann::json> status = job.FinalStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_NO_FATAL_FAILURE(ExpectEveryEpochExactlyOnce(*status, lines));
  if (final_status != nullptr) *final_status = *std::move(status);
}

std::pair<std::optional<int>, std::string> PlotRun(const std::string& master_dir,
                                                   const std::string& png) {
  const std::string log = png + ".log";
  StatusOr<std::unique_ptr<Process>> plot = Process::Start(
      {"/usr/bin/python3", std::string(EPS_SOURCE_DIR) + "/scripts/plot_run.py", master_dir,
       "--out", png},
      log);
  if (!plot.ok()) return {std::nullopt, std::string(plot.status().message())};
  const std::optional<int> code = (*plot)->Wait(absl::Seconds(120));
  return {code, (*plot)->Log()};
}

int AliveWorkers(const nlohmann::json& status, bool trained) {
  int alive = 0;
  for (const nlohmann::json& worker : status["workers"]) {
    alive += worker["state"] == "alive" && (!trained || worker["records"].get<uint64_t>() > 0);
  }
  return alive;
}

std::unique_ptr<SocketFactory> FactoryWithJobKeys(const std::string& keys_dir, proto::Role role) {
  JobConfig::Security config;
  config.keys_dir = keys_dir;
  StatusOr<SecurityOptions> security = LoadSecurity(config, role);
  EXPECT_TRUE(security.ok()) << security.status();
  TransportOptions transport;
  if (security.ok()) transport.security = *std::move(security);
  return std::make_unique<SocketFactory>(transport);
}

proto::NodeId WorkerOfJob(const std::string& keys_dir, uint32_t id) {
  proto::NodeId worker;
  worker.set_role(proto::ROLE_WORKER);
  worker.set_id(id);
  JobConfig::Security config;
  config.keys_dir = keys_dir;
  StatusOr<SecurityOptions> master = LoadSecurity(config, proto::ROLE_MASTER);
  EXPECT_TRUE(master.ok()) << master.status();
  if (!master.ok()) return worker;
  StatusOr<WorkerCredentials> credentials = WorkerCredentials::ForMaster(*master);
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  if (credentials.ok()) worker.set_credential(credentials->Issue(id));
  return worker;
}

std::string JobKeysFlag(const std::string& keys_dir) {
  if (Status keys = WriteJobKeys(keys_dir); !keys.ok() && !absl::IsAlreadyExists(keys)) {
    ADD_FAILURE() << "cannot make the job's keys: " << keys;
  }
  return "--security.keys_dir=" + keys_dir;
}

LocalJob::LocalJob(std::string dir, std::string config, std::vector<std::string> overrides,
                   absl::Duration deadline)
    : job_deadline_(deadline),
      dir_(std::move(dir)),
      config_(std::move(config)),
      overrides_(std::move(overrides)),
      master_dir_(dir_ + "/master") {
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  // Every job runs as users run it, with CURVE and its own keys, unless the
  // test chose its [security] itself.
  const bool chosen =
      absl::c_any_of(overrides_, [](const std::string& o) {
        return absl::StartsWith(o, "--security.");
      }) ||
      absl::c_any_of(absl::StrSplit(ReadFile(config_), '\n'),
                     [](absl::string_view line) {
                       return absl::StartsWith(absl::StripLeadingAsciiWhitespace(line),
                                               "[security]");
                     });
  if (chosen) return;
  keys_dir_ = dir_ + "/keys";
  overrides_.push_back(JobKeysFlag(keys_dir_));
}

LocalJob::~LocalJob() = default;

std::string LocalJob::HttpToken() const {
  if (keys_dir_.empty()) return "";
  const std::string token = ReadFile(keys_dir_ + "/http_token");
  return token.substr(0, token.find('\n'));
}

std::vector<std::string> LocalJob::CommonArgs() const {
  std::vector<std::string> args = {"--config", config_};
  args.insert(args.end(), overrides_.begin(), overrides_.end());
  return args;
}

Status LocalJob::StartMaster(absl::Duration timeout) { return LaunchMaster("0", "0", timeout); }

Status LocalJob::RestartMaster(absl::Duration timeout, const std::vector<std::string>& extra) {
  const std::string rpc_port = endpoint_.substr(endpoint_.rfind(':') + 1);
  const std::string http_port = http_.substr(http_.rfind(':') + 1);
  std::error_code error;
  std::filesystem::remove(master_dir_ + "/master.json", error);
  return LaunchMaster(rpc_port, http_port, timeout, extra);
}

Status LocalJob::LaunchMaster(const std::string& port, const std::string& http_port,
                              absl::Duration timeout, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {BinaryPath("eps-master"), "--port", port, "--http-port",
                                   http_port, "--data-dir", master_dir_};
  argv.insert(argv.end(), extra.begin(), extra.end());
  for (const std::string& arg : CommonArgs()) argv.push_back(arg);
  if (master_starts_ == 0) deadline_ = absl::Now() + job_deadline_;
  const std::string log = master_starts_++ == 0
                              ? dir_ + "/master.log"
                              : absl::StrCat(dir_, "/master-", master_starts_, ".log");
  ASSIGN_OR_RETURN(master_, Process::Start(argv, log));
  const absl::Time deadline = absl::Now() + timeout;
  const std::string endpoints = master_dir_ + "/master.json";
  while (absl::Now() < deadline) {
    if (std::filesystem::exists(endpoints)) {
      nlohmann::json doc = nlohmann::json::parse(ReadFile(endpoints), nullptr, false);
      if (!doc.is_discarded()) {
        endpoint_ = doc["rpc"];
        http_ = doc["http"];
        return absl::OkStatus();
      }
    }
    if (!master_->Running()) {
      return absl::UnavailableError(absl::StrCat("master exited: ", master_->Log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("master did not write master.json in time");
}

Status LocalJob::Start(int servers, int workers) {
  RETURN_IF_ERROR(StartMaster());
  for (int i = 0; i < servers; ++i) RETURN_IF_ERROR(StartServer().status());
  for (int i = 0; i < workers; ++i) RETURN_IF_ERROR(StartWorker().status());
  return absl::OkStatus();
}

std::string LocalJob::server_dir(size_t index) const {
  return absl::StrCat(dir_, "/server-", index);
}

StatusOr<size_t> LocalJob::StartServer(const std::string& data_dir) {
  const size_t index = servers_.size();
  std::vector<std::string> argv = {BinaryPath("eps-server"), "--master", endpoint_, "--data-dir",
                                   data_dir.empty() ? server_dir(index) : data_dir};
  for (const std::string& arg : CommonArgs()) argv.push_back(arg);
  std::vector<std::string> env;
  if (!keys_dir_.empty()) env.push_back(absl::StrCat("EPS_LAUNCH_SECRET_FILE=", keys_dir_, "/http_token"));
  ASSIGN_OR_RETURN(auto process,
                   Process::Start(argv, absl::StrCat(dir_, "/server-", index, ".log"), env));
  servers_.push_back(std::move(process));
  return index;
}

StatusOr<size_t> LocalJob::StartWorker() {
  const size_t index = workers_.size();
  std::vector<std::string> argv = {BinaryPath("eps-worker"), "--master", endpoint_, "--device",
                                   "cpu"};
  for (const std::string& arg : CommonArgs()) argv.push_back(arg);
  ASSIGN_OR_RETURN(auto process, Process::Start(argv, absl::StrCat(dir_, "/worker-", index, ".log")));
  workers_.push_back(std::move(process));
  return index;
}

StatusOr<int> LocalJob::WaitForMaster(absl::Duration timeout) {
  const absl::Time until = std::min(absl::Now() + timeout, deadline_);
  std::optional<int> code = master_->Wait(std::max(absl::ZeroDuration(), until - absl::Now()));
  if (code.has_value()) return *code;
  const std::string what = absl::StrCat("the master did not exit ", RanOut(until, timeout));
  RecordFailure(what);
  return absl::DeadlineExceededError(what);
}

// The stacks of every thread of `process`, when gdb is there to read them
// (for a process that does not exit: where it waits); empty otherwise.
static std::string ThreadStacks(const std::string& dir, const std::string& name,
                                Process& process) {
  if (!std::filesystem::exists("/usr/bin/gdb")) return "";
  const std::string log = absl::StrCat(dir, "/", name, ".stacks");
  StatusOr<std::unique_ptr<Process>> gdb = Process::Start(
      {"/usr/bin/gdb", "-p", std::to_string(process.pid()), "-batch", "-nx", "-ex",
       "thread apply all bt"},
      log);
  if (!gdb.ok() || !(*gdb)->Wait(absl::Seconds(60)).has_value()) return "";
  std::string stacks = (*gdb)->Log();
  if (stacks.size() > 20000) stacks = stacks.substr(0, 20000) + "...";
  return absl::StrCat("\n---- ", name, "'s threads (gdb) ----\n", stacks);
}

std::vector<std::optional<int>> LocalJob::WaitForOthers(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::optional<int>> codes;
  std::vector<std::string> running;
  std::string stacks;
  for (auto* group : {&servers_, &workers_}) {
    for (size_t i = 0; i < group->size(); ++i) {
      codes.push_back((*group)[i]->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now())));
      if (!codes.back().has_value()) {
        running.push_back(absl::StrCat(group == &servers_ ? "server-" : "worker-", i));
        absl::StrAppend(&stacks, ThreadStacks(dir_, running.back(), *(*group)[i]));
      }
    }
  }
  if (!running.empty()) {
    RecordFailure(absl::StrCat(absl::StrJoin(running, ", "), " still running ",
                               absl::FormatDuration(timeout), " after the wait began", stacks));
  }
  return codes;
}

StatusOr<nlohmann::json> LocalJob::FinalStatus() const {
  const std::string path = master_dir_ + "/final_status.json";
  if (!std::filesystem::exists(path)) return absl::NotFoundError(path + " is missing");
  nlohmann::json doc = nlohmann::json::parse(ReadFile(path), nullptr, false);
  if (doc.is_discarded()) return absl::DataLossError(path + " is not JSON");
  return doc;
}

StatusOr<nlohmann::json> LocalJob::LiveStatus() const {
  httplib::Client client(http_);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/status");
  if (!result || result->status != 200) return absl::UnavailableError("GET /status failed");
  nlohmann::json doc = nlohmann::json::parse(result->body, nullptr, false);
  if (doc.is_discarded()) return absl::DataLossError("/status is not JSON");
  return doc;
}

bool LocalJob::WaitForStatus(const std::function<bool(const nlohmann::json&)>& condition,
                             absl::Duration timeout) const {
  const absl::Time until = std::min(absl::Now() + timeout, deadline_);
  std::optional<nlohmann::json> last;
  while (absl::Now() < until) {
    StatusOr<nlohmann::json> status = LiveStatus();
    if (status.ok()) {
      if (condition(*status)) return true;
      last = *std::move(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string what =
      absl::StrCat("/status did not reach the condition ", RanOut(until, timeout));
  RecordFailure(what, last.has_value() ? absl::StrCat("the last seen: ", last->dump())
                                       : std::string("none answered"));
  return false;
}

std::string LocalJob::RanOut(absl::Time until, absl::Duration timeout) const {
  if (until < deadline_) return absl::StrCat("within ", absl::FormatDuration(timeout));
  return absl::StrCat("by the job's deadline (", absl::FormatDuration(job_deadline_),
                      " after its first start)");
}

void LocalJob::RecordFailure(const std::string& what) const {
  if (http_.empty()) return RecordFailure(what, "the master never wrote its endpoints");
  StatusOr<nlohmann::json> live = LiveStatus();
  RecordFailure(what, live.ok()
                          ? live->dump()
                          : absl::StrCat("no answer from ", http_, ": ", live.status().ToString()));
}

void LocalJob::RecordFailure(const std::string& what, const std::string& status) const {
  ADD_FAILURE() << what << "\nthe master's /status: " << status << "\n" << Logs();
}

std::string LocalJob::Logs() const {
  std::string out;
  auto tail = [&out](const std::string& name, const Process& process) {
    std::string log = process.Log();
    if (log.size() > 3000) log = "..." + log.substr(log.size() - 3000);
    absl::StrAppend(&out, "---- ", name, " ----\n", log, "\n");
  };
  if (master_) tail("master", *master_);
  for (size_t i = 0; i < servers_.size(); ++i) tail(absl::StrCat("server-", i), *servers_[i]);
  for (size_t i = 0; i < workers_.size(); ++i) tail(absl::StrCat("worker-", i), *workers_[i]);
  return out;
}

}  // namespace eps::testing
