// Only the job's own processes can act on it (security.mode = curve, the
// default): the attacks that once ruined a job, replayed against a running
// one by an outsider without keys, one with keys of another job, and one
// holding the job's worker key; every one is refused, the job finishes
// exactly once with the AUC of an unattacked run, and /metrics counts the
// refusals. With mode = off the job still trains, and every process says at
// its start that it is unauthenticated.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/security.h"
#include "rpc/socket_factory.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace eps::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Seconds(180);
constexpr int kRows = 200000;

proto::NodeId Node(proto::Role role, uint32_t id) {
  proto::NodeId node;
  node.set_role(role);
  node.set_id(id);
  return node;
}

// The requests that once ruined a job, each with the endpoint it goes to.
struct Attack {
  std::string what;
  std::string endpoint;
  Message request;
};

std::vector<Attack> Attacks(const std::string& master, const std::vector<std::string>& servers) {
  std::vector<Attack> attacks;
  for (const std::string& server : servers) {
    Attack restore{"RESTORE of nothing", server, Message()};
    restore.request.header().set_method(proto::RESTORE);
    restore.request.header().mutable_restore_request()->set_checkpoint_id(0);
    attacks.push_back(std::move(restore));

    Attack checkpoint{"CHECKPOINT keeping none", server, Message()};
    checkpoint.request.header().set_method(proto::CHECKPOINT);
    checkpoint.request.header().mutable_checkpoint_request()->set_checkpoint_id(1'000'000);
    checkpoint.request.header().mutable_checkpoint_request()->add_keep_ids(1'000'000);
    attacks.push_back(std::move(checkpoint));

    Attack fence{"FENCE_WORKERS of every id", server, Message()};
    fence.request.header().set_method(proto::FENCE_WORKERS);
    for (uint32_t id = 0; id < 100'000; ++id) {
      fence.request.header().mutable_fence_workers_request()->add_worker_ids(id);
    }
    attacks.push_back(std::move(fence));
  }
  Attack takeover{"REGISTER_SERVER taking slot 0", master, Message()};
  takeover.request.header().set_method(proto::REGISTER_SERVER);
  proto::RegisterServerRequest* body = takeover.request.header().mutable_register_server_request();
  body->set_endpoint("tcp://127.0.0.1:1");
  body->set_hostname("attacker");
  body->set_pid(1);
  body->set_stored_server_id(0);
  attacks.push_back(std::move(takeover));
  return attacks;
}

// Sends every attack once as `sender` through `factory`; none may succeed.
// The codes they got, in order.
std::vector<absl::StatusCode> Replay(SocketFactory& factory, const proto::NodeId& sender,
                                     std::vector<Attack> attacks) {
  RpcChannel channel(&factory, sender);
  CallOptions once;
  once.attempt_timeout = absl::Milliseconds(400);
  once.max_attempts = 1;
  std::vector<absl::StatusCode> codes;
  for (Attack& attack : attacks) {
    StatusOr<Message> reply = channel.Call(attack.endpoint, std::move(attack.request), once);
    EXPECT_FALSE(reply.ok()) << attack.what << " as " << RoleName(sender.role())
                             << " succeeded";
    codes.push_back(reply.status().code());
  }
  return codes;
}

std::vector<std::string> ServerEndpoints(const json& status) {
  std::vector<std::string> endpoints;
  for (const json& server : status["servers"]) {
    endpoints.push_back(server["endpoint"].get<std::string>());
  }
  return endpoints;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(GenerateData(dir_.Join("data"), kRows, /*seed=*/31, /*files=*/2).ok());
    overrides_ = {"--data.train=" + dir_.Join("data/train"),
                  "--data.eval=" + dir_.Join("data/eval")};
    lines_ = CountLines(dir_.Join("data/train"));
  }

  // Runs the job to its end in DIR/name; its final status.
  json Finish(LocalJob& job) {
    nlohmann::json final_status;
    ExpectFinishedExactlyOnce(job, kJobTimeout, lines_, &final_status);
    for (const std::optional<int>& code : job.WaitForOthers(absl::Seconds(30))) {
      EXPECT_EQ(code, 0) << job.Logs();
    }
    return final_status;
  }

  TempDir dir_;
  std::vector<std::string> overrides_;
  uint64_t lines_ = 0;
};

