// Tests JobControl's partition moves (master/job_moves.cc, docs/design.md
// 2.20) with scripted time: a drain queues a move per partition, each move
// runs COPY, HANDOFF and TAIL and commits with the next map version, a
// failed step gives the move up with a newer map and tries it again.

#include <cstdint>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/job_control.h"
#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

using Step = proto::MovePartitionRequest;

class JobControlMovesTest : public JobControlTest {
 protected:
  // Runs the next step of the move in progress with a reply of `rows`
  // rows (or `error`); the step that was sent.
  std::optional<JobControl::MoveStep> RunStep(absl::Time now, uint64_t rows = 10,
                                              Status error = absl::OkStatus()) {
    std::optional<JobControl::MoveStep> step = control_->NextMoveStep(now);
    if (!step.has_value()) return step;
    proto::MovePartitionReply reply;
    reply.set_rows(rows);
    reply.set_bytes(rows * 100);
    control_->MoveStepDone(*step, error.ok() ? StatusOr<proto::MovePartitionReply>(reply)
                                             : StatusOr<proto::MovePartitionReply>(error),
                           now);
    return step;
  }
};

TEST_F(JobControlMovesTest, ADrainMovesEachPartitionStepByStepAndCommitsWithTheMap) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  EXPECT_FALSE(control_->NextMoveStep(t0_).has_value()) << "nothing to move";
  EXPECT_EQ(control_->Drain(7).status().code(), absl::StatusCode::kNotFound);
  StatusOr<nlohmann::json> drained = control_->Drain(0);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ((*drained)["moves_queued"], 4) << "8 partitions on 2 servers";
  // ps[1] is the last server able to hold them.
  EXPECT_EQ(control_->Drain(1).status().code(), absl::StatusCode::kFailedPrecondition);
  // Saved: a restarted master moves what the drained server still holds.
  ASSERT_EQ(control_->SaveRecord().draining_servers_size(), 1);
  EXPECT_EQ(control_->SaveRecord().draining_servers(0), 0u);

  const std::string from_endpoint = control_->membership().servers().at(0).endpoint;
  for (int move = 0; move < 4; ++move) {
    const uint64_t version = control_->membership().cluster_map().version();
    std::optional<JobControl::MoveStep> copy = RunStep(At(move * 100));
    ASSERT_TRUE(copy.has_value());
    const uint32_t p = copy->request.partition();
    EXPECT_EQ(copy->request.step(), Step::COPY);
    EXPECT_EQ(copy->target.first, 1u) << "the new owner copies";
    EXPECT_EQ(copy->request.from_server(), 0u);
    EXPECT_EQ(copy->request.from_endpoint(), from_endpoint);
    EXPECT_EQ(copy->request.map_version(), version);
    EXPECT_EQ(control_->membership().cluster_map().partition_owner(static_cast<int>(p)), 0u);

    std::optional<JobControl::MoveStep> handoff = control_->NextMoveStep(At(move * 100 + 10));
    ASSERT_TRUE(handoff.has_value());
    EXPECT_EQ(handoff->request.step(), Step::HANDOFF);
    EXPECT_EQ(handoff->target.first, 0u) << "the old owner hands off";
    // Saved before the old owner hears of it.
    EXPECT_EQ(control_->SaveRecord().partition_moving(), p);
    proto::MovePartitionReply handed;
    control_->MoveStepDone(*handoff, handed, At(move * 100 + 20));

    std::optional<JobControl::MoveStep> tail = RunStep(At(move * 100 + 50), 3);
    ASSERT_TRUE(tail.has_value());
    EXPECT_EQ(tail->request.step(), Step::TAIL);
    EXPECT_EQ(tail->target.first, 1u);
    EXPECT_EQ(control_->membership().cluster_map().partition_owner(static_cast<int>(p)), 1u);
    EXPECT_EQ(control_->membership().cluster_map().version(), version + 1);
    EXPECT_FALSE(control_->SaveRecord().has_partition_moving());
  }
  EXPECT_FALSE(control_->NextMoveStep(At(1000)).has_value());
  EXPECT_EQ(control_->membership().PartitionCounts().at(0), 0u);
  EXPECT_EQ(events_.Count("partition_move_started"), 4u);
  ASSERT_EQ(events_.Count("partition_moved"), 4u);
  const nlohmann::json first = events_.Named("partition_moved")[0];
  EXPECT_EQ(first["rows"], 13);
  EXPECT_EQ(first["from"], 0);
  EXPECT_EQ(first["to"], 1);
  EXPECT_DOUBLE_EQ(first["unavailable_ms"].get<double>(), 30.0) << "hand-off to commit";
  EXPECT_EQ(events_.Count("server_drained"), 1u);
  // Still listed: a drained server takes no partition again.
  EXPECT_EQ(control_->SaveRecord().draining_servers_size(), 1);
  StatusOr<nlohmann::json> again = control_->Drain(0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["drained"], true);
  const nlohmann::json moves = control_->moves().ToJson(At(1000));
  EXPECT_EQ(moves["done"], 4);
  EXPECT_EQ(moves["rows"], 4 * 13);
  EXPECT_TRUE(moves["in_progress"].is_null());
}

