#include "core/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/file_util.h"
#include "core/status.h"

namespace eps {
namespace {

// "1 CPU", "2 CPUs".
std::string Count(int64_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

int ToInt(int64_t n) { return static_cast<int>(std::clamp<int64_t>(n, 1, INT_MAX)); }

struct ParsedQuota {
  enum class Kind { kNoLimit, kLimit, kMalformed };
  Kind kind = Kind::kMalformed;
  int64_t quota = 0;
  int64_t period = 0;
};

// "QUOTA PERIOD", QUOTA "max" or "-1" meaning no limit.
ParsedQuota ParseQuota(absl::string_view text) {
  ParsedQuota parsed;
  std::vector<absl::string_view> fields =
      absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty());
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[1], &parsed.period) || parsed.period <= 0) {
    return parsed;
  }
  if (fields[0] == "max" || fields[0] == "-1") {
    parsed.kind = ParsedQuota::Kind::kNoLimit;
  } else if (absl::SimpleAtoi(fields[0], &parsed.quota) && parsed.quota > 0) {
    parsed.kind = ParsedQuota::Kind::kLimit;
  }
  return parsed;
}

// The directories whose quotas bind cgroup `path` of the hierarchy mounted
// at `mount`: the cgroup's own and each ancestor's up to the mount,
// innermost first (a parent's quota caps its children's together). The
// mount alone when the cgroup's directory is not there: a container
// without its own cgroup namespace is shown the host's path, while its own
// cgroup is what is mounted.
std::vector<std::string> QuotaDirs(const std::string& mount, std::string path) {
  if (path.empty() || path[0] != '/') path = absl::StrCat("/", path);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::error_code error;
  if (absl::StrContains(path, "/..") || !std::filesystem::is_directory(mount + path, error)) {
    return {mount};
  }
  std::vector<std::string> dirs;
  while (true) {
    dirs.push_back(path == "/" ? mount : mount + path);
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? std::string("/") : path.substr(0, slash);
  }
  return dirs;
}

// The stripped contents of a small file; nothing when it cannot be read.
bool ReadStripped(const std::string& path, std::string* text) {
  StatusOr<std::string> contents = ReadSmallFile(path, /*max_bytes=*/4096);
  if (!contents.ok()) return false;
  *text = std::string(absl::StripAsciiWhitespace(*contents));
  return true;
}

}  // namespace

CpuBudget ChooseCpuThreads(const CpuLimits& limits, int64_t explicit_threads,
                           int64_t workers_on_host) {
  std::vector<std::string> parts;
  int64_t cpus = 1;
  if (limits.affinity_cpus > 0) {
    cpus = limits.affinity_cpus;
    parts.push_back(limits.hardware_threads > limits.affinity_cpus
                        ? absl::StrCat("affinity allows ", limits.affinity_cpus, " of ",
                                       Count(limits.hardware_threads, "CPU"))
                        : absl::StrCat("affinity allows ", Count(limits.affinity_cpus, "CPU")));
  } else if (limits.hardware_threads > 0) {
    cpus = limits.hardware_threads;
    parts.push_back(absl::StrCat("affinity unknown, hardware_concurrency ",
                                 limits.hardware_threads));
  } else {
    parts.push_back("CPU count unknown, so 1");
  }

  // The most restrictive well-formed quota caps the CPUs.
  const CpuQuota* tightest = nullptr;
  ParsedQuota tightest_parsed;
  int64_t tightest_cpus = 0;
  bool malformed = false;
  for (const CpuQuota& quota : limits.quotas) {
    const ParsedQuota parsed = ParseQuota(quota.text);
    if (parsed.kind == ParsedQuota::Kind::kMalformed) {
      malformed = true;
      parts.push_back(absl::StrCat("cgroup ", quota.name, " '",
                                   absl::StripAsciiWhitespace(quota.text), "' (", quota.path,
                                   ") is malformed, ignored"));
      continue;
    }
    if (parsed.kind == ParsedQuota::Kind::kNoLimit) continue;
    // A fractional quota rounds down: 1.5 CPUs of time keep 1 thread busy
    // without being throttled; at least 1.
    const int64_t allowed = std::max<int64_t>(1, parsed.quota / parsed.period);
    if (tightest == nullptr || allowed < tightest_cpus) {
      tightest = &quota;
      tightest_parsed = parsed;
      tightest_cpus = allowed;
    }
  }
  if (tightest != nullptr) {
    parts.push_back(absl::StrFormat(
        "cgroup %s %d/%d = %g -> %d", tightest->name, tightest_parsed.quota, tightest_parsed.period,
        static_cast<double>(tightest_parsed.quota) / static_cast<double>(tightest_parsed.period),
        tightest_cpus));
    cpus = std::min(cpus, tightest_cpus);
  } else if (!malformed) {
    parts.push_back("no cgroup CPU quota");
  }

  int64_t threads = cpus;
  if (workers_on_host > 1) {
    threads = std::max<int64_t>(1, cpus / workers_on_host);
    parts.push_back(absl::StrCat(workers_on_host, " workers on this host -> ", threads));
  }

  CpuBudget budget;
  budget.threads = ToInt(threads);
  budget.reason = absl::StrCat(Count(budget.threads, "thread"), ": ", absl::StrJoin(parts, ", "));
  if (explicit_threads > 0) {
    budget.threads = ToInt(explicit_threads);
    budget.reason = absl::StrCat(Count(budget.threads, "thread"),
                                 ": set explicitly (the CPU budget would be ", budget.reason, ")");
  }
  return budget;
}

