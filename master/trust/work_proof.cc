#include "master/trust/work_proof.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace eps {

Status CheckWorkProof(const WorkerCredentials& key, uint32_t worker,
                      const proto::CommitProgressRequest& commit) {
  if (commit.phase() != proto::TRAIN || !std::isfinite(commit.loss_sum())) {
    return absl::OkStatus();
  }
  const uint64_t claimed =
      commit.lines() >= commit.malformed() ? commit.lines() - commit.malformed() : 0;
  proto::WorkBatch batch;
  batch.set_shard_id(commit.shard_id());
  batch.set_epoch(commit.epoch());
  batch.set_begin_offset(commit.begin_offset());
  batch.set_end_offset(commit.end_offset());
  uint64_t proven = 0;
  for (int i = 0; i < commit.receipts_size(); ++i) {
    const proto::WorkReceipt& receipt = commit.receipts(i);
    batch.set_records(receipt.records());
    if (!key.VerifyReceipt(worker, batch, receipt.tag())) {
      return absl::PermissionDeniedError(
          absl::StrCat("its commit of shard ", commit.shard_id(), " [", commit.begin_offset(), ", ",
                       commit.end_offset(), ") carries receipt ", i,
                       " that no server of the job made for it"));
    }
    proven += receipt.records();
  }
  if (proven == claimed) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("it committed ", claimed, " records of shard ", commit.shard_id(), " [",
                   commit.begin_offset(), ", ", commit.end_offset(), ") but the servers' receipts",
                   " prove pushes of ", proven));
}

}  // namespace eps
