// eps-worker: one elastic training process.
//
//   eps-worker --config JOB.ini --master tcp://HOST:PORT [--device auto|cpu|cuda]

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "cluster/launch_grant.h"
#include "core/flags.h"
#include "core/logging.h"
#include "core/signal_watcher.h"
#include "worker/worker.h"

namespace {

// The eps workers on this host, this one included, as its launcher says
// (EPS_WORKERS_ON_HOST, set by scripts/run_local.sh and the autoscaler's
// local launcher): 1 when unset, 0 (refused by Validate) when malformed.
int64_t WorkersOnHost() {
  const char* value = std::getenv("EPS_WORKERS_ON_HOST");
  if (value == nullptr || *value == '\0') return 1;
  int64_t workers = 0;
  if (!absl::SimpleAtoi(value, &workers)) return 0;
  return workers;
}

}  // namespace

int main(int argc, char** argv) {
  eps::SignalWatcher signal_watcher;
  eps::CommandLine command_line(
      "eps-worker", "--config JOB.ini --master tcp://HOST:PORT [--device auto|cpu|cuda]");
  eps::WorkerOptions options;
  command_line.AddString("master", &options.master, "the master's endpoint, tcp://HOST:PORT",
                         /*required=*/true);
  command_line.AddString("device", &options.device, "auto, cpu or cuda");
  eps::StatusOr<eps::JobConfig> config = command_line.Parse(argc, argv);
  if (command_line.help_requested()) {
    std::cout << command_line.Usage();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << "eps-worker: " << config.status().message() << "\n";
    return 2;
  }
  options.job = *std::move(config);
  options.workers_on_host = WorkersOnHost();
  if (eps::Status valid = options.Validate(); !valid.ok()) {
    std::cerr << "eps-worker: " << valid.message() << "\n";
    return 2;
  }
  eps::SetLogNode("worker");
  eps::StatusOr<eps::SecurityOptions> security =
      eps::LoadSecurity(options.job.security, eps::proto::ROLE_WORKER);
  if (!security.ok()) {
    std::cerr << "eps-worker: " << security.status().message() << "\n";
    return 2;
  }
  options.security = *std::move(security);
  const eps::LaunchGrant grant = eps::LaunchGrant::FromEnvironment();
  options.launch_id = grant.id;
  if (options.launch_id != 0) options.launch_secret = grant.secret;

  eps::Worker worker(options);
  signal_watcher.Start([&worker](int signal) {
    LOG(WARNING) << "received " << strsignal(signal)
                 << "; finishing the batch in hand, then leaving";
    worker.RequestStop();
  });
  eps::Status result = worker.Run();
  signal_watcher.Stop();
  if (!result.ok()) {
    std::cerr << "eps-worker: " << result.message() << "\n";
    return absl::IsInvalidArgument(result) ? 2 : 1;
  }
  return 0;
}
