// RowQuota: how many rows each worker may create on a server per second
// (ps.max_new_rows_per_worker_s), and all workers together
// (ps.max_new_rows_s), so that one worker pulling fresh keys (a bug, or a
// holder of the job's worker key), or one registered under many ids,
// cannot grow a server at will.
//
// A token bucket per worker holding one second's worth of rows. The rows a
// request creates are known only once it ran, so a request may take the
// bucket into debt; the worker's next requests are refused (Admit) until
// the bucket has refilled past zero. A refused request did nothing, so the
// worker retries it after a pause (reason SLOW_DOWN). A bucket that has
// refilled is forgotten (when its worker next asks, or by a sweep once many
// are kept), so memory follows the workers that create rows, not every id
// ever claimed, and once no worker creates rows Admit takes no lock. The
// total is one more bucket of the same kind, which every worker charges.
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_PS_ROW_QUOTA_H_
#define EPS_PS_ROW_QUOTA_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/status.h"
#include "core/token_bucket.h"

namespace eps {

class RowQuota {
 public:
  // `rows_per_s` per worker and `total_rows_s` for all together, 0:
  // unlimited. `clock` must outlive this.
  RowQuota(uint64_t rows_per_s, const Clock* clock, uint64_t total_rows_s = 0)
      : rows_per_s_(rows_per_s),
        total_rows_s_(total_rows_s),
        clock_(clock),
        total_(static_cast<double>(total_rows_s), static_cast<double>(total_rows_s),
               absl::InfinitePast()) {}

  // OK when `worker` may create rows now; kResourceExhausted with reason
  // SLOW_DOWN while it, or all workers together, owe rows.
  Status Admit(uint32_t worker) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts `rows` that a request of `worker` created.
  void Charge(uint32_t worker, uint64_t rows) ABSL_LOCKS_EXCLUDED(mu_);
  // Workers whose bucket is kept (not full when last looked at).
  size_t workers_kept() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t rows_per_s_;
  const uint64_t total_rows_s_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  // Only workers whose bucket is not full.
  absl::flat_hash_map<uint32_t, TokenBucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> kept_{0};  // buckets_.size(), read without mu_
  // All workers' bucket, and whether it is full (read without mu_).
  TokenBucket total_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> total_full_{true};
};

}  // namespace eps

#endif  // EPS_PS_ROW_QUOTA_H_