TEST_F(SecurityTest, EveryAttackIsRefusedAndTheJobTrainsAsIfNoneHappened) {
  const std::string config = WriteFaultJobConfig(dir_.path(), "security");
  // About 25 s of training: the attacks land while it trains.
  overrides_.push_back("--worker.max_records_per_s=4000");
  LocalJob job(dir_.Join("attacked"), config, overrides_);
  ASSERT_FALSE(job.keys_dir().empty());
  ASSERT_TRUE(job.Start(/*servers=*/2, /*workers=*/2).ok()) << job.Logs();
  ASSERT_TRUE(job.WaitForStatus([&](const json& status) {
    return status["servers"].size() == 2 && status["records_trained"].get<uint64_t>() > 0;
  })) << job.Logs();
  const StatusOr<json> live = job.LiveStatus();
  ASSERT_TRUE(live.ok()) << live.status();
  const std::vector<std::string> servers = ServerEndpoints(*live);
  const size_t on_servers = 3 * servers.size();

  // An outsider without keys: nothing reaches a handler, nothing answers.
  SocketFactory plain;
  for (absl::StatusCode code :
       Replay(plain, Node(proto::ROLE_MASTER, 0), Attacks(job.endpoint(), servers))) {
    EXPECT_EQ(code, absl::StatusCode::kDeadlineExceeded);
  }
  // One with keys of its own (and the job's public keys): the handshake
  // is refused, and counted.
  TempDir foreign;
  ASSERT_TRUE(WriteJobKeys(foreign.path()).ok());
  {
    auto keys_in = [](const std::string& dir, proto::Role role) {
      JobConfig::Security config;
      config.keys_dir = dir;
      return LoadSecurity(config, role).value();
    };
    TransportOptions transport;
    transport.security = keys_in(foreign.path(), proto::ROLE_MASTER);
    const SecurityOptions job_keys = keys_in(job.keys_dir(), proto::ROLE_TOOL);
    transport.security.master_key = job_keys.master_key;
    transport.security.server_key = job_keys.server_key;
    SocketFactory outsider(transport);
    for (absl::StatusCode code :
         Replay(outsider, Node(proto::ROLE_MASTER, 0), Attacks(job.endpoint(), servers))) {
      EXPECT_EQ(code, absl::StatusCode::kDeadlineExceeded);
    }
  }
  // A worker started with another job's keys cannot join, and says why.
  {
    std::vector<std::string> argv = {BinaryPath("eps-worker"), "--config", config, "--master",
                                     job.endpoint(), "--security.keys_dir=" + foreign.path(),
                                     "--worker.master_wait_s=2"};
    argv.insert(argv.end(), overrides_.begin(), overrides_.end());
    StatusOr<std::unique_ptr<Process>> stranger = Process::Start(argv, dir_.Join("stranger.log"));
    ASSERT_TRUE(stranger.ok()) << stranger.status();
    EXPECT_EQ((*stranger)->Wait(absl::Seconds(30)), 1) << (*stranger)->Log();
    EXPECT_THAT((*stranger)->Log(), HasSubstr("security.keys_dir"));
  }
  // The job's worker key, honest about its role and claiming the master's:
  // every master-only and server-only method is refused with an answer.
  std::unique_ptr<SocketFactory> worker = FactoryWithJobKeys(job.keys_dir(), proto::ROLE_WORKER);
  for (const proto::NodeId& claim : {Node(proto::ROLE_WORKER, 0), Node(proto::ROLE_MASTER, 0)}) {
    for (absl::StatusCode code : Replay(*worker, claim, Attacks(job.endpoint(), servers))) {
      EXPECT_EQ(code, absl::StatusCode::kPermissionDenied);
    }
  }
  // The tool's key only reads: a PUSH of -9e37 into a dense tensor is
  // refused.
  std::unique_ptr<SocketFactory> tool = FactoryWithJobKeys(job.keys_dir(), proto::ROLE_TOOL);
  {
    RpcChannel channel(tool.get(), Node(proto::ROLE_TOOL, 0));
    Message push;
    push.header().set_method(proto::PUSH);
    push.header().mutable_push_request()->add_table_ids(1);
    push.AddArray(std::vector<uint64_t>{1});
    push.AddArray(std::vector<float>(14, -9e37f));
    CallOptions once;
    once.max_attempts = 1;
    EXPECT_EQ(channel.Call(servers[0], std::move(push), once).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  // POST /checkpoint without the token, or from another origin's page.
  httplib::Client http(job.http());
  http.set_connection_timeout(2);
  httplib::Result posted = http.Post("/checkpoint");
  ASSERT_TRUE(posted) << httplib::to_string(posted.error());
  EXPECT_EQ(posted->status, 401);

  // The refusals reach /metrics: the master's at once, the servers' with
  // their next heartbeat.
  ASSERT_TRUE(job.WaitForStatus([&](const json& status) {
    uint64_t refused = 0;
    uint64_t unauthenticated = 0;
    for (const json& server : status["servers"]) {
      refused += server["requests_refused"].get<uint64_t>();
      unauthenticated += server["requests_unauthenticated"].get<uint64_t>();
    }
    return refused >= 2 * on_servers + 1 && unauthenticated >= 1;
  })) << job.Logs();
  httplib::Result metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("eps_master_requests_refused_total{reason=\"permission_denied\"} 2\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("eps_http_requests_refused_total{reason=\"unauthorized\"} 1\n"));
  EXPECT_THAT(metrics->body, HasSubstr("eps_server_requests_refused_total{server=\"0\""));
  EXPECT_THAT(metrics->body, ::testing::Not(HasSubstr(
                                 "eps_master_requests_refused_total{reason=\"unauthenticated\"} 0\n")));
  // Each refusal is logged once per peer.
  EXPECT_THAT(job.master().Log(), HasSubstr("refused REGISTER_SERVER from a worker key"));
  EXPECT_THAT(job.master().Log(), HasSubstr("refused a connection from 127.0.0.1"));

  const StatusOr<json> still = job.LiveStatus();
  ASSERT_TRUE(still.ok() && (*still)["state"] == "running")
      << "the job ended before the attacks were over: they proved nothing\n" << job.Logs();
  const json attacked = Finish(job);
  EXPECT_EQ(attacked["checkpoints"]["failed"].get<uint64_t>(), 0u) << attacked["checkpoints"];

  // The same job, unattacked.
  LocalJob quiet(dir_.Join("quiet"), config, overrides_);
  ASSERT_TRUE(quiet.Start(/*servers=*/2, /*workers=*/2).ok()) << quiet.Logs();
  const json unattacked = Finish(quiet);
  EXPECT_NEAR(attacked["metrics"]["eval_auc"].get<double>(),
              unattacked["metrics"]["eval_auc"].get<double>(), 0.005);
}

TEST_F(SecurityTest, OffStillTrainsAndEveryProcessSaysItIsUnauthenticated) {
  const std::string config = WriteFaultJobConfig(dir_.path(), "open");
  std::vector<std::string> flags = overrides_;
  flags.push_back("--security.mode=off");
  flags.push_back("--ps.num_servers=1");
  LocalJob job(dir_.Join("open"), config, flags);
  EXPECT_TRUE(job.keys_dir().empty());
  ASSERT_TRUE(job.Start(/*servers=*/1, /*workers=*/1).ok()) << job.Logs();
  Finish(job);
  EXPECT_THAT(job.master().Log(), HasSubstr("master is UNAUTHENTICATED"));
  EXPECT_THAT(job.master().Log(), HasSubstr("POST /checkpoint needs no token"));
  EXPECT_THAT(job.servers()[0]->Log(), HasSubstr("server is UNAUTHENTICATED"));
  EXPECT_THAT(job.workers()[0]->Log(), HasSubstr("worker is UNAUTHENTICATED"));
}

}  // namespace
}  // namespace eps::testing
