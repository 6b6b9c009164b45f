// Proven work: a training commit counts only the records the servers saw
// pushed for it.
//
// Under CURVE every push names its batch (PushRequest.batch: shard, epoch,
// byte range, records) and the server that applied it answers with a
// receipt, an HMAC of the batch and the pushing worker's id under the key
// of workers' credentials (WorkerCredentials::Receipt), which only the
// master and the servers hold. The worker's commit carries the receipts of
// its pushes; CheckWorkProof holds the commit to them. A worker key alone
// cannot make a receipt, so a worker that commits records it never pushed
// is caught at its first such commit (the master fences it and its shards
// are trained by others). What a receipt does not prove: that the pushed
// gradients are honest ones (docs/security.md).
//
// Thread-safety: a pure function.

#ifndef EPS_MASTER_TRUST_WORK_PROOF_H_
#define EPS_MASTER_TRUST_WORK_PROOF_H_

#include <cstdint>

#include "core/status.h"
#include "proto/eps.pb.h"
#include "rpc/security.h"

namespace eps {

// OK when `commit` is no training commit, carries a non-finite loss (the
// job stops on it: nothing of it was pushed), or its receipts are worker
// `worker`'s for the commit's shard, epoch and range and their records add
// up to its valid records (lines - malformed). kPermissionDenied otherwise,
// saying what was claimed and what the receipts prove.
Status CheckWorkProof(const WorkerCredentials& key, uint32_t worker,
                      const proto::CommitProgressRequest& commit);

}  // namespace eps

#endif  // EPS_MASTER_TRUST_WORK_PROOF_H_