TEST_F(JobControlMovesTest, ADrainedServerLeavesTheJobAndIsToldToExit) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  while (RunStep(At(10)).has_value()) {
  }
  ASSERT_EQ(control_->membership().PartitionCounts().at(0), 0u);
  const uint64_t version = control_->membership().cluster_map().version();
  // The newest checkpoint is 0 (empty): no recovery reads a part of ps[0].
  control_->Tick(At(20));
  EXPECT_EQ(control_->membership().server(0), nullptr);
  ASSERT_NE(control_->membership().LeftServer(0), nullptr);
  EXPECT_EQ(*control_->membership().LeftServer(0), "tcp://127.0.0.1:5000");
  EXPECT_EQ(control_->membership().cluster_map().version(), version + 1);
  ASSERT_EQ(control_->membership().cluster_map().servers_size(), 1);
  EXPECT_EQ(control_->membership().cluster_map().servers(0).id(), 1u);
  EXPECT_TRUE(control_->membership().MissingServers().empty());
  EXPECT_EQ(events_.Count("server_left"), 1u);
  const proto::MasterRecord record = control_->SaveRecord();
  EXPECT_EQ(record.draining_servers_size(), 0);
  ASSERT_EQ(record.left_servers_size(), 1);
  EXPECT_EQ(record.left_servers(0).id(), 0u);
  // Its process hears it may go once the workers follow the map; the job
  // goes on.
  for (uint32_t worker : {0u, 1u}) {
    ASSERT_TRUE(WorkerBeat(worker, At(25), 0, nullptr, /*map_version=*/version + 1).ok());
  }
  proto::HeartbeatRequest beat;
  beat.set_endpoint("tcp://127.0.0.1:5000");
  proto::HeartbeatReply reply;
  ASSERT_TRUE(control_->Heartbeat(ServerNode(0), beat, /*map_version=*/0, At(30), &reply).ok());
  EXPECT_TRUE(reply.shutdown());
  EXPECT_EQ(reply.state(), proto::JOB_RUNNING);
  EXPECT_FALSE(control_->over());
  // Never given out again: not on its data dir, nor to a fresh server
  // (every slot left is alive: that is a join, in a new slot).
  Status back = RegisterServer(5000, 200, 0, At(40));
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(back.message(), ::testing::HasSubstr("left the job"));
  proto::RegisterServerReply joined;
  ASSERT_TRUE(RegisterServer(5009, 201, std::nullopt, At(50), &joined).ok());
  EXPECT_EQ(joined.server_id(), 2u);
  // A restarted master keeps it out.
  std::unique_ptr<JobControl> restarted = NewControl();
  ASSERT_TRUE(restarted->Restore(Snapshot(), /*resume=*/false, At(60)).ok());
  ASSERT_NE(restarted->membership().LeftServer(0), nullptr);
  EXPECT_EQ(restarted->membership().server(0), nullptr);
}

