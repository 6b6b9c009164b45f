// ServerAdmission (master/trust/server_admission.h) on its own, and through
// JobControl::RegisterServer with scripted time: a holder of the server key
// can neither take a live server's slot nor join the placed job without a
// grant, and a refusal changes nothing.

#include "master/trust/server_admission.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/master/job_control_fixture.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

WorkerCredentials Key() { return WorkerCredentials::FromKey(std::string(32, 'k')).value(); }

TEST(ServerAdmissionTest, OffAdmitsAnyoneAndIssuesNoCredential) {
  const ServerAdmission off;
  proto::RegisterServerRequest request = ServerRequest(5000, 100, /*stored_slot=*/0);
  EXPECT_TRUE(off.CheckClaim(request).ok());
  EXPECT_TRUE(off.CheckJoin(request).ok());
  EXPECT_EQ(off.Credential(0), "");
}

TEST(ServerAdmissionTest, AClaimNeedsItsSlotsCredential) {
  const WorkerCredentials key = Key();
  const ServerAdmission admission(&key, kToken);
  proto::RegisterServerRequest request = ServerRequest(5000, 100, /*stored_slot=*/1);
  const Status bare = admission.CheckClaim(request);
  EXPECT_EQ(bare.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(bare.message(), HasSubstr("claims ps[1] without its credential"));
  EXPECT_THAT(bare.message(), HasSubstr("SERVER_CREDENTIAL"));
  request.set_slot_credential(admission.Credential(0));
  EXPECT_THAT(admission.CheckClaim(request).message(), HasSubstr("with another's credential"));
  request.set_slot_credential(admission.Credential(1));
  EXPECT_TRUE(admission.CheckClaim(request).ok());
  // Another job's master (another key) issued another.
  const WorkerCredentials other = WorkerCredentials::FromKey(std::string(32, 'o')).value();
  request.set_slot_credential(other.ServerCredential(1));
  EXPECT_FALSE(admission.CheckClaim(request).ok());
}

TEST(ServerAdmissionTest, AJoinNeedsTheOperatorsTokenOrAnAutoscalerLaunch) {
  const WorkerCredentials key = Key();
  ServerAdmission admission(&key, kToken);
  proto::RegisterServerRequest request = ServerRequest(5002, 102);
  const Status bare = admission.CheckJoin(request);
  EXPECT_EQ(bare.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(bare.message(), HasSubstr("it carries none"));
  EXPECT_THAT(bare.message(), HasSubstr("EPS_LAUNCH_SECRET_FILE=KEYS/http_token"));
  request.set_launch_secret("0123456789abcdef0123456789abcdeX");
  EXPECT_THAT(admission.CheckJoin(request).message(), HasSubstr("not the job's HTTP token"));
  request.set_launch_secret(kToken);
  EXPECT_TRUE(admission.CheckJoin(request).ok());
  // A launch id is the server autoscaler's: its own secret, not the token.
  request.set_launch_id(7);
  EXPECT_THAT(admission.CheckJoin(request).message(), HasSubstr("launch id 7 is not one"));
  admission.VerifyLaunchesWith(
      [](uint64_t id, absl::string_view secret) { return id == 7 && secret == "launch-7"; });
  EXPECT_FALSE(admission.CheckJoin(request).ok());
  request.set_launch_secret("launch-7");
  EXPECT_TRUE(admission.CheckJoin(request).ok());
}

// JobControl under CURVE: the claims and joins a holder of the server key
// alone can make are refused before they change anything.
class ServerAdmissionControlTest : public JobControlTest {
 protected:
  void SetUp() override {
    control_->admission() = ServerAdmission(&key_, kToken);
    ASSERT_NO_FATAL_FAILURE(StartTraining());
  }
  Status Register(proto::RegisterServerRequest request, proto::RegisterServerReply* reply) {
    AddSharedOptions(job_.SharedOptions(), request.mutable_job_options());
    if (request.has_stored_server_id()) {
      request.set_stored_job(absl::StrCat(control_->job_spec().job_id(), " tiny"));
    }
    return control_->RegisterServer(request, At(10), reply);
  }
  const WorkerCredentials key_ = Key();
};

TEST_F(ServerAdmissionControlTest, EachAdmittedServerGetsItsSlotsCredential) {
  proto::RegisterServerReply reply;
  proto::RegisterServerRequest retry = ServerRequest(5001, 101);
  ASSERT_TRUE(Register(retry, &reply).ok());
  EXPECT_EQ(reply.server_id(), 1u);
  EXPECT_TRUE(key_.VerifyServer(1, reply.slot_credential()));
}

TEST_F(ServerAdmissionControlTest, ALiveSlotIsNotTakenWithoutItsCredential) {
  const uint64_t version = control_->membership().cluster_map().version();
  proto::RegisterServerReply reply;
  const Status taken = Register(ServerRequest(6000, 900, /*stored_slot=*/0), &reply);
  EXPECT_EQ(taken.code(), absl::StatusCode::kPermissionDenied) << taken;
  EXPECT_EQ(control_->servers_refused(), 1u);
  // Nothing changed: ps[0] is alive at its endpoint, no recovery started.
  EXPECT_EQ(control_->membership().servers().at(0).state, PeerState::kAlive);
  EXPECT_EQ(control_->membership().servers().at(0).endpoint, Endpoint(5000));
  EXPECT_FALSE(control_->recovery().active());
  EXPECT_EQ(control_->membership().cluster_map().version(), version);
  EXPECT_FALSE(reply.has_job()) << "a refused server learns nothing of the job";
  EXPECT_TRUE(reply.slot_credential().empty());
  // Rejoining is claiming too.
  proto::RegisterServerRequest rejoin = ServerRequest(5000, 100, /*stored_slot=*/0);
  rejoin.set_rejoin(true);
  EXPECT_EQ(Register(rejoin, &reply).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(control_->servers_refused(), 2u);
  // Its own data dir holds the credential: a restart is taken as one.
  proto::RegisterServerRequest restarted = ServerRequest(6000, 900, /*stored_slot=*/0);
  restarted.set_slot_credential(key_.ServerCredential(0));
  ASSERT_TRUE(Register(restarted, &reply).ok());
  EXPECT_EQ(control_->membership().servers().at(0).endpoint, Endpoint(6000));
  EXPECT_TRUE(control_->recovery().active());
}

TEST_F(ServerAdmissionControlTest, AJoinWithoutAGrantGetsNoSlot) {
  const size_t slots = control_->membership().servers().size();
  proto::RegisterServerReply reply;
  EXPECT_EQ(Register(ServerRequest(5002, 102), &reply).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(control_->membership().servers().size(), slots);
  EXPECT_EQ(control_->servers_refused(), 1u);
  proto::RegisterServerRequest granted = ServerRequest(5002, 102);
  granted.set_launch_secret(kToken);
  ASSERT_TRUE(Register(granted, &reply).ok());
  EXPECT_EQ(reply.server_id(), 2u);
  EXPECT_TRUE(key_.VerifyServer(2, reply.slot_credential()));
}

TEST_F(ServerAdmissionControlTest, ADeadSlotsPlaceIsTakenFromAFreshDirWithTheKeyAlone) {
  // ps[1]'s lease runs out; the replacement of a lost machine needs no grant.
  ASSERT_TRUE(ServerBeat(0, At(1'000)).ok());
  control_->Tick(At(1'000) + absl::Milliseconds(job_.master.lease_ms - 1));
  ASSERT_EQ(control_->membership().servers().at(1).state, PeerState::kDead);
  proto::RegisterServerReply reply;
  ASSERT_TRUE(Register(ServerRequest(6001, 901), &reply).ok());
  EXPECT_EQ(reply.server_id(), 1u);
  EXPECT_EQ(control_->servers_refused(), 0u);
}

}  // namespace
}  // namespace eps
