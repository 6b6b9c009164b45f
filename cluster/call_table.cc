#include "cluster/call_table.h"

#include "absl/strings/str_cat.h"
#include "rpc/security.h"

namespace eps {

Status AuthorizeCall(proto::Method method, proto::Role caller) {
  bool allowed = false;
  const char* who = "";
  switch (method) {
    case proto::REGISTER_SERVER:
      allowed = caller == proto::ROLE_SERVER;
      who = "servers";
      break;
    case proto::HEARTBEAT:
    case proto::DEREGISTER:  // a server: drain me (SIGTERM)
      allowed = caller == proto::ROLE_SERVER || caller == proto::ROLE_WORKER;
      who = "servers and workers";
      break;
    case proto::GET_CLUSTER_MAP:
      allowed = caller != proto::ROLE_UNSPECIFIED;
      who = "members of the job";
      break;
    case proto::REGISTER_WORKER:
    case proto::GET_SHARD:
    case proto::COMMIT_PROGRESS:
    case proto::SPLIT_SHARD:
    case proto::SHARD_UNREADABLE:
    case proto::PUSH:
      allowed = caller == proto::ROLE_WORKER;
      who = "workers";
      break;
    case proto::PULL:
      // The master reads to check evaluations (master/trust/eval_check.h).
      allowed = caller == proto::ROLE_WORKER || caller == proto::ROLE_MASTER;
      who = "workers and the master";
      break;
    case proto::FENCE_WORKERS:
    case proto::CHECKPOINT:
    case proto::RESTORE:
    case proto::EXPORT:
    case proto::MOVE_PARTITION:
      allowed = caller == proto::ROLE_MASTER;
      who = "the master";
      break;
    case proto::FETCH_PARTITION:
      // The one call a server makes to another: a moving partition's rows.
      allowed = caller == proto::ROLE_SERVER;
      who = "parameter servers";
      break;
    default:
      // Unknown to this build: no role may call it.
      return absl::UnimplementedError(absl::StrCat("unknown method ", static_cast<int>(method)));
  }
  if (allowed) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(proto::Method_Name(method), " is for ", who, ", not for ",
                   caller == proto::ROLE_UNSPECIFIED ? "a peer of no role"
                                                     : absl::StrCat("a ", RoleName(caller))));
}

}  // namespace eps