// A server's DEREGISTER, as ps/param_server_session.cc sends it.
proto::DeregisterRequest ServerLeaving(uint32_t slot, std::string endpoint) {
  proto::DeregisterRequest request;
  request.set_server_id(slot);
  request.set_endpoint(std::move(endpoint));
  return request;
}

TEST_F(JobControlMovesTest, AServerThatDeregistersIsDrained) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  // A replaced process of the slot (another endpoint) drains nothing.
  const Status replaced =
      control_->Deregister(ServerNode(1), ServerLeaving(1, "tcp://127.0.0.1:1"));
  EXPECT_EQ(replaced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(replaced), proto::FENCED);
  EXPECT_THAT(replaced.message(), ::testing::HasSubstr("was replaced"));
  EXPECT_EQ(control_->moves().ToJson(t0_)["queued"], 0);
  ASSERT_TRUE(
      control_->Deregister(ServerNode(1), ServerLeaving(1, control_->membership().server(1)->endpoint))
          .ok());
  EXPECT_EQ(control_->moves().ToJson(t0_)["queued"], 4);
  // ps[0] is the last server able to hold the partitions: it cannot leave.
  const Status last =
      control_->Deregister(ServerNode(0), ServerLeaving(0, control_->membership().server(0)->endpoint));
  EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(last.message(), ::testing::HasSubstr("only server left"));
}

TEST_F(JobControlMovesTest, ADrainedServerStaysUntilACheckpointNoLongerNeedsItsPart) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  proto::CheckpointRecord before;
  ASSERT_NO_FATAL_FAILURE(RecordCheckpoint(1, At(100), &before));
  ASSERT_TRUE(control_->Drain(0).ok());
  while (RunStep(At(200)).has_value()) {
  }
  // Checkpoint 1 holds ps[0]'s partitions in ps[0]'s part: a recovery
  // would read them there, so ps[0] stays and a checkpoint is asked for.
  control_->Tick(At(300));
  EXPECT_NE(control_->membership().server(0), nullptr);
  EXPECT_EQ(control_->checkpoints().round_id(), 2u);
  proto::CheckpointRecord after;
  ASSERT_NO_FATAL_FAILURE(RecordCheckpoint(2, At(400), &after));
  control_->Tick(At(500));
  EXPECT_EQ(control_->membership().server(0), nullptr);
  EXPECT_NE(control_->membership().LeftServer(0), nullptr);
}

// A retired server is told to exit only once every live worker says it
// routes by a map without it (a worker in a long step would otherwise meet a
// server that has gone), or one worker lease after its retirement.
class RetiredServerTest : public JobControlMovesTest {
 protected:
  // Drains ps[0] and retires it at At(20) (checkpoint 0 holds none of its
  // partitions).
  void SetUp() override {
    JobControlMovesTest::SetUp();
    ASSERT_NO_FATAL_FAILURE(StartTraining());
    ASSERT_TRUE(control_->Drain(0).ok());
    while (RunStep(At(10)).has_value()) {
    }
    endpoint_ = control_->membership().server(0)->endpoint;
    control_->Tick(At(20));
    ASSERT_NE(control_->membership().LeftServer(0), nullptr);
  }

  // The retired process's heartbeat at `now`: whether it is told to exit.
  bool ToldToExit(absl::Time now) {
    proto::HeartbeatRequest request;
    request.set_endpoint(endpoint_);
    proto::HeartbeatReply reply;
    EXPECT_TRUE(control_->Heartbeat(ServerNode(0), request, 0, now, &reply).ok());
    EXPECT_EQ(reply.state(), proto::JOB_RUNNING);
    if (!reply.shutdown()) EXPECT_EQ(reply.cluster_map_version(), 0u) << "no map names it";
    return reply.shutdown();
  }

  std::string endpoint_;
};

