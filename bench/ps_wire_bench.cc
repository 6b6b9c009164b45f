// ps_wire_bench: eps's wire between one worker and one parameter server,
// through the real client (worker/ps_client) and server (ps/param_server)
// over loopback TCP, with CURVE off and on, against the loopback limit
// measured in the same run (a plain TCP stream of as many bytes).
//
//   build/bench/ps_wire_bench [--reps=N] [--keys=N] [--modes=off,curve]
//                             [--request_mb=N]
//
// The server runs in this process with its own threads and sockets, behind
// a stand-in master that registers it, hands it a job of two embedding
// tables (dim 16 and dim 64) and a cluster map giving it every partition.
// Each figure is the median of --reps timed calls after one untimed call
// (which creates the rows): a pull of --keys keys x 16 floats, a push of as
// many gradients, the same for a tenth as many keys x 64 floats, and a
// 1-key pull (median of 200). Bytes counted: the keys sent and the floats
// returned (a pull) or sent (a push); GB/s is those bytes over the time.
// The share of the loopback limit is the stream's time for those bytes
// over the call's. --request_mb caps each request the client sends (and so
// each reply) at N MiB: the client's default is 4.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/call_table.h"
#include "core/logging.h"
#include "ps/param_server.h"
#include "rpc/message.h"
#include "rpc/rpc_server.h"
#include "rpc/security.h"
#include "rpc/socket_factory.h"
#include "worker/ps_client.h"

namespace eps {
namespace {

constexpr uint32_t kPartitions = 64;
constexpr uint32_t kNarrow = 0;  // dim 16
constexpr uint32_t kWide = 1;    // dim 64

proto::JobSpec BenchJob() {
  proto::JobSpec job;
  job.set_name("ps-wire-bench");
  job.set_num_partitions(kPartitions);
  for (uint32_t id : {kNarrow, kWide}) {
    proto::TableSpec* table = job.add_tables();
    table->set_id(id);
    table->set_name(id == kNarrow ? "narrow" : "wide");
    table->set_kind(proto::EMBEDDING);
    table->set_dim(id == kNarrow ? 16 : 64);
    table->mutable_initializer()->set_kind(proto::InitializerSpec::ZEROS);
    table->mutable_optimizer()->set_kind(proto::OptimizerSpec::SGD);
    table->mutable_optimizer()->set_learning_rate(0.01f);
  }
  return job;
}

// Stands in for the master: registers the one server, answers its
// heartbeats and gives it every partition.
class StandInMaster {
 public:
  static StatusOr<std::unique_ptr<StandInMaster>> Start(SocketFactory* factory,
                                                        std::string credential_key) {
    auto master = std::unique_ptr<StandInMaster>(new StandInMaster(std::move(credential_key)));
    RpcServerOptions options;
    options.name = "stand-in master";
    options.authorize = AuthorizeCall;
    ASSIGN_OR_RETURN(master->rpc_,
                     RpcServer::Start(factory, options, [m = master.get()](Message& r, Message* a) {
                       return m->Handle(r, a);
                     }));
    if (!master->credential_key_.empty()) {
      // As the master: the server's heartbeats carry its slot's credential.
      ASSIGN_OR_RETURN(WorkerCredentials credentials,
                       WorkerCredentials::FromKey(master->credential_key_));
      master->rpc_->SetWorkerCredentials(std::move(credentials));
    }
    return master;
  }
  const std::string& endpoint() const { return rpc_->endpoint(); }
  // The map once the server registered (its endpoint).
  proto::ClusterMap Map() const {
    proto::ClusterMap map;
    map.set_version(1);
    map.set_num_partitions(kPartitions);
    proto::ServerInfo* server = map.add_servers();
    server->set_id(0);
    server->set_endpoint(server_endpoint_);
    for (uint32_t p = 0; p < kPartitions; ++p) map.add_partition_owner(0);
    return map;
  }
  ~StandInMaster() { rpc_->Stop(); }

 private:
  explicit StandInMaster(std::string credential_key) : credential_key_(std::move(credential_key)) {}
  Status Handle(Message& request, Message* reply) {
    switch (request.header().method()) {
      case proto::REGISTER_SERVER: {
        server_endpoint_ = request.header().register_server_request().endpoint();
        proto::RegisterServerReply* body = reply->header().mutable_register_server_reply();
        body->set_server_id(0);
        *body->mutable_job() = BenchJob();
        body->set_worker_credential_key(credential_key_);
        if (!credential_key_.empty()) {
          // The slot's credential, as the master issues it.
          ASSIGN_OR_RETURN(WorkerCredentials credentials,
                           WorkerCredentials::FromKey(credential_key_));
          body->set_slot_credential(credentials.ServerCredential(0));
        }
        return absl::OkStatus();
      }
      case proto::HEARTBEAT: {
        proto::HeartbeatReply* body = reply->header().mutable_heartbeat_reply();
        body->set_state(proto::JOB_RUNNING);
        body->set_cluster_map_version(1);
        return absl::OkStatus();
      }
      case proto::GET_CLUSTER_MAP:
        *reply->header().mutable_get_cluster_map_reply()->mutable_map() = Map();
        return absl::OkStatus();
      default:
        return absl::UnimplementedError("a stand-in master");
    }
  }

