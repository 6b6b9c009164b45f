// Tests master/membership.h: server slots (claiming, restarts,
// replacements), leases with scripted time, the fence list and how far
// the servers acknowledged it, placement, and the saved record.

#include "master/membership.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "tests/master/unit_testing.h"
#include "tests/testing/recording_events.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

const absl::Duration kLease = absl::Milliseconds(kLeaseMs);

class MembershipTest : public ::testing::Test {
 protected:
  // ClaimSlot then AdmitServer, as RegisterServer does. Returns the slot.
  uint32_t Register(const proto::RegisterServerRequest& request, absl::Time now) {
    StatusOr<Membership::Claim> claim = members_.ClaimSlot(request);
    EXPECT_TRUE(claim.ok()) << claim.status();
    if (!claim.ok()) return ~0u;
    members_.AdmitServer(claim->slot, request, now);
    return claim->slot;
  }

  // Two servers (slots 0 and 1 at ports 5000 and 5001), placed.
  void PlaceTwoServers(absl::Time now) {
    ASSERT_EQ(Register(ServerRequest(5000, 100), now), 0u);
    ASSERT_EQ(Register(ServerRequest(5001, 101), now), 1u);
    ASSERT_TRUE(members_.MaybePlace(/*num_partitions=*/8));
  }

  void Heartbeat(uint32_t slot, absl::Time now) {
    bool first_contact = false;
    ASSERT_TRUE(members_.ServerHeartbeat(slot, "", proto::ServerStats(), now, &first_contact).ok());
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  const JobConfig job_ = TwoServerJob();
  RecordingEvents events_;
  Membership members_{job_, &events_};
};

// --- Slots ---------------------------------------------------------------------

TEST_F(MembershipTest, FreshServersTakeTheNextSlots) {
  StatusOr<Membership::Claim> first = members_.ClaimSlot(ServerRequest(5000, 100));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->slot, 0u);
  EXPECT_FALSE(first->retried);
  EXPECT_FALSE(first->restarted);
  EXPECT_FALSE(members_.AdmitServer(0, ServerRequest(5000, 100), t0_));
  EXPECT_EQ(Register(ServerRequest(5001, 101), t0_), 1u);
  EXPECT_EQ(members_.servers().at(1).endpoint, "tcp://127.0.0.1:5001");
  EXPECT_EQ(members_.servers().at(1).pid, 101u);
  EXPECT_TRUE(members_.servers().at(1).seen);
  EXPECT_EQ(members_.cluster_map().version(), 0u) << "placed without being asked";
}

TEST_F(MembershipTest, AllSlotsTakenBeforePlacementIsRefused) {
  ASSERT_EQ(Register(ServerRequest(5000, 100), t0_), 0u);
  ASSERT_EQ(Register(ServerRequest(5001, 101), t0_), 1u);
  EXPECT_EQ(members_.ClaimSlot(ServerRequest(5002, 102)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, RetriedRegistrationIsAnsweredTheSame) {
  PlaceTwoServers(t0_);
  const uint64_t generation = members_.generation();
  StatusOr<Membership::Claim> again = members_.ClaimSlot(ServerRequest(5001, 101));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->slot, 1u);
  EXPECT_TRUE(again->retried);
  EXPECT_FALSE(again->restarted);
  EXPECT_EQ(members_.servers().at(1).state, PeerState::kAlive);
  EXPECT_EQ(members_.generation(), generation);
  EXPECT_EQ(members_.cluster_map().version(), 1u);
}

TEST_F(MembershipTest, ARetryIsKnownByItsInstanceNotByItsEndpointAndPid) {
  proto::RegisterServerRequest first = ServerRequest(5000, 100);
  first.set_instance("drawn by ps[0]");
  ASSERT_EQ(Register(first, t0_), 0u);
  ASSERT_EQ(Register(ServerRequest(5001, 101), t0_), 1u);
  ASSERT_TRUE(members_.MaybePlace(/*num_partitions=*/8));
  StatusOr<Membership::Claim> again = members_.ClaimSlot(first);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->retried);
  // Another process copying the endpoint and pid /status shows: no retry
  // of ps[0]'s, but a new slot (which ServerAdmission judges as a join).
  proto::RegisterServerRequest copy = ServerRequest(5000, 100);
  copy.set_instance("drawn by another");
  StatusOr<Membership::Claim> copied = members_.ClaimSlot(copy);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_FALSE(copied->retried);
  EXPECT_TRUE(copied->joined);
  EXPECT_EQ(copied->slot, 2u);
  EXPECT_EQ(members_.servers().at(0).state, PeerState::kAlive);
}

