// The old owner's side of a partition move (ps/param_server_moves.cc,
// docs/design.md 2.20), spoken to as the new owner and the master would:
// the copy's pages, its catch-up rounds and the tail the hand-off leaves.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tests/ps/param_server_fixture.h"

namespace eps {
namespace {

class ParamServerMovesTest : public ParamServerTest {
 protected:
  // The keys that `request` reads, every page of it from its first on (as
  // the new owner); the error of the first page that fails.
  StatusOr<std::set<uint64_t>> FetchAll(proto::FetchPartitionRequest request) {
    std::set<uint64_t> keys;
    while (true) {
      Message message;
      message.header().set_method(proto::FETCH_PARTITION);
      *message.header().mutable_fetch_partition_request() = request;
      ASSIGN_OR_RETURN(Message reply, CallOn(new_owner_, std::move(message)));
      const proto::FetchPartitionReply& body = reply.header().fetch_partition_reply();
      for (int i = 0; i < body.table_ids_size(); ++i) {
        ASSIGN_OR_RETURN(std::span<const uint64_t> page, reply.Array<uint64_t>(2 * i));
        keys.insert(page.begin(), page.end());
      }
      if (body.done()) return keys;
      request.set_table(body.next_table());
      request.set_key(body.next_key());
    }
  }

  proto::FetchPartitionRequest Page(uint32_t partition) const {
    proto::FetchPartitionRequest request;
    request.set_partition(partition);
    request.set_max_rows(2);  // several pages
    request.set_map_version(1);
    return request;
  }

  // MOVE_PARTITION HANDOFF of `partition` (as the master); the rows pushed
  // to since the last catch-up round, as the reply counts them.
  StatusOr<uint64_t> HandOff(uint32_t partition) {
    Message message;
    message.header().set_method(proto::MOVE_PARTITION);
    proto::MovePartitionRequest* body = message.header().mutable_move_partition_request();
    body->set_step(proto::MovePartitionRequest::HANDOFF);
    body->set_partition(partition);
    body->set_from_server(kServerId);
    body->set_map_version(1);
    ASSIGN_OR_RETURN(Message reply, CallOn(master_channel_, std::move(message)));
    return reply.header().move_partition_reply().rows();
  }

  // The master names `new_owner_` as the new owner of `partition` (at map
  // version 1) in the heartbeats' replies.
  void StartMoveTo(uint32_t partition, uint32_t to = kOtherServerId) {
    proto::MoveNotice move;
    move.set_partition(partition);
    move.set_to_server(to);
    move.set_map_version(1);
    master_->set_moves_out({move});
  }

  RpcChannel new_owner_{&factory_, Node(proto::ROLE_SERVER, kOtherServerId)};
};

// The copy's pages read the old owner's store; its first catch-up round
// reads from memory the rows the store lacked when the copy began and those
// pushed to since, while the old owner serves on; later rounds and the
// hand-off's tail hold only the keys pushed to since the round before, so
// the time a key is refused no longer grows with the copy's.
TEST_F(ParamServerMovesTest, CatchUpRoundsLeaveTheHandOffOnlyTheKeysPushedSince) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(StartServer(OptionsWithDataDir(dir.Join("ps"))));
  ASSERT_NO_FATAL_FAILURE(AwaitMap());
  const std::vector<uint64_t> here = EmbKeys(200, /*here=*/true);
  const uint32_t p = PartitionOf(here[0], kPartitions);
  std::vector<uint64_t> keys;
  for (uint64_t key : here) {
    if (PartitionOf(key, kPartitions) == p) keys.push_back(key);
  }
  ASSERT_GE(keys.size(), 5u);
  const std::set<uint64_t> all(keys.begin(), keys.end());
  const auto push = [&](std::vector<uint64_t> pushed) {
    const Status status = Push(kEmb, pushed, std::vector<float>(pushed.size() * kDim, 1.0f));
    ASSERT_TRUE(status.ok()) << status;
  };
  ASSERT_NO_FATAL_FAILURE(push(keys));

  StartMoveTo(p);
  StatusOr<std::set<uint64_t>> copied = FetchAll(Page(p));
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_NO_FATAL_FAILURE(push({keys[0], keys[1], keys[2]}));
  proto::FetchPartitionRequest round = Page(p);
  round.set_catch_up(1);
  StatusOr<std::set<uint64_t>> caught_up = FetchAll(round);
  ASSERT_TRUE(caught_up.ok()) << caught_up.status();
  std::set<uint64_t> read = *copied;
  read.insert(caught_up->begin(), caught_up->end());
  EXPECT_EQ(read, all);
  for (uint64_t key : {keys[0], keys[1], keys[2]}) EXPECT_TRUE(caught_up->contains(key)) << key;
  // Within the first round's reach (the store held none of them when the
  // copy began: a server's periodic flushes go to its journal) and not
  // before a round of its own.
  EXPECT_TRUE(copied->empty());