  const std::string credential_key_;
  // Written by the one RPC thread before the server's first heartbeat.
  std::string server_endpoint_;
  std::unique_ptr<RpcServer> rpc_;
};

// Seconds to move `bytes` through a loopback TCP connection in 1 MiB
// writes: the limit the wire is held to.
double LoopbackSeconds(uint64_t bytes) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  CHECK(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  CHECK(listen(listener, 1) == 0);
  CHECK(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  std::thread reader([listener, bytes] {
    const int connection = accept(listener, nullptr, nullptr);
    std::vector<char> buffer(1 << 20);
    uint64_t read_total = 0;
    while (read_total < bytes) {
      const ssize_t n = read(connection, buffer.data(), buffer.size());
      if (n <= 0) break;
      read_total += static_cast<uint64_t>(n);
    }
    close(connection);
  });
  const int writer = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(connect(writer, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  std::vector<char> buffer(1 << 20, 'x');
  const absl::Time start = absl::Now();
  uint64_t written = 0;
  while (written < bytes) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), bytes - written));
    const ssize_t sent = write(writer, buffer.data(), n);
    CHECK(sent > 0);
    written += static_cast<uint64_t>(sent);
  }
  close(writer);
  reader.join();
  close(listener);
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Row {
  std::string mode, op;
  uint64_t keys = 0;
  uint32_t dim = 0;
  double seconds = 0;
  uint64_t bytes = 0;
};

// Times `reps` pulls and pushes of `n` keys of `table` (one untimed pull
// first, which creates the rows).
Status TimeTable(PsClient& client, const std::string& mode, uint32_t table, uint32_t dim,
                 uint64_t n, int reps, std::vector<Row>* rows) {
  std::mt19937_64 random(table * 7919 + n);
  std::vector<uint64_t> keys(n);
  for (uint64_t& key : keys) key = random();
  const std::vector<PsClient::Keys> tables = {{table, keys}};
  std::vector<std::vector<float>> out;
  RETURN_IF_ERROR(client.Pull(tables, &out));
  std::vector<double> pulls, pushes;
  const std::vector<float> grads(n * dim, 0.001f);
  const std::vector<std::span<const float>> gradients = {grads};
  for (int rep = 0; rep < reps; ++rep) {
    absl::Time start = absl::Now();
    RETURN_IF_ERROR(client.Pull(tables, &out));
    pulls.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    start = absl::Now();
    RETURN_IF_ERROR(client.Push(tables, gradients));
    pushes.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const uint64_t bytes = n * sizeof(uint64_t) + n * dim * sizeof(float);
  rows->push_back(Row{mode, "pull", n, dim, Median(pulls), bytes});
  rows->push_back(Row{mode, "push", n, dim, Median(pushes), bytes});
  return absl::OkStatus();
}

Status RunMode(const std::string& mode, uint64_t keys, int reps, size_t request_bytes,
               std::vector<Row>* rows) {
  if (mode != "off" && mode != "curve") {
    return absl::InvalidArgumentError(absl::StrCat("unknown mode '", mode, "' (off or curve)"));
  }
  const bool curve = mode == "curve";
  const std::string dir = absl::StrCat("/tmp/eps-wire-bench-", getpid(), "-", mode);
  // The job's secret keys go with the run, whatever ends it.
  absl::Cleanup remove_keys = [&dir] {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  };
  SecurityOptions master_security, server_security, worker_security;
  std::string credential_key;
  std::string credential;
  if (curve) {
    RETURN_IF_ERROR(WriteJobKeys(dir));
    JobConfig::Security config;
    config.mode = "curve";
    config.keys_dir = dir;
    ASSIGN_OR_RETURN(master_security, LoadSecurity(config, proto::ROLE_MASTER));
    ASSIGN_OR_RETURN(server_security, LoadSecurity(config, proto::ROLE_SERVER));
    ASSIGN_OR_RETURN(worker_security, LoadSecurity(config, proto::ROLE_WORKER));
    ASSIGN_OR_RETURN(const WorkerCredentials credentials,
                     WorkerCredentials::ForMaster(master_security));
    credential_key = credentials.key();
    credential = credentials.Issue(1);
  }
  SocketFactory master_factory(TransportOptions{.security = master_security});
  ASSIGN_OR_RETURN(std::unique_ptr<StandInMaster> master,
                   StandInMaster::Start(&master_factory, credential_key));
  ParamServerOptions server_options;
  server_options.master = master->endpoint();
  server_options.host = "127.0.0.1";
  server_options.threads = 2;
  server_options.heartbeat = absl::Milliseconds(200);
  server_options.security = server_security;
  ParamServer server(server_options);
  RETURN_IF_ERROR(server.Start());
  // The server serves once its first heartbeat brought it the map.
  absl::SleepFor(absl::Milliseconds(500));

  SocketFactory worker_factory(TransportOptions{.security = worker_security});
  proto::NodeId self;
  self.set_role(proto::ROLE_WORKER);
  self.set_id(1);
  self.set_credential(credential);
  CallOptions call;
  call.attempt_timeout = absl::Seconds(60);
  call.max_attempts = 1;
  PsClient client(&worker_factory, self, BenchJob(), call,
                  [&master]() -> StatusOr<proto::ClusterMap> { return master->Map(); },
                  request_bytes);
  RETURN_IF_ERROR(client.SetClusterMap(master->Map()));

  RETURN_IF_ERROR(TimeTable(client, mode, kNarrow, 16, keys, reps, rows));
  RETURN_IF_ERROR(TimeTable(client, mode, kWide, 64, keys / 10, reps, rows));
  // The round trip of one key.
  const std::vector<uint64_t> one = {42};
  const std::vector<PsClient::Keys> tables = {{kNarrow, one}};
  std::vector<std::vector<float>> out;
  std::vector<double> trips;
  for (int i = 0; i < 200; ++i) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(client.Pull(tables, &out));
    trips.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  rows->push_back(Row{mode, "1-key pull", 1, 16, Median(trips), 8 + 64});
  server.RequestStop();
  return server.Wait();
}

}  // namespace
}  // namespace eps

int main(int argc, char** argv) {
  int64_t reps = 3;
  int64_t keys = 1'000'000;
  std::string modes = "off,curve";
  int64_t request_mb = 4;
  for (int i = 1; i < argc; ++i) {
    const std::vector<std::string> flag = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    const bool ok = flag.size() == 2 &&
                    ((flag[0] == "--reps" && absl::SimpleAtoi(flag[1], &reps) && reps > 0) ||
                     (flag[0] == "--keys" && absl::SimpleAtoi(flag[1], &keys) && keys >= 10) ||
                     (flag[0] == "--modes" && (modes = flag[1], true)) ||
                     (flag[0] == "--request_mb" && absl::SimpleAtoi(flag[1], &request_mb) &&
                      request_mb >= 1 && request_mb <= 48));
    if (!ok) {
      std::cerr << "usage: ps_wire_bench [--reps=N] [--keys=N] [--modes=off,curve] "
                   "[--request_mb=1..48] (bad: "
                << argv[i] << ")\n";
      return 2;
    }
  }
  std::vector<eps::Row> rows;
  for (const std::string& mode : std::vector<std::string>(absl::StrSplit(modes, ','))) {
    if (eps::Status run = eps::RunMode(mode, static_cast<uint64_t>(keys), static_cast<int>(reps),
                                       static_cast<size_t>(request_mb) << 20, &rows);
        !run.ok()) {
      std::cerr << "ps_wire_bench: " << mode << ": " << run.message() << "\n";
      return 1;
    }
  }
  std::printf("%-6s %-11s %9s %4s %10s %12s %8s %16s\n", "mode", "call", "keys", "dim", "ms",
              "keys/s", "GB/s", "of loopback");
  for (const eps::Row& row : rows) {
    const double loopback = eps::LoopbackSeconds(std::max<uint64_t>(row.bytes, 1 << 20)) *
                            static_cast<double>(row.bytes) /
                            static_cast<double>(std::max<uint64_t>(row.bytes, 1 << 20));
    // A round trip of one key is latency, not bandwidth: no share.
    const std::string share =
        row.keys > 1 ? absl::StrFormat("%.1f%%", 100.0 * loopback / row.seconds) : "-";
    std::printf("%-6s %-11s %9llu %4u %10.3f %12.0f %8.3f %16s\n", row.mode.c_str(),
                row.op.c_str(), static_cast<unsigned long long>(row.keys), row.dim,
                row.seconds * 1e3, static_cast<double>(row.keys) / row.seconds,
                static_cast<double>(row.bytes) / row.seconds / 1e9, share.c_str());
  }
  return 0;
}
