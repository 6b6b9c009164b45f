#include "tests/testing/slurm_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "master/autoscale/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

constexpr const char* kDaemons[] = {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                                    "/usr/bin/sbatch"};
constexpr absl::Duration kCommandTimeout = absl::Seconds(30);

// Where Debian's slurm-wlm keeps its plugins.
std::string PluginDir() {
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
                          "/usr/lib/slurm-wlm", "/usr/lib/slurm"}) {
    if (std::filesystem::exists(std::string(dir) + "/select_cons_tres.so")) return dir;
  }
  return "/usr/lib/x86_64-linux-gnu/slurm-wlm";
}

// Polls `done` every 200 ms until it holds or `timeout` passes.
bool Await(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return done();
}

std::string Tail(const std::string& path, size_t bytes = 3000) {
  const std::string text = ReadFile(path);
  return text.size() <= bytes ? text : text.substr(text.size() - bytes);
}

}  // namespace

std::string SlurmCluster::Unavailable() {
  if (::geteuid() != 0) return "a Slurm cluster on loopback needs root (slurmd runs the jobs)";
  for (const char* daemon : kDaemons) {
    if (::access(daemon, X_OK) != 0) {
      return absl::StrCat("no ", daemon, " (Debian's slurm-wlm and munge; scripts/test.sh installs them)");
    }
  }
  return "";
}

StatusOr<std::unique_ptr<SlurmCluster>> SlurmCluster::Start(const std::string& dir, int gpus) {
  namespace fs = std::filesystem;
  std::unique_ptr<SlurmCluster> cluster(new SlurmCluster(dir));
  for (const char* sub : {"state", "spool", "log", "dev"}) fs::create_directories(fs::path(dir) / sub);
  // Jobs of another user run their script from the spool: the directories
  // above it must let them through (the key stays root's alone).
  for (const char* sub : {"", "/spool"}) ::chmod((dir + sub).c_str(), 0755);
  for (int i = 0; i < gpus; ++i) {
    const std::string device = absl::StrCat(dir, "/dev/gpu", i);
    if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
      return absl::UnavailableError(absl::StrCat("mknod ", device, ": ", std::strerror(errno)));
    }
  }
  // munge's key: 1 KiB of random bytes, readable by root only.
  {
    std::random_device random;
    std::string key(1024, '\0');
    for (char& c : key) c = static_cast<char>(random());
    const std::string path = dir + "/munge.key";
    std::ofstream(path, std::ios::binary) << key;
    ::chmod(path.c_str(), 0600);
  }
  const int controller_port = FreeLoopbackPort();
  const int node_port = FreeLoopbackPort();
  if (controller_port == 0 || node_port == 0) return absl::UnavailableError("no free port");
  const std::string conf = dir + "/slurm.conf";
  WriteFile(conf, absl::StrCat(
                      "ClusterName=epstest\n"
                      "SlurmctldHost=localhost(127.0.0.1)\n"
                      "SlurmctldPort=", controller_port, "\n"
                      "SlurmdPort=", node_port, "\n"
                      "SlurmUser=root\n"
                      "SlurmdUser=root\n"
                      "AuthType=auth/munge\n"
                      "CredType=cred/munge\n"
                      "AuthInfo=socket=", dir, "/munge.sock\n"
                      "StateSaveLocation=", dir, "/state\n"
                      "SlurmdSpoolDir=", dir, "/spool\n"
                      "SlurmctldPidFile=", dir, "/slurmctld.pid\n"
                      "SlurmdPidFile=", dir, "/slurmd.pid\n"
                      "SlurmctldLogFile=", dir, "/log/slurmctld.log\n"
                      "SlurmdLogFile=", dir, "/log/slurmd.log\n"
                      "PluginDir=", PluginDir(), "\n"
                      "SlurmdParameters=config_overrides\n"
                      "ProctrackType=proctrack/linuxproc\n"
                      "TaskPlugin=task/none\n"
                      "MpiDefault=none\n"
                      "SelectType=select/cons_tres\n"
                      "SelectTypeParameters=CR_CPU\n"
                      "GresTypes=gpu\n"
                      "SchedulerType=sched/backfill\n"
                      "SchedulerParameters=bf_interval=1\n"
                      "JobAcctGatherType=jobacct_gather/none\n"
                      "AccountingStorageType=accounting_storage/none\n"
                      "ReturnToService=2\n"
                      // A cancelled job's processes get SIGKILL 2 s after SIGTERM.
                      "KillWait=2\n"
                      "NodeName=localhost NodeAddr=127.0.0.1 CPUs=16 RealMemory=16000 Gres=gpu:",
                      gpus, " State=UNKNOWN\n"
                      "PartitionName=gpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n"
                      "PartitionName=cpu Nodes=localhost MaxTime=INFINITE State=UP\n"));
  WriteFile(dir + "/gres.conf",
            absl::StrCat("Name=gpu File=", dir, "/dev/gpu[0-", gpus - 1, "]\n"));
  ::setenv("SLURM_CONF", conf.c_str(), 1);

  ASSIGN_OR_RETURN(cluster->munged_,
                   Process::Start({"/usr/sbin/munged", "--foreground", "--force",
                                   "--socket=" + dir + "/munge.sock",
                                   "--key-file=" + dir + "/munge.key",
                                   "--log-file=" + dir + "/log/munged.log",
                                   "--pid-file=" + dir + "/munged.pid",
                                   "--seed-file=" + dir + "/munged.seed"},
                                  dir + "/log/munged.out"));
  if (!Await([&] { return fs::exists(dir + "/munge.sock"); }, absl::Seconds(20))) {
    return absl::UnavailableError(absl::StrCat("munged did not start:\n", cluster->Logs()));
  }
  ASSIGN_OR_RETURN(cluster->slurmctld_,
                   Process::Start({"/usr/sbin/slurmctld", "-D", "-f", conf},
                                  dir + "/log/slurmctld.out"));
  ASSIGN_OR_RETURN(cluster->slurmd_, Process::Start({"/usr/sbin/slurmd", "-D", "-f", conf, "-N",
                                                     "localhost"},
                                                    dir + "/log/slurmd.out"));
  const bool idle = Await(
      [&] {
        StatusOr<std::string> state =
            cluster->Command(
            {"sinfo", "--noheader", "--Node", "--partition=gpu", "--Format=StateLong"});
        return state.ok() && absl::StripAsciiWhitespace(*state) == "idle";
      },
      absl::Minutes(1));
  if (!idle) {
    return absl::UnavailableError(
        absl::StrCat("the Slurm node did not become idle within a minute:\n", cluster->Logs()));
  }
  return cluster;
}