TEST_F(MembershipTest, StoredIdTakesItsDeadSlotBack) {
  PlaceTwoServers(t0_);
  Heartbeat(0, t0_ + absl::Seconds(1));
  // Slot 1's lease runs out.
  ASSERT_THAT(members_.ExpireLeases(t0_ + kLease + absl::Milliseconds(1)).servers, ElementsAre(1u));
  StatusOr<Membership::Claim> back = members_.ClaimSlot(ServerRequest(6001, 201, /*stored=*/1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->slot, 1u);
  EXPECT_FALSE(back->restarted) << "it was dead already";
  EXPECT_FALSE(back->retried);
}

TEST_F(MembershipTest, UnknownStoredIdIsRefused) {
  PlaceTwoServers(t0_);
  StatusOr<Membership::Claim> claim = members_.ClaimSlot(ServerRequest(6000, 200, /*stored=*/5));
  EXPECT_EQ(claim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(claim.status().message(), HasSubstr("ps[5]"));
  EXPECT_THAT(claim.status().message(), HasSubstr("fresh --data-dir"));
}

TEST_F(MembershipTest, ClaimOnALiveSlotMarksItDeadAndRestarted) {
  PlaceTwoServers(t0_);
  // A new process on slot 0's data dir, before the old one's lease ran out.
  StatusOr<Membership::Claim> claim = members_.ClaimSlot(ServerRequest(6000, 200, /*stored=*/0));
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->slot, 0u);
  EXPECT_TRUE(claim->restarted);
  EXPECT_FALSE(claim->retried);
  EXPECT_EQ(members_.servers().at(0).state, PeerState::kDead);
  EXPECT_FALSE(members_.all_servers_alive());
  ASSERT_EQ(events_.Count("server_dead"), 1u);
  EXPECT_EQ(events_.Named("server_dead")[0]["server"], 0);
  EXPECT_EQ(events_.Named("server_dead")[0]["reason"], "restarted");
}

TEST_F(MembershipTest, AdmitServerReplacingBumpsTheMapVersion) {
  PlaceTwoServers(t0_);
  ASSERT_EQ(members_.cluster_map().version(), 1u);
  const uint64_t generation = members_.generation();
  ASSERT_TRUE(members_.ClaimSlot(ServerRequest(6000, 200, /*stored=*/0)).ok());
  EXPECT_TRUE(members_.AdmitServer(0, ServerRequest(6000, 200, /*stored=*/0), t0_));
  EXPECT_EQ(members_.cluster_map().version(), 2u);
  EXPECT_GT(members_.generation(), generation);
  for (const proto::ServerInfo& info : members_.cluster_map().servers()) {
    EXPECT_EQ(info.endpoint(), info.id() == 0 ? "tcp://127.0.0.1:6000" : "tcp://127.0.0.1:5001");
  }
  EXPECT_EQ(members_.servers().at(0).state, PeerState::kAlive);
  EXPECT_EQ(members_.servers().at(0).pid, 200u);
  EXPECT_TRUE(members_.all_servers_alive());
  // The old process is no longer the slot's.
  EXPECT_FALSE(members_.Serving({0, "tcp://127.0.0.1:5000"}));
  EXPECT_TRUE(members_.Serving({0, "tcp://127.0.0.1:6000"}));
  bool first_contact = false;
  Status old = members_.ServerHeartbeat(0, "tcp://127.0.0.1:5000", proto::ServerStats(), t0_,
                                        &first_contact);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(old), proto::FENCED);
}

TEST_F(MembershipTest, ReplacementMustHearTheFenceListAgain) {
  PlaceTwoServers(t0_);
  const uint32_t worker = members_.AdmitWorker(WorkerRequest(300), t0_);
  members_.Fence(worker, t0_, "test");
  std::optional<Membership::FenceRound> round = members_.PendingFences();
  ASSERT_TRUE(round.has_value());
  members_.FencesAcknowledged(*round);
  ASSERT_FALSE(members_.fencing());
  ASSERT_FALSE(members_.PendingFences().has_value());

  ASSERT_TRUE(members_.ClaimSlot(ServerRequest(6000, 200, /*stored=*/0)).ok());
  ASSERT_TRUE(members_.AdmitServer(0, ServerRequest(6000, 200, /*stored=*/0), t0_));
  EXPECT_TRUE(members_.fencing());
  round = members_.PendingFences();
  ASSERT_TRUE(round.has_value());
  EXPECT_THAT(round->fenced, ElementsAre(worker));
  EXPECT_THAT(round->servers, ElementsAre(Pair(0u, "tcp://127.0.0.1:6000"),
                                          Pair(1u, "tcp://127.0.0.1:5001")));
}

// --- Placement -----------------------------------------------------------------

