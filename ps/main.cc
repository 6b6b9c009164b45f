// eps-server: a parameter server.
//
//   eps-server --config JOB.ini --master tcp://HOST:PORT [--port N] [--data-dir DIR]

#include <algorithm>
#include <cstring>
#include <iostream>

#include "cluster/launch_grant.h"
#include "core/cpu_budget.h"
#include "core/flags.h"
#include "core/logging.h"
#include "core/memory.h"
#include "core/signal_watcher.h"
#include "ps/param_server.h"

int main(int argc, char** argv) {
  eps::SignalWatcher signal_watcher;
  eps::CommandLine command_line(
      "eps-server", "--config JOB.ini --master tcp://HOST:PORT [--port N] [--data-dir DIR]");
  std::string master;
  int64_t port = 0;
  std::string data_dir;
  command_line.AddString("master", &master, "the master's endpoint, tcp://HOST:PORT",
                         /*required=*/true);
  command_line.AddInt("port", &port, "port to serve on (0 picks a free one)");
  command_line.AddString("data-dir", &data_dir,
                         "directory of the server's RocksDB store and checkpoints (without it, "
                         "parameters live in memory only)");
  eps::StatusOr<eps::JobConfig> config = command_line.Parse(argc, argv);
  if (command_line.help_requested()) {
    std::cout << command_line.Usage();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << "eps-server: " << config.status().message() << "\n";
    return 2;
  }
  eps::ParamServerOptions options = eps::ParamServerOptions::FromConfig(*config);
  // Request threads past the CPUs this process may use (affinity mask,
  // cgroup quota) only take turns on them: ps.threads is capped there.
  const eps::CpuBudget cpu =
      eps::ChooseCpuThreads(eps::ReadCpuLimits(), /*explicit_threads=*/0, /*workers_on_host=*/1);
  const int configured_threads = options.threads;
  options.threads = std::min(options.threads, cpu.threads);
  // Before the server's threads start: one arena per request handler (the
  // pull and push path never waits for another's), and two for RocksDB's
  // background jobs and the rest.
  eps::LimitMallocArenas(options.threads + 2);
  eps::TuneForMessages();
  options.master = master;
  options.port = port;
  options.storage.data_dir = data_dir;
  if (eps::Status valid = options.Validate(); !valid.ok()) {
    std::cerr << "eps-server: " << valid.message() << "\n";
    return 2;
  }
  eps::SetLogNode("ps");
  LOG(INFO) << "request threads: " << options.threads << " (ps.threads " << configured_threads
            << "; the CPU budget: " << cpu.reason << ")";
  eps::StatusOr<eps::SecurityOptions> security =
      eps::LoadSecurity(config->security, eps::proto::ROLE_SERVER);
  if (!security.ok()) {
    std::cerr << "eps-server: " << security.status().message() << "\n";
    return 2;
  }
  options.security = *std::move(security);
  options.grant = eps::LaunchGrant::FromEnvironment();
  if (data_dir.empty()) {
    LOG(WARNING) << "no --data-dir: parameters live in memory only, and a crash loses them";
  }

  eps::ParamServer server(options);
  if (eps::Status started = server.Start(); !started.ok()) {
    std::cerr << "eps-server: " << started.message() << "\n";
    // A data dir of another job, or a bad option, is a usage error.
    const bool usage = absl::IsFailedPrecondition(started) || absl::IsInvalidArgument(started);
    return usage ? 2 : 1;
  }
  signal_watcher.Start([&server](int signal) {
    LOG(WARNING) << "received " << strsignal(signal) << "; leaving the job";
    server.RequestLeave();
  });
  eps::Status result = server.Wait();
  signal_watcher.Stop();
  if (!result.ok()) {
    std::cerr << "eps-server: " << result.message() << "\n";
    return 1;
  }
  return 0;
}
