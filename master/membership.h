// Membership: who is in the job. Workers (a fresh id per registration),
// server slots (a slot is a server id; a restarted or replacement server
// takes a slot back), leases, the fence list and how far the servers have
// acknowledged it, the cluster map, and the membership generation (raised
// by every change).
//
//   worker:  kAlive --lease expired--> kDead
//              |  \--DEREGISTER-----> kLeft
//              \----recovery--------> kFenced   (it registers again)
//   server:  kAlive --lease expired or restarted--> kDead --slot filled--> kAlive
//              \--drained, RetireServer--> retired (the slot is gone; LeftServer)
//                                           \--RetiredServerMayGo--> told to exit
//
// A retired server's process keeps answering WRONG_OWNER until no live
// worker's heartbeat says a cluster map older than the one that retired it
// (NoteWorkerMap), or for one worker lease at most: a worker in a long
// step then follows the map, never a server that has gone.
//
// A fenced worker id is never accepted again (ids are never reused); its
// shards may move only once every live server refuses its pushes too, so
// Fence() queues it and FencesAcknowledged() says when that is.
//
// Time is passed in; the unit holds no lock, reads no clock, does no I/O
// (events are queued on the sink).
//
// Thread-safety: not thread-safe; the master guards it with its mutex.

#ifndef EPS_MASTER_MEMBERSHIP_H_
#define EPS_MASTER_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/status.h"
#include "core/token_bucket.h"
#include "master/event_log.h"
#include "proto/eps.pb.h"

namespace eps {

// kFenced: a live worker sent away by a server recovery (it registers again).
enum class PeerState { kAlive, kDead, kLeft, kFenced };
const char* PeerStateName(PeerState state);

struct WorkerEntry {
  std::string host;
  uint32_t pid = 0;
  std::string device;
  PeerState state = PeerState::kAlive;
  absl::Time last_seen;
  absl::Time joined;
  uint64_t records = 0;         // committed by this worker, counted by the master
  uint64_t records_pushed = 0;  // as the worker reports it
  double records_per_s = 0;
  bool told_to_exit = false;
  uint64_t paused_for = 0;  // the checkpoint it reports having paused for
  // The cluster map version every call it starts goes by, as its last
  // heartbeat said (0: not said yet).
  uint64_t map_version = 0;
  // Its last heartbeat paused for the checkpoint round in progress: the
  // round held it back until then, which is no lack of progress of its own.
  absl::Time held_until = absl::InfinitePast();
  // When it last made progress: took a shard, or had a commit applied.
  absl::Time last_progress;
  // The autoscaler's launch id (0: started by hand).
  uint64_t launch_id = 0;
  // Fenced by the master while alive (it held a shard and made no
  // progress): the autoscaler replaces the process.
  bool fenced_alive = false;
  // Why the master fenced it while alive (what its later calls are told).
  std::string fenced_why;
  // As last reported; kept once the worker is gone (/metrics).
  proto::WorkerStats stats;
  // The last HeartbeatRequest.seq applied (0: none numbered yet).
  uint64_t heartbeat_seq = 0;
};

struct ServerEntry {
  std::string endpoint;
  std::string host;
  uint32_t pid = 0;
  PeerState state = PeerState::kAlive;
  absl::Time last_seen;
  proto::ServerStats stats;
  bool told_to_exit = false;
  // Heard from by this master (a restored entry is not, until it heartbeats).
  bool seen = false;
  // What the process drew at its start (RegisterServerRequest.instance):
  // a retried registration must carry the same.
  std::string instance;
  // Since when it has failed to acknowledge the fence list (InfiniteFuture
  // while it acknowledges).
  absl::Time fences_failing_since = absl::InfiniteFuture();
  // The last HeartbeatRequest.seq applied (0: none numbered yet).
  uint64_t heartbeat_seq = 0;
};

// A server slot and the endpoint a call to it goes to.
using ServerAddress = std::pair<uint32_t, std::string>;

class Membership {
 public:
  // `events` is not owned and must outlive the unit.
  Membership(const JobConfig& job, EventSink* events);

  // --- Registration -------------------------------------------------------

