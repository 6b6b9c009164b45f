#include "master/autoscale/autoscaler.h"

#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/logging.h"
#include "core/subprocess.h"
#include "master/autoscale/slurm.h"
#include "httplib.h"

namespace eps {
namespace {

// 32 random bytes from the kernel, as hex: one launch's secret.
std::string NewLaunchSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else CHECK(errno == EINTR) << "getrandom: " << std::strerror(errno);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

using nlohmann::json;

// How often the fleet is brought to the target between readings: a dead
// worker is replaced within this (plus its back-off).
constexpr absl::Duration kReconcileEvery = absl::Seconds(1);

class CommandSource final : public SignalSource {
 public:
  explicit CommandSource(const JobConfig::Autoscale& options)
      : command_(options.command), timeout_(absl::Seconds(options.source_timeout_s)) {}

  StatusOr<AutoscaleSignal> Read() override {
    ASSIGN_OR_RETURN(CommandResult result, RunShell(command_, timeout_, /*max_output=*/4096));
    if (result.exit_code != 0) {
      return absl::UnavailableError(
          absl::StrCat("autoscale.command failed: ", DescribeFailure(result)));
    }
    StatusOr<AutoscaleSignal> signal = ParseSignalLine(result.out);
    if (!signal.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("autoscale.command: ", signal.status().message()));
    }
    return signal;
  }

 private:
  const std::string command_;
  const absl::Duration timeout_;
};

class PrometheusSource final : public SignalSource {
 public:
  explicit PrometheusSource(const JobConfig::Autoscale& options)
      : url_(options.prometheus_url),
        query_(options.query),
        pending_query_(options.pending_query),
        timeout_(absl::Seconds(options.source_timeout_s)) {}

  StatusOr<AutoscaleSignal> Read() override {
    AutoscaleSignal signal;
    ASSIGN_OR_RETURN(signal.free_gpus, Query(query_));
    if (!pending_query_.empty()) {
      ASSIGN_OR_RETURN(signal.pending_gpus, Query(pending_query_));
    }
    return signal;
  }

 private:
  StatusOr<int64_t> Query(const std::string& query) {
    httplib::Client client(url_);
    const int64_t seconds = absl::ToInt64Seconds(timeout_);
    client.set_connection_timeout(seconds);
    client.set_read_timeout(seconds);
    client.set_write_timeout(seconds);
    const httplib::Params params = {{"query", query}};
    httplib::Result result = client.Get("/api/v1/query", params, httplib::Headers());
    if (!result) {
      return absl::UnavailableError(absl::StrCat("autoscale.prometheus_url ", url_, ": ",
                                                 httplib::to_string(result.error())));
    }
    StatusOr<double> value = ParsePrometheusAnswer(result->body, query);
    if (!value.ok()) {
      return absl::Status(value.status().code(), absl::StrCat(url_, " (HTTP ", result->status,
                                                              "): ", value.status().message()));
    }
    return static_cast<int64_t>(std::floor(std::min(*value, 1e12)));
  }

  const std::string url_;
  const std::string query_;
  const std::string pending_query_;
  const absl::Duration timeout_;
};

// eps-worker processes on this machine, each in its own process group.
class LocalLauncher final : public WorkerLauncher {
 public:
  LocalLauncher(std::string binary, const LauncherContext& context)
      : binary_(std::move(binary)), context_(context) {}

  StatusOr<std::string> Start(uint64_t launch_id, const std::string& secret) override {
    // The environment of a process is readable by its user alone.
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> child,
                     Subprocess::Start({binary_, "--config", context_.worker_config, "--master",
                                        context_.master_endpoint},
                                       {absl::StrCat("EPS_LAUNCH_ID=", launch_id),
                                        absl::StrCat("EPS_LAUNCH_SECRET=", secret)},
                                       context_.LogPath(launch_id)));
    const std::string handle = absl::StrCat("pid ", child->pid());
    children_[launch_id] = std::move(child);
    return handle;
  }

  Status Stop(uint64_t launch_id, const std::string&, bool force) override {
    auto it = children_.find(launch_id);
    if (it == children_.end()) return absl::NotFoundError("no such worker");
    it->second->Signal(force ? SIGKILL : SIGTERM);
    return absl::OkStatus();
  }

