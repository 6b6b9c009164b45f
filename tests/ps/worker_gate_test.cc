// Tests ps/worker_gate.h: a fenced worker gets nothing through; a push is
// applied once, and again after a restore forgot it; a receipt is given
// for an applied push and its repeat only; and a push racing its worker's
// fence is either recorded before it or refused.

#include "ps/worker_gate.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/security.h"

namespace eps {
namespace {

proto::NodeId Node(proto::Role role, uint32_t id) {
  proto::NodeId node;
  node.set_role(role);
  node.set_id(id);
  return node;
}
proto::NodeId Worker(uint32_t id) { return Node(proto::ROLE_WORKER, id); }

proto::WorkBatch Batch(uint64_t shard, uint64_t begin) {
  proto::WorkBatch batch;
  batch.set_shard_id(shard);
  batch.set_begin_offset(begin);
  batch.set_end_offset(begin + 100);
  batch.set_records(10);
  return batch;
}

TEST(WorkerGate, AFencedWorkerGetsNothingThroughAndOthersPass) {
  WorkerGate gate;
  EXPECT_TRUE(gate.CheckNotFenced(Worker(3)).ok());
  const std::vector<uint32_t> workers = {3, 4};
  WorkerGate::Fenced fenced = gate.Fence(workers);
  EXPECT_EQ(fenced.added, workers);
  EXPECT_EQ(fenced.total, 2u);
  const Status refused = gate.CheckNotFenced(Worker(3));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), proto::FENCED);
  EXPECT_EQ(gate.AdmitPush(Worker(4), 1), WorkerGate::Push::kFenced);
  EXPECT_TRUE(gate.CheckNotFenced(Worker(5)).ok());
  // The master and servers have no lease to lose here, whatever their id.
  EXPECT_TRUE(gate.CheckNotFenced(Node(proto::ROLE_MASTER, 3)).ok());
  EXPECT_EQ(gate.AdmitPush(Node(proto::ROLE_TOOL, 3), 1), WorkerGate::Push::kFirstTime);
  // Fencing again adds nobody.
  const std::vector<uint32_t> again = {3, 6};
  fenced = gate.Fence(again);
  EXPECT_EQ(fenced.added, std::vector<uint32_t>{6});
  EXPECT_EQ(fenced.total, 3u);
}

TEST(WorkerGate, APushIsAppliedOnceUntilARestoreForgetsIt) {
  WorkerGate gate;
  EXPECT_EQ(gate.AdmitPush(Worker(1), 1), WorkerGate::Push::kFirstTime);
  EXPECT_EQ(gate.AdmitPush(Worker(1), 1), WorkerGate::Push::kRepeat);
  EXPECT_EQ(gate.AdmitPush(Worker(2), 1), WorkerGate::Push::kFirstTime) << "per worker";
  gate.ForgetPushes();
  EXPECT_EQ(gate.AdmitPush(Worker(1), 1), WorkerGate::Push::kFirstTime);
}

TEST(WorkerGate, AReceiptIsForAnAppliedPushAndItsRepeatOnly) {
  WorkerGate gate;
  const proto::WorkBatch batch = Batch(7, 0);
  EXPECT_TRUE(gate.ReceiptFor(1, 1, batch, /*first_time=*/true).empty()) << "no key: no CURVE";
  const WorkerCredentials key = WorkerCredentials::FromKey(std::string(32, 'k')).value();
  gate.SetReceiptKey(key);
  const std::string receipt = gate.ReceiptFor(1, 2, batch, /*first_time=*/true);
  EXPECT_EQ(receipt, key.Receipt(1, batch));
  EXPECT_EQ(gate.ReceiptFor(1, 2, batch, /*first_time=*/false), receipt) << "the reply was lost";
  EXPECT_TRUE(gate.ReceiptFor(1, 2, Batch(7, 100), false).empty()) << "another batch";
  EXPECT_TRUE(gate.ReceiptFor(1, 1, batch, false).empty()) << "an older push";
  EXPECT_TRUE(gate.ReceiptFor(2, 2, batch, false).empty()) << "another worker";
  // Once fenced, its last receipt is forgotten too.
  const std::vector<uint32_t> workers = {1};
  gate.Fence(workers);
  EXPECT_TRUE(gate.ReceiptFor(1, 2, batch, false).empty());
}

TEST(WorkerGate, APushRacingItsFenceIsRecordedBeforeItOrRefused) {
  for (int round = 0; round < 20; ++round) {
    WorkerGate gate;
    std::atomic<bool> fenced{false};
    std::atomic<int> admitted_after_fence{0};
    std::thread pusher([&] {
      for (uint64_t seq = 1; seq <= 2000; ++seq) {
        const bool was_fenced = fenced.load();
        const WorkerGate::Push push = gate.AdmitPush(Worker(9), seq);
        if (was_fenced && push != WorkerGate::Push::kFenced) admitted_after_fence.fetch_add(1);
      }
    });
    const std::vector<uint32_t> workers = {9};
    gate.Fence(workers);
    fenced.store(true);
    pusher.join();
    EXPECT_EQ(admitted_after_fence.load(), 0);
    EXPECT_EQ(gate.AdmitPush(Worker(9), 5000), WorkerGate::Push::kFenced);
  }
}

}  // namespace
}  // namespace eps