  struct Claim {
    uint32_t slot = 0;
    // A registration retried by the process already in the slot: answer
    // the same, change nothing.
    bool retried = false;
    // The slot's previous process was alive (a new process on its data
    // dir): it is dead now, and what it held since its last checkpoint is
    // lost (the caller starts a recovery).
    bool restarted = false;
    // A server joining the placed job in a new slot, past the ones it
    // started with (docs/design.md 2.20): it holds no partition yet.
    bool joined = false;
  };
  // Finds the slot a registering server takes: the one a registration of
  // the same process (endpoint, pid and instance) was answered, its own
  // (stored_server_id),
  // the next one while the job is placed, a dead one, or once every slot
  // is alive a new one (a join; at most one slot per partition). A rejoining
  // process (request.rejoin: it lost its lease, it is not a new process)
  // takes its slot back only while the slot is still its own (the same
  // endpoint and pid), alive or dead.
  //   kFailedPrecondition: a stored slot this job does not have, every
  //     slot taken by a live server, or a rejoining server whose slot
  //     another process took.
  StatusOr<Claim> ClaimSlot(const proto::RegisterServerRequest& request);
  // Puts the registering server in `slot` (after ClaimSlot). Returns true
  // when it replaces an earlier process of the slot: the slot's endpoint
  // changes in the cluster map (a new version) and the fence list must be
  // sent to it again.
  bool AdmitServer(uint32_t slot, const proto::RegisterServerRequest& request, absl::Time now);

  // Whether a worker may register now (then AdmitWorker): refused with
  // reason SLOW_DOWN (it waits and asks again) while master.max_workers
  // (JobConfig::MaxWorkers) workers are alive, or past the registration
  // rate: a bucket of max_workers registrations refilled at an eighth of
  // that (at least 8) a second, so that a whole fleet may start at once but
  // no holder of the worker key can churn ids. Takes a registration.
  Status TakeRegistration(absl::Time now);
  // A new worker id.
  uint32_t AdmitWorker(const proto::RegisterWorkerRequest& request, absl::Time now);

  // The worker `sender` names, if registered and alive: every call of a
  // worker the master accepts goes through here, and renews its lease
  // (last_seen = now). FENCED otherwise (kFailedPrecondition), saying why
  // the master fenced it, or `fenced_why` (when not empty) why a recovery
  // did. kInvalidArgument when the sender is no worker.
  StatusOr<const WorkerEntry*> LiveWorker(const proto::NodeId& sender,
                                          const std::string& fenced_why, absl::Time now);
  // A live worker's heartbeat (LiveWorker's errors; the lease renewed):
  // keeps its `stats` (bounded by the caller: master/trust/peer_stats.h) and the
  // checkpoint it `paused_for`; while `round` is in progress and it paused
  // for it, the round holds it back (held_until). Each batch-size change
  // it reports for the first time is the event batch_size_changed. A
  // heartbeat numbered `seq` (HeartbeatRequest.seq) at or below the last
  // one applied for this registration changes nothing (it is OK).
  Status WorkerHeartbeat(const proto::NodeId& sender, const std::string& fenced_why,
                         proto::WorkerStats stats, uint64_t paused_for,
                         std::optional<uint64_t> round, absl::Time now, uint64_t seq = 0);
  // Worker `id` says it routes by cluster map `version` or newer from now
  // on (a heartbeat's envelope). Never lowers it; no-op for an unknown id.
  void NoteWorkerMap(uint32_t id, uint64_t version);
  // Worker `id` made progress at `now`: it took a shard, or had a commit
  // of `records` records applied. No-op for an unknown id.
  void NoteProgress(uint32_t id, absl::Time now, uint64_t records = 0);
  // The job's end reached `peer` (a worker or a server): it exits.
  void ToldToExit(const proto::NodeId& peer);

  // A server's heartbeat: renews its lease. FENCED (kFailedPrecondition)
  // when the slot is not alive, or `endpoint` (when given) is not the
  // slot's current process. Sets *first_contact when this master had not
  // heard from the server yet. A stale `seq`, as WorkerHeartbeat's.
  Status ServerHeartbeat(uint32_t slot, const std::string& endpoint,
                         const proto::ServerStats& stats, absl::Time now, bool* first_contact,
                         uint64_t seq = 0);
  const ServerEntry* server(uint32_t slot) const;
  // The slot has a live server.
  bool ServerAlive(uint32_t slot) const {
    const ServerEntry* entry = server(slot);
    return entry != nullptr && entry->state == PeerState::kAlive;
  }
  // The worker registered as `id` in any state, or null.
  const WorkerEntry* worker(uint32_t id) const;

