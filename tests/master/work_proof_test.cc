// Tests master/trust/work_proof.h with scripted commits and receipts.

#include "master/trust/work_proof.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

class WorkProofTest : public ::testing::Test {
 protected:
  WorkProofTest() : key_(WorkerCredentials::FromKey(std::string(32, 'k')).value()) {
    commit_.set_shard_id(7);
    commit_.set_epoch(1);
    commit_.set_phase(proto::TRAIN);
    commit_.set_begin_offset(1000);
    commit_.set_end_offset(9000);
    commit_.set_lines(100);
    commit_.set_malformed(4);
    commit_.set_loss_sum(60.0);
  }

  // A server's receipt for worker `worker`'s push of `records` records of
  // `commit_`'s range (or of `end` instead of its end).
  void AddReceipt(uint32_t worker, uint32_t records, uint64_t end = 9000) {
    proto::WorkBatch batch;
    batch.set_shard_id(commit_.shard_id());
    batch.set_epoch(commit_.epoch());
    batch.set_begin_offset(commit_.begin_offset());
    batch.set_end_offset(end);
    batch.set_records(records);
    proto::WorkReceipt* receipt = commit_.add_receipts();
    receipt->set_records(records);
    receipt->set_tag(key_.Receipt(worker, batch));
  }

  WorkerCredentials key_;
  proto::CommitProgressRequest commit_;
};

TEST_F(WorkProofTest, ReceiptsCoveringTheValidRecordsProveTheCommit) {
  AddReceipt(3, 96);
  EXPECT_TRUE(CheckWorkProof(key_, 3, commit_).ok());
}

TEST_F(WorkProofTest, AStepMadeInPiecesIsProvenByTheirReceiptsTogether) {
  AddReceipt(3, 48);
  AddReceipt(3, 48);
  EXPECT_TRUE(CheckWorkProof(key_, 3, commit_).ok());
}

TEST_F(WorkProofTest, ACommitOverThePushedCountIsRefused) {
  AddReceipt(3, 50);
  const Status refused = CheckWorkProof(key_, 3, commit_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("committed 96 records of shard 7 [1000, 9000)"));
  EXPECT_THAT(refused.message(), HasSubstr("prove pushes of 50"));
}

TEST_F(WorkProofTest, ACommitWithNoReceiptsIsRefused) {
  EXPECT_THAT(CheckWorkProof(key_, 3, commit_).message(), HasSubstr("prove pushes of 0"));
}

TEST_F(WorkProofTest, AllMalformedNeedsNoPush) {
  commit_.set_malformed(100);
  EXPECT_TRUE(CheckWorkProof(key_, 3, commit_).ok());
}

TEST_F(WorkProofTest, AnotherWorkersReceiptProvesNothing) {
  AddReceipt(4, 96);
  EXPECT_THAT(CheckWorkProof(key_, 3, commit_).message(),
              HasSubstr("receipt 0 that no server of the job made for it"));
}

TEST_F(WorkProofTest, AReceiptForAnotherRangeProvesNothing) {
  AddReceipt(3, 96, /*end=*/8000);
  EXPECT_EQ(CheckWorkProof(key_, 3, commit_).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(WorkProofTest, AReceiptMadeWithAnotherKeyProvesNothing) {
  const WorkerCredentials other = WorkerCredentials::FromKey(std::string(32, 'x')).value();
  AddReceipt(3, 96);
  EXPECT_TRUE(CheckWorkProof(key_, 3, commit_).ok());
  EXPECT_EQ(CheckWorkProof(other, 3, commit_).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(WorkProofTest, EvaluationAndDivergedCommitsAreNotHeldToReceipts) {
  commit_.set_phase(proto::EVAL);
  EXPECT_TRUE(CheckWorkProof(key_, 3, commit_).ok());
  commit_.set_phase(proto::TRAIN);
  commit_.set_loss_sum(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(CheckWorkProof(key_, 3, commit_).ok()) << "the job stops on it; nothing was pushed";
}

}  // namespace
}  // namespace eps
