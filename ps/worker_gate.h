// WorkerGate: what a parameter server lets through from workers. The fence
// list and which pushes were applied, under one reader-writer lock, and the
// receipts of applied pushes, under a second one taken after it:
//   - a fenced worker's PULL and PUSH are refused FENCED;
//   - a push passes the fence and is recorded (PushDeduplicator: applied
//     once per server process) in one step with the lock held shared, and
//     fencing takes it exclusively and forgets the worker's pushes and its
//     last receipt: so a push is either recorded before its worker is
//     fenced (and forgotten with it) or refused, and no push record is
//     kept for a fenced worker (a push admitted just before its fence may
//     still leave its receipt, which no later push of the worker can use);
//   - under CURVE (SetReceiptKey) an applied push earns a receipt,
//     HMAC(K, worker, batch) (WorkerCredentials::Receipt). A repeat of the
//     worker's last push gets it again; a repeat of an older one, or one
//     naming another batch, gets none: a push applied once is one receipt;
//   - a restore forgets which pushes were applied (ForgetPushes): what was
//     applied before it is gone, so a retry of it must be applied again.
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_PS_WORKER_GATE_H_
#define EPS_PS_WORKER_GATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "proto/eps.pb.h"
#include "ps/push_deduplicator.h"
#include "rpc/security.h"

namespace eps {

class WorkerGate {
 public:
  WorkerGate() : dedup_(std::make_unique<PushDeduplicator>()) {}

  // FENCED (kFailedPrecondition) when `sender` is a fenced worker; every
  // other sender passes.
  Status CheckNotFenced(const proto::NodeId& sender) const ABSL_LOCKS_EXCLUDED(mu_);
  // The refusal of fenced worker `worker`'s calls.
  static Status FencedError(uint32_t worker);

  enum class Push { kFenced, kFirstTime, kRepeat };
  // Push `seq` of `sender`, valid and about to be applied: refused when the
  // sender is fenced, else whether it is applied for the first time (a
  // sender that is not a worker has no sequence of its own: always).
  Push AdmitPush(const proto::NodeId& sender, uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // What AdmitPush would answer now, recording nothing.
  Push PeekPush(const proto::NodeId& sender, uint64_t seq) const ABSL_LOCKS_EXCLUDED(mu_);

  struct Fenced {
    std::vector<uint32_t> added;  // fenced by this call
    size_t total = 0;             // fenced in all
  };
  // Fences `workers`: from now on nothing of theirs passes.
  Fenced Fence(std::span<const uint32_t> workers) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets which pushes were applied (a restore replaced every row).
  void ForgetPushes() ABSL_LOCKS_EXCLUDED(mu_);

  // The key receipts are made with (the master's key of workers'
  // credentials): receipts are given from now on.
  void SetReceiptKey(WorkerCredentials key) ABSL_LOCKS_EXCLUDED(receipts_mu_);
  // The receipt for worker `sender`'s push `seq` of `batch`; `first_time`:
  // applied now (else a repeat). Empty when none is due.
  std::string ReceiptFor(uint32_t sender, uint64_t seq, const proto::WorkBatch& batch,
                         bool first_time) ABSL_LOCKS_EXCLUDED(receipts_mu_);

 private:
  bool IsFenced(const proto::NodeId& sender) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_set<uint32_t> fenced_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PushDeduplicator> dedup_ ABSL_GUARDED_BY(mu_);

  absl::Mutex receipts_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // Set once the server registered; the HMAC is made outside the lock.
  std::shared_ptr<const WorkerCredentials> receipt_key_ ABSL_GUARDED_BY(receipts_mu_);
  struct LastReceipt {
    uint64_t seq = 0;
    std::string tag;
  };
  absl::flat_hash_map<uint32_t, LastReceipt> last_receipts_ ABSL_GUARDED_BY(receipts_mu_);
};

}  // namespace eps

#endif  // EPS_PS_WORKER_GATE_H_