  // --- Leases -------------------------------------------------------------

  struct Expired {
    // Workers whose lease ran out (now kDead), with the records each pushed
    // but never committed (they are trained again by others).
    std::vector<std::pair<uint32_t, uint64_t>> workers;
    // Slots whose server's lease ran out (now kDead). Before placement the
    // slot is simply freed for another server and not listed.
    std::vector<uint32_t> servers;
  };
  // Also forgets the oldest gone workers beyond kGoneWorkersKept (they stay
  // fenced; /status and /metrics show the newest).
  Expired ExpireLeases(absl::Time now);
  // Gone (dead, left, fenced) workers kept for /status and /metrics: a job
  // with workers coming and going for days must not grow with them.
  static constexpr size_t kGoneWorkersKept = 64;
  // Marks the live server in `slot` dead for `why` (logged, event
  // server_dead). Before placement the slot is freed instead (another
  // server may take it) and false is returned; true once placed: the
  // caller starts a recovery.
  bool LoseServer(uint32_t slot, const std::string& why, absl::Time now);

  // --- Fencing ------------------------------------------------------------

  // Adds `worker` to the fence list; its shards wait for FencesAcknowledged.
  void Fence(uint32_t worker, absl::Time now, const std::string& why);
  // Fences every live worker as kFenced (a recovery, which their later
  // calls are told of; or, with `tell_why`, `why`). Returns the records
  // they pushed but never committed, summed.
  uint64_t FenceAllAlive(absl::Time now, const std::string& why, bool tell_why = false);
  // Fences one live worker as kFenced (it registers again); its shards
  // wait for FencesAcknowledged. Returns the records it pushed but never
  // committed. No-op (0) unless it is alive.
  uint64_t FenceAlive(uint32_t worker, absl::Time now, const std::string& why);
  // A worker leaving (DEREGISTER): kLeft and fenced at once; its shards may
  // move now (it committed what it pushed). False when it was not alive.
  // kNotFound for an unknown worker.
  StatusOr<bool> Leave(uint32_t worker);
  // Every worker id ever fenced, sorted.
  const std::vector<uint32_t>& fenced() const { return fenced_; }
  bool IsFenced(uint32_t worker) const;

  struct FenceRound {
    std::vector<uint32_t> fenced;         // the whole list
    std::vector<ServerAddress> servers;   // every live server
    // Server admissions when the round was taken: a server admitted since
    // (a slot refilled, even on the same endpoint) was not sent the round.
    uint64_t admissions = 0;
  };
  // The fence list to send, when some server may not have it yet.
  std::optional<FenceRound> PendingFences() const;
  // Every server in `round` acknowledged `round.fenced`. Returns the fenced
  // workers that were waiting for it, with when each was last seen. A round
  // taken before a server was admitted counts for nothing (that server has
  // not heard it): the next round goes to it too.
  std::vector<std::pair<uint32_t, absl::Time>> FencesAcknowledged(const FenceRound& round);
  // Some servers of `round` did not acknowledge it (`refused`, the others
  // did). Returns the refusing servers that have failed to acknowledge the
  // fence list for longer than `patience` (a server that cannot fence is
  // not serving: the caller loses it).
  std::vector<uint32_t> FencesRefused(const FenceRound& round,
                                      const std::vector<ServerAddress>& refused,
                                      absl::Duration patience, absl::Time now);
  // Some fence is not acknowledged by every live server yet.
  bool fencing() const;
  // Some fenced worker's shards wait for its fence to reach every server.
  bool awaiting_fences() const { return !awaiting_fence_.empty(); }

  // --- Placement ----------------------------------------------------------

