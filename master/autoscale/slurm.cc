#include "master/autoscale/slurm.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "master/autoscale/subprocess.h"

namespace eps {
namespace {

// How often the launcher asks squeue how its jobs stand: the controller of
// a large cluster is not to be polled every second.
constexpr absl::Duration kJobPollEvery = absl::Seconds(5);
constexpr size_t kMaxOutput = 1 << 20;

// `text` without its parenthesized parts: "gpu:2(IDX:0,3)" -> "gpu:2".
std::string WithoutParentheses(absl::string_view text) {
  std::string out;
  int depth = 0;
  for (char c : text) {
    if (c == '(') {
      ++depth;
    } else if (c == ')') {
      depth = std::max(0, depth - 1);
    } else if (depth == 0) {
      out.push_back(c);
    }
  }
  return out;
}

// "gpu:8" or "gpu:a100:8" or "gpu=8" (name first, count last): the count
// when the name is "gpu".
int64_t GpusOfEntry(absl::string_view entry) {
  std::vector<absl::string_view> parts = absl::StrSplit(entry, absl::ByAnyChar(":="));
  if (parts.size() < 2 || absl::StripAsciiWhitespace(parts.front()) != "gpu") return 0;
  int64_t count = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts.back()), &count) || count < 0) return 0;
  return count;
}

// "a|b|c|" -> {"a", "b", "c"}: the fields of one line of -O "X:|,Y:|".
std::vector<std::string> Fields(absl::string_view line) {
  std::vector<std::string> fields = absl::StrSplit(line, '|');
  if (!fields.empty() && fields.back().empty()) fields.pop_back();
  for (std::string& field : fields) absl::StripAsciiWhitespace(&field);
  return fields;
}


StatusOr<std::string> Run(const std::vector<std::string>& argv, absl::Duration timeout) {
  ASSIGN_OR_RETURN(CommandResult result, RunCommand(argv, timeout, kMaxOutput));
  if (result.exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat(absl::StrJoin(argv, " "), " failed: ", DescribeFailure(result)));
  }
  return std::move(result.out);
}

class SlurmSource final : public SignalSource {
 public:
  explicit SlurmSource(const JobConfig& job)
      : partition_(job.autoscale.partition),
        own_prefix_(SlurmWorkerJobPrefix(job)),
        timeout_(absl::Seconds(job.autoscale.source_timeout_s)) {}

  StatusOr<AutoscaleSignal> Read() override {
    StatusOr<std::string> partition =
        Run({"scontrol", "--oneliner", "show", "partition", partition_}, timeout_);
    if (!partition.ok()) {
      return absl::UnavailableError(absl::StrCat("autoscale.partition '", partition_,
                                                 "': ", partition.status().message()));
    }
    std::string state;
    for (absl::string_view field : absl::StrSplit(*partition, absl::ByAnyChar(" \n"))) {
      if (absl::ConsumePrefix(&field, "State=")) state = std::string(field);
    }
    AutoscaleSignal signal;
    if (state == "UP") {
      ASSIGN_OR_RETURN(std::string sinfo,
                       Run({"sinfo", "--noheader", "--Node", "--partition=" + partition_,
                            "--Format=NodeList:|,StateLong:|,Gres:|,GresUsed:|"},
                           timeout_));
      ASSIGN_OR_RETURN(signal.free_gpus, ParseSlurmFreeGpus(sinfo));
    } else if (state != reported_state_) {
      LOG(WARNING) << "autoscale: Slurm partition " << partition_ << " is "
                   << (state.empty() ? "of unknown state" : state) << ": no free GPUs in it";
    }
    reported_state_ = state;
    ASSIGN_OR_RETURN(std::string squeue,
                     Run({"squeue", "--noheader", "--states=PENDING",
                          "--partition=" + partition_,
                          "--Format=JobID:|,Name:|,Reason:|,NumNodes:|,NumTasks:|,"
                          "tres-per-node:|,tres-per-job:|,tres-per-task:|"},
                         timeout_));
    ASSIGN_OR_RETURN(signal.pending_gpus, ParseSlurmPendingGpus(squeue, own_prefix_));
    return signal;
  }

 private:
  const std::string partition_;
  const std::string own_prefix_;
  const absl::Duration timeout_;
  std::string reported_state_ = "UP";
};

class SlurmLauncher final : public WorkerLauncher {
 public:
  SlurmLauncher(const JobConfig& job, const LauncherContext& context, std::string binary)
      : options_(job.autoscale),
        prefix_(SlurmWorkerJobPrefix(job)),
        context_(context),
        binary_(std::move(binary)),
        timeout_(absl::Seconds(job.autoscale.source_timeout_s)) {}