  std::vector<std::pair<uint64_t, int>> Exits() override {
    std::vector<std::pair<uint64_t, int>> exits;
    for (auto it = children_.begin(); it != children_.end();) {
      if (std::optional<int> code = it->second->Poll()) {
        if (*code != 0) {
          LOG(WARNING) << "autoscale: worker launch " << it->first << " exited with " << *code
                       << "; its log: " << context_.LogPath(it->first);
        }
        exits.emplace_back(it->first, *code);
        it = children_.erase(it);
      } else {
        ++it;
      }
    }
    return exits;
  }

 private:
  const std::string binary_;
  const LauncherContext context_;
  std::map<uint64_t, std::unique_ptr<Subprocess>> children_;
};

// start_command and stop_command, shell templates.
class CommandLauncher final : public WorkerLauncher {
 public:
  CommandLauncher(const JobConfig::Autoscale& options, const LauncherContext& context)
      : start_(options.start_command),
        stop_(options.stop_command),
        timeout_(absl::Seconds(options.source_timeout_s)),
        context_(context) {}

  StatusOr<std::string> Start(uint64_t launch_id, const std::string& secret) override {
    // Each value one word, whatever it holds (a ';' in a data dir's name).
    const std::string command =
        absl::StrReplaceAll(start_, {{"{id}", ShellQuoted(absl::StrCat(launch_id))},
                                     {"{secret}", ShellQuoted(secret)},
                                     {"{master}", ShellQuoted(context_.master_endpoint)},
                                     {"{config}", ShellQuoted(context_.worker_config)}});
    ASSIGN_OR_RETURN(CommandResult result, RunShell(command, timeout_, /*max_output=*/4096));
    if (result.exit_code != 0) {
      return absl::UnavailableError(
          absl::StrCat("autoscale.start_command failed: ", DescribeFailure(result)));
    }
    // Its first line, e.g. the pod or job it made.
    const std::string handle(
        absl::StripAsciiWhitespace(absl::string_view(result.out).substr(0, result.out.find('\n'))));
    return handle.empty() ? absl::StrCat(launch_id) : handle;
  }

  Status Stop(uint64_t launch_id, const std::string& handle, bool force) override {
    // The handle is what a command printed: one word, never a command.
    const std::string command =
        absl::StrReplaceAll(stop_, {{"{id}", ShellQuoted(absl::StrCat(launch_id))},
                                    {"{handle}", ShellQuoted(handle)},
                                    {"{signal}", force ? "KILL" : "TERM"}});
    ASSIGN_OR_RETURN(CommandResult result, RunShell(command, timeout_, /*max_output=*/4096));
    if (result.exit_code != 0) {
      return absl::UnavailableError(
          absl::StrCat("autoscale.stop_command failed: ", DescribeFailure(result)));
    }
    if (force) forced_.emplace_back(launch_id, -1);
    return absl::OkStatus();
  }

  std::vector<std::pair<uint64_t, int>> Exits() override { return std::exchange(forced_, {}); }
  bool ObservesExits() const override { return false; }

 private:
  const std::string start_;
  const std::string stop_;
  const absl::Duration timeout_;
  const LauncherContext context_;
  std::vector<std::pair<uint64_t, int>> forced_;
};

// The eps-worker next to this eps-master.
std::string WorkerNextToMaster() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "eps-worker";
  return (self.parent_path() / "eps-worker").string();
}

}  // namespace

StatusOr<AutoscaleSignal> ParseSignalLine(absl::string_view output) {
  const absl::string_view line = absl::StripAsciiWhitespace(output.substr(0, output.find('\n')));
  std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
  AutoscaleSignal signal;
  const bool parsed = (fields.size() == 1 || fields.size() == 2) &&
                      absl::SimpleAtoi(fields[0], &signal.free_gpus) && signal.free_gpus >= 0 &&
                      (fields.size() == 1 ||
                       (absl::SimpleAtoi(fields[1], &signal.pending_gpus) &&
                        signal.pending_gpus >= 0));
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected \"FREE_GPUS [PENDING_GPUS]\" (integers >= 0), got ", QuoteOutput(line)));
  }
  return signal;
}

