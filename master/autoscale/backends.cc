#include "master/autoscale/backends.h"

#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
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
#include "master/autoscale/subprocess.h"
#include "httplib.h"

namespace eps {
namespace {

using nlohmann::json;


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
  LocalLauncher(std::string binary, const LauncherContext& context, int64_t max_workers)
      : binary_(std::move(binary)), context_(context), max_workers_(max_workers) {}

  StatusOr<std::string> Start(uint64_t launch_id, const std::string& secret) override {
    // A worker fixes its compute threads when it starts (core/cpu_budget.h),
    // and the fleet may grow to autoscale.max_workers after it: each is told
    // the most that may share this host, so that none takes the cores a
    // later one needs (too few threads cost far less than too many).
    const int64_t on_host =
        std::max<int64_t>(max_workers_, static_cast<int64_t>(children_.size()) + 1);
    // The environment of a process is readable by its user alone.
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> child,
                     Subprocess::Start({binary_, "--config", context_.worker_config, "--master",
                                        context_.master_endpoint},
                                       {absl::StrCat("EPS_LAUNCH_ID=", launch_id),
                                        absl::StrCat("EPS_LAUNCH_SECRET=", secret),
                                        absl::StrCat("EPS_WORKERS_ON_HOST=", on_host)},
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
  const int64_t max_workers_;
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
}  // namespace

std::string NextToMaster(const std::string& name) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return name;
  return (self.parent_path() / name).string();
}

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
        options.worker_binary.empty() ? NextToMaster("eps-worker") : options.worker_binary;
    // (A Slurm node runs the same path: a shared install, as the config
    // and log paths are shared.)
    if (::access(binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "autoscale.worker_binary: ", binary,
          " is not an executable eps-worker; set autoscale.worker_binary to one"));
    }
    if (options.launcher == "slurm") return MakeSlurmLauncher(job, context, binary);
    return std::make_unique<LocalLauncher>(binary, context, options.max_workers);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("autoscale.launcher: no launcher '", options.launcher, "'"));
}

}  // namespace eps
