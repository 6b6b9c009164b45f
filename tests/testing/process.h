// Test helpers for integration tests: child processes, temporary
// directories, and a whole eps job on loopback.
//
// Every process a test starts is killed and reaped when its Process object
// goes away, so a failing test leaves nothing running. Every LocalJob has a
// deadline: a wait that runs out records a GoogleTest failure carrying the
// master's /status and the last lines of every log, so a hang never passes
// as slow.
//
// Thread-safety: one thread only.

#ifndef EPS_TESTS_TESTING_PROCESS_H_
#define EPS_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"
#include "rpc/socket_factory.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {

class Process {
 public:
  // Starts argv (argv[0] a path) with stdout and stderr going to `log_path`,
  // in the test's environment with `env` ("NAME=value") added.
  static StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv,
                                                  const std::string& log_path,
                                                  const std::vector<std::string>& env = {});
  // Kills (SIGKILL) the process if it still runs, and reaps it.
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal);
  // Waits up to `timeout` for the exit. The exit code, 128 + the signal that
  // killed it, or nullopt when it still runs.
  std::optional<int> Wait(absl::Duration timeout);
  bool Running();
  // The process's peak resident set size so far (VmHWM in /proc/PID/status),
  // in bytes; nullopt once it has exited (or where /proc does not say).
  std::optional<uint64_t> PeakResidentBytes() const;
  // Its resident set size now (VmRSS), in bytes; nullopt as above.
  std::optional<uint64_t> ResidentBytes() const;
  // The number in `field` of /proc/PID/status ("RssAnon:" in kB,
  // "Threads:"), as written; nullopt as above.
  std::optional<uint64_t> StatusField(const std::string& field) const;
  // What the process has written so far.
  std::string Log() const;
  const std::string& log_path() const { return log_path_; }

 private:
  Process(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  // StatusField of a field in kB, in bytes.
  std::optional<uint64_t> StatusBytes(const std::string& field) const;
  pid_t pid_;
  std::string log_path_;
  std::optional<int> exit_code_;
};

// Path of an eps binary built next to the tests ("eps-master", ...).
std::string BinaryPath(const std::string& name);

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);

// The job file of the fault tests, as DIR/job.ini (its path returned): job
// `name`, one epoch in shards of 10,000 lines, 2 servers over 16
// partitions, workers in batches of 1,024 throttled to 20,000 records/s
// each (a few seconds of training: time to fail in the middle), short
// calls (2 attempts of 2 s), heartbeats every 200 ms, leases of 2 s, a
// checkpoint every second (2 kept). `extra` is appended: more [checkpoint]
// keys, or sections of its own.
std::string WriteFaultJobConfig(const std::string& dir, const std::string& name,
                                const std::string& extra = "");

// Runs eps-datagen: `rows` training rows in `files` files (and the default
// eval split) into `out`, with `extra` flags (--drift R). Its output goes
// to `out` + ".log".
Status GenerateData(const std::string& out, int rows, int seed, int files,
                    const std::vector<std::string>& extra = {});
// Lines in every file of directory `dir`.
uint64_t CountLines(const std::string& dir);
// The master's events log (DATA_DIR/events.jsonl), one object per line.
std::vector<nlohmann::json> ReadEvents(const std::string& master_dir);
// The events called `name` ("scale_up"), in order.
std::vector<nlohmann::json> EventsNamed(const std::vector<nlohmann::json>& events,
                                        const std::string& name);
class LocalJob;

// Makes a job's keys in `keys_dir` (keeping those already there) and
// returns the flag that gives them to a process: --security.keys_dir=DIR.
// A failure to make them is recorded (ADD_FAILURE).
std::string JobKeysFlag(const std::string& keys_dir);
// A socket factory holding `role`'s key pair of the job whose keys are in
// `keys_dir` (a plain one, with a failure recorded, when they do not load).
std::unique_ptr<SocketFactory> FactoryWithJobKeys(const std::string& keys_dir, proto::Role role);
// Worker `id` of the job whose keys are in `keys_dir`, with the credential
// its master would issue it (what a registered worker that went bad holds).
proto::NodeId WorkerOfJob(const std::string& keys_dir, uint32_t id);

// A final status that says "finished" with every epoch's ledger complete,
// each line counted exactly once and `lines` committed (GoogleTest
// expectations; a fatal failure when the ledger is empty).
void ExpectEveryEpochExactlyOnce(const nlohmann::json& final_status, uint64_t lines);
// Waits up to `timeout` for `job`'s master to exit 0, then expects its
// final status as ExpectEveryEpochExactlyOnce does; the final status in
// `final_status` when given. Fatal failures: use ASSERT_NO_FATAL_FAILURE.
void ExpectFinishedExactlyOnce(LocalJob& job, absl::Duration timeout, uint64_t lines,
                               nlohmann::json* final_status = nullptr);
// Runs scripts/plot_run.py on a master's --data-dir, writing `png`; its
// exit code (nullopt when it ran past 2 minutes) and what it printed.
std::pair<std::optional<int>, std::string> PlotRun(const std::string& master_dir,
                                                   const std::string& png);