StatusOr<double> ParsePrometheusAnswer(absl::string_view body, absl::string_view query) {
  const json answer = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded() || !answer.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("not a Prometheus answer: ", QuoteOutput(body)));
  }
  if (answer.value("status", "") != "success") {
    return absl::InvalidArgumentError(absl::StrCat("query ", QuoteOutput(query), " failed: ",
                                                   answer.value("error", std::string("?"))));
  }
  const json& data = answer.value("data", json::object());
  const std::string type = data.value("resultType", "");
  const json& result = data.value("result", json::array());
  auto number = [](const json& sample) -> std::optional<double> {
    // [ <unix time>, "<value>" ]
    double value = 0;
    if (!sample.is_array() || sample.size() != 2 || !sample[1].is_string() ||
        !absl::SimpleAtod(sample[1].get<std::string>(), &value) || !std::isfinite(value) ||
        value < 0) {
      return std::nullopt;
    }
    return value;
  };
  std::optional<double> total;
  if (type == "scalar") {
    total = number(result);
  } else if (type == "vector") {
    if (!result.is_array() || result.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("query ", QuoteOutput(query), " returned no series"));
    }
    total = 0;
    for (const json& series : result) {
      std::optional<double> value =
          series.is_object() ? number(series.value("value", json())) : std::nullopt;
      if (!value.has_value()) {
        total.reset();
        break;
      }
      *total += *value;
    }
  }
  if (!total.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("query ", QuoteOutput(query),
                     " did not give a number >= 0 (a scalar, or a vector of them): ",
                     QuoteOutput(body)));
  }
  return *total;
}

StatusOr<std::unique_ptr<SignalSource>> MakeSignalSource(const JobConfig& job) {
  const JobConfig::Autoscale& options = job.autoscale;
  if (options.source == "slurm") return MakeSlurmSource(job);
  if (options.source == "command") return std::make_unique<CommandSource>(options);
  if (options.source == "prometheus") return std::make_unique<PrometheusSource>(options);
  return absl::InvalidArgumentError(
      absl::StrCat("autoscale.source: no source '", options.source, "'"));
}

StatusOr<std::unique_ptr<WorkerLauncher>> MakeLauncher(const JobConfig& job,
                                                       const LauncherContext& context) {
  std::error_code error;
  std::filesystem::create_directories(context.log_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", context.log_dir, ": ", error.message()));
  }
  const JobConfig::Autoscale& options = job.autoscale;
  if (options.launcher == "command") return std::make_unique<CommandLauncher>(options, context);
  if (options.launcher == "local" || options.launcher == "slurm") {
    const std::string binary =
        options.worker_binary.empty() ? WorkerNextToMaster() : options.worker_binary;
    // (A Slurm node runs the same path: a shared install, as the config
    // and log paths are shared.)
    if (::access(binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "autoscale.worker_binary: ", binary,
          " is not an executable eps-worker; set autoscale.worker_binary to one"));
    }
    if (options.launcher == "slurm") return MakeSlurmLauncher(job, context, binary);
    return std::make_unique<LocalLauncher>(binary, context);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("autoscale.launcher: no launcher '", options.launcher, "'"));
}

Autoscaler::Autoscaler(const JobConfig& job, std::unique_ptr<SignalSource> source,
                       std::unique_ptr<WorkerLauncher> launcher, SeenFn seen, RunningFn running,
                       EventSink* events, const Clock* clock)
    : job_(job),
      source_(std::move(source)),
      launcher_(std::move(launcher)),
      seen_(std::move(seen)),
      running_(std::move(running)),
      events_(events),
      clock_(clock),
      policy_(job.autoscale),
      fleet_(job, events, static_cast<uint64_t>(absl::ToUnixMicros(clock->Now()))) {}

Autoscaler::~Autoscaler() { Stop(absl::ZeroDuration()); }