  ASSERT_NO_FATAL_FAILURE(push({keys[0], keys[1], keys[2]}));
  round.set_catch_up(2);
  caught_up = FetchAll(round);
  ASSERT_TRUE(caught_up.ok()) << caught_up.status();
  EXPECT_EQ(*caught_up, (std::set<uint64_t>{keys[0], keys[1], keys[2]}));
  ASSERT_NO_FATAL_FAILURE(push({keys[3]}));
  // A repeat of the round (a lost reply) reads the same keys again.
  caught_up = FetchAll(round);
  ASSERT_TRUE(caught_up.ok()) << caught_up.status();
  EXPECT_EQ(*caught_up, (std::set<uint64_t>{keys[0], keys[1], keys[2]}));
  // Rounds go in order.
  round.set_catch_up(4);
  EXPECT_TRUE(absl::IsFailedPrecondition(FetchAll(round).status()));

  StatusOr<uint64_t> tail_rows = HandOff(p);
  ASSERT_TRUE(tail_rows.ok()) << tail_rows.status();
  EXPECT_EQ(*tail_rows, 1u);
  proto::FetchPartitionRequest tail = Page(p);
  tail.set_tail(true);
  StatusOr<std::set<uint64_t>> tail_keys = FetchAll(tail);
  ASSERT_TRUE(tail_keys.ok()) << tail_keys.status();
  EXPECT_EQ(*tail_keys, std::set<uint64_t>{keys[3]});
  // Handed off: no round is left to catch up.
  round.set_catch_up(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(FetchAll(round).status()));
}

// Any holder of the server key can ask for a partition's pages: the old
// owner serves them only to the server the master named as the new owner
// of a move it started, and a refused request registers nothing (no move
// that notes pushes), counted in the heartbeat's stats (/metrics
// eps_server_requests_refused_total).
TEST_F(ParamServerMovesTest, PagesGoOnlyToTheNewOwnerOfAMoveTheMasterStarted) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(StartServer(OptionsWithDataDir(dir.Join("ps"))));
  ASSERT_NO_FATAL_FAILURE(AwaitMap());
  const std::vector<uint64_t> here = EmbKeys(50, /*here=*/true);
  const uint32_t p = PartitionOf(here[0], kPartitions);
  ASSERT_TRUE(Push(kEmb, here, std::vector<float>(here.size() * kDim, 1.0f)).ok());

  // No move at all.
  StatusOr<std::set<uint64_t>> pages = FetchAll(Page(p));
  EXPECT_EQ(pages.status().code(), absl::StatusCode::kPermissionDenied) << pages.status();
  // A move the master started, to another server than the one asking.
  StartMoveTo(p, /*to=*/kOtherServerId + 1);
  pages = FetchAll(Page(p));
  EXPECT_EQ(pages.status().code(), absl::StatusCode::kPermissionDenied) << pages.status();
  // Of another map version, or of another partition.
  proto::MoveNotice stale;
  stale.set_partition(p);
  stale.set_to_server(kOtherServerId);
  stale.set_map_version(2);
  master_->set_moves_out({stale});
  pages = FetchAll(Page(p));
  EXPECT_EQ(pages.status().code(), absl::StatusCode::kPermissionDenied) << pages.status();
  // A worker, whatever the master started.
  StartMoveTo(p);
  Message from_worker;
  from_worker.header().set_method(proto::FETCH_PARTITION);
  *from_worker.header().mutable_fetch_partition_request() = Page(p);
  EXPECT_EQ(Call(std::move(from_worker)).status().code(), absl::StatusCode::kPermissionDenied);
  master_->set_moves_out({});
  // Nothing was registered: no copy is in progress to hand off.
  EXPECT_EQ(HandOff(p).status().code(), absl::StatusCode::kFailedPrecondition);
  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.requests_refused() >= 4; }, absl::Seconds(5));
  EXPECT_EQ(stats.requests_refused(), 4u);

  // The named new owner reads every row.
  StartMoveTo(p);
  pages = FetchAll(Page(p));
  ASSERT_TRUE(pages.ok()) << pages.status();
}

}  // namespace
}  // namespace eps
