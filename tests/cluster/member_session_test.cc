// Tests cluster/member_session.h against a fake master on loopback: an
// RpcServer (ephemeral port) whose answers the test scripts: registrations
// held unanswered, heartbeats answered (late if asked), refused FENCED,
// held silent or answered with shutdown, and the cluster map version it
// announces. Every wait has a deadline; nothing sleeps to synchronise.

#include "cluster/member_session.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kWorkerId = 7;
// Bound on every wait for something that should happen.
constexpr absl::Duration kPatience = absl::Seconds(5);

// Waits until `done` holds under `mu`; false after `timeout`.
template <typename Done>
bool AwaitUnder(absl::Mutex& mu, Done done, absl::Duration timeout = kPatience) {
  absl::MutexLock lock(&mu);
  return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
}

// A fake master: REGISTER_WORKER, HEARTBEAT, GET_CLUSTER_MAP and GET_SHARD
// (as any call a member makes), answered as the test says.
class FakeMaster {
 public:
  enum class Heartbeats { kAnswer, kFenced, kSilent, kShutdown };

  explicit FakeMaster(SocketFactory* factory) {
    RpcServerOptions options;
    options.name = "fake-master";
    options.num_threads = 6;  // held requests each keep one
    StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(
        factory, options,
        [this](Message& request, Message* reply) { return Handle(request, reply); });
    CHECK_OK(server.status());
    server_ = std::move(server).value();
    endpoint_ = server_->endpoint();
  }
  ~FakeMaster() { Stop(); }

  const std::string& endpoint() const { return endpoint_; }
  // Releases held requests and closes the port: from now on, silence.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      released_ = true;
    }
    server_->Stop();
  }

  // How the master answers; tests change it with Change.
  struct Script {
    Heartbeats heartbeats = Heartbeats::kAnswer;
    // Each heartbeat is answered this long after it arrived.
    absl::Duration heartbeat_delay = absl::ZeroDuration();
    // The map version heartbeats announce (0: not placed).
    uint64_t map_version = 0;
    // The next `hold` registrations (and GET_SHARDs) go unanswered.
    int hold = 0;
  };
  void Change(const std::function<void(Script&)>& edit) {
    absl::MutexLock lock(&mu_);
    edit(script_);
  }

  // What the master has seen.
  struct Log {
    int registrations = 0;
    int calls = 0;  // GET_SHARD
    int heartbeats = 0;
    proto::HeartbeatRequest last_heartbeat;
    proto::NodeId last_sender;
  };
  Log log() const {
    absl::MutexLock lock(&mu_);
    return log_;
  }
  // Waits until `count` heartbeats have arrived.
  bool AwaitHeartbeats(int count, absl::Duration timeout = kPatience) {
    return AwaitUnder(
        mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return log_.heartbeats >= count; },
        timeout);
  }

 private:
  Status Handle(Message& request, Message* reply) {
    absl::MutexLock lock(&mu_);
    switch (request.header().method()) {
      case proto::REGISTER_WORKER: {
        ++log_.registrations;
        EXPECT_EQ(request.header().sender().role(), proto::ROLE_WORKER);
        if (TakeHold()) return Hold("registration");
        proto::RegisterWorkerReply* body = reply->header().mutable_register_worker_reply();
        body->set_worker_id(kWorkerId);
        return absl::OkStatus();
      }
      case proto::GET_SHARD:
        ++log_.calls;
        if (TakeHold()) return Hold("GET_SHARD");
        reply->header().mutable_get_shard_reply()->set_action(proto::GetShardReply::WAIT);
        return absl::OkStatus();
      case proto::GET_CLUSTER_MAP:
        reply->header().mutable_get_cluster_map_reply()->mutable_map()->set_version(
            script_.map_version);
        return absl::OkStatus();
      case proto::HEARTBEAT: {
        ++log_.heartbeats;
        log_.last_heartbeat = request.header().heartbeat_request();
        log_.last_sender = request.header().sender();
        const absl::Time answer_at = absl::Now() + script_.heartbeat_delay;
        auto answer_due = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return released_ || absl::Now() >= answer_at;
        };
        // Timed: the condition depends on the clock.
        while (!answer_due())
          mu_.AwaitWithTimeout(absl::Condition(&released_), answer_at - absl::Now());
        switch (script_.heartbeats) {
          case Heartbeats::kFenced:
            return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                   "worker 7 is not registered", proto::FENCED);
          case Heartbeats::kSilent:
            return Hold("heartbeat");
          default:
            break;
        }
        proto::HeartbeatReply* body = reply->header().mutable_heartbeat_reply();
        const bool shutdown = script_.heartbeats == Heartbeats::kShutdown;
        body->set_shutdown(shutdown);
        body->set_state(shutdown ? proto::JOB_FINISHED : proto::JOB_RUNNING);
        body->set_cluster_map_version(script_.map_version);
        return absl::OkStatus();
      }
      default:
        return absl::UnimplementedError("fake master");
    }
  }

  // True (using one up) while requests are to be held.
  bool TakeHold() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (script_.hold == 0) return false;
    --script_.hold;
    return true;
  }

  // Keeps the request unanswered until Stop (or a while): the caller's
  // attempt times out first. The handler thread stays busy meanwhile, and
  // a request the server hands it then waits too (tests only count
  // requests where that cannot happen).
  Status Hold(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.AwaitWithTimeout(absl::Condition(&released_), absl::Seconds(3));
    return absl::UnavailableError(absl::StrCat(what, " held"));
  }

  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  Log log_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::string endpoint_;
  // Last: stopped (joining its threads) before the state above goes.
  std::unique_ptr<RpcServer> server_;
};

