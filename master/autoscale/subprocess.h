// Subprocesses: a command run to completion with a bounded wait and its
// output captured (RunCommand), and a long-lived child with its output in a
// log file (Subprocess). The master's autoscaler reads its signals and
// starts and stops workers with them.
//
// Every child runs in its own process group, so a timeout or Kill ends what
// it started too (a shell's pipeline, sbatch's helpers).
//
// Thread-safety: RunCommand is safe for concurrent use; a Subprocess is
// not (one owner).

#ifndef EPS_MASTER_AUTOSCALE_SUBPROCESS_H_
#define EPS_MASTER_AUTOSCALE_SUBPROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/status.h"

namespace eps {

struct CommandResult {
  // The exit status; 128 + N for a child ended by signal N.
  int exit_code = 0;
  // What the command wrote on stdout, and the last of its stderr, each up
  // to the limit RunCommand was given.
  std::string out;
  std::string err;
};

// Runs argv[0] (found on PATH) with `argv`, no stdin, waiting at most
// `timeout`; stdout and stderr are captured up to `max_output` bytes each
// (the rest is read and dropped). The command's own failure is its
// exit_code, not an error.
//   kDeadlineExceeded: it ran past `timeout` (its process group was
//     killed), naming the command.
//   kInvalidArgument: empty argv.
//   kUnavailable: it could not be started (not found, not executable).
StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                                   size_t max_output = 1 << 20);

// RunCommand of `/bin/sh -c command`.
StatusOr<CommandResult> RunShell(const std::string& command, absl::Duration timeout,
                                 size_t max_output = 1 << 20);

// `text` as one word for sh, whatever it holds: in single quotes, each
// single quote in it written '\''.
std::string ShellQuoted(absl::string_view text);

// "the command's stderr tail (exit N)": one line for an error message.
std::string DescribeFailure(const CommandResult& result);
// What a command printed, in single quotes and cut to 200 characters
// ("...'" then), for an error message that shows it.
std::string QuoteOutput(absl::string_view output);

// A child that runs on its own, its stdout and stderr appended to a log
// file. Destroying a Subprocess leaves the child running (Kill first to end
// it) and does not reap it.
class Subprocess {
 public:
  // Starts argv[0] (a path, or a name found on PATH) with `argv`, with the
  // environment of this process plus `env` ("NAME=value" items) and stdin
  // from /dev/null. kUnavailable naming the program or the log file when
  // it cannot start.
  static StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                     const std::vector<std::string>& env,
                                                     const std::string& log_path);

  pid_t pid() const { return pid_; }
  // Sends `signal` to the child's process group (no-op once reaped).
  void Signal(int signal);
  // The exit status (as CommandResult::exit_code) once the child exited;
  // nullopt while it runs. Reaps it; never blocks.
  std::optional<int> Poll();
  // Poll until the child exits or `timeout` passes.
  std::optional<int> Wait(absl::Duration timeout);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::optional<int> exit_code_;
};

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_SUBPROCESS_H_
