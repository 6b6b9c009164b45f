#include "master/autoscale/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace eps {
namespace {

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// posix_spawnp in a new process group, with no signal blocked (the master
// blocks the ones its SignalWatcher waits for, and a child would inherit
// the mask) and default dispositions. `stdio[i]`, when >= 0, becomes fd i.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, char* const* envp,
                      const int (&stdio)[3]) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to run");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd = 0; fd < 3; ++fd) {
    if (stdio[fd] >= 0) posix_spawn_file_actions_adddup2(&actions, stdio[fd], fd);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGHUP);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int error = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot start ", argv[0], ": ", strerror(error)));
  }
  return pid;
}

int OpenDevNull() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Appends what `fd` has to `*into`, keeping at most `limit` bytes (the
// first ones for stdout, the last ones for stderr). False at end of file.
bool Drain(int fd, std::string* into, size_t limit, bool keep_tail) {
  char buffer[4096];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  into->append(buffer, static_cast<size_t>(n));
  if (into->size() > limit) {
    if (keep_tail) {
      into->erase(0, into->size() - limit);
    } else {
      into->resize(limit);
    }
  }
  return true;
}

}  // namespace

StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                                   size_t max_output) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to run");
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::UnavailableError("pipe failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::UnavailableError("pipe failed");
  }
  const int null = OpenDevNull();
  StatusOr<pid_t> spawned = Spawn(argv, environ, {null, out[1], err[1]});
  ::close(out[1]);
  ::close(err[1]);
  if (null >= 0) ::close(null);
  if (!spawned.ok()) {
    ::close(out[0]);
    ::close(err[0]);
    return spawned.status();
  }
  const pid_t pid = *spawned;
  const absl::Time deadline = absl::Now() + timeout;
  CommandResult result;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open = 2;
  bool timed_out = false;
  while (open > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int ready = ::poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      if (!Drain(fds[i].fd, i == 0 ? &result.out : &result.err, max_output, i == 1)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  if (timed_out) ::kill(-pid, SIGKILL);
  // The pipes are closed (or the group killed): the child is gone or
  // going; what it started and left running holds no pipe of ours.
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, timed_out ? 0 : WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    if (done == 0) {
      if (absl::Now() >= deadline) {
        timed_out = true;
        ::kill(-pid, SIGKILL);
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat("'", absl::StrJoin(argv, " "),
                                                    "' did not finish within ",
                                                    absl::FormatDuration(timeout)));
  }
  result.exit_code = ExitCode(status);
  return result;
}

std::string ShellQuoted(absl::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out += "'";
  return out;
}

StatusOr<CommandResult> RunShell(const std::string& command, absl::Duration timeout,
                                 size_t max_output) {
  return RunCommand({"/bin/sh", "-c", command}, timeout, max_output);
}

std::string QuoteOutput(absl::string_view output) {
  constexpr size_t kShown = 200;
  return absl::StrCat("'", output.substr(0, kShown), output.size() > kShown ? "...'" : "'");
}

std::string DescribeFailure(const CommandResult& result) {
  std::string err(absl::StripAsciiWhitespace(result.err));
  const size_t last_line = err.rfind('\n');
  if (last_line != std::string::npos) err = err.substr(last_line + 1);
  if (err.empty()) return absl::StrCat("exit ", result.exit_code);
  return absl::StrCat(err, " (exit ", result.exit_code, ")");
}

StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                        const std::vector<std::string>& env,
                                                        const std::string& log_path) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));
  }
  std::vector<std::string> environment;
  for (char** item = environ; *item != nullptr; ++item) environment.emplace_back(*item);
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& item : environment) envp.push_back(item.data());
  envp.push_back(nullptr);
  const int null = OpenDevNull();
  StatusOr<pid_t> spawned = Spawn(argv, envp.data(), {null, log, log});
  ::close(log);
  if (null >= 0) ::close(null);
  if (!spawned.ok()) return spawned.status();
  return std::unique_ptr<Subprocess>(new Subprocess(*spawned));
}

void Subprocess::Signal(int signal) {
  if (!exit_code_.has_value()) ::kill(-pid_, signal);
}

std::optional<int> Subprocess::Poll() {
  if (exit_code_.has_value()) return exit_code_;
  int status = 0;
  pid_t done;
  do {
    done = ::waitpid(pid_, &status, WNOHANG);
  } while (done < 0 && errno == EINTR);
  if (done == pid_) exit_code_ = ExitCode(status);
  return exit_code_;
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Poll().has_value() && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

}  // namespace eps
