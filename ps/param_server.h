// ParamServer: one parameter server process's service.
//
// Registers with the master, receives the job's table specs, serves PULL
// and PUSH for the partitions the cluster map gives it (answering
// WRONG_OWNER for others), heartbeats its stats, and exits when the master
// says the job is over.
//
// Who may call what is the RpcServer's to decide, with the job's call table
// (cluster/call_table.h): CHECKPOINT, RESTORE and FENCE_WORKERS come from
// the master only, PULL and PUSH from workers; others get
// kPermissionDenied.
//
// Fencing: the master sends FENCE_WORKERS with every worker whose lease expired. The
// server remembers them for its lifetime (worker ids are never reused, so
// the set only grows and a repeated list changes nothing) and from then on
// refuses every PULL and PUSH a fenced worker sends with
// kFailedPrecondition/FENCED, before touching any table and before the
// cluster map matters: FENCE_WORKERS is served even before the server has
// its map. A push that was already being applied when the fence arrived
// still lands; one that reaches its deduplication step after the fence
// does not. Refused pushes are counted in ServerStats.pushes_fenced.
//
// Retried pushes: a PUSH from a worker carries PushRequest.client_seq; after
// validation and the fence check the server applies it only the first time
// it sees that (worker, client_seq) (ps/push_deduplicator.h) and answers
// PushReply.applied = true; a repeat (a retry whose first delivery was
// applied) is acknowledged with applied = false, applied nothing, and is
// counted in ServerStats.pushes_deduplicated. A repeat may be acknowledged
// while its first delivery is still being applied. client_seq 0, and pushes
// from senders that are not workers, are applied every time.
//
// Identity: a server with a data dir records the id the master gives it in
// DATA_DIR/SERVER and, restarted on that dir, asks for it again
// (RegisterServerRequest.stored_server_id); it takes whatever id the master
// answers and records that. A running server whose heartbeat the master
// refuses (it was cut off past its lease) registers again with `rejoin`,
// as the same slot at the same endpoint.
//
// Storage failures: once the store or a checkpoint cannot be written
// (ServerStorage::write_error, e.g. a full disk), every heartbeat says so
// (HeartbeatRequest.storage_error) and the master stops the job.
//
// Checkpoints: CHECKPOINT writes checkpoint N of this
// server (ServerStorage::Checkpoint: under checkpoint.dir/ps-<id>/N when the
// job sets checkpoint.dir, else DATA_DIR/checkpoints/N) and answers its
// absolute path; CheckpointRequest.keep_ids, when given, says which older
// ones to keep.
//
// Restore: RESTORE (kInvalidArgument without a body or a path) replaces
// every parameter by the checkpoint at RestoreRequest.path
// (ServerStorage::Restore). It needs no cluster map, but answers
// kUnavailable/NOT_READY until Start has made the tables, and
// kFailedPrecondition without a data dir. The pulls, pushes and checkpoints
// in progress finish first; those arriving meanwhile wait until it is done,
// then see only the checkpoint's values. The push deduplication state is
// forgotten (pushes applied before are undone, so a retry of one is applied
// again); the fence set stays. kNotFound/kDataLoss for a missing or broken
// checkpoint, naming it, with nothing changed (deduplication state included). Restoring the same
// checkpoint again gives the same state. Should the store not reopen after
// a failed restore, the server stops: Wait returns that error.
//
// Model health: a pushed row whose update would make a weight or an
// optimizer state non-finite keeps its values (ps/optimizer.h); the push
// is still acknowledged, and the row is counted in
// ServerStats.updates_refused (a warning is logged on the first and then
// rarely).
//
// Thread-safety: safe for concurrent use; request handlers run on
// `threads` threads. Start/Wait/RequestStop from the owning thread
// (RequestStop also from a signal-watching thread).

#ifndef EPS_PS_PARAM_SERVER_H_
#define EPS_PS_PARAM_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "cluster/launch_grant.h"
#include "core/job_config.h"
#include "core/status.h"
#include "ps/storage.h"
#include "rpc/security.h"