TEST_F(MembershipTest, PlacesOnceEveryServerRegistered) {
  ASSERT_EQ(Register(ServerRequest(5000, 100), t0_), 0u);
  EXPECT_FALSE(members_.MaybePlace(8));
  EXPECT_FALSE(members_.placed());
  ASSERT_EQ(Register(ServerRequest(5001, 101), t0_), 1u);
  EXPECT_TRUE(members_.MaybePlace(8));
  EXPECT_TRUE(members_.placed());
  EXPECT_EQ(members_.cluster_map().version(), 1u);
  EXPECT_EQ(members_.cluster_map().num_partitions(), 8u);
  EXPECT_EQ(members_.cluster_map().partition_owner_size(), 8);
  EXPECT_EQ(members_.cluster_map().servers_size(), 2);
  EXPECT_FALSE(members_.MaybePlace(8)) << "placed twice";
  EXPECT_EQ(members_.cluster_map().version(), 1u);
}

// --- Leases --------------------------------------------------------------------

TEST_F(MembershipTest, WorkerDiesAfterItsLease) {
  const uint32_t id = members_.AdmitWorker(WorkerRequest(300), t0_);
  proto::WorkerStats stats;
  stats.set_records_pushed(50);
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", stats, 0, std::nullopt, t0_).ok());
  members_.NoteProgress(id, t0_, /*records=*/20);

  EXPECT_THAT(members_.ExpireLeases(t0_ + kLease).workers, IsEmpty()) << "exactly a lease is alive";
  Membership::Expired expired = members_.ExpireLeases(t0_ + kLease + absl::Milliseconds(1));
  EXPECT_THAT(expired.workers, ElementsAre(Pair(id, 30u)));  // pushed, never committed
  EXPECT_THAT(expired.servers, IsEmpty());
  EXPECT_EQ(members_.workers().at(id).state, PeerState::kDead);
  ASSERT_EQ(events_.Count("worker_dead"), 1u);
  EXPECT_EQ(events_.Named("worker_dead")[0]["silent_ms"], 1001);
  EXPECT_THAT(members_.ExpireLeases(t0_ + 10 * kLease).workers, IsEmpty()) << "dies once";

  StatusOr<const WorkerEntry*> dead = members_.LiveWorker(WorkerNode(id), "", t0_ + 10 * kLease);
  EXPECT_EQ(dead.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(dead.status()), proto::FENCED);
}

// Every call of a worker the master accepts renews its lease: LiveWorker
// (which every handler but the heartbeat goes through) and WorkerHeartbeat.
// A refused one renews nothing.
TEST_F(MembershipTest, EveryAcceptedWorkerCallRenewsTheLease) {
  const uint32_t by_call = members_.AdmitWorker(WorkerRequest(300), t0_);
  const uint32_t by_beat = members_.AdmitWorker(WorkerRequest(301), t0_);
  const uint32_t silent = members_.AdmitWorker(WorkerRequest(302), t0_);
  const absl::Time later = t0_ + absl::Milliseconds(900);
  StatusOr<const WorkerEntry*> live = members_.LiveWorker(WorkerNode(by_call), "", later);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ((*live)->last_seen, later);
  ASSERT_TRUE(
      members_.WorkerHeartbeat(WorkerNode(by_beat), "", proto::WorkerStats(), 0, std::nullopt, later)
          .ok());
  EXPECT_THAT(members_.ExpireLeases(t0_ + kLease + absl::Milliseconds(1)).workers,
              ElementsAre(Pair(silent, 0u)));
  EXPECT_THAT(members_.ExpireLeases(later + kLease + absl::Milliseconds(1)).workers,
              ElementsAre(Pair(by_call, 0u), Pair(by_beat, 0u)));
  EXPECT_EQ(ReasonOf(members_.LiveWorker(WorkerNode(silent), "", later + kLease).status()),
            proto::FENCED);
}

// The heartbeat's bookkeeping: stats kept, records pushed never fall, a
// pause for the round in progress holds the worker back, and each batch-size
// change is one event however many heartbeats repeat it.
TEST_F(MembershipTest, WorkerHeartbeatKeepsWhatTheWorkerReports) {
  const uint32_t id = members_.AdmitWorker(WorkerRequest(300), t0_);
  proto::WorkerStats stats;
  stats.set_records_pushed(500);
  stats.set_records_per_s(250);
  proto::BatchSizeChange* change = stats.add_batch_size_changes();
  change->set_seq(1);
  change->set_from(512);
  change->set_to(256);
  change->set_reason("out of memory");
  const absl::Time at = t0_ + absl::Milliseconds(100);
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", stats, 7, 7, at).ok());
  stats.set_records_pushed(400);  // reordered: never lower
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", stats, 7, std::nullopt, at).ok());
  const WorkerEntry& worker = members_.workers().at(id);
  EXPECT_EQ(worker.records_pushed, 500u);
  EXPECT_EQ(worker.records_per_s, 250);
  EXPECT_EQ(worker.paused_for, 7u);
  EXPECT_EQ(worker.held_until, at);
  EXPECT_EQ(events_.Count("batch_size_changed"), 1u);
  members_.NoteProgress(id, at, 30);
  EXPECT_EQ(members_.workers().at(id).records, 30u);
  EXPECT_EQ(members_.workers().at(id).last_progress, at);
}

