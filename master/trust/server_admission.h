// ServerAdmission: who may hold a server slot under CURVE (docs/security.md,
// "Who may be a server"). The server key lets a process speak to the
// master as a server; it does not make it one. A registration is judged by
// what it claims:
//
//   slot N, from its --data-dir or taking   needs N's credential: the master
//   N back after a lost lease               gave it to the process it admitted
//                                           to N (DATA_DIR/SERVER_CREDENTIAL)
//   a new slot in the placed job (a join)   needs a launch grant: the server
//                                           autoscaler's launch id and that
//                                           launch's secret, or the job's
//                                           HTTP token (an operator's act)
//   one of the job's first slots, or a      the server key alone: the job's
//   dead slot's place, from a fresh dir     start, and the replacement of a
//                                           lost machine
//
// Once admitted, a server sends its slot's credential with every request
// (rpc/rpc_server.h checks it), so the server key alone can neither
// heartbeat, drain nor fetch partitions as a server of the job.
//
// Pure: no clock, no I/O, no lock; the launch verifier it is given may
// take the server autoscaler's lock.
//
// Thread-safety: const methods only; the verifier must be safe to call.

#ifndef EPS_MASTER_TRUST_SERVER_ADMISSION_H_
#define EPS_MASTER_TRUST_SERVER_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "core/status.h"
#include "proto/eps.pb.h"
#include "rpc/security.h"

namespace eps {

class ServerAdmission {
 public:
  // Whether `secret` is the secret of the server autoscaler's launch `id`.
  using LaunchVerifier = std::function<bool(uint64_t id, absl::string_view secret)>;

  // Admits anyone (security off): no check, no credentials.
  ServerAdmission() = default;
  // Under CURVE. `credentials` is not owned and must outlive the unit;
  // `http_token` is the job's (empty: no operator may admit a join).
  ServerAdmission(const WorkerCredentials* credentials, std::string http_token)
      : credentials_(credentials), http_token_(std::move(http_token)) {}

  // The server autoscaler's launches, once it runs (unset: none verifies).
  void VerifyLaunchesWith(LaunchVerifier verifier) { verify_launch_ = std::move(verifier); }

  // A claim on a slot (stored_server_id or rejoin): kPermissionDenied
  // without the slot's credential, naming the slot and what to do.
  Status CheckClaim(const proto::RegisterServerRequest& request) const;
  // A join (a new slot in the placed job): kPermissionDenied without a
  // launch grant, saying how an operator admits one.
  Status CheckJoin(const proto::RegisterServerRequest& request) const;
  // Slot `slot`'s credential for the reply; empty when security is off.
  std::string Credential(uint32_t slot) const;

 private:
  const WorkerCredentials* credentials_ = nullptr;
  std::string http_token_;
  LaunchVerifier verify_launch_;
};

}  // namespace eps

#endif  // EPS_MASTER_TRUST_SERVER_ADMISSION_H_
