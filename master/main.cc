// eps-master: the control plane of one job.
//
//   eps-master --config JOB.ini [--port N] [--http-port N] [--data-dir DIR] [--resume]

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <cstring>

#include "core/flags.h"
#include "core/logging.h"
#include "core/memory.h"
#include "core/signal_watcher.h"
#include "master/master.h"

namespace {

// The soft open-file limit up to the hard one, or 65536 (the soft one is
// often 1024, of 524288): the HTTP port serves at most half the soft limit
// in connections (see master/http/http_service.h), and 512 would let a thousand
// idle clients shut out /status. Not further: the commands the master runs
// inherit it.
void RaiseOpenFileLimit() {
  constexpr rlim_t kEnough = 65536;
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= kEnough ||
      files.rlim_cur >= files.rlim_max) {
    return;
  }
  files.rlim_cur = std::min(files.rlim_max, kEnough);
  // On failure the limit stays; HttpService logs what it then allows.
  (void)setrlimit(RLIMIT_NOFILE, &files);
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread starts: a master allocates little, from few threads at once
  // (its RPC thread, the job loop, HTTP).
  eps::LimitMallocArenas(2);
  eps::FixMmapThreshold();
  RaiseOpenFileLimit();
  eps::SignalWatcher signal_watcher;

  eps::CommandLine command_line(
      "eps-master", "--config JOB.ini [--port N] [--http-port N] [--data-dir DIR] [--resume]");
  eps::MasterOptions options;
  bool resume = false;
  command_line.AddInt("port", &options.port, "RPC port (0 picks a free one)");
  command_line.AddInt("http-port", &options.http_port, "HTTP port of /status (0 picks one)");
  command_line.AddString("data-dir", &options.data_dir, "directory for the master's files");
  command_line.AddSwitch("resume", &resume, "continue a stopped job from its last checkpoint");
  eps::StatusOr<eps::JobConfig> config = command_line.Parse(argc, argv);
  if (command_line.help_requested()) {
    std::cout << command_line.Usage();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << "eps-master: " << config.status().message() << "\n";
    return 2;
  }
  options.job = *std::move(config);
  options.resume = resume;
  if (eps::Status valid = options.Validate(); !valid.ok()) {
    std::cerr << "eps-master: " << valid.message() << "\n";
    return 2;
  }
  eps::SetLogNode("master");
  eps::StatusOr<eps::SecurityOptions> security =
      eps::LoadSecurity(options.job.security, eps::proto::ROLE_MASTER);
  if (!security.ok()) {
    std::cerr << "eps-master: " << security.status().message() << "\n";
    return 2;
  }
  options.security = *std::move(security);

  eps::Master master(options);
  if (eps::Status started = master.Start(); !started.ok()) {
    std::cerr << "eps-master: " << started.message() << "\n";
    // The data dir holding another (or a finished) job is a usage error too.
    const bool config_error = started.code() == absl::StatusCode::kNotFound ||
                              started.code() == absl::StatusCode::kFailedPrecondition ||
                              started.code() == absl::StatusCode::kInvalidArgument;
    return config_error ? 2 : 1;
  }
  signal_watcher.Start([&master](int signal) {
    LOG(WARNING) << "received " << strsignal(signal) << "; stopping the job";
    master.RequestStop(std::string("stopped by ") + strsignal(signal));
  });
  eps::Status result = master.Wait();
  signal_watcher.Stop();
  if (!result.ok()) {
    if (master.Resumable()) {
      std::cerr << "eps-master: job stopped (" << result.message()
                << "); continue it from its last checkpoint with eps-master --resume\n";
    } else {
      std::cerr << "eps-master: job failed: " << result.message() << "\n";
    }
    return 1;
  }
  return 0;
}