// With 2 RPC threads a slow heartbeat can be applied after the one sent
// after it: a numbered heartbeat at or below the last one applied changes
// nothing (its pause, its stats, its batch-size changes), and an unnumbered
// one (an older sender) is applied as before.
TEST_F(MembershipTest, AHeartbeatOlderThanTheLastAppliedChangesNothing) {
  const uint32_t id = members_.AdmitWorker(WorkerRequest(300), t0_);
  proto::WorkerStats newer;
  newer.set_records_per_s(300);
  proto::BatchSizeChange* change = newer.add_batch_size_changes();
  change->set_seq(1);
  change->set_from(512);
  change->set_to(256);
  const absl::Time at = t0_ + absl::Milliseconds(500);
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", newer, 7, 7, at, /*seq=*/5).ok());
  proto::WorkerStats older;  // sent before the change, and before the pause
  older.set_records_per_s(100);
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", older, 0, 7,
                                       at + absl::Milliseconds(10), /*seq=*/4)
                  .ok());
  const WorkerEntry& worker = members_.workers().at(id);
  EXPECT_EQ(worker.paused_for, 7u);
  EXPECT_EQ(worker.records_per_s, 300);
  EXPECT_EQ(worker.last_seen, at);
  // The next one repeats the change: still one event.
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", newer, 7, 7,
                                       at + absl::Milliseconds(20), /*seq=*/6)
                  .ok());
  EXPECT_EQ(events_.Count("batch_size_changed"), 1u);
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(id), "", older, 0, 7,
                                       at + absl::Milliseconds(30), /*seq=*/0)
                  .ok());
  EXPECT_EQ(members_.workers().at(id).paused_for, 0u);

  PlaceTwoServers(t0_);
  bool first_contact = false;
  proto::ServerStats big;
  big.set_rows(1000);
  ASSERT_TRUE(members_.ServerHeartbeat(0, "", big, at, &first_contact, /*seq=*/3).ok());
  ASSERT_TRUE(members_.ServerHeartbeat(0, "", proto::ServerStats(), at + absl::Milliseconds(5),
                                       &first_contact, /*seq=*/2)
                  .ok());
  EXPECT_EQ(members_.servers().at(0).stats.rows(), 1000u);
  EXPECT_EQ(members_.servers().at(0).last_seen, at);
}

TEST_F(MembershipTest, LiveWorkerRefusesOtherRoles) {
  proto::NodeId server;
  server.set_role(proto::ROLE_SERVER);
  EXPECT_EQ(members_.LiveWorker(server, "", t0_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(members_.LiveWorker(WorkerNode(7), "", t0_).status()), proto::FENCED)
      << "an unknown worker";
}

TEST_F(MembershipTest, ServerHeartbeatRenewsItsLease) {
  PlaceTwoServers(t0_);
  Heartbeat(0, t0_ + absl::Milliseconds(800));
  Heartbeat(1, t0_ + absl::Milliseconds(800));
  EXPECT_THAT(members_.ExpireLeases(t0_ + absl::Milliseconds(1500)).servers, IsEmpty());
  Heartbeat(0, t0_ + absl::Milliseconds(1500));
  Membership::Expired expired = members_.ExpireLeases(t0_ + absl::Milliseconds(1801));
  EXPECT_THAT(expired.servers, ElementsAre(1u));
  EXPECT_EQ(members_.servers().at(1).state, PeerState::kDead);
  EXPECT_EQ(members_.servers().at(0).state, PeerState::kAlive);
  EXPECT_THAT(members_.MissingServers(), ElementsAre(1u));
  EXPECT_THAT(members_.LiveServers(), ElementsAre(Pair(0u, "tcp://127.0.0.1:5000")));
  EXPECT_FALSE(members_.all_servers_alive());

  bool first_contact = false;
  Status refused = members_.ServerHeartbeat(1, "", proto::ServerStats(),
                                            t0_ + absl::Milliseconds(1900), &first_contact);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), proto::FENCED);
}

