#include "master/trust/peer_stats.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "core/metrics.h"

namespace eps {
namespace {

// Absent, or the buckets of eps's histograms of that kind.
Status CheckHistogram(const proto::Histogram& histogram, std::span<const double> bounds,
                      const char* name) {
  if (histogram.bounds_size() == 0 && histogram.counts_size() == 0) return absl::OkStatus();
  const bool same = static_cast<size_t>(histogram.bounds_size()) == bounds.size() &&
                    std::equal(bounds.begin(), bounds.end(), histogram.bounds().begin()) &&
                    static_cast<size_t>(histogram.counts_size()) == bounds.size() + 1;
  if (!same) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat: histogram ", name, " has ", histogram.bounds_size(), " bounds and ",
        histogram.counts_size(), " counts, not eps's ", bounds.size(), " buckets"));
  }
  return absl::OkStatus();
}

}  // namespace

Status CheckWorkerStats(proto::WorkerStats& stats) {
  stats.DiscardUnknownFields();
  const std::span<const double> latency = LatencyHistogram::Bounds();
  RETURN_IF_ERROR(CheckHistogram(stats.pull_latency(), latency, "pull_latency"));
  RETURN_IF_ERROR(CheckHistogram(stats.push_latency(), latency, "push_latency"));
  RETURN_IF_ERROR(CheckHistogram(stats.staleness_wait(), latency, "staleness_wait"));
  RETURN_IF_ERROR(CheckHistogram(stats.batch_wait(), latency, "batch_wait"));
  RETURN_IF_ERROR(CheckHistogram(stats.compute(), latency, "compute"));
  RETURN_IF_ERROR(CheckHistogram(stats.push_wait(), latency, "push_wait"));
  RETURN_IF_ERROR(
      CheckHistogram(stats.dense_staleness(), CountHistogram::Bounds(), "dense_staleness"));
  if (stats.batch_size_changes_size() > kMaxBatchSizeChanges) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat: ", stats.batch_size_changes_size(),
                                                   " batch-size changes, more than ",
                                                   kMaxBatchSizeChanges));
  }
  for (const proto::BatchSizeChange& change : stats.batch_size_changes()) {
    if (change.reason().size() > kMaxReasonBytes) {
      return absl::InvalidArgumentError(absl::StrCat("heartbeat: a batch-size change's reason of ",
                                                     change.reason().size(),
                                                     " bytes, more than ", kMaxReasonBytes));
    }
  }
  return absl::OkStatus();
}

Status CheckServerStats(proto::ServerStats& stats, const std::string& storage_error) {
  stats.DiscardUnknownFields();
  const std::span<const double> latency = LatencyHistogram::Bounds();
  RETURN_IF_ERROR(CheckHistogram(stats.pull_latency(), latency, "pull_latency"));
  RETURN_IF_ERROR(CheckHistogram(stats.push_latency(), latency, "push_latency"));
  RETURN_IF_ERROR(
      CheckHistogram(stats.dense_staleness(), CountHistogram::Bounds(), "dense_staleness"));
  if (storage_error.size() > kMaxStorageErrorBytes) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat: a storage error of ",
                                                   storage_error.size(), " bytes, more than ",
                                                   kMaxStorageErrorBytes));
  }
  return absl::OkStatus();
}

}  // namespace eps