void Autoscaler::Start() {
  LOG(INFO) << "autoscale: " << job_.autoscale.source << " signal every "
            << job_.autoscale.interval_s << " s, " << job_.autoscale.launcher << " launcher, "
            << job_.autoscale.min_workers << " to " << job_.autoscale.max_workers << " workers";
  thread_ = std::thread([this] { Loop(); });
}

void Autoscaler::Stop() {
  absl::Duration grace;
  {
    absl::MutexLock lock(&mu_);
    grace = fleet_.stop_grace();
  }
  Stop(grace);
}

void Autoscaler::Stop(absl::Duration stop_grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  if (!launcher_->ObservesExits()) return;
  // The master told the workers to exit; those that do not are ended.
  const absl::Time deadline = clock_->Now() + stop_grace;
  std::vector<uint64_t> left;
  while (true) {
    const std::vector<std::pair<uint64_t, int>> exits = launcher_->Exits();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, code] : exits) fleet_.Exited(id, code, clock_->Now());
      left = fleet_.launched();
    }
    if (left.empty() || clock_->Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (uint64_t id : left) {
    std::string handle;
    {
      absl::MutexLock lock(&mu_);
      handle = fleet_.handle(id);
    }
    if (stop_grace > absl::ZeroDuration()) {
      LOG(WARNING) << "autoscale: worker launch " << id << " (" << handle << ") still running "
                   << absl::FormatDuration(stop_grace) << " after the job ended; killing it";
    }
    (void)launcher_->Stop(id, handle, /*force=*/true);
  }
  (void)launcher_->Exits();
}

void Autoscaler::Loop() {
  absl::Time next_reading = clock_->Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
    }
    const absl::Time now = clock_->Now();
    if (running_()) {
      // The fleet first learns who started and who ended, so that the
      // reading counts as starting only those still starting; then it acts
      // on the decision at once.
      Reconcile(now);
      if (now >= next_reading) {
        ReadSignal(now);
        next_reading = now + absl::Seconds(job_.autoscale.interval_s);
        Reconcile(clock_->Now());
      }
    }
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    wake_.WaitWithTimeout(&mu_, kReconcileEvery);
  }
}

void Autoscaler::ReadSignal(absl::Time now) {
  const StatusOr<AutoscaleSignal> signal = source_->Read();  // bounded by its timeout
  absl::MutexLock lock(&mu_);
  const AutoscaleDecision decision =
      policy_.Decide(signal,
                     {.starting = fleet_.starting() * job_.autoscale.gpus_per_worker,
                      .stopping = fleet_.stopping() * job_.autoscale.gpus_per_worker},
                     now);
  ++decisions_[ActionName(decision.action)];
  if (!signal.ok()) {
    const std::string error(signal.status().message());
    if (signal_error_.empty()) {
      LOG(WARNING) << "autoscale: " << decision.rule;
      events_->Record("autoscale_signal_failed", {{"error", error}, {"target", decision.target}});
    }
    signal_error_ = error;
    return;
  }
  if (!signal_error_.empty()) {
    LOG(INFO) << "autoscale: the signal is back (free GPUs " << signal->free_gpus << ")";
    events_->Record("autoscale_signal_restored", decision.ToJson());
    signal_error_.clear();
  }
  signal_ = *signal;
  if (decision.action != AutoscaleDecision::Action::kHold) {
    LOG(INFO) << "autoscale: " << ActionName(decision.action) << " " << decision.previous
              << " -> " << decision.target << " workers: " << decision.rule;
    events_->Record(ActionName(decision.action), decision.ToJson());
  } else {
    VLOG(1) << "autoscale: hold at " << decision.target << ": " << decision.rule;
  }
}