TEST_F(RetiredServerTest, ItExitsOnceNoLiveWorkerRoutesToIt) {
  const uint64_t without = control_->membership().cluster_map().version();
  // Worker 0 follows the map that retired ps[0]; worker 1 is in a long step.
  ASSERT_TRUE(WorkerBeat(0, At(30), 0, nullptr, without).ok());
  ASSERT_TRUE(WorkerBeat(1, At(30), 0, nullptr, without - 1).ok());
  EXPECT_FALSE(ToldToExit(At(40))) << "worker 1 may still send to it";
  ASSERT_TRUE(WorkerBeat(1, At(50), 0, nullptr, without).ok());
  EXPECT_TRUE(ToldToExit(At(60)));
}

TEST_F(RetiredServerTest, ItWaitsForAWorkerBehindAtMostALease) {
  const absl::Time lease_later = At(20) + absl::Milliseconds(kLeaseMs);
  for (absl::Time now : {At(30), lease_later - absl::Milliseconds(1)}) {
    for (uint32_t worker : {0u, 1u}) ASSERT_TRUE(WorkerBeat(worker, now).ok());
    EXPECT_FALSE(ToldToExit(now));
  }
  EXPECT_TRUE(ToldToExit(lease_later));
}

TEST_F(JobControlMovesTest, ADrainedServerThatDiesIsRetiredNotRecovered) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  while (RunStep(At(10)).has_value()) {
  }
  // Its lease runs out before the next tick would retire it.
  ASSERT_TRUE(ServerBeat(1, At(9000)).ok());
  for (uint32_t worker : {0u, 1u}) ASSERT_TRUE(WorkerBeat(worker, At(9000)).ok());
  control_->Tick(At(9000));
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_EQ(control_->membership().server(0), nullptr);
  EXPECT_NE(control_->membership().LeftServer(0), nullptr);
}

// A recovery gives the move in progress up and drops the queued ones (the
// restore may give partitions back to other owners): the drain plans them
// again once the job trains, and none of them counts as failed.
TEST_F(JobControlMovesTest, ARecoveryDropsTheQueuedMoves) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  ASSERT_TRUE(RunStep(t0_).has_value());  // the first move's COPY
  EXPECT_EQ(control_->moves().ToJson(t0_)["queued"], 3);
  // ps[1] stops heartbeating.
  ASSERT_TRUE(ServerBeat(0, At(9000)).ok());
  for (uint32_t worker : {0u, 1u}) ASSERT_TRUE(WorkerBeat(worker, At(9000)).ok());
  control_->Tick(At(9000));
  ASSERT_TRUE(control_->recovery().active());
  const nlohmann::json moves = control_->moves().ToJson(At(9000));
  EXPECT_EQ(moves["queued"], 0) << moves.dump();
  EXPECT_TRUE(moves["in_progress"].is_null()) << moves.dump();
  EXPECT_EQ(moves["failed"], 0) << moves.dump();
  EXPECT_EQ(events_.Count("partition_move_failed"), 1u) << "the one in progress";
  EXPECT_FALSE(control_->NextMoveStep(At(9001)).has_value()) << "not during the recovery";
  EXPECT_EQ(control_->SaveRecord().draining_servers_size(), 1) << "the drain goes on after";
}

TEST_F(JobControlMovesTest, AFailedStepGivesTheMoveUpWithANewerMapAndTriesAgain) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  const uint64_t version = control_->membership().cluster_map().version();
  std::optional<JobControl::MoveStep> copy =
      RunStep(t0_, 0, absl::UnavailableError("ps[1] died before it answered"));
  ASSERT_TRUE(copy.has_value());
  const uint32_t p = copy->request.partition();
  // A newer map ends the move on both servers; the old owner keeps it.
  EXPECT_EQ(control_->membership().cluster_map().version(), version + 1);
  EXPECT_EQ(control_->membership().cluster_map().partition_owner(static_cast<int>(p)), 0u);
  ASSERT_EQ(events_.Count("partition_move_failed"), 1u);
  EXPECT_EQ(events_.Named("partition_move_failed")[0]["retry"], true);
  // Tried again at the back of the queue; after 3 failures, given up.
  int failures = 1;
  while (failures < 3) {
    std::optional<JobControl::MoveStep> step = control_->NextMoveStep(At(failures));
    ASSERT_TRUE(step.has_value());
    if (step->request.partition() != p) {
      control_->MoveStepDone(*step, absl::UnavailableError("not this one"), At(failures));
      continue;
    }
    control_->MoveStepDone(*step, absl::UnavailableError("again"), At(failures));
    ++failures;
  }
  EXPECT_EQ(control_->moves().ToJson(At(10))["failed"], 1);
  EXPECT_EQ(events_.Named("partition_move_failed").back()["retry"], false);
  EXPECT_EQ(control_->membership().cluster_map().partition_owner(static_cast<int>(p)), 0u);
}

