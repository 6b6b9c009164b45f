// Security: which peers an eps process talks to, proven by ZeroMQ CURVE.
//
// A job's keys, made by `eps-keygen --out DIR` (WriteJobKeys):
//   DIR/public_keys   one "ROLE Z85" line per role (master, server, worker,
//                     tool): the public keys every process of the job trusts;
//   DIR/ROLE.key      that role's key pair, "public Z85" and "secret Z85"
//                     lines, mode 0600;
//   DIR/http_token    the bearer token of the master's mutating HTTP
//                     endpoints, mode 0600.
// A process loads the public keys and its own role's pair (LoadSecurity);
// a machine that runs only workers needs public_keys and worker.key.
//
// With CURVE on, every socket from the SocketFactory encrypts, and every
// serving socket admits only peers whose public key public_keys lists, and
// knows their role from it (ZapAuthenticator, a ZAP handler); RpcServer then
// refuses a request whose envelope claims another role, or whose method
// that role may not call (the authorizer it was given: cluster/call_table.h's
// AuthorizeCall), with PERMISSION_DENIED.
//
// Thread-safety: SecurityOptions is a value; ZapAuthenticator is safe for
// concurrent use of its counters.

#ifndef EPS_RPC_SECURITY_H_
#define EPS_RPC_SECURITY_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/job_config.h"
#include "core/status.h"
#include "proto/eps.pb.h"
#include "zmq.hpp"

namespace eps {

// "master", "server", "worker", "tool"; "unknown" for anything else.
const char* RoleName(proto::Role role);
std::optional<proto::Role> RoleFromName(absl::string_view name);

struct SecurityOptions {
  // Whether sockets use CURVE. Off: plain TCP, and a request's role is the
  // one its envelope claims (which anyone can write).
  bool curve = false;
  // Whose key pair this process holds (public_key, secret_key: Z85, 40
  // characters each).
  proto::Role role = proto::ROLE_UNSPECIFIED;
  std::string public_key;
  std::string secret_key;
  // The public keys of the roles that serve, which clients must know.
  std::string master_key;
  std::string server_key;
  // Every public key the job trusts, with its role.
  std::vector<std::pair<std::string, proto::Role>> trusted;
  // The bearer token of the master's mutating HTTP endpoints
  // (security.http_token_file, under curve KEYS_DIR/http_token by default);
  // empty: they need none (mode off without a token file).
  std::string http_token;

  // The role whose public key is `z85`, if the job trusts it.
  std::optional<proto::Role> RoleOf(absl::string_view z85) const;
};

// The [security] of a process of `role`: mode "curve" loads the keys from
// keys_dir; "off" loads nothing and logs a warning that the process is
// unauthenticated (at every start). kInvalidArgument naming security.mode
// or security.keys_dir, or the file and line that is wrong, with what to do
// (run eps-keygen, or set security.mode = off explicitly).
StatusOr<SecurityOptions> LoadSecurity(const JobConfig::Security& config, proto::Role role);

// Makes a job's keys in `dir` (created if missing): the files above.
// kAlreadyExists when dir already holds keys (a job's keys are not replaced
// by accident); kUnavailable when a file cannot be written.
Status WriteJobKeys(const std::string& dir);

// 32 random bytes in hex: a launch's secret, a token.
std::string NewSecret();
// Whether two secrets are equal, in time that does not depend on where
// they differ.
bool SameSecret(absl::string_view a, absl::string_view b);

// The role a method is served by: the master (methods 1-31) or a parameter
// server (32-63).
proto::Role ServingRole(proto::Method method);

// Proves that a worker's request comes from the worker the master
// registered under that id: the master issues each worker a credential (an
// HMAC of its id under a key derived from the master's secret key, so a
// restarted master issues and accepts the same), the worker stamps it on
// every request (NodeId.credential), and the master and the servers (which
// get the key when they register) check it. A worker key thereby acts only
// as the workers it registered; under security.mode = off there are none.
// A server slot has a credential too (ServerCredential, in another domain):
// the master gives it to the process it admits to the slot, which sends it
// with its requests and keeps it in its data dir (docs/security.md, "Who
// may be a server"). The servers hold the key as well, so an admitted
// server is trusted as any server; a holder of the server key alone is not.
class WorkerCredentials {
 public:
  // The credentials of the job whose master holds `security` (its own
  // secret key). kInvalidArgument unless it is the master's, under curve.
  static StatusOr<WorkerCredentials> ForMaster(const SecurityOptions& security);
  // From the key a server received from the master (`key()`).
  // kInvalidArgument for a key of the wrong length.
  static StatusOr<WorkerCredentials> FromKey(absl::string_view key);

  // Worker `id`'s credential.
  std::string Issue(uint32_t id) const;
  // Whether `credential` is worker `id`'s (in constant time).
  bool Verify(uint32_t id, absl::string_view credential) const;
  // Server slot `slot`'s credential, and whether `credential` is it.
  std::string ServerCredential(uint32_t slot) const;
  bool VerifyServer(uint32_t slot, absl::string_view credential) const;
  // A server's receipt that worker `id`'s push of `batch` was applied
  // (PushReply.receipt): an HMAC of both under the same key, in another
  // domain than credentials, so only the servers and the master can make
  // one. Every server makes the same receipt for the same push.
  std::string Receipt(uint32_t id, const proto::WorkBatch& batch) const;
  // Whether `tag` is Receipt(id, batch) (in constant time).
  bool VerifyReceipt(uint32_t id, const proto::WorkBatch& batch, absl::string_view tag) const;
  // The checking key, for the servers (secret: only over CURVE).
  const std::string& key() const { return key_; }

 private:
  explicit WorkerCredentials(std::string key) : key_(std::move(key)) {}
  // HMAC-SHA512-256 of `message` under key_: credentials, slot credentials
  // and receipts, each in a domain of its own.
  std::string Tag(absl::string_view message) const;
  std::string key_;
};

// The ZAP handler of one ZeroMQ context: answers the CURVE handshakes of
// every serving socket, admitting the keys `security` trusts, with the
// peer's role name as its ZAP user id (what a received message's
// "User-Id" property then says). A refused key is logged once per address.
class ZapAuthenticator {
 public:
  // Binds inproc://zeromq.zap.01 in `context` and starts answering.
  // kUnavailable when the context has no socket left or another handler is
  // bound there.
  static StatusOr<std::unique_ptr<ZapAuthenticator>> Start(zmq::context_t& context,
                                                           const SecurityOptions& security);
  ~ZapAuthenticator();  // stops and joins
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  // Handshakes refused (a key the job does not trust).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  explicit ZapAuthenticator(const SecurityOptions& security) : security_(security) {}
  void Loop(zmq::socket_t socket);

  const SecurityOptions security_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace eps

#endif  // EPS_RPC_SECURITY_H_