TEST_F(MembershipTest, DeadServerBeforePlacementFreesItsSlot) {
  ASSERT_EQ(Register(ServerRequest(5000, 100), t0_), 0u);
  const uint64_t generation = members_.generation();
  Membership::Expired expired = members_.ExpireLeases(t0_ + kLease + absl::Milliseconds(1));
  EXPECT_THAT(expired.servers, IsEmpty()) << "nothing placed on it: not a loss";
  EXPECT_TRUE(members_.servers().empty());
  EXPECT_GT(members_.generation(), generation);
  EXPECT_EQ(events_.Count("server_dead"), 1u);
  // Two more fresh servers fill the job.
  const absl::Time later = t0_ + absl::Seconds(2);
  StatusOr<Membership::Claim> a = members_.ClaimSlot(ServerRequest(5002, 102));
  ASSERT_TRUE(a.ok()) << a.status();
  members_.AdmitServer(a->slot, ServerRequest(5002, 102), later);
  StatusOr<Membership::Claim> b = members_.ClaimSlot(ServerRequest(5003, 103));
  ASSERT_TRUE(b.ok()) << b.status();
  members_.AdmitServer(b->slot, ServerRequest(5003, 103), later);
  EXPECT_NE(a->slot, b->slot);
  EXPECT_TRUE(members_.MaybePlace(8));
  EXPECT_EQ(members_.servers().size(), 2u);
  EXPECT_TRUE(members_.all_servers_alive());
}

TEST_F(MembershipTest, DeadServerAfterPlacementKeepsItsSlot) {
  PlaceTwoServers(t0_);
  Heartbeat(1, t0_ + absl::Seconds(1));
  EXPECT_THAT(members_.ExpireLeases(t0_ + kLease + absl::Milliseconds(1)).servers, ElementsAre(0u));
  EXPECT_EQ(members_.servers().size(), 2u);
  // A fresh server (no stored id) takes the dead slot.
  StatusOr<Membership::Claim> fresh = members_.ClaimSlot(ServerRequest(6000, 200));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->slot, 0u);
  EXPECT_FALSE(fresh->restarted);
}

// --- Fencing -------------------------------------------------------------------

TEST_F(MembershipTest, FenceListStaysSorted) {
  for (uint32_t id : {5u, 2u, 9u, 2u, 0u}) members_.Fence(id, t0_, "test");
  EXPECT_THAT(members_.fenced(), ElementsAre(0u, 2u, 5u, 9u));
  EXPECT_TRUE(members_.IsFenced(5));
  EXPECT_FALSE(members_.IsFenced(3));
  EXPECT_TRUE(members_.fencing());
  EXPECT_TRUE(members_.awaiting_fences());
}

TEST_F(MembershipTest, FencesAcknowledgedReleasesOnlyTheWorkersInTheRound) {
  PlaceTwoServers(t0_);
  const uint32_t w0 = members_.AdmitWorker(WorkerRequest(300), t0_);
  const uint32_t w1 = members_.AdmitWorker(WorkerRequest(301), t0_ + absl::Seconds(1));
  ASSERT_EQ(w0, 0u);
  ASSERT_EQ(w1, 1u);
  EXPECT_FALSE(members_.PendingFences().has_value());

  members_.Fence(w1, t0_ + absl::Seconds(5), "lease expired");
  std::optional<Membership::FenceRound> first = members_.PendingFences();
  ASSERT_TRUE(first.has_value());
  EXPECT_THAT(first->fenced, ElementsAre(w1));
  EXPECT_THAT(first->servers, ElementsAre(Pair(0u, "tcp://127.0.0.1:5000"),
                                          Pair(1u, "tcp://127.0.0.1:5001")));

  // A later fence, before the first round's acknowledgements come back.
  members_.Fence(w0, t0_ + absl::Seconds(6), "lease expired");
  // Released with when each was last seen (joined), not when fenced.
  EXPECT_THAT(members_.FencesAcknowledged(*first),
              ElementsAre(Pair(w1, t0_ + absl::Seconds(1))));
  EXPECT_TRUE(members_.awaiting_fences()) << "worker 0's fence is not acknowledged";
  EXPECT_TRUE(members_.fencing());
  ASSERT_EQ(events_.Count("worker_fenced"), 1u);
  EXPECT_EQ(events_.Named("worker_fenced")[0]["worker"], w1);

  std::optional<Membership::FenceRound> second = members_.PendingFences();
  ASSERT_TRUE(second.has_value());
  EXPECT_THAT(second->fenced, ElementsAre(w0, w1));
  // The stale round again releases nothing more.
  EXPECT_THAT(members_.FencesAcknowledged(*first), IsEmpty());
  EXPECT_THAT(members_.FencesAcknowledged(*second), ElementsAre(Pair(w0, t0_)));
  EXPECT_FALSE(members_.awaiting_fences());
  EXPECT_FALSE(members_.fencing());
  EXPECT_FALSE(members_.PendingFences().has_value());
}