Message RegisterRequest() {
  Message request;
  request.header().set_method(proto::REGISTER_WORKER);
  request.header().mutable_register_worker_request()->set_hostname("test");
  return request;
}

Message GetShard() {
  Message request;
  request.header().set_method(proto::GET_SHARD);
  request.header().mutable_get_shard_request();
  return request;
}

proto::NodeId Self() {
  proto::NodeId self;
  self.set_role(proto::ROLE_WORKER);
  self.set_id(kWorkerId);
  return self;
}

class MemberSessionTest : public ::testing::Test {
 protected:
  MemberSessionOptions Options() const {
    MemberSessionOptions options;
    options.master = master_->endpoint();
    options.role = proto::ROLE_WORKER;
    options.master_wait = absl::Seconds(10);
    options.register_attempt_timeout = absl::Milliseconds(100);
    return options;
  }

  // What the hooks saw.
  struct Seen {
    int replies = 0;
    bool shutdown_seen = false;
    std::vector<uint64_t> follows;  // versions handed to follow_map
    std::vector<MemberSession::State> ends;
    Status end_status;
  };

  // Hooks that report worker stats (records 42, paused for checkpoint 3)
  // and record what they see; follow_map fetches the map through Call and
  // fails the first time it sees `fail_version`.
  MemberSession::Hooks RecordingHooks(uint64_t fail_version = 0) {
    MemberSession::Hooks hooks;
    hooks.fill_heartbeat = [](proto::HeartbeatRequest* request) {
      request->mutable_worker()->set_records(42);
      request->set_paused_for_checkpoint(3);
    };
    hooks.on_reply = [this](const proto::HeartbeatReply& reply) {
      absl::MutexLock lock(&mu_);
      ++seen_.replies;
      seen_.shutdown_seen |= reply.shutdown();
    };
    hooks.follow_map = [this, fail_version](uint64_t version) -> Status {
      bool fail = false;
      {
        absl::MutexLock lock(&mu_);
        fail = version == fail_version &&
               std::count(seen_.follows.begin(), seen_.follows.end(), version) == 0;
        seen_.follows.push_back(version);
      }
      if (fail) return absl::UnavailableError("scripted failure");
      Message request;
      request.header().set_method(proto::GET_CLUSTER_MAP);
      request.header().mutable_get_cluster_map_request();
      CallOptions call;
      call.attempt_timeout = absl::Seconds(2);
      call.max_attempts = 1;
      ASSIGN_OR_RETURN(Message reply, session_->Call(std::move(request), call));
      EXPECT_EQ(reply.header().get_cluster_map_reply().map().version(), version);
      return absl::OkStatus();
    };
    hooks.on_end = [this](MemberSession::State state, const Status& status) {
      absl::MutexLock lock(&mu_);
      seen_.ends.push_back(state);
      seen_.end_status = status;
    };
    return hooks;
  }

