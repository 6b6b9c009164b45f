// ParamServer::Impl: the server's dispatch and serving (param_server.cc),
// its session with the master, registration and rejoin
// (param_server_session.cc), and its storage handlers: CHECKPOINT, EXPORT
// and RESTORE (param_server_storage.cc). What passes from workers (fences,
// pushes applied once, receipts) is its WorkerGate. Private to ps/.

#ifndef EPS_PS_PARAM_SERVER_IMPL_H_
#define EPS_PS_PARAM_SERVER_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "cluster/member_session.h"
#include "cluster/placement.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "core/status.h"
#include "ps/global_batch.h"
#include "ps/param_server.h"
#include "ps/row_quota.h"
#include "ps/storage.h"
#include "ps/table.h"
#include "ps/worker_gate.h"
#include "rpc/message.h"
#include "rpc/rpc_server.h"
#include "rpc/security.h"
#include "rpc/socket_factory.h"

namespace eps {

class ParamServer::Impl {
 public:
  explicit Impl(const ParamServerOptions& options)
      : options_(options) {}
  ~Impl() {
    RequestStop();
    if (session_) session_->Stop();
    if (rpc_) rpc_->Stop();
  }

  Status Start();
  Status Wait();
  void RequestStop() { Stop(absl::OkStatus()); }
  void RequestLeave() {
    absl::MutexLock lock(&mu_);
    leave_requested_ = true;
  }
  const std::string& endpoint() const { return endpoint_; }
  uint32_t id() const { return id_; }

 private:
  // Ends Wait with `result` (the first non-OK one given wins).
  void Stop(const Status& result) ABSL_LOCKS_EXCLUDED(mu_);
  Status Handle(Message& request, Message* reply);
  // A worker's quota of rows created (ps.max_new_rows_per_worker_s):
  // whether it may create rows now (counting a refusal), and what it did.
  Status AdmitRows(const proto::NodeId& sender);
  void ChargeRows(const proto::NodeId& sender, uint64_t created);
  Status HandlePull(const Message& request, Message* reply)
      ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  Status HandlePush(const Message& request, Message* reply)
      ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // A push's reply_rows: the pushed keys' rows of each table, as frames.
  Status ReplyRows(std::span<Table* const> tables,
                   std::span<const std::span<const uint64_t>> keys, bool dense_bf16,
                   Message* reply) ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // Adds the rows of `keys` as a frame of the reply: float32, or bfloat16
  // for a DENSE table when `dense_bf16`. `created` as Table::Pull's.
  static Status AddRows(Table& table, std::span<const uint64_t> keys, bool dense_bf16,
                        Message* reply, uint64_t* created);
  Status HandleFenceWorkers(const Message& request, Message* reply);
  // Writes this server's rows into a model export (from the master).
  Status HandleExport(const Message& request, Message* reply) ABSL_LOCKS_EXCLUDED(restore_mu_);
  // Writes checkpoint N (from the master or an operator's tool).
  Status HandleCheckpoint(const Message& request, Message* reply)
      ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // Replaces every parameter by a checkpoint (from the master or a tool).
  Status HandleRestore(const Message& request, Message* reply) ABSL_LOCKS_EXCLUDED(restore_mu_);
  // Waits (up to rpc_timeout, asking for a heartbeat now) until this
  // server has cluster map `want` or a newer one; NOT_READY past that. OK
  // at once for 0.
  Status AwaitMapVersion(uint64_t want) ABSL_LOCKS_EXCLUDED(mu_);
  // Partition moves (param_server_moves.cc; docs/design.md 2.20): the
  // master's steps, and the pages this server serves the new owner.
  Status HandleMovePartition(const Message& request, Message* reply)
      ABSL_LOCKS_EXCLUDED(restore_mu_);
  Status HandleFetchPartition(const Message& request, Message* reply)
      ABSL_LOCKS_EXCLUDED(restore_mu_);
  // OK when `sender` is the server the master named as the new owner of
  // its move of `body`'s partition at `body`'s map version
  // (HeartbeatReply.moves_out), waiting (up to rpc_timeout) for two
  // heartbeat replies when none names it yet: the master starts a move
  // before the new owner asks. kPermissionDenied otherwise, counted in
  // fetches_refused_ (ServerStats.requests_refused); nothing registered.
  Status CheckFetcher(const proto::NodeId& sender, const proto::FetchPartitionRequest& body)
      ABSL_LOCKS_EXCLUDED(mu_);
  // FETCH_PARTITION of a copy's catch-up round or of its tail: a page of
  // the rows of the keys pushed to during the copy (the proto says which).
  Status ServeNotedRows(const proto::FetchPartitionRequest& body, size_t max_rows,
                        proto::FetchPartitionReply* answer, Message* reply)
      ABSL_LOCKS_EXCLUDED(restore_mu_, moves_mu_);
  // COPY and TAIL: reads the partition's pages (or its tail) from the old
  // owner and writes them here; the rows and bytes, and in *fetching the
  // time spent waiting for the old owner's pages.
  StatusOr<proto::MovePartitionReply> FetchFromOldOwner(const proto::MovePartitionRequest& move,
                                                        bool tail, absl::Duration* fetching);
  // Notes the keys of a push that belong to a partition being copied
  // away, before the push applies them (a cheap check while none is).
  void NoteMovingKeys(std::span<Table* const> tables,
                      std::span<const std::span<const uint64_t>> keys)
      ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // Publishes outgoing_'s partitions not handed off yet to noting_.
  void PublishNoting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(moves_mu_);
  // FENCED when `sender` is a fenced worker (counting a refused push).
  Status CheckNotFenced(const proto::NodeId& sender, proto::Method method);
  // The table `table_id` if known; kInvalidArgument otherwise.
  StatusOr<Table*> FindTable(uint32_t table_id) ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // kFailedPrecondition/WRONG_OWNER unless this server owns every key (not
  // checked without `ownership`); kInvalidArgument for a dense key outside
  // its tensor.
  Status CheckKeys(const Table& table, std::span<const uint64_t> keys, bool ownership = true);
  // The version counter of `table` (one that only a dense tensor moves).
  std::atomic<uint64_t>& DenseVersion(const Table& table) {
    return dense_versions_[table.spec().id()];
  }