// A round is sent to the servers live when it was taken, without the
// master's lock. A replacement admitted meanwhile never received it, so
// the round's acknowledgement must not count for the replacement, nor
// release the workers whose fence it still lacks.
// FAILS at the time of writing: FencesAcknowledged counts the round's list
// as acknowledged whatever servers it reached (see the report).
TEST_F(MembershipTest, RoundTakenBeforeAReplacementDoesNotCoverIt) {
  PlaceTwoServers(t0_);
  const uint32_t worker = members_.AdmitWorker(WorkerRequest(300), t0_);
  Heartbeat(0, t0_ + absl::Milliseconds(900));
  ASSERT_TRUE(members_.LiveWorker(WorkerNode(worker), "", t0_ + absl::Milliseconds(900)).ok());
  ASSERT_THAT(members_.ExpireLeases(t0_ + kLease + absl::Milliseconds(1)).servers,
              ElementsAre(1u));
  members_.Fence(worker, t0_ + absl::Seconds(1), "test");
  const std::optional<Membership::FenceRound> round = members_.PendingFences();
  ASSERT_TRUE(round.has_value());
  ASSERT_THAT(round->servers, ElementsAre(Pair(0u, "tcp://127.0.0.1:5000")));

  // While the round is out, slot 1 is filled again.
  ASSERT_TRUE(members_.ClaimSlot(ServerRequest(6001, 201, /*stored=*/1)).ok());
  ASSERT_TRUE(members_.AdmitServer(1, ServerRequest(6001, 201, /*stored=*/1),
                                   t0_ + absl::Seconds(2)));
  members_.FencesAcknowledged(*round);  // ps[0] acknowledged

  EXPECT_TRUE(members_.fencing()) << "ps[1]'s new process never got the fence list";
  EXPECT_TRUE(members_.awaiting_fences()) << "the worker's shards moved before ps[1] refuses it";
  const std::optional<Membership::FenceRound> again = members_.PendingFences();
  ASSERT_TRUE(again.has_value());
  EXPECT_THAT(again->servers, ElementsAre(Pair(0u, "tcp://127.0.0.1:5000"),
                                          Pair(1u, "tcp://127.0.0.1:6001")));
}

TEST_F(MembershipTest, LeaveFencesAndFreesAtOnce) {
  const uint32_t id = members_.AdmitWorker(WorkerRequest(300), t0_);
  StatusOr<bool> left = members_.Leave(id);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(*left);
  EXPECT_EQ(members_.workers().at(id).state, PeerState::kLeft);
  EXPECT_TRUE(members_.IsFenced(id));
  EXPECT_FALSE(members_.awaiting_fences()) << "its shards may move now";
  EXPECT_TRUE(members_.fencing()) << "the servers must still refuse it";
  EXPECT_EQ(events_.Count("worker_left"), 1u);

  StatusOr<bool> again = members_.Leave(id);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_EQ(members_.Leave(42).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(MembershipTest, FenceAllAliveFencesOnlyLiveWorkers) {
  const uint32_t w0 = members_.AdmitWorker(WorkerRequest(300), t0_);
  const uint32_t w1 = members_.AdmitWorker(WorkerRequest(301), t0_);
  const uint32_t w2 = members_.AdmitWorker(WorkerRequest(302), t0_ + absl::Seconds(2));
  const auto pushed = [](uint64_t records) {
    proto::WorkerStats stats;
    stats.set_records_pushed(records);
    return stats;
  };
  // Worker 1 died before the recovery (w0's lease is renewed first).
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(w0), "", pushed(100), 0, std::nullopt,
                                       t0_ + absl::Seconds(2)).ok());
  members_.NoteProgress(w0, t0_, 40);
  ASSERT_TRUE(members_.WorkerHeartbeat(WorkerNode(w2), "", pushed(10), 0, std::nullopt,
                                       t0_ + absl::Seconds(2)).ok());
  members_.NoteProgress(w2, t0_, 10);
  ASSERT_THAT(members_.ExpireLeases(t0_ + absl::Seconds(2)).workers, ElementsAre(Pair(w1, 0u)));

  EXPECT_EQ(members_.FenceAllAlive(t0_ + absl::Seconds(2), "ps[1] lost"), 60u);
  EXPECT_EQ(members_.workers().at(w0).state, PeerState::kFenced);
  EXPECT_EQ(members_.workers().at(w1).state, PeerState::kDead);
  EXPECT_EQ(members_.workers().at(w2).state, PeerState::kFenced);
  EXPECT_THAT(members_.fenced(), ElementsAre(w0, w2));
  StatusOr<const WorkerEntry*> fenced =
      members_.LiveWorker(WorkerNode(w0), "ps[1] lost", t0_ + absl::Seconds(2));
  EXPECT_EQ(ReasonOf(fenced.status()), proto::FENCED);
  EXPECT_THAT(fenced.status().message(), HasSubstr("a parameter server was lost (ps[1] lost)"));
}

