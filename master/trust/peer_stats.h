// What a peer's heartbeat may carry before the master keeps it: the stats
// of a worker or a server are bounded in size and in the metric series
// they can make, whatever the peer sends (one holder of the worker key
// must not grow the master, or /metrics, at will).
//
//   - every histogram is absent or has exactly the buckets eps's own
//     histograms have (LatencyHistogram, CountHistogram: core/metrics.h),
//     so it adds no series of the peer's choosing;
//   - at most kMaxBatchSizeChanges batch-size changes, each reason at most
//     kMaxReasonBytes;
//   - a server's storage error at most kMaxStorageErrorBytes.
//
// Fields this master does not know are dropped (a newer peer is not
// refused for them).

#ifndef EPS_MASTER_TRUST_PEER_STATS_H_
#define EPS_MASTER_TRUST_PEER_STATS_H_

#include <cstddef>
#include <string>

#include "core/status.h"
#include "proto/eps.pb.h"
#include "worker/batch_sizer.h"

namespace eps {

// What a worker keeps and sends (WorkerBatchSize::kChangesKept).
inline constexpr int kMaxBatchSizeChanges = static_cast<int>(WorkerBatchSize::kChangesKept);
inline constexpr size_t kMaxReasonBytes = 128;
inline constexpr size_t kMaxStorageErrorBytes = 4096;

// OK, or kInvalidArgument naming the first field out of bounds. Drops the
// unknown fields of `stats` either way.
Status CheckWorkerStats(proto::WorkerStats& stats);
Status CheckServerStats(proto::ServerStats& stats, const std::string& storage_error);

}  // namespace eps

#endif  // EPS_MASTER_TRUST_PEER_STATS_H_
