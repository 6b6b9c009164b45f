// ServerScalePolicy: how many parameter servers the job should have
// (autoscale.min_servers to max_servers), from the servers' own figures
// (their heartbeats' ServerStats), read every autoscale.interval_s.
//
// Each reading recommends a size from the current target:
//   - a server is short of room (one of the rules below is passed): one
//     server more ("short");
//   - with one server fewer every rule set would still hold with room: one
//     server fewer ("idle");
//   - otherwise the size stays.
// The rules, each off at its default but memory's:
//   memory    a server's hot tier above servers_memory_high of its
//             ps.memory_budget_mb and evicting rows to stay within it (at
//             least kMinEvictions since the last reading: its rows do not
//             fit; the size alone never falls, as a hot tier keeps its
//             arenas); no budget: never short. Idle when no server evicts
//             and their hot tiers, spread over one server fewer, stay under
//             half of that;
//   hit rate  a server's lookups served from memory since the last reading,
//             over all its lookups, below servers_min_hit_rate (at least
//             kMinLookups of them); idle when every server's is at least it;
//   push p99  the bucket bound under which 99% of a server's pushes since
//             the last reading were answered, above servers_max_push_ms (at
//             least kMinPushes of them); idle when every server's is under
//             half of it.
// With no rule that can judge (no budget, the other two off) the job never
// shrinks. Then a Stabilizer (autoscale_policy.h) applies the windows and
// the cooldown, and the size is clamped to [min_servers, max_servers].
// A reading while the servers change (a launched server not yet joined,
// partitions moving, a drain in progress) holds the size: its figures are
// the change's, not the load's.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O.
//
// Thread-safety: not thread-safe; its owner guards it.

#ifndef EPS_MASTER_AUTOSCALE_SERVER_POLICY_H_
#define EPS_MASTER_AUTOSCALE_SERVER_POLICY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/metrics.h"
#include "master/autoscale/autoscale_policy.h"

namespace eps {

// One live server's figures as its last heartbeat carried them (counters
// since it started: the policy takes the differences between readings).
struct ServerReading {
  uint32_t slot = 0;
  int64_t memory_bytes = 0;  // rows in memory (hot tier)
  int64_t budget_bytes = 0;  // ps.memory_budget_mb; 0: unlimited
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  HistogramSnapshot push_latency;  // seconds
};

class ServerScalePolicy {
 public:
  // Lookups and pushes since the last reading below which a server's hit
  // rate or p99 says nothing.
  static constexpr uint64_t kMinLookups = 1000;
  static constexpr uint64_t kMinPushes = 100;
  static constexpr uint64_t kMinEvictions = 100;

  // `start`: the servers the job has now.
  ServerScalePolicy(const JobConfig::Autoscale& options, int64_t start);

  // One reading of the live servers; `changing` names a change in
  // progress (see above), empty when none.
  AutoscaleDecision Decide(const std::vector<ServerReading>& servers,
                           const std::string& changing, absl::Time now);

  int64_t target() const { return stabilizer_.target(); }
  const AutoscaleDecision& last() const { return last_; }

 private:
  // A server's lookups and push latency since the last reading.
  struct Since {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    HistogramSnapshot pushes;
  };
  Since Difference(const ServerReading& now) const;
  std::pair<int64_t, std::string> Recommend(const std::vector<ServerReading>& servers,
                                            const std::map<uint32_t, Since>& since) const;

  const JobConfig::Autoscale options_;
  Stabilizer stabilizer_;
  // Each server's reading last time, for the differences.
  std::map<uint32_t, ServerReading> previous_;
  AutoscaleDecision last_;
};

}  // namespace eps

#endif  // EPS_MASTER_AUTOSCALE_SERVER_POLICY_H_