  StatusOr<std::string> Start(uint64_t launch_id, const std::string& secret) override {
    // The secret in a file only the job's user reads, on the filesystem the
    // nodes share (not on sbatch's command line, which ps shows).
    const std::string secret_file = absl::StrCat(context_.log_dir, "/worker-", launch_id, ".secret");
    RETURN_IF_ERROR(WriteFileAtomically(secret_file, secret, 0600));
    std::vector<std::string> argv = {
        "sbatch",
        "--parsable",
        "--partition=" + options_.partition,
        absl::StrCat("--gres=gpu:", options_.gpus_per_worker),
        absl::StrCat("--job-name=", prefix_, launch_id),
        "--output=" + context_.LogPath(launch_id),
        absl::StrCat("--export=ALL,EPS_LAUNCH_ID=", launch_id,
                     ",EPS_LAUNCH_SECRET_FILE=", secret_file)};
    for (absl::string_view arg : absl::StrSplit(options_.sbatch_args, ' ', absl::SkipWhitespace())) {
      argv.emplace_back(arg);
    }
    argv.push_back(absl::StrCat("--wrap=exec ", ShellQuoted(binary_), " --config ",
                                ShellQuoted(context_.worker_config), " --master ",
                                ShellQuoted(context_.master_endpoint)));
    StatusOr<std::string> out = Run(argv, timeout_);
    if (!out.ok()) return out.status();
    // "<job id>" or "<job id>;<cluster>".
    const std::string job_id(
        absl::StripAsciiWhitespace(absl::string_view(*out).substr(0, out->find_first_of(";\n"))));
    uint64_t number = 0;
    if (!absl::SimpleAtoi(job_id, &number)) {
      return absl::UnavailableError(
          absl::StrCat("sbatch printed no job id: ", QuoteOutput(*out)));
    }
    jobs_[launch_id] = job_id;
    return absl::StrCat("slurm job ", job_id);
  }

  Status Stop(uint64_t launch_id, const std::string&, bool force) override {
    auto it = jobs_.find(launch_id);
    if (it == jobs_.end()) return absl::NotFoundError("no such worker");
    std::vector<std::string> argv = {"scancel"};
    if (!force) {
      // --full: the batch step's processes too, which is where the worker
      // runs (plain --signal reaches only steps started with srun).
      argv.push_back("--full");
      argv.push_back("--signal=TERM");
    }
    argv.push_back(it->second);
    return Run(argv, timeout_).status();
  }

  std::vector<std::pair<uint64_t, int>> Exits() override {
    std::vector<std::pair<uint64_t, int>> exits;
    const absl::Time now = absl::Now();
    if (jobs_.empty() || now < next_poll_) return exits;
    next_poll_ = now + kJobPollEvery;
    std::vector<std::string> ids;
    for (const auto& [launch_id, job_id] : jobs_) ids.push_back(job_id);
    StatusOr<CommandResult> result =
        RunCommand({"squeue", "--noheader", "--states=all", "--jobs=" + absl::StrJoin(ids, ","),
                    "--Format=JobID:|,State:|,exit_code:|"},
                   timeout_, kMaxOutput);
    // squeue refuses a list of ids it has all forgotten (MinJobAge passed):
    // every job has ended then.
    const bool all_forgotten = result.ok() && result->exit_code != 0 &&
                               absl::StrContains(result->err, "Invalid job id");
    StatusOr<std::map<std::string, std::pair<std::string, int>>> states =
        all_forgotten            ? std::map<std::string, std::pair<std::string, int>>()
        : !result.ok()           ? result.status()
        : result->exit_code != 0 ? absl::UnavailableError(DescribeFailure(*result))
                                 : ParseSlurmJobStates(result->out);
    if (!states.ok()) {
      // Said once until it works again; the fleet's own bounds (a dead
      // worker's lease) still hold meanwhile.
      if (!poll_failing_) {
        LOG(WARNING) << "autoscale: squeue of the worker jobs failed (" << states.status()
                     << "); trying again every " << absl::FormatDuration(kJobPollEvery);
      }
      poll_failing_ = true;
      return exits;
    }
    poll_failing_ = false;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      auto state = states->find(it->second);
      std::optional<int> end = state == states->end()
                                   ? std::optional<int>(-1)  // forgotten: ended long ago
                                   : SlurmJobEnd(state->second.first, state->second.second);
      if (!end.has_value()) {
        ++it;
        continue;
      }
      if (*end != 0) {
        LOG(WARNING) << "autoscale: worker launch " << it->first << " (slurm job " << it->second
                     << ") ended "
                     << (state == states->end() ? std::string("unseen")
                                               : absl::StrCat(state->second.first, " ", *end))
                     << "; its log: " << context_.LogPath(it->first);
      }
      exits.emplace_back(it->first, *end);
      it = jobs_.erase(it);
    }
    return exits;
  }

 private:
  const JobConfig::Autoscale options_;
  const std::string prefix_;
  const LauncherContext context_;
  const std::string binary_;
  const absl::Duration timeout_;
  // Launch id -> Slurm job id.
  std::map<uint64_t, std::string> jobs_;
  absl::Time next_poll_ = absl::InfinitePast();
  bool poll_failing_ = false;
};

}  // namespace