  // Registers (REQUIRES success) and starts heartbeating.
  void StartSession(const MemberSessionOptions& options, absl::Duration heartbeat,
                    absl::Duration lease, MemberSession::Hooks hooks) {
    session_ = std::make_unique<MemberSession>(&factory_, options);
    StatusOr<Message> reply = session_->Register(RegisterRequest());
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->header().register_worker_reply().worker_id(), kWorkerId);
    session_->Start(Self(), heartbeat, lease, std::move(hooks));
  }
  void StartSession(absl::Duration heartbeat = absl::Milliseconds(20)) {
    StartSession(Options(), heartbeat, absl::Seconds(10), RecordingHooks());
  }

  void HoldRequests(int requests) {
    master_->Change([requests](FakeMaster::Script& script) { script.hold = requests; });
  }
  void DelayHeartbeats(absl::Duration delay) {
    master_->Change([delay](FakeMaster::Script& script) { script.heartbeat_delay = delay; });
  }
  void AnswerHeartbeats(FakeMaster::Heartbeats mode) {
    master_->Change([mode](FakeMaster::Script& script) { script.heartbeats = mode; });
  }
  void SetMapVersion(uint64_t version) {
    master_->Change([version](FakeMaster::Script& script) { script.map_version = version; });
  }
  // Starts a session, answers heartbeats with `mode` once one was
  // answered, and waits until the session ends.
  void EndSessionBy(FakeMaster::Heartbeats mode) {
    StartSession();
    ASSERT_TRUE(AwaitReplies(1));
    AnswerHeartbeats(mode);
    ASSERT_TRUE(AwaitEnd());
  }

  Seen seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  bool AwaitReplies(int count) {
    return AwaitUnder(mu_,
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.replies >= count; });
  }
  bool AwaitEnd() {
    return AwaitUnder(mu_,
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !seen_.ends.empty(); });
  }

  // Declared first: destroyed after the session and the master.
  SocketFactory factory_;
  std::unique_ptr<FakeMaster> master_ = std::make_unique<FakeMaster>(&factory_);
  absl::Mutex mu_;
  Seen seen_ ABSL_GUARDED_BY(mu_);
  // Destroyed first: its hooks use the state above.
  std::unique_ptr<MemberSession> session_;
};

TEST(MemberSessionOptions, RejectsNonsense) {
  MemberSessionOptions options;
  options.master = "tcp://127.0.0.1:5000";
  options.role = proto::ROLE_SERVER;
  EXPECT_TRUE(options.Validate().ok());
  options.role = proto::ROLE_MASTER;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options.role = proto::ROLE_WORKER;
  options.master_wait = absl::ZeroDuration();  // give up at once: allowed
  EXPECT_TRUE(options.Validate().ok());
  options.master_wait = -absl::Seconds(1);
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options.master_wait = absl::Seconds(1);
  options.register_attempt_timeout = absl::ZeroDuration();
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options.register_attempt_timeout = absl::Seconds(1);
  options.clock = nullptr;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options.clock = Clock::Real();
  options.master = "localhost";
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MemberSessionTest, RegistrationIsRetriedUntilTheMasterAnswers) {
  HoldRequests(2);
  MemberSession session(&factory_, Options());
  StatusOr<Message> reply = session.Register(RegisterRequest());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header().register_worker_reply().worker_id(), kWorkerId);
  EXPECT_EQ(master_->log().registrations, 3);
  EXPECT_EQ(session.state(), MemberSession::State::kRegistered);
}

