// CpuBudget: how many compute threads a process should run, from the CPU it
// may use rather than the cores the machine has.
//
// std::thread::hardware_concurrency and nproc see the node, not the limits
// put on the process, so two workers on one host each took every core (two
// workers on 2 cores trained 3.4x slower than with one thread each, issue
// 50), and so does a process in a container whose CPU limit is below the
// node's cores (Kubernetes resources.limits.cpu, Slurm --cpus-per-task):
// the mistake Go's GOMAXPROCS and the JVM fixed by reading the quota.
//
// The inputs (CpuLimits, read by ReadCpuLimits):
//   - the affinity mask: CPUs the process may be scheduled on
//     (sched_getaffinity; taskset, cpusets, Slurm's binding);
//   - cgroup quotas: v2's cpu.max ("QUOTA PERIOD" or "max PERIOD") of the
//     process's cgroup and of each ancestor, v1's cpu.cfs_quota_us and
//     cpu.cfs_period_us ("-1" is no limit) where that hierarchy is mounted;
//   - hardware_concurrency, used only when the affinity mask is unknown;
//   - the eps workers the launcher put on the same host (the launcher
//     knows; eps-worker reads EPS_WORKERS_ON_HOST).
// The rule (ChooseCpuThreads):
//   CPUs = the affinity mask's count (else hardware_concurrency, else 1);
//   each well-formed quota allows floor(QUOTA / PERIOD) CPUs, at least 1,
//     and the most restrictive of them caps CPUs; a malformed one is
//     ignored, and the reason says so;
//   threads = CPUs / workers on the host, rounded down, at least 1;
//   a thread count set explicitly (> 0) wins over all of it.
// Every choice comes with a one-line reason for the process's log.
//
// Thread-safety: ChooseCpuThreads is a pure function; ReadCpuLimits only
// reads files and is safe for concurrent use.

#ifndef EPS_CORE_CPU_BUDGET_H_
#define EPS_CORE_CPU_BUDGET_H_

#include <cstdint>
#include <string>
#include <vector>

namespace eps {

// One cgroup CPU quota, as read.
struct CpuQuota {
  // What it is, for the reason: "cpu.max" (v2) or "cpu.cfs_quota_us" (v1).
  std::string name;
  // The file it came from (under the root ReadCpuLimits was given).
  std::string path;
  // "QUOTA PERIOD" in microseconds; QUOTA "max" (v2) or "-1" (v1) is no
  // limit. For v1, the two files' contents joined by a space.
  std::string text;
};

// What limits the CPU of this process.
struct CpuLimits {
  // CPUs in the affinity mask; 0 when unknown.
  int affinity_cpus = 0;
  // std::thread::hardware_concurrency(); 0 when unknown.
  int hardware_threads = 0;
  // The quotas of the process's cgroup and its ancestors, innermost
  // first; empty when none is set or no cgroup file was found.
  std::vector<CpuQuota> quotas;
};

struct CpuBudget {
  // Threads to run, >= 1.
  int threads = 1;
  // One line: "1 thread: affinity allows 2 CPUs, cgroup cpu.max
  // 150000/100000 = 1.5 -> 1".
  std::string reason;
};

// The rule above. `explicit_threads` > 0 is a count set by the user (it
// wins; the reason still says what the budget would have been); 0 asks for
// the budget. `workers_on_host` < 1 counts as 1.
CpuBudget ChooseCpuThreads(const CpuLimits& limits, int64_t explicit_threads,
                           int64_t workers_on_host);

// Reads this process's limits: the affinity mask (sched_getaffinity) and
// hardware_concurrency of the running process, and the cgroup quotas from
// `root` + /proc/self/cgroup and `root` + /sys/fs/cgroup/... (`root` is ""
// for the real system; tests give a directory holding a fake tree). v2's
// cpu.max is read for the cgroup /proc/self/cgroup names ("0::/PATH") and
// each of its ancestors; v1's cfs files for the hierarchy whose controllers
// include "cpu". When the named cgroup's directory is not there (a
// container without its own cgroup namespace sees the host's path), the
// mount's top directory is read instead. Never fails: what cannot be read
// is left out (a limit it cannot see is no limit).
CpuLimits ReadCpuLimits(const std::string& root = "");

}  // namespace eps

#endif  // EPS_CORE_CPU_BUDGET_H_
