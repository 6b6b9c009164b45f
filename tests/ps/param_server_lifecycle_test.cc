// Tests ps/param_server.h: retried pushes, unimplemented methods, starting,
// stopping, losing the master.
// The fixture is in tests/ps/param_server_fixture.h.

#include "tests/ps/param_server_fixture.h"

namespace eps {
namespace {

TEST_F(ParamServerTest, RetriedPushIsAppliedOnce) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(6, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  const uint64_t seq = NextSeq();

  // The same request delivered twice (a retry after a lost reply).
  StatusOr<Message> reply = Call(PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());
  reply = Call(PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->header().has_push_reply());
  EXPECT_FALSE(reply->header().push_reply().applied());
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<float> expected(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) expected[i] = Sgd(0.0f, grads[i]);
  EXPECT_EQ(*rows, expected);

  // The same number from another worker is another push.
  reply = CallOn(other_worker_, PushRequest({kEmb}, {keys}, {grads}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());
  for (size_t i = 0; i < grads.size(); ++i) expected[i] = Sgd(expected[i], grads[i]);
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, expected);

  // Without a sequence number (0) every delivery is applied.
  for (int i = 0; i < 2; ++i) {
    reply = Call(PushRequest({kEmb}, {keys}, {grads}, /*client_seq=*/0));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(reply->header().push_reply().applied());
    for (size_t j = 0; j < grads.size(); ++j) expected[j] = Sgd(expected[j], grads[j]);
  }
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, expected);

  // A rejected push records nothing: resent valid, it is applied.
  const uint64_t next = NextSeq();
  std::vector<float> bad = grads;
  bad[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Call(PushRequest({kEmb}, {keys}, {bad}, next)).status().code(),
            absl::StatusCode::kInvalidArgument);
  reply = Call(PushRequest({kEmb}, {keys}, {grads}, next));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());

  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.pushes() >= 5; }, absl::Seconds(3));
  EXPECT_EQ(stats.pushes(), 5u);
  EXPECT_EQ(stats.pushes_deduplicated(), 1u);
  EXPECT_EQ(stats.pushes_fenced(), 0u);
}

TEST_F(ParamServerTest, OtherMethodsAreUnimplemented) {
  StartServer();
  AwaitMap();
  for (proto::Method method : {proto::GET_SHARD, proto::HEARTBEAT, proto::METHOD_UNSPECIFIED}) {
    Message request;
    request.header().set_method(method);
    StatusOr<Message> reply = Call(std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnimplemented)
        << proto::Method_Name(method) << ": " << reply.status();
  }
}

TEST_F(ParamServerTest, ShutdownFromTheMasterEndsWait) {
  StartServer();
  AwaitMap();
  master_->set_shutdown(true);
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ParamServerTest, RequestStopEndsWait) {
  StartServer();
  server_->RequestStop();
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ParamServerTest, StartFailsWhenTheMasterIsUnreachable) {
  // The master's port is closed: nobody listens there.
  std::string dead;
  {
    StatusOr<zmq::socket_t> router = factory_.BindRouter("tcp://127.0.0.1:0", &dead);
    ASSERT_TRUE(router.ok()) << router.status();
    router->close();
  }
  ParamServerOptions options = Options();
  options.master = dead;
  options.master_wait = absl::Seconds(2);
  ParamServer server(options);
  const absl::Time start = absl::Now();
  const Status started = server.Start();
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(started.code() == absl::StatusCode::kDeadlineExceeded ||
              started.code() == absl::StatusCode::kUnavailable)
      << started;
  EXPECT_THAT(started.message(), HasSubstr(dead));
  EXPECT_LT(took, absl::Seconds(4));
  EXPECT_EQ(server.Wait().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ParamServerTest, StartRefusesAJobWithBadTableIds) {
  proto::JobSpec job = MakeJob();
  job.mutable_tables(1)->set_id(5);
  master_->set_job(job);
  ParamServer server(Options());
  const Status started = server.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kInvalidArgument) << started;
}

TEST_F(ParamServerTest, LosingTheMasterEndsWaitWithUnavailable) {
  ParamServerOptions options = Options();
  options.master_wait = absl::Seconds(1);
  StartServer(options);
  AwaitMap();
  master_->Stop();
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(waited.message(), HasSubstr(master_->endpoint()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST_F(ParamServerTest, AServerRefusedAHeartbeatTakesItsSlotBack) {
  StartServer();
  AwaitMap();
  ASSERT_EQ(master_->registrations(), 1);
  const proto::RegisterServerRequest first = master_->last_registration();
  EXPECT_FALSE(first.rejoin());
  // Wait registers again (as the binary runs it: right after Start).
  Status waited = absl::UnknownError("not returned");
  std::thread waiter([&] { waited = server_->Wait(); });
  master_->RefuseHeartbeats(1, ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                               "ps[3] is not registered", proto::FENCED));
  const bool beating = master_->AwaitHeartbeats(master_->heartbeats() + 4, absl::Seconds(5));
  master_->set_shutdown(true);
  waiter.join();
  ASSERT_TRUE(beating);
  EXPECT_EQ(master_->registrations(), 2);
  const proto::RegisterServerRequest again = master_->last_registration();
  EXPECT_TRUE(again.rejoin());
  EXPECT_EQ(again.stored_server_id(), kServerId);
  EXPECT_EQ(again.endpoint(), server_->endpoint());
  EXPECT_EQ(again.job_options_size(), first.job_options_size());
  EXPECT_EQ(again.pid(), first.pid());
  // It served on, as the same slot, until the job ended.
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST_F(ParamServerTest, AServerWhoseSlotWasTakenExits) {
  StartServer();
  AwaitMap();
  master_->set_register_error(absl::FailedPreconditionError(
      "ps[3] is served by tcp://10.0.0.9:7 now: this server was replaced while it was away"));
  master_->set_heartbeat_error(ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                               "ps[3] is not registered", proto::FENCED));
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("ps[3] cannot take its slot back"));
  EXPECT_THAT(waited.message(), HasSubstr("replaced while it was away"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ParamServerTest, AMasterThatKeepsRefusingHeartbeatsEndsWait) {
  StartServer();
  AwaitMap();
  master_->set_heartbeat_error(ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                               "ps[3] is not registered", proto::FENCED));
  const absl::Time start = absl::Now();
  const Status waited = server_->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("right after it took its slot back"));
  EXPECT_EQ(master_->registrations(), 2) << "one attempt to take the slot back";
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace eps