  // Places the partitions when ps.num_servers servers have registered
  // (cluster map version 1). True when it did.
  bool MaybePlace(uint32_t num_partitions);
  bool placed() const { return cluster_map_.version() != 0; }
  bool all_servers_alive() const;
  // Members alive now.
  size_t alive_servers() const;
  size_t alive_workers() const;
  // Slots without a live server this master has heard from.
  std::vector<uint32_t> MissingServers() const;
  std::vector<ServerAddress> LiveServers() const;
  // The slot's server is alive at `endpoint` (a call to it still matters).
  bool Serving(const ServerAddress& server) const;
  const proto::ClusterMap& cluster_map() const { return cluster_map_; }
  // A partition move (docs/design.md 2.20). The move of `partition` is in
  // progress (persisted: a restarted master gives it up), or none is.
  void SetMoving(std::optional<uint32_t> partition) { moving_ = partition; }
  // Gives `partition` to `slot`: the next map version. Ends the move.
  void MovePartition(uint32_t partition, uint32_t slot);
  // A map like this one with the next version: ends a move given up on the
  // servers (whatever it did, the old owner keeps the partition).
  void RaiseMapVersion();
  // A restore of checkpoint `map` into `restored` slots: each partition a
  // restored slot owns now goes back to its owner in `map` (the rows it
  // has there are the checkpoint's). A new version when any changed.
  void RestoreOwners(const proto::ClusterMap& map, const std::vector<uint32_t>& restored);
  // Partitions each slot owns (0 for a slot without any).
  std::map<uint32_t, uint32_t> PartitionCounts() const;
  // A drained server leaves the job (docs/design.md 2.20): its slot goes
  // from the map (a new version), from checkpoints, recoveries and the
  // slots a fresh server may take, and its process is told to exit when it
  // heartbeats (LeftServer) and RetiredServerMayGo. Event server_left.
  // REQUIRES: the slot exists and owns no partition.
  void RetireServer(uint32_t slot, absl::Time now);
  // The endpoint the server that left `slot` served at, or null.
  const std::string* LeftServer(uint32_t slot) const;
  // Whether the process of retired `slot` may exit at `now`: no live
  // worker says a map older than the one that retired it, or one worker
  // lease (master.lease_ms) has passed since (a live worker heartbeats in
  // that time). Until then it redirects those workers' calls.
  // REQUIRES: LeftServer(slot).
  bool RetiredServerMayGo(uint32_t slot, absl::Time now) const;

  // --- Lifecycle ----------------------------------------------------------

  // True when every live peer has been told to exit.
  bool EveryoneTold() const;
  void Bump() { ++generation_; }

  const std::map<uint32_t, WorkerEntry>& workers() const { return workers_; }
  const std::map<uint32_t, ServerEntry>& servers() const { return servers_; }
  // The membership generation; `membership_epoch` on the wire, in the
  // stored MasterRecord and in /status.
  uint64_t generation() const { return generation_; }
  uint32_t next_worker_id() const { return next_worker_id_; }

  // The fields of MasterRecord this unit owns.
  void SaveTo(proto::MasterRecord* record) const;
  // A restarted master: the saved slots (given a fresh lease: servers keep
  // running while the master is away), ids, fence list and map.
  void RestoreFrom(const proto::MasterRecord& record, absl::Time now);

 private:
  // LiveWorker without renewing the lease.
  StatusOr<WorkerEntry*> Live(const proto::NodeId& sender, const std::string& fenced_why);
  void AddToFenceList(uint32_t worker);
  void ForgetOldWorkers();

  const JobConfig& job_;
  EventSink* const events_;
  std::map<uint32_t, WorkerEntry> workers_;
  std::map<uint32_t, ServerEntry> servers_;
  uint32_t next_worker_id_ = 0;
  // See TakeRegistration.
  TokenBucket registrations_;
  uint32_t next_server_id_ = 0;
  proto::ClusterMap cluster_map_;
  std::optional<uint32_t> moving_;
  // Retired slots (RetireServer): the last endpoint, the map version that
  // retired it, and when.
  struct Retired {
    std::string endpoint;
    uint64_t map_version = 0;
    absl::Time at;
  };
  std::map<uint32_t, Retired> left_;
  uint64_t generation_ = 0;
  std::vector<uint32_t> fenced_;
  // Fenced workers whose shards wait until every server refuses them, with
  // when each was last seen.
  std::map<uint32_t, absl::Time> awaiting_fence_;
  // Size of fenced_ every live server has acknowledged.
  size_t fences_acknowledged_ = 0;
  // Servers admitted so far (see FenceRound::admissions).
  uint64_t admissions_ = 0;
};

}  // namespace eps

#endif  // EPS_MASTER_MEMBERSHIP_H_
