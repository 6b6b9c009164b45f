// Fuzzes the config loader: CommandLine::Parse of a --config INI file and
// --section.key overrides (Boost.Program_options underneath, whose
// exceptions must all become Status), JobConfig::Validate, and what the
// master builds from a config: BuildJobSpec.
//
// Input: the INI file's text; after a NUL byte, if any, one command-line
// argument per line (e.g. "--model.type=dlrm", "--master=tcp://h:1").
// Seeds: fuzz/corpus/job_config, the job configs of examples/ and a few
// with overrides.
//
// Invariants checked: a config that loads and writes itself out as a job
// file (ToIni) reads back from that file as the same config; a job spec the
// master builds is one every server accepts (ValidateJobSpec).

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cluster/job_spec_check.h"
#include "core/flags.h"
#include "core/logging.h"
#include "master/job_spec.h"

namespace eps {
namespace {

void WriteFile(const std::string& path, absl::string_view text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  CHECK(file.good()) << "cannot write " << path;
}

// Loads `args` as the worker's command line does (its role flags included).
StatusOr<JobConfig> Load(const std::vector<std::string>& args) {
  CommandLine command_line("eps-fuzz", "--config JOB.ini");
  std::string master;
  int64_t port = 0;
  bool resume = false;
  command_line.AddString("master", &master, "master endpoint");
  command_line.AddInt("port", &port, "port");
  command_line.AddSwitch("resume", &resume, "resume");
  std::vector<const char*> argv = {"eps-fuzz"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return command_line.Parse(static_cast<int>(argv.size()), argv.data());
}

}  // namespace
}  // namespace eps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace eps;
  static const std::string path = (std::filesystem::temp_directory_path() /
                                   absl::StrCat("eps-job_config_fuzzer-", ::getpid(), ".ini"))
                                      .string();
  static const std::string again = path + ".again";
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  WriteFile(path, input.substr(0, nul));
  std::vector<std::string> args = {"--config", path};
  if (nul != absl::string_view::npos) {
    for (absl::string_view arg : absl::StrSplit(input.substr(nul + 1), '\n', absl::SkipEmpty())) {
      args.emplace_back(arg);
    }
  }
  StatusOr<JobConfig> config = Load(args);
  SetLogVerbosity(0);  // the file may have set -v
  if (!config.ok()) return 0;
  (void)config->DebugString();
  (void)config->OptimizerOverrides();
  StatusOr<proto::JobSpec> spec = BuildJobSpec(*config);
  if (spec.ok()) {
    const Status valid = ValidateJobSpec(*spec);
    CHECK(valid.ok()) << "the master built a job spec servers refuse: " << valid;
  }
  StatusOr<std::string> ini = config->ToIni();
  if (ini.ok()) {
    WriteFile(again, *ini);
    StatusOr<JobConfig> reread = Load({"--config", again});
    CHECK(reread.ok()) << "ToIni wrote a job file that does not load: " << reread.status()
                       << "\n" << *ini;
    CHECK_EQ(reread->DebugString(), config->DebugString()) << "ToIni's job file reads back "
                                                              "as another config";
  }
  return 0;
}