CpuLimits ReadCpuLimits(const std::string& root) {
  CpuLimits limits;
  // A fixed cpu_set_t covers 1024 CPUs; on a larger machine the call fails
  // and hardware_concurrency stands in.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) limits.affinity_cpus = CPU_COUNT(&set);
  limits.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());

  StatusOr<std::string> cgroups = ReadSmallFile(root + "/proc/self/cgroup", /*max_bytes=*/1 << 16);
  if (!cgroups.ok()) return limits;
  const std::string cgroup_root = root + "/sys/fs/cgroup";
  // Paths in the reason are as the process sees them, without the root.
  const auto shown = [&root](const std::string& path) { return path.substr(root.size()); };
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    // "HIERARCHY:CONTROLLERS:PATH"; the path may itself hold ':'.
    const size_t first = line.find(':');
    const size_t second = first == absl::string_view::npos ? first : line.find(':', first + 1);
    if (second == absl::string_view::npos) continue;
    const absl::string_view hierarchy = line.substr(0, first);
    const absl::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    if (hierarchy == "0" && controllers.empty()) {
      // cgroup v2: the unified hierarchy at /sys/fs/cgroup.
      for (const std::string& dir : QuotaDirs(cgroup_root, path)) {
        std::string text;
        if (ReadStripped(dir + "/cpu.max", &text)) {
          limits.quotas.push_back({"cpu.max", shown(dir + "/cpu.max"), std::move(text)});
        }
      }
      continue;
    }
    const std::vector<absl::string_view> names = absl::StrSplit(controllers, ',');
    if (std::find(names.begin(), names.end(), "cpu") == names.end()) continue;
    // cgroup v1: the cpu hierarchy is mounted as its controller list
    // ("cpu,cpuacct"), usually with a "cpu" link to it.
    std::string mount = absl::StrCat(cgroup_root, "/", controllers);
    std::error_code error;
    if (!std::filesystem::is_directory(mount, error)) mount = cgroup_root + "/cpu";
    if (!std::filesystem::is_directory(mount, error)) continue;
    for (const std::string& dir : QuotaDirs(mount, path)) {
      std::string quota;
      std::string period;
      if (!ReadStripped(dir + "/cpu.cfs_quota_us", &quota)) continue;
      ReadStripped(dir + "/cpu.cfs_period_us", &period);
      limits.quotas.push_back({"cpu.cfs_quota_us", shown(dir + "/cpu.cfs_quota_us"),
                               absl::StrCat(quota, " ", period)});
    }
  }
  return limits;
}

}  // namespace eps
