// Tests cluster/call_table.h: each method is open to the roles the
// protocol gives it and to no other.

#include "cluster/call_table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/eps.pb.h"
#include "rpc/security.h"

namespace eps {
namespace {

using ::testing::HasSubstr;

TEST(AuthorizeCall, FollowsTheRoles) {
  const proto::Role master = proto::ROLE_MASTER;
  const proto::Role server = proto::ROLE_SERVER;
  const proto::Role worker = proto::ROLE_WORKER;
  const proto::Role tool = proto::ROLE_TOOL;
  for (proto::Method method :
       {proto::RESTORE, proto::FENCE_WORKERS, proto::CHECKPOINT, proto::EXPORT,
        proto::MOVE_PARTITION}) {
    EXPECT_TRUE(AuthorizeCall(method, master).ok());
    for (proto::Role other : {server, worker, tool, proto::ROLE_UNSPECIFIED}) {
      EXPECT_EQ(AuthorizeCall(method, other).code(), absl::StatusCode::kPermissionDenied)
          << proto::Method_Name(method) << " from " << RoleName(other);
    }
  }
  EXPECT_TRUE(AuthorizeCall(proto::REGISTER_SERVER, server).ok());
  EXPECT_FALSE(AuthorizeCall(proto::REGISTER_SERVER, worker).ok());
  EXPECT_FALSE(AuthorizeCall(proto::REGISTER_SERVER, tool).ok());
  for (proto::Method method : {proto::REGISTER_WORKER, proto::GET_SHARD, proto::COMMIT_PROGRESS,
                               proto::SPLIT_SHARD, proto::SHARD_UNREADABLE, proto::PULL,
                               proto::PUSH}) {
    EXPECT_TRUE(AuthorizeCall(method, worker).ok());
    EXPECT_FALSE(AuthorizeCall(method, tool).ok()) << proto::Method_Name(method);
    EXPECT_FALSE(AuthorizeCall(method, server).ok()) << proto::Method_Name(method);
  }
  // The master reads the model to check evaluations; it never writes it.
  EXPECT_TRUE(AuthorizeCall(proto::PULL, master).ok());
  EXPECT_FALSE(AuthorizeCall(proto::PUSH, master).ok());
  EXPECT_TRUE(AuthorizeCall(proto::HEARTBEAT, server).ok());
  // A moving partition's rows go from server to server, and nowhere else.
  EXPECT_TRUE(AuthorizeCall(proto::FETCH_PARTITION, server).ok());
  for (proto::Role other : {master, worker, tool, proto::ROLE_UNSPECIFIED}) {
    EXPECT_EQ(AuthorizeCall(proto::FETCH_PARTITION, other).code(),
              absl::StatusCode::kPermissionDenied)
        << RoleName(other);
  }
  EXPECT_TRUE(AuthorizeCall(proto::DEREGISTER, worker).ok());
  EXPECT_FALSE(AuthorizeCall(proto::DEREGISTER, tool).ok());
  EXPECT_TRUE(AuthorizeCall(proto::DEREGISTER, server).ok()) << "a server asks to be drained";
  EXPECT_TRUE(AuthorizeCall(proto::GET_CLUSTER_MAP, tool).ok());
  EXPECT_FALSE(AuthorizeCall(proto::GET_CLUSTER_MAP, proto::ROLE_UNSPECIFIED).ok());
  EXPECT_EQ(AuthorizeCall(proto::METHOD_UNSPECIFIED, master).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_THAT(AuthorizeCall(proto::RESTORE, worker).message(), HasSubstr("the master"));
}

}  // namespace
}  // namespace eps
