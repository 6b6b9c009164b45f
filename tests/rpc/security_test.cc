// Tests rpc/security.h: a job's keys, loading them, the authorization
// table, and CURVE with ZAP end to end through RpcServer and RpcChannel on
// loopback (real ZeroMQ sockets, ephemeral ports).

#include "rpc/security.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cluster/call_table.h"
#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/rpc_channel.h"
#include "rpc/rpc_server.h"
#include "rpc/socket_factory.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::eps::testing::TempDir;
using ::testing::HasSubstr;

JobConfig::Security Curve(const std::string& keys_dir) {
  JobConfig::Security config;
  config.mode = "curve";
  config.keys_dir = keys_dir;
  return config;
}

proto::NodeId Node(proto::Role role, uint32_t id) {
  proto::NodeId node;
  node.set_role(role);
  node.set_id(id);
  return node;
}

TEST(JobKeys, EveryRoleLoadsItsOwnPair) {
  TempDir dir;
  ASSERT_TRUE(WriteJobKeys(dir.path()).ok());
  for (proto::Role role :
       {proto::ROLE_MASTER, proto::ROLE_SERVER, proto::ROLE_WORKER, proto::ROLE_TOOL}) {
    StatusOr<SecurityOptions> security = LoadSecurity(Curve(dir.path()), role);
    ASSERT_TRUE(security.ok()) << security.status();
    EXPECT_TRUE(security->curve);
    EXPECT_EQ(security->role, role);
    EXPECT_EQ(security->public_key.size(), 40u);
    EXPECT_EQ(security->RoleOf(security->public_key), role);
    EXPECT_NE(security->master_key, security->server_key);
    EXPECT_EQ(security->trusted.size(), 4u);
    struct stat info;
    ASSERT_EQ(::stat(dir.Join(std::string(RoleName(role)) + ".key").c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0077, 0u) << "a key pair readable by others";
  }
  struct stat token;
  ASSERT_EQ(::stat(dir.Join("http_token").c_str(), &token), 0);
  EXPECT_EQ(token.st_mode & 0077, 0u);
  // 32 random bytes in hex: nothing an HTTP library would decode ('%').
  StatusOr<SecurityOptions> master = LoadSecurity(Curve(dir.path()), proto::ROLE_MASTER);
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_THAT(master->http_token, ::testing::MatchesRegex("[0-9a-f]{64}"));
}

TEST(JobKeys, AreNotReplacedByASecondRun) {
  TempDir dir;
  ASSERT_TRUE(WriteJobKeys(dir.path()).ok());
  const StatusOr<std::string> before = ReadSmallFile(dir.Join("public_keys"), 4096);
  const Status again = WriteJobKeys(dir.path());
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_EQ(ReadSmallFile(dir.Join("public_keys"), 4096).value(), before.value());
}

TEST(LoadSecurity, OffLoadsNothing) {
  JobConfig::Security config;
  config.mode = "off";
  StatusOr<SecurityOptions> security = LoadSecurity(config, proto::ROLE_WORKER);
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_FALSE(security->curve);
}

TEST(LoadSecurity, CurveWithoutKeysSaysWhatToDo) {
  const StatusOr<SecurityOptions> security = LoadSecurity(Curve(""), proto::ROLE_MASTER);
  EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(security.status().message(), HasSubstr("security.keys_dir"));
  EXPECT_THAT(security.status().message(), HasSubstr("eps-keygen"));
  EXPECT_THAT(security.status().message(), HasSubstr("security.mode = off"));
}

TEST(LoadSecurity, NamesAMissingFile) {
  TempDir dir;
  const StatusOr<SecurityOptions> security = LoadSecurity(Curve(dir.path()), proto::ROLE_WORKER);
  EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(security.status().message(), HasSubstr(dir.Join("public_keys")));
}

TEST(LoadSecurity, NamesTheBadLine) {
  TempDir dir;
  ASSERT_TRUE(WriteJobKeys(dir.path()).ok());
  std::ofstream(dir.Join("public_keys"), std::ios::app) << "worker not-a-key\n";
  const StatusOr<SecurityOptions> security = LoadSecurity(Curve(dir.path()), proto::ROLE_WORKER);
  EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
  // Two comment lines and four keys come first.
  EXPECT_THAT(security.status().message(), HasSubstr(dir.Join("public_keys") + ":7"));
}

// A key or token that is not a regular file (a FIFO would block the read
// forever) is refused at start, named.
TEST(LoadSecurity, RefusesAKeyOrTokenThatIsNotARegularFile) {
  TempDir dir;
  ASSERT_TRUE(WriteJobKeys(dir.path()).ok());
  struct stat info;
  ASSERT_EQ(::stat(dir.path().c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0077, 0u) << "a keys dir others may enter";
  std::filesystem::remove(dir.Join("worker.key"));
  ASSERT_EQ(::mkfifo(dir.Join("worker.key").c_str(), 0600), 0);
  StatusOr<SecurityOptions> security = LoadSecurity(Curve(dir.path()), proto::ROLE_WORKER);
  EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(security.status().message(),
              HasSubstr(dir.Join("worker.key") + " is not a regular file"));

  std::filesystem::remove(dir.Join("http_token"));
  std::filesystem::create_directory(dir.Join("http_token"));
  security = LoadSecurity(Curve(dir.path()), proto::ROLE_MASTER);
  EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(security.status().message(), HasSubstr("security.http_token_file"));
  EXPECT_THAT(security.status().message(), HasSubstr("is not a regular file"));
}

TEST(LoadSecurity, RefusesKeysOfTwoRunsMixed) {
  TempDir one;
  TempDir two;
  ASSERT_TRUE(WriteJobKeys(one.path()).ok());
  ASSERT_TRUE(WriteJobKeys(two.path()).ok());
  std::filesystem::copy_file(two.Join("worker.key"), one.Join("worker.key"),
                             std::filesystem::copy_options::overwrite_existing);
  const StatusOr<SecurityOptions> security = LoadSecurity(Curve(one.path()), proto::ROLE_WORKER);
  EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(security.status().message(), HasSubstr("worker.key"));
  EXPECT_THAT(security.status().message(), HasSubstr("not listed"));
}

TEST(WorkerCredentials, ProveOnlyTheIdTheyWereIssuedFor) {
  TempDir dir;
  ASSERT_TRUE(WriteJobKeys(dir.path()).ok());
  StatusOr<WorkerCredentials> master =
      WorkerCredentials::ForMaster(LoadSecurity(Curve(dir.path()), proto::ROLE_MASTER).value());
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string seven = master->Issue(7);
  EXPECT_TRUE(master->Verify(7, seven));
  EXPECT_FALSE(master->Verify(8, seven));
  EXPECT_FALSE(master->Verify(7, ""));
  EXPECT_FALSE(master->Verify(7, seven.substr(1)));
  std::string flipped = seven;
  flipped[0] ^= 1;
  EXPECT_FALSE(master->Verify(7, flipped));
  // A server checks with the key the master handed it.
  StatusOr<WorkerCredentials> server = WorkerCredentials::FromKey(master->key());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(server->Verify(7, seven));
  // A restarted master issues the same; another job's does not.
  EXPECT_EQ(WorkerCredentials::ForMaster(LoadSecurity(Curve(dir.path()), proto::ROLE_MASTER).value())
                ->Issue(7),
            seven);
  TempDir other;
  ASSERT_TRUE(WriteJobKeys(other.path()).ok());
  StatusOr<WorkerCredentials> foreign =
      WorkerCredentials::ForMaster(LoadSecurity(Curve(other.path()), proto::ROLE_MASTER).value());
  ASSERT_TRUE(foreign.ok());
  EXPECT_FALSE(foreign->Verify(7, seven));
}

TEST(WorkerCredentials, NeedTheMastersKey) {
  TempDir dir;
  ASSERT_TRUE(WriteJobKeys(dir.path()).ok());
  EXPECT_EQ(WorkerCredentials::ForMaster(LoadSecurity(Curve(dir.path()), proto::ROLE_WORKER).value())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const StatusOr<WorkerCredentials> short_key = WorkerCredentials::FromKey("abc");
  EXPECT_EQ(short_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_key.status().message(), HasSubstr("not 3"));
}

// A server-role process serving RESTORE, PULL and GET_CLUSTER_MAP (the
// handler only counts), and clients of every role, all with one job's keys.
class CurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(WriteJobKeys(keys_.path()).ok());
    server_factory_ = Factory(keys_.path(), proto::ROLE_SERVER);
    StatusOr<std::unique_ptr<RpcServer>> server =
        RpcServer::Start(server_factory_.get(), RpcServerOptions{.authorize = AuthorizeCall},
                         [this](Message&, Message*) {
                           handled_.fetch_add(1);
                           return absl::OkStatus();
                         });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  static std::unique_ptr<SocketFactory> Factory(const std::string& keys, proto::Role role) {
    TransportOptions options;
    options.security = LoadSecurity(Curve(keys), role).value();
    return std::make_unique<SocketFactory>(options);
  }

  static CallOptions Once(absl::Duration timeout = absl::Seconds(5)) {
    CallOptions options;
    options.attempt_timeout = timeout;
    options.max_attempts = 1;
    return options;
  }

  static Message Request(proto::Method method) {
    Message request;
    request.header().set_method(method);
    return request;
  }

  // The credentials the job's master issues.
  WorkerCredentials Credentials() const {
    return WorkerCredentials::ForMaster(LoadSecurity(Curve(keys_.path()), proto::ROLE_MASTER).value())
        .value();
  }

  TempDir keys_;
  std::unique_ptr<SocketFactory> server_factory_;
  std::unique_ptr<RpcServer> server_;
  std::atomic<int> handled_{0};
};

TEST_F(CurveTest, EachRoleGetsWhatItMayCall) {
  auto master = Factory(keys_.path(), proto::ROLE_MASTER);
  auto worker = Factory(keys_.path(), proto::ROLE_WORKER);
  RpcChannel as_master(master.get(), Node(proto::ROLE_MASTER, 0));
  server_->SetWorkerCredentials(Credentials());
  proto::NodeId three = Node(proto::ROLE_WORKER, 3);
  three.set_credential(Credentials().Issue(3));
  RpcChannel as_worker(worker.get(), three);
  EXPECT_TRUE(as_master.Call(server_->endpoint(), Request(proto::RESTORE), Once()).ok());
  EXPECT_TRUE(as_worker.Call(server_->endpoint(), Request(proto::PULL), Once()).ok());
  const StatusOr<Message> restore =
      as_worker.Call(server_->endpoint(), Request(proto::RESTORE), Once());
  EXPECT_EQ(restore.status().code(), absl::StatusCode::kPermissionDenied) << restore.status();
  EXPECT_EQ(handled_.load(), 2);
  EXPECT_EQ(server_->refused(), 1u);
}

TEST_F(CurveTest, AnEnvelopeCannotClaimAnotherRole) {
  auto worker = Factory(keys_.path(), proto::ROLE_WORKER);
  // The worker's key, the master's name.
  RpcChannel liar(worker.get(), Node(proto::ROLE_MASTER, 0));
  const StatusOr<Message> restore = liar.Call(server_->endpoint(), Request(proto::RESTORE), Once());
  EXPECT_EQ(restore.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(restore.status().message(), HasSubstr("its key is the worker's"));
  EXPECT_EQ(handled_.load(), 0);
  EXPECT_EQ(server_->refused(), 1u);
}

TEST_F(CurveTest, AForeignKeyIsRefusedAtTheHandshake) {
  TempDir other;
  ASSERT_TRUE(WriteJobKeys(other.path()).ok());
  // Another job's worker key, with this job's server key (public keys are
  // not secret): the handshake completes only if ZAP admits the key.
  TransportOptions options;
  options.security = LoadSecurity(Curve(other.path()), proto::ROLE_WORKER).value();
  options.security.server_key = server_factory_->options().security.server_key;
  SocketFactory outsider(options);
  RpcChannel channel(&outsider, Node(proto::ROLE_MASTER, 0));
  const StatusOr<Message> restore =
      channel.Call(server_->endpoint(), Request(proto::RESTORE), Once(absl::Milliseconds(500)));
  EXPECT_EQ(restore.status().code(), absl::StatusCode::kDeadlineExceeded) << restore.status();
  EXPECT_EQ(handled_.load(), 0);
  EXPECT_GE(server_factory_->handshakes_refused(), 1u);
}

TEST_F(CurveTest, APlainPeerGetsNothing) {
  SocketFactory plain;
  RpcChannel channel(&plain, Node(proto::ROLE_MASTER, 0));
  const StatusOr<Message> restore =
      channel.Call(server_->endpoint(), Request(proto::RESTORE), Once(absl::Milliseconds(500)));
  EXPECT_EQ(restore.status().code(), absl::StatusCode::kDeadlineExceeded) << restore.status();
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(CurveTest, AWorkerActsOnlyAsTheIdItsCredentialProves) {
  auto worker = Factory(keys_.path(), proto::ROLE_WORKER);
  proto::NodeId three = Node(proto::ROLE_WORKER, 3);
  RpcChannel unproven(worker.get(), three);
  // Until the server has the credentials' key it cannot tell: not ready,
  // which callers retry, and no refusal.
  const StatusOr<Message> early = unproven.Call(server_->endpoint(), Request(proto::PULL), Once());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable) << early.status();
  const WorkerCredentials credentials = Credentials();
  server_->SetWorkerCredentials(credentials);

  const StatusOr<Message> bare = unproven.Call(server_->endpoint(), Request(proto::PULL), Once());
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kPermissionDenied) << bare.status();
  EXPECT_THAT(bare.status().message(), HasSubstr("worker 3 but carries no credential"));
  // Worker 4's credential does not make its holder worker 3.
  three.set_credential(credentials.Issue(4));
  RpcChannel impostor(worker.get(), three);
  const StatusOr<Message> stolen = impostor.Call(server_->endpoint(), Request(proto::PULL), Once());
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  EXPECT_THAT(stolen.status().message(), HasSubstr("another's credential"));
  EXPECT_EQ(handled_.load(), 0);
  EXPECT_EQ(server_->refused(), 2u);

  three.set_credential(credentials.Issue(3));
  RpcChannel proven(worker.get(), three);
  EXPECT_TRUE(proven.Call(server_->endpoint(), Request(proto::PULL), Once()).ok());
  // The cluster map is the same for any worker: no credential needed.
  EXPECT_TRUE(unproven.Call(server_->endpoint(), Request(proto::GET_CLUSTER_MAP), Once()).ok());
  EXPECT_EQ(handled_.load(), 2);
}

// A server's request to another (FETCH_PARTITION) carries its slot's
// credential: the server key alone acts as no slot, and a worker's
// credential is no server's.
TEST_F(CurveTest, AServerActsOnlyAsTheSlotItsCredentialProves) {
  auto server_key = Factory(keys_.path(), proto::ROLE_SERVER);
  const WorkerCredentials credentials = Credentials();
  server_->SetWorkerCredentials(credentials);
  proto::NodeId one = Node(proto::ROLE_SERVER, 1);
  RpcChannel bare(server_key.get(), one);
  const StatusOr<Message> refused =
      bare.Call(server_->endpoint(), Request(proto::FETCH_PARTITION), Once());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("ps[1] but carries no credential"));
  for (const std::string& wrong : {credentials.Issue(1), credentials.ServerCredential(2)}) {
    one.set_credential(wrong);
    RpcChannel impostor(server_key.get(), one);
    EXPECT_EQ(impostor.Call(server_->endpoint(), Request(proto::FETCH_PARTITION), Once())
                  .status()
                  .code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(handled_.load(), 0);
  EXPECT_EQ(server_->refused(), 3u);
  one.set_credential(credentials.ServerCredential(1));
  RpcChannel proven(server_key.get(), one);
  EXPECT_TRUE(proven.Call(server_->endpoint(), Request(proto::FETCH_PARTITION), Once()).ok());
  EXPECT_EQ(handled_.load(), 1);
}

TEST(Unauthenticated, TheEnvelopesRoleStillDecides) {
  SocketFactory factory;
  std::atomic<int> handled{0};
  StatusOr<std::unique_ptr<RpcServer>> server =
      RpcServer::Start(&factory, RpcServerOptions{.authorize = AuthorizeCall},
                       [&handled](Message&, Message*) {
        handled.fetch_add(1);
        return absl::OkStatus();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  CallOptions once;
  once.max_attempts = 1;
  RpcChannel tool(&factory, Node(proto::ROLE_TOOL, 1));
  RpcChannel master(&factory, Node(proto::ROLE_MASTER, 0));
  Message restore;
  restore.header().set_method(proto::RESTORE);
  EXPECT_EQ(tool.Call((*server)->endpoint(), std::move(restore), once).status().code(),
            absl::StatusCode::kPermissionDenied);
  Message again;
  again.header().set_method(proto::RESTORE);
  EXPECT_TRUE(master.Call((*server)->endpoint(), std::move(again), once).ok());
  // A method this build does not know is unimplemented, not a refusal.
  Message unknown;
  unknown.header().set_method(static_cast<proto::Method>(99));
  EXPECT_EQ(master.Call((*server)->endpoint(), std::move(unknown), once).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(handled.load(), 1);
  EXPECT_EQ((*server)->refused(), 1u);
}

}  // namespace
}  // namespace eps