// --- The saved record ----------------------------------------------------------

TEST_F(MembershipTest, SaveToRestoreFromRoundTrip) {
  PlaceTwoServers(t0_);
  for (uint32_t pid : {300u, 301u, 302u}) members_.AdmitWorker(WorkerRequest(pid), t0_);
  members_.Fence(1, t0_, "test");
  proto::MasterRecord record;
  members_.SaveTo(&record);
  EXPECT_EQ(record.next_worker_id(), 3u);
  EXPECT_EQ(record.next_server_id(), 2u);
  EXPECT_EQ(record.membership_epoch(), members_.generation());
  EXPECT_THAT(record.fenced_workers(), ElementsAre(1u));
  ASSERT_EQ(record.servers_size(), 2);

  const absl::Time t1 = t0_ + absl::Minutes(5);
  RecordingEvents events;
  Membership restored(job_, &events);
  restored.RestoreFrom(record, t1);
  EXPECT_EQ(restored.next_worker_id(), 3u);
  EXPECT_EQ(restored.generation(), members_.generation() + 1);
  EXPECT_EQ(restored.cluster_map().SerializeAsString(),
            members_.cluster_map().SerializeAsString());
  EXPECT_TRUE(restored.placed());
  EXPECT_THAT(restored.fenced(), ElementsAre(1u));
  EXPECT_TRUE(restored.IsFenced(1));
  ASSERT_EQ(restored.servers().size(), 2u);
  EXPECT_EQ(restored.servers().at(1).endpoint, "tcp://127.0.0.1:5001");
  EXPECT_TRUE(restored.workers().empty()) << "workers register again";
  // Not heard from yet: missing until each heartbeats.
  EXPECT_THAT(restored.MissingServers(), ElementsAre(0u, 1u));
  bool first_contact = false;
  ASSERT_TRUE(restored.ServerHeartbeat(0, "tcp://127.0.0.1:5000", proto::ServerStats(),
                                       t1 + absl::Milliseconds(500), &first_contact)
                  .ok());
  EXPECT_TRUE(first_contact);
  EXPECT_THAT(restored.MissingServers(), ElementsAre(1u));
  // The servers got a fresh lease at t1, not their old one.
  EXPECT_THAT(restored.ExpireLeases(t1 + kLease).servers, IsEmpty());
  EXPECT_THAT(restored.ExpireLeases(t1 + kLease + absl::Milliseconds(1)).servers, ElementsAre(1u));
  // A restarted master sends the fence list again, and never reuses an id.
  std::optional<Membership::FenceRound> round = restored.PendingFences();
  ASSERT_TRUE(round.has_value());
  EXPECT_THAT(round->fenced, ElementsAre(1u));
  EXPECT_EQ(restored.AdmitWorker(WorkerRequest(400), t1), 3u);
  // The saved job is placed: a fresh server only takes a dead slot.
  EXPECT_EQ(restored.ClaimSlot(ServerRequest(7000, 500)).value().slot, 1u);
}

TEST_F(MembershipTest, GoneWorkersAreForgottenButStayFenced) {
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  const size_t total = Membership::kGoneWorkersKept + 36;
  for (size_t i = 0; i < total; ++i) members_.AdmitWorker(WorkerRequest(400 + i), t0);
  const uint32_t alive = members_.AdmitWorker(WorkerRequest(999), t0 + absl::Seconds(2));
  // All but the last die; their fences reach every server.
  const Membership::Expired expired =
      members_.ExpireLeases(t0 + absl::Milliseconds(kLeaseMs) + absl::Milliseconds(1));
  ASSERT_EQ(expired.workers.size(), total);
  for (const auto& [id, retrained] : expired.workers) members_.Fence(id, t0, "dead");
  members_.FencesAcknowledged(*members_.PendingFences());
  members_.ExpireLeases(t0 + absl::Milliseconds(kLeaseMs) + absl::Milliseconds(2));
  EXPECT_EQ(members_.workers().size(), Membership::kGoneWorkersKept + 1)
      << "the newest gone workers and the live one";
  EXPECT_FALSE(members_.workers().contains(0)) << "the oldest go first";
  EXPECT_TRUE(members_.workers().contains(static_cast<uint32_t>(total - 1)));
  EXPECT_TRUE(members_.workers().contains(alive));
  // A forgotten worker is still refused, everywhere.
  EXPECT_TRUE(members_.IsFenced(0));
  EXPECT_EQ(ReasonOf(members_.LiveWorker(WorkerNode(0), "", t0_).status()), proto::FENCED);
}

