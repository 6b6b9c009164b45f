#include "master/autoscale/server_policy.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace eps {

ServerScalePolicy::ServerScalePolicy(const JobConfig::Autoscale& options, int64_t start)
    : options_(options), stabilizer_(options, start) {
  last_.previous = start;
  last_.target = start;
  last_.rule = absl::StrCat("start at the job's ", start, " server(s)");
}

ServerScalePolicy::Since ServerScalePolicy::Difference(const ServerReading& now) const {
  Since since{.hits = now.hits,
              .misses = now.misses,
              .evictions = now.evictions,
              .pushes = now.push_latency};
  auto it = previous_.find(now.slot);
  if (it == previous_.end()) return since;
  const ServerReading& before = it->second;
  // A server restarted in the slot counts from 0 again: all of it is new.
  if (now.hits < before.hits || now.misses < before.misses || now.evictions < before.evictions) {
    return since;
  }
  since.hits -= before.hits;
  since.misses -= before.misses;
  since.evictions -= before.evictions;
  const HistogramSnapshot& old = before.push_latency;
  if (old.bounds == now.push_latency.bounds && old.counts.size() == since.pushes.counts.size() &&
      old.count <= since.pushes.count) {
    for (size_t i = 0; i < old.counts.size(); ++i) {
      since.pushes.counts[i] -= std::min(old.counts[i], since.pushes.counts[i]);
    }
    since.pushes.count -= old.count;
    since.pushes.sum -= old.sum;
  }
  return since;
}