TEST_F(JobControlMovesTest, NoCheckpointRoundStartsDuringAMove) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  ASSERT_TRUE(RunStep(t0_).has_value());  // COPY done: HANDOFF next
  ASSERT_TRUE(control_->RequestCheckpoint().ok());
  control_->Tick(At(10));
  EXPECT_FALSE(control_->checkpoints().round_id().has_value());
  ASSERT_TRUE(RunStep(At(20)).has_value());  // HANDOFF
  ASSERT_TRUE(RunStep(At(30)).has_value());  // TAIL: committed
  control_->Tick(At(40));
  EXPECT_TRUE(control_->checkpoints().round_id().has_value());
  // And no move step while the round runs.
  EXPECT_FALSE(control_->NextMoveStep(At(50)).has_value());
}

TEST_F(JobControlMovesTest, AJoinedServerGetsItsShareOfThePartitions) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  proto::RegisterServerReply reply;
  ASSERT_TRUE(RegisterServer(5002, 102, std::nullopt, t0_, &reply).ok());
  EXPECT_EQ(reply.server_id(), 2u);
  EXPECT_EQ(events_.Count("server_joined"), 1u);
  EXPECT_TRUE(control_->SaveRecord().balancing_servers());
  // 4 + 4 + 0 becomes 3 + 3 + 2: two moves to the new server.
  int moves = 0;
  while (std::optional<JobControl::MoveStep> step = RunStep(At(moves * 10))) {
    if (step->request.step() == Step::COPY) {
      EXPECT_EQ(step->target.first, 2u);
      ++moves;
    }
    ASSERT_LT(moves, 10);
  }
  EXPECT_EQ(moves, 2);
  const std::map<uint32_t, uint32_t> counts = control_->membership().PartitionCounts();
  EXPECT_EQ(counts.at(0), 3u);
  EXPECT_EQ(counts.at(1), 3u);
  EXPECT_EQ(counts.at(2), 2u);
  EXPECT_FALSE(control_->SaveRecord().balancing_servers()) << "balanced";
}

TEST_F(JobControlMovesTest, AMoveThatSawAnotherMapIsGivenUp) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  std::optional<JobControl::MoveStep> copy = RunStep(t0_);
  ASSERT_TRUE(copy.has_value());
  // A server joins during the move: the old owner takes the partition back
  // when it sees the new map, so the move must not commit.
  ASSERT_TRUE(RegisterServer(5002, 102, std::nullopt, At(1)).ok());
  ASSERT_TRUE(RunStep(At(2)).has_value());  // HANDOFF
  ASSERT_TRUE(RunStep(At(3)).has_value());  // TAIL
  EXPECT_EQ(events_.Count("partition_moved"), 0u);
  EXPECT_EQ(events_.Count("partition_move_failed"), 1u);
  EXPECT_EQ(control_->membership().cluster_map().partition_owner(
                static_cast<int>(copy->request.partition())),
            0u);
}