SlurmCluster::~SlurmCluster() {
  if (slurmctld_ != nullptr && slurmctld_->Running()) {
    // Every job, then an empty queue, so that no job's processes outlive
    // the test.
    for (const char* partition : {"--partition=gpu", "--partition=cpu"}) {
      (void)Command({"scancel", "--full", "--signal=KILL", partition});
      (void)Command({"scancel", partition});
    }
    Await(
        [&] {
          StatusOr<std::string> left = Command({"squeue", "--noheader", "--Format=JobID"});
          return left.ok() && absl::StripAsciiWhitespace(*left).empty();
        },
        absl::Seconds(30));
  }
  for (std::unique_ptr<Process>* daemon : {&slurmd_, &slurmctld_, &munged_}) {
    if (*daemon == nullptr) continue;
    (*daemon)->Signal(SIGTERM);
    if (!(*daemon)->Wait(absl::Seconds(10)).has_value()) (*daemon)->Signal(SIGKILL);
    daemon->reset();
  }
  ::unsetenv("SLURM_CONF");
}

StatusOr<std::string> SlurmCluster::Command(const std::vector<std::string>& argv) const {
  ASSIGN_OR_RETURN(CommandResult result, RunCommand(argv, kCommandTimeout));
  if (result.exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat(absl::StrJoin(argv, " "), ": ", DescribeFailure(result)));
  }
  return result.out;
}

StatusOr<std::string> SlurmCluster::Submit(const std::string& name, int gpus,
                                           const std::string& script,
                                           const std::string& user) const {
  std::vector<std::string> argv = {"sbatch", "--parsable", "--partition=gpu",
                                   absl::StrCat("--gres=gpu:", gpus), "--job-name=" + name,
                                   "--output=/dev/null", "--chdir=/"};
  if (!user.empty()) argv.push_back("--uid=" + user);
  argv.push_back("--wrap=" + script);
  ASSIGN_OR_RETURN(std::string out, Command(argv));
  return std::string(absl::StripAsciiWhitespace(out.substr(0, out.find(';'))));
}

std::string SlurmCluster::JobState(const std::string& job_id) const {
  StatusOr<std::string> state = Command(
      {"squeue", "--noheader", "--states=all", "--jobs=" + job_id, "--Format=State"});
  return state.ok() ? std::string(absl::StripAsciiWhitespace(*state)) : "";
}

std::string SlurmCluster::AwaitJobState(const std::string& job_id,
                                        const std::vector<std::string>& states,
                                        absl::Duration timeout) const {
  std::string state;
  Await(
      [&] {
        state = JobState(job_id);
        return std::find(states.begin(), states.end(), state) != states.end();
      },
      timeout);
  return state;
}

std::string SlurmCluster::Logs() const {
  std::string logs;
  for (const char* name : {"munged.out", "slurmctld.out", "slurmctld.log", "slurmd.out",
                           "slurmd.log"}) {
    absl::StrAppend(&logs, "--- ", name, " ---\n", Tail(absl::StrCat(dir_, "/log/", name)), "\n");
  }
  return logs;
}

}  // namespace eps::testing