// A partition move commits with the next map version; a hand-off in
// progress is saved, and a master restored from it gives the move up with
// a newer map (the old owner serves the partition again).
TEST_F(MembershipTest, APartitionMoveIsTheNextMapVersionAndAHandOffSurvivesARestart) {
  PlaceTwoServers(t0_);
  ASSERT_EQ(members_.cluster_map().partition_owner(2), 0u);
  members_.SetMoving(2);
  proto::MasterRecord handing_off;
  members_.SaveTo(&handing_off);
  ASSERT_TRUE(handing_off.has_partition_moving());
  EXPECT_EQ(handing_off.partition_moving(), 2u);
  Membership restored(job_, &events_);
  restored.RestoreFrom(handing_off, t0_);
  EXPECT_EQ(restored.cluster_map().version(), 2u) << "given up with a newer map";
  EXPECT_EQ(restored.cluster_map().partition_owner(2), 0u);
  proto::MasterRecord after;
  restored.SaveTo(&after);
  EXPECT_FALSE(after.has_partition_moving());

  members_.MovePartition(2, 1);
  EXPECT_EQ(members_.cluster_map().version(), 2u);
  EXPECT_EQ(members_.cluster_map().partition_owner(2), 1u);
  proto::MasterRecord moved;
  members_.SaveTo(&moved);
  EXPECT_FALSE(moved.has_partition_moving()) << "the commit ends the hand-off";
  EXPECT_THAT(members_.PartitionCounts(), ElementsAre(Pair(0u, 3u), Pair(1u, 5u)));
}

// A restore puts back the owners of the checkpoint for the partitions the
// restored servers hold now, and leaves the others where they are.
TEST_F(MembershipTest, ARestoreGivesPartitionsBackToTheirCheckpointOwners) {
  PlaceTwoServers(t0_);
  const proto::ClusterMap checkpoint = members_.cluster_map();
  members_.MovePartition(2, 1);  // from 0 to 1 after the checkpoint
  members_.MovePartition(3, 0);  // from 1 to 0
  const uint64_t version = members_.cluster_map().version();
  // Only ps[1] restored: partition 2 (on ps[1] now) goes back to ps[0];
  // partition 3 stays on ps[0], which kept its rows.
  members_.RestoreOwners(checkpoint, {1});
  EXPECT_EQ(members_.cluster_map().partition_owner(2), 0u);
  EXPECT_EQ(members_.cluster_map().partition_owner(3), 0u);
  EXPECT_EQ(members_.cluster_map().version(), version + 1);
  // Both restored (a rollback): the checkpoint's map.
  members_.RestoreOwners(checkpoint, {0, 1});
  for (int p = 0; p < checkpoint.partition_owner_size(); ++p) {
    EXPECT_EQ(members_.cluster_map().partition_owner(p), checkpoint.partition_owner(p)) << p;
  }
  const uint64_t settled = members_.cluster_map().version();
  members_.RestoreOwners(checkpoint, {0, 1});
  EXPECT_EQ(members_.cluster_map().version(), settled) << "nothing changed, no new version";
}

// Once every slot is alive, a fresh server joins in a new slot: listed in
// the next map version with no partition; at most one slot per partition.
TEST_F(MembershipTest, AFreshServerJoinsInANewSlotOnceEverySlotIsAlive) {
  PlaceTwoServers(t0_);
  StatusOr<Membership::Claim> claim = members_.ClaimSlot(ServerRequest(5002, 102));
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_TRUE(claim->joined);
  EXPECT_EQ(claim->slot, 2u);
  EXPECT_FALSE(members_.AdmitServer(claim->slot, ServerRequest(5002, 102), t0_));
  const proto::ClusterMap& map = members_.cluster_map();
  EXPECT_EQ(map.version(), 2u);
  ASSERT_EQ(map.servers_size(), 3);
  EXPECT_EQ(map.servers(2).id(), 2u);
  EXPECT_EQ(members_.PartitionCounts().at(2), 0u);
  // Up to 8 slots for 8 partitions; a ninth would hold nothing.
  for (uint32_t port = 5003; port < 5008; ++port) {
    StatusOr<Membership::Claim> more = members_.ClaimSlot(ServerRequest(port, port));
    ASSERT_TRUE(more.ok()) << more.status();
    members_.AdmitServer(more->slot, ServerRequest(port, port), t0_);
  }
  StatusOr<Membership::Claim> ninth = members_.ClaimSlot(ServerRequest(5008, 5008));
  ASSERT_FALSE(ninth.ok());
  EXPECT_THAT(ninth.status().message(), HasSubstr("one more server would hold none"));
}

}  // namespace
}  // namespace eps