  // A dense table's global batch (TableSpec.global_batch; ps/global_batch.h).
  struct DenseBatch {
    explicit DenseBatch(const GlobalBatch::Options& options) : batch(options) {}
    absl::Mutex mu;
    GlobalBatch batch ABSL_GUARDED_BY(mu);
  };
  // `table`'s, or null for a table that steps at every push.
  DenseBatch* GlobalBatchOf(const Table& table) {
    return global_batches_.empty() ? nullptr : global_batches_[table.spec().id()].get();
  }
  // Adds a push to `table`'s global batch and, once it holds the batch,
  // applies its step (Table::Push) and raises the table's version to it.
  // `worker`'s reservation on it ends (none: not a worker's push).
  Status AddToGlobalBatch(Table& table, DenseBatch& batch, std::span<const uint64_t> keys,
                          std::span<const float> grads, uint32_t records, uint64_t based_on,
                          std::optional<uint64_t> worker) ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // A worker reads the versions being filled of `tables`' global batches
  // (those without one are skipped): each gives it a reservation, all or
  // none (GlobalBatch::MayRead, Hold), after applying a step a reservation
  // that expired let through. kUnavailable with reason BATCH_FULL when one
  // is full (`holds_elsewhere`, PullRequest.holds_reservations: up to twice
  // the batch). True when one was reserved; false for a sender that is not
  // a worker or tables without a global batch.
  // (Locks a varying set of mutexes: not for the static analysis.)
  StatusOr<bool> ReserveGlobalBatches(const proto::NodeId& sender,
                                      std::span<Table* const> tables, bool holds_elsewhere)
      ABSL_SHARED_LOCKS_REQUIRED(restore_mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Applies the part every global batch holds, as one step each: before a
  // checkpoint (which so holds no sum) and a hand-off (so the partition's
  // rows leave with every push they took).
  Status FlushGlobalBatches() ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // Applies `batch`'s step (its mutex held) and publishes its version.
  Status ApplyGlobalStep(Table& table, DenseBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch.mu)
      ABSL_SHARED_LOCKS_REQUIRED(restore_mu_);
  // Forgets what every global batch holds (a restore: the pushes it summed
  // are gone with the rest).
  void ResetGlobalBatches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(restore_mu_);

  // Registration with the master: a session, the REGISTER_SERVER request
  // (`rejoin`: this process taking its slot back after its lease ran out),
  // and starting its heartbeats.
  std::unique_ptr<MemberSession> NewSession();
  Message RegisterRequest(bool rejoin) const;
  // Under CURVE: takes the key of workers' credentials from the master's
  // answer, so that the RPC server checks them (kFailedPrecondition when
  // the answer has none or a bad one).
  Status CheckWorkerCredentials(const proto::RegisterServerReply& reply);
  // This server as the sender of its requests: its slot and, under CURVE,
  // the slot's credential.
  proto::NodeId Self() const;
  void StartHeartbeats();
  // The master refused a heartbeat (FENCED, `why`): registers again as the
  // same slot. An error when the master gave the slot to another process
  // (or is gone): the server stops with it.
  Status Rejoin(const Status& why);
  // RequestLeave, on Wait's thread: asks the master to drain this server
  // (DEREGISTER), or stops it when the master cannot or it was asked before.
  // `again`: the periodic repeat while it waits (only a refusal stops it).
  void Leave(bool again = false);
  // One DEREGISTER to the master (a few short attempts).
  Status AskToLeave();
  // The member session's hooks, on its heartbeat thread.
  MemberSession::Hooks SessionHooks();
  void OnHeartbeatReply(const proto::HeartbeatReply& body);
  Status RefreshClusterMap();
  proto::ServerStats Stats() const;

  const ParamServerOptions options_;
  SocketFactory factory_{TransportOptions{.security = options_.security}};
  // Made by Start and replaced by Rejoin (Wait's thread, once the old one
  // stopped; both write it under mu_, which request threads read it
  // under); heartbeats from the end of a successful Start until Wait
  // returns.
  std::unique_ptr<MemberSession> session_;
  // Heartbeat thread only: the storage's write error was logged.
  bool write_error_reported_ = false;
  // Wait's thread: this process registered again (Rejoin) at least once;
  // and whether a heartbeat was answered since the last registration.
  bool rejoined_ = false;
  std::atomic<bool> answered_{false};
  bool started_ = false;  // Start succeeded
  std::unique_ptr<RpcServer> rpc_;
  std::string endpoint_;
  uint32_t id_ = 0;
  // Under CURVE, the credential of slot id_ (RegisterServerReply.
  // slot_credential). id_ and credential_ are set by Start before any
  // thread that reads them starts, and never change.
  std::string credential_;
  // Drawn at construction: what tells this process's retried registration
  // (RegisterServerRequest.instance).
  const std::string instance_ = NewSecret();
  proto::JobSpec job_;
  // Set before the port is bound; internally synchronised, but its tables
  // are replaced by a restore: Table* are used only under restore_mu_.
  std::unique_ptr<ServerStorage> storage_;
  // Progress lines: heartbeat thread only.
  absl::Time last_progress_;
  uint64_t rows_pulled_before_ = 0;
  uint64_t rows_pushed_before_ = 0;
  std::atomic<uint64_t> pulls_{0};
  std::atomic<uint64_t> pushes_{0};
  std::atomic<uint64_t> rows_pulled_{0};
  std::atomic<uint64_t> rows_pushed_{0};
  std::atomic<uint64_t> pushes_fenced_{0};
  std::atomic<uint64_t> pushes_deduplicated_{0};
  RowQuota row_quota_{options_.max_new_rows_per_worker_s, Clock::Real(), options_.max_new_rows_s};
  std::atomic<uint64_t> rows_limited_{0};  // requests refused by row_quota_
  // Time from a PULL's or PUSH's arrival in Handle to its reply.
  LatencyHistogram pull_latency_;
  LatencyHistogram push_latency_;
  // Per table id: pushes applied to a dense tensor's chunks here (its
  // version; not kept across restarts: a worker's copy and its versions
  // live only as long as its session, which a restart ends). Sized once the
  // job is known, before any table exists. And the staleness pushes had.
  std::vector<std::atomic<uint64_t>> dense_versions_;
  CountHistogram dense_staleness_;
  // Per table id: the global batch of a dense table that has one, else
  // null; made with dense_versions_ (empty before). A table's version is
  // then its global steps. Not kept across restarts, as the versions.
  std::vector<std::unique_ptr<DenseBatch>> global_batches_;

  // Held shared by every PULL, PUSH and CHECKPOINT from validation to
  // reply, exclusively by a RESTORE: tables are swapped only while no
  // request uses them, and requests arriving meanwhile wait. Taken before
  // the gate's locks and mu_.
  absl::Mutex restore_mu_;

  // The fence list, the pushes applied and their receipts (a restore
  // forgets the pushes, under restore_mu_).
  WorkerGate gate_;

  // A partition being copied away (docs/design.md 2.20): from the first
  // page the new owner reads until a map newer than `map_version`.
  struct OutgoingMove {
    uint64_t map_version = 0;
    bool handed_off = false;
    // Per table id: the keys pushed to since the copy began, or since its
    // last catch-up round; at the next round, sorted into `caught_up`, at
    // the hand-off into `tail`.
    std::vector<absl::flat_hash_set<uint64_t>> pushed;
    uint32_t catch_up_round = 0;  // the last round begun (0: none)
    std::vector<std::vector<uint64_t>> caught_up;
    std::vector<std::vector<uint64_t>> tail;
  };
  absl::Mutex moves_mu_ ABSL_ACQUIRED_AFTER(restore_mu_);
  std::map<uint32_t, OutgoingMove> outgoing_ ABSL_GUARDED_BY(moves_mu_);
  // What pushes must note, read by every push without the lock
  // (PublishNoting): kNotNoting, the one partition being copied away (the
  // master moves one at a time), or kNotingSeveral. Raised only under
  // restore_mu_ held exclusively, so a push sees it before it checks its
  // keys or not at all.
  static constexpr uint64_t kNotNoting = ~uint64_t{0};
  static constexpr uint64_t kNotingSeveral = ~uint64_t{0} - 1;
  std::atomic<uint64_t> noting_{kNotNoting};

  // Partitions this server is copying in -> the map version of their move:
  // a page is written only while its move is the newest (a copy a restarted
  // master gave up must not write over a later one's). Held across the
  // check and the write; taken before restore_mu_.
  absl::Mutex import_mu_ ABSL_ACQUIRED_BEFORE(restore_mu_);
  std::map<uint32_t, uint64_t> importing_ ABSL_GUARDED_BY(import_mu_);

  mutable absl::Mutex mu_;
  std::shared_ptr<const Placement> placement_ ABSL_GUARDED_BY(mu_);
  // Partitions handed off (HANDOFF) -> the map version then: not owned
  // here under that map or an older one, whatever it says.
  std::map<uint32_t, uint64_t> handed_off_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> owned_ ABSL_GUARDED_BY(mu_);  // partition -> owned here
  // The moves the master's last heartbeat reply named this server the old
  // owner of (HeartbeatReply.moves_out), by partition, and the replies
  // taken so far (CheckFetcher waits on them).
  std::map<uint32_t, proto::MoveNotice> moves_out_ ABSL_GUARDED_BY(mu_);
  uint64_t replies_taken_ ABSL_GUARDED_BY(mu_) = 0;
  // FETCH_PARTITION requests refused for their sender (CheckFetcher).
  std::atomic<uint64_t> fetches_refused_{0};
  // Start has made the tables (and recorded the server's id): RESTORE is
  // served from then on.
  bool tables_ready_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Status stop_reason_ ABSL_GUARDED_BY(mu_);  // given by Stop, Wait's result
  // The master refused a heartbeat: Wait registers again (Rejoin).
  bool rejoin_ ABSL_GUARDED_BY(mu_) = false;
  // RequestLeave: asked (for Wait to act on), and how long Wait waits for
  // the master's drain once it accepted (Leave).
  bool leave_requested_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time leave_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // When Wait asks the master again while it waits for the drain.
  absl::Time leave_ask_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Drained and told to go (OnHeartbeatReply): how long it goes on
  // redirecting workers before it stops.
  absl::Duration retire_linger_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  Status rejoin_why_ ABSL_GUARDED_BY(mu_);
  bool summarized_ = false;                  // Wait logged the summary
};


}  // namespace eps

#endif  // EPS_PS_PARAM_SERVER_IMPL_H_