std::pair<int64_t, std::string> ServerScalePolicy::Recommend(
    const std::vector<ServerReading>& servers, const std::map<uint32_t, Since>& since) const {
  const int64_t size = target();
  const int64_t n = static_cast<int64_t>(servers.size());
  // Short: the first rule a server passes.
  for (const ServerReading& server : servers) {
    const Since& recent = since.at(server.slot);
    const double high = options_.servers_memory_high * static_cast<double>(server.budget_bytes);
    if (server.budget_bytes > 0 && static_cast<double>(server.memory_bytes) > high &&
        recent.evictions >= kMinEvictions) {
      return {size + 1,
              absl::StrFormat("ps[%u] holds %.1f MiB in memory, over %.2f of its budget of "
                              "%.1f MiB (autoscale.servers_memory_high), and evicted %u rows "
                              "since the last reading: one server more",
                              server.slot, server.memory_bytes / 1048576.0,
                              options_.servers_memory_high, server.budget_bytes / 1048576.0,
                              recent.evictions)};
    }
    const uint64_t lookups = recent.hits + recent.misses;
    if (options_.servers_min_hit_rate > 0 && lookups >= kMinLookups) {
      const double rate = static_cast<double>(recent.hits) / static_cast<double>(lookups);
      if (rate < options_.servers_min_hit_rate) {
        return {size + 1, absl::StrFormat("ps[%u]'s hit rate %.3f is below "
                                          "autoscale.servers_min_hit_rate = %g: one server more",
                                          server.slot, rate, options_.servers_min_hit_rate)};
      }
    }
    if (options_.servers_max_push_ms > 0 && recent.pushes.count >= kMinPushes) {
      const std::optional<double> p99 = QuantileBound(recent.pushes, 0.99);
      if (!p99.has_value() || 1e3 * *p99 > options_.servers_max_push_ms) {
        return {size + 1,
                absl::StrCat("ps[", server.slot, "]'s push p99 ",
                             p99.has_value() ? absl::StrFormat("%.1f ms", 1e3 * *p99)
                                             : std::string("is past every bucket and"),
                             " is above autoscale.servers_max_push_ms = ",
                             options_.servers_max_push_ms, ": one server more")};
      }
    }
  }
  // Idle: every rule that can judge has room with one server fewer.
  if (n < 2 || size < 2) return {size, "no server is short of room: keep the size"};
  bool judged = false;
  std::string room;
  int64_t memory = 0;
  int64_t budget = 0;
  for (const ServerReading& server : servers) {
    if (server.budget_bytes > 0 && since.at(server.slot).evictions >= kMinEvictions) {
      return {size, absl::StrCat("ps[", server.slot, "] evicts rows: keep the size")};
    }
    memory += server.memory_bytes;
    budget = budget == 0 ? server.budget_bytes : std::min(budget, server.budget_bytes);
    if (server.budget_bytes <= 0) budget = -1;  // one server without a budget: no judgement
  }
  if (budget > 0) {
    judged = true;
    const double spread = static_cast<double>(memory) / static_cast<double>(n - 1);
    const double half = 0.5 * options_.servers_memory_high * static_cast<double>(budget);
    if (spread >= half) {
      return {size, absl::StrFormat("no server is short of room, but over %d server(s) their "
                                    "%.1f MiB in memory would pass half of "
                                    "autoscale.servers_memory_high: keep the size",
                                    n - 1, memory / 1048576.0)};
    }
    room = absl::StrFormat("%.1f MiB in memory over %d server(s)", memory / 1048576.0, n - 1);
  }
  for (const ServerReading& server : servers) {
    const Since& recent = since.at(server.slot);
    const uint64_t lookups = recent.hits + recent.misses;
    if (options_.servers_min_hit_rate > 0) {
      judged = true;
      if (lookups >= kMinLookups &&
          static_cast<double>(recent.hits) <
              options_.servers_min_hit_rate * static_cast<double>(lookups)) {
        return {size, "a hit rate near autoscale.servers_min_hit_rate: keep the size"};
      }
    }
    if (options_.servers_max_push_ms > 0) {
      judged = true;
      const std::optional<double> p99 = QuantileBound(recent.pushes, 0.99);
      if (recent.pushes.count >= kMinPushes &&
          (!p99.has_value() || 1e3 * *p99 >= 0.5 * options_.servers_max_push_ms)) {
        return {size, absl::StrCat("ps[", server.slot, "]'s push p99 is above half of "
                                   "autoscale.servers_max_push_ms: keep the size")};
      }
    }
  }
  if (!judged) return {size, "no rule can tell an idle server (no budget, no other rule set)"};
  if (options_.servers_min_hit_rate > 0) absl::StrAppend(&room, room.empty() ? "" : ", ",
                                                         "hit rates held");
  if (options_.servers_max_push_ms > 0) absl::StrAppend(&room, room.empty() ? "" : ", ",
                                                        "push p99 under half the limit");
  return {size - 1, absl::StrCat("idle with one server fewer (", room, "): one server fewer")};
}

AutoscaleDecision ServerScalePolicy::Decide(const std::vector<ServerReading>& servers,
                                            const std::string& changing, absl::Time now) {
  AutoscaleDecision decision;
  decision.time = now;
  decision.previous = target();
  decision.target = target();
  std::map<uint32_t, Since> since;
  for (const ServerReading& server : servers) since[server.slot] = Difference(server);
  previous_.clear();
  for (const ServerReading& server : servers) previous_[server.slot] = server;
  if (!changing.empty() || servers.empty()) {
    decision.rule = absl::StrCat(servers.empty() ? "no live server" : changing, ": keeping ",
                                 target(), " server(s)");
    last_ = decision;
    return decision;
  }
  // Settled: the size is the servers the job has (some may have been
  // started or drained by hand since the last decision).
  stabilizer_.Follow(static_cast<int64_t>(servers.size()));
  auto [recommended, why] = Recommend(servers, since);
  recommended = ClampSize(recommended, options_.min_servers, "autoscale.min_servers",
                          options_.max_servers, "autoscale.max_servers", &why);
  decision.rule = why;
  stabilizer_.Settle(recommended, now, &decision);
  last_ = decision;
  return decision;
}

}  // namespace eps