// A DEREGISTER names its slot and its endpoint, both checked always: one
// naming another slot, or no slot, or no endpoint, or another process's
// endpoint drains nothing and is counted (/metrics).
TEST_F(JobControlMovesTest, ADeregisterNamesItsOwnSlotAndEndpoint) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  const std::string endpoint = control_->membership().server(1)->endpoint;
  const auto request = [](std::string endpoint, std::optional<uint32_t> slot) {
    if (slot.has_value()) return ServerLeaving(*slot, std::move(endpoint));
    proto::DeregisterRequest body;
    body.set_endpoint(std::move(endpoint));
    return body;
  };
  EXPECT_EQ(control_->Deregister(ServerNode(1), request(endpoint, 0)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(control_->Deregister(ServerNode(1), request(endpoint, std::nullopt)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(control_->Deregister(ServerNode(1), request("", 1)).code(),
            absl::StatusCode::kInvalidArgument);
  // Slot 0 named, with ps[1]'s endpoint.
  const Status other = control_->Deregister(ServerNode(0), request(endpoint, 0));
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(other), proto::FENCED);
  EXPECT_EQ(control_->moves().ToJson(t0_)["queued"], 0);
  EXPECT_TRUE(control_->drains().leaving().empty());
  EXPECT_EQ(control_->deregisters_refused(), 4u);
  ASSERT_TRUE(control_->Deregister(ServerNode(1), request(endpoint, 1)).ok());
  EXPECT_EQ(control_->moves().ToJson(t0_)["queued"], 4);
  EXPECT_EQ(control_->deregisters_refused(), 4u);
}

// The old owner learns from its heartbeats' replies which server the
// master named as the new owner of the move in progress.
TEST_F(JobControlMovesTest, TheOldOwnerHearsWhichServerTakesThePartition) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  ASSERT_TRUE(control_->Drain(0).ok());
  std::optional<JobControl::MoveStep> copy = control_->NextMoveStep(t0_);
  ASSERT_TRUE(copy.has_value());
  const auto beat = [&](uint32_t slot) {
    proto::HeartbeatRequest request;
    request.set_endpoint(control_->membership().server(slot)->endpoint);
    proto::HeartbeatReply reply;
    const Status status = control_->Heartbeat(ServerNode(slot), request, /*map_version=*/0, At(1), &reply);
    EXPECT_TRUE(status.ok()) << status;
    return reply;
  };
  const proto::HeartbeatReply old_owner = beat(0);
  ASSERT_EQ(old_owner.moves_out_size(), 1);
  EXPECT_EQ(old_owner.moves_out(0).partition(), copy->request.partition());
  EXPECT_EQ(old_owner.moves_out(0).to_server(), 1u);
  EXPECT_EQ(old_owner.moves_out(0).map_version(), copy->request.map_version());
  EXPECT_EQ(beat(1).moves_out_size(), 0) << "not the old owner";
  // Given up: named to nobody.
  control_->MoveStepDone(*copy, absl::UnavailableError("gone"), At(2));
  EXPECT_EQ(beat(0).moves_out_size(), 0);
}

// A new owner that never copies: its moves are given up after
// PartitionMoves::kMaxAttempts tries, and no move goes to it again (a
// balance would otherwise give it the partitions without end).
TEST_F(JobControlMovesTest, ANewOwnerThatNeverCopiesIsGivenUpAndNotChosenAgain) {
  ASSERT_NO_FATAL_FAILURE(StartTraining());
  proto::RegisterServerReply joined;
  ASSERT_TRUE(RegisterServer(5002, 102, std::nullopt, t0_, &joined).ok());
  ASSERT_EQ(joined.server_id(), 2u);
  int copies = 0;
  while (std::optional<JobControl::MoveStep> step =
             RunStep(At(copies), 0, absl::UnavailableError("ps[2] copies nothing"))) {
    EXPECT_EQ(step->request.step(), Step::COPY);
    EXPECT_EQ(step->target.first, 2u);
    ++copies;
    ASSERT_LT(copies, 20) << "retried without end";
  }
  // Two moves planned; the first to fail 3 times ends both.
  EXPECT_EQ(copies, 5);
  EXPECT_TRUE(control_->excluded_new_owners().contains(2));
  EXPECT_EQ(events_.Count("move_target_excluded"), 1u);
  EXPECT_FALSE(control_->SaveRecord().balancing_servers());
  EXPECT_FALSE(control_->NextMoveStep(At(100)).has_value());
  // A drain goes to the other servers only.
  ASSERT_TRUE(control_->Drain(0).ok());
  std::optional<JobControl::MoveStep> copy = control_->NextMoveStep(At(110));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->target.first, 1u);
}

}  // namespace
}  // namespace eps