int64_t SlurmGresGpus(absl::string_view gres) {
  int64_t total = 0;
  for (absl::string_view entry : absl::StrSplit(WithoutParentheses(gres), ',')) {
    total += GpusOfEntry(entry);
  }
  return total;
}

int64_t SlurmTresGpus(absl::string_view tres) {
  int64_t total = 0;
  for (absl::string_view entry : absl::StrSplit(tres, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!absl::ConsumePrefix(&entry, "gres:")) absl::ConsumePrefix(&entry, "gres/");
    total += GpusOfEntry(entry);
  }
  return total;
}

bool SlurmNodeUsable(absl::string_view state) {
  // Flags sinfo appends: * not responding, ~ powered down, # powering up,
  // ! and % powering down, @ reboot pending, ^ rebooting, $ maintenance.
  if (state.find_first_of("*~#!%@^$") != absl::string_view::npos) return false;
  const std::string base = absl::AsciiStrToLower(state.substr(0, state.find('+')));
  static const absl::flat_hash_set<std::string> kUsable = {"idle", "mixed", "allocated",
                                                           "completing", "planned"};
  return kUsable.contains(base);
}

StatusOr<int64_t> ParseSlurmFreeGpus(absl::string_view sinfo) {
  int64_t free = 0;
  for (absl::string_view line : absl::StrSplit(sinfo, '\n', absl::SkipWhitespace())) {
    const std::vector<std::string> fields = Fields(line);
    if (fields.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("sinfo: expected NODE|STATE|GRES|GRES_USED|, got ", QuoteOutput(line)));
    }
    if (!SlurmNodeUsable(fields[1])) continue;
    free += std::max<int64_t>(0, SlurmGresGpus(fields[2]) - SlurmGresGpus(fields[3]));
  }
  return free;
}

StatusOr<int64_t> ParseSlurmPendingGpus(absl::string_view squeue, absl::string_view own_prefix) {
  int64_t pending = 0;
  for (absl::string_view line : absl::StrSplit(squeue, '\n', absl::SkipWhitespace())) {
    const std::vector<std::string> fields = Fields(line);
    int64_t nodes = 0;
    int64_t tasks = 0;
    if (fields.size() != 8 || !absl::SimpleAtoi(fields[3], &nodes) ||
        !absl::SimpleAtoi(fields[4], &tasks)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "squeue: expected ID|NAME|REASON|NODES|TASKS|TRES_PER_NODE|TRES_PER_JOB|TRES_PER_TASK|, "
          "got ",
          QuoteOutput(line)));
    }
    if (absl::StartsWith(fields[1], own_prefix)) continue;
    // Only jobs waiting for the machines: not held, not after a dependency
    // or a begin time, not over a limit of their account.
    if (fields[2] != "Resources" && fields[2] != "Priority") continue;
    pending += SlurmTresGpus(fields[5]) * std::max<int64_t>(1, nodes) + SlurmTresGpus(fields[6]) +
               SlurmTresGpus(fields[7]) * std::max<int64_t>(1, tasks);
  }
  return pending;
}

std::optional<int> SlurmJobEnd(absl::string_view state, int exit_code) {
  // Job states that end a job (squeue --states help); the rest may still run.
  static const absl::flat_hash_set<std::string> kEnded = {
      "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",  "NODE_FAIL",    "PREEMPTED",
      "BOOT_FAIL", "DEADLINE",  "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"};
  const std::string base(state.substr(0, state.find(' ')));
  if (!kEnded.contains(base)) return std::nullopt;
  if (base == "COMPLETED") return 0;
  return exit_code != 0 ? exit_code : 1;
}

StatusOr<std::map<std::string, std::pair<std::string, int>>> ParseSlurmJobStates(
    absl::string_view squeue) {
  std::map<std::string, std::pair<std::string, int>> states;
  for (absl::string_view line : absl::StrSplit(squeue, '\n', absl::SkipWhitespace())) {
    const std::vector<std::string> fields = Fields(line);
    int code = 0;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[2], &code)) {
      return absl::InvalidArgumentError(
          absl::StrCat("squeue: expected ID|STATE|EXIT_CODE|, got ", QuoteOutput(line)));
    }
    states[fields[0]] = {fields[1], code};
  }
  return states;
}

std::string SlurmWorkerJobPrefix(const JobConfig& job) {
  return absl::StrCat("eps-", job.job.name, "-worker-");
}

std::unique_ptr<SignalSource> MakeSlurmSource(const JobConfig& job) {
  return std::make_unique<SlurmSource>(job);
}

std::unique_ptr<WorkerLauncher> MakeSlurmLauncher(const JobConfig& job,
                                                  const LauncherContext& context,
                                                  const std::string& worker_binary) {
  return std::make_unique<SlurmLauncher>(job, context, worker_binary);
}

}  // namespace eps