void Autoscaler::Reconcile(absl::Time now) {
  const std::vector<std::pair<uint64_t, int>> exits = launcher_->Exits();
  const std::map<uint64_t, WorkerFleet::Seen> seen = seen_();  // takes the master's lock
  WorkerFleet::Plan plan;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, code] : exits) fleet_.Exited(id, code, now);
    plan = fleet_.Next(policy_.target(), seen, now);
  }
  for (uint64_t id : plan.stop) {
    std::string handle;
    {
      absl::MutexLock lock(&mu_);
      handle = fleet_.handle(id);
    }
    LOG(INFO) << "autoscale: stopping worker launch " << id << " (" << handle << ")";
    Status stopped = launcher_->Stop(id, handle, /*force=*/false);
    if (!stopped.ok()) LOG(WARNING) << "autoscale: stopping launch " << id << ": " << stopped;
  }
  for (uint64_t id : plan.kill) {
    std::string handle;
    {
      absl::MutexLock lock(&mu_);
      handle = fleet_.handle(id);
    }
    Status killed = launcher_->Stop(id, handle, /*force=*/true);
    if (!killed.ok()) LOG(WARNING) << "autoscale: killing launch " << id << ": " << killed;
  }
  for (int i = 0; i < plan.launches; ++i) {
    uint64_t id;
    std::string secret;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      id = fleet_.NewLaunchId();
      secret = NewLaunchSecret();
      secrets_[id] = secret;
    }
    StatusOr<std::string> handle = launcher_->Start(id, secret);
    absl::MutexLock lock(&mu_);
    if (handle.ok()) {
      LOG(INFO) << "autoscale: launched worker " << id << " (" << *handle << ")";
      fleet_.Launched(id, *handle, clock_->Now());
    } else {
      fleet_.LaunchFailed(id, std::string(handle.status().message()), clock_->Now());
      break;  // the back-off decides when to try again
    }
  }
}

bool Autoscaler::VerifyLaunch(uint64_t launch_id, absl::string_view secret) const {
  absl::MutexLock lock(&mu_);
  auto it = secrets_.find(launch_id);
  if (it == secrets_.end() || it->second.size() != secret.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < secret.size(); ++i) differ |= it->second[i] ^ secret[i];
  return differ == 0;
}

json Autoscaler::StatusJson() const {
  absl::MutexLock lock(&mu_);
  const AutoscaleDecision& last = policy_.last();
  json out = {{"source", job_.autoscale.source},
              {"launcher", job_.autoscale.launcher},
              {"min_workers", job_.autoscale.min_workers},
              {"max_workers", job_.autoscale.max_workers},
              {"target_workers", policy_.target()},
              {"last_decision", last.ToJson()},
              {"fleet", fleet_.ToJson(clock_->Now())}};
  out["free_gpus"] = signal_.has_value() ? json(signal_->free_gpus) : json();
  out["pending_gpus"] = signal_.has_value() ? json(signal_->pending_gpus) : json();
  out["signal_error"] = signal_error_.empty() ? json() : json(signal_error_);
  out["live_workers"] = fleet_.live();
  return out;
}

void Autoscaler::WriteMetrics(PrometheusWriter& out) const {
  absl::MutexLock lock(&mu_);
  out.Family("eps_autoscale_free_gpus", MetricType::kGauge,
             "GPUs free in the job's queue at the last reading of the signal.");
  if (signal_.has_value()) out.Sample(static_cast<double>(signal_->free_gpus));
  out.Family("eps_autoscale_pending_gpus", MetricType::kGauge,
             "GPUs other jobs of the queue wait for, at the last reading.");
  if (signal_.has_value()) out.Sample(static_cast<double>(signal_->pending_gpus));
  out.Family("eps_autoscale_target_workers", MetricType::kGauge,
             "Workers the autoscaler wants.");
  out.Sample(static_cast<double>(policy_.target()));
  out.Family("eps_autoscale_live_workers", MetricType::kGauge,
             "Workers the autoscaler launched that are starting or running.");
  out.Sample(static_cast<double>(fleet_.live()));
  out.Family("eps_autoscale_decisions_total", MetricType::kCounter,
             "Readings of the signal, by the action decided (hold, scale_up, scale_down).");
  for (const char* action : {"hold", "scale_up", "scale_down"}) {
    auto it = decisions_.find(action);
    out.Sample({{"action", action}}, it == decisions_.end() ? 0.0 : static_cast<double>(it->second));
  }
  out.Family("eps_autoscale_restarts_total", MetricType::kCounter,
             "Workers that died or were stuck and were replaced.");
  out.Sample(static_cast<double>(fleet_.restarts()));
}

}  // namespace eps
