// ServerCalls: the master's one fan-out to its servers: FENCE_WORKERS,
// CHECKPOINT, RESTORE and EXPORT, and a partition move's steps. A call
// goes to every server at once and the replies are awaited together; the
// wait watches the servers meanwhile, so a call to a server that dies (or
// is replaced) is given up instead of waiting out its timeout.
//
// Thread-safety: one thread only (it owns its ZeroMQ sockets); it takes no
// lock itself, so the caller must not hold the master's mutex.

#ifndef EPS_MASTER_SERVER_CALLS_H_
#define EPS_MASTER_SERVER_CALLS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/clock.h"
#include "core/status.h"
#include "master/membership.h"
#include "master/recovery.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"

namespace eps {

class ServerCalls {
 public:
  // Asked every 20 ms while replies are outstanding: false when the
  // server's call no longer matters (it died or was replaced).
  using Serving = std::function<bool(const ServerAddress&)>;

  // `factory` and `clock` are not owned and must outlive this.
  ServerCalls(SocketFactory* factory, const Clock* clock);

  // Sends the fence list to every server of `round`. Returns the servers
  // that did not acknowledge it (none: every one did, or the round has no
  // server); the caller tries again later.
  std::vector<ServerAddress> SendFences(const Membership::FenceRound& round,
                                        absl::Duration timeout);
  // Has every server write checkpoint `id`, keeping `keep` besides it. One
  // result per server: its part, or the error naming it.
  std::vector<StatusOr<proto::ServerCheckpoint>> WriteCheckpoint(
      uint64_t id, const std::vector<uint64_t>& keep, const std::vector<ServerAddress>& servers,
      const Serving& serving);
  // Has every target restore checkpoint `id` (its path); checkpoint 0 of
  // a warm-started job loads `init_from` (with the optimizer state when
  // `init_state`). One result per target: the bytes restored (or, with
  // init_from, the rows loaded), or the error.
  std::vector<StatusOr<uint64_t>> Restore(uint64_t id,
                                          const std::vector<Recovery::RestoreTarget>& targets,
                                          const Serving& serving,
                                          const std::string& init_from = "",
                                          bool init_state = true);
  // Has every server write its rows into the model export in `dir`, first
  // deleting the rows that expired with `passes_done` passes when given.
  // One result per server: its reply, or the error naming it.
  // Sends one step of a partition move to `server` (docs/design.md 2.20).
  StatusOr<proto::MovePartitionReply> MovePartition(const ServerAddress& server,
                                                    const proto::MovePartitionRequest& step,
                                                    const Serving& serving);
  // `map_version` is the master's cluster map: each server exports the
  // partitions it gives it (a server behind it waits for it).
  std::vector<StatusOr<proto::ExportReply>> Export(
      const std::string& dir, const std::vector<ServerAddress>& servers, const Serving& serving,
      uint64_t map_version, std::optional<uint32_t> passes_done = std::nullopt);

 private:
  std::vector<StatusOr<Message>> CallAll(const std::vector<ServerAddress>& servers,
                                         const std::function<Message(size_t)>& make,
                                         absl::Duration timeout, const Serving& serving);

  const Clock* const clock_;
  RpcChannel channel_;
};

}  // namespace eps

#endif  // EPS_MASTER_SERVER_CALLS_H_