namespace eps {

struct ParamServerOptions {
  // The master, "tcp://HOST:PORT". Required.
  std::string master;
  // Port to serve on; 0 picks a free one. Default 0.
  int64_t port = 0;
  // Address to bind and advertise; empty means the local address that
  // faces the master. Default empty.
  std::string host;
  // Rows, store and checkpoints (StorageOptions.data_dir is the server's
  // --data-dir; empty keeps everything in memory).
  StorageOptions storage;
  // Request-handling threads. Default 2.
  int threads = 2;
  // Rows one worker may create per second (RowQuota); 0: unlimited.
  // Default 0 (ps.max_new_rows_per_worker_s has its own default).
  uint64_t max_new_rows_per_worker_s = 0;
  // Rows all workers together may create per second; 0: unlimited.
  // Default 0 (ps.max_new_rows_s has its own default).
  uint64_t max_new_rows_s = 0;
  // Heartbeat interval. Default 1 s.
  absl::Duration heartbeat = absl::Seconds(1);
  // How long the master may stay unreachable (at startup or later) before
  // the server gives up. Default 30 s.
  absl::Duration master_wait = absl::Seconds(30);
  // How long a server asked to leave (RequestLeave) waits for the master to
  // drain it before it exits anyway. Default 10 min.
  absl::Duration leave_timeout = absl::Minutes(10);
  // Time per attempt of a call to the master. Default 5 s.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Interval of progress lines in the log. Default 10 s.
  absl::Duration progress_interval = absl::Seconds(10);
  // The job options every process must share (JobConfig::SharedOptions),
  // sent at registration: the master refuses the server when they differ
  // from its own. Default none.
  std::vector<std::pair<std::string, std::string>> shared_options;
  // CURVE and the job's keys, from [security] (LoadSecurity); off when
  // default-made (in-process tests).
  SecurityOptions security;
  // What admits this server to a running job in a new slot under CURVE
  // (cluster/launch_grant.h; eps-server reads it from its environment).
  // Default none: the server may fill the job's first slots, take a dead
  // server's, or its own back from its --data-dir.
  LaunchGrant grant;

  // The job's [ps], [master] and [worker] settings.
  static ParamServerOptions FromConfig(const JobConfig& config);
  Status Validate() const;
};

class ParamServer {
 public:
  explicit ParamServer(const ParamServerOptions& options);
  ~ParamServer();
  ParamServer(const ParamServer&) = delete;
  ParamServer& operator=(const ParamServer&) = delete;

  // Binds, registers with the master (retrying for master_wait) and starts
  // serving. kUnavailable/kDeadlineExceeded when the master cannot be
  // reached, kFailedPrecondition when it refuses the server,
  // kInvalidArgument when its job's tables are unusable.
  Status Start();

  // Blocks until the master says the job is over (OK), RequestStop (OK),
  // the master is lost for master_wait (kUnavailable), the master gave this
  // server's slot to another process (kFailedPrecondition), or a failed
  // restore left no database to serve from (that error). When the master
  // refuses a heartbeat (this server was cut off past its lease), Wait
  // registers again as the same slot (RegisterServerRequest.rejoin) and
  // goes on if the master lets it; the recovery that the lost lease
  // started then restores it. Without a successful Start,
  // kFailedPrecondition at once.
  Status Wait();

  void RequestStop();
  // SIGTERM: asks the master to drain this server (docs/design.md 2.20).
  // It serves on until the master has moved its partitions to the other
  // servers and tells it to go (Wait returns OK), or leave_timeout has
  // passed (kDeadlineExceeded). When the master cannot drain it (the job
  // is not training, this is its last server, the master is unreachable),
  // or when asked a second time, it stops at once, as RequestStop does:
  // the master then counts it as lost. Safe from any thread.
  void RequestLeave();

  // Valid after Start.
  const std::string& endpoint() const;
  uint32_t id() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace eps

#endif  // EPS_PS_PARAM_SERVER_H_