TEST_F(MemberSessionTest, RegistrationGivesUpAfterTheMasterWait) {
  MemberSessionOptions options = Options();
  options.master_wait = absl::Milliseconds(300);
  master_->Stop();
  MemberSession session(&factory_, options);
  const absl::Time start = absl::Now();
  StatusOr<Message> reply = session.Register(RegisterRequest());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("cannot register with the master at"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(MemberSessionTest, HeartbeatsCarryTheRolesStats) {
  StartSession();
  ASSERT_TRUE(master_->AwaitHeartbeats(2));
  const FakeMaster::Log log = master_->log();
  const proto::HeartbeatRequest& heartbeat = log.last_heartbeat;
  EXPECT_EQ(heartbeat.worker().records(), 42u);
  EXPECT_EQ(heartbeat.paused_for_checkpoint(), 3u);
  EXPECT_EQ(log.last_sender.role(), proto::ROLE_WORKER);
  EXPECT_EQ(log.last_sender.id(), kWorkerId);
  EXPECT_TRUE(AwaitReplies(2));
  EXPECT_EQ(session_->state(), MemberSession::State::kRunning);
  EXPECT_TRUE(session_->CheckLease().ok());
}

TEST_F(MemberSessionTest, FirstHeartbeatAtOnceAndHeartbeatNowSendsTheNext) {
  // An interval far beyond the test: only HeartbeatNow brings a second one.
  StartSession(/*heartbeat=*/absl::Seconds(60));
  ASSERT_TRUE(master_->AwaitHeartbeats(1));
  ASSERT_TRUE(AwaitReplies(1));
  session_->HeartbeatNow();
  EXPECT_TRUE(master_->AwaitHeartbeats(2));
}

TEST_F(MemberSessionTest, FencedReplyEndsTheSessionFenced) {
  ASSERT_NO_FATAL_FAILURE(EndSessionBy(FakeMaster::Heartbeats::kFenced));
  EXPECT_EQ(session_->state(), MemberSession::State::kFenced);
  EXPECT_EQ(ReasonOf(session_->status()), proto::FENCED) << session_->status();
  EXPECT_EQ(session_->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(seen().ends, ElementsAre(MemberSession::State::kFenced));
  EXPECT_EQ(ReasonOf(seen().end_status), proto::FENCED);
  // No heartbeat after the end.
  const int heartbeats = master_->log().heartbeats;
  session_->Stop();
  EXPECT_EQ(master_->log().heartbeats, heartbeats);
  EXPECT_EQ(session_->state(), MemberSession::State::kFenced);  // the first end wins
}

TEST_F(MemberSessionTest, SilencePastTheMasterWaitLosesTheMaster) {
  MemberSessionOptions options = Options();
  options.master_wait = absl::Milliseconds(300);
  StartSession(options, absl::Milliseconds(20), absl::Seconds(10), RecordingHooks());
  ASSERT_TRUE(AwaitReplies(1));
  master_->Stop();
  const absl::Time silent_from = absl::Now();
  ASSERT_TRUE(AwaitEnd());
  // The first heartbeat attempt past the wait (1 s each) gives up.
  EXPECT_LT(absl::Now() - silent_from, absl::Seconds(3));
  EXPECT_EQ(session_->state(), MemberSession::State::kLostMaster);
  EXPECT_EQ(session_->status().code(), absl::StatusCode::kUnavailable) << session_->status();
  EXPECT_THAT(session_->status().message(),
              HasSubstr(absl::StrCat("lost the master at ", master_->endpoint())));
  EXPECT_THAT(seen().ends, ElementsAre(MemberSession::State::kLostMaster));
}

// The lease on scripted time (MemberSessionOptions.clock): it runs out
// exactly a lease after the last answered heartbeat was sent, and an
// answered heartbeat renews it from its own sending.
TEST_F(MemberSessionTest, LeaseExpiresALeaseAfterTheLastAnsweredHeartbeatWasSent) {
  ScriptedClock clock;
  MemberSessionOptions options = Options();
  options.clock = &clock;
  // The first heartbeat goes at once; the next would come a minute later.
  StartSession(options, absl::Seconds(60), absl::Milliseconds(300), RecordingHooks());
  ASSERT_TRUE(AwaitReplies(1));
  clock.Advance(absl::Milliseconds(299));
  EXPECT_TRUE(session_->CheckLease().ok());
  clock.Advance(absl::Milliseconds(1));
  const Status lease = session_->CheckLease();
  EXPECT_EQ(lease.code(), absl::StatusCode::kFailedPrecondition) << lease;
  EXPECT_EQ(ReasonOf(lease), proto::FENCED);
  EXPECT_THAT(lease.message(), HasSubstr("no heartbeat answered for 300ms"));
  EXPECT_THAT(lease.message(), HasSubstr("this worker may be fenced"));
  // Fencing is the master's word: the session itself goes on.
  EXPECT_EQ(session_->state(), MemberSession::State::kRunning);
  session_->HeartbeatNow();
  ASSERT_TRUE(AwaitReplies(2));
  EXPECT_TRUE(session_->CheckLease().ok());
}

TEST_F(MemberSessionTest, AHeartbeatAnsweredAfterALeaseDoesNotRenewIt) {
  // The only heartbeat is answered 800 ms after it was sent, with a lease
  // of 500 ms: counted from the send, the lease ran out before the answer
  // came (counted from the answer it would look fresh).
  DelayHeartbeats(absl::Milliseconds(800));
  StartSession(Options(), absl::Seconds(60), absl::Milliseconds(500), RecordingHooks());
  ASSERT_TRUE(AwaitReplies(1));
  const Status lease = session_->CheckLease();
  EXPECT_EQ(ReasonOf(lease), proto::FENCED) << lease;
  // A prompt answer renews it.
  DelayHeartbeats(absl::ZeroDuration());
  session_->HeartbeatNow();
  ASSERT_TRUE(AwaitReplies(2));
  EXPECT_TRUE(session_->CheckLease().ok());
}

TEST_F(MemberSessionTest, MapVersionReachesTheHookOnceAndAgainAfterAFailure) {
  SetMapVersion(0);  // not placed: nothing to follow
  StartSession(Options(), absl::Milliseconds(20), absl::Seconds(10),
               RecordingHooks(/*fail_version=*/2));
  ASSERT_TRUE(AwaitReplies(3));
  EXPECT_TRUE(seen().follows.empty());
  SetMapVersion(1);
  int replies = seen().replies;
  ASSERT_TRUE(AwaitReplies(replies + 4));
  EXPECT_THAT(seen().follows, ElementsAre(1));
  SetMapVersion(2);  // the hook fails the first time, then succeeds
  replies = seen().replies;
  ASSERT_TRUE(AwaitReplies(replies + 5));
  EXPECT_THAT(seen().follows, ElementsAre(1, 2, 2));
}

TEST_F(MemberSessionTest, ShutdownEndsTheSessionFinished) {
  ASSERT_NO_FATAL_FAILURE(EndSessionBy(FakeMaster::Heartbeats::kShutdown));
  EXPECT_EQ(session_->state(), MemberSession::State::kFinished);
  EXPECT_TRUE(session_->status().ok()) << session_->status();
  const Seen hooks = seen();
  EXPECT_TRUE(hooks.shutdown_seen);  // on_reply saw it before the end
  EXPECT_THAT(hooks.ends, ElementsAre(MemberSession::State::kFinished));
  EXPECT_TRUE(hooks.end_status.ok());
}

TEST_F(MemberSessionTest, StopReturnsPromptlyBetweenHeartbeats) {
  StartSession(/*heartbeat=*/absl::Seconds(60));
  ASSERT_TRUE(AwaitReplies(1));
  const absl::Time start = absl::Now();
  session_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(session_->state(), MemberSession::State::kStopped);
  EXPECT_TRUE(seen().ends.empty());  // on_end is the master's doing only
}

TEST_F(MemberSessionTest, StopReturnsPromptlyDuringAnUnansweredHeartbeat) {
  StartSession();
  ASSERT_TRUE(AwaitReplies(1));
  AnswerHeartbeats(FakeMaster::Heartbeats::kSilent);
  const int heartbeats = master_->log().heartbeats;
  ASSERT_TRUE(master_->AwaitHeartbeats(heartbeats + 1));  // one in flight, held
  const absl::Time start = absl::Now();
  session_->Stop();
  // Well under the heartbeat's 1 s attempt timeout.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(session_->state(), MemberSession::State::kStopped);
}

TEST_F(MemberSessionTest, CallMasterRidesOutAnUnansweredCall) {
  StartSession();
  HoldRequests(1);
  RpcChannel channel(&factory_, Self());
  CallOptions call;
  call.attempt_timeout = absl::Milliseconds(100);
  call.max_attempts = 1;
  StatusOr<Message> reply = session_->CallMaster(channel, GetShard, call);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(master_->log().calls, 2);
  // Given up after one unanswered call when the caller says so, long
  // before the master wait (10 s).
  HoldRequests(1);
  const absl::Time start = absl::Now();
  reply = session_->CallMaster(channel, GetShard, call, [] { return true; });
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace eps