// Workers a /status document shows alive; with `trained`, only those that
// committed records.
int AliveWorkers(const nlohmann::json& status, bool trained = false);

// A job on loopback: one master, servers and workers, all in `dir`.
//
// The job's deadline is `deadline` after the first StartMaster.
// WaitForMaster and WaitForStatus end at the earlier of their timeout and
// the deadline. A wait (those and WaitForOthers) that ends with its
// condition unmet records a GoogleTest failure (ADD_FAILURE, not fatal)
// whose message has the master's /status and Logs(), and still returns its
// result, which callers assert as before.
class LocalJob {
 public:
  // `config` is the job file; `overrides` are extra --section.key=value
  // flags given to every process. A test whose job needs longer than the
  // default deadline passes more.
  LocalJob(std::string dir, std::string config, std::vector<std::string> overrides,
           absl::Duration deadline = absl::Minutes(4));
  ~LocalJob();

  // Starts the master on ephemeral ports and waits for its endpoints. The
  // first start sets the job's deadline.
  Status StartMaster(absl::Duration timeout = absl::Seconds(20));
  // Starts the master again on the ports and data dir of the first one
  // (which must have exited), with `extra` flags (--resume), and waits for
  // it to serve.
  Status RestartMaster(absl::Duration timeout = absl::Seconds(20),
                       const std::vector<std::string>& extra = {});
  // Starts the master, then `servers` servers and `workers` workers.
  Status Start(int servers, int workers);
  // Starts a server / worker; returns its index in servers() / workers().
  // A server's --data-dir is DIR/server-<index> unless `data_dir` is given
  // (a server restarted on an earlier one's dir: server_dir(i)). With the
  // job's keys it is started as an operator starts one
  // (EPS_LAUNCH_SECRET_FILE=KEYS/http_token), so it may join the running
  // job (master/trust/server_admission.h).
  StatusOr<size_t> StartServer(const std::string& data_dir = "");
  std::string server_dir(size_t index) const;
  StatusOr<size_t> StartWorker();

  // Waits up to `timeout`, and at most until the deadline, for the master
  // to exit. Its exit code; kDeadlineExceeded, with a failure recorded,
  // when it still runs.
  StatusOr<int> WaitForMaster(absl::Duration timeout);
  // Waits up to `timeout` in all for every server and worker to exit;
  // their exit codes, servers first, nullopt for one still running (a
  // failure is recorded naming it). Not bounded by the deadline: it runs
  // after the master's exit, when the others only have to follow.
  std::vector<std::optional<int>> WaitForOthers(absl::Duration timeout);
  // DATA_DIR/final_status.json of the master.
  StatusOr<nlohmann::json> FinalStatus() const;
  // GET /status from the master's HTTP port.
  StatusOr<nlohmann::json> LiveStatus() const;
  // Polls /status until `condition` holds on it (true) or `timeout` or the
  // deadline passes (false, with a failure recorded that carries the last
  // /status seen).
  bool WaitForStatus(const std::function<bool(const nlohmann::json&)>& condition,
                     absl::Duration timeout = absl::Seconds(60)) const;

  Process& master() { return *master_; }
  std::vector<std::unique_ptr<Process>>& servers() { return servers_; }
  std::vector<std::unique_ptr<Process>>& workers() { return workers_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& http() const { return http_; }
  const std::string& master_dir() const { return master_dir_; }
  // The job's keys (DIR/keys, made by the constructor); empty when the
  // test set [security] itself.
  const std::string& keys_dir() const { return keys_dir_; }
  // The bearer token of the master's mutating HTTP endpoints
  // (KEYS_DIR/http_token); empty without keys.
  std::string HttpToken() const;
  // The last lines of every process's log, for failure messages.
  std::string Logs() const;

 private:
  std::vector<std::string> CommonArgs() const;
  // How a wait of `timeout` that ended at `until` ran out: "within
  // TIMEOUT" or "by the job's deadline (...)".
  std::string RanOut(absl::Time until, absl::Duration timeout) const;
  // Records a failure: `what`, the master's live /status (or that it did
  // not answer) and Logs().
  void RecordFailure(const std::string& what) const;
  // The same with `status` standing for the master's /status.
  void RecordFailure(const std::string& what, const std::string& status) const;
  Status LaunchMaster(const std::string& port, const std::string& http_port,
                      absl::Duration timeout, const std::vector<std::string>& extra = {});
  int master_starts_ = 0;
  const absl::Duration job_deadline_;
  absl::Time deadline_ = absl::InfiniteFuture();  // set by the first start
  std::string dir_;
  std::string config_;
  std::vector<std::string> overrides_;
  std::string master_dir_;
  std::string keys_dir_;
  std::string endpoint_;
  std::string http_;
  std::unique_ptr<Process> master_;
  std::vector<std::unique_ptr<Process>> servers_;
  std::vector<std::unique_ptr<Process>> workers_;
};

}  // namespace eps::testing

#endif  // EPS_TESTS_TESTING_PROCESS_H_
