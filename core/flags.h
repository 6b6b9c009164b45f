// CommandLine: parses an eps process's command line.
//
// Every binary takes `--config JOB.ini`, its own flags (--port, --master, ...)
// and any job option as `--section.key=value`, which wins over the file.
// An unknown or malformed option, a missing file or a nonsense value is a
// kInvalidArgument whose message is one line naming the option and, for file
// options, FILE:LINE. The binaries print it and exit 2.
//
//   CommandLine cl("eps-worker", "--config JOB.ini --master tcp://HOST:PORT");
//   std::string master;
//   cl.AddString("master", &master, "master endpoint", /*required=*/true);
//   StatusOr<JobConfig> config = cl.Parse(argc, argv);
//
// Thread-safety: one thread only.

#ifndef EPS_CORE_FLAGS_H_
#define EPS_CORE_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/job_config.h"
#include "core/status.h"

namespace eps {

class CommandLine {
 public:
  // `program` names the binary in messages; `usage` is the synopsis after it.
  CommandLine(std::string program, std::string usage);
  ~CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // Declares a role flag --name. The target's current value is the default.
  // REQUIRES: called before Parse(); `target` outlives Parse().
  void AddString(const std::string& name, std::string* target, const std::string& help,
                 bool required = false);
  void AddInt(const std::string& name, int64_t* target, const std::string& help);
  // A switch: present means true.
  void AddSwitch(const std::string& name, bool* target, const std::string& help);

  // Parses argv: role flags, the --config file, then --section.key
  // overrides, and validates the result. kInvalidArgument on any bad input.
  // When --help is given, returns a default JobConfig without reading any
  // file; check help_requested() first.
  StatusOr<JobConfig> Parse(int argc, const char* const* argv);

  bool help_requested() const { return help_requested_; }
  // The full usage text (synopsis, role flags, every job option).
  std::string Usage() const;
  // The path given with --config.
  const std::string& config_path() const { return config_path_; }

 private:
  struct Impl;
  std::string program_;
  std::string usage_;
  std::string config_path_;
  int64_t verbosity_ = 0;
  bool help_requested_ = false;
  std::unique_ptr<Impl> impl_;
};

// Returns the 1-based line of `option` ("section.key") in INI file `path`,
// or 0 when the file does not set it.
int FindOptionLine(const std::string& path, absl::string_view option);

}  // namespace eps

#endif  // EPS_CORE_FLAGS_H_
