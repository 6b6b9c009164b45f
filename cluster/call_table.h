// The job's call table: which role may call which method. The transport
// authenticates a peer's role (rpc/security.h) and asks its server's
// authorizer (RpcServerOptions.authorize) whether that role may make the
// call; the master and the parameter servers pass AuthorizeCall.
//
// Thread-safety: a pure function.

#ifndef EPS_CLUSTER_CALL_TABLE_H_
#define EPS_CLUSTER_CALL_TABLE_H_

#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

// Whether a peer of `caller`'s role may call `method`: RESTORE,
// FENCE_WORKERS, CHECKPOINT and EXPORT only the master; REGISTER_SERVER
// only a server; the data and training methods only workers (PULL the
// master too, to check evaluations); tools only read the cluster map.
// PERMISSION_DENIED saying who may; UNIMPLEMENTED for a method this build
// does not know.
Status AuthorizeCall(proto::Method method, proto::Role caller);

}  // namespace eps

#endif  // EPS_CLUSTER_CALL_TABLE_H_
